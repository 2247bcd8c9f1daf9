//! Programs that run other programs or code: wrappers (unwrapped when their options are known
//! exactly), shells (`-c` scripts parsed again), interpreters, builtins that evaluate text,
//! and programs with options that run commands. The lists here are the ones the module docs of
//! [`super`] and the README describe.

mod command_options;
mod databases;
mod git;
mod interpreters;
mod launchers;
mod lists;
mod specs;
mod wrappers;

use super::words::Word;
use super::{MAX_DEPTH, Redirect, Role, Walker, analyze_into};
use databases::*;
use git::*;
use interpreters::*;
use launchers::*;
use lists::*;
use specs::*;
use wrappers::*;

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

fn is_python(name: &str) -> bool {
    let rest = name
        .strip_prefix("python")
        .or_else(|| name.strip_prefix("pypy"));
    rest.is_some_and(|r| r.chars().all(|c| c.is_ascii_digit() || c == '.'))
}
