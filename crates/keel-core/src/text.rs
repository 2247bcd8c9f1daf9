//! Text checks shared by the hosts: which characters must not pass unseen into a terminal or a
//! name people read.

/// Unicode general category Cf (format), Unicode 15.1: bidi overrides and isolates (U+202E,
/// U+2066…), zero-width characters, tags — characters that make text read differently from
/// what it is ("Trojan Source", CVE-2021-42574).
pub fn is_format(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// Why `name` (a tenant's or an API key's name, shown to people in lists, the journal and the
/// inspector) is refused, if it is: empty or blank, over 200 bytes, or holding a control
/// character or a format character ([`is_format`]) that would rewrite a terminal or hide
/// what the name says.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.trim().is_empty() || name.len() > 200 {
        return Some("name must be 1 to 200 bytes");
    }
    if name.chars().any(|c| c.is_control() || is_format(c)) {
        return Some(
            "name must not hold control or format characters (escapes, bidi controls, zero-width characters)",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_hidden_characters_are_refused() {
        assert_eq!(name_problem("alice"), None);
        assert_eq!(name_problem("alice (you)"), None);
        assert_eq!(name_problem("Zoë ops"), None);
        for bad in [
            "",
            "  ",
            "a\u{1b}[31mb",
            "evil\u{202e}cod",
            "a\u{200b}b",
            "a\nb",
        ] {
            assert!(name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(name_problem(&"x".repeat(201)).is_some());
    }
}
