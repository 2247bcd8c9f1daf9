//! Secret redaction: applied to every event before it is journaled or leaves the process, and to
//! every ephemeral delta.
//!
//! Three sources of secrets: built-in patterns for common API keys and tokens (OpenAI `sk-…`,
//! Anthropic `sk-ant-…`, GitHub `ghp_…`/`github_pat_…`, AWS `AKIA…`, Slack `xox?-…`,
//! `Bearer …` headers, the password of a URL's userinfo: `postgres://u:PASSWORD@h`), configured
//! regular expressions
//! ([`crate::SessionConfig::secret_patterns`]), and literal secret values (values shorter than
//! 6 bytes are ignored so `1` or `true` are not blanked everywhere). Matches become
//! [`REDACTED`].
//!
//! The runtime builds every session's redactor in one place (`crate::secrets`): its literal
//! values are the session's sealed secret values, the values of the variables its `secret_env`
//! names, of [`PROVIDER_KEY_ENV`] and of [`crate::RuntimeOptions::withheld_env`], and the host's
//! [`crate::RuntimeOptions::secret_values`]. Hosts get the same redactor from
//! [`crate::Runtime::redactor`].
//!
//! **Escaped spellings.** Text may carry a secret JSON-escaped: the raw text of a tool call's
//! arguments that did not parse (`"postgres:\/\/u:pw@h\/db`), a JSON document in a tool's
//! output (`"\u0073k-…"`). Every text holding a backslash is also searched in its JSON-unescaped
//! form — every escape of RFC 8259 §7 decoded leniently: `\"`, `\\`, `\/`, `\b`, `\f`, `\n`,
//! `\r`, `\t`, `\uXXXX` with surrogate pairs (a lone surrogate decodes to U+FFFD; a backslash
//! starting no escape stays as it is) — repeated for up to [`UNESCAPE_DEPTH`] levels of nesting
//! (JSON in a JSON string). A secret found there is redacted in the original text over its
//! whole escaped spelling.

use std::ops::Range;
use std::sync::{Arc, LazyLock, OnceLock};

use aho_corasick::AhoCorasick;
use async_trait::async_trait;
use regex::{Regex, RegexSet};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Result, RuntimeError};

/// The session's redactor is the secret check of its tool calls ([`keel_tools::SessionScope`]).
impl keel_tools::SecretCheck for Redactor {
    fn holds_secret(&self, text: &str) -> bool {
        Redactor::holds_secret(self, text)
    }
}

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

const BUILTIN: &[&str] = &[
    r"sk-ant-[A-Za-z0-9_\-]{16,}",
    r"sk-(?:proj-)?[A-Za-z0-9_\-]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"AKIA[0-9A-Z]{16}",
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    r"(?i)bearer\s+[A-Za-z0-9._~+/\-]{16,}=*",
];

/// [`BUILTIN`] as one set, compiled once per process and shared by every redactor: a single
/// pass over a text says which of the built-in patterns occur in it (most texts hold none: one
/// scan instead of one per pattern), and only those are searched for their places, each with
/// its own regex ([`builtin`]). Compiling per session (and warming each regex's lazy DFA
/// afresh: a new `Regex` starts with an empty search cache) cost a third of a worker's CPU
/// while it took 200 sessions over (issue 16's recovery bench, debug build). The patterns are
/// constant and valid (a test checks every one compiles).
static BUILTIN_SET: LazyLock<Option<RegexSet>> = LazyLock::new(|| RegexSet::new(BUILTIN).ok());

/// The literal every match of a [`BUILTIN`] pattern begins with, spelled out (`gh[pousr]_` as
/// five), searched for without regard to ASCII case: a text holding none of them holds no
/// built-in secret, and [`BUILTIN_SET`] is neither run nor compiled for it. Compiling the set
/// (its prefilter expands `(?i)bearer` into every case spelling) was an eighth of a one-step
/// `keel run`'s instructions, for texts — the session's first events — that hold none of these.
/// A test checks each pattern's matches begin with one of these.
const BUILTIN_PREFIXES: &[&str] = &[
    "sk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "akia",
    "xoxa-",
    "xoxb-",
    "xoxp-",
    "xoxr-",
    "xoxs-",
    "bearer",
];

