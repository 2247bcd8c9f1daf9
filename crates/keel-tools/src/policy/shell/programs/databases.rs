//! Database shells (sqlite3, psql, mysql/mariadb): their dot- and backslash-commands that run
//! programs or read files.

use super::*;

/// Whether `word` occurs in `text` as a whole word (ASCII case-insensitive).
pub(super) fn has_word(text: &str, word: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    lower
        .match_indices(word)
        .any(|(i, _)| !lower[..i].ends_with(ident) && !lower[i + word.len()..].starts_with(ident))
}

/// Dot-commands of the sqlite3 shell that only show or format: anything else (`.shell`,
/// `.system`, `.output |…`, `.once`, `.import`, `.read`, `.load`, `.open`, `.cd`, …) can run
/// commands, load code or reach other files.
pub(super) const SQLITE_SAFE_DOT: &[&str] = &[
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
pub(super) fn sqlite_code(text: &str) -> Option<String> {
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
pub(super) fn sqlite3(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn psql_code(text: &str) -> Option<String> {
    if text.contains('\\') || text.contains('`') {
        return Some("`psql` with a backslash command, which can run shell commands".into());
    }
    has_word(text, "program")
        .then(|| "`psql` with `COPY … PROGRAM`, which runs a command on the server".into())
}

/// psql: getopt_long (options anywhere, long options abbreviated). `-c` text is checked,
/// `-f` from standard input, `-o`/`-L` to a pipe and variables with backquotes are unprovable,
/// and without `-c`/`-f`/`-l` commands are read from standard input.
pub(super) fn psql(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn mysql_code(text: &str) -> Option<String> {
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
pub(super) fn mysql(name: &str, argv: &[Word]) -> Result<Runs, String> {
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
