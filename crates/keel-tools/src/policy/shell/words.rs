//! Words as bash reads them: quote removal, ANSI-C decoding, and which parts are only known
//! when the line runs (expansions, substitutions, globs, braces, tildes).
//!
//! The tree-sitter grammar finds the word boundaries and the expansions; this module decodes
//! the literal parts and double-checks the grammar: a character that bash would read as syntax
//! (an unquoted blank, quote, `$(`, backquote, operator) found inside what the grammar calls
//! literal text is an error, which makes the line unprovable instead of silently misread.

use crate::policy::pattern::CmdTok;

/// One decoded unit of a word before globbing, brace and tilde expansion are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raw {
    /// A character and whether it was quoted (by a backslash or inside quotes).
    Char(char, bool),
    /// An expansion or substitution; `split` when unquoted (its result is split into words
    /// and globbed).
    Expansion {
        /// Unquoted: subject to word splitting.
        split: bool,
    },
}

/// A word of a command as policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Word {
    /// The text, with [`CmdTok::Any`] where it is only known when the line runs.
    pub(crate) toks: Vec<CmdTok>,
    /// The word as written in the line (for messages).
    pub(crate) src: String,
    /// Holds an expansion or substitution of any kind (parameter, command, arithmetic, brace,
    /// tilde).
    pub(crate) expanded: bool,
    /// Holds unquoted glob characters: file names replace it.
    pub(crate) glob: bool,
    /// May turn into a word starting with `-`, or into several words (word splitting, a brace
    /// expansion, a glob at its start).
    pub(crate) may_be_option: bool,
}

impl Word {
    /// A word with the known text `text`.
    pub(crate) fn literal(text: &str) -> Self {
        Self {
            toks: text.chars().map(CmdTok::Char).collect(),
            src: text.to_owned(),
            ..Self::default()
        }
    }

    /// A word nothing is known about (what `xargs` appends).
    pub(crate) fn any(src: &str) -> Self {
        Self {
            toks: vec![CmdTok::Any],
            src: src.to_owned(),
            expanded: true,
            glob: false,
            may_be_option: true,
        }
    }

    /// The word's text when it is known exactly (no expansion, no glob).
    pub(crate) fn text(&self) -> Option<String> {
        (!self.toks.contains(&CmdTok::Any)).then(|| self.literal_prefix())
    }

    /// The known start of the word: its text up to the first unknown part.
    pub(crate) fn literal_prefix(&self) -> String {
        self.toks
            .iter()
            .map_while(|t| match t {
                CmdTok::Char(c) => Some(*c),
                CmdTok::Any => None,
            })
            .collect()
    }

    /// The text with each unknown part shown as `*` (for path rules, which read it as a glob).
    pub(crate) fn render(&self) -> String {
        self.toks
            .iter()
            .map(|t| match t {
                CmdTok::Char(c) => *c,
                CmdTok::Any => '*',
            })
            .collect()
    }

    /// This word with every occurrence of `needle` in its text replaced by an unknown part
    /// (what `xargs -I {}` and `find -exec … {}` substitute).
    pub(crate) fn replace_with_any(&self, needle: &str) -> Self {
        let needle: Vec<CmdTok> = needle.chars().map(CmdTok::Char).collect();
        if needle.is_empty() {
            return self.clone();
        }
        let mut toks = Vec::new();
        let mut i = 0;
        let mut replaced = false;
        while i < self.toks.len() {
            if self.toks[i..].starts_with(&needle) {
                push_any(&mut toks);
                i += needle.len();
                replaced = true;
            } else {
                toks.push(self.toks[i]);
                i += 1;
            }
        }
        Self {
            may_be_option: self.may_be_option || toks.first() == Some(&CmdTok::Any),
            toks,
            src: self.src.clone(),
            expanded: self.expanded || replaced,
            glob: self.glob,
        }
    }