/// [`BUILTIN_PREFIXES`] as one automaton (`None` only if it could not be built; then every
/// text goes to the set).
static BUILTIN_PREFILTER: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(BUILTIN_PREFIXES)
        .ok()
});

/// Whether `text` may hold a match of a [`BUILTIN`] pattern.
fn may_hold_builtin(text: &str) -> bool {
    BUILTIN_PREFILTER
        .as_ref()
        .is_none_or(|ac| ac.is_match(text))
}

/// One regex per [`BUILTIN`] pattern, compiled the first time the set finds that pattern in a
/// text (most processes never need most of them: compiling all seven at start-up was an eighth
/// of `keel run`'s instructions before its first step).
static BUILTIN_ONE: [OnceLock<Option<Regex>>; BUILTIN.len()] =
    [const { OnceLock::new() }; BUILTIN.len()];

/// The regex of built-in pattern `i` (`None` past the end; every pattern compiles).
fn builtin(i: usize) -> Option<&'static Regex> {
    BUILTIN_ONE
        .get(i)?
        .get_or_init(|| BUILTIN.get(i).and_then(|p| Regex::new(p).ok()))
        .as_ref()
}

/// The password of a URL's userinfo (`postgres://user:PASSWORD@host/db`, RFC 3986 §3.2.1):
/// group 1 is redacted, the scheme, user and host stay readable. Searched only in text holding
/// `://`.
static URL_PASSWORD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?i)\b[a-z][a-z0-9+.\-]{0,31}://[^\s/?#@:\[\]]*:([^\s/?#@\[\]]+)@").ok()
});

/// Environment variables the model adapters read provider API keys from
/// (`keel_model::HttpModel::new`). Their values are always secret: redacted in every session
/// whatever its `secret_env` says, and withheld from tool processes
/// ([`crate::RuntimeOptions::withheld_env`]).
pub const PROVIDER_KEY_ENV: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// A compiled set of secret patterns and literal values.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// The configured patterns (the built-in ones are shared by every redactor: see
    /// [`BUILTIN_SET`]).
    patterns: Vec<Arc<Regex>>,
    literals: Vec<String>,
}

impl Redactor {
    /// Built-in patterns plus `patterns` (regular expressions) plus the current values of the
    /// environment variables named in `secret_env` and of [`PROVIDER_KEY_ENV`].
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming a pattern that does not compile.
    pub fn new(patterns: &[String], secret_env: &[String]) -> Result<Self> {
        let names: Vec<&str> = secret_env
            .iter()
            .map(String::as_str)
            .chain(PROVIDER_KEY_ENV.iter().copied())
            .collect();
        Self::with_values(patterns, &env_values(&names))
    }

    /// Built-in patterns plus `patterns` (regular expressions) plus the literal `values` (values
    /// shorter than 6 bytes are ignored). Reads no environment.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming a pattern that does not compile.
    pub fn with_values(patterns: &[String], values: &[String]) -> Result<Self> {
        let mut compiled = Vec::with_capacity(patterns.len());
        for p in patterns {
            compiled.push(Arc::new(Regex::new(p).map_err(|e| {
                RuntimeError::InvalidInput(format!("secret pattern {p:?} does not compile: {e}"))
            })?));
        }
        Ok(Self {
            patterns: compiled,
            literals: Vec::new(),
        }
        .with_literals(values))
    }

    /// The same redactor, also replacing each of `values` (secrets the host knows by value, such
    /// as a provider key written in its configuration; values shorter than 6 bytes are ignored).
    #[must_use]
    pub fn with_literals(mut self, values: &[String]) -> Self {
        for v in values.iter().filter(|v| v.len() >= 6) {
            if !self.literals.contains(v) {
                self.literals.push(v.clone());
            }
        }
        self.literals.sort_by_key(|v| std::cmp::Reverse(v.len()));
        self
    }

