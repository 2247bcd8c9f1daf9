//! Text made safe and short for a terminal: control and format characters shown, one-line summaries, counts, and the hint command.

use super::*;

/// Whether `c` must not reach a terminal raw: control characters other than newline and tab
/// (ESC, BEL, CR, C1 controls, …) would move the cursor, clear the screen or set the title;
/// Unicode format characters (general category Cf: bidi overrides and isolates such as
/// U+202E, zero-width characters, tags) would make a command read differently from what runs
/// ("Trojan Source", CVE-2021-42574).
pub(super) fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || is_format(c)
}

/// Unicode general category Cf (format): [`keel_core::text::is_format`].
pub(super) fn is_format(c: char) -> bool {
    keel_core::text::is_format(c)
}

/// How much of a call's arguments an approval prompt shows before saying how much is left
/// (characters).
pub(super) const APPROVAL_SHOWN_CHARS: usize = 6_000;

/// The arguments of a call a human is asked to approve, all of them (up to
/// [`APPROVAL_SHOWN_CHARS`], then how many characters are not shown and where to read them),
/// made [`visible`], indented under the question: a `shell` command as its lines, anything else
/// as indented JSON. Never one truncated line: what is approved is what is shown.
pub fn approval_text(tool: &str, arguments: &serde_json::Value) -> String {
    let body = match (
        tool,
        arguments.get("command").and_then(serde_json::Value::as_str),
    ) {
        ("shell", Some(command)) => {
            let mut text = command.to_owned();
            for (key, value) in arguments.as_object().into_iter().flatten() {
                if key != "command" {
                    text.push_str(&format!("\n({key}: {value})"));
                }
            }
            text
        }
        _ => serde_json::to_string_pretty(arguments).unwrap_or_else(|_| arguments.to_string()),
    };
    let body = visible(&body);
    let total = body.chars().count();
    let mut shown: String = body.chars().take(APPROVAL_SHOWN_CHARS).collect();
    if total > APPROVAL_SHOWN_CHARS {
        shown.push_str(&format!(
            "\n[… {} more characters not shown: read them all with `keel sessions show SESSION` before you decide]",
            total - APPROVAL_SHOWN_CHARS
        ));
    }
    shown
        .lines()
        .map(|l| format!("  │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` made safe for a terminal: ESC becomes `␛`, every other control character except
/// newline and tab, and every Unicode format character, becomes `\u{…}`. Untrusted output (model text, tool arguments and outputs,
/// stored prompts) stays data in every human-readable rendering; JSON output is not passed
/// through this.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\u{1b}' => out.push('␛'),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A writer that passes everything through [`visible`]; for human-readable listings.
#[derive(Debug)]
pub struct Visible<W: Write>(pub W);

impl<W: Write> Write for Visible<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(visible(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Shortens `text` to its first line and at most `max` characters, made [`visible`].
pub fn one_line(text: &str, max: usize) -> String {
    let text = visible(text);
    let first = text.lines().next().unwrap_or_default();
    let more = text.lines().nth(1).is_some();
    if first.chars().count() > max {
        format!("{}…", first.chars().take(max).collect::<String>())
    } else if more {
        format!("{first} …")
    } else {
        first.to_owned()
    }
}

/// The part of `text` not yet shown when `shown` was streamed live: `text` after the longest
/// suffix of `shown` that is a prefix of `text` (an attempt abandoned mid-stream leaves its
/// partial text before the answer's); all of `text` when nothing of it was shown.
pub fn unshown_rest<'a>(shown: &str, text: &'a str) -> &'a str {
    for (i, _) in shown.char_indices() {
        let tail = &shown[i..];
        if let Some(rest) = text.strip_prefix(tail) {
            return rest;
        }
    }
    text
}

/// How printed hints name keel ([`hint_command`]); set once per process.
pub(super) static HINT_COMMAND: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes the hints this process prints (`keel approve …`, `keel resume …`) start with
/// `command`, e.g. `keel --server http://host:7878` when `--server` was given as a flag (a
/// hint without it would name the local store). The first call wins.
pub fn set_hint_command(command: String) {
    let _ = HINT_COMMAND.set(command);
}

/// How hints name keel: `keel`, or what [`set_hint_command`] set.
pub fn hint_command() -> &'static str {
    HINT_COMMAND.get().map_or("keel", String::as_str)
}

/// `n` and `noun`, plural unless `n` is 1 (`1 step`, `2 steps`).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub use keel_runtime::input::model_label;
