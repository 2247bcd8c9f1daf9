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
//!     module does not follow (see `programs::OPAQUE`: `systemd-run`, `pkexec`, `parallel`,
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
//! `programs::DATA_ONLY` list of programs that read their arguments as data: `echo`, `grep`,
//! `cat`, …) may be a wrapper nobody listed or take a command in an option, so
//! [`Command::argument_commands`] offers the commands its arguments could be (`cgexec -g
//! cpu:x rm v` → `rm v`, `frob --hook='make && rm v'` → `make`, `rm v`), which deny and ask
//! rules match too.
//!
//! What programs do with files is out of reach: a script the line runs by path, `make` with a
//! Makefile, `cargo` with a build script, git hooks and config files, a program that another
//! command wrote first. The sandbox is the boundary; this analysis is for approvals.

mod arguments;
mod programs;
mod words;

use std::cell::RefCell;

use tree_sitter::{Node, Parser, Tree};

use super::pattern::CmdTok;
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

    /// Decodes a word node (any of the kinds in [`Walker::is_word`], or `command_name`).
    /// `split`: the word is unquoted context (expansions in it are split into words).
    fn word(&mut self, node: Node<'_>, split: bool) -> Word {
        let mut raw = Vec::new();
        if self.enter() {
            self.word_into(node, split, true, &mut raw);
        }
        self.nesting -= 1;
        let word = Word::from_raw(&raw, self.text(node));
        if word.expanded {
            // Tilde and brace expansions are found in the decoded text.
            self.not_literal(format!("`{}` is expanded when the line runs", word.src));
        }
        word
    }

    fn word_into(&mut self, node: Node<'_>, split: bool, at_start: bool, raw: &mut Vec<Raw>) {
        let text = self.text(node).to_owned();
        let result = match node.kind() {
            "word" | "number" => words::unquoted(&text, at_start, raw),
            "command_name" | "concatenation" => {
                self.concatenation(node, at_start, raw);
                Ok(())
            }
            "string" => {
                self.string(node, raw);
                Ok(())
            }
            "raw_string" => match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
                Some(body) => {
                    raw.extend(body.chars().map(|c| Raw::Char(c, true)));
                    Ok(())
                }
                None => Err("a single-quoted string the parser did not close".to_owned()),
            },
            "ansi_c_string" => match text.strip_prefix("$'").and_then(|t| t.strip_suffix('\'')) {
                Some(body) => words::ansi_c(body, raw),
                None => Err("a `$'…'` string the parser did not close".to_owned()),
            },
            "translated_string" => {
                self.not_literal("a `$\"…\"` translated string");
                self.scan(node);
                raw.push(Raw::Expansion { split: false });
                Ok(())
            }
            "simple_expansion"
            | "expansion"
            | "command_substitution"
            | "process_substitution"
            | "arithmetic_expansion" => {
                self.expansion_node(node);
                let split = split && node.kind() != "process_substitution";
                raw.push(Raw::Expansion { split });
                Ok(())
            }
            "brace_expression" => {
                self.not_literal("a brace expansion");
                raw.push(Raw::Expansion { split: true });
                Ok(())
            }
            "extglob_pattern" => {
                raw.push(Raw::Expansion { split: true });
                Ok(())
            }
            kind => Err(format!("unsupported bash word syntax `{kind}`")),
        };
        if let Err(why) = result {
            self.unprovable(why);
            raw.push(Raw::Expansion { split: true });
        }
    }

    /// Adjacent parts of one word; text between the grammar's parts is decoded as unquoted.
    fn concatenation(&mut self, node: Node<'_>, at_start: bool, raw: &mut Vec<Raw>) {
        let mut cursor = node.start_byte();
        for child in named_children(node) {
            if child.kind() == "comment" {
                self.unprovable("a comment inside a word");
                continue;
            }
            self.gap(cursor, child.start_byte(), at_start && raw.is_empty(), raw);
            let start = at_start && raw.is_empty();
            // An unquoted `$` right before a quote starts `$"…"` / `$'…'` in bash, even where
            // the grammar read the `$` on its own (`rm$"" v`, `"r"$"m" v`).
            if matches!(child.kind(), "string" | "raw_string")
                && raw.last() == Some(&Raw::Char('$', false))
            {
                raw.pop();
                self.dollar_quoted(child, raw);
                cursor = child.end_byte();
                continue;
            }
            if self.enter() {
                self.word_into(child, true, start, raw);
            }
            self.nesting -= 1;
            cursor = child.end_byte();
        }
        self.gap(cursor, node.end_byte(), false, raw);
    }

    /// A quoted string that follows a `$` the grammar did not join to it: `$"…"` is a
    /// translated string (not literal: a message catalog can replace it), `$'…'` is decoded as
    /// ANSI-C.
    fn dollar_quoted(&mut self, node: Node<'_>, raw: &mut Vec<Raw>) {
        let text = self.text(node).to_owned();
        if node.kind() == "string" {
            self.not_literal("a `$\"…\"` translated string");
            self.scan(node);
            raw.push(Raw::Expansion { split: false });
            return;
        }
        let decoded = match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
            Some(body) => words::ansi_c(body, raw),
            None => Err("a `$'…'` string the parser did not close".to_owned()),
        };
        if let Err(why) = decoded {
            self.unprovable(why);
            raw.push(Raw::Expansion { split: true });
        }
    }

    fn gap(&mut self, from: usize, to: usize, at_start: bool, raw: &mut Vec<Raw>) {
        if from >= to {
            return;
        }
        let text = self.src.get(from..to).unwrap_or("").to_owned();
        if let Err(why) = words::unquoted(&text, at_start, raw) {
            self.unprovable(why);
        }
    }

    /// A double-quoted string: literal text between the expansions the grammar found.
    fn string(&mut self, node: Node<'_>, raw: &mut Vec<Raw>) {
        let text = self.text(node);
        if !(text.len() >= 2 && text.starts_with('"') && text.ends_with('"')) {
            self.unprovable("a double-quoted string the parser did not close");
            return;
        }
        let (start, end) = (node.start_byte() + 1, node.end_byte() - 1);
        let mut cursor = start;
        for child in named_children(node) {
            if child.kind() == "string_content" {
                continue;
            }
            self.dq_gap(cursor, child.start_byte(), raw);
            match child.kind() {
                "simple_expansion"
                | "expansion"
                | "command_substitution"
                | "arithmetic_expansion" => {
                    self.expansion_node(child);
                    raw.push(Raw::Expansion { split: false });
                }
                kind => {
                    self.unprovable(format!("unsupported syntax `{kind}` inside double quotes"));
                    raw.push(Raw::Expansion { split: false });
                }
            }
            cursor = child.end_byte();
        }
        self.dq_gap(cursor, end, raw);
    }

    fn dq_gap(&mut self, from: usize, to: usize, raw: &mut Vec<Raw>) {
        if from >= to {
            return;
        }
        let text = self.src.get(from..to).unwrap_or("").to_owned();
        if let Err(why) = words::double_quoted(&text, raw) {
            self.unprovable(why);
        }
    }

    /// An expansion or substitution inside a word: not literal; the commands inside are
    /// commands of the line; forms that evaluate values as code are unprovable.
    fn expansion_node(&mut self, node: Node<'_>) {
        match node.kind() {
            "simple_expansion" => self.not_literal("a parameter expansion"),
            "expansion" => self.expansion(node),
            "command_substitution" | "process_substitution" => self.substitution(node),
            "arithmetic_expansion" => {
                self.not_literal("an arithmetic expansion");
                self.arithmetic(node);
            }
            _ => self.scan(node),
        }
    }

    fn substitution(&mut self, node: Node<'_>) {
        let what = if node.kind() == "process_substitution" {
            "a process substitution"
        } else {
            "a command substitution"
        };
        self.not_literal(what);
        let text = self.text(node);
        if text.starts_with('`') && text.contains('\\') {
            self.unprovable(
                "a backquoted substitution with backslashes, which bash reads differently",
            );
        }
        for child in named_children(node) {
            self.statement(child);
        }
    }

    /// `${…}`: indirection, substring offsets and subscripts evaluate values as code.
    fn expansion(&mut self, node: Node<'_>) {
        self.not_literal("a parameter expansion");
        let text = self.text(node);
        if text.starts_with("${!") {
            self.unprovable(format!(
                "`{text}` is an indirect expansion, which evaluates a variable's value as a name"
            ));
        }
        if text.ends_with("@P}") {
            self.unprovable(format!(
                "`{text}` expands a value as a prompt string, which runs `$(…)` in it"
            ));
        }
        let mut after_colon = false;
        for child in children(node).into_iter().map(|(_, c)| c) {
            if !child.is_named() {
                let t = self.text(child);
                if t == ":" {
                    after_colon = true;
                } else if t != "}" && after_colon {
                    after_colon = false;
                }
                continue;
            }
            if after_colon && !(child.kind() == "number" && is_digits(self.text(child))) {
                self.unprovable(format!(
                    "`{text}` takes a substring at an offset bash evaluates as arithmetic"
                ));
            }
        }
        // Bash expands the words inside `${…}` (`${x:-word}`, patterns, replacements): a
        // substitution there that the grammar left in plain text (`${x:-`rm v`}`) is unseen.
        let mut stack = named_children(node);
        while let Some(n) = stack.pop() {
            match n.kind() {
                "command_substitution" | "process_substitution" | "arithmetic_expansion" => {}
                _ if n.named_child_count() == 0 => {
                    let leaf = self.text(n);
                    let dollar = leaf
                        .char_indices()
                        .filter(|&(_, c)| c == '$')
                        .any(|(i, _)| leaf[i + 1..].starts_with(['(', '{', '[']));
                    if leaf.contains('`') || dollar {
                        self.unprovable(format!(
                            "`{text}` holds a substitution the parser did not read"
                        ));
                    }
                }
                _ => stack.extend(named_children(n)),
            }
        }
        self.scan(node);
    }

    /// Visits everything under `node` for substitutions, expansions and subscripts.
    fn scan(&mut self, node: Node<'_>) {
        if !self.enter() {
            self.nesting -= 1;
            return;
        }
        for child in named_children(node) {
            match child.kind() {
                "command_substitution" | "process_substitution" => self.substitution(child),
                "arithmetic_expansion" => {
                    self.not_literal("an arithmetic expansion");
                    self.arithmetic(child);
                }
                "expansion" => self.expansion(child),
                "simple_expansion" => self.not_literal("a parameter expansion"),
                "subscript" => self.subscript(child),
                "ERROR" => self.unprovable("the command is not valid bash"),
                _ => self.scan(child),
            }
        }
        self.nesting -= 1;
    }

    /// `a[i]`: bash evaluates the index as arithmetic (which can run `$(…)` held in a value).
    fn subscript(&mut self, node: Node<'_>) {
        match node.child_by_field_name("index") {
            Some(index) => {
                let t = self.text(index);
                if !(t == "@" || t == "*" || is_digits(t)) {
                    self.unprovable(format!(
                        "`{}` has an array index bash evaluates as arithmetic",
                        self.text(node)
                    ));
                }
            }
            None => self.unprovable("an array subscript the parser did not read"),
        }
    }

    /// Arithmetic (`$((…))`, `((…))`, C-style `for`): provable only over literal numbers.
    fn arithmetic(&mut self, node: Node<'_>) {
        let text = self.text(node);
        let inner = text
            .trim_start_matches("$((")
            .trim_start_matches("$[")
            .trim_start_matches("((")
            .trim_end_matches("))")
            .trim_end_matches(']');
        if !is_literal_arithmetic(inner) {
            self.unprovable(format!(
                "`{text}` is arithmetic over variables, which bash evaluates as code"
            ));
        }
    }

    /// A variable assignment (standalone or as a command prefix): not literal; a dangerous name
    /// is unprovable. Returns the variable's name.
    fn assignment(&mut self, node: Node<'_>) -> Option<String> {
        let name_node = node.child_by_field_name("name");
        let name = match name_node {
            Some(n) if n.kind() == "variable_name" => self.text(n).to_owned(),
            Some(n) if n.kind() == "subscript" => {
                self.subscript(n);
                n.child_by_field_name("name")
                    .map(|v| self.text(v).to_owned())
                    .unwrap_or_default()
            }
            _ => {
                self.unprovable("an assignment to a computed name");
                return None;
            }
        };
        self.not_literal(format!("`{name}=…` assigns a variable"));
        if let Some(why) = programs::dangerous_variable(&name) {
            self.unprovable(why);
        }
        if let Some(value) = node.child_by_field_name("value") {
            if value.kind() == "array" {
                for element in named_children(value) {
                    if self.text(element).starts_with('[') {
                        self.unprovable(
                            "an array element with an index, which bash evaluates as arithmetic",
                        );
                    }
                    self.word(element, false);
                }
            } else {
                self.word(value, false);
            }
        }
        Some(name)
    }

    /// `export`, `declare`, `local`, `readonly`, `typeset`.
    fn declaration(&mut self, node: Node<'_>) {
        let keyword = node
            .child(0)
            .map(|c| self.text(c).to_owned())
            .unwrap_or_default();
        self.not_literal(format!("`{keyword}` declares variables"));
        for child in named_children(node) {
            match child.kind() {
                "variable_assignment" => {
                    self.assignment(child);
                }
                "variable_name" => {
                    let name = self.text(child).to_owned();
                    if let Some(why) = programs::dangerous_variable(&name) {
                        self.unprovable(why);
                    }
                }
                "word" if self.text(child).starts_with(['-', '+']) => {
                    self.unprovable(format!(
                        "`{keyword} {}`: declarations with options can evaluate values as code",
                        self.text(child)
                    ));
                }
                _ => self.unprovable(format!(
                    "`{keyword}` with a computed name `{}`",
                    self.text(child)
                )),
            }
        }
    }

    /// `unset NAME…`: a command of the line; computed or subscripted names are unprovable.
    fn unset(&mut self, node: Node<'_>) {
        let mut argv = Vec::new();
        let mut prev_end = None;
        for (i, child) in children(node).into_iter().map(|(_, c)| c).enumerate() {
            if i == 0 {
                argv.push(Word::literal(self.text(child)));
                prev_end = Some(child.end_byte());
                continue;
            }
            if !child.is_named() {
                continue;
            }
            if prev_end == Some(child.start_byte()) {
                self.unprovable(format!(
                    "`unset` with a subscripted or computed name `{}`",
                    self.text(child)
                ));
            }
            prev_end = Some(child.end_byte());
            let word = self.word(child, true);
            match word.text() {
                Some(t) if !t.contains('[') => argv.push(word),
                _ => {
                    self.unprovable(format!(
                        "`unset` with a subscripted or computed name `{}`",
                        self.text(child)
                    ));
                    argv.push(word);
                }
            }
        }
        self.out.commands.push(Command {
            words: argv,
            redirects: Vec::new(),
            role: Role::Program,
            args_may_run: false,
        });
    }

    fn function(&mut self, node: Node<'_>) {
        match node.child_by_field_name("name") {
            Some(name) if name.kind() == "word" => {
                self.not_literal(format!("defines the function `{}`", self.text(name)));
            }
            _ => self.unprovable("a function with a computed name"),
        }
        match node.child_by_field_name("body") {
            Some(body) => self.statement(body),
            None => self.unprovable("a function without a body"),
        }
        for (field, child) in children(node) {
            if field == Some("redirect") {
                let found = self.redirect(child);
                self.out.loose_redirects.extend(found);
            }
        }
    }

    fn case(&mut self, node: Node<'_>) {
        for (field, child) in children(node) {
            match (field, child.kind()) {
                (Some("value"), _) => {
                    self.word(child, false);
                }
                (_, "case_item") => self.case_item(child),
                (_, "comment") => {}
                _ if !child.is_named() => {}
                (_, kind) => self.unprovable(format!("unexpected `{kind}` in a `case`")),
            }
        }
    }

    fn case_item(&mut self, node: Node<'_>) {
        for (field, child) in children(node) {
            match field {
                Some("value") => {
                    self.word(child, false);
                }
                _ if !child.is_named() => {}
                _ => self.statement(child),
            }
        }
    }

    fn for_loop(&mut self, node: Node<'_>) {
        if node.child(0).is_some_and(|c| c.kind() == "select") {
            self.unprovable("`select` reads its choice from standard input");
        }
        for (field, child) in children(node) {
            match field {
                Some("variable") => {
                    let name = self.text(child).to_owned();
                    self.not_literal(format!("the loop assigns `{name}`"));
                    if let Some(why) = programs::dangerous_variable(&name) {
                        self.unprovable(why);
                    }
                }
                Some("value") => {
                    self.word(child, true);
                }
                Some("body") => self.statement(child),
                _ if !child.is_named() => {}
                _ if child.kind() == "comment" => {}
                _ => self.unprovable(format!("unexpected `{}` in a `for` loop", child.kind())),
            }
        }
    }

    /// `[[ … ]]` and `[ … ]`: arithmetic comparisons and `-v` evaluate operands as code.
    fn test_command(&mut self, node: Node<'_>) {
        let text = self.text(node);
        let mut stack = vec![node];
        let mut operators = Vec::new();
        while let Some(n) = stack.pop() {
            if n.kind() == "test_operator" {
                operators.push(self.text(n));
            }
            stack.extend(named_children(n));
        }
        // The operator words as the grammar read them, and as plain words too.
        operators.extend(text.split_whitespace());
        let arithmetic = operators
            .iter()
            .any(|o| matches!(*o, "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge"));
        let names = operators.iter().any(|o| matches!(*o, "-v" | "-R"));
        if arithmetic && !only_number_operands(text) {
            self.unprovable(format!(
                "`{text}` compares as arithmetic, which bash evaluates as code"
            ));
        }
        let inner = text.trim_start_matches("[[").trim_start_matches('[');
        if names && inner.contains(['[', '$', '`']) {
            self.unprovable(format!(
                "`{text}` tests a subscripted or computed name, which bash evaluates as code"
            ));
        }
        for child in named_children(node) {
            self.test_part(child);
        }
    }

    fn test_part(&mut self, node: Node<'_>) {
        if self.is_word(node) {
            self.word(node, false);
        } else {
            self.scan(node);
        }
    }

    /// A redirection: its target as a path word (`None` for a descriptor duplication).
    fn redirect(&mut self, node: Node<'_>) -> Vec<Redirect> {
        match node.kind() {
            "file_redirect" => self.file_redirect(node).into_iter().collect(),
            "heredoc_redirect" => self.heredoc(node),
            "herestring_redirect" => {
                for child in named_children(node) {
                    self.word(child, false);
                }
                Vec::new()
            }
            kind => {
                self.unprovable(format!("unsupported redirection `{kind}`"));
                Vec::new()
            }
        }
    }

    fn file_redirect(&mut self, node: Node<'_>) -> Option<Redirect> {
        let mut op = String::new();
        let mut dest = None;
        for (field, child) in children(node) {
            match field {
                Some("descriptor") => {
                    if !is_digits(self.text(child)) {
                        self.not_literal("a redirection that assigns a descriptor variable");
                    }
                }
                Some("destination") => {
                    if dest.is_some() {
                        self.unprovable("a redirection with two targets");
                    }
                    dest = Some(child);
                }
                _ if !child.is_named() => op.push_str(self.text(child)),
                _ => self.unprovable(format!("unexpected `{}` in a redirection", child.kind())),
            }
        }
        if op.ends_with('-') {
            // `>&-` / `<&-` close a descriptor and take no target.
            if dest.is_some() {
                self.unprovable(format!(
                    "the parser read a target after `{op}`, which closes a descriptor and takes none"
                ));
            }
            return None;
        }
        let Some(dest) = dest else {
            self.unprovable("a redirection without a target");
            return None;
        };
        let target = self.word(dest, true);
        let text = target.text();
        if matches!(op.as_str(), ">&" | "<&")
            && text.as_deref().is_some_and(|t| is_digits(t) || t == "-")
        {
            return None;
        }
        let write = op.contains('>');
        match text.as_deref() {
            None => self.not_literal(format!("redirects to `{}`, a computed path", target.src)),
            Some("/dev/null") => {}
            Some(path) if !is_workspace_path(path) => {
                self.not_literal(format!("redirects to `{path}`, outside the workspace"));
            }
            Some(path) if write && path.split('/').any(|c| c == ".git") => {
                self.not_literal(format!(
                    "redirects into `{path}`; git runs hooks and config from `.git`"
                ));
            }
            Some(_) => {}
        }
        Some(Redirect { target, write })
    }

    /// A here-document. Its delimiter is computed as bash computes it (quote removal) and the
    /// grammar's reading is checked against it: the body must hold no line bash would take as
    /// the delimiter (with `<<-` tabs and, unquoted, line continuations applied as bash does),
    /// and the grammar's terminator line must be the delimiter. A delimiter this module does
    /// not compute exactly (`$'…'`, `$"…"`, any `$`) is unprovable.
    fn heredoc(&mut self, node: Node<'_>) -> Vec<Redirect> {
        let mut quoted = false;
        let mut strip_tabs = false;
        let mut delimiter = None;
        let (mut body, mut end) = (None, None);
        let mut out = Vec::new();
        for child in children(node).into_iter().map(|(_, c)| c) {
            if !child.is_named() {
                strip_tabs |= self.text(child) == "<<-";
                continue;
            }
            match child.kind() {
                "heredoc_start" => match words::heredoc_delimiter(self.text(child)) {
                    Ok((word, q)) => {
                        quoted = q;
                        delimiter = Some(word);
                    }
                    Err(why) => {
                        quoted = true;
                        self.unprovable(why);
                    }
                },
                "heredoc_body" => {
                    body = Some(child);
                    if !quoted {
                        self.heredoc_body(child);
                    }
                }
                "heredoc_end" => end = Some(child),
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    out.extend(self.redirect(child));
                }
                _ => self.statement(child),
            }
        }
        if let Some(delimiter) = delimiter {
            self.check_heredoc_ends(&delimiter, quoted, strip_tabs, body, end);
        }
        out
    }

    /// Whether bash ends the here-document where the grammar does (see [`Walker::heredoc`]).
    fn check_heredoc_ends(
        &mut self,
        delimiter: &str,
        quoted: bool,
        strip_tabs: bool,
        body: Option<Node<'_>>,
        end: Option<Node<'_>>,
    ) {
        let Some(end) = end else {
            self.unprovable(format!(
                "the here-document `{delimiter}` has no terminator the parser found"
            ));
            return;
        };
        // The terminator line as a whole (the grammar leaves `<<-` tabs out of the node).
        let line_start = self.src[..end.start_byte()]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let line = &self.src[line_start..end.end_byte()];
        let line = if strip_tabs {
            line.trim_start_matches('\t')
        } else {
            line
        };
        let after = self.src[end.end_byte()..].chars().next();
        if line != delimiter || !matches!(after, None | Some('\n')) {
            self.unprovable(format!(
                "the parser ended the here-document `{delimiter}` at a line bash does not end it at"
            ));
            return;
        }
        let body_text = match body {
            Some(b) => &self.src[b.start_byte()..line_start.max(b.start_byte())],
            None => "",
        };
        if words::heredoc_line_ends(body_text, delimiter, strip_tabs, !quoted) {
            self.unprovable(format!(
                "the here-document body holds a line bash reads as its delimiter `{delimiter}`, which the parser did not"
            ));
        }
    }

    fn heredoc_body(&mut self, node: Node<'_>) {
        for child in named_children(node) {
            match child.kind() {
                "heredoc_content" => {
                    let text = self.text(child).to_owned();
                    if let Err(why) = words::double_quoted(&text.replace('"', ""), &mut Vec::new())
                    {
                        self.unprovable(why);
                    }
                }
                "simple_expansion"
                | "expansion"
                | "command_substitution"
                | "arithmetic_expansion" => {
                    self.not_literal("a here-document with expansions");
                    self.expansion_node(child);
                }
                kind => self.unprovable(format!("unsupported `{kind}` in a here-document")),
            }
        }
        if named_children(node).is_empty() {
            let text = self.text(node).to_owned();
            if let Err(why) = words::double_quoted(&text.replace('"', ""), &mut Vec::new()) {
                self.unprovable(why);
            }
        }
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

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Arithmetic text with only numbers and operators (no variable names, no expansions).
fn is_literal_arithmetic(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_ascii_digit() || c.is_whitespace() || "+-*/%()<>=!&|^~?:,".contains(c))
}