    /// Builds the word from decoded units, applying brace expansion, tilde expansion and
    /// globbing as bash does, to unquoted characters only.
    pub(crate) fn from_raw(raw: &[Raw], src: &str) -> Self {
        if has_brace_expansion(raw) {
            return Self::any(src);
        }
        let raw = expand_tildes(raw);
        let mut word = Self {
            src: src.to_owned(),
            ..Self::default()
        };
        let mut i = 0;
        while i < raw.len() {
            match raw[i] {
                Raw::Char('*' | '?', false) => {
                    push_any(&mut word.toks);
                    word.glob = true;
                }
                Raw::Char('[', false) => {
                    // A bracket expression when a `]` closes it (after at least one character).
                    let close = raw
                        .iter()
                        .enumerate()
                        .skip(i + 2)
                        .find(|(_, r)| matches!(r, Raw::Char(']', _)))
                        .map(|(j, _)| j);
                    match close {
                        Some(j) => {
                            push_any(&mut word.toks);
                            word.glob = true;
                            i = j;
                        }
                        None => word.toks.push(CmdTok::Char('[')),
                    }
                }
                Raw::Char(c, _) => word.toks.push(CmdTok::Char(c)),
                Raw::Expansion { split } => {
                    push_any(&mut word.toks);
                    word.expanded = true;
                    word.may_be_option |= split;
                }
            }
            i += 1;
        }
        word.may_be_option |= word.toks.first() == Some(&CmdTok::Any);
        word
    }
}

fn push_any(toks: &mut Vec<CmdTok>) {
    if toks.last() != Some(&CmdTok::Any) {
        toks.push(CmdTok::Any);
    }
}

/// Whether bash would brace-expand the word: an unquoted `{` closed by an unquoted `}` with an
/// unquoted `,` or `..` between them.
fn has_brace_expansion(raw: &[Raw]) -> bool {
    let unquoted = |i: usize, c: char| raw.get(i) == Some(&Raw::Char(c, false));
    for open in (0..raw.len()).filter(|&i| unquoted(i, '{')) {
        let mut separator = false;
        for i in open + 1..raw.len() {
            if unquoted(i, ',') || (unquoted(i, '.') && unquoted(i + 1, '.')) {
                separator = true;
            }
            if unquoted(i, '}') {
                if separator {
                    return true;
                }
                break;
            }
        }
    }
    false
}

/// Replaces tilde prefixes (at the start, or after an unquoted `=` or `:`) by an expansion.
fn expand_tildes(raw: &[Raw]) -> Vec<Raw> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let at_prefix = i == 0 || matches!(raw[i - 1], Raw::Char('=' | ':', false));
        if at_prefix && raw[i] == Raw::Char('~', false) {
            let end = raw[i..]
                .iter()
                .position(|r| matches!(r, Raw::Char('/' | ':', false)))
                .map_or(raw.len(), |p| i + p);
            let all_unquoted = raw[i..end].iter().all(|r| matches!(r, Raw::Char(_, false)));
            if all_unquoted {
                out.push(Raw::Expansion { split: false });
                i = end;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    out
}

/// Whether `c` after a `$` starts an expansion.
fn starts_expansion(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            '_' | '{' | '(' | '[' | '@' | '*' | '#' | '?' | '-' | '$' | '!' | '\'' | '"'
        )
}

/// Decodes unquoted word text (backslash escapes), checking that it holds no syntax the
/// grammar should have seen. `at_word_start`: the text begins a word (a `#` there would start a
/// comment).
///
/// Errors: why bash may read the text differently from the grammar.
pub(crate) fn unquoted(text: &str, at_word_start: bool, out: &mut Vec<Raw>) -> Result<(), String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => match chars.get(i + 1) {
                Some('\n') => i += 1,
                Some(&next) => {
                    out.push(Raw::Char(next, true));
                    i += 1;
                }
                None => out.push(Raw::Char('\\', true)),
            },
            ' ' | '\t' | '\n' | '\r' => {
                return Err("a blank inside what the parser read as one word".into());
            }
            '\'' | '"' | '`' | ';' | '&' | '|' | '<' | '>' | '(' | ')' => {
                return Err(format!(
                    "`{c}` inside what the parser read as a plain word (`{text}`)"
                ));
            }
            '$' if chars.get(i + 1).is_some_and(|&n| starts_expansion(n)) => {
                return Err(format!("an expansion the parser did not see in `{text}`"));
            }
            '#' if i == 0 && at_word_start => {
                return Err(format!("a word starting with `#` (`{text}`)"));
            }
            _ => out.push(Raw::Char(c, false)),
        }
        i += 1;
    }
    Ok(())
}

