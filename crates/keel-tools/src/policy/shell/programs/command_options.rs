//! Programs whose options carry a command line or name a program they launch, followed so
//! that rules see what runs:
//!
//! - `split --filter=COMMAND` runs COMMAND with `$SHELL -c`: parsed as sh, like `sh -c`;
//! - `sort --compress-program=PROG` runs `PROG` and `PROG -d`; `install --strip-program=PROG`,
//!   `diff3`/`sdiff --diff-program=PROG`, `rustc -C linker=PROG`, `wget --use-askpass=PROG`
//!   (also `-e use_askpass=PROG`) run PROG with arguments keel does not know; `gcc -wrapper
//!   PROG,ARG,…` runs that command before each compiler program;
//! - refused (unprovable): `gcc -B`/`-fplugin`/`-specs` (and those through `rustc -C
//!   link-arg`), which run programs or load code found in a directory or file, and `cpio
//!   --rsh-command`.
//!
//! The command or program is a command of the line ([`Runs::Launches`]): rules must allow it
//! as well as the program that launches it, deny and ask rules see it, and an interpreter
//! or shell reading its input (`sort --compress-program=sh`) is unprovable as it is anywhere.
//!
//! GNU programs read options after operands too and accept unambiguous abbreviations of long
//! options, so every word up to `--` is read, and a prefix counts (erring toward reading a word
//! as the option: a false match asks, a miss would let a command through).

use super::super::words::Word;
use super::{Runs, text};
use crate::policy::pattern::CmdTok;

/// Whether `key` (the text after `--`, up to `=`) may be `option` abbreviated to at least
/// `min` characters.
fn abbreviates(key: &str, option: &str, min: usize) -> bool {
    key.len() >= min && option.starts_with(key)
}

/// The values of long option `--OPTION` (`--OPTION=value` or `--OPTION value`, abbreviated to
/// at least `min` characters) in `argv[1..]` up to `--`, in order. A computed word that could
/// be the option or its value is an error: what runs could not be known.
fn long_values(name: &str, argv: &[Word], option: &str, min: usize) -> Result<Vec<String>, String> {
    let computed = |word: &Word| {
        format!(
            "`{name}` with the computed word `{}`, which could be `--{option}` naming a command to run",
            word.src
        )
    };
    let mut values = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let word = &argv[i];
        let Some(t) = word.text() else {
            if word.may_be_option {
                return Err(computed(word));
            }
            let prefix = word.literal_prefix();
            if let Some(long) = prefix.strip_prefix("--") {
                let could_be = match long.split_once('=') {
                    Some((key, _)) => abbreviates(key, option, min),
                    // The key itself is unfinished: `--fil$x` may become `--filter=…`.
                    None => option.starts_with(long) || long.starts_with(option),
                };
                if could_be {
                    return Err(computed(word));
                }
            }
            i += 1;
            continue;
        };
        if t == "--" {
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            match long.split_once('=') {
                Some((key, value)) if abbreviates(key, option, min) => {
                    values.push(value.to_owned());
                }
                None if abbreviates(long, option, min) => {
                    i += 1;
                    values.push(text(name, argv, i)?);
                }
                _ => {}
            }
        }
        i += 1;
    }
    Ok(values)
}

/// Program `program` run with arguments keel does not know, chosen by the program that
/// launches it from the line's own (checked) words: unknown, but not options the line could
/// slip in, so `rustc -C linker=cc` does not make `cc` unprovable.
fn with_unknown_arguments(program: &str) -> Vec<Word> {
    vec![Word::literal(program), chosen_arguments()]
}

fn chosen_arguments() -> Word {
    Word {
        toks: vec![CmdTok::Any],
        src: "…".to_owned(),
        expanded: true,
        ..Word::default()
    }
}

fn launches(scripts: Vec<String>, programs: Vec<Vec<Word>>) -> Runs {
    if scripts.is_empty() && programs.is_empty() {
        Runs::Nothing
    } else {
        Runs::Launches { scripts, programs }
    }
}

