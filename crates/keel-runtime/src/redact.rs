//! Secret redaction: applied to every event before it is journaled or leaves the process, and to
//! every ephemeral delta.
//!
//! Three sources of secrets: built-in patterns for common API keys and tokens (OpenAI `sk-…`,
//! Anthropic `sk-ant-…`, GitHub `ghp_…`/`github_pat_…`, AWS `AKIA…`, Slack `xox?-…`,
//! `Bearer …` headers), configured regular expressions
//! ([`crate::SessionConfig::secret_patterns`]), and the values of environment variables marked
//! secret ([`crate::SessionConfig::secret_env`], read when the session is loaded; values shorter
//! than 6 bytes are ignored so `1` or `true` are not blanked everywhere). Matches become
//! [`REDACTED`].

use regex::Regex;
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

/// A compiled set of secret patterns and literal values.
#[derive(Debug, Clone)]
pub struct Redactor {
    patterns: Vec<Regex>,
    literals: Vec<String>,
}

impl Redactor {
    /// Built-in patterns plus `patterns` (regular expressions) plus the current values of the
    /// environment variables named in `secret_env`.
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

    /// Redacts every string (values, not keys) of a JSON value in place.
    pub fn redact_value(&self, value: &mut Value) {
        match value {
            Value::String(s) => {
                let r = self.redact_str(s);
                if r != *s {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.redact_value(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
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
    fn a_bad_pattern_is_a_clear_error() {
        let err = Redactor::new(&["(".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("does not compile"), "{err}");
    }
}
