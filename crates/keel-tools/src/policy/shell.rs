//! What a shell command line runs, for policy: parsed with the tree-sitter bash grammar, the
//! grammar `shell` runs lines with (`bash -c`).
//!
//! [`analyze`] returns the commands a line runs ([`Analysis::commands`]), each with its words
//! as rules match them, and two verdicts on the line as a whole:
//!
//! - **unprovable** ([`Analysis::unprovable`], with the reason): what runs cannot be known from
//!   the text. Policy then treats the line as matching every `shell` deny and ask rule (see
//!   [`crate::policy`]). A line is unprovable when:
//!   - it does not parse (a syntax error, or text the grammar and bash would read differently:
//!     the word checks in `words` double-check every literal the grammar reports, a `$` glued
//!     to the quote after it (`rm$"" v`) is read as bash reads it, and a backquote or `$(`
//!     left as text inside `${…}` is unprovable);
//!   - a here-document ends where bash would not end it: the delimiter is computed with
//!     bash's quote removal (`E''OF` is `EOF`) and the body must hold no line bash takes for
//!     it (`<<-` tabs and unquoted line continuations applied); a delimiter bash versions
//!     read differently (`$'EOF'`, `$"EOF"`, any `$`) is unprovable;
//!   - a command name is computed: `$(echo rm) v`, `$a v`, `rm${IFS}v`, `"$@"`, a glob
//!     (`/???/r? v`), a brace or tilde expansion;
//!   - it runs code given as data: `eval`, `source`/`.`, `trap`, `alias`, `enable`, `hash`,
//!     `fc`, `coproc`, `compgen`, `complete`, `bind`, `let` and arithmetic (`$((…))`, `((…))`,
//!     C-style `for`, `[[ … -eq … ]]`, array subscripts, `${x:off}`, `${!x}`) over anything
//!     but literal numbers (bash evaluates `a[$(cmd)]` found in a variable's value), `read`,
//!     `printf -v`, `test -v` and the like with a subscripted name, `declare`/`local`/`export`
//!     with options, `mapfile -C`, `jobs -x`, `exec -a`;
//!   - it sets a variable that makes programs run code it names: `BASH_ENV`, `ENV`,
//!     `PROMPT_COMMAND`, `PS0`–`PS4`, `SHELLOPTS`, `BASHOPTS`, `BASH_FUNC_*`, `LD_*`, `GIT_*`
//!     (but the author/committer identity and `GIT_TERMINAL_PROMPT`), `PAGER`, `MANPAGER`,
//!     `EDITOR`, `VISUAL`, `BROWSER`, `LESSOPEN`, `LESSCLOSE`, `SHELL`, `PERL5OPT`, `PERL5DB`,
//!     `PYTHONSTARTUP`, `PYTHONINSPECT`, `NODE_OPTIONS`, `RUBYOPT`, `TAR_OPTIONS`, `ZIPOPT`,
//!     `RSYNC_RSH`, `MAKEFLAGS`, `GNUMAKEFLAGS`, `SSH_ASKPASS`, `SUDO_ASKPASS`, `RUSTC_WRAPPER`,
//!     `RUSTC_WORKSPACE_WRAPPER`, `CARGO_BUILD_RUSTC_WRAPPER`, `CARGO_TARGET_*`, `PSQL_PAGER`,
//!     `PSQL_EDITOR`, `PSQLRC`, `MYSQL_HOME`, `npm_config_*`, `GOFLAGS`, `GOENV`, `RUSTC`,
//!     `RUSTDOC`;
//!   - a shell or interpreter reads its program from standard input or a file: `… | sh`,
//!     `sh < f`, `bash <<EOF`, `sh script.sh`, `python3` with no script, `… | python3 -`; or
//!     from the command line: `python3 -c`, `perl -e`/`-E`/`-M`/`-m`/`-d` (perl's switches
//!     parsed as perl does: bundles, digits after `-0`/`-l`/`-C`, the rest of the word after
//!     `-F`/`-i`/`-I`/`-x`), `ruby -e`, `node -e`/`-p`/`-r`/`--import`, `php -r`, `lua -e`,
//!     `awk` programs that use `system`, `|` or `@load`, `sed` scripts with the `e` command or
//!     flag; interpreters under versioned names (`perl5.36.0`); and shells other than
//!     sh/bash/dash/ash (`zsh`, `ksh`, `fish`, …), whose syntax differs;
//!   - a program runs command text it is given: `sqlite3` dot-commands but a few that only
//!     show (`.shell`, `.system`, `.output |…`, …) and SQL calling `edit()`/`load_extension()`,
//!     `psql -c` with a backslash command or `PROGRAM`, `mysql`/`mariadb -e` with a client
//!     command (`system`, `\!`, `pager`, …), any of them reading commands from standard input,
//!     `npm`/`pnpm`/`yarn` `exec`/`x`/`dlx`/`-c`;
//!   - a program runs a command given in its options: `git -c` and `git clone -c` with any
//!     key but a few known data-only ones (`alias.*`, `core.*` included), `git config`
//!     setting such a key, `git --config-env`/`--exec-path`, `--upload-pack`/
//!     `--receive-pack`/`--exec`/`--open-files-in-pager` and the `send-email` command options
//!     in any subcommand (abbreviated too), `git grep -O`, `git rebase -x` (bundled too),
//!     `git bisect run`, `git submodule foreach`, `git difftool -x`, `git filter-branch`,
//!     `git remote-ext`; `tar --to-command`/`--checkpoint-action`/`-I`/`-F`/…, `zip -TT`,
//!     `rsync -e`, `ssh`/`scp` `ProxyCommand`/`LocalCommand`/`Include`/`-S`/`-I`, `ssh -F`
//!     from standard input, `sftp -b`/`-D`, `dpkg --pre-invoke`/`--post-invoke`,
//!     `apt-get -o`/`-c`, `cargo --config`, `go -toolexec`/`-exec`/`-vettool`, `make
//!     --eval`/`-f -`/`$` in arguments, `man -P`/`-H`, `less +…`, `gcc -B`/`-fplugin`/
//!     `-specs` (also through `rustc -C link-arg`), `cpio --rsh-command`, a computed word where
//!     a followed option that names a command could be (`split $opts f`),
//!     and editors and debuggers (`vim`, `ex`, `ed`, `emacs`, `gdb`, `lldb`);
//!   - a wrapper's options are not known exactly (an unknown or abbreviated option, a computed
//!     word before the command), or the wrapper is only known to run commands in ways this
//!     module does not follow (see `programs::lists::OPAQUE`: `systemd-run`, `pkexec`, `parallel`,
//!     `script`, `capsh`, `sg`, `firejail`, `bwrap`, `valgrind`, `expect`, `tmux`, `socat`,
//!     `start-stop-daemon`, `run-parts`, …).
//!
//! - **not literal** ([`Analysis::not_literal`]): the line is provable but is not made only
//!   of literal simple commands, so no `allow` rule with a pattern can match it (deny and ask
//!   rules still do, on every value the unknown parts could take). Not literal are variable
//!   assignments (standalone, `export`, as a prefix `FOO=1 cmd`, through `env`/`sudo`, loop
//!   variables), expansions and substitutions of any kind in any word (parameter, command,
//!   process, arithmetic, brace, tilde, `$"…"`), here-documents with expansions, function
//!   definitions, and redirections other than to `/dev/null` or relative paths without `..`
//!   (writes into `.git`, whose hooks run later, and any file redirection in a line that
//!   `cd`s are not literal either). A literal target can still lead elsewhere through a
//!   symlink (`g -> .git`): [`redirect_targets`] lists them so that policy resolves them
//!   against the workspace when the call is authorized (see `Subject::command`).
//!   Glob characters in arguments are allowed (an `allow` rule must then match every file name
//!   they could expand to: `shell(ls *)` allows `ls *.rs`); `$'…'` is literal when it decodes
//!   exactly.
//!
//! Control structures (`if`, `while`, `until`, `for`, `case`, `{ }`, `( )`, `!`, pipelines and
//! lists) are followed into: every command inside is one of the line's commands.
//!
//! **Wrappers** are unwrapped when the wrapper and its options are known exactly: the wrapper
//! (with all its words) and the command it runs are both commands of the line
//! ([`Role::Wrapper`], [`Role::TransparentWrapper`]). Transparent wrappers change how a
//! command runs but not who runs it or what it can reach, and need no allow rule of their own
//! (`timeout 60 cargo test` is allowed by `shell(cargo test *)`): `env` (its assignments are
//! not literal; `-S` is unprovable), `nice`, `timeout`, `nohup`, `setsid`, `stdbuf`, `time`,
//! `ionice`, `chrt`, `taskset`, `flock` (`-c` is parsed as sh), `watch` (its words are joined
//! and parsed as sh, as watch does), `xargs` (the command gets unknown arguments; with `-I`
//! the replacement is unknown), `command`, `builtin`, `exec`, `busybox`, `setarch`, `prlimit`,
//! `fakeroot`, and the shells `sh`/`bash`/`dash`/`ash` with `-c` and a literal script (parsed
//! again). The others need an allow rule for themselves as well as for the command: `sudo`,
//! `doas`, `su -c` and `runuser` (the script is parsed as sh), `setpriv`, `unshare`,
//! `nsenter`, `chroot`, `strace`. `find -exec`/`-execdir`/`-ok`/`-okdir` runs its command (with
//! `{}` unknown) as an extra command of the line. A wrapper given by a path outside the system
//! directories (`./env`) is unwrapped too, but needs its own allow rule. `choom`,
//! `fakeroot-sysv`/`-tcp` are transparent; `ssh-agent` needs its own allow rule.
//!
//! **Commands in options** (`programs::command_options`): `split --filter=CMD` (parsed as
//! sh), `sort --compress-program=PROG` (`PROG`, `PROG -d`), `install --strip-program`,
//! `diff3`/`sdiff --diff-program`, `rustc -C linker`, `gcc -wrapper`, `wget --use-askpass`
//! name commands that are commands of the line: the program needs an allow rule, and so does
//! each of them.
//!
//! **Unknown programs.** A program on none of this module's lists (and not on the short
//! `programs::lists::DATA_ONLY` list of programs that read their arguments as data: `echo`, `grep`,
//! `cat`, …) may be a wrapper nobody listed or take a command in an option, so
//! [`Command::argument_commands`] offers the commands its arguments could be (`cgexec -g
//! cpu:x rm v` → `rm v`, `frob --hook='make && rm v'` → `make`, `rm v`), which deny and ask
//! rules match too.
//!
//! What programs do with files is out of reach: a script the line runs by path, `make` with a
//! Makefile, `cargo` with a build script, git hooks and config files, a program that another
//! command wrote first. The sandbox is the boundary; this analysis is for approvals.

