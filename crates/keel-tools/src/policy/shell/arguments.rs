//! What the arguments of a program keel knows nothing about could run
//! ([`Command::argument_commands`]), for deny and ask rules.
//!
//! Such a program may be a wrapper nobody listed (`cgexec -g cpu:x rm v`) or take a command in
//! an option's value (`split --filter='rm v'` was one before keel knew split): so every run of
//! words from a literal word that is not an option counts, and so does every command that the
//! text after the first or second `=` of a word (`--filter=rm v`, `-o ProxyCommand=rm v`,
//! `--config=hooks.x=rm v`) or a whole non-option word (`--exec 'make; rm v'`) parses into as
//! a bash line.

use super::words::Word;
use super::{Command, analyze, join_tokens};
use crate::policy::pattern::CmdTok;

/// How deep commands found in argument values are searched for further argument commands
/// (`a --x='b --y="rm v"'` is two levels).
const MAX_VALUE_DEPTH: usize = 4;

impl Command {
    /// For a program keel has no rule for ([`Command::args_may_run`]): the commands its
    /// arguments could be, as `(text, tokens)` — see the module docs. Runs of words are offered
    /// once as written and once with a program path written by name (`/bin/rm v` → `rm v`);
    /// commands parsed from a value come with the ones their own arguments could be.
    pub(crate) fn argument_commands(&self) -> Vec<(String, Vec<CmdTok>)> {
        let mut out = Vec::new();
        self.argument_commands_into(0, &mut out);
        out
    }

    fn argument_commands_into(&self, depth: usize, out: &mut Vec<(String, Vec<CmdTok>)>) {
        if !self.args_may_run || depth > MAX_VALUE_DEPTH {
            return;
        }
        for k in 1..self.words.len() {
            let Some(text) = self.words[k].text() else {
                continue;
            };
            let rest = &self.words[k + 1..];
            if !text.is_empty() && !text.starts_with('-') && !text.contains('=') {
                push_run(&self.words[k], rest, out);
            }
            let mut lines = Vec::new();
            if !text.starts_with('-') {
                lines.push(text.as_str());
            }
            // After the first `=` (`--opt=VALUE`, `Key=VALUE`) and the second (`--opt=Key=VALUE`):
            // two at most, so that the text read stays linear in the line's length.
            for (at, _) in text.match_indices('=').take(2) {
                let value = &text[at + 1..];
                if !value.is_empty() {
                    push_run(&Word::literal(value), rest, out);
                    lines.push(value);
                }
            }
            for line in lines.into_iter().filter(|l| is_command_line(l)) {
                for command in analyze(line).commands() {
                    out.push((command.text(), command.tokens()));
                    if let Some(by_name) = command.tokens_by_name() {
                        out.push((command.text(), by_name));
                    }
                    command.argument_commands_into(depth + 1, out);
                }
            }
        }
    }
}

/// Words of a run kept as written: the rest is one unknown part, which deny and ask rules
/// (the only readers) may match to anything — so a long line costs linear, not quadratic,
/// time and matches at least what it did.
const MAX_RUN_WORDS: usize = 32;

/// Pushes the run of words `first`, `rest…` as a command, and again with a program path
/// written by name.
fn push_run(first: &Word, rest: &[Word], out: &mut Vec<(String, Vec<CmdTok>)>) {
    let tail;
    let rest = if rest.len() > MAX_RUN_WORDS {
        tail = rest[..MAX_RUN_WORDS]
            .iter()
            .cloned()
            .chain(std::iter::once(Word::any("…")))
            .collect::<Vec<_>>();
        tail.as_slice()
    } else {
        rest
    };
    let text = std::iter::once(first)
        .chain(rest)
        .map(|w| w.src.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    out.push((
        text.clone(),
        join_tokens(
            std::iter::once(first.toks.as_slice()).chain(rest.iter().map(|w| w.toks.as_slice())),
        ),
    ));
    let Some(program) = first.text() else {
        return;
    };
    if let Some(name) = program
        .rsplit('/')
        .next()
        .filter(|n| *n != program && !n.is_empty())
    {
        let named = Word::literal(name);
        out.push((
            text,
            join_tokens(
                std::iter::once(named.toks.as_slice())
                    .chain(rest.iter().map(|w| w.toks.as_slice())),
            ),
        ));
    }
}

/// Whether `text` is more than one plain word, so that reading it as a bash line can find
/// commands a run of words does not show (`make; rm v`, `x && rm v`, `$(rm v)`).
fn is_command_line(text: &str) -> bool {
    text.chars().any(|c| {
        c.is_whitespace()
            || matches!(
                c,
                ';' | '&'
                    | '|'
                    | '<'
                    | '>'
                    | '('
                    | ')'
                    | '$'
                    | '`'
                    | '\''
                    | '"'
                    | '\\'
                    | '{'
                    | '}'
                    | '\n'
            )
    })
}

#[cfg(test)]
mod tests {
    use super::super::analyze;

    /// The texts of the argument commands of the line's first command.
    fn argument_texts(line: &str) -> Vec<String> {
        let a = analyze(line);
        let mut texts: Vec<String> = a.commands()[0]
            .argument_commands()
            .into_iter()
            .map(|(text, _)| text)
            .collect();
        texts.dedup();
        texts
    }

    #[test]
    fn option_values_and_command_lines_in_arguments_count() {
        let t = argument_texts("frob --exec='make && rm v' --level=3");
        assert!(t.contains(&"rm v".to_owned()), "{t:?}");
        assert!(t.contains(&"make".to_owned()), "{t:?}");
        let t = argument_texts("frob -o 'Hook=rm -rf x' y");
        assert!(t.contains(&"rm -rf x y".to_owned()), "{t:?}");
        let t = argument_texts("frob --exec 'true; /bin/rm v'");
        assert!(t.contains(&"/bin/rm v".to_owned()), "{t:?}");
        let t = argument_texts(r#"frob --x='bar --y="rm v"'"#);
        assert!(t.contains(&"rm v".to_owned()), "{t:?}");
        assert!(argument_texts("grep --exec='rm v' x").is_empty());
    }

    #[test]
    fn a_long_line_of_values_is_read_in_linear_time() {
        let line = format!("frob {}", "'--x=a=b; c=d && e' ".repeat(3000));
        let start = std::time::Instant::now();
        let texts = argument_texts(&line);
        // Correctness deadline with a wide margin (a debug build takes well under a second).
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
        assert!(texts.iter().any(|t| t == "e"), "{:?}", &texts[..4]);
    }

    #[test]
    fn nested_values_are_followed_down_to_the_depth_bound() {
        let nest = |levels: usize| {
            let mut line = "rm v".to_owned();
            for _ in 0..levels {
                line = format!("frob --x='{}'", line.replace('\'', "'\\''"));
            }
            argument_texts(&line).contains(&"rm v".to_owned())
        };
        assert!(nest(super::MAX_VALUE_DEPTH + 1));
        assert!(!nest(super::MAX_VALUE_DEPTH + 3));
    }
}