/// `split --filter=COMMAND`: every value (split uses the last, but a word keel reads as the
/// option may be another option's value, so all are followed).
pub(super) fn split(argv: &[Word]) -> Result<Runs, String> {
    Ok(launches(
        long_values("split", argv, "filter", 1)?,
        Vec::new(),
    ))
}

/// `sort --compress-program=PROG`: sort runs `PROG` to compress temporary files and
/// `PROG -d` to read them back.
pub(super) fn sort(argv: &[Word]) -> Result<Runs, String> {
    let programs = long_values("sort", argv, "compress-program", 2)?
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            [
                vec![Word::literal(&p)],
                vec![Word::literal(&p), Word::literal("-d")],
            ]
        })
        .collect();
    Ok(launches(Vec::new(), programs))
}

/// `install --strip-program=PROG` (`--strip` alone is a flag), `diff3`/`sdiff
/// --diff-program=PROG`: PROG runs with arguments of the program's choosing.
pub(super) fn program_option(name: &str, argv: &[Word]) -> Result<Runs, String> {
    let (option, min) = match name {
        "install" => ("strip-program", 6),
        _ => ("diff-program", 1),
    };
    let programs = long_values(name, argv, option, min)?
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| with_unknown_arguments(p))
        .collect();
    Ok(launches(Vec::new(), programs))
}

/// Whether `name` is a C compiler driver that reads gcc's options (`gcc`, `cc`, `g++`,
/// `clang`, versioned or with a target prefix: `gcc-12`, `x86_64-linux-gnu-gcc`).
pub(super) fn is_c_compiler(name: &str) -> bool {
    const DRIVERS: &[&str] = &["gcc", "g++", "cc", "c++", "clang", "clang++"];
    let unversioned = match name.rsplit_once('-') {
        Some((base, version))
            if !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.') =>
        {
            base
        }
        _ => name,
    };
    DRIVERS.iter().any(|d| {
        unversioned == *d
            || unversioned
                .strip_suffix(d)
                .is_some_and(|target| target.ends_with('-'))
    })
}

/// Errs when the computed `word` may be an option that names a command: it may become several
/// words or one starting with `-` (`may_be_option`), or its known start `could_be` one.
fn check_computed(name: &str, word: &Word, could_be: impl Fn(&str) -> bool) -> Result<(), String> {
    if word.may_be_option || could_be(&word.literal_prefix()) {
        return Err(format!(
            "`{name}` with the computed word `{}`, which could be an option that runs a command",
            word.src
        ));
    }
    Ok(())
}

/// gcc options that run programs or load code found in a directory or file the line names:
/// `-B` (compiler programs), `-fplugin`, `-specs` (spec files run commands), a linker by path.
const GCC_REFUSED: &[&str] = &[
    "-B",
    "-fplugin",
    "-specs",
    "--specs",
    "--ld-path",
    "-fuse-ld=/",
    "-fuse-ld=.",
];

/// Why gcc option word `t` runs code the line does not show, if it does.
fn gcc_refused(t: &str) -> Option<String> {
    GCC_REFUSED.iter().any(|o| t.starts_with(o)).then(|| {
        format!("`{t}` makes the compiler run programs or load code from files the line names")
    })
}

/// gcc and compatible drivers: `-wrapper PROG,ARG,…` runs that command around every compiler
/// program; `-B`, `-fplugin`, `-specs` are unprovable.
pub(super) fn c_compiler(name: &str, argv: &[Word]) -> Result<Runs, String> {
    let mut programs = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let word = &argv[i];
        let Some(t) = word.text() else {
            check_computed(name, word, |prefix| {
                let could_be = |o: &&str| o.starts_with(prefix) || prefix.starts_with(o);
                prefix.starts_with('-')
                    && ("-wrapper".starts_with(prefix) || GCC_REFUSED.iter().any(could_be))
            })?;
            i += 1;
            continue;
        };
        if t == "-wrapper" {
            i += 1;
            let value = text(name, argv, i)?;
            let mut command: Vec<Word> = value.split(',').map(Word::literal).collect();
            command.push(chosen_arguments());
            programs.push(command);
        } else if let Some(why) = gcc_refused(&t) {
            return Err(why);
        }
        i += 1;
    }
    Ok(launches(Vec::new(), programs))
}

