//! Wrappers and shells: `trap` and builtins taking variable names, `env`, `flock`, `watch`,
//! `xargs`, shells' `-c` scripts, `sudo`/`su`, `strace` and `find -exec`.

use super::*;

pub(super) fn trap(argv: &[Word]) -> Runs {
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
pub(super) fn variable_names(name: &str, argv: &[Word]) -> Runs {
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

pub(super) fn env(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn flock(argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn watch(argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn xargs(argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn shell(name: &str, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn sudo(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn su(name: &str, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn strace(w: &mut Walker<'_, '_>, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn find(argv: &[Word]) -> Result<Runs, String> {
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