mod arguments;
mod constructs;
mod expand;
mod paths;
mod programs;
mod redirects;
#[cfg(test)]
pub(crate) mod tests;
mod words;

use std::cell::RefCell;

use tree_sitter::{Node, Parser, Tree};

use super::pattern::CmdTok;
use paths::*;
pub use paths::{path_words, path_words_of, redirect_targets};
use words::{Raw, Word};

/// What a command line runs, as far as the text proves it.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    commands: Vec<Command>,
    unprovable: Option<String>,
    not_literal: Option<String>,
    loose_redirects: Vec<Redirect>,
}

impl Analysis {
    /// Every command the line runs (wrappers and what they run, commands inside
    /// substitutions, loops, functions and `sh -c` scripts), in order of appearance.
    pub fn commands(&self) -> &[Command] {
        &self.commands
    }

    /// Why the line cannot be proven to run only [`Analysis::commands`], if it cannot.
    pub fn unprovable(&self) -> Option<&str> {
        self.unprovable.as_deref()
    }

    /// Why the line is not made only of literal simple commands (so no allow rule with a
    /// pattern can match it), if it is not. Set for every unprovable line too.
    pub fn not_literal(&self) -> Option<&str> {
        self.not_literal.as_deref().or(self.unprovable.as_deref())
    }