    /// Whether this redactor is the one [`Redactor::with_values`] builds from `patterns` and
    /// `values`: the same configured patterns in the same order, and the same set of literal
    /// values (values under 6 bytes ignored, as it ignores them).
    pub(crate) fn is_built_from(&self, patterns: &[String], values: &[String]) -> bool {
        let configured = &self.patterns;
        if configured.len() != patterns.len()
            || configured
                .iter()
                .zip(patterns)
                .any(|(re, p)| re.as_str() != p)
        {
            return false;
        }
        let mut wanted: Vec<&str> = values
            .iter()
            .filter(|v| v.len() >= 6)
            .map(String::as_str)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut mine: Vec<&str> = self.literals.iter().map(String::as_str).collect();
        mine.sort_unstable();
        mine == wanted
    }

    /// Whether `text` holds a secret this redactor would redact (plain or JSON-escaped).
    pub fn holds_secret(&self, text: &str) -> bool {
        !self.spans(text).is_empty()
    }

    /// Redacts one string: every secret, in plain or JSON-escaped spelling (see the module
    /// docs), becomes [`REDACTED`]; overlapping or touching secrets become one.
    pub fn redact_str(&self, text: &str) -> String {
        let spans = self.spans(text);
        if spans.is_empty() {
            return text.to_owned();
        }
        replaced(text, spans)
    }