/// Decodes the text between double quotes (or an unquoted here-document body).
///
/// Errors: why bash may read the text differently from the grammar.
pub(crate) fn double_quoted(text: &str, out: &mut Vec<Raw>) -> Result<(), String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => match chars.get(i + 1) {
                Some('\n') => i += 1,
                Some(&next @ ('$' | '`' | '"' | '\\')) => {
                    out.push(Raw::Char(next, true));
                    i += 1;
                }
                _ => out.push(Raw::Char('\\', true)),
            },
            '`' => return Err("a backquote the parser did not see".into()),
            '$' if chars
                .get(i + 1)
                .is_some_and(|&n| starts_expansion(n) && n != '\'' && n != '"') =>
            {
                return Err(format!("an expansion the parser did not see in `{text}`"));
            }
            _ => out.push(Raw::Char(c, true)),
        }
        i += 1;
    }
    Ok(())
}

/// The delimiter of a here-document as bash computes it from the word after `<<`: quote
/// removal (backslashes, single and double quotes), and whether any part was quoted (then the
/// body is not expanded). Only words whose result is the same in every bash version are
/// computed.
///
/// Errors: a `$` (bash 5.2 decodes `$'…'` and `$"…"` in delimiters, older versions do not),
/// a backquote, a backslash, `$` or backquote inside double quotes, unclosed quotes, blanks or
/// operators.
pub(crate) fn heredoc_delimiter(word: &str) -> Result<(String, bool), String> {
    let refuse = |what: &str| {
        Err(format!(
            "the here-document delimiter `{word}` has {what}, which bash may read differently from the parser"
        ))
    };
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = word.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => return refuse("a trailing backslash"),
                Some(next) => {
                    quoted = true;
                    out.push(next);
                }
            },
            '\'' => {
                quoted = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(inner) => out.push(inner),
                        None => return refuse("an unclosed quote"),
                    }
                }
            }
            '"' => {
                quoted = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('$' | '`' | '\\') => {
                            return refuse("`$`, a backquote or a backslash inside double quotes");
                        }
                        Some(inner) => out.push(inner),
                        None => return refuse("an unclosed quote"),
                    }
                }
            }
            '$' => return refuse("a `$`"),
            '`' => return refuse("a backquote"),
            c if c.is_whitespace() || ";&|<>()".contains(c) => {
                return refuse("a blank or an operator");
            }
            c => out.push(c),
        }
    }
    if out.is_empty() {
        return refuse("an empty result");
    }
    Ok((out, quoted))
}

/// Whether bash would end a here-document with delimiter `delimiter` at a line of `body`
/// (the text the parser read as the body). `strip_tabs`: `<<-`, leading tabs are removed from
/// each line first. `continuations`: an unquoted delimiter, where bash joins a line ending in
/// a backslash with the next before comparing; both readings of a line ending in several
/// backslashes are tried.
pub(crate) fn heredoc_line_ends(
    body: &str,
    delimiter: &str,
    strip_tabs: bool,
    continuations: bool,
) -> bool {
    let strip = |line: &str| -> String {
        if strip_tabs {
            line.trim_start_matches('\t').to_owned()
        } else {
            line.to_owned()
        }
    };
    let lines: Vec<&str> = body.split('\n').collect();
    // The last piece follows the final newline: it is where the terminator line starts.
    let lines = &lines[..lines.len().saturating_sub(1)];
    if lines.iter().any(|l| strip(l) == delimiter) {
        return true;
    }
    if !continuations {
        return false;
    }
    // Joined readings: every line ending in a backslash continues (each piece tab-stripped,
    // or only the first), or only those ending in an odd number of backslashes.
    for odd_only in [false, true] {
        for strip_each in [false, true] {
            let mut acc = String::new();
            for (i, line) in lines.iter().enumerate() {
                let piece = if acc.is_empty() || strip_each {
                    strip(line)
                } else {
                    (*line).to_owned()
                };
                let trailing = piece.len() - piece.trim_end_matches('\\').len();
                let continues = if odd_only {
                    trailing % 2 == 1
                } else {
                    trailing > 0
                };
                if continues && i + 1 < lines.len() {
                    acc.push_str(&piece[..piece.len() - 1]);
                    continue;
                }
                acc.push_str(&piece);
                if acc == delimiter {
                    return true;
                }
                acc.clear();
            }
        }
    }
    false
}