    fn set_unprovable(&mut self, why: impl Into<String>) {
        if self.unprovable.is_none() {
            self.unprovable = Some(why.into());
        }
    }

    fn set_not_literal(&mut self, why: impl Into<String>) {
        if self.not_literal.is_none() {
            self.not_literal = Some(why.into());
        }
    }
}

/// How a command relates to the others of its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A command on its own, or the command a wrapper runs: rules must allow it.
    Program,
    /// A wrapper that runs the next command without changing who runs it or what it can reach
    /// (`timeout`, `nice`, `env`, `sh -c`, …): it needs no allow rule of its own.
    TransparentWrapper,
    /// A wrapper that changes privileges, namespaces or root, or traces the command (`sudo`,
    /// `su`, `chroot`, `strace`, …): rules must allow it as well as the command it runs.
    Wrapper,
}

/// One command of a line: its words (program first) and redirections.
#[derive(Debug, Clone)]
pub struct Command {
    words: Vec<Word>,
    redirects: Vec<Redirect>,
    role: Role,
    /// The program is on no list of known programs: it may run a command given in its
    /// arguments (as an unknown wrapper does).
    args_may_run: bool,
}

#[derive(Debug, Clone)]
struct Redirect {
    target: Word,
    write: bool,
}

impl Command {
    /// The command as written (its words' source text joined by single spaces).
    pub fn text(&self) -> String {
        self.words
            .iter()
            .map(|w| w.src.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The command's text when every word is known exactly (no expansion or glob).
    pub fn exact_text(&self) -> Option<String> {
        let words: Option<Vec<String>> = self.words.iter().map(Word::text).collect();
        words.map(|w| w.join(" "))
    }

    /// How it relates to the other commands of its line.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether an allow rule must match it for the line to be allowed.
    pub fn needs_allow(&self) -> bool {
        self.role != Role::TransparentWrapper
    }

    /// Whether the program is on no list of known programs, so that it may run a command given
    /// in its arguments (deny and ask rules look at [`Command::argument_commands`] too).
    pub fn args_may_run(&self) -> bool {
        self.args_may_run
    }

    /// The words joined by single spaces, unknown parts as [`CmdTok::Any`].
    pub(crate) fn tokens(&self) -> Vec<CmdTok> {
        join_tokens(self.words.iter().map(|w| w.toks.as_slice()))
    }

    /// As [`Command::tokens`] with the program written by name when it was given as a path
    /// (`/usr/bin/git push` → `git push`); `None` when it already is.
    pub(crate) fn tokens_by_name(&self) -> Option<Vec<CmdTok>> {
        let program = self.words.first()?.text()?;
        let name = program.rsplit('/').next()?;
        if name == program || name.is_empty() {
            return None;
        }
        let first = Word::literal(name);
        Some(join_tokens(
            std::iter::once(first.toks.as_slice())
                .chain(self.words.iter().skip(1).map(|w| w.toks.as_slice())),
        ))
    }
}

fn join_tokens<'a>(words: impl Iterator<Item = &'a [CmdTok]>) -> Vec<CmdTok> {
    let mut out = Vec::new();
    for (i, w) in words.enumerate() {
        if i > 0 {
            out.push(CmdTok::Char(' '));
        }
        out.extend_from_slice(w);
    }
    out
}

/// Parses `line` as bash and returns what it runs (see the module docs).
pub fn analyze(line: &str) -> Analysis {
    let mut out = Analysis::default();
    analyze_into(&mut out, line, 0);
    leaves_workspace(&mut out);
    out
}

/// A relative redirection target is checked against the workspace from the directory the line
/// starts in (see `Subject::command`); after a `cd`/`pushd`/`popd` it is relative to a
/// directory that check does not follow (`cd g && echo x >> config`, with `g` a symlink to
/// `.git`), so every redirection except to `/dev/null` makes such a line not literal.
fn leaves_workspace(out: &mut Analysis) {
    let moves = out.commands.iter().any(|c| {
        c.words
            .first()
            .and_then(Word::text)
            .is_some_and(|name| matches!(name.as_str(), "cd" | "pushd" | "popd"))
    });
    let redirects = out
        .commands
        .iter()
        .flat_map(|c| c.redirects.iter())
        .chain(out.loose_redirects.iter())
        .any(|r| r.target.text().as_deref() != Some("/dev/null"));
    if moves && redirects {
        out.set_not_literal(
            "the line changes directory, so a relative redirection is not checked where it writes",
        );
    }
}

/// How deeply `sh -c` scripts and wrappers are followed before the line counts as unprovable.
const MAX_DEPTH: usize = 12;
/// How deeply the syntax tree is followed (nested groups, substitutions) before the line counts
/// as unprovable.
const MAX_NESTING: usize = 200;

thread_local! {
    static PARSER: RefCell<Option<Parser>> = const { RefCell::new(None) };
}

fn parse(src: &str) -> Option<Tree> {
    PARSER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let mut parser = Parser::new();
            parser
                .set_language(&tree_sitter_bash::LANGUAGE.into())
                .ok()?;
            *slot = Some(parser);
        }
        slot.as_mut()?.parse(src, None)
    })
}

