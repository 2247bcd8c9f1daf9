//! git: subcommands, `-c`/`config` keys and options that name commands to run.

use super::*;

/// Sections and keys `git -c` / `git config` may set without making the line unprovable: they
/// hold data, never a command.
pub(super) const SAFE_GIT_KEYS: &[&str] = &[
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

pub(super) fn safe_git_key(key: &str) -> bool {
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
pub(super) const GIT_EXEC_SUBCOMMANDS: &[&str] = &[
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
pub(super) const GIT_COMMAND_OPTIONS: &[&str] = &[
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
pub(super) fn git_short_command_options(sub: &str) -> &'static str {
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
pub(super) fn git_command_options(sub: &str, rest: &[Word]) -> Option<String> {
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

pub(super) fn git(argv: &[Word]) -> Result<Runs, String> {
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

pub(super) fn git_config(args: &[String]) -> Option<String> {
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
