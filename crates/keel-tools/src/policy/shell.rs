//! Splitting a shell command line into the simple commands it would run, for policy.
//!
//! Pure and conservative: operators (`&&`, `||`, `;`, `|`, `|&`, `&`, newlines), subshells `( … )`,
//! groups `{ …; }`, command substitution `$( … )` and backticks, process substitution `<( … )`
//! all separate commands; `bash -c '…'`, `sh -c`, `eval …` and `env -S '…'` are parsed again;
//! `find … -exec CMD … ;` yields `CMD`; wrappers (`timeout`, `nohup`, `setsid`, `env`, `xargs`,
//! `nice`, `ionice`, `stdbuf`, `time`, `command`, `exec`, `builtin`, `sudo`, `doas`, `unbuffer`,
//! `chronic`) and leading `VAR=value` assignments are stripped so the real command is what rules match. Input that cannot be parsed
//! (unbalanced quotes or parentheses) is an error, which policy turns into `ask`, never `allow`.
//! Here-document bodies are read as commands too, which can only make a decision stricter.

/// Why a command line could not be split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellParseError(pub String);

/// Maximum nesting of `bash -c` / subshells followed before giving up (stricter: error).
const MAX_DEPTH: usize = 8;

/// Splits `command` into the simple commands it runs, each normalized to its words joined by one
/// space, wrappers stripped. Empty commands are dropped.
pub fn split_commands(command: &str) -> Result<Vec<String>, ShellParseError> {
    let mut out = Vec::new();
    split_into(command, 0, &mut out)?;
    Ok(out)
}

fn split_into(command: &str, depth: usize, out: &mut Vec<String>) -> Result<(), ShellParseError> {
    if depth > MAX_DEPTH {
        return Err(ShellParseError("commands nested too deeply".into()));
    }
    let chars: Vec<char> = command.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        pos: 0,
        depth,
    };
    let segments = lexer.segments(None)?;
    for segment in segments {
        for nested in &segment.nested {
            split_into(nested, depth + 1, out)?;
        }
        simple_commands(segment.words, depth, out)?;
    }
    Ok(())
}

/// One simple command's words (unquoted), plus code found nested inside it.
#[derive(Debug, Default)]
struct Segment {
    words: Vec<String>,
    nested: Vec<String>,
}

struct Lexer<'a> {
    chars: &'a [char],
    pos: usize,
    depth: usize,
}

