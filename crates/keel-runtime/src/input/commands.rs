//! User commands: `.keel/commands/*.md` files, found, parsed and listed, and the `@path` mentions and `$ARGUMENTS` expansion a prompt goes through.

use super::*;

/// A user-defined command read from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCommand {
    /// Its name (the file name without `.md`).
    pub name: String,
    /// The front matter's `description:`, if any.
    pub description: Option<String>,
    /// The text after the front matter.
    pub body: String,
    /// The file.
    pub file: PathBuf,
}

/// The `/NAME args` of `raw`, or `None` for text. A first word with another `/` in it is a
/// path (`/usr/bin/env is …`), not a command.
pub(super) fn split_command(raw: &str) -> Option<(&str, &str)> {
    let rest = raw.trim_start().strip_prefix('/')?;
    let (name, args) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(n, a)| (n, a.trim()));
    if name.is_empty() || name.contains('/') {
        return None;
    }
    Some((name, args))
}

/// Whether `name` may name a command file (`[A-Za-z0-9_-]+`: nothing that walks a path).
pub(super) fn valid_command_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Reads a command file: an optional front matter (`---` lines around `key: value` lines, of
/// which `description` is used) and the body.
pub(super) fn parse_command_file(name: &str, file: PathBuf, text: &str) -> UserCommand {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut description = None;
    let mut body = text;
    if let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        && let Some(end) = rest.find("\n---")
    {
        for line in rest[..end].lines() {
            if let Some((k, v)) = line.split_once(':')
                && k.trim() == "description"
            {
                description = Some(v.trim().trim_matches('"').to_owned());
            }
        }
        let after = &rest[end + 4..];
        body = after.split_once('\n').map_or("", |(_, b)| b);
    }
    UserCommand {
        name: name.to_owned(),
        description,
        body: body.trim().to_owned(),
        file,
    }
}

/// The most keel reads from a command file, in bytes (1 MiB).
pub const MAX_COMMAND_BYTES: u64 = keel_tools::files::MAX_CONFIG_BYTES;

/// Whether `name` is a built-in command's (a command file of that name is never used).
pub(super) fn is_builtin(name: &str) -> bool {
    BUILTIN_COMMANDS.iter().any(|(b, _)| *b == name)
}

/// Reads a user-directory command file: regular files only, opened without blocking (a FIFO
/// cannot hang keel), at most [`MAX_COMMAND_BYTES`]. `Ok(None)`: there is none.
pub(super) fn read_command_file(
    file: &std::path::Path,
) -> std::result::Result<Option<String>, String> {
    match keel_tools::files::read_regular_file_if_present(file, MAX_COMMAND_BYTES) {
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| "it is not UTF-8 text".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// The user command `name` ([`InputOptions`] gives the precedence).
///
/// # Errors
/// [`RuntimeError::Input`] when the file exists and keel does not use it (unreadable, a
/// symlink in the workspace, a FIFO or device, too large), or exists in an untrusted
/// workspace's `.keel/commands` only.
pub fn find_user_command(opts: &InputOptions, name: &str) -> Result<Option<UserCommand>> {
    if !valid_command_name(name) || is_builtin(name) {
        return Ok(None);
    }
    let unused = |file: &std::path::Path, why: &str| {
        RuntimeError::Input(format!("/{name}: {} is not used: {why}", file.display()))
    };
    if let Some(c) = opts.workspace_commands.iter().find(|c| c.name == name) {
        return match &c.text {
            Ok(text) => Ok(Some(parse_command_file(name, c.file.clone(), text))),
            Err(why) => Err(unused(&c.file, why)),
        };
    }
    for dir in &opts.command_dirs {
        let file = dir.join(format!("{name}.md"));
        match read_command_file(&file) {
            Ok(Some(text)) => return Ok(Some(parse_command_file(name, file, &text))),
            Ok(None) => {}
            Err(why) => return Err(unused(&file, &why)),
        }
    }
    if let Some(u) = &opts.untrusted_dir {
        let file = u.dir.join(format!("{name}.md"));
        if std::fs::symlink_metadata(&file).is_ok() {
            return Err(RuntimeError::Input(format!(
                "/{name}: {} exists, but this workspace is not trusted, so its commands are not used; review them, then `keel trust {}`",
                file.display(),
                u.workspace.display()
            )));
        }
    }
    Ok(None)
}

/// Every user command of `opts` (the first of a name wins), sorted by name, and a note for
/// each command file keel does not use (named like a built-in, unreadable, a special file).
pub fn list_user_commands(opts: &InputOptions) -> (Vec<UserCommand>, Vec<String>) {
    let mut out: Vec<UserCommand> = Vec::new();
    let mut notes = Vec::new();
    let mut consider = |name: &str, file: PathBuf, text: std::result::Result<String, String>| {
        if !valid_command_name(name) || out.iter().any(|c| c.name == name) {
            return;
        }
        if is_builtin(name) {
            notes.push(format!(
                "{} is not used: /{name} is a built-in command (rename the file)",
                file.display()
            ));
            return;
        }
        match text {
            Ok(text) => out.push(parse_command_file(name, file, &text)),
            Err(why) => notes.push(format!("{} is not used: {why}", file.display())),
        }
    };
    for c in &opts.workspace_commands {
        consider(&c.name, c.file.clone(), c.text.clone());
    }
    for dir in &opts.command_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".md"))
                .map(str::to_owned)
            else {
                continue;
            };
            let text =
                read_command_file(&path).and_then(|t| t.ok_or_else(|| "it went away".into()));
            consider(&name, path, text);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    (out, notes)
}

/// The `@path` mentions of `text`, in order, each once: words starting with `@` (trailing
/// punctuation `.,;:!?)"'` dropped), or `@"path"` for a path with spaces (up to the next `"`).
/// `@` inside a word (an e-mail address) is no mention.
pub fn mentions(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let starts_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let after = &rest[at + 1..];
        if !starts_word {
            rest = after;
            continue;
        }
        let (path, next) = match after.strip_prefix('"').and_then(|q| q.split_once('"')) {
            Some((quoted, tail)) => (quoted, tail),
            None => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                let word = &after[..end];
                (
                    word.trim_end_matches(['.', ',', ';', ':', '!', '?', ')', '"', '\'']),
                    &after[end..],
                )
            }
        };
        if !path.is_empty() && !out.iter().any(|p| p == path) {
            out.push(path.to_owned());
        }
        rest = next;
    }
    out
}

/// The user message for `text` with `files` (path, content) appended.
pub(super) fn with_attachments(text: &str, files: &[(String, String)]) -> String {
    let mut message = text.to_owned();
    for (path, content) in files {
        message.push_str(&format!(
            "\n\n<attached_file path=\"{path}\">\n{content}\n</attached_file>"
        ));
    }
    message
}

/// `$ARGUMENTS` in `body` replaced by `args`; without the placeholder, non-empty `args` follow
/// the body on a line of their own.
pub(super) fn expand(body: &str, args: &str) -> String {
    if body.contains("$ARGUMENTS") {
        body.replace("$ARGUMENTS", args)
    } else if args.is_empty() {
        body.to_owned()
    } else {
        format!("{body}\n\n{args}")
    }
}
