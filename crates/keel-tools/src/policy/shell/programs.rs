//! Programs that run other programs or code: wrappers (unwrapped when their options are known
//! exactly), shells (`-c` scripts parsed again), interpreters, builtins that evaluate text,
//! and programs with options that run commands. The lists here are the ones the module docs of
//! [`super`] and the README describe.

mod command_options;

use super::words::Word;
use super::{MAX_DEPTH, Redirect, Role, Walker, analyze_into};

/// Directories a wrapper may be given by path in and still count as itself for allow rules
/// (`/usr/bin/env` is `env`; `./env` is a program of the workspace).
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/usr/bin",
    "/usr/local/bin",
    "/sbin",
    "/usr/sbin",
    "/usr/local/sbin",
];

/// Bash's reserved words: never a command name bash would run.
const RESERVED_WORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do",
    "done", "in", "function", "{", "}", "!", "[[", "]]",
];

/// What running a program with given arguments runs besides itself.
enum Runs {
    /// Nothing else that policy follows.
    Nothing,
    /// These commands (a wrapper's command, `find -exec` commands), with the role of the
    /// program itself.
    Commands { inner: Vec<Vec<Word>>, role: Role },
    /// A shell script given as text (`sh -c`, `su -c`, `watch`, `flock -c`).
    Script { script: String, role: Role },
    /// Cannot be known from the text: why.
    Unprovable(String),
    /// Unprovable, but the text it evaluates is known and analyzed too (`eval`, `trap`), so
    /// that deny rules name what it runs and path rules see its paths.
    Evaluates { why: String, script: String },
    /// A program that runs command lines given in its options (`split --filter`) or launches
    /// programs they name (`sort --compress-program`): it needs an allow rule of its own, and
    /// so does each command it runs.
    Launches {
        scripts: Vec<String>,
        programs: Vec<Vec<Word>>,
    },
    /// A program no rule here covers: it may run a command given in its arguments, as a
    /// wrapper does (`choom -n 0 rm v`), so deny and ask rules also look at them.
    Unknown,
}

use Runs::{Nothing, Unprovable};

fn unprovable(why: impl Into<String>) -> Runs {
    Unprovable(why.into())
}

/// Decides what `argv` runs and records it (and everything it runs, recursively) in `w`.
pub(super) fn resolve(
    w: &mut Walker<'_, '_>,
    argv: Vec<Word>,
    redirects: Vec<Redirect>,
    depth: usize,
) {
    let Some(program) = argv.first().and_then(Word::text) else {
        let shown = argv.first().map(|a| a.src.clone()).unwrap_or_default();
        w.unprovable(format!(
            "the command name `{shown}` is computed when the line runs"
        ));
        w.push(argv, redirects, Role::Program);
        return;
    };
    if w.depth + depth > MAX_DEPTH {
        w.unprovable("wrappers are nested too deeply to follow");
        w.push(argv, redirects, Role::Program);
        return;
    }
    if RESERVED_WORDS.contains(&program.as_str()) {
        // `time if …`, `time { …; }`: bash reads a compound command where the grammar read
        // words.
        w.unprovable(format!(
            "the reserved word `{program}` where the parser read a command name"
        ));
        w.push(argv, redirects, Role::Program);
        return;
    }
    let name = program.rsplit('/').next().unwrap_or(&program).to_owned();
    let by_name = !program.contains('/')
        || SYSTEM_DIRS
            .iter()
            .any(|d| program.strip_prefix(d) == Some(&format!("/{name}")));
    let runs = match runs(w, &name, &argv) {
        Ok(runs) => runs,
        Err(why) => Unprovable(why),
    };
    let own_role = |role: Role| if by_name { role } else { Role::Program };
    match runs {
        Nothing => w.push(argv, redirects, Role::Program),
        Runs::Unknown => {
            w.push(argv, redirects, Role::Program);
            if let Some(command) = w.out.commands.last_mut() {
                command.args_may_run = true;
            }
        }
        Unprovable(why) => {
            w.unprovable(why);
            w.push(argv, redirects, Role::Program);
        }
        Runs::Evaluates { why, script } => {
            w.unprovable(why);
            w.push(argv, redirects, Role::Program);
            analyze_into(w.out, &script, w.depth + depth + 1);
        }
        Runs::Commands { inner, role } => {
            w.push(argv, redirects, own_role(role));
            for command in inner {
                if command.is_empty() {
                    continue;
                }
                resolve(w, command, Vec::new(), depth + 1);
            }
        }
        Runs::Script { script, role } => {
            w.push(argv, redirects, own_role(role));
            analyze_into(w.out, &script, w.depth + depth + 1);
        }
        Runs::Launches { scripts, programs } => {
            w.push(argv, redirects, Role::Program);
            for script in scripts {
                analyze_into(w.out, &script, w.depth + depth + 1);
            }
            for program in programs {
                resolve(w, program, Vec::new(), depth + 1);
            }
        }
    }
}

/// The text of `argv[i]`, which must be known exactly.
fn text(name: &str, argv: &[Word], i: usize) -> Result<String, String> {
    match argv.get(i) {
        Some(word) => word.text().ok_or_else(|| {
            format!(
                "`{name}` has the computed word `{}` where the command it runs is decided",
                word.src
            )
        }),
        None => Err(format!("`{name}` is missing an option's value")),
    }
}

/// Short and long options of a program, as its getopt reads them.
#[derive(Default)]
struct Spec {
    /// Short flags.
    flags: &'static str,
    /// Short options with a value, attached or in the next word.
    values: &'static str,
    /// Short options with an optional value, attached only.
    optional: &'static str,
    /// Long flags.
    long_flags: &'static [&'static str],
    /// Long options with a value (`--x=v` or `--x v`).
    long_values: &'static [&'static str],
    /// Long options with an optional value (`--x` or `--x=v`).
    long_optional: &'static [&'static str],
    /// `-10`-style numeric options (`nice`).
    numeric: bool,
}

/// Options read from the start of a command line.
struct Parsed {
    /// `-x` / `--long` with their values.
    opts: Vec<(String, Option<String>)>,
    /// Index of the first operand.
    rest: usize,
    /// Options ended with `--`.
    ended: bool,
}

impl Parsed {
    fn has(&self, names: &[&str]) -> bool {
        self.opts.iter().any(|(o, _)| names.contains(&o.as_str()))
    }

    fn value(&self, names: &[&str]) -> Option<Option<&str>> {
        self.opts
            .iter()
            .rev()
            .find(|(o, _)| names.contains(&o.as_str()))
            .map(|(_, v)| v.as_deref())
    }
}

/// Reads options from `argv[start..]` up to the first operand (or `--`). Unknown or
/// abbreviated options and computed words are errors: the command could not be followed.
fn parse_options(name: &str, argv: &[Word], start: usize, spec: &Spec) -> Result<Parsed, String> {
    let mut opts = Vec::new();
    let mut i = start;
    let mut ended = false;
    let unknown = |opt: &str| {
        format!("`{name}` with the option `{opt}`, which is not on the list of options followed")
    };
    while i < argv.len() {
        let word = text(name, argv, i)?;
        if word == "--" {
            i += 1;
            ended = true;
            break;
        }
        if let Some(long) = word.strip_prefix("--") {
            let (key, value) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (long, None),
            };
            if spec.long_flags.contains(&key) && value.is_none() {
                opts.push((format!("--{key}"), None));
            } else if spec.long_values.contains(&key) {
                let value = match value {
                    Some(v) => v,
                    None => {
                        i += 1;
                        text(name, argv, i)?
                    }
                };
                opts.push((format!("--{key}"), Some(value)));
            } else if spec.long_optional.contains(&key) {
                opts.push((format!("--{key}"), value));
            } else if spec.numeric && is_number(key) {
                opts.push(("-n".into(), Some(format!("-{key}"))));
            } else {
                return Err(unknown(&word));
            }
            i += 1;
            continue;
        }
        if word.len() > 1 && word.starts_with('-') {
            if spec.numeric && is_number(&word[1..]) {
                opts.push(("-n".into(), Some(word[1..].to_owned())));
                i += 1;
                continue;
            }
            let chars: Vec<char> = word[1..].chars().collect();
            for (j, &c) in chars.iter().enumerate() {
                let attached: String = chars[j + 1..].iter().collect();
                if spec.flags.contains(c) {
                    opts.push((format!("-{c}"), None));
                } else if spec.values.contains(c) {
                    let value = if attached.is_empty() {
                        i += 1;
                        text(name, argv, i)?
                    } else {
                        attached
                    };
                    opts.push((format!("-{c}"), Some(value)));
                    break;
                } else if spec.optional.contains(c) {
                    opts.push((format!("-{c}"), (!attached.is_empty()).then_some(attached)));
                    break;
                } else {
                    return Err(unknown(&format!("-{c}")));
                }
            }
            i += 1;
            continue;
        }
        break;
    }
    Ok(Parsed {
        opts,
        rest: i,
        ended,
    })
}

fn is_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The command starting at `argv[i]` (must have a literal name), or `None` when there is none.
fn command_at(name: &str, argv: &[Word], i: usize) -> Result<Option<Vec<Word>>, String> {
    if i >= argv.len() {
        return Ok(None);
    }
    text(name, argv, i)?;
    Ok(Some(argv[i..].to_vec()))
}

fn wrapper(inner: Option<Vec<Word>>, role: Role) -> Runs {
    match inner {
        Some(inner) => Runs::Commands {
            inner: vec![inner],
            role,
        },
        None => Nothing,
    }
}

/// Records a `NAME=value` operand of `env`/`sudo`/`strace -E`: not literal, and unprovable
/// for a variable that makes programs run code.
fn assignment_operand(w: &mut Walker<'_, '_>, name: &str, operand: &str) -> Result<(), String> {
    let var = operand.split_once('=').map_or(operand, |(v, _)| v);
    if let Some(why) = dangerous_variable(var) {
        return Err(why);
    }
    w.not_literal(format!("`{name} {var}=…` sets a variable"));
    Ok(())
}

/// Variables whose value programs run as code or load code from (see the module docs).
const DANGEROUS_VARIABLES: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "SHELLOPTS",
    "BASHOPTS",
    "PAGER",
    "MANPAGER",
    "EDITOR",
    "VISUAL",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "SHELL",
    "PERL5OPT",
    "PERL5DB",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "NODE_OPTIONS",
    "RUBYOPT",
    "TAR_OPTIONS",
    "ZIPOPT",
    "RSYNC_RSH",
    "MAKEFLAGS",
    "GNUMAKEFLAGS",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "BASH_CMDS",
    "BASH_ALIASES",
    "PSQL_PAGER",
    "PSQL_EDITOR",
    "PSQL_EDITOR_LINENUMBER_ARG",
    "PSQLRC",
    "MYSQL_HOME",
    "MYSQL_TEST_LOGIN_FILE",
    "GOFLAGS",
    "GOENV",
    "RUSTC",
    "RUSTDOC",
];
const DANGEROUS_PREFIXES: &[&str] = &[
    "BASH_FUNC_",
    "LD_",
    "GIT_",
    "CARGO_TARGET_",
    "npm_config_",
    "NPM_CONFIG_",
];
const SAFE_GIT_VARIABLES: &[&str] = &[
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
    "GIT_TERMINAL_PROMPT",
];

/// Why setting `name` makes the line unprovable, if it does.
pub(super) fn dangerous_variable(name: &str) -> Option<String> {
    let dangerous = DANGEROUS_VARIABLES.contains(&name)
        || (DANGEROUS_PREFIXES.iter().any(|p| name.starts_with(p))
            && !SAFE_GIT_VARIABLES.contains(&name));
    dangerous
        .then(|| format!("it sets `{name}`, which makes programs run code or commands it names"))
}

/// Whether `word` is a shell assignment `NAME=value`.
pub(super) fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// Programs known to run other commands in ways not followed here: always unprovable.
const OPAQUE: &[&str] = &[
    "systemd-run",
    "pkexec",
    "machinectl",
    "firejail",
    "bwrap",
    "proot",
    "faketime",
    "gosu",
    "su-exec",
    "tini",
    "dumb-init",
    "catchsegv",
    "valgrind",
    "perf",
    "ltrace",
    "expect",
    "tmux",
    "screen",
    "dtach",
    "abduco",
    "parallel",
    "sem",
    "start-stop-daemon",
    "run-parts",
    "entr",
    "at",
    "batch",
    "pee",
    "ifne",
    "dbus-run-session",
    "xvfb-run",
    "numactl",
    "cpulimit",
    "prlimit",
    "torsocks",
    "proxychains",
    "proxychains4",
    "eatmydata",
    "nocache",
    "rlwrap",
    "socat",
    "sshpass",
    "chpst",
    "setuidgid",
    "envuidgid",
    "envdir",
    "softlimit",
    "runcon",
    "capsh",
    "sg",
    "newgrp",
    "script",
    "unbuffer",
    "chronic",
    "vipe",
    "deno",
    "bun",
    "npx",
    "bunx",
    "uvx",
    "pipx",
    "R",
    "tclsh",
    "wish",
    "osascript",
    "pwsh",
    "powershell",
];