/// Decodes the body of an ANSI-C quoted string `$'…'` exactly as bash does.
///
/// Errors: escapes whose result is not decoded here (`\c`, a NUL byte, non-ASCII `\u`, bytes
/// that are not UTF-8).
pub(crate) fn ansi_c(body: &str, out: &mut Vec<Raw>) -> Result<(), String> {
    let chars: Vec<char> = body.chars().collect();
    let mut bytes: Vec<u8> = Vec::new();
    let push_char = |bytes: &mut Vec<u8>, c: char| {
        let mut buf = [0u8; 4];
        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    };
    let digits = |start: usize, max: usize, radix: u32| -> (u32, usize) {
        let mut value = 0u32;
        let mut n = 0;
        while n < max {
            match chars.get(start + n).and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    value = value * radix + d;
                    n += 1;
                }
                None => break,
            }
        }
        (value, n)
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c != '\\' {
            push_char(&mut bytes, c);
            i += 1;
            continue;
        }
        let Some(&e) = chars.get(i + 1) else {
            bytes.push(b'\\');
            break;
        };
        i += 2;
        let simple = match e {
            'a' => Some(7u8),
            'b' => Some(8),
            'e' | 'E' => Some(27),
            'f' => Some(12),
            'n' => Some(b'\n'),
            'r' => Some(b'\r'),
            't' => Some(b'\t'),
            'v' => Some(11),
            '\\' => Some(b'\\'),
            '\'' => Some(b'\''),
            '"' => Some(b'"'),
            '?' => Some(b'?'),
            _ => None,
        };
        if let Some(b) = simple {
            bytes.push(b);
            continue;
        }
        match e {
            '0'..='7' => {
                let (value, n) = digits(i - 1, 3, 8);
                i = i - 1 + n;
                let byte = (value & 0xFF) as u8;
                if byte == 0 {
                    return Err("`$'…'` with a NUL byte, which cuts the string".into());
                }
                bytes.push(byte);
            }
            'x' => {
                let (value, n) = digits(i, 2, 16);
                if n == 0 {
                    return Err("`$'…'` with `\\x` and no hex digits".into());
                }
                i += n;
                if value == 0 {
                    return Err("`$'…'` with a NUL byte, which cuts the string".into());
                }
                bytes.push(value as u8);
            }
            'u' | 'U' => {
                let (value, n) = digits(i, if e == 'u' { 4 } else { 8 }, 16);
                i += n;
                match char::from_u32(value) {
                    Some(ch) if n > 0 && value != 0 && ch.is_ascii() => push_char(&mut bytes, ch),
                    _ => {
                        return Err(
                            "`$'…'` with a `\\u` escape whose result depends on the locale".into(),
                        );
                    }
                }
            }
            'c' => return Err("`$'…'` with a `\\c` control escape".into()),
            other => {
                bytes.push(b'\\');
                push_char(&mut bytes, other);
            }
        }
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| "`$'…'` decodes to bytes that are not UTF-8".to_owned())?;
    out.extend(text.chars().map(|c| Raw::Char(c, true)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(text: &str) -> Word {
        let mut raw = Vec::new();
        unquoted(text, true, &mut raw).unwrap();
        Word::from_raw(&raw, text)
    }

    #[test]
    fn escapes_are_removed_and_globs_braces_tildes_are_unknown() {
        assert_eq!(word("r\\m").text().as_deref(), Some("rm"));
        assert_eq!(word("a\\ b").text().as_deref(), Some("a b"));
        assert!(word("/???/r?").glob);
        assert!(word("[r]m").glob);
        assert_eq!(word("[").text().as_deref(), Some("["));
        assert_eq!(word("{}").text().as_deref(), Some("{}"));
        assert!(word("{a,b}").expanded);
        assert!(word("x{1..3}").expanded);
        assert!(word("~/x").expanded);
        assert!(word("--prefix=~/x").expanded);
        assert_eq!(word("a~").text().as_deref(), Some("a~"));
        assert!(word("*.rs").may_be_option);
        assert!(!word("src/*.rs").may_be_option);
    }

    #[test]
    fn syntax_inside_a_plain_word_is_an_error() {
        for bad in ["a b", "a'b", "a$(b", "a`b", "a;b", "$x", "${x}", "#x"] {
            assert!(unquoted(bad, true, &mut Vec::new()).is_err(), "{bad}");
        }
        assert!(unquoted("a$", true, &mut Vec::new()).is_ok());
        assert!(unquoted("a#b", true, &mut Vec::new()).is_ok());
    }

    #[test]
    fn heredoc_delimiters_are_computed_with_bash_quote_removal_or_refused() {
        let d = |w: &str| heredoc_delimiter(w);
        assert_eq!(d("EOF").unwrap(), ("EOF".to_owned(), false));
        assert_eq!(d("'EOF'").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("\"EOF\"").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("E''OF").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("E\"O\"F").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("EOF\"\"").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("E\\OF").unwrap(), ("EOF".to_owned(), true));
        assert_eq!(d("E'$'F").unwrap(), ("E$F".to_owned(), true));
        for refused in [
            "$'EOF'", "$\"EOF\"", "E$'O'F", "E$\"OF\"", "E$F", "\"E$F\"", "'E", "`x`",
        ] {
            assert!(d(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_heredoc_body_line_bash_takes_for_the_delimiter_is_found() {
        // The body as the grammar read it, ending with the newline before its terminator.
        assert!(heredoc_line_ends("EOF\nrm v\n", "EOF", false, false));
        assert!(!heredoc_line_ends("EOFx\n EOF\n", "EOF", false, true));
        assert!(heredoc_line_ends("\t\tEOF\nrm v\n", "EOF", true, false));
        assert!(!heredoc_line_ends("\tEOF\n", "EOF", false, false));
        // Unquoted: `E\` + `OF` is joined into the delimiter; quoted it is not.
        assert!(heredoc_line_ends("E\\\nOF\nrm v\n", "EOF", false, true));
        assert!(!heredoc_line_ends("E\\\nOF\nrm v\n", "EOF", false, false));
        assert!(!heredoc_line_ends("hello \\\nworld\n", "EOF", false, true));
    }

    #[test]
    fn ansi_c_strings_decode_exactly_or_not_at_all() {
        let decode = |s: &str| {
            let mut raw = Vec::new();
            ansi_c(s, &mut raw).map(|()| Word::from_raw(&raw, s).text().unwrap())
        };
        assert_eq!(decode("\\x72m").unwrap(), "rm");
        assert_eq!(decode("\\162\\155").unwrap(), "rm");
        assert_eq!(decode("\\u0072m").unwrap(), "rm");
        assert_eq!(decode("a\\tb\\'").unwrap(), "a\tb'");
        assert_eq!(decode("\\q").unwrap(), "\\q");
        assert_eq!(decode("\\xc3\\xa9").unwrap(), "é");
        assert!(decode("r\\0m").is_err());
        assert!(decode("\\cA").is_err());
        assert!(decode("\\xff").is_err());
        assert!(decode("\\u00e9").is_err());
    }
}