    /// Whether any string of `value` (values and object keys) holds a secret.
    fn value_holds_secret(&self, value: &Value) -> bool {
        match value {
            Value::String(s) => self.holds_secret(s),
            Value::Array(items) => items.iter().any(|v| self.value_holds_secret(v)),
            Value::Object(map) => map
                .iter()
                .any(|(k, v)| self.holds_secret(k) || self.value_holds_secret(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }

    /// The longest literal value, bytes (0 when there is none).
    fn longest_literal(&self) -> usize {
        self.literals.iter().map(String::len).max().unwrap_or(0)
    }

    /// Adds the byte ranges of `text` holding secrets as they are spelled there to `out`.
    fn plain_spans(&self, text: &str, out: &mut Vec<Range<usize>>) {
        for lit in &self.literals {
            out.extend(
                text.match_indices(lit.as_str())
                    .map(|(i, m)| i..i + m.len()),
            );
        }
        let mut search = |re: &Regex| out.extend(re.find_iter(text).map(|m| m.range()));
        if may_hold_builtin(text) {
            match BUILTIN_SET.as_ref() {
                Some(set) => set
                    .matches(text)
                    .iter()
                    .filter_map(builtin)
                    .for_each(&mut search),
                None => (0..BUILTIN.len()).filter_map(builtin).for_each(&mut search),
            }
        }
        for re in &self.patterns {
            search(re);
        }
        if text.contains("://")
            && let Some(re) = URL_PASSWORD.as_ref()
        {
            out.extend(
                re.captures_iter(text)
                    .filter_map(|c| c.get(1))
                    .map(|m| m.range()),
            );
        }
    }

    /// Byte ranges of `text` holding secrets, plain or JSON-escaped, sorted, with overlapping
    /// or touching ranges merged. Every range starts and ends on a character boundary.
    fn spans(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans: Vec<Range<usize>> = Vec::new();
        self.plain_spans(text, &mut spans);
        // The text JSON-unescaped, level by level; what is found at a level is mapped back
        // through every level to its escaped spelling in `text`.
        let mut levels: Vec<Unescaped> = Vec::new();
        while levels.len() < UNESCAPE_DEPTH {
            let Some(next) = Unescaped::decode(levels.last().map_or(text, |u| u.text.as_str()))
            else {
                break;
            };
            let mut found = Vec::new();
            self.plain_spans(&next.text, &mut found);
            levels.push(next);
            for r in found {
                let (mut start, mut end) = (r.start, r.end);
                for level in levels.iter().rev() {
                    start = level.raw_start(start);
                    end = level.raw_end(end);
                }
                spans.push(start..end);
            }
        }
        spans.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
        for r in spans {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }

    /// Redacts a serializable value (an event, an event body) and returns it with the same type.
    /// A string whose redaction would make the value unreadable (an id, a timestamp, an enum
    /// name matched by a configured pattern) is left as it is; every other string is redacted —
    /// the value never falls back to its unredacted form as a whole. A value that does not
    /// serialize is returned unchanged (every runtime type serializes).
    pub fn redact_typed<T: Serialize + DeserializeOwned>(&self, item: T) -> T {
        let Ok(original) = serde_json::to_value(&item) else {
            return item;
        };
        // Most items hold no secret: found without copying the tree or any string.
        if !self.value_holds_secret(&original) {
            return item;
        }
        let mut whole = original.clone();
        self.redact_value(&mut whole);
        if whole == original {
            return item;
        }
        if let Ok(v) = serde_json::from_value(whole) {
            return v;
        }
        // Rare: some redacted string is structural. Redact leaf by leaf, keeping each change
        // that leaves the value readable.
        let mut paths = Vec::new();
        string_paths(&original, String::new(), &mut paths);
        let mut current = original;
        for path in paths {
            let Some(Value::String(s)) = current.pointer(&path) else {
                continue;
            };
            let r = self.redact_str(s);
            if r == *s {
                continue;
            }
            let mut candidate = current.clone();
            if let Some(slot) = candidate.pointer_mut(&path) {
                *slot = Value::String(r);
            }
            if serde_json::from_value::<T>(candidate.clone()).is_ok() {
                current = candidate;
            }
        }
        serde_json::from_value(current).unwrap_or(item)
    }

    /// Redacts every string of a JSON value in place: values, and object keys (a model may put a
    /// secret in an argument's name). Keys that redact alike stay apart as `[REDACTED]`,
    /// `[REDACTED]#2`, … so no entry is lost.
    pub fn redact_value(&self, value: &mut Value) {
        match value {
            Value::String(s) => {
                let spans = self.spans(s);
                if !spans.is_empty() {
                    *s = replaced(s, spans);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                if map.keys().any(|k| self.holds_secret(k)) {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        let mut key = self.redact_str(&k);
                        if key != k {
                            let base = key.clone();
                            let mut n = 1;
                            while map.contains_key(&key) {
                                n += 1;
                                key = format!("{base}#{n}");
                            }
                        }
                        map.insert(key, v);
                    }
                }
                map.values_mut().for_each(|v| self.redact_value(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

/// `text` with each of `spans` (sorted, apart) replaced by [`REDACTED`].
fn replaced(text: &str, spans: Vec<Range<usize>>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    for s in spans {
        out.push_str(&text[pos..s.start]);
        out.push_str(REDACTED);
        pos = s.end;
    }
    out.push_str(&text[pos..]);
    out
}

/// The current values of the environment variables `names` (unset and non-UTF-8 ones left out).
pub fn env_values(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .collect()
}

/// How many levels of JSON escaping the redactor looks through (a JSON document inside a
/// JSON string inside the raw arguments text is three).
pub const UNESCAPE_DEPTH: usize = 3;

/// One JSON escape decoded: where its character is in the decoded text and where its spelling
/// is in the text it was decoded from.
#[derive(Debug)]
struct Escape {
    decoded: Range<usize>,
    raw: Range<usize>,
}

/// A text with its JSON escapes decoded, and where each decoded escape came from.
#[derive(Debug)]
struct Unescaped {
    text: String,
    /// In order; text between escapes is copied byte for byte.
    escapes: Vec<Escape>,
}

impl Unescaped {
    /// Decodes every JSON escape of `raw`, wherever it stands (see the module docs); `None`
    /// when `raw` has none.
    fn decode(raw: &str) -> Option<Self> {
        let bytes = raw.as_bytes();
        let mut i = memchr_backslash(bytes, 0)?;
        let mut text = String::with_capacity(raw.len());
        let mut escapes = Vec::new();
        let mut copied = 0;
        loop {
            match escape_at(bytes, i) {
                Some((ch, len)) => {
                    text.push_str(&raw[copied..i]);
                    let start = text.len();
                    text.push(ch);
                    escapes.push(Escape {
                        decoded: start..text.len(),
                        raw: i..i + len,
                    });
                    copied = i + len;
                    i = copied;
                }
                None => i += 1,
            }
            match memchr_backslash(bytes, i) {
                Some(next) => i = next,
                None => break,
            }
        }
        if escapes.is_empty() {
            return None;
        }
        text.push_str(&raw[copied..]);
        Some(Self { text, escapes })
    }

    /// The escape whose decoded range starts at or before `d` (`strict`: before), if any.
    fn before(&self, d: usize, strict: bool) -> Option<&Escape> {
        let n = self.escapes.partition_point(|e| {
            if strict {
                e.decoded.start < d
            } else {
                e.decoded.start <= d
            }
        });
        n.checked_sub(1).map(|i| &self.escapes[i])
    }

    /// Where a range starting at decoded offset `d` starts in the raw text (a range starting
    /// inside an escape's character starts at the escape).
    fn raw_start(&self, d: usize) -> usize {
        match self.before(d, false) {
            None => d,
            Some(e) if d < e.decoded.end => e.raw.start,
            Some(e) => e.raw.end + (d - e.decoded.end),
        }
    }

    /// Where a range ending (exclusive) at decoded offset `d` ends in the raw text (a range
    /// ending inside or right after an escape's character ends after the escape).
    fn raw_end(&self, d: usize) -> usize {
        match self.before(d, true) {
            None => d,
            Some(e) if d <= e.decoded.end => e.raw.end,
            Some(e) => e.raw.end + (d - e.decoded.end),
        }
    }
}

/// The index of the first `\` in `bytes` at or after `from`.
fn memchr_backslash(bytes: &[u8], from: usize) -> Option<usize> {
    bytes
        .get(from..)?
        .iter()
        .position(|b| *b == b'\\')
        .map(|i| i + from)
}

/// The JSON escape starting at `bytes[i]` (a backslash): its character and length in bytes;
/// `None` when the backslash starts no escape.
fn escape_at(bytes: &[u8], i: usize) -> Option<(char, usize)> {
    let simple = match *bytes.get(i + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(bytes, i + 2)?;
            return Some(match hi {
                0xD800..=0xDBFF => {
                    let lo = (bytes.get(i + 6) == Some(&b'\\') && bytes.get(i + 7) == Some(&b'u'))
                        .then(|| hex4(bytes, i + 8))
                        .flatten()
                        .filter(|lo| (0xDC00..=0xDFFF).contains(lo));
                    match lo {
                        Some(lo) => {
                            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                            (char::from_u32(c).unwrap_or('\u{FFFD}'), 12)
                        }
                        None => ('\u{FFFD}', 6),
                    }
                }
                _ => (char::from_u32(hi).unwrap_or('\u{FFFD}'), 6),
            });
        }
        _ => return None,
    };
    Some((simple, 2))
}

/// The value of the four hex digits at `bytes[at..at + 4]`.
fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = bytes.get(at..at + 4)?;
    digits
        .iter()
        .try_fold(0u32, |acc, b| Some(acc * 16 + char::from(*b).to_digit(16)?))
}

/// JSON pointers of every string leaf of `v`.
fn string_paths(v: &Value, prefix: String, out: &mut Vec<String>) {
    match v {
        Value::String(_) => out.push(prefix),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_paths(item, format!("{prefix}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                let k = k.replace('~', "~0").replace('/', "~1");
                string_paths(item, format!("{prefix}/{k}"), out);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Redacts text that arrives in pieces (model text, tool-call arguments, tool output), so a
/// secret split across two pieces is still caught.
///
/// It holds back the last `hold` bytes of what it was given (at least 256 bytes, and at least
/// six times the longest secret value: its spelling in `\uXXXX` escapes), and any secret that
/// reaches into them, until more text arrives or [`StreamRedactor::finish`] is called. What it
/// returns, concatenated, equals the redaction of the whole text for every secret spelled in
/// fewer bytes than the hold (longer ones are caught as long as the pattern already matches
/// their first `hold` bytes, which every built-in pattern does). What is journaled is redacted
/// whole in any case.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Arc<Redactor>,
    raw: String,
    emitted: usize,
    hold: usize,
}

impl StreamRedactor {
    /// A redactor for one stream.
    pub fn new(redactor: Arc<Redactor>) -> Self {
        // A literal spelled with `\uXXXX` escapes is at most six times as long.
        let hold = redactor.longest_literal().saturating_mul(6).max(256);
        Self {
            redactor,
            raw: String::new(),
            emitted: 0,
            hold,
        }
    }

    /// Adds `chunk`; returns the redacted text that is now safe to show (may be empty).
    pub fn push(&mut self, chunk: &str) -> String {
        self.raw.push_str(chunk);
        let cut = self.raw.len().saturating_sub(self.hold);
        self.emit(cut, false)
    }

    /// The end of the stream: returns the redacted rest.
    pub fn finish(&mut self) -> String {
        self.emit(self.raw.len(), true)
    }

    fn emit(&mut self, cut: usize, last: bool) -> String {
        let mut cut = floor_boundary(&self.raw, cut);
        if cut <= self.emitted {
            return String::new();
        }
        let window = floor_boundary(&self.raw, self.emitted.saturating_sub(self.hold));
        let spans: Vec<Range<usize>> = self
            .redactor
            .spans(&self.raw[window..])
            .into_iter()
            .map(|r| r.start + window..r.end + window)
            .collect();
        if !last && let Some(s) = spans.iter().find(|s| s.start < cut && s.end >= cut) {
            // A secret reaching the cut may still grow: keep it back whole.
            cut = s.start.max(self.emitted);
        }
        if cut <= self.emitted {
            return String::new();
        }
        let mut out = String::with_capacity(cut - self.emitted);
        let mut pos = self.emitted;
        for s in spans
            .iter()
            .filter(|s| s.end > self.emitted && s.start < cut)
        {
            let start = s.start.max(pos);
            out.push_str(&self.raw[pos..start]);
            out.push_str(REDACTED);
            pos = s.end.min(cut);
        }
        out.push_str(&self.raw[pos..cut]);
        self.emitted = cut;
        self.forget_emitted();
        out
    }

    /// Drops what was emitted, but the last `hold` bytes (the next scan looks back that far): a
    /// long stream keeps about `hold` bytes plus what it holds back, never all it was given.
    /// Done once the droppable prefix is large, so the moves stay linear in the text.
    fn forget_emitted(&mut self) {
        let keep_from = floor_boundary(&self.raw, self.emitted.saturating_sub(self.hold));
        if keep_from >= FORGET_AFTER_BYTES.max(self.hold) {
            self.raw.drain(..keep_from);
            self.emitted -= keep_from;
        }
    }

    /// Bytes of the stream kept in memory now (for tests of the bound).
    pub fn buffered_bytes(&self) -> usize {
        self.raw.len()
    }
}

/// How much emitted text a [`StreamRedactor`] may keep before dropping it, bytes.
const FORGET_AFTER_BYTES: usize = 64 * 1024;

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// An artifact sink that redacts what it stores: full tool outputs reach the store only with
/// secrets replaced, like everything else written there. Text that is not UTF-8 is redacted on
/// its lossy decoding (and stored so only when a secret was found in it).
pub(crate) struct RedactingSink {
    /// The sink that stores.
    pub(crate) inner: Arc<dyn keel_tools::artifact::ArtifactSink>,
    /// The session's redactor.
    pub(crate) redactor: Arc<Redactor>,
}

#[async_trait]
impl keel_tools::artifact::ArtifactSink for RedactingSink {
    async fn put(
        &self,
        call_id: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> std::result::Result<keel_tools::artifact::ArtifactRef, keel_tools::ToolsError> {
        let text = String::from_utf8_lossy(&bytes);
        let shown = self.redactor.redact_str(&text);
        let bytes = if shown == text {
            bytes
        } else {
            shown.into_bytes()
        };
        self.inner.put(call_id, name, bytes).await
    }

    async fn get(&self, id: &str) -> std::result::Result<Vec<u8>, keel_tools::ToolsError> {
        self.inner.get(id).await
    }
}

#[cfg(test)]
mod tests;