fn analyze_into(out: &mut Analysis, src: &str, depth: usize) {
    if depth > MAX_DEPTH {
        out.set_unprovable("commands are nested too deeply to follow");
        return;
    }
    let Some(tree) = parse(src) else {
        out.set_unprovable("the bash parser could not read the command");
        return;
    };
    let root = tree.root_node();
    let mut walker = Walker {
        out,
        src,
        depth,
        nesting: 0,
    };
    if root.has_error() {
        let near = first_error(root)
            .map(|n| {
                let text = walker.text(n);
                let text: String = text.chars().take(40).collect();
                if text.trim().is_empty() {
                    String::new()
                } else {
                    format!(" near `{}`", text.trim())
                }
            })
            .unwrap_or_default();
        walker
            .out
            .set_unprovable(format!("the command is not valid bash{near}"));
    }
    walker.statement(root);
}

fn first_error(root: Node<'_>) -> Option<Node<'_>> {
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if node.is_error() || node.is_missing() {
            return Some(node);
        }
        if node.has_error() {
            for i in (0..node.child_count()).rev() {
                if let Some(child) = node.child(i) {
                    stack.push(child);
                }
            }
        }
    }
    None
}

/// The children of `node` with their field names.
fn children<'t>(node: Node<'t>) -> Vec<(Option<&'t str>, Node<'t>)> {
    (0..node.child_count())
        .filter_map(|i| node.child(i).map(|c| (node.field_name_for_child(i), c)))
        .collect()
}

