//! Secret redaction: applied to every event before it is journaled or leaves the process, and to
//! every ephemeral delta.
//!
//! Three sources of secrets: built-in patterns for common API keys and tokens (OpenAI `sk-…`,
//! Anthropic `sk-ant-…`, GitHub `ghp_…`/`github_pat_…`, AWS `AKIA…`, Slack `xox?-…`,
//! `Bearer …` headers), configured regular expressions
//! ([`crate::SessionConfig::secret_patterns`]), and the values of environment variables marked
//! secret ([`crate::SessionConfig::secret_env`] and the provider keys of [`PROVIDER_KEY_ENV`],
//! read when the session is loaded; values shorter
//! than 6 bytes are ignored so `1` or `true` are not blanked everywhere). Matches become
//! [`REDACTED`].

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use regex::Regex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Result, RuntimeError};

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

/// Environment variables the model adapters read provider API keys from
/// (`keel_model::HttpModel::new`). Their values are always secret: redacted in every session
/// whatever its `secret_env` says, and withheld from tool processes
/// ([`crate::RuntimeOptions::withheld_env`]).
pub const PROVIDER_KEY_ENV: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// A compiled set of secret patterns and literal values.
#[derive(Debug, Clone)]
pub struct Redactor {
    patterns: Vec<Regex>,
    literals: Vec<String>,
}

impl Redactor {
    /// Built-in patterns plus `patterns` (regular expressions) plus the current values of the
    /// environment variables named in `secret_env` and of [`PROVIDER_KEY_ENV`].
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming a pattern that does not compile.
    pub fn new(patterns: &[String], secret_env: &[String]) -> Result<Self> {
        let mut compiled = Vec::new();
        for p in BUILTIN
            .iter()
            .copied()
            .chain(patterns.iter().map(String::as_str))
        {
            compiled.push(Regex::new(p).map_err(|e| {
                RuntimeError::InvalidInput(format!("secret pattern {p:?} does not compile: {e}"))
            })?);
        }
        let mut literals: Vec<String> = secret_env
            .iter()
            .map(String::as_str)
            .chain(PROVIDER_KEY_ENV.iter().copied())
            .filter_map(|name| std::env::var(name).ok())
            .filter(|v| v.len() >= 6)
            .collect();
        // Longest first, so a value containing another is replaced whole.
        literals.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Ok(Self {
            patterns: compiled,
            literals,
        })
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

    /// Redacts one string. Returns it unchanged (no allocation) when nothing matches.
    pub fn redact_str(&self, text: &str) -> String {
        let mut out = std::borrow::Cow::Borrowed(text);
        for lit in &self.literals {
            if out.contains(lit.as_str()) {
                out = std::borrow::Cow::Owned(out.replace(lit.as_str(), REDACTED));
            }
        }
        for re in &self.patterns {
            if re.is_match(&out) {
                out = std::borrow::Cow::Owned(re.replace_all(&out, REDACTED).into_owned());
            }
        }
        out.into_owned()
    }

    /// Byte ranges of `text` holding secrets, sorted, with overlapping or touching ranges merged.
    fn spans(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans: Vec<Range<usize>> = Vec::new();
        for lit in &self.literals {
            spans.extend(
                text.match_indices(lit.as_str())
                    .map(|(i, m)| i..i + m.len()),
            );
        }
        for re in &self.patterns {
            spans.extend(re.find_iter(text).map(|m| m.range()));
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
                let r = self.redact_str(s);
                if r != *s {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                if map.keys().any(|k| self.redact_str(k) != *k) {
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
/// the longest secret value), and any secret that reaches into them, until more text arrives or
/// [`StreamRedactor::finish`] is called. What it returns, concatenated, equals the redaction of
/// the whole text for every secret shorter than the hold (longer ones are caught as long as the
/// pattern already matches their first `hold` bytes, which every built-in pattern does).
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
        let hold = redactor
            .literals
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(256);
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
        out
    }
}

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
mod tests {
    use super::*;

    #[test]
    fn builtin_patterns_and_configured_ones_are_redacted() {
        let r = Redactor::new(&["tok_[0-9]{4}".into()], &[]).unwrap();
        let s = r.redact_str(
            "key sk-abcdefghijklmnopqrstuvwx and tok_1234 and Bearer abcdefghijklmnopqrstu",
        );
        assert!(!s.contains("sk-abc"), "{s}");
        assert!(!s.contains("tok_1234"), "{s}");
        assert!(!s.contains("abcdefghijklmnopqrstu"), "{s}");
        assert_eq!(r.redact_str("nothing here"), "nothing here");
    }

    #[test]
    fn a_secret_split_across_chunks_is_redacted_in_the_stream() {
        let r = Arc::new(Redactor::new(&["tok_[0-9]{4}".into()], &[]).unwrap());
        let text = format!(
            "{} key sk-abcdefghij{} and tok_12{}34 end é",
            "x".repeat(300),
            "klmnopqrstuvwx",
            ""
        );
        for split in [1, 3, 7, 64, 301, 310, 317] {
            let mut s = StreamRedactor::new(r.clone());
            let mut out = String::new();
            let bytes: Vec<char> = text.chars().collect();
            for chunk in bytes.chunks(split) {
                let piece: String = chunk.iter().collect();
                let got = s.push(&piece);
                assert!(!got.contains("sk-"), "split {split}: {got}");
                out.push_str(&got);
            }
            out.push_str(&s.finish());
            assert_eq!(out, r.redact_str(&text), "split {split}");
            assert!(
                !out.contains("abcdefghij") && !out.contains("tok_12"),
                "{out}"
            );
        }
    }

    #[test]
    fn a_pattern_matching_a_structural_field_still_redacts_the_rest() {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Ev {
            ts: chrono::DateTime<chrono::Utc>,
            payload: String,
        }
        // A configured pattern that also matches the timestamp: the payload must still be
        // redacted (the value must not fall back to its unredacted form).
        let r = Redactor::new(&["[0-9]{4}-[0-9]{2}-[0-9]{2}".into()], &[]).unwrap();
        let ev = Ev {
            ts: chrono::Utc::now(),
            payload: "license 1234-56-78".into(),
        };
        let ts = ev.ts;
        let out = r.redact_typed(ev);
        assert_eq!(out.ts, ts);
        assert_eq!(out.payload, format!("license {REDACTED}"));
    }

    #[test]
    fn a_bad_pattern_is_a_clear_error() {
        let err = Redactor::new(&["(".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("does not compile"), "{err}");
    }
}
