//! Which words of a command are paths it reads or writes, for path rules (best effort:
//! literal arguments), and small predicates over words.

use super::*;

pub(super) fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Arithmetic text with only numbers and operators (no variable names, no expansions).
pub(super) fn is_literal_arithmetic(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_ascii_digit() || c.is_whitespace() || "+-*/%()<>=!&|^~?:,".contains(c))
}

/// Whether every operand of a `[[ … ]]` / `[ … ]` with arithmetic comparisons is a number.
pub(super) fn only_number_operands(text: &str) -> bool {
    text.split_whitespace()
        .filter(|w| !matches!(*w, "[[" | "]]" | "[" | "]" | "&&" | "||" | "!" | "(" | ")"))
        .all(|w| {
            is_digits(w.trim_start_matches('-'))
                || (w.starts_with('-') && w[1..].chars().all(|c| c.is_ascii_alphabetic()))
        })
}

/// A literal path that stays in the workspace: relative, no `..` component, no `~`.
pub(super) fn is_workspace_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.starts_with('~')
        && !path.split('/').any(|c| c == "..")
}

/// Commands that change or remove every path they are given.
pub(super) const WRITES_ALL: &[&str] = &[
    "rm", "rmdir", "touch", "tee", "truncate", "mv", "mkdir", "chmod", "chown", "chgrp", "shred",
    "unlink",
];
/// Commands whose last path argument is written (the others are read).
pub(super) const WRITES_LAST: &[&str] = &["cp", "install", "ln", "rsync", "scp"];
/// Commands that write their file arguments in place when given `-i` / `--in-place`.
pub(super) const IN_PLACE: &[&str] = &["sed", "perl", "ruby"];

/// The literal paths a command line names, each with whether it is written: every argument that
/// is not an option (and the value of `--opt=value`), the program itself when written as a path,
/// redirection targets (`> f`, `>> f`, `2> f` are writes, `< f` a read), `dd`'s `if=`/`of=`.
/// An argument counts as written for commands that change their arguments (`rm`, `mv`, `touch`,
/// `tee`, `chmod`, …, the last argument of `cp`/`ln`/`install`, `sed -i`), and as read otherwise.
/// Unknown parts of a word (globs, expansions) are shown as `*`.
///
/// Best effort by design, for path rules only: paths built from variables, `cd` followed by
/// relative paths, or paths inside scripts are not seen (the sandbox is the boundary for those).
/// Words that are not paths at all are returned too (`echo hello` names `hello`), which can only
/// make a decision stricter.
pub fn path_words(command: &str) -> Vec<(String, bool)> {
    path_words_of(&analyze(command), command)
}

/// The literal targets of the line's file redirections (`> f`, `>> f`, `< f`, `&> f`), each
/// with whether it is written; `/dev/null` and computed targets are left out. Policy resolves
/// them against the workspace when it decides (`Subject::command`, then the registry), since
/// a literal path can lead through a symlink (`g -> .git`).
pub fn redirect_targets(analysis: &Analysis) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    for r in analysis
        .commands
        .iter()
        .flat_map(|c| c.redirects.iter())
        .chain(analysis.loose_redirects.iter())
    {
        let Some(path) = r.target.text() else {
            continue;
        };
        if path == "/dev/null" {
            continue;
        }
        let entry = (path, r.write);
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}

/// [`path_words`] of an analysis already made of `command`.
pub fn path_words_of(analysis: &Analysis, command: &str) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let push = |word: &str, write: bool, out: &mut Vec<(String, bool)>| {
        let word = word.trim();
        if word.is_empty() || word == "-" || word.contains("://") {
            return;
        }
        let entry = (word.to_owned(), write);
        if !out.contains(&entry) {
            out.push(entry);
        }
    };
    if analysis.commands.is_empty() && analysis.unprovable.is_some() {
        // Unparseable: every whitespace-separated word.
        for w in command
            .replace(['\'', '"', '(', ')', ';', '&', '|', '<', '>'], " ")
            .split_whitespace()
        {
            push(w, false, &mut out);
        }
        return out;
    }
    for cmd in &analysis.commands {
        if cmd.role == Role::Program {
            program_path_words(cmd, &mut out, &push);
        }
        for r in &cmd.redirects {
            push(&r.target.render(), r.write, &mut out);
        }
    }
    for r in &analysis.loose_redirects {
        push(&r.target.render(), r.write, &mut out);
    }
    out
}

pub(super) fn program_path_words(
    cmd: &Command,
    out: &mut Vec<(String, bool)>,
    push: &impl Fn(&str, bool, &mut Vec<(String, bool)>),
) {
    let words: Vec<String> = cmd.words.iter().map(Word::render).collect();
    let Some((program, args)) = words.split_first() else {
        return;
    };
    if program.contains('/') {
        push(program, false, out);
    }
    let name = program.rsplit('/').next().unwrap_or(program);
    let in_place = IN_PLACE.contains(&name)
        && args
            .iter()
            .any(|a| (a.starts_with("-i") && !a.starts_with("--")) || a.starts_with("--in-place"));
    let writes_all = WRITES_ALL.contains(&name) || in_place;
    let last_operand = args
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.starts_with('-'))
        .map(|(i, _)| i)
        .next_back();
    for (i, arg) in args.iter().enumerate() {
        if let Some((key, value)) = arg.split_once('=') {
            if name == "dd" && (key == "of" || key == "if") {
                push(value, key == "of", out);
                continue;
            }
            if key.starts_with('-') || programs::is_assignment(arg) {
                push(value, writes_all, out);
                continue;
            }
        }
        if arg.starts_with('-') {
            continue;
        }
        let write = writes_all || (WRITES_LAST.contains(&name) && Some(i) == last_operand);
        push(arg, write, out);
    }
}