fn named_children(node: Node<'_>) -> Vec<Node<'_>> {
    (0..node.child_count())
        .filter_map(|i| node.child(i))
        .filter(|c| c.is_named())
        .collect()
}

struct Walker<'a, 's> {
    out: &'a mut Analysis,
    src: &'s str,
    depth: usize,
    nesting: usize,
}

impl<'s> Walker<'_, 's> {
    fn text(&self, node: Node<'_>) -> &'s str {
        self.src.get(node.byte_range()).unwrap_or("")
    }

    fn unprovable(&mut self, why: impl Into<String>) {
        self.out.set_unprovable(why);
    }

    fn not_literal(&mut self, why: impl Into<String>) {
        self.out.set_not_literal(why);
    }

    /// Enters one level of the tree; false (and unprovable) past [`MAX_NESTING`].
    fn enter(&mut self) -> bool {
        self.nesting += 1;
        if self.nesting > MAX_NESTING {
            self.unprovable("the command is nested too deeply to follow");
            return false;
        }
        true
    }

    fn statement(&mut self, node: Node<'_>) {
        if self.enter() {
            self.statement_inner(node);
        }
        self.nesting -= 1;
    }

    fn statement_inner(&mut self, node: Node<'_>) {
        match node.kind() {
            "program" | "list" | "pipeline" | "subshell" | "negated_command" | "do_group"
            | "if_statement" | "elif_clause" | "else_clause" | "while_statement" => {
                for child in named_children(node) {
                    self.statement(child);
                }
            }
            "compound_statement" => {
                if node.child(0).is_some_and(|c| c.kind() == "((") {
                    self.arithmetic(node);
                } else {
                    for child in named_children(node) {
                        self.statement(child);
                    }
                }
            }
            "comment" => {}
            "command" => self.command(node, Vec::new()),
            "redirected_statement" => self.redirected_statement(node),
            "variable_assignment" => {
                self.assignment(node);
            }
            "variable_assignments" => {
                for child in named_children(node) {
                    self.statement(child);
                }
            }
            "declaration_command" => self.declaration(node),
            "unset_command" => self.unset(node),
            "function_definition" => self.function(node),
            "case_statement" => self.case(node),
            "case_item" => self.case_item(node),
            "for_statement" => self.for_loop(node),
            "c_style_for_statement" => {
                self.not_literal("an arithmetic `for` loop");
                self.arithmetic(node);
            }
            "test_command" => self.test_command(node),
            "ERROR" => self.unprovable("the command is not valid bash"),
            kind if self.is_word(node) => {
                // A bare word where a statement belongs (the grammar's error recovery).
                self.unprovable(format!("unexpected `{kind}` where a command belongs"));
            }
            kind => self.unprovable(format!("unsupported bash syntax `{kind}`")),
        }
    }

    fn is_word(&self, node: Node<'_>) -> bool {
        matches!(
            node.kind(),
            "word"
                | "number"
                | "string"
                | "raw_string"
                | "ansi_c_string"
                | "translated_string"
                | "concatenation"
                | "simple_expansion"
                | "expansion"
                | "command_substitution"
                | "process_substitution"
                | "arithmetic_expansion"
                | "brace_expression"
                | "extglob_pattern"
        )
    }

    fn redirected_statement(&mut self, node: Node<'_>) {
        let mut body = None;
        let mut redirects = Vec::new();
        for (field, child) in children(node) {
            match field {
                Some("body") => body = Some(child),
                Some("redirect") => redirects.push(child),
                _ if !child.is_named() => {}
                _ => self.unprovable(format!(
                    "unexpected `{}` in a redirected command",
                    child.kind()
                )),
            }
        }
        match body {
            Some(b) if b.kind() == "command" => self.command(b, redirects),
            Some(b) => {
                self.statement(b);
                for r in redirects {
                    let found = self.redirect(r);
                    self.out.loose_redirects.extend(found);
                }
            }
            None => {
                self.not_literal("a redirection without a command");
                for r in redirects {
                    let found = self.redirect(r);
                    self.out.loose_redirects.extend(found);
                }
            }
        }
    }

    fn command<'t>(&mut self, node: Node<'t>, mut redirect_nodes: Vec<Node<'t>>) {
        let mut name = None;
        let mut args = Vec::new();
        for (field, child) in children(node) {
            match (field, child.kind()) {
                (Some("name"), _) => name = Some(child),
                (Some("argument"), _) => args.push(child),
                (Some("redirect"), _) => redirect_nodes.push(child),
                (_, "variable_assignment") => {
                    if let Some(var) = self.assignment(child) {
                        self.not_literal(format!("`{var}=…` sets a variable for the command"));
                    }
                }
                (_, "file_redirect" | "heredoc_redirect" | "herestring_redirect") => {
                    redirect_nodes.push(child);
                }
                (_, "comment") => {}
                _ if !child.is_named() => {}
                (_, kind) => self.unprovable(format!("unexpected `{kind}` in a command")),
            }
        }
        let mut redirects = Vec::new();
        for r in redirect_nodes {
            redirects.extend(self.redirect(r));
        }
        let Some(name) = name else {
            self.not_literal("a command without a name");
            self.out.loose_redirects.extend(redirects);
            return;
        };
        // Words are separated by blanks; with none between them (or only line continuations,
        // which bash removes) bash reads one word where the grammar reads two.
        let mut prev_end = name.end_byte();
        for a in &args {
            let gap = self.src.get(prev_end..a.start_byte()).unwrap_or("");
            let gap = gap.replace("\\\n", "");
            if gap.is_empty() || !gap.chars().all(char::is_whitespace) {
                self.unprovable(format!(
                    "the parser split the word `{}` where bash does not",
                    self.text(*a)
                ));
            }
            prev_end = a.end_byte();
        }
        let program = self.word(name, true);
        let mut argv = vec![program];
        for a in args {
            argv.push(self.word(a, true));
        }
        programs::resolve(self, argv, redirects, 0);
    }

    /// Records `command` as one of the line's commands.
    fn push(&mut self, words: Vec<Word>, redirects: Vec<Redirect>, role: Role) {
        self.out.commands.push(Command {
            words,
            redirects,
            role,
            args_may_run: false,
        });
    }
}
