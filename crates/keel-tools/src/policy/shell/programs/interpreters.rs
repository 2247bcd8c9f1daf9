//! Interpreters (python, ruby, node, php, lua, Rscript, perl) and the text-processing
//! languages that can run commands (awk, sed): code given on the command line is unprovable.

use super::*;

/// How an interpreter's command line is read.
pub(super) struct Interp {
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

pub(super) const PYTHON: Interp = Interp {
    flags: "bBdEhiIOPqsSuvVx?R",
    long_values: &["check-hash-based-pycs"],
    code: "c",
    code_long: &[],
    values: "WXQ",
    attached: "",
    module: "m",
    info: &["-V", "--version", "-h", "--help", "-?"],
};
pub(super) const RUBY: Interp = Interp {
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
pub(super) const NODE: Interp = Interp {
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
pub(super) const PHP: Interp = Interp {
    flags: "aChHiqmsvw",
    long_values: &[],
    code: "raBRFE",
    code_long: &[],
    values: "fcdzt",
    attached: "",
    module: "",
    info: &["-v", "-h", "-i", "-m", "--version", "--help"],
};
pub(super) const LUA: Interp = Interp {
    flags: "vEW",
    long_values: &[],
    code: "ei",
    code_long: &[],
    values: "l",
    attached: "",
    module: "",
    info: &["-v"],
};
pub(super) const RSCRIPT: Interp = Interp {
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
pub(super) fn perl(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn unversioned(name: &str) -> &str {
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
pub(super) fn is_stdin_name(path: &str) -> bool {
    path == "-"
        || path == "/dev/stdin"
        || path.starts_with("/dev/fd/")
        || (path.starts_with("/proc/") && path.contains("/fd/"))
}

pub(super) fn interpreter(argv: &[Word], name: &str, spec: &Interp) -> Result<Runs, String> {
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

pub(super) fn awk(name: &str, argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn sed(argv: &[Word]) -> Result<Runs, String> {
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
pub(super) fn sed_may_execute(script: &str) -> bool {
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