/// Whether every operand of a `[[ … ]]` / `[ … ]` with arithmetic comparisons is a number.
fn only_number_operands(text: &str) -> bool {
    text.split_whitespace()
        .filter(|w| !matches!(*w, "[[" | "]]" | "[" | "]" | "&&" | "||" | "!" | "(" | ")"))
        .all(|w| {
            is_digits(w.trim_start_matches('-'))
                || (w.starts_with('-') && w[1..].chars().all(|c| c.is_ascii_alphabetic()))
        })
}

/// A literal path that stays in the workspace: relative, no `..` component, no `~`.
fn is_workspace_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.starts_with('~')
        && !path.split('/').any(|c| c == "..")
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

fn program_path_words(
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The commands of `line`, which must be provable, as text.
    pub(crate) fn texts(line: &str) -> Vec<String> {
        let a = analyze(line);
        assert!(a.unprovable().is_none(), "{line}: {:?}", a.unprovable());
        a.commands().iter().map(Command::text).collect()
    }

    /// Why `line` is unprovable; panics when it is not.
    pub(crate) fn unprovable(line: &str) -> String {
        analyze(line)
            .unprovable()
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{line:?} should be unprovable"))
    }

    #[test]
    fn lists_pipelines_and_groups_yield_each_command() {
        assert_eq!(
            texts("a && b || c; d | e\nf & g"),
            ["a", "b", "c", "d", "e", "f", "g"]
        );
        assert_eq!(texts("echo 'a;b' \"c && d\""), ["echo 'a;b' \"c && d\""]);
        assert_eq!(texts("(cd x && rm y)"), ["cd x", "rm y"]);
        assert_eq!(texts("{ echo a; rm b; }"), ["echo a", "rm b"]);
        assert_eq!(texts("if true; then rm a; fi"), ["true", "rm a"]);
        assert_eq!(texts("case x in x) rm v;; esac"), ["rm v"]);
    }

    #[test]
    fn substitutions_yield_their_commands_and_are_not_literal() {
        let a = analyze("echo $(rm -rf z)");
        assert!(a.unprovable().is_none());
        assert!(a.not_literal().is_some());
        let t: Vec<String> = a.commands().iter().map(Command::text).collect();
        assert_eq!(t, ["rm -rf z", "echo $(rm -rf z)"]);
        assert_eq!(
            texts("diff <(ls a) <(ls b)"),
            ["ls a", "ls b", "diff <(ls a) <(ls b)"]
        );
    }

    #[test]
    fn wrappers_yield_the_wrapper_and_the_command() {
        assert_eq!(
            texts("timeout -s KILL 10 cargo test"),
            ["timeout -s KILL 10 cargo test", "cargo test"]
        );
        assert_eq!(
            texts("bash -lc 'git push && echo ok'"),
            ["bash -lc 'git push && echo ok'", "git push", "echo ok"]
        );
        let a = analyze("find . -exec rm {} \\;");
        let t: Vec<String> = a.commands().iter().map(Command::text).collect();
        assert_eq!(t, ["find . -exec rm {} \\;", "rm {}"]);
        assert_eq!(a.commands()[1].exact_text(), None);
    }

    #[test]
    fn computed_command_names_are_unprovable() {
        for line in [
            "$(echo rm) v",
            "a=rm; $a v",
            "rm${IFS}v",
            "{rm,v}",
            "/???/r? v",
            "\"$@\"",
            "~/bin/x",
            "`echo rm` v",
        ] {
            unprovable(line);
        }
        let a = analyze("$'\\x72m' v");
        assert!(a.unprovable().is_none());
        assert_eq!(a.commands()[0].exact_text().as_deref(), Some("rm v"));
    }

    #[test]
    fn heredocs_are_provable_only_where_bash_ends_them_as_the_parser_does() {
        assert_eq!(
            texts("cat <<'EOF'\nrm v\nEOF\necho done"),
            ["cat", "echo done"]
        );
        assert_eq!(texts("cat <<-EOF\n\thello\n\tEOF"), ["cat"]);
        assert_eq!(texts("cat <<\\EOF\nhello\nEOF"), ["cat"]);
        assert_eq!(texts("cat <<\"EOF\"\nhello $x\nEOF"), ["cat"]);
        assert_eq!(texts("x=$(cat <<'EOF'\nhi\nEOF\n)"), ["cat"]);
        for line in [
            "grep x <<E''OF\nEOF\ntouch m\nE''OF",
            "cat <<-E\"O\"F\nEOF\nrm v\nE\"O\"F",
            "x=$(cat <<E'O'F\nEOF\nrm v\nE'O'F\n)",
            "cat <<$'EOF'\nEOF",
            "cat <<E'$'F\nE$F\nrm v\nE'$'F",
            "cat <<EOF\nE\\\nOF\nrm v\nEOF",
        ] {
            unprovable(line);
        }
    }

    #[test]
    fn a_dollar_glued_to_a_quote_and_substitutions_hidden_in_expansions_are_seen() {
        for line in ["rm$\"\" v", "r$\"m\" v", "\"r\"$\"m\" v"] {
            unprovable(line);
        }
        let a = analyze("r$'m' v");
        assert_eq!(a.commands()[0].exact_text().as_deref(), Some("rm v"));
        for line in [
            "echo ${x:-`rm v`}",
            "echo \"${x:=`rm v`}\"",
            "echo ${x:-${y:-`rm v`}}",
            "cat <<EOF\n${x:+`rm v`}\nEOF",
        ] {
            unprovable(line);
        }
        let a = analyze("echo ${x:-default}");
        assert!(a.unprovable().is_none());
    }

    #[test]
    fn perl_switches_are_read_as_perl_reads_them() {
        for line in [
            "perl -le 'unlink 1'",
            "perl -0e 1",
            "perl -00e 1",
            "perl -l0e 1",
            "perl -0x1F -e 1",
            "perl -CSDe 1",
            "perl -I. -le 1",
            "perl '-l -e' 1",
            "perl5.36.0 -e 1",
            "perl5.36-x86_64-linux-gnu -e 1",
            "perl",
            "perl -",
            "ruby -0e 1",
        ] {
            unprovable(line);
        }
        assert_eq!(texts("perl -w -l0 tool.pl x"), ["perl -w -l0 tool.pl x"]);
        assert_eq!(texts("perl -F: -lan tool.pl"), ["perl -F: -lan tool.pl"]);
        assert_eq!(
            texts("perl -i.bak -p fix.pl f"),
            ["perl -i.bak -p fix.pl f"]
        );
    }

    #[test]
    fn an_unknown_programs_arguments_are_offered_as_commands() {
        let a = analyze("cgexec -g cpu:x /bin/rm -f v");
        let offered: Vec<String> = a.commands()[0]
            .argument_commands()
            .into_iter()
            .map(|(text, _)| text)
            .collect();
        assert!(offered.contains(&"/bin/rm -f v".to_owned()), "{offered:?}");
        assert!(offered.contains(&"v".to_owned()), "{offered:?}");
        assert!(
            analyze("echo rm v").commands()[0]
                .argument_commands()
                .is_empty()
        );
        assert!(
            analyze("choom -n 0 ls").commands()[0]
                .argument_commands()
                .is_empty()
        );
    }

    #[test]
    fn a_redirection_in_a_line_that_changes_directory_is_not_literal() {
        let a = analyze("cd src && echo hi > x");
        assert!(a.unprovable().is_none());
        assert!(a.not_literal().is_some());
        assert!(
            analyze("cd src && make 2>/dev/null")
                .not_literal()
                .is_none()
        );
        assert_eq!(
            redirect_targets(&analyze("echo a > x 2>/dev/null < in; { :; } >> y")),
            [
                ("x".to_owned(), true),
                ("in".to_owned(), false),
                ("y".to_owned(), true)
            ]
        );
    }

    #[test]
    fn unbalanced_input_is_unprovable() {
        unprovable("echo 'oops");
        unprovable("(echo hi");
        unprovable("echo $(true");
        unprovable("exec 3>&- rm");
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
        assert_eq!(
            w("head -n 3 secrets/*"),
            [("3".to_owned(), false), ("secrets/*".to_owned(), false)]
        );
    }
}