/// Shells whose syntax is not bash's: never analyzed.
const OTHER_SHELLS: &[&str] = &[
    "zsh", "ksh", "ksh93", "mksh", "pdksh", "oksh", "yash", "posh", "fish", "csh", "tcsh", "rc",
    "es", "elvish", "nu", "nush", "xonsh", "ion", "osh", "ysh", "oil",
];

/// Editors and debuggers: they run their own command languages.
const EDITORS: &[&str] = &[
    "vi",
    "vim",
    "nvim",
    "view",
    "vimdiff",
    "rvim",
    "rview",
    "gvim",
    "evim",
    "ex",
    "ed",
    "red",
    "emacs",
    "emacsclient",
    "gdb",
    "lldb",
    "nano",
];

fn runs(w: &mut Walker<'_, '_>, name: &str, argv: &[Word]) -> Result<Runs, String> {
    let name = unversioned(name);
    if OPAQUE.contains(&name) {
        return Ok(unprovable(format!(
            "`{name}` runs commands in ways that are not followed"
        )));
    }
    if OTHER_SHELLS.contains(&name) {
        return Ok(unprovable(format!(
            "`{name}` is a shell whose syntax is not analyzed"
        )));
    }
    if EDITORS.contains(&name) {
        return Ok(unprovable(format!(
            "`{name}` runs its own commands (editor or debugger)"
        )));
    }
    if is_python(name) {
        return interpreter(argv, name, &PYTHON);
    }
    if command_options::is_c_compiler(name) {
        return command_options::c_compiler(name, argv);
    }
    Ok(match name {
        // Builtins that evaluate text.
        "eval" => {
            let words: Option<Vec<String>> = argv[1..].iter().map(Word::text).collect();
            match words {
                Some(words) => Runs::Evaluates {
                    why: "`eval` runs its arguments as code".into(),
                    script: words.join(" "),
                },
                None => unprovable("`eval` runs computed text as code"),
            }
        }
        "source" | "." => unprovable(format!("`{name}` runs the commands of a file")),
        "trap" => trap(argv),
        "alias" | "enable" | "fc" | "coproc" | "compgen" | "complete" | "compopt" | "bind" => {
            unprovable(format!("`{name}` can make text run as commands"))
        }
        "declare" | "typeset" | "local" | "export" | "readonly" => unprovable(format!(
            "`{name}` through a wrapper can evaluate values as code"
        )),
        "hash" => {
            if argv[1..].iter().any(|a| {
                a.text()
                    .is_none_or(|t| t.starts_with('-') && t.contains('p'))
            }) {
                unprovable("`hash -p` changes which program a name runs")
            } else {
                Nothing
            }
        }
        "let" => {
            let literal = argv[1..].iter().all(|a| {
                a.text().is_some_and(|t| {
                    t.chars().all(|c| {
                        c.is_ascii_digit() || c.is_whitespace() || "+-*/%()<>=!&|^~?:,".contains(c)
                    })
                })
            });
            if literal {
                Nothing
            } else {
                unprovable("`let` evaluates variables as arithmetic, which can run code")
            }
        }
        "mapfile" | "readarray" | "read" | "getopts" | "wait" | "printf" | "test" | "[" => {
            variable_names(name, argv)
        }
        "jobs" => {
            if argv[1..].iter().any(|a| {
                a.text()
                    .is_none_or(|t| t.starts_with('-') && t.contains('x'))
            }) {
                unprovable("`jobs -x` runs a command")
            } else {
                Nothing
            }
        }
        // Wrappers that run the next command.
        "env" => env(w, argv)?,
        "nice" => {
            let p = parse_options(name, argv, 1, &NICE)?;
            wrapper(command_at(name, argv, p.rest)?, Role::TransparentWrapper)
        }
        "timeout" => {
            let p = parse_options(name, argv, 1, &TIMEOUT)?;
            if p.has(&["--help", "--version"]) {
                return Ok(Nothing);
            }
            text(name, argv, p.rest)?;
            wrapper(
                command_at(name, argv, p.rest + 1)?,
                Role::TransparentWrapper,
            )
        }
        "choom" => {
            let p = parse_options(name, argv, 1, &CHOOM)?;
            if p.has(&["-p", "--pid", "-h", "--help", "-V", "--version"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::TransparentWrapper)
        }
        "ssh-agent" => {
            let p = parse_options(name, argv, 1, &SSH_AGENT)?;
            if p.has(&["-k"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::Wrapper)
        }
        "nohup" | "setsid" | "stdbuf" | "time" | "fakeroot" | "fakeroot-sysv" | "fakeroot-tcp" => {
            let spec = match name {
                "nohup" => &NOHUP,
                "setsid" => &SETSID,
                "stdbuf" => &STDBUF,
                "time" => &TIME,
                _ => &FAKEROOT,
            };
            let p = parse_options(name, argv, 1, spec)?;
            if p.has(&["-l", "--lib", "-f", "--faked"]) {
                return Ok(unprovable(
                    "`fakeroot` loading another library runs its code",
                ));
            }
            if p.has(&["--help", "--version", "-h", "-V"]) {
                return Ok(Nothing);
            }
            match command_at(name, argv, p.rest)? {
                None if name.starts_with("fakeroot") => {
                    unprovable(format!("`{name}` without a command starts a shell"))
                }
                inner => wrapper(inner, Role::TransparentWrapper),
            }
        }
        "ionice" => {
            let p = parse_options(name, argv, 1, &IONICE)?;
            if p.has(&["-p", "--pid", "-P", "--pgid", "-u", "--uid", "-h", "-V"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::TransparentWrapper)
        }
        "chrt" => {
            let p = parse_options(name, argv, 1, &CHRT)?;
            if p.has(&["-p", "--pid", "-m", "--max", "-h", "-V"]) {
                return Ok(Nothing);
            }
            let mut i = p.rest;
            if argv
                .get(i)
                .and_then(Word::text)
                .is_some_and(|t| is_number(&t))
            {
                i += 1;
            }
            wrapper(command_at(name, argv, i)?, Role::TransparentWrapper)
        }
        "taskset" => {
            let p = parse_options(name, argv, 1, &TASKSET)?;
            if p.has(&["-p", "--pid", "-h", "-V"]) {
                return Ok(Nothing);
            }
            text(name, argv, p.rest)?;
            wrapper(
                command_at(name, argv, p.rest + 1)?,
                Role::TransparentWrapper,
            )
        }
        "setarch" | "linux32" | "linux64" | "i386" | "x86_64" => {
            let start = if name == "setarch" {
                text(name, argv, 1)?;
                2
            } else {
                1
            };
            let p = parse_options(name, argv, start, &SETARCH)?;
            if p.has(&["--list", "-h", "-V"]) {
                return Ok(Nothing);
            }
            match command_at(name, argv, p.rest)? {
                Some(inner) => wrapper(Some(inner), Role::TransparentWrapper),
                None => unprovable(format!("`{name}` without a command starts a shell")),
            }
        }
        "flock" => flock(argv)?,
        "watch" => watch(argv)?,
        "xargs" => xargs(argv)?,
        "command" => {
            let p = parse_options(name, argv, 1, &COMMAND)?;
            if p.has(&["-v", "-V"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::TransparentWrapper)
        }
        "builtin" => wrapper(command_at(name, argv, 1)?, Role::TransparentWrapper),
        "exec" => {
            let p = parse_options(name, argv, 1, &EXEC)?;
            if p.has(&["-a"]) {
                return Ok(unprovable("`exec -a` runs a command under another name"));
            }
            wrapper(command_at(name, argv, p.rest)?, Role::TransparentWrapper)
        }
        "busybox" => match argv.get(1).and_then(Word::text) {
            Some(applet) if !applet.starts_with('-') => {
                wrapper(Some(argv[1..].to_vec()), Role::TransparentWrapper)
            }
            Some(_) => Nothing,
            None if argv.len() > 1 => unprovable("`busybox` with a computed applet name"),
            None => Nothing,
        },
        "sh" | "bash" | "dash" | "ash" | "rbash" => shell(name, argv)?,
        // Wrappers that change who runs the command or what it reaches.
        "sudo" => sudo(w, argv)?,
        "doas" => {
            let p = parse_options(name, argv, 1, &DOAS)?;
            if p.has(&["-s"]) {
                return Ok(unprovable("`doas -s` starts a shell"));
            }
            if p.has(&["-C"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::Wrapper)
        }
        "su" | "runuser" => su(name, argv)?,
        "setpriv" => {
            let p = parse_options(name, argv, 1, &SETPRIV)?;
            if p.has(&["-d", "--dump", "-h", "--help", "-V", "--version"]) {
                return Ok(Nothing);
            }
            wrapper(command_at(name, argv, p.rest)?, Role::Wrapper)
        }
        "unshare" | "nsenter" => {
            let spec = if name == "unshare" {
                &UNSHARE
            } else {
                &NSENTER
            };
            let p = parse_options(name, argv, 1, spec)?;
            if p.has(&["-h", "--help", "-V", "--version"]) {
                return Ok(Nothing);
            }
            match command_at(name, argv, p.rest)? {
                Some(inner) => wrapper(Some(inner), Role::Wrapper),
                None => unprovable(format!("`{name}` without a command starts a shell")),
            }
        }
        "chroot" => {
            let p = parse_options(name, argv, 1, &CHROOT)?;
            if p.has(&["--help", "--version"]) {
                return Ok(Nothing);
            }
            text(name, argv, p.rest)?;
            match command_at(name, argv, p.rest + 1)? {
                Some(inner) => wrapper(Some(inner), Role::Wrapper),
                None => unprovable("`chroot` without a command starts a shell"),
            }
        }
        "strace" => strace(w, argv)?,
        "find" => find(argv)?,
        // Interpreters.
        "perl" => perl(argv)?,
        "ruby" => interpreter(argv, name, &RUBY)?,
        "node" | "nodejs" => interpreter(argv, name, &NODE)?,
        "php" => interpreter(argv, name, &PHP)?,
        "lua" | "luajit" | "lua5.1" | "lua5.2" | "lua5.3" | "lua5.4" => {
            interpreter(argv, name, &LUA)?
        }
        "Rscript" => interpreter(argv, name, &RSCRIPT)?,
        "awk" | "gawk" | "mawk" | "nawk" => awk(name, argv)?,
        "sed" => sed(argv)?,
        // Programs with options that run commands.
        "git" => git(argv)?,
        "tar" => tar(argv)?,
        "split" => command_options::split(argv)?,
        "sort" => command_options::sort(argv)?,
        "install" | "diff3" | "sdiff" => command_options::program_option(name, argv)?,
        "rustc" => command_options::rustc(argv)?,
        "wget" => command_options::wget(argv)?,
        "cpio" => scan_options(name, argv, &[], &[], &["rsh-command"], "")?,
        "zip" => scan_options(name, argv, &[], &["-TT"], &["unzip-command"], "")?,
        "rsync" => scan_options(name, argv, &[], &["-e"], &["rsh", "rsync-path"], "e")?,
        "ssh" | "scp" | "sftp" | "slogin" => ssh(name, argv)?,
        // Database shells: their command-line text is a command language that can run
        // shell commands.
        "sqlite3" => sqlite3(argv)?,
        "psql" => psql(argv)?,
        "mysql" | "mariadb" => mysql(name, argv)?,
        "npm" | "pnpm" | "yarn" => package_manager(name, argv)?,
        "dpkg" => dpkg(argv)?,
        "cargo" => scan_options(name, argv, &[], &[], &["config"], "")?,
        "go" => go(argv)?,
        "apt" | "apt-get" => scan_options(
            name,
            argv,
            &[],
            &["-o", "-c"],
            &["option", "config-file"],
            "oc",
        )?,
        "make" | "gmake" => make(argv)?,
        "man" => scan_options(name, argv, &[], &["-P", "-H"], &["pager", "html"], "PH")?,
        "less" | "more" | "most" => {
            if argv[1..]
                .iter()
                .any(|a| a.text().is_none_or(|t| t.starts_with('+')))
            {
                unprovable(format!("`{name} +…` runs {name} commands"))
            } else {
                Nothing
            }
        }
        _ if DATA_ONLY.contains(&name) => Nothing,
        _ => Runs::Unknown,
    })
}

/// Common programs known to treat their arguments as data, never as a command to run: a
/// program not on any list of this module is assumed to maybe run its arguments (see
/// [`Runs::Unknown`]).
const DATA_ONLY: &[&str] = &[
    "echo",
    "printf",
    "cat",
    "tac",
    "ls",
    "dir",
    "head",
    "tail",
    "wc",
    "cut",
    "tr",
    "uniq",
    "paste",
    "join",
    "fold",
    "fmt",
    "nl",
    "column",
    "grep",
    "egrep",
    "fgrep",
    "diff",
    "cmp",
    "comm",
    "file",
    "stat",
    "readlink",
    "realpath",
    "basename",
    "dirname",
    "which",
    "whereis",
    "whatis",
    "apropos",
    "type",
    "help",
    "info",
    "touch",
    "mkdir",
    "rmdir",
    "rm",
    "cp",
    "mv",
    "ln",
    "chmod",
    "chown",
    "chgrp",
    "test",
    "[",
    "true",
    "false",
    ":",
    "pwd",
    "cd",
    "pushd",
    "popd",
    "dirs",
    "unset",
    "shift",
    "set",
    "shopt",
    "umask",
    "ulimit",
    "kill",
    "sleep",
    "date",
    "seq",
    "du",
    "df",
    "tee",
    "base64",
    "md5sum",
    "sha1sum",
    "sha256sum",
    "sha512sum",
    "od",
    "hexdump",
    "xxd",
    "jq",
    "tree",
    "unlink",
    "truncate",
    "shred",
    "mktemp",
    "whoami",
    "id",
    "hostname",
    "uname",
];

fn is_python(name: &str) -> bool {
    let rest = name
        .strip_prefix("python")
        .or_else(|| name.strip_prefix("pypy"));
    rest.is_some_and(|r| r.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

const NICE: Spec = Spec {
    values: "n",
    long_values: &["adjustment"],
    long_flags: &["help", "version"],
    numeric: true,
    ..SPEC
};
const SPEC: Spec = Spec {
    flags: "",
    values: "",
    optional: "",
    long_flags: &[],
    long_values: &[],
    long_optional: &[],
    numeric: false,
};
const TIMEOUT: Spec = Spec {
    flags: "v",
    values: "ks",
    long_flags: &[
        "preserve-status",
        "foreground",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["kill-after", "signal"],
    ..SPEC
};
const NOHUP: Spec = Spec {
    long_flags: &["help", "version"],
    ..SPEC
};
const SETSID: Spec = Spec {
    flags: "cfwhV",
    long_flags: &["ctty", "fork", "wait", "help", "version"],
    ..SPEC
};
const STDBUF: Spec = Spec {
    values: "ioe",
    long_values: &["input", "output", "error"],
    long_flags: &["help", "version"],
    ..SPEC
};
const TIME: Spec = Spec {
    flags: "apqvhV",
    values: "fo",
    long_flags: &[
        "append",
        "portability",
        "quiet",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["format", "output"],
    ..SPEC
};
const FAKEROOT: Spec = Spec {
    flags: "uhv",
    values: "lfisb",
    long_flags: &["unknown-is-real", "help", "version"],
    long_values: &["lib", "faked", "fd-base"],
    ..SPEC
};
const CHOOM: Spec = Spec {
    flags: "hV",
    values: "np",
    long_flags: &["help", "version"],
    long_values: &["adjust", "pid"],
    ..SPEC
};
const SSH_AGENT: Spec = Spec {
    flags: "cDdks",
    values: "aEOPt",
    ..SPEC
};
const IONICE: Spec = Spec {
    flags: "tpPuhV",
    values: "cn",
    long_flags: &["ignore", "pid", "pgid", "uid", "help", "version"],
    long_values: &["class", "classdata"],
    ..SPEC
};
const CHRT: Spec = Spec {
    flags: "bdfioRrampvhV",
    values: "TPD",
    long_flags: &[
        "batch",
        "deadline",
        "fifo",
        "idle",
        "other",
        "rr",
        "reset-on-fork",
        "all-tasks",
        "max",
        "pid",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["sched-runtime", "sched-period", "sched-deadline"],
    ..SPEC
};
const TASKSET: Spec = Spec {
    flags: "apchV",
    long_flags: &["all-tasks", "pid", "cpu-list", "help", "version"],
    ..SPEC
};
const SETARCH: Spec = Spec {
    flags: "BFILRSTXZ3vhV",
    long_flags: &[
        "32bit",
        "fdpic-funcptrs",
        "short-inode",
        "addr-compat-layout",
        "addr-no-randomize",
        "whole-seconds",
        "sticky-timeouts",
        "read-implies-exec",
        "mmap-page-zero",
        "3gb",
        "4gb",
        "uname-2.6",
        "verbose",
        "list",
        "help",
        "version",
    ],
    ..SPEC
};
const COMMAND: Spec = Spec {
    flags: "pvV",
    ..SPEC
};
const EXEC: Spec = Spec {
    flags: "cl",
    values: "a",
    ..SPEC
};
const DOAS: Spec = Spec {
    flags: "Lns",
    values: "Cu",
    ..SPEC
};
const SETPRIV: Spec = Spec {
    flags: "dhV",
    long_flags: &[
        "dump",
        "nnp",
        "no-new-privs",
        "clear-groups",
        "keep-groups",
        "init-groups",
        "reset-env",
        "help",
        "version",
    ],
    long_values: &[
        "ambient-caps",
        "inh-caps",
        "bounding-set",
        "ruid",
        "euid",
        "rgid",
        "egid",
        "reuid",
        "regid",
        "groups",
        "securebits",
        "pdeathsig",
        "selinux-label",
        "apparmor-profile",
    ],
    ..SPEC
};
const UNSHARE: Spec = Spec {
    flags: "frchV",
    values: "RwSG",
    optional: "muinpUCT",
    long_flags: &[
        "fork",
        "map-root-user",
        "map-current-user",
        "map-auto",
        "keep-caps",
        "help",
        "version",
    ],
    long_values: &[
        "map-user",
        "map-group",
        "map-users",
        "map-groups",
        "propagation",
        "setgroups",
        "root",
        "wd",
        "setuid",
        "setgid",
        "monotonic",
        "boottime",
    ],
    long_optional: &[
        "mount",
        "uts",
        "ipc",
        "net",
        "pid",
        "user",
        "cgroup",
        "time",
        "kill-child",
        "mount-proc",
    ],
    numeric: false,
};
const NSENTER: Spec = Spec {
    flags: "aFZhV",
    values: "tSGW",
    optional: "muinpCUTrw",
    long_flags: &[
        "all",
        "preserve-credentials",
        "no-fork",
        "follow-context",
        "help",
        "version",
    ],
    long_values: &["target", "setuid", "setgid", "wdns"],
    long_optional: &[
        "mount", "uts", "ipc", "net", "pid", "cgroup", "user", "time", "root", "wd",
    ],
    numeric: false,
};
const CHROOT: Spec = Spec {
    long_flags: &["skip-chdir", "help", "version"],
    long_values: &["groups", "userspec"],
    ..SPEC
};
const SUDO: Spec = Spec {
    optional: "",
    flags: "AbBEHKknPSVvlies",
    values: "CDgpRrtTUu",
    long_flags: &[
        "askpass",
        "background",
        "bell",
        "preserve-env",
        "set-home",
        "remove-timestamp",
        "reset-timestamp",
        "non-interactive",
        "preserve-groups",
        "stdin",
        "version",
        "validate",
        "list",
        "login",
        "edit",
        "shell",
        "help",
    ],
    long_values: &[
        "close-from",
        "chdir",
        "group",
        "prompt",
        "chroot",
        "role",
        "type",
        "command-timeout",
        "other-user",
        "user",
        "host",
    ],
    long_optional: &["preserve-env"],
    numeric: false,
};
const STRACE: Spec = Spec {
    optional: "",
    flags: "AcCdDfFhiknqrtTvVwxyYzZ",
    values: "abeEIoOpPsSuUX",
    long_flags: &[
        "follow-forks",
        "output-separately",
        "instruction-pointer",
        "stack-traces",
        "syscall-number",
        "output-append-mode",
        "no-abbrev",
        "summary-only",
        "summary",
        "summary-wall-clock",
        "successful-only",
        "failed-only",
        "seccomp-bpf",
        "debug",
        "help",
        "version",
    ],
    long_values: &[
        "env",
        "attach",
        "user",
        "detach-on",
        "interruptible",
        "trace",
        "signal",
        "status",
        "trace-path",
        "columns",
        "abbrev",
        "verbose",
        "raw",
        "read",
        "write",
        "kvm",
        "output",
        "string-limit",
        "const-print-style",
        "summary-syscall-overhead",
        "summary-sort-by",
        "summary-columns",
        "inject",
        "fault",
    ],
    long_optional: &[
        "daemonize",
        "quiet",
        "relative-timestamps",
        "absolute-timestamps",
        "syscall-times",
        "strings-in-hex",
        "decode-fds",
        "decode-pids",
        "tips",
    ],
    numeric: false,
};
const ENV: Spec = Spec {
    optional: "",
    flags: "i0v",
    values: "uCS",
    long_flags: &[
        "ignore-environment",
        "null",
        "debug",
        "list-signal-handling",
        "help",
        "version",
    ],
    long_values: &["unset", "chdir", "split-string"],
    long_optional: &["block-signal", "default-signal", "ignore-signal"],
    numeric: false,
};
const FLOCK: Spec = Spec {
    flags: "sxenouFhV",
    values: "wEc",
    long_flags: &[
        "shared",
        "exclusive",
        "unlock",
        "nonblock",
        "nb",
        "close",
        "no-fork",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["timeout", "wait", "conflict-exit-code", "command"],
    ..SPEC
};
const WATCH: Spec = Spec {
    flags: "bcCegptwxrhv",
    values: "nq",
    optional: "d",
    long_flags: &[
        "beep", "color", "no-color", "errexit", "chgexit", "precise", "no-title", "no-wrap",
        "exec", "no-rerun", "help", "version",
    ],
    long_values: &["interval", "equexit"],
    long_optional: &["differences"],
    numeric: false,
};
const XARGS: Spec = Spec {
    flags: "0oprtx",
    values: "adEILnPs",
    optional: "eil",
    long_flags: &[
        "null",
        "open-tty",
        "interactive",
        "no-run-if-empty",
        "verbose",
        "exit",
        "show-limits",
        "help",
        "version",
    ],
    long_values: &[
        "arg-file",
        "delimiter",
        "max-args",
        "max-procs",
        "max-chars",
        "process-slot-var",
    ],
    long_optional: &["eof", "replace", "max-lines"],
    numeric: false,
};

fn trap(argv: &[Word]) -> Runs {
    let mut i = 1;
    while let Some(t) = argv.get(i).and_then(Word::text) {
        if t == "--" {
            i += 1;
            break;
        }
        if t.starts_with('-') && t.len() > 1 {
            i += 1;
            continue;
        }
        break;
    }
    match argv.get(i).map(Word::text) {
        Some(Some(action)) => Runs::Evaluates {
            why: "`trap` runs its action as code when a signal comes".into(),
            script: action,
        },
        Some(None) => unprovable("`trap` with a computed action"),
        None => Nothing,
    }
}

/// Builtins that take variable names: a subscript in a name is evaluated as arithmetic.
fn variable_names(name: &str, argv: &[Word]) -> Runs {
    let names_at: Vec<usize> = match name {
        "printf" | "test" | "[" => argv
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                let flags: &[&str] = if name == "printf" {
                    &["-v"]
                } else {
                    &["-v", "-R"]
                };
                a.text().is_some_and(|t| flags.contains(&t.as_str()))
            })
            .map(|(i, _)| i + 1)
            .collect(),
        _ => (1..argv.len()).collect(),
    };
    if (name == "mapfile" || name == "readarray")
        && argv[1..].iter().any(|a| {
            a.text()
                .is_none_or(|t| t.starts_with('-') && t.contains('C'))
        })
    {
        return unprovable(format!("`{name} -C` runs a callback"));
    }
    for i in names_at {
        if let Some(word) = argv.get(i) {
            match word.text() {
                Some(t) if t.starts_with('-') => {}
                Some(t) if dangerous_variable(&t).is_some() => {
                    return Unprovable(dangerous_variable(&t).unwrap_or_default());
                }
                Some(t) if !t.contains('[') => {}
                _ => {
                    return unprovable(format!(
                        "`{name}` with the variable name `{}`, whose subscript bash evaluates as code",
                        word.src
                    ));
                }
            }
        }
    }
    Nothing
}

fn env(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
    let p = parse_options("env", argv, 1, &ENV)?;
    if p.has(&["-S", "--split-string"]) {
        return Ok(unprovable(
            "`env -S` splits a string into a command line, which is not followed",
        ));
    }
    if p.has(&["--help", "--version"]) {
        return Ok(Nothing);
    }
    if p.has(&["-u", "--unset", "-i", "--ignore-environment"]) {
        w.not_literal("`env` changes the environment");
    }
    let mut i = p.rest;
    while i < argv.len() {
        let t = text("env", argv, i)?;
        if t == "-" {
            i += 1;
        } else if t.contains('=') {
            assignment_operand(w, "env", &t)?;
            i += 1;
        } else {
            break;
        }
    }
    Ok(wrapper(
        command_at("env", argv, i)?,
        Role::TransparentWrapper,
    ))
}

fn flock(argv: &[Word]) -> Result<Runs, String> {
    let p = parse_options("flock", argv, 1, &FLOCK)?;
    if p.has(&["-h", "--help", "-V", "--version"]) {
        return Ok(Nothing);
    }
    if let Some(Some(cmd)) = p.value(&["-c", "--command"]) {
        return Ok(Runs::Script {
            script: cmd.to_owned(),
            role: Role::TransparentWrapper,
        });
    }
    // The lock file (or descriptor), then `-c COMMAND` or a command.
    text("flock", argv, p.rest)?;
    let after = p.rest + 1;
    match argv.get(after).and_then(Word::text).as_deref() {
        Some("-c" | "--command") => Ok(Runs::Script {
            script: text("flock", argv, after + 1)?,
            role: Role::TransparentWrapper,
        }),
        _ => Ok(wrapper(
            command_at("flock", argv, after)?,
            Role::TransparentWrapper,
        )),
    }
}

fn watch(argv: &[Word]) -> Result<Runs, String> {
    let p = parse_options("watch", argv, 1, &WATCH)?;
    if p.has(&["-h", "--help", "-v", "--version"]) {
        return Ok(Nothing);
    }
    if p.has(&["-x", "--exec"]) {
        return Ok(wrapper(
            command_at("watch", argv, p.rest)?,
            Role::TransparentWrapper,
        ));
    }
    // watch joins its arguments with spaces and runs them with `sh -c`.
    let words: Result<Vec<String>, String> = (p.rest..argv.len())
        .map(|i| text("watch", argv, i))
        .collect();
    let words = words?;
    if words.is_empty() {
        return Ok(Nothing);
    }
    Ok(Runs::Script {
        script: words.join(" "),
        role: Role::TransparentWrapper,
    })
}

fn xargs(argv: &[Word]) -> Result<Runs, String> {
    let p = parse_options("xargs", argv, 1, &XARGS)?;
    if p.has(&["--help", "--version", "--show-limits"]) {
        return Ok(Nothing);
    }
    let replace = match (p.value(&["-I"]), p.value(&["-i", "--replace"])) {
        (Some(Some(r)), _) => Some(r.to_owned()),
        (_, Some(r)) => Some(r.unwrap_or("{}").to_owned()),
        _ => None,
    };
    let mut inner = match command_at("xargs", argv, p.rest)? {
        Some(inner) => inner,
        None => vec![Word::literal("echo")],
    };
    match replace {
        Some(r) => {
            inner = inner.iter().map(|w| w.replace_with_any(&r)).collect();
        }
        None => inner.push(Word::any("…")),
    }
    Ok(Runs::Commands {
        inner: vec![inner],
        role: Role::TransparentWrapper,
    })
}

fn shell(name: &str, argv: &[Word]) -> Result<Runs, String> {
    let mut i = 1;
    let mut script = false;
    while i < argv.len() {
        let t = text(name, argv, i)?;
        if t == "--" || t == "-" {
            i += 1;
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            match long {
                "login" | "noprofile" | "norc" | "posix" | "restricted" | "verbose"
                | "noediting" => {}
                "help" | "version" => return Ok(Nothing),
                _ => {
                    return Ok(unprovable(format!(
                        "`{name} {t}` is not on the list of shell options followed"
                    )));
                }
            }
            i += 1;
            continue;
        }
        if t.len() > 1 && (t.starts_with('-') || t.starts_with('+')) {
            let mut values = 0;
            for c in t[1..].chars() {
                match c {
                    'c' => script = true,
                    'o' | 'O' => values += 1,
                    'i' => return Ok(unprovable(format!("`{name} -i` is an interactive shell"))),
                    's' => {
                        return Ok(unprovable(format!(
                            "`{name} -s` reads commands from standard input"
                        )));
                    }
                    'a' | 'b' | 'e' | 'f' | 'h' | 'k' | 'm' | 'n' | 'p' | 't' | 'u' | 'v' | 'x'
                    | 'B' | 'C' | 'E' | 'H' | 'P' | 'T' | 'l' | 'r' => {}
                    _ => {
                        return Ok(unprovable(format!(
                            "`{name} -{c}` is not on the list of shell options followed"
                        )));
                    }
                }
            }
            for _ in 0..values {
                i += 1;
                text(name, argv, i)?;
            }
            i += 1;
            continue;
        }
        break;
    }
    if script {
        return match argv.get(i).map(Word::text) {
            Some(Some(script)) => Ok(Runs::Script {
                script,
                role: Role::TransparentWrapper,
            }),
            Some(None) => Ok(unprovable(format!("`{name} -c` runs a computed script"))),
            None => Ok(unprovable(format!("`{name} -c` without a script"))),
        };
    }
    Ok(match argv.get(i) {
        Some(file) => unprovable(format!("`{name}` runs the script file `{}`", file.src)),
        None => unprovable(format!(
            "`{name}` reads commands from standard input (input piped or redirected into a shell)"
        )),
    })
}

fn sudo(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
    // sudo reads options and `VAR=value` assignments interleaved.
    let mut opts = Vec::new();
    let mut i = 1;
    loop {
        let p = parse_options("sudo", argv, i, &SUDO)?;
        opts.extend(p.opts);
        i = p.rest;
        let start = i;
        while i < argv.len() && is_assignment(&text("sudo", argv, i)?) {
            assignment_operand(w, "sudo", &text("sudo", argv, i)?)?;
            i += 1;
        }
        if i == start || p.ended {
            break;
        }
    }
    let has = |names: &[&str]| {
        opts.iter()
            .any(|(o, _): &(String, Option<String>)| names.contains(&o.as_str()))
    };
    if has(&["-s", "--shell", "-i", "--login"]) {
        return Ok(unprovable(
            "`sudo -s`/`-i` runs the command through a shell",
        ));
    }
    if has(&["-e", "--edit"]) {
        return Ok(unprovable("`sudo -e` runs an editor"));
    }
    if has(&["-h", "--host", "--help"]) {
        return Ok(unprovable(
            "`sudo -h` is read differently by different sudo versions",
        ));
    }
    if argv
        .get(i)
        .and_then(Word::text)
        .is_some_and(|t| t.starts_with('-') || t.contains('='))
    {
        return Ok(unprovable(
            "`sudo` with an option or assignment where its command starts",
        ));
    }
    Ok(wrapper(command_at("sudo", argv, i)?, Role::Wrapper))
}

fn su(name: &str, argv: &[Word]) -> Result<Runs, String> {
    // util-linux su/runuser read options anywhere (getopt permutes).
    let mut user = None;
    let mut command = None;
    let mut run_as: Option<String> = None;
    let mut operands = Vec::new();
    let mut i = 1;
    let mut ended = false;
    while i < argv.len() {
        let t = text(name, argv, i)?;
        if ended || !(t.starts_with('-') && t.len() > 1) {
            if t == "-" && !ended {
                i += 1;
                continue;
            }
            operands.push(i);
            if name == "runuser" && run_as.is_some() {
                // `runuser -u USER COMMAND…`: everything from here is the command.
                break;
            }
            i += 1;
            continue;
        }
        if t == "--" {
            ended = true;
            i += 1;
            continue;
        }
        let (key, attached) = match t.strip_prefix("--") {
            Some(long) => match long.split_once('=') {
                Some((k, v)) => (format!("--{k}"), Some(v.to_owned())),
                None => (t.clone(), None),
            },
            None => (t[..2].to_owned(), (t.len() > 2).then(|| t[2..].to_owned())),
        };
        let value = |i: &mut usize| -> Result<String, String> {
            match &attached {
                Some(v) => Ok(v.clone()),
                None => {
                    *i += 1;
                    text(name, argv, *i)
                }
            }
        };
        match key.as_str() {
            "-l"
            | "--login"
            | "-m"
            | "-p"
            | "--preserve-environment"
            | "-f"
            | "--fast"
            | "-P"
            | "--pty" => {
                if attached.is_some() && !key.starts_with("--") {
                    return Ok(unprovable(format!(
                        "`{name} {t}`: combined options are not followed"
                    )));
                }
            }
            "-c" | "--command" | "--session-command" => command = Some(value(&mut i)?),
            "-u" | "--user" if name == "runuser" => run_as = Some(value(&mut i)?),
            "-g" | "--group" | "-G" | "--supp-group" | "-w" | "--whitelist-environment" => {
                value(&mut i)?;
            }
            "-s" | "--shell" => {
                let shell = value(&mut i)?;
                let base = shell.rsplit('/').next().unwrap_or(&shell);
                if !matches!(base, "sh" | "bash" | "dash") {
                    return Ok(unprovable(format!(
                        "`{name} -s {shell}` runs a shell whose syntax is not analyzed"
                    )));
                }
            }
            "-h" | "--help" | "-V" | "--version" => return Ok(Nothing),
            _ => {
                return Ok(unprovable(format!(
                    "`{name}` with the option `{t}`, which is not on the list of options followed"
                )));
            }
        }
        i += 1;
    }
    if run_as.is_some() {
        if let Some(cmd) = command {
            return Ok(Runs::Script {
                script: cmd,
                role: Role::Wrapper,
            });
        }
        return Ok(match operands.first() {
            Some(&start) => wrapper(command_at(name, argv, start)?, Role::Wrapper),
            None => unprovable(format!("`{name}` without a command starts a shell")),
        });
    }
    if let Some(&first) = operands.first() {
        user = Some(first);
    }
    if operands.len() > usize::from(user.is_some()) {
        return Ok(unprovable(format!(
            "`{name}` passes the arguments after the user to the shell"
        )));
    }
    Ok(match command {
        Some(script) => Runs::Script {
            script,
            role: Role::Wrapper,
        },
        None => unprovable(format!(
            "`{name}` without `-c` starts a shell reading standard input"
        )),
    })
}

fn strace(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
    let p = parse_options("strace", argv, 1, &STRACE)?;
    for (opt, value) in &p.opts {
        match (opt.as_str(), value.as_deref()) {
            ("-o" | "--output", Some(v)) if v.starts_with(['|', '!']) => {
                return Ok(unprovable("`strace -o |…` pipes its output into a command"));
            }
            ("-E" | "--env", Some(v)) if v.contains('=') => assignment_operand(w, "strace", v)?,
            _ => {}
        }
    }
    if p.has(&["-h", "--help", "-V", "--version"]) {
        return Ok(Nothing);
    }
    Ok(wrapper(command_at("strace", argv, p.rest)?, Role::Wrapper))
}

fn find(argv: &[Word]) -> Result<Runs, String> {
    for word in &argv[1..] {
        if word.text().is_none() {
            return Ok(unprovable(format!(
                "`find` with the computed or glob word `{}`, which could become `-exec`",
                word.src
            )));
        }
    }
    let texts: Vec<String> = argv.iter().filter_map(Word::text).collect();
    let mut inner = Vec::new();
    let mut i = 1;
    while i < texts.len() {
        if matches!(texts[i].as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
            let mut cmd = Vec::new();
            let mut j = i + 1;
            let mut closed = false;
            while j < texts.len() {
                if texts[j] == ";" || (texts[j] == "+" && texts[j - 1] == "{}") {
                    closed = true;
                    break;
                }
                cmd.push(argv[j].replace_with_any("{}"));
                j += 1;
            }
            if !closed || cmd.is_empty() {
                return Ok(unprovable("`find -exec` without a closing `;` or `+`"));
            }
            inner.push(cmd);
            i = j + 1;
            continue;
        }
        i += 1;
    }
    Ok(if inner.is_empty() {
        Nothing
    } else {
        Runs::Commands {
            inner,
            role: Role::Program,
        }
    })
}

/// How an interpreter's command line is read.
struct Interp {
    /// Short options whose value (or the rest of the line) is code.
    code: &'static str,
    /// Long options whose value is code or loads code.
    code_long: &'static [&'static str],
    /// Short options that take a value (attached or in the next word).
    values: &'static str,
    /// Short options that take only an attached value (the rest of the word).
    attached: &'static str,
    /// Short options that run a module by name instead of a script (`python -m`).
    module: &'static str,
    /// Short flags known to take no value.
    flags: &'static str,
    /// Long options known to take a value from the next word.
    long_values: &'static [&'static str],
    /// Options that only print information.
    info: &'static [&'static str],
}

const PYTHON: Interp = Interp {
    flags: "bBdEhiIOPqsSuvVx?R",
    long_values: &["check-hash-based-pycs"],
    code: "c",
    code_long: &[],
    values: "WXQ",
    attached: "",
    module: "m",
    info: &["-V", "--version", "-h", "--help", "-?"],
};
const RUBY: Interp = Interp {
    flags: "acdhlnpsSvwy",
    long_values: &[
        "encoding",
        "external-encoding",
        "internal-encoding",
        "dump",
        "enable",
        "disable",
    ],
    code: "e",
    code_long: &[],
    values: "rICEF",
    attached: "xi0KTW",
    module: "",
    info: &["-v", "-h", "--version", "--help"],
};
const NODE: Interp = Interp {
    flags: "cvh",
    long_values: &[],
    code: "epri",
    code_long: &[
        "eval",
        "print",
        "require",
        "import",
        "loader",
        "experimental-loader",
        "interactive",
    ],
    values: "",
    attached: "",
    module: "",
    info: &["-v", "-h", "--version", "--help"],
};
const PHP: Interp = Interp {
    flags: "aChHiqmsvw",
    long_values: &[],
    code: "raBRFE",
    code_long: &[],
    values: "fcdzt",
    attached: "",
    module: "",
    info: &["-v", "-h", "-i", "-m", "--version", "--help"],
};
const LUA: Interp = Interp {
    flags: "vEW",
    long_values: &[],
    code: "ei",
    code_long: &[],
    values: "l",
    attached: "",
    module: "",
    info: &["-v"],
};
const RSCRIPT: Interp = Interp {
    flags: "",
    long_values: &[],
    code: "e",
    code_long: &[],
    values: "",
    attached: "",
    module: "",
    info: &["--version", "--help"],
};

/// Perl's command-line switches, read as perl reads them (`perl.c`, `moreswitches`): switches
/// are bundled (`-lne`, `-wle`), some take the digits or letters right after them (`-l0`,
/// `-00`, `-0x1F`, `-CSD`), some the rest of the word (`-F:`, `-i.bak`, `-x`, `-I.`; `-I` alone
/// the next word), and a blank inside a word starts another switch (`'-l -e'`). Code given on
/// the command line (`-e`, `-E`, `-M`, `-m`, `-d`) or read from standard input is unprovable;
/// an unknown switch too.
fn perl(argv: &[Word]) -> Result<Runs, String> {
    let inline = || unprovable("`perl` runs code given on the command line");
    let unknown = |c: char| {
        unprovable(format!(
            "`perl -{c}` is not on the list of perl switches followed"
        ))
    };
    let mut i = 1;
    while i < argv.len() {
        let t = text("perl", argv, i)?;
        if t == "--" {
            i += 1;
            break;
        }
        if !(t.len() > 1 && t.starts_with('-')) {
            break;
        }
        if matches!(t.as_str(), "--help" | "--version") {
            return Ok(Nothing);
        }
        let c: Vec<char> = t.chars().collect();
        let mut j = 1;
        while j < c.len() {
            let sw = c[j];
            j += 1;
            let digits = |j: &mut usize, max: usize, radix: u32| {
                let mut n = 0;
                while n < max && *j < c.len() && c[*j].is_digit(radix) {
                    *j += 1;
                    n += 1;
                }
            };
            match sw {
                'e' | 'E' | 'M' | 'm' | 'd' => return Ok(inline()),
                'v' | 'V' | 'h' | '?' => return Ok(Nothing),
                'a' | 'c' | 'f' | 'g' | 'n' | 'p' | 's' | 'S' | 't' | 'T' | 'u' | 'U' | 'w'
                | 'W' | 'X' => {}
                '0' => {
                    if c.get(j) == Some(&'x') && j + 1 < c.len() {
                        j += 1;
                        digits(&mut j, usize::MAX, 16);
                    } else {
                        digits(&mut j, 3, 8);
                    }
                }
                'l' => {
                    let max = if c.get(j) == Some(&'0') { 4 } else { 3 };
                    digits(&mut j, max, 8);
                }
                'C' => {
                    if c.get(j).is_some_and(char::is_ascii_digit) {
                        digits(&mut j, usize::MAX, 10);
                    } else {
                        while j < c.len() && "IOEioSDALa".contains(c[j]) {
                            j += 1;
                        }
                    }
                }
                'D' => {
                    // Debugging flags (letters or a number); a code switch among them is not
                    // told apart from a flag letter here.
                    if c[j..].iter().any(|&x| "eEMmd".contains(x) || x == ' ') {
                        return Ok(unknown('D'));
                    }
                    j = c.len();
                }
                'F' | 'i' | 'x' => j = c.len(),
                'I' => {
                    if j == c.len() {
                        i += 1;
                        text("perl", argv, i)?;
                    }
                    j = c.len();
                }
                ' ' => {
                    while j < c.len() && c[j] == ' ' {
                        j += 1;
                    }
                    if c.get(j) == Some(&'-') {
                        j += 1;
                    }
                }
                other => return Ok(unknown(other)),
            }
        }
        i += 1;
    }
    Ok(match argv.get(i).map(Word::text) {
        Some(Some(script)) if is_stdin_name(&script) => {
            unprovable("`perl` reads its program from standard input")
        }
        Some(Some(_)) => Nothing,
        Some(None) => unprovable("`perl` runs a computed script"),
        None => unprovable(
            "`perl` reads its program from standard input (input piped or redirected into an interpreter)",
        ),
    })
}

/// An interpreter installed under a versioned name (`perl5.36.0`, `ruby3.1`, `php8.2`,
/// `lua5.4`, `perl5.36-x86_64-linux-gnu`) is that interpreter.
fn unversioned(name: &str) -> &str {
    const BASES: &[&str] = &[
        "perl", "ruby", "php", "lua", "luajit", "node", "nodejs", "tclsh", "wish", "gawk",
    ];
    for base in BASES {
        let Some(rest) = name.strip_prefix(base) else {
            continue;
        };
        let version_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (version, tail) = rest.split_at(version_end);
        if version.starts_with(|c: char| c.is_ascii_digit())
            && (tail.is_empty() || (tail.starts_with('-') && tail.contains("-linux")))
        {
            return base;
        }
    }
    name
}

/// Whether a script operand names standard input.
fn is_stdin_name(path: &str) -> bool {
    path == "-"
        || path == "/dev/stdin"
        || path.starts_with("/dev/fd/")
        || (path.starts_with("/proc/") && path.contains("/fd/"))
}

fn interpreter(argv: &[Word], name: &str, spec: &Interp) -> Result<Runs, String> {
    let inline = || unprovable(format!("`{name}` runs code given on the command line"));
    // Whether a code option is in this word.
    let is_code = |t: &str| {
        if let Some(long) = t.strip_prefix("--") {
            let key = long.split_once('=').map_or(long, |(k, _)| k);
            spec.code_long.contains(&key)
        } else {
            t.len() > 1 && t.starts_with('-') && t[1..].chars().any(|c| spec.code.contains(c))
        }
    };
    // Set after an option whose value the interpreter may take from the next word although
    // it is not listed: the script found after it may be that value, so later words are
    // checked for code options too.
    let mut uncertain = false;
    let mut i = 1;
    while i < argv.len() {
        let t = text(name, argv, i)?;
        if spec.info.contains(&t.as_str()) {
            return Ok(Nothing);
        }
        if t == "--" {
            i += 1;
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            let key = long.split_once('=').map_or(long, |(k, _)| k);
            if spec.code_long.contains(&key) {
                return Ok(inline());
            }
            if !long.contains('=') {
                if spec.long_values.contains(&key) {
                    i += 1;
                } else {
                    uncertain = true;
                }
            }
            i += 1;
            continue;
        }
        if t.len() > 1 && t.starts_with('-') {
            let chars: Vec<char> = t[1..].chars().collect();
            for (j, &c) in chars.iter().enumerate() {
                let last = j + 1 == chars.len();
                if spec.code.contains(c) {
                    return Ok(inline());
                }
                if spec.module.contains(c) {
                    return Ok(Nothing);
                }
                if spec.attached.contains(c) {
                    // Some of these take only digits or one letter and read more switches
                    // after them (`ruby -0e`, `-W0e`): a code switch letter in the rest counts.
                    if chars[j + 1..].iter().any(|&x| spec.code.contains(x)) {
                        return Ok(inline());
                    }
                    uncertain |= last;
                    break;
                }
                if spec.values.contains(c) {
                    if last {
                        i += 1;
                    }
                    break;
                }
                if !spec.flags.contains(c) {
                    uncertain = true;
                }
            }
            i += 1;
            continue;
        }
        break;
    }
    if uncertain
        && argv[i.min(argv.len())..]
            .iter()
            .any(|w| w.text().is_none_or(|t| is_code(&t)))
    {
        return Ok(inline());
    }
    Ok(match argv.get(i).and_then(Word::text) {
        Some(script) if is_stdin_name(&script) => {
            unprovable(format!("`{name}` reads its program from standard input"))
        }
        Some(_) => Nothing,
        None if i < argv.len() => unprovable(format!("`{name}` runs a computed script")),
        None => unprovable(format!(
            "`{name}` reads its program from standard input (input piped or redirected into an interpreter)"
        )),
    })
}

fn awk(name: &str, argv: &[Word]) -> Result<Runs, String> {
    let mut programs = Vec::new();
    let mut from_file = false;
    let mut sandbox = false;
    let mut i = 1;
    while i < argv.len() {
        let t = text(name, argv, i)?;
        if t == "--" {
            i += 1;
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (long, None),
            };
            let take = |i: &mut usize| -> Result<String, String> {
                match &value {
                    Some(v) => Ok(v.clone()),
                    None => {
                        *i += 1;
                        text(name, argv, *i)
                    }
                }
            };
            match key {
                "file" | "exec" | "include" => {
                    let file = take(&mut i)?;
                    if is_stdin_name(&file) {
                        return Ok(unprovable(format!(
                            "`{name}` reads its program from standard input"
                        )));
                    }
                    // `--include` adds a library; the program is still the first operand.
                    from_file |= key != "include";
                }
                "source" => programs.push(take(&mut i)?),
                "field-separator" | "assign" => {
                    take(&mut i)?;
                }
                "load" => return Ok(unprovable(format!("`{name} --load` loads a library"))),
                "sandbox" => sandbox = true,
                "version" | "help" | "usage" | "copyright" => return Ok(Nothing),
                "characters-as-bytes"
                | "traditional"
                | "posix"
                | "re-interval"
                | "lint"
                | "optimize"
                | "no-optimize"
                | "bignum"
                | "use-lc-numeric"
                | "non-decimal-data"
                | "csv"
                | "dump-variables"
                | "profile"
                | "pretty-print"
                | "debug"
                | "gen-pot" => {}
                _ => {
                    return Ok(unprovable(format!(
                        "`{name} {t}` is not on the list of awk options followed"
                    )));
                }
            }
            i += 1;
            continue;
        }
        if t.len() > 1 && t.starts_with('-') {
            let c = t[1..].chars().next().unwrap_or('-');
            let attached = t.get(2..).filter(|a| !a.is_empty()).map(str::to_owned);
            let take = |i: &mut usize| -> Result<String, String> {
                match &attached {
                    Some(v) => Ok(v.clone()),
                    None => {
                        *i += 1;
                        text(name, argv, *i)
                    }
                }
            };
            match c {
                'F' | 'v' => {
                    take(&mut i)?;
                }
                'f' | 'E' | 'i' => {
                    let file = take(&mut i)?;
                    if is_stdin_name(&file) {
                        return Ok(unprovable(format!(
                            "`{name}` reads its program from standard input"
                        )));
                    }
                    // `-i` adds a library; the program is still the first operand.
                    from_file |= c != 'i';
                }
                'e' => programs.push(take(&mut i)?),
                'l' => return Ok(unprovable(format!("`{name} -l` loads a library"))),
                'S' => sandbox = true,
                'W' => {
                    let opt = take(&mut i)?;
                    if opt.starts_with("exec") || opt.starts_with('e') || opt.starts_with('f') {
                        return Ok(unprovable(format!(
                            "`{name} -W {opt}` reads its program from a file or runs it"
                        )));
                    }
                    if opt == "sandbox" {
                        sandbox = true;
                    }
                }
                'b' | 'c' | 'C' | 'd' | 'D' | 'g' | 'h' | 'L' | 'M' | 'n' | 'N' | 'o' | 'O'
                | 'p' | 'P' | 'r' | 's' | 't' | 'V' | 'k' => {}
                _ => {
                    return Ok(unprovable(format!(
                        "`{name} {t}` is not on the list of awk options followed"
                    )));
                }
            }
            i += 1;
            continue;
        }
        break;
    }
    if programs.is_empty() && !from_file {
        match argv.get(i).map(Word::text) {
            Some(Some(program)) => programs.push(program),
            Some(None) => return Ok(unprovable(format!("`{name}` runs a computed program"))),
            None => return Ok(Nothing),
        }
    }
    if sandbox {
        return Ok(Nothing);
    }
    if programs
        .iter()
        .any(|p| p.contains("system") || p.contains('|') || p.contains('@'))
    {
        return Ok(unprovable(format!(
            "the `{name}` program can run commands (`system`, `|` or `@load`)"
        )));
    }
    Ok(Nothing)
}

fn sed(argv: &[Word]) -> Result<Runs, String> {
    // GNU sed reads options anywhere (getopt permutes).
    let mut scripts = Vec::new();
    let mut from_file = false;
    let mut sandbox = false;
    let mut operands = Vec::new();
    let mut i = 1;
    let mut ended = false;
    while i < argv.len() {
        let t = text("sed", argv, i)?;
        if ended || !(t.starts_with('-') && t.len() > 1) {
            operands.push(t);
            i += 1;
            continue;
        }
        if t == "--" {
            ended = true;
            i += 1;
            continue;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (long, None),
            };
            let take = |i: &mut usize| -> Result<String, String> {
                match &value {
                    Some(v) => Ok(v.clone()),
                    None => {
                        *i += 1;
                        text("sed", argv, *i)
                    }
                }
            };
            match key {
                "expression" => scripts.push(take(&mut i)?),
                "file" => {
                    let file = take(&mut i)?;
                    if is_stdin_name(&file) {
                        return Ok(unprovable("`sed` reads its script from standard input"));
                    }
                    from_file = true;
                }
                "line-length" => {
                    take(&mut i)?;
                }
                "sandbox" => sandbox = true,
                "in-place" | "quiet" | "silent" | "debug" | "follow-symlinks" | "posix"
                | "regexp-extended" | "separate" | "unbuffered" | "null-data"
                | "zero-terminated" | "binary" => {}
                "help" | "version" => return Ok(Nothing),
                _ => {
                    return Ok(unprovable(format!(
                        "`sed {t}` is not on the list of sed options followed"
                    )));
                }
            }
            i += 1;
            continue;
        }
        let chars: Vec<char> = t[1..].chars().collect();
        for (j, &c) in chars.iter().enumerate() {
            let attached: String = chars[j + 1..].iter().collect();
            let take = |i: &mut usize| -> Result<String, String> {
                if attached.is_empty() {
                    *i += 1;
                    text("sed", argv, *i)
                } else {
                    Ok(attached.clone())
                }
            };
            match c {
                'n' | 'r' | 'E' | 's' | 'u' | 'z' | 'b' => continue,
                'i' => break,
                'l' => {
                    take(&mut i)?;
                    break;
                }
                'e' => {
                    scripts.push(take(&mut i)?);
                    break;
                }
                'f' => {
                    let file = take(&mut i)?;
                    if is_stdin_name(&file) {
                        return Ok(unprovable("`sed` reads its script from standard input"));
                    }
                    from_file = true;
                    break;
                }
                _ => {
                    return Ok(unprovable(format!(
                        "`sed -{c}` is not on the list of sed options followed"
                    )));
                }
            }
        }
        i += 1;
    }
    if scripts.is_empty() && !from_file {
        match operands.first() {
            Some(script) => scripts.push(script.clone()),
            None => return Ok(Nothing),
        }
    }
    if !sandbox && scripts.iter().any(|s| sed_may_execute(s)) {
        return Ok(unprovable(
            "the `sed` script uses the `e` command or flag, which runs commands",
        ));
    }
    Ok(Nothing)
}

/// Whether a GNU sed script may run a command (the `e` command, the `e` flag of `s`); true
/// whenever the script is not understood.
fn sed_may_execute(script: &str) -> bool {
    let c: Vec<char> = script.chars().collect();
    let n = c.len();
    let mut i = 0;
    let skip_blank = |i: &mut usize| {
        while *i < n && (c[*i] == ' ' || c[*i] == '\t') {
            *i += 1;
        }
    };
    let skip_line = |i: &mut usize| {
        while *i < n && c[*i] != '\n' {
            *i += 1;
        }
    };
    let skip_label = |i: &mut usize| {
        while *i < n && c[*i] != '\n' && c[*i] != ';' {
            *i += 1;
        }
    };
    // Moves past text ending at an unescaped `d`; false when it never ends.
    let delimited = |i: &mut usize, d: char| -> bool {
        while *i < n {
            if c[*i] == '\\' {
                *i += 2;
                continue;
            }
            if c[*i] == d {
                *i += 1;
                return true;
            }
            *i += 1;
        }
        false
    };
    let address = |i: &mut usize| -> bool {
        if *i >= n {
            return true;
        }
        match c[*i] {
            '0'..='9' | '+' | '~' => {
                *i += 1;
                while *i < n && (c[*i].is_ascii_digit() || c[*i] == '~') {
                    *i += 1;
                }
                true
            }
            '$' => {
                *i += 1;
                true
            }
            '/' | '\\' => {
                let d = if c[*i] == '/' {
                    '/'
                } else {
                    match c.get(*i + 1) {
                        Some(&d) => {
                            *i += 1;
                            d
                        }
                        None => return false,
                    }
                };
                *i += 1;
                if !delimited(i, d) {
                    return false;
                }
                while *i < n && matches!(c[*i], 'I' | 'M') {
                    *i += 1;
                }
                true
            }
            _ => true,
        }
    };
    loop {
        while i < n && (c[i].is_whitespace() || c[i] == ';') {
            i += 1;
        }
        if i >= n {
            return false;
        }
        if !address(&mut i) {
            return true;
        }
        skip_blank(&mut i);
        if i < n && c[i] == ',' {
            i += 1;
            skip_blank(&mut i);
            if !address(&mut i) {
                return true;
            }
        }
        skip_blank(&mut i);
        while i < n && c[i] == '!' {
            i += 1;
            skip_blank(&mut i);
        }
        let Some(&cmd) = c.get(i) else {
            return true;
        };
        i += 1;
        match cmd {
            '{' | '}' | '=' | 'd' | 'D' | 'g' | 'G' | 'h' | 'H' | 'n' | 'N' | 'p' | 'P' | 'x'
            | 'z' | 'F' => {}
            '#' | 'r' | 'R' | 'w' | 'W' => skip_line(&mut i),
            ':' | 'b' | 't' | 'T' | 'v' => skip_label(&mut i),
            'l' | 'q' | 'Q' | 'L' => {
                skip_blank(&mut i);
                while i < n && c[i].is_ascii_digit() {
                    i += 1;
                }
            }
            'a' | 'i' | 'c' => {
                while i < n && c[i] != '\n' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
            }
            's' | 'y' => {
                let Some(&d) = c.get(i) else {
                    return true;
                };
                if d == '\n' || d == '\\' {
                    return true;
                }
                i += 1;
                if !delimited(&mut i, d) || !delimited(&mut i, d) {
                    return true;
                }
                if cmd == 's' {
                    while i < n {
                        match c[i] {
                            'g' | 'p' | 'i' | 'I' | 'm' | 'M' | '0'..='9' => i += 1,
                            'e' => return true,
                            'w' => {
                                skip_line(&mut i);
                                break;
                            }
                            _ => break,
                        }
                    }
                }
            }
            _ => return true,
        }
    }
}

/// Sections and keys `git -c` / `git config` may set without making the line unprovable: they
/// hold data, never a command.
const SAFE_GIT_KEYS: &[&str] = &[
    "user.",
    "color.",
    "advice.",
    "log.",
    "i18n.",
    "column.",
    "init.defaultbranch",
    "commit.gpgsign",
    "tag.gpgsign",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "merge.conflictstyle",
    "diff.noprefix",
    "diff.renames",
    "safe.directory",
    "protocol.version",
    "fetch.prune",
    "rebase.autostash",
    "rebase.autosquash",
    "status.showuntrackedfiles",
    "status.short",
    "status.branch",
];

fn safe_git_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SAFE_GIT_KEYS.iter().any(|k| {
        if k.ends_with('.') {
            key.starts_with(k)
        } else {
            key == *k
        }
    })
}

/// Git subcommands with options that run commands.
const GIT_EXEC_SUBCOMMANDS: &[&str] = &[
    "clone",
    "fetch",
    "pull",
    "push",
    "ls-remote",
    "archive",
    "rebase",
    "submodule",
    "bisect",
    "difftool",
    "mergetool",
    "config",
    "remote",
    "grep",
    "send-pack",
    "fetch-pack",
    "send-email",
    "daemon",
    "remote-ext",
    "remote-fd",
];

/// Long options of git subcommands that name a command to run (any subcommand; git accepts
/// unambiguous abbreviations, so a prefix of three letters or more counts too).
const GIT_COMMAND_OPTIONS: &[&str] = &[
    "upload-pack",
    "receive-pack",
    "exec",
    "open-files-in-pager",
    "sendmail-cmd",
    "to-cmd",
    "cc-cmd",
    "header-cmd",
    "smtp-server",
    "access-hook",
    "extcmd",
];

/// Short options of git subcommands that name a command to run (also bundled, `-x'cmd'`).
fn git_short_command_options(sub: &str) -> &'static str {
    match sub {
        "clone" | "ls-remote" => "u",
        "grep" => "O",
        "rebase" => "xi",
        "difftool" | "mergetool" => "xt",
        _ => "",
    }
}

/// Why the words after git subcommand `sub` run a command, if they may: an option that names
/// one (`--upload-pack`, `--receive-pack`, `--exec`, `git grep -O`, `git rebase -x`, …, also
/// abbreviated or bundled), an `ext::`/`fd::` transport, a config key set with `clone -c`
/// that can name a command, or a computed word where such an option could be.
fn git_command_options(sub: &str, rest: &[Word]) -> Option<String> {
    let short = git_short_command_options(sub);
    let mut config_value = false;
    for word in rest {
        let Some(t) = word.text() else {
            if GIT_EXEC_SUBCOMMANDS.contains(&sub) || !short.is_empty() {
                return Some(format!(
                    "`git {sub}` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                ));
            }
            continue;
        };
        if config_value {
            config_value = false;
            let key = t.split_once('=').map_or(t.as_str(), |(k, _)| k);
            if !safe_git_key(key) {
                return Some(format!(
                    "`git {sub} -c {key}=…` sets a key that can name a command to run"
                ));
            }
            continue;
        }
        if t.starts_with("ext::") || t.starts_with("fd::") {
            return Some(format!("`git {sub} {t}` runs a command as its transport"));
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = long
                .split_once('=')
                .map_or((long, None), |(k, v)| (k, Some(v)));
            let names_command = GIT_COMMAND_OPTIONS
                .iter()
                .any(|o| *o == key || (key.len() >= 3 && o.starts_with(key)));
            if names_command {
                return Some(format!(
                    "`git {sub} {t}` runs a command given on the command line"
                ));
            }
            if sub == "clone" && key.len() >= 3 && "config".starts_with(key) {
                match value {
                    Some(kv) => {
                        let k = kv.split_once('=').map_or(kv, |(k, _)| k);
                        if !safe_git_key(k) {
                            return Some(format!(
                                "`git clone --config {k}=…` sets a key that can name a command to run"
                            ));
                        }
                    }
                    None => config_value = true,
                }
            }
            continue;
        }
        if let Some(cluster) = t.strip_prefix('-').filter(|c| !c.is_empty()) {
            if cluster.contains(|c| short.contains(c)) {
                return Some(format!(
                    "`git {sub} {t}` runs a command given on the command line"
                ));
            }
            if sub == "clone" && cluster.contains('c') {
                let attached = cluster.split_once('c').map_or("", |(_, v)| v);
                if attached.is_empty() {
                    config_value = true;
                } else {
                    let k = attached.split_once('=').map_or(attached, |(k, _)| k);
                    if !safe_git_key(k) {
                        return Some(format!(
                            "`git clone -c {k}=…` sets a key that can name a command to run"
                        ));
                    }
                }
            }
        }
    }
    None
}

fn git(argv: &[Word]) -> Result<Runs, String> {
    let mut i = 1;
    while i < argv.len() {
        let t = text("git", argv, i)?;
        match t.as_str() {
            "-c" => {
                let kv = text("git", argv, i + 1)?;
                let key = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
                if !safe_git_key(key) {
                    return Ok(unprovable(format!(
                        "`git -c {key}=…` sets a key that can name a command to run"
                    )));
                }
                i += 2;
            }
            "-C" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix"
            | "--list-cmds" | "--attr-source" => i += 2,
            "--exec-path" | "--html-path" | "--man-path" | "--info-path" | "--version"
            | "--help" | "-v" | "-h" => return Ok(Nothing),
            "-p"
            | "-P"
            | "--paginate"
            | "--no-pager"
            | "--bare"
            | "--no-replace-objects"
            | "--literal-pathspecs"
            | "--glob-pathspecs"
            | "--noglob-pathspecs"
            | "--icase-pathspecs"
            | "--no-optional-locks"
            | "--no-advice"
            | "--no-lazy-fetch" => {
                i += 1;
            }
            _ if t.starts_with("--config-env") || t.starts_with("--exec-path=") => {
                return Ok(unprovable(format!(
                    "`git {t}` makes git run a command the line does not show"
                )));
            }
            _ if [
                "--git-dir=",
                "--work-tree=",
                "--namespace=",
                "--super-prefix=",
                "--list-cmds=",
                "--attr-source=",
            ]
            .iter()
            .any(|p| t.starts_with(p)) =>
            {
                i += 1;
            }
            _ if t.starts_with('-') => {
                return Ok(unprovable(format!(
                    "`git {t}` is not on the list of git options followed"
                )));
            }
            _ => break,
        }
    }
    let Some(sub) = argv.get(i).and_then(Word::text) else {
        return Ok(Nothing);
    };
    let rest = &argv[i + 1..];
    if let Some(why) = git_command_options(&sub, rest) {
        return Ok(Unprovable(why));
    }
    let texts: Vec<String> = rest.iter().filter_map(Word::text).collect();
    let has = |opts: &[&str]| texts.iter().any(|t| opts.contains(&t.as_str()));
    let why = match sub.as_str() {
        "config" => git_config(&texts),
        "rebase"
            if has(&["-x", "--exec", "-i", "--interactive"])
                || texts.iter().any(|t| t.starts_with("--exec=")) =>
        {
            Some("`git rebase -x`/`-i` runs commands or an editor".to_owned())
        }
        "bisect" if texts.first().is_some_and(|t| t == "run") => {
            Some("`git bisect run` runs a command".to_owned())
        }
        "submodule" if has(&["foreach"]) => {
            Some("`git submodule foreach` runs a command".to_owned())
        }
        "difftool" | "mergetool"
            if has(&["-x", "--extcmd", "-t", "--tool"])
                || texts
                    .iter()
                    .any(|t| t.starts_with("--extcmd=") || t.starts_with("--tool=")) =>
        {
            Some(format!("`git {sub}` with a tool runs a command"))
        }
        "filter-branch" | "filter-repo" => Some(format!("`git {sub}` runs filter commands")),
        "remote-ext" | "remote-fd" => Some(format!("`git {sub}` runs a command as a transport")),
        _ => None,
    };
    Ok(why.map_or(Nothing, Unprovable))
}

fn git_config(args: &[String]) -> Option<String> {
    const WITH_VALUE: &[&str] = &[
        "--file",
        "-f",
        "--blob",
        "--type",
        "--default",
        "--comment",
        "--value",
        "--url",
    ];
    let mut positional = Vec::new();
    let mut reads = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "-e" || a == "--edit" {
            return Some("`git config --edit` runs an editor".into());
        }
        if WITH_VALUE.contains(&a) {
            i += 2;
            continue;
        }
        if a.starts_with("--get")
            || a.starts_with("--unset")
            || matches!(a, "-l" | "--list" | "--remove-section" | "--rename-section")
        {
            reads = true;
        }
        if !a.starts_with('-') {
            positional.push(a);
        }
        i += 1;
    }
    let key = match positional.first().copied() {
        Some("set") => positional.get(1).copied(),
        Some("edit") => return Some("`git config edit` runs an editor".into()),
        Some(
            "get" | "list" | "unset" | "rename-section" | "remove-section" | "get-color"
            | "get-colorbool",
        ) => None,
        Some(key) if !reads && positional.len() >= 2 => Some(key),
        _ => None,
    }?;
    (!safe_git_key(key))
        .then(|| format!("`git config {key} …` sets a key that can name a command to run"))
}

fn tar(argv: &[Word]) -> Result<Runs, String> {
    const DANGEROUS: &[&str] = &[
        "to-command",
        "checkpoint-action",
        "use-compress-program",
        "rsh-command",
        "info-script",
        "new-volume-script",
        "rmt-command",
    ];
    for (i, word) in argv.iter().enumerate().skip(1) {
        let Some(t) = word.text() else {
            if word.may_be_option {
                return Ok(unprovable(format!(
                    "`tar` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                )));
            }
            continue;
        };
        if let Some(long) = t.strip_prefix("--") {
            let key = long.split_once('=').map_or(long, |(k, _)| k);
            if !key.is_empty() && DANGEROUS.iter().any(|d| d.starts_with(key)) {
                return Ok(unprovable(format!("`tar {t}` runs a command")));
            }
        } else if (t.starts_with('-') || i == 1) && t.contains(['I', 'F']) {
            return Ok(unprovable(format!(
                "`tar {t}` may name a program to run (`-I`/`-F`)"
            )));
        }
    }
    Ok(Nothing)
}

/// Programs with a few options that run commands: unprovable when one of them (or a computed
/// word that could become one) appears anywhere.
fn scan_options(
    name: &str,
    argv: &[Word],
    exact: &[&str],
    prefixes: &[&str],
    long: &[&str],
    cluster: &str,
) -> Result<Runs, String> {
    for word in &argv[1..] {
        let Some(t) = word.text() else {
            if word.may_be_option {
                return Ok(unprovable(format!(
                    "`{name}` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                )));
            }
            continue;
        };
        let found = exact.contains(&t.as_str())
            || prefixes.iter().any(|p| t.starts_with(p))
            || t.strip_prefix("--").is_some_and(|l| {
                let key = l.split_once('=').map_or(l, |(k, _)| k);
                !key.is_empty() && long.iter().any(|d| d.starts_with(key))
            })
            || (t.starts_with('-')
                && !t.starts_with("--")
                && t[1..].contains(|c| cluster.contains(c)));
        if found {
            return Ok(unprovable(format!("`{name} {t}` runs a command")));
        }
    }
    Ok(Nothing)
}

fn ssh(name: &str, argv: &[Word]) -> Result<Runs, String> {
    const DANGEROUS: &[&str] = &[
        "proxycommand",
        "localcommand",
        "permitlocalcommand",
        "knownhostscommand",
        "match",
        "include",
        "securitykeyprovider",
        "pkcs11provider",
    ];
    let mut i = 1;
    while i < argv.len() {
        let Some(t) = argv[i].text() else {
            if argv[i].may_be_option {
                return Ok(unprovable(format!(
                    "`{name}` with the computed word `{}`, which could be an option that runs a command",
                    argv[i].src
                )));
            }
            i += 1;
            continue;
        };
        // Every word that looks like an option is read as one (ssh also reads options after
        // the host), by its getopt string: the options that take a value end the cluster.
        if t.len() > 1 && t.starts_with('-') && !t.starts_with("--") {
            let values = match name {
                "scp" => "cDFiJloPSX",
                "sftp" => "BbcDFiJloPRsSX",
                _ => "BbcDEeFIiJLlmOopQRSWw",
            };
            let chars: Vec<char> = t[1..].chars().collect();
            for (j, &c) in chars.iter().enumerate() {
                if !values.contains(c) {
                    continue;
                }
                let attached: String = chars[j + 1..].iter().collect();
                let value = if attached.is_empty() {
                    text(name, argv, i + 1)?
                } else {
                    attached
                };
                let refused = match c {
                    'o' => {
                        let lower = value.to_ascii_lowercase();
                        DANGEROUS
                            .iter()
                            .any(|d| lower.contains(d))
                            .then(|| format!("`{name} -o {value}` runs a local command or loads code"))
                    }
                    'F' => is_stdin_name(&value).then(|| {
                        format!("`{name} -F` reads its configuration (which can name commands) from standard input")
                    }),
                    'S' if name != "ssh" => Some(format!("`{name} -S` runs another program as ssh")),
                    'b' | 'D' if name == "sftp" => Some(
                        "`sftp -b`/`-D` reads commands (which can run local ones) or runs a program"
                            .to_owned(),
                    ),
                    'I' if name == "ssh" => Some("`ssh -I` loads a PKCS#11 library".to_owned()),
                    _ => None,
                };
                if let Some(why) = refused {
                    return Ok(Unprovable(why));
                }
                break;
            }
        }
        i += 1;
    }
    Ok(Nothing)
}

fn make(argv: &[Word]) -> Result<Runs, String> {
    for (i, word) in argv.iter().enumerate().skip(1) {
        let Some(t) = word.text() else {
            let prefix = word.literal_prefix();
            let known = ["-j", "-l", "--jobs=", "--load-average="]
                .iter()
                .any(|p| prefix.starts_with(p));
            if word.may_be_option || (prefix.starts_with('-') && !known) {
                return Ok(unprovable(format!(
                    "`make` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                )));
            }
            continue;
        };
        if t.contains('$') {
            return Ok(unprovable(format!(
                "`make {t}`: a `$` in make's arguments can run `$(shell …)`"
            )));
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = long
                .split_once('=')
                .map_or((long, None), |(k, v)| (k, Some(v)));
            if !key.is_empty() && "eval".starts_with(key) {
                return Ok(unprovable(
                    "`make --eval` runs make code from the command line",
                ));
            }
            let file = value
                .map(str::to_owned)
                .or_else(|| argv.get(i + 1).and_then(Word::text));
            if ("file".starts_with(key) || "makefile".starts_with(key))
                && !key.is_empty()
                && file.is_some_and(|f| is_stdin_name(&f))
            {
                return Ok(unprovable("`make` reads its makefile from standard input"));
            }
        } else if let Some(cluster) = t.strip_prefix('-') {
            if cluster.contains('E') {
                return Ok(unprovable("`make -E` runs make code from the command line"));
            }
            if let Some(pos) = t.find('f') {
                let file = if pos + 1 < t.len() {
                    Some(t[pos + 1..].to_owned())
                } else {
                    argv.get(i + 1).and_then(Word::text)
                };
                if file.is_some_and(|f| is_stdin_name(&f)) {
                    return Ok(unprovable("`make` reads its makefile from standard input"));
                }
            }
        }
    }
    Ok(Nothing)
}

/// Whether `word` occurs in `text` as a whole word (ASCII case-insensitive).
fn has_word(text: &str, word: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    lower
        .match_indices(word)
        .any(|(i, _)| !lower[..i].ends_with(ident) && !lower[i + word.len()..].starts_with(ident))
}

/// Dot-commands of the sqlite3 shell that only show or format: anything else (`.shell`,
/// `.system`, `.output |…`, `.once`, `.import`, `.read`, `.load`, `.open`, `.cd`, …) can run
/// commands, load code or reach other files.
const SQLITE_SAFE_DOT: &[&str] = &[
    "tables",
    "table",
    "schema",
    "fullschema",
    "indexes",
    "indices",
    "headers",
    "header",
    "mode",
    "databases",
    "show",
    "width",
    "nullvalue",
    "separator",
    "timer",
    "changes",
    "bail",
    "echo",
    "eqp",
    "explain",
    "help",
    "print",
    "stats",
    "version",
    "dump",
    "dbinfo",
    "quit",
    "exit",
];

/// Why sqlite3 command text may run a command, if it may: a dot-command not known to be safe,
/// or SQL calling `load_extension` or the shell's `edit()` (which runs an editor it names).
fn sqlite_code(text: &str) -> Option<String> {
    for line in text.lines() {
        if let Some(dot) = line.trim_start().strip_prefix('.') {
            let name: String = dot.chars().take_while(|c| !c.is_whitespace()).collect();
            if !SQLITE_SAFE_DOT.contains(&name.as_str()) {
                return Some(format!(
                    "`sqlite3` with the dot-command `.{name}`, which can run commands or load code"
                ));
            }
        }
    }
    (has_word(text, "load_extension") || has_word(text, "edit")).then(|| {
        "`sqlite3` SQL calling `load_extension` or `edit`, which load code or run a command".into()
    })
}

/// sqlite3: options (one or two dashes, anywhere), the database, then SQL or dot-commands, each
/// argument run in turn (`sqlite3 db '.shell rm v'`). Without any, commands are read from
/// standard input.
fn sqlite3(argv: &[Word]) -> Result<Runs, String> {
    const VALUE: &[&str] = &[
        "separator",
        "newline",
        "nullvalue",
        "mmap",
        "vfs",
        "maxsize",
        "nonce",
        "heap",
        "threadsafe",
        "sorterref",
        "multiplex",
        "escape",
    ];
    const TWO_VALUES: &[&str] = &["lookaside", "pagecache"];
    const FLAGS: &[&str] = &[
        "append",
        "ascii",
        "bail",
        "batch",
        "box",
        "column",
        "csv",
        "deserialize",
        "echo",
        "header",
        "noheader",
        "html",
        "interactive",
        "json",
        "line",
        "list",
        "markdown",
        "memtrace",
        "nofollow",
        "quote",
        "readonly",
        "safe",
        "stats",
        "table",
        "tabs",
        "zip",
        "no-rowid-in-view",
        "utf8",
        "unsafe-testing",
    ];
    let mut database = false;
    let mut commands = 0;
    let mut i = 1;
    while i < argv.len() {
        let t = text("sqlite3", argv, i)?;
        let Some(opt) = t.strip_prefix('-').filter(|o| !o.is_empty()) else {
            if database {
                if let Some(why) = sqlite_code(&t) {
                    return Ok(Unprovable(why));
                }
                commands += 1;
            }
            database = true;
            i += 1;
            continue;
        };
        let opt = opt.strip_prefix('-').unwrap_or(opt);
        match opt {
            "version" | "help" => return Ok(Nothing),
            "A" => return Ok(Nothing),
            "cmd" => {
                i += 1;
                if let Some(why) = sqlite_code(&text("sqlite3", argv, i)?) {
                    return Ok(Unprovable(why));
                }
            }
            "init" => {
                i += 1;
                let file = text("sqlite3", argv, i)?;
                if is_stdin_name(&file) {
                    return Ok(unprovable(
                        "`sqlite3 -init` reads commands from standard input",
                    ));
                }
            }
            _ if VALUE.contains(&opt) => {
                i += 1;
                text("sqlite3", argv, i)?;
            }
            _ if TWO_VALUES.contains(&opt) => {
                i += 2;
                text("sqlite3", argv, i)?;
            }
            _ if FLAGS.contains(&opt) => {}
            _ => {
                return Ok(unprovable(format!(
                    "`sqlite3 {t}` is not on the list of sqlite3 options followed"
                )));
            }
        }
        i += 1;
    }
    Ok(if commands == 0 {
        unprovable("`sqlite3` reads commands from standard input")
    } else {
        Nothing
    })
}

/// Why psql command text may run a command: any backslash command (`\!`, `\o |…`, `\g |…`,
/// `\copy … program`, backquotes in arguments, …), or SQL naming `PROGRAM` (`COPY … TO
/// PROGRAM`).
fn psql_code(text: &str) -> Option<String> {
    if text.contains('\\') || text.contains('`') {
        return Some("`psql` with a backslash command, which can run shell commands".into());
    }
    has_word(text, "program")
        .then(|| "`psql` with `COPY … PROGRAM`, which runs a command on the server".into())
}

/// psql: getopt_long (options anywhere, long options abbreviated). `-c` text is checked,
/// `-f` from standard input, `-o`/`-L` to a pipe and variables with backquotes are unprovable,
/// and without `-c`/`-f`/`-l` commands are read from standard input.
fn psql(argv: &[Word]) -> Result<Runs, String> {
    const LONG: &[(&str, char)] = &[
        ("command", 'c'),
        ("dbname", 'd'),
        ("file", 'f'),
        ("list", 'l'),
        ("set", 'v'),
        ("variable", 'v'),
        ("version", 'V'),
        ("no-psqlrc", 'X'),
        ("single-transaction", '1'),
        ("help", '?'),
        ("echo-all", 'a'),
        ("echo-errors", 'b'),
        ("echo-queries", 'e'),
        ("echo-hidden", 'E'),
        ("log-file", 'L'),
        ("no-readline", 'n'),
        ("output", 'o'),
        ("quiet", 'q'),
        ("single-step", 's'),
        ("single-line", 'S'),
        ("no-align", 'A'),
        ("csv", 'A'),
        ("field-separator", 'F'),
        ("html", 'H'),
        ("pset", 'P'),
        ("record-separator", 'R'),
        ("tuples-only", 't'),
        ("table-attr", 'T'),
        ("expanded", 'x'),
        ("field-separator-zero", 'z'),
        ("record-separator-zero", '0'),
        ("host", 'h'),
        ("port", 'p'),
        ("username", 'U'),
        ("no-password", 'w'),
        ("password", 'W'),
    ];
    const VALUES: &str = "cdfFhLoPpRTUv";
    const FLAGS: &str = "aAbeEHlnqsStVwWxXz01?";
    let mut reads_stdin = true;
    let mut check = |opt: char, value: Option<&str>| -> Option<Runs> {
        match (opt, value) {
            ('V' | '?', _) => Some(Nothing),
            ('l', _) => {
                reads_stdin = false;
                None
            }
            ('c', Some(v)) => {
                reads_stdin = false;
                psql_code(v).map(Unprovable)
            }
            ('f', Some(v)) => {
                reads_stdin = false;
                is_stdin_name(v).then(|| unprovable("`psql -f` reads commands from standard input"))
            }
            ('o' | 'L', Some(v)) if v.trim_start().starts_with('|') => {
                Some(unprovable("`psql` sends its output into a command"))
            }
            ('v' | 'P', Some(v)) if v.contains('`') => Some(unprovable(
                "`psql` with a backquote in a variable, which runs a command",
            )),
            _ => None,
        }
    };
    let mut i = 1;
    while i < argv.len() {
        let t = text("psql", argv, i)?;
        if t == "--" {
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (long, None),
            };
            let mut matches: Vec<char> = LONG
                .iter()
                .filter(|(name, _)| name.starts_with(key) && !key.is_empty())
                .map(|&(_, c)| c)
                .collect();
            matches.sort_unstable();
            matches.dedup();
            let exact = LONG.iter().find(|(name, _)| *name == key).map(|&(_, c)| c);
            let opt = match (exact, matches.as_slice()) {
                (Some(c), _) | (None, &[c]) => c,
                _ => {
                    return Ok(unprovable(format!(
                        "`psql {t}` is not on the list of psql options followed"
                    )));
                }
            };
            let value = match value {
                Some(v) => Some(v),
                None if VALUES.contains(opt) && key != "help" => {
                    i += 1;
                    Some(text("psql", argv, i)?)
                }
                None => None,
            };
            if let Some(r) = check(opt, value.as_deref()) {
                return Ok(r);
            }
            i += 1;
            continue;
        }
        if t.len() > 1 && t.starts_with('-') {
            let chars: Vec<char> = t[1..].chars().collect();
            for (j, &c) in chars.iter().enumerate() {
                if VALUES.contains(c) {
                    let attached: String = chars[j + 1..].iter().collect();
                    let value = if attached.is_empty() {
                        i += 1;
                        text("psql", argv, i)?
                    } else {
                        attached
                    };
                    if let Some(r) = check(c, Some(&value)) {
                        return Ok(r);
                    }
                    break;
                }
                if !FLAGS.contains(c) {
                    return Ok(unprovable(format!(
                        "`psql -{c}` is not on the list of psql options followed"
                    )));
                }
                if let Some(r) = check(c, None) {
                    return Ok(r);
                }
            }
        }
        i += 1;
    }
    Ok(if reads_stdin {
        unprovable("`psql` reads commands from standard input")
    } else {
        Nothing
    })
}

/// Why mysql/mariadb command text may run a command: a backslash command (`\!`, `\P`, `\.`)
/// or a client command by name (`system`, `pager`, `edit`, `source`, `tee`).
fn mysql_code(text: &str) -> Option<String> {
    if text.contains('\\') {
        return Some("`mysql` with a backslash command, which can run shell commands".into());
    }
    ["system", "pager", "edit", "source", "tee"]
        .iter()
        .find(|w| has_word(text, w))
        .map(|w| {
            format!(
                "`mysql` with the client command `{w}`, which can run a command or read commands"
            )
        })
}

/// mysql/mariadb: `-e`/`--execute` text is checked; options that name a program, a pager, a
/// plugin or another option file are unprovable; without `-e` commands are read from
/// standard input.
fn mysql(name: &str, argv: &[Word]) -> Result<Runs, String> {
    const REFUSED: &[&str] = &[
        "pager",
        "tee",
        "defaults-file",
        "defaults-extra-file",
        "defaults-group-suffix",
        "plugin-dir",
        "default-auth",
        "init-command",
        "load-data-local-dir",
    ];
    const SHORT_VALUES: &str = "DhPSuO#";
    let mut executes = false;
    let mut i = 1;
    while i < argv.len() {
        let Some(t) = argv[i].text() else {
            if argv[i].may_be_option {
                return Ok(unprovable(format!(
                    "`{name}` with the computed word `{}`, which could be an option that runs a command",
                    argv[i].src
                )));
            }
            i += 1;
            continue;
        };
        if t == "--" {
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (key, value) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (long, None),
            };
            let key = key.replace('_', "-");
            let key = key.strip_prefix("loose-").map(str::to_owned).unwrap_or(key);
            if key.is_empty() {
                return Ok(unprovable(format!("`{name} {t}` is not followed")));
            }
            if matches!(key.as_str(), "help" | "version") {
                return Ok(Nothing);
            }
            if REFUSED.iter().any(|r| r.starts_with(key.as_str())) {
                return Ok(unprovable(format!(
                    "`{name} {t}` names a program, plugin or option file"
                )));
            }
            if "execute".starts_with(key.as_str()) && key.len() >= 2 {
                let code = match value {
                    Some(v) => v,
                    None => {
                        i += 1;
                        text(name, argv, i)?
                    }
                };
                if let Some(why) = mysql_code(&code) {
                    return Ok(Unprovable(why));
                }
                executes = true;
            }
            i += 1;
            continue;
        }
        if t.len() > 1 && t.starts_with('-') {
            let chars: Vec<char> = t[1..].chars().collect();
            for (j, &c) in chars.iter().enumerate() {
                let attached: String = chars[j + 1..].iter().collect();
                match c {
                    'e' => {
                        let code = if attached.is_empty() {
                            i += 1;
                            text(name, argv, i)?
                        } else {
                            attached
                        };
                        if let Some(why) = mysql_code(&code) {
                            return Ok(Unprovable(why));
                        }
                        executes = true;
                        break;
                    }
                    'p' => break,
                    '?' | 'I' | 'V' => return Ok(Nothing),
                    _ if SHORT_VALUES.contains(c) => {
                        if attached.is_empty() {
                            i += 1;
                        }
                        break;
                    }
                    _ => {}
                }
            }
        }
        i += 1;
    }
    Ok(if executes {
        Nothing
    } else {
        unprovable(format!("`{name}` reads commands from standard input"))
    })
}

/// npm, pnpm, yarn: `exec`/`x`/`dlx` run a package's program or a command line (`npm exec -c
/// 'rm v'`), and `--call`, `--script-shell`, `--node-options` and other config files name
/// commands: unprovable. The subcommand is the first word that is not an option or the value
/// of one.
fn package_manager(name: &str, argv: &[Word]) -> Result<Runs, String> {
    const RUNS: &[&str] = &["exec", "exe", "x", "dlx"];
    const REFUSED: &[&str] = &[
        "call",
        "script-shell",
        "node-options",
        "userconfig",
        "globalconfig",
        "shell",
    ];
    // Whether the previous word was an option that may take the next word as its value.
    let mut after_option = false;
    let mut subcommand_found = false;
    for word in &argv[1..] {
        let Some(t) = word.text() else {
            if !subcommand_found || word.may_be_option {
                return Ok(unprovable(format!(
                    "`{name}` with the computed word `{}`, which could run a command",
                    word.src
                )));
            }
            continue;
        };
        if t == "-c" {
            return Ok(unprovable(format!("`{name} -c` runs a command line")));
        }
        if let Some(long) = t.strip_prefix("--") {
            let key = long.split_once('=').map_or(long, |(k, _)| k);
            if !key.is_empty() && REFUSED.iter().any(|r| r.starts_with(key)) {
                return Ok(unprovable(format!("`{name} {t}` names a command to run")));
            }
        }
        if t.starts_with('-') {
            after_option = !t.contains('=');
            continue;
        }
        if !subcommand_found && RUNS.contains(&t.as_str()) {
            return Ok(unprovable(format!("`{name} {t}` runs a command")));
        }
        subcommand_found |= !after_option;
        after_option = false;
    }
    Ok(Nothing)
}

/// dpkg: `--pre-invoke`/`--post-invoke`/`--status-logger` run a command (dpkg matches long
/// options exactly); a computed word could be one of them.
fn dpkg(argv: &[Word]) -> Result<Runs, String> {
    for word in &argv[1..] {
        let Some(t) = word.text() else {
            if word.may_be_option {
                return Ok(unprovable(format!(
                    "`dpkg` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                )));
            }
            continue;
        };
        let key = t.split_once('=').map_or(t.as_str(), |(k, _)| k);
        if matches!(key, "--pre-invoke" | "--post-invoke" | "--status-logger") {
            return Ok(unprovable(format!("`dpkg {t}` runs a command")));
        }
    }
    Ok(Nothing)
}

/// go: `-toolexec`, `-exec` and `-vettool` name a program to run (flags take one or two
/// dashes, the value after `=` or in the next word); `go generate` runs the commands written in
/// source files, which is out of reach like a Makefile and stays provable.
fn go(argv: &[Word]) -> Result<Runs, String> {
    for word in &argv[1..] {
        let Some(t) = word.text() else {
            if word.may_be_option {
                return Ok(unprovable(format!(
                    "`go` with the computed word `{}`, which could be an option that runs a command",
                    word.src
                )));
            }
            continue;
        };
        let flag = t.trim_start_matches('-');
        let key = flag.split_once('=').map_or(flag, |(k, _)| k);
        if t.starts_with('-') && matches!(key, "toolexec" | "exec" | "vettool") {
            return Ok(unprovable(format!("`go {t}` names a program to run")));
        }
    }
    Ok(Nothing)
}