impl Lexer<'_> {
    fn peek(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    /// Reads segments until end of input, or until the closing `close` char (consumed).
    fn segments(&mut self, close: Option<char>) -> Result<Vec<Segment>, ShellParseError> {
        let mut segments = Vec::new();
        let mut current = Segment::default();
        let mut word = String::new();
        let mut in_word = false;
        let flush_word = |word: &mut String, in_word: &mut bool, seg: &mut Segment| {
            if *in_word {
                seg.words.push(std::mem::take(word));
                *in_word = false;
            }
        };
        loop {
            let Some(c) = self.peek(0) else {
                if close.is_some() {
                    return Err(ShellParseError("unbalanced parenthesis".into()));
                }
                break;
            };
            match c {
                '\\' => {
                    match self.peek(1) {
                        Some('\n') => {}
                        Some(next) => {
                            word.push(next);
                            in_word = true;
                        }
                        None => {
                            word.push('\\');
                            in_word = true;
                        }
                    }
                    self.pos += 2;
                }
                '\'' => {
                    self.pos += 1;
                    loop {
                        match self.peek(0) {
                            None => {
                                return Err(ShellParseError("unterminated single quote".into()));
                            }
                            Some('\'') => {
                                self.pos += 1;
                                break;
                            }
                            Some(ch) => {
                                word.push(ch);
                                self.pos += 1;
                            }
                        }
                    }
                    in_word = true;
                }
                '"' => {
                    self.pos += 1;
                    loop {
                        match self.peek(0) {
                            None => {
                                return Err(ShellParseError("unterminated double quote".into()));
                            }
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some('\\') => {
                                if let Some(next) = self.peek(1) {
                                    if !matches!(next, '"' | '\\' | '$' | '`' | '\n') {
                                        word.push('\\');
                                    }
                                    if next != '\n' {
                                        word.push(next);
                                    }
                                }
                                self.pos += 2;
                            }
                            Some('$') if self.peek(1) == Some('(') => {
                                let inner = self.substitution()?;
                                word.push_str("$(");
                                word.push_str(&inner);
                                word.push(')');
                                current.nested.push(inner);
                            }
                            Some('`') => {
                                let inner = self.backtick()?;
                                word.push('`');
                                word.push_str(&inner);
                                word.push('`');
                                current.nested.push(inner);
                            }
                            Some(ch) => {
                                word.push(ch);
                                self.pos += 1;
                            }
                        }
                    }
                    in_word = true;
                }
                '$' if self.peek(1) == Some('(') => {
                    let inner = self.substitution()?;
                    word.push_str("$(");
                    word.push_str(&inner);
                    word.push(')');
                    current.nested.push(inner);
                    in_word = true;
                }
                '`' => {
                    let inner = self.backtick()?;
                    word.push('`');
                    word.push_str(&inner);
                    word.push('`');
                    current.nested.push(inner);
                    in_word = true;
                }
                '<' | '>' if self.peek(1) == Some('(') => {
                    // Process substitution.
                    self.pos += 1;
                    let inner = self.substitution_body()?;
                    current.nested.push(inner);
                    in_word = true;
                    word.push_str("<(…)");
                }
                '(' => {
                    // Subshell (or arithmetic/array, which we conservatively treat the same).
                    self.pos += 1;
                    flush_word(&mut word, &mut in_word, &mut current);
                    let inner = self.segments(Some(')'))?;
                    push_segment(&mut segments, std::mem::take(&mut current));
                    for seg in inner {
                        push_segment(&mut segments, seg);
                    }
                }
                ')' => {
                    if close == Some(')') {
                        self.pos += 1;
                        flush_word(&mut word, &mut in_word, &mut current);
                        push_segment(&mut segments, current);
                        return Ok(segments);
                    }
                    return Err(ShellParseError("unbalanced parenthesis `)`".into()));
                }
                ';' | '\n' => {
                    self.pos += 1;
                    flush_word(&mut word, &mut in_word, &mut current);
                    push_segment(&mut segments, std::mem::take(&mut current));
                }
                '|' => {
                    // `|`, `||`, `|&`
                    self.pos += if matches!(self.peek(1), Some('|') | Some('&')) {
                        2
                    } else {
                        1
                    };
                    flush_word(&mut word, &mut in_word, &mut current);
                    push_segment(&mut segments, std::mem::take(&mut current));
                }
                '&' => {
                    if self.peek(1) == Some('>') {
                        // `&>file` redirection.
                        word.push('&');
                        in_word = true;
                        self.pos += 1;
                    } else if in_word && (word.ends_with('>') || word.ends_with('<')) {
                        // `2>&1`, `<&3`
                        word.push('&');
                        self.pos += 1;
                    } else {
                        self.pos += if self.peek(1) == Some('&') { 2 } else { 1 };
                        flush_word(&mut word, &mut in_word, &mut current);
                        push_segment(&mut segments, std::mem::take(&mut current));
                    }
                }
                '#' if !in_word => {
                    // Comment to end of line.
                    while let Some(ch) = self.peek(0) {
                        if ch == '\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                c if c.is_whitespace() => {
                    self.pos += 1;
                    flush_word(&mut word, &mut in_word, &mut current);
                }
                c => {
                    word.push(c);
                    in_word = true;
                    self.pos += 1;
                }
            }
        }
        flush_word(&mut word, &mut in_word, &mut current);
        push_segment(&mut segments, current);
        Ok(segments)
    }

    /// At `$(`: returns the raw inner text and moves past the closing `)`.
    fn substitution(&mut self) -> Result<String, ShellParseError> {
        self.pos += 1; // `$`
        self.substitution_body()
    }

    /// At `(`: returns the raw text up to the matching `)` (respecting quotes), consuming it.
    fn substitution_body(&mut self) -> Result<String, ShellParseError> {
        self.pos += 1; // `(`
        let start = self.pos;
        let mut level = 1usize;
        let mut quote: Option<char> = None;
        while let Some(c) = self.peek(0) {
            match (quote, c) {
                (Some('\''), '\'') => quote = None,
                (Some('\''), _) => {}
                (Some('"'), '"') => quote = None,
                (_, '\\') => self.pos += 1,
                (None, '\'') | (None, '"') => quote = Some(c),
                (None, '(') => level += 1,
                (None, ')') => {
                    level -= 1;
                    if level == 0 {
                        let inner: String = self.chars[start..self.pos].iter().collect();
                        self.pos += 1;
                        let _ = self.depth;
                        return Ok(inner);
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
        Err(ShellParseError("unbalanced `$(` or `<(`".into()))
    }

    /// At a backtick: returns the raw inner text and moves past the closing backtick.
    fn backtick(&mut self) -> Result<String, ShellParseError> {
        self.pos += 1;
        let start = self.pos;
        while let Some(c) = self.peek(0) {
            if c == '\\' {
                self.pos += 2;
                continue;
            }
            if c == '`' {
                let inner: String = self.chars[start..self.pos].iter().collect();
                self.pos += 1;
                return Ok(inner);
            }
            self.pos += 1;
        }
        Err(ShellParseError("unterminated backtick".into()))
    }
}

fn push_segment(segments: &mut Vec<Segment>, segment: Segment) {
    if !segment.words.is_empty() || !segment.nested.is_empty() {
        segments.push(segment);
    }
}

/// Reserved words that may start a simple command and carry no meaning for policy.
const LEADING_KEYWORDS: &[&str] = &[
    "!", "{", "}", "then", "do", "else", "elif", "if", "while", "until", "fi", "done", "esac",
];

/// Turns one segment's words into normalized commands (usually one), stripping wrappers and
/// recursing into `bash -c`, `eval`, `env -S` and `find -exec`.
fn simple_commands(
    mut words: Vec<String>,
    depth: usize,
    out: &mut Vec<String>,
) -> Result<(), ShellParseError> {
    loop {
        // Leading keywords and trailing `}` / `fi` etc.
        while words
            .first()
            .is_some_and(|w| LEADING_KEYWORDS.contains(&w.as_str()))
        {
            words.remove(0);
        }
        // Leading assignments `FOO=bar`.
        while words.first().is_some_and(|w| is_assignment(w)) {
            words.remove(0);
        }
        let Some(first) = words.first().cloned() else {
            return Ok(());
        };
        let program = first.rsplit('/').next().unwrap_or(&first).to_owned();
        let rest = &words[1..];
        let stripped: Option<Vec<String>> = match program.as_str() {
            "nohup" | "builtin" | "exec" | "setsid" | "unbuffer" | "chronic" => {
                Some(skip_flags(rest, &[], &[]))
            }
            "doas" => Some(skip_flags(rest, &["-u", "-C"], &[])),
            "time" => Some(skip_flags(rest, &[], &["-p"])),
            "command" => Some(skip_flags(rest, &[], &["-p"])),
            "timeout" => {
                let after = skip_flags(rest, &["-s", "-k", "--signal", "--kill-after"], &[]);
                // The duration.
                Some(after.into_iter().skip(1).collect())
            }
            "nice" => Some(skip_flags(rest, &["-n", "--adjustment"], &[])),
            "ionice" => Some(skip_flags(
                rest,
                &["-c", "-n", "-p", "--class", "--classdata"],
                &[],
            )),
            "stdbuf" => Some(skip_flags(
                rest,
                &["-i", "-o", "-e", "--input", "--output", "--error"],
                &[],
            )),
            "sudo" => Some(skip_flags(
                rest,
                &[
                    "-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group",
                ],
                &[],
            )),
            "xargs" => Some(skip_flags(
                rest,
                &[
                    "-I",
                    "-n",
                    "-P",
                    "-L",
                    "-d",
                    "-E",
                    "-s",
                    "-a",
                    "--max-args",
                    "--max-procs",
                    "--delimiter",
                    "--arg-file",
                ],
                &[],
            )),
            "env" => {
                let mut i = 0;
                let mut result = None;
                while i < rest.len() {
                    let w = &rest[i];
                    if w == "-S" || w == "--split-string" {
                        if let Some(script) = rest.get(i + 1) {
                            let mut joined = script.clone();
                            for extra in &rest[i + 2..] {
                                joined.push(' ');
                                joined.push_str(extra);
                            }
                            split_into(&joined, depth + 1, out)?;
                        }
                        return Ok(());
                    } else if w == "-u" || w == "-C" || w == "--unset" || w == "--chdir" {
                        i += 2;
                    } else if w.starts_with('-') || is_assignment(w) {
                        i += 1;
                    } else {
                        result = Some(rest[i..].to_vec());
                        break;
                    }
                }
                Some(result.unwrap_or_default())
            }
            "bash" | "sh" | "zsh" | "dash" | "ksh" => {
                // `bash [-opts] -c SCRIPT`
                let mut script = None;
                let mut i = 0;
                while i < rest.len() {
                    let w = &rest[i];
                    if w.starts_with('-') && !w.starts_with("--") && w.contains('c') {
                        script = rest.get(i + 1).cloned();
                        break;
                    } else if w.starts_with('-') {
                        i += 1;
                    } else {
                        break;
                    }
                }
                match script {
                    Some(script) => {
                        split_into(&script, depth + 1, out)?;
                        return Ok(());
                    }
                    None => None,
                }
            }
            "eval" => {
                split_into(&rest.join(" "), depth + 1, out)?;
                return Ok(());
            }
            _ => None,
        };
        match stripped {
            Some(inner) if !inner.is_empty() => {
                words = inner;
                continue;
            }
            _ => {}
        }
        // `find … -exec CMD … ;` runs CMD as well.
        if program == "find" {
            let mut i = 0;
            while i < words.len() {
                if matches!(words[i].as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
                    let end = words[i + 1..]
                        .iter()
                        .position(|w| w == ";" || w == "+")
                        .map_or(words.len(), |p| i + 1 + p);
                    let inner: Vec<String> = words[i + 1..end].to_vec();
                    simple_commands(inner, depth + 1, out)?;
                    i = end;
                }
                i += 1;
            }
        }
        out.push(words.join(" "));
        return Ok(());
    }
}

/// Commands that change or remove every path they are given.
const WRITES_ALL: &[&str] = &[
    "rm", "rmdir", "touch", "tee", "truncate", "mv", "mkdir", "chmod", "chown", "chgrp", "shred",
    "unlink",
];
/// Commands whose last path argument is written (the others are read).
const WRITES_LAST: &[&str] = &["cp", "install", "ln", "rsync", "scp"];
/// Commands that write their file arguments in place when given `-i` / `--in-place`.
const IN_PLACE: &[&str] = &["sed", "perl", "ruby"];

/// The literal paths a command line names, each with whether it is written: every argument that
/// is not an option (and the value of `--opt=value`), the program itself when written as a path,
/// redirection targets (`> f`, `>> f`, `2> f` are writes, `< f` a read), `dd`'s `if=`/`of=`.
/// An argument counts as written for commands that change their arguments (`rm`, `mv`, `touch`,
/// `tee`, `chmod`, …, the last argument of `cp`/`ln`/`install`, `sed -i`), and as read otherwise.
///
/// Best effort by design, for path rules only: paths built from variables, globs expanded by the
/// shell, `cd` followed by relative paths, or paths inside scripts are not seen (the sandbox is
/// the boundary for those). Words that are not paths at all are returned too (`echo hello` names
/// `hello`), which can only make a decision stricter. Unparseable input is split on whitespace.
pub fn path_words(command: &str) -> Vec<(String, bool)> {
    let parts = split_commands(command)
        .unwrap_or_else(|_| vec![command.replace(['\'', '"', '(', ')', ';', '&', '|'], " ")]);
    let mut out: Vec<(String, bool)> = Vec::new();
    let push = |word: &str, write: bool, out: &mut Vec<(String, bool)>| {
        let word = word.trim();
        if word.is_empty() || word == "-" || word.contains("://") || word.starts_with('&') {
            return;
        }
        let entry = (word.to_owned(), write);
        if !out.contains(&entry) {
            out.push(entry);
        }
    };
    for part in parts {
        let words: Vec<&str> = part.split_whitespace().collect();
        let Some((program, args)) = words.split_first() else {
            continue;
        };
        if program.contains('/') {
            push(program, false, &mut out);
        }
        let name = program.rsplit('/').next().unwrap_or(program);
        let in_place = IN_PLACE.contains(&name)
            && args.iter().any(|a| {
                (a.starts_with("-i") && !a.starts_with("--")) || a.starts_with("--in-place")
            });
        let writes_all = WRITES_ALL.contains(&name) || in_place;
        let operands: Vec<usize> = args
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.starts_with('-') && !a.contains(['<', '>']))
            .map(|(i, _)| i)
            .collect();
        let last_operand = operands.last().copied();
        let mut redirect: Option<bool> = None;
        for (i, arg) in args.iter().enumerate() {
            if let Some(write) = redirect.take() {
                push(arg, write, &mut out);
                continue;
            }
            if let Some(pos) = arg.find(['<', '>']) {
                // `>f`, `2>>f`, `<f`, `a>f` (quotes are gone by now: conservative).
                let write = arg[pos..].starts_with('>');
                push(
                    arg[..pos].trim_end_matches(|c: char| c.is_ascii_digit()),
                    false,
                    &mut out,
                );
                let after_ops = arg[pos..].trim_start_matches(['<', '>', '|']);
                if after_ops.starts_with('&') {
                    // `2>&1`, `>&2`, `<&3`: duplicates a descriptor, names no file.
                    continue;
                }
                let target = after_ops;
                if target.is_empty() {
                    redirect = Some(write);
                } else {
                    push(target, write, &mut out);
                }
                continue;
            }
            if let Some((key, value)) = arg.split_once('=') {
                if name == "dd" && (key == "of" || key == "if") {
                    push(value, key == "of", &mut out);
                    continue;
                }
                if key.starts_with('-') || is_assignment(arg) {
                    push(value, writes_all, &mut out);
                    continue;
                }
            }
            if arg.starts_with('-') {
                continue;
            }
            let write = writes_all || (WRITES_LAST.contains(&name) && Some(i) == last_operand);
            push(arg, write, &mut out);
        }
    }
    out
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// Skips leading options: flags in `with_value` consume the next word (unless written `-x=v` /
/// `-xV`), any other word starting with `-` is a flag on its own. Stops at `--` (consumed).
fn skip_flags(words: &[String], with_value: &[&str], _no_value: &[&str]) -> Vec<String> {
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        if w == "--" {
            i += 1;
            break;
        }
        if !w.starts_with('-') || w == "-" {
            break;
        }
        if with_value.contains(&w) {
            i += 2;
        } else {
            i += 1;
        }
    }
    words.get(i..).map(<[String]>::to_vec).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Vec<String> {
        split_commands(s).unwrap()
    }

    #[test]
    fn splits_operators_and_keeps_quoted_separators() {
        assert_eq!(
            split("a && b || c; d | e\nf & g"),
            ["a", "b", "c", "d", "e", "f", "g"]
        );
        assert_eq!(split("echo 'a;b' \"c && d\""), ["echo a;b c && d"]);
        assert_eq!(
            split("cargo test 2>&1 | tail -n 5"),
            ["cargo test 2>&1", "tail -n 5"]
        );
    }

    #[test]
    fn subshells_and_substitutions_are_separate_commands() {
        assert_eq!(split("(cd x && rm y)"), ["cd x", "rm y"]);
        assert_eq!(split("echo $(rm -rf z)"), ["rm -rf z", "echo $(rm -rf z)"]);
        assert_eq!(split("echo `whoami`"), ["whoami", "echo `whoami`"]);
        assert_eq!(
            split("diff <(ls a) <(ls b)"),
            ["ls a", "ls b", "diff <(…) <(…)"]
        );
    }

    #[test]
    fn wrappers_are_stripped() {
        assert_eq!(split("timeout -s KILL 10 cargo test"), ["cargo test"]);
        assert_eq!(split("nohup env -i FOO=1 rm -rf x"), ["rm -rf x"]);
        assert_eq!(
            split("find . -name '*.o' | xargs -0 -n 1 rm -f"),
            ["find . -name *.o", "rm -f"]
        );
        assert_eq!(split("FOO=bar /usr/bin/git push"), ["/usr/bin/git push"]);
        assert_eq!(
            split("bash -lc 'git push && echo ok'"),
            ["git push", "echo ok"]
        );
        assert_eq!(
            split("find . -exec rm {} \\;"),
            ["rm {}", "find . -exec rm {} ;"]
        );
    }

    #[test]
    fn path_words_name_arguments_and_redirections_with_their_access() {
        let w = |s: &str| path_words(s);
        assert_eq!(
            w("cat secrets/x | tee out.txt"),
            [
                ("secrets/x".to_owned(), false),
                ("out.txt".to_owned(), true)
            ]
        );
        assert_eq!(
            w("echo hi >> log.txt 2>&1 &>all.txt"),
            [
                ("hi".to_owned(), false),
                ("log.txt".to_owned(), true),
                ("all.txt".to_owned(), true)
            ]
        );
        assert_eq!(
            w("cp -r a b/c"),
            [("a".to_owned(), false), ("b/c".to_owned(), true)]
        );
        assert_eq!(
            w("sed -i s/a/b/ f.txt"),
            [("s/a/b/".to_owned(), true), ("f.txt".to_owned(), true)]
        );
        assert_eq!(
            w("dd if=a of=b"),
            [("a".to_owned(), false), ("b".to_owned(), true)]
        );
        assert_eq!(w("wc <in.txt"), [("in.txt".to_owned(), false)]);
        assert_eq!(
            w("./run.sh --config=cfg.toml"),
            [
                ("./run.sh".to_owned(), false),
                ("cfg.toml".to_owned(), false)
            ]
        );
        assert_eq!(w("curl https://x.example/a"), []);
    }

    #[test]
    fn unbalanced_input_is_an_error() {
        assert!(split_commands("echo 'oops").is_err());
        assert!(split_commands("(echo hi").is_err());
        assert!(split_commands("echo $(true").is_err());
    }
}
