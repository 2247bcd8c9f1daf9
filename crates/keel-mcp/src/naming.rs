//! The names the model sees: `mcp__<server>__<tool>`, made to fit `^[a-zA-Z0-9_-]{1,64}$`
//! (what the provider APIs accept for a function name).
//!
//! A name that already fits is used as is. Otherwise every other character becomes `_`, and the
//! name is cut to leave room for `_` and eight hex digits of the SHA-256 of the unaltered
//! `mcp__<server>__<tool>`, so two tools that differ only in what was replaced or cut still get
//! different names, and the same tool always gets the same one.

use sha2::{Digest, Sha256};

/// Longest tool name the provider APIs accept.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// Prefix of every MCP tool's name.
pub const PREFIX: &str = "mcp__";

/// The name the model calls tool `tool` of server `server` by.
pub fn tool_name(server: &str, tool: &str) -> String {
    let raw = format!("{PREFIX}{server}__{tool}");
    let fits = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if raw.len() <= MAX_TOOL_NAME_CHARS && raw.chars().all(fits) {
        return raw;
    }
    let digest = Sha256::digest(raw.as_bytes());
    let suffix = hex::encode(&digest[..4]);
    let mut name: String = raw
        .chars()
        .map(|c| if fits(c) { c } else { '_' })
        .take(MAX_TOOL_NAME_CHARS - suffix.len() - 1)
        .collect();
    name.push('_');
    name.push_str(&suffix);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        (1..=MAX_TOOL_NAME_CHARS).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn a_fitting_name_is_kept() {
        assert_eq!(tool_name("git", "git_status"), "mcp__git__git_status");
    }

    #[test]
    fn other_characters_are_replaced_and_hashed() {
        let a = tool_name("fs", "read.file");
        let b = tool_name("fs", "read_file");
        assert!(valid(&a), "{a}");
        assert!(a.starts_with("mcp__fs__read_file_"), "{a}");
        assert_ne!(a, b);
        assert_eq!(a, tool_name("fs", "read.file"));
        let unicode = tool_name("fs", "lire_é");
        assert!(valid(&unicode), "{unicode}");
    }

    #[test]
    fn a_long_name_is_cut_with_a_hash_suffix() {
        let long = "x".repeat(100);
        let a = tool_name("server", &long);
        let b = tool_name("server", &format!("{long}y"));
        assert_eq!(a.len(), MAX_TOOL_NAME_CHARS);
        assert!(valid(&a) && valid(&b));
        assert_ne!(a, b, "names that differ only after the cut stay distinct");
        assert!(a.starts_with("mcp__server__xxx"));
    }
}
