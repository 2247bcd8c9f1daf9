//! Programs whose options or files name commands they launch: tar, ssh, make, package
//! managers (npm, pnpm, yarn), dpkg and go.

use super::*;

pub(super) fn tar(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn scan_options(
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

pub(super) fn ssh(name: &str, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn make(argv: &[Word]) -> Result<Runs, String> {
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

/// npm, pnpm, yarn: `exec`/`x`/`dlx` run a package's program or a command line (`npm exec -c
/// 'rm v'`), and `--call`, `--script-shell`, `--node-options` and other config files name
/// commands: unprovable. The subcommand is the first word that is not an option or the value
/// of one.
pub(super) fn package_manager(name: &str, argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn dpkg(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn go(argv: &[Word]) -> Result<Runs, String> {
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