/// `rustc -C linker=PROG` (also `-Clinker=`, `--codegen linker=`) runs PROG with the link
/// arguments; `-C link-arg`/`link-args` with a gcc option that runs code is unprovable.
pub(super) fn rustc(argv: &[Word]) -> Result<Runs, String> {
    let mut programs = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let word = &argv[i];
        let Some(t) = word.text() else {
            check_computed("rustc", word, |prefix| {
                prefix.starts_with("-C")
                    || (prefix.starts_with("--")
                        && ("--codegen".starts_with(prefix) || prefix.starts_with("--codegen")))
            })?;
            i += 1;
            continue;
        };
        let setting = if t == "-C" || t == "--codegen" {
            i += 1;
            Some(text("rustc", argv, i)?)
        } else if let Some(v) = t.strip_prefix("-C") {
            Some(v.to_owned())
        } else {
            t.strip_prefix("--codegen=").map(str::to_owned)
        };
        if let Some(setting) = setting {
            let (key, value) = setting.split_once('=').unwrap_or((&setting, ""));
            match key.replace('_', "-").as_str() {
                "linker" => programs.push(with_unknown_arguments(value)),
                "link-arg" | "link-args" | "pre-link-arg" | "pre-link-args" => {
                    if let Some(why) = value.split_whitespace().find_map(gcc_refused) {
                        return Err(format!("`rustc -C {setting}`: {why}"));
                    }
                    if value.split_whitespace().any(|a| a == "-wrapper") {
                        return Err(format!(
                            "`rustc -C {setting}` makes the linker run a command"
                        ));
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    Ok(launches(Vec::new(), programs))
}

/// `wget --use-askpass=PROG`, or `-e`/`--execute` with the wgetrc command `use_askpass`: wget
/// runs PROG to ask for credentials.
pub(super) fn wget(argv: &[Word]) -> Result<Runs, String> {
    let mut programs: Vec<Vec<Word>> = long_values("wget", argv, "use-askpass", 1)?
        .iter()
        .map(|p| with_unknown_arguments(p))
        .collect();
    let mut commands = long_values("wget", argv, "execute", 1)?;
    let mut i = 1;
    while i < argv.len() {
        let Some(t) = argv[i].text() else {
            i += 1;
            continue;
        };
        if t == "--" {
            break;
        }
        if let Some(cluster) = t.strip_prefix('-').filter(|c| !c.starts_with('-'))
            && let Some((_, attached)) = cluster.split_once('e')
        {
            if attached.is_empty() {
                i += 1;
                commands.push(text("wget", argv, i)?);
            } else {
                commands.push(attached.to_owned());
            }
        }
        i += 1;
    }
    for command in commands {
        let (key, value) = command.split_once('=').unwrap_or((&command, ""));
        let key: String = key
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        if key.trim() == "useaskpass" {
            programs.push(with_unknown_arguments(value.trim()));
        }
    }
    Ok(launches(Vec::new(), programs))
}

#[cfg(test)]
mod tests {
    use super::is_c_compiler;
    use crate::policy::shell::tests::{texts, unprovable};
    use crate::policy::shell::{Role, analyze};

    #[test]
    fn split_filter_is_parsed_as_a_command_line_in_every_spelling() {
        for line in [
            "split --filter='gzip; rm v' f",
            "split --filter 'gzip; rm v' f",
            "split --fil='gzip; rm v' f",
            "split f --filter='gzip; rm v'",
            "split -b 1M --additional-suffix --filter='gzip; rm v' f",
        ] {
            let t = texts(line);
            assert!(t.contains(&"gzip".to_owned()), "{line}: {t:?}");
            assert!(t.contains(&"rm v".to_owned()), "{line}: {t:?}");
        }
        assert_eq!(texts("split -l 10 f part-"), ["split -l 10 f part-"]);
        assert_eq!(texts("split -- --filter=x"), ["split -- --filter=x"]);
        assert!(unprovable("split --filter=\"$c\" f").contains("--filter"));
        assert!(unprovable("split $opts f").contains("$opts"));
        assert!(unprovable("split --fil$x f").contains("--filter"));
        let a = analyze("split --filter='gzip > $FILE.gz' f");
        assert!(a.unprovable().is_none() && a.not_literal().is_some());
    }

    #[test]
    fn launched_programs_are_commands_that_need_allowing() {
        assert_eq!(
            texts("sort -S 1M --compress-program=gzip f"),
            ["sort -S 1M --compress-program=gzip f", "gzip", "gzip -d"]
        );
        assert_eq!(texts("sort --co zstd f")[1..], ["zstd", "zstd -d"]);
        assert_eq!(texts("sort -k2 -o out f"), ["sort -k2 -o out f"]);
        assert!(unprovable("sort --compress-program=sh f").contains("standard input"));
        for (line, launched) in [
            ("install -s --strip-program=rm f v", "rm …"),
            ("diff3 --diff-program=./e a b c", "./e …"),
            ("sdiff --diff-prog ./e a b", "./e …"),
            ("rustc -C linker=./l x.rs", "./l …"),
            ("rustc -Clinker=cc x.rs", "cc …"),
            ("rustc --codegen linker=cc x.rs", "cc …"),
            ("wget --use-askpass=./e u", "./e …"),
            ("wget -qe use_askpass=./e u", "./e …"),
        ] {
            assert_eq!(texts(line)[1..], [launched], "{line}");
        }
        for line in [
            "install --strip -m 644 f d",
            "rustc -C opt-level=3 x.rs",
            "wget -e robots=off u",
        ] {
            assert_eq!(texts(line), [line]);
        }
        let t = texts("gcc -wrapper sh,-c,'rm v' x.c");
        assert_eq!(t[1..], ["sh -c rm v …", "rm v"]);
        let a = analyze("sort --compress-program=gzip f");
        assert!(a.commands().iter().all(|c| c.role() == Role::Program));
    }

    #[test]
    fn options_that_run_code_from_files_are_unprovable() {
        for line in [
            "gcc -B. x.c",
            "cc -fplugin=./p.so x.c",
            "g++ -specs=s x.cc",
            "x86_64-linux-gnu-gcc-12 -B d x.c",
            "clang --ld-path=./ld x.c",
            "gcc $CFLAGS x.c",
            "rustc -C link-arg=-B. x.rs",
            "rustc -C 'link-args=-Wl,-x -wrapper sh,-c,x' x.rs",
            "rustc $RUSTFLAGS x.rs",
            "cpio -o -F x:y --rsh-command=./e",
        ] {
            unprovable(line);
        }
        assert_eq!(
            texts("gcc -O2 -Wall -c x.c -o x.o"),
            ["gcc -O2 -Wall -c x.c -o x.o"]
        );
    }

    #[test]
    fn c_compilers_are_known_by_their_driver_names() {
        for name in [
            "gcc",
            "cc",
            "g++",
            "c++",
            "clang",
            "clang++",
            "gcc-12",
            "clang-17",
            "x86_64-linux-gnu-gcc",
            "aarch64-linux-gnu-g++-13",
        ] {
            assert!(is_c_compiler(name), "{name}");
        }
        for name in ["gccgo", "rcc", "tcc-x", "ccache", "gcc-ar", "clang-format"] {
            assert!(!is_c_compiler(name), "{name}");
        }
    }
}
