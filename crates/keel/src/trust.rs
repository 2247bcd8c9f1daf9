//! Trusted workspaces: the `trusted_workspaces` list of the user config, and `keel trust`,
//! which edits it.
//!
//! A workspace's `keel.toml` comes with the repository, so by default it may only tighten the
//! user's settings (docs/SECURITY.md). A workspace the user names in `trusted_workspaces`
//! (in the **user** config; a workspace file may never set it) may also loosen them and bring
//! `allow` rules. Entries are matched by canonical path — symlinks and `..` resolved on both
//! sides — and exactly: trusting `/src/repo` does not trust `/src/repo/vendor/x`.
//!
//! **Trust is given to a version of the file.** Each entry pins the SHA-256 of the workspace's
//! `keel.toml` as it was when the user ran `keel trust` (`none` when it had none):
//! `{ path = "/src/repo", keel_toml = "sha256:…" }`. When the file changes — a `git pull`, or
//! the model writing it with `write_file` or `shell` — the workspace is untrusted again (its
//! file may only tighten) until the user reviews it and runs `keel trust` again; a notice
//! says so. A plain path entry pins nothing and trusts nothing (the notice says how to pin).
//! The pin also covers the workspace's `.keel/agents/*.md` and `.keel/commands/*.md` (names and
//! contents, [`pin_of_workspace`]): an agent or command file added or changed after `keel trust`
//! untrusts the workspace the same way. A workspace without such files keeps the plain
//! `keel.toml` hash, so entries written by earlier builds stay valid there; one with them needs
//! `keel trust` once more after the upgrade.
//! The same idea as direnv's `direnv allow`.
//!
//! `keel trust` edits the user config with `toml_edit`, so the user's comments, order and
//! formatting survive; the file is replaced atomically (a temporary file in the same directory,
//! then a rename onto the file a symlinked config points to).

use std::path::{Path, PathBuf};

use crate::config::{CONFIG_FILE, ConfigError};

/// The user-config key listing trusted workspaces.
pub const KEY: &str = "trusted_workspaces";

/// Expands `~/…` with the home directory; any other entry is returned as it is.
fn expand_home(entry: &str) -> PathBuf {
    match entry.strip_prefix("~/") {
        Some(rest) => dirs::home_dir().map_or_else(|| PathBuf::from(entry), |h| h.join(rest)),
        None if entry == "~" => dirs::home_dir().unwrap_or_else(|| PathBuf::from(entry)),
        None => PathBuf::from(entry),
    }
}

/// One `trusted_workspaces` entry as written: a plain path (pins nothing, so trusts nothing)
/// or a path with the hash of the `keel.toml` the user trusted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum TrustEntry {
    /// `"/src/repo"`: written by hand or by an older keel; not trusted until pinned.
    Path(String),
    /// `{ path = "/src/repo", keel_toml = "sha256:…" }` (or `keel_toml = "none"`).
    Pinned(PinnedEntry),
}

/// A trusted workspace and the `keel.toml` version trusted there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedEntry {
    /// Absolute path (or `~/…`) of the workspace.
    pub path: String,
    /// [`pin_of`] the workspace's `keel.toml` when it was trusted: `sha256:<hex>` or `none`.
    pub keel_toml: String,
}

impl TrustEntry {
    /// The path as written.
    pub fn path(&self) -> &str {
        match self {
            Self::Path(p) => p,
            Self::Pinned(e) => &e.path,
        }
    }
}

/// The pin of a workspace's `keel.toml` contents (`None`: no file): `sha256:<hex>` or `none`.
pub fn pin_of(contents: Option<&[u8]>) -> String {
    contents.map_or_else(|| "none".to_owned(), keel_core::canonical::bytes_hash)
}

/// The directories of a workspace whose `*.md` files trust covers besides `keel.toml`: its
/// agents and its commands (a repository's text put in the user's mouth).
pub const COVERED_DIRS: [&str; 2] = [crate::config::AGENTS_DIR, crate::config::COMMANDS_DIR];

/// A workspace file trust covers (`.keel/agents/NAME.md`, `.keel/commands/NAME.md`), as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoveredFile {
    /// Its path relative to the workspace (`.keel/agents/review.md`), or the directory's when
    /// the directory itself is unusable (a symlink).
    pub rel: String,
    /// Its path.
    pub path: PathBuf,
    /// Its bytes, or why keel does not use it (a symlink, a FIFO, larger than 1 MiB…).
    pub content: Result<Vec<u8>, String>,
}

/// The `*.md` files of the workspace's [`COVERED_DIRS`], sorted by path, each read once (the
/// bytes hashed for trust are the bytes used) and safely: no symlink is followed (neither the
/// file nor `.keel` or its directory may be one), only regular files, a non-blocking open (a
/// FIFO cannot hang keel), at most 1 MiB ([`keel_tools::files::MAX_CONFIG_BYTES`]). A file (or
/// directory) keel will not use is listed with the reason, so that it counts in the pin too.
pub fn read_covered(workspace: &Path) -> Vec<CoveredFile> {
    let mut out = Vec::new();
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    let dot_keel = workspace.join(".keel");
    for dir in COVERED_DIRS {
        let path = workspace.join(dir);
        if is_link(&dot_keel) || is_link(&path) {
            out.push(CoveredFile {
                rel: dir.to_owned(),
                path,
                content: Err(
                    "it (or .keel) is a symlink; keel follows no symlink in a workspace's .keel"
                        .into(),
                ),
            });
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".md") {
                continue;
            }
            let file = entry.path();
            let content = keel_tools::files::read_regular_file_nofollow(
                &file,
                keel_tools::files::MAX_CONFIG_BYTES,
            )
            .map_err(|e| e.to_string());
            out.push(CoveredFile {
                rel: format!("{dir}/{name}"),
                path: file,
                content,
            });
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The pin of a workspace: [`pin_of`] its `keel.toml` when it has no [`COVERED_DIRS`] files (so
/// entries pinned by earlier builds stay valid there), else the SHA-256 of the canonical JSON
/// `[keel_toml pin, [[rel, sha256 or "unusable"], …]]`: adding, removing or changing an agent
/// or command file changes it, which untrusts the workspace until `keel trust` again.
pub fn pin_of_workspace(keel_toml: Option<&[u8]>, covered: &[CoveredFile]) -> String {
    let base = pin_of(keel_toml);
    if covered.is_empty() {
        return base;
    }
    let files: Vec<(&str, String)> = covered
        .iter()
        .map(|f| {
            let hash = match &f.content {
                Ok(bytes) => keel_core::canonical::bytes_hash(bytes),
                Err(_) => "unusable".to_owned(),
            };
            (f.rel.as_str(), hash)
        })
        .collect();
    let text = serde_json::to_vec(&(base, files)).unwrap_or_default();
    keel_core::canonical::bytes_hash(&text)
}

/// Whether a workspace is trusted, and if not, why (for a notice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Listed, and its `keel.toml` is the version the user trusted.
    Trusted,
    /// Not listed.
    Untrusted,
    /// Listed, but its `keel.toml` or a [`COVERED_DIRS`] file changed since (or appeared, or
    /// went away).
    Changed,
    /// Listed as a plain path, with no pinned `keel.toml`.
    Unpinned,
}

/// Whether `workspace` (canonical), whose `keel.toml` has pin `pin` ([`pin_of`]), is trusted by
/// `entries` (the user config's `trusted_workspaces`, read from `user_file`). Entries that do
/// not exist (a deleted checkout) trust nothing.
///
/// # Errors
/// [`ConfigError::InFile`] naming `user_file` for an entry that is not an absolute path (or
/// `~/…`): it would mean a different directory from every working directory.
pub fn is_trusted(
    workspace: &Path,
    pin: &str,
    entries: &[TrustEntry],
    user_file: &Path,
) -> Result<Trust, ConfigError> {
    let mut found = Trust::Untrusted;
    for entry in entries {
        let path = expand_home(entry.path());
        if !path.is_absolute() {
            return Err(ConfigError::InFile {
                path: user_file.to_owned(),
                message: format!(
                    "{KEY} entry {:?} is not an absolute path (write /full/path or ~/path, or run `keel trust PATH`)",
                    entry.path()
                ),
            });
        }
        if !std::fs::canonicalize(&path).is_ok_and(|p| p == workspace) {
            continue;
        }
        match entry {
            TrustEntry::Pinned(e) if e.keel_toml == pin => return Ok(Trust::Trusted),
            TrustEntry::Pinned(_) => found = Trust::Changed,
            TrustEntry::Path(_) if found == Trust::Untrusted => found = Trust::Unpinned,
            TrustEntry::Path(_) => {}
        }
    }
    Ok(found)
}

/// What `keel trust PATH` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trusted {
    /// The canonical path was added to the user config, pinned to its current `keel.toml`.
    Added(PathBuf),
    /// It was listed already, pinned to another version of `keel.toml` or to none: the pin now
    /// names the current file.
    Repinned(PathBuf),
    /// It was listed already (under this spelling) with the current `keel.toml` pinned.
    Already(PathBuf, String),
}

/// The user config file, or an error saying how to get one.
///
/// # Errors
/// [`ConfigError::NoConfigDir`].
pub fn user_file(locations: &crate::config::Locations) -> Result<PathBuf, ConfigError> {
    locations.user_file.clone().ok_or(ConfigError::NoConfigDir)
}

/// Reads the user config as an editable document (an absent file is an empty one).
fn read_doc(file: &Path) -> Result<toml_edit::DocumentMut, ConfigError> {
    let bytes = crate::config::read_config_bytes(file)?.unwrap_or_default();
    let text = String::from_utf8(bytes).map_err(|e| ConfigError::Read {
        path: file.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    text.parse::<toml_edit::DocumentMut>()
        .map_err(|e| ConfigError::Parse {
            path: file.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })
}

/// The `trusted_workspaces` entries of `doc`, as written.
fn entries_of(doc: &toml_edit::DocumentMut, file: &Path) -> Result<Vec<TrustEntry>, ConfigError> {
    let Some(item) = doc.get(KEY) else {
        return Ok(Vec::new());
    };
    let bad = || ConfigError::InFile {
        path: file.to_owned(),
        message: format!(
            "{KEY} must be an array of workspaces, e.g. {KEY} = [{{ path = \"/home/me/src/repo\", keel_toml = \"sha256:…\" }}] (keel trust PATH writes them)"
        ),
    };
    let array = item.as_array().ok_or_else(bad)?;
    array
        .iter()
        .map(|v| match v {
            toml_edit::Value::String(s) => Ok(TrustEntry::Path(s.value().clone())),
            toml_edit::Value::InlineTable(t) => {
                let field = |k: &str| {
                    t.get(k)
                        .and_then(toml_edit::Value::as_str)
                        .map(str::to_owned)
                };
                match (field("path"), field("keel_toml"), t.len()) {
                    (Some(path), Some(keel_toml), 2) => {
                        Ok(TrustEntry::Pinned(PinnedEntry { path, keel_toml }))
                    }
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        })
        .collect()
}

/// The inline table of a pinned entry.
fn pinned_value(path: &str, pin: &str) -> toml_edit::Value {
    let mut t = toml_edit::InlineTable::new();
    t.insert("path", path.into());
    t.insert("keel_toml", pin.into());
    toml_edit::Value::InlineTable(t)
}

/// The pin of `workspace` now ([`pin_of_workspace`]).
fn current_pin(workspace: &Path) -> Result<String, ConfigError> {
    let file = workspace.join(CONFIG_FILE);
    let bytes = crate::config::read_config_bytes(&file)?;
    Ok(pin_of_workspace(bytes.as_deref(), &read_covered(workspace)))
}

/// Replaces `file` with `text` atomically, keeping its permissions; a symlinked config file is
/// written where it points.
fn write_atomically(file: &Path, text: &str) -> Result<(), ConfigError> {
    let failed = |source| ConfigError::Write {
        path: file.to_owned(),
        source,
    };
    let target = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let dir = target
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&dir).map_err(failed)?;
    let tmp = dir.join(format!(".{CONFIG_FILE}.{}.tmp", std::process::id()));
    let result = (|| {
        std::fs::write(&tmp, text)?;
        if let Ok(meta) = std::fs::metadata(&target) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, &target)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(failed)
}

/// `keel trust PATH`: adds the canonical `path` to the user config's `trusted_workspaces`
/// (creating the file and the key as needed), keeping the rest of the file as written.
///
/// # Errors
/// [`ConfigError::NoWorkspace`] when `path` is not an existing directory; a config file that
/// cannot be read, parsed or written.
pub fn trust(file: &Path, path: &Path) -> Result<Trusted, ConfigError> {
    let workspace = crate::config::resolve_workspace(Some(path))?;
    let pin = current_pin(&workspace)?;
    let mut doc = read_doc(file)?;
    let entries = entries_of(&doc, file)?;
    let text = workspace.to_str().ok_or_else(|| ConfigError::Value {
        field: "trusted_workspaces",
        value: workspace.display().to_string(),
        expected: "a path that is valid UTF-8 (TOML strings are)",
    })?;
    let names_it = |entry: &TrustEntry| {
        let p = expand_home(entry.path());
        p.is_absolute() && std::fs::canonicalize(&p).is_ok_and(|p| p == workspace)
    };
    if let Some(entry) = entries
        .iter()
        .find(|e| names_it(e) && matches!(e, TrustEntry::Pinned(p) if p.keel_toml == pin))
    {
        return Ok(Trusted::Already(workspace, entry.path().to_owned()));
    }
    let listed = entries.iter().any(names_it);
    match doc.get_mut(KEY).and_then(toml_edit::Item::as_array_mut) {
        Some(array) => {
            // Every entry naming this workspace gives way to one pinned to the file now.
            let keep: Vec<bool> = entries.iter().map(|e| !names_it(e)).collect();
            let mut i = 0;
            array.retain(|_| {
                let k = keep.get(i).copied().unwrap_or(true);
                i += 1;
                k
            });
            array.push(pinned_value(text, &pin));
        }
        None => {
            let mut array = toml_edit::Array::new();
            array.push(pinned_value(text, &pin));
            doc.insert(KEY, toml_edit::value(array));
        }
    }
    write_atomically(file, &doc.to_string())?;
    Ok(if listed {
        Trusted::Repinned(workspace)
    } else {
        Trusted::Added(workspace)
    })
}

/// `keel trust --list`: the entries as written.
///
/// # Errors
/// A config file that cannot be read or parsed, or whose `trusted_workspaces` is not an array
/// of strings.
pub fn list(file: &Path) -> Result<Vec<TrustEntry>, ConfigError> {
    entries_of(&read_doc(file)?, file)
}

/// `keel trust --remove PATH`: removes every entry that names `path` — the same canonical
/// directory, or (for a directory that no longer exists) the same text or absolute path.
/// Returns the entries removed (none: nothing written).
///
/// # Errors
/// As [`list`]; a file that cannot be written.
pub fn remove(file: &Path, path: &Path) -> Result<Vec<String>, ConfigError> {
    let mut doc = read_doc(file)?;
    let entries = entries_of(&doc, file)?;
    let canonical = std::fs::canonicalize(path).ok();
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let names = |entry: &str| {
        let p = expand_home(entry);
        Path::new(entry) == path
            || p == absolute
            || canonical
                .as_ref()
                .is_some_and(|c| std::fs::canonicalize(&p).is_ok_and(|p| &p == c))
    };
    let keep: Vec<bool> = entries.iter().map(|e| !names(e.path())).collect();
    let removed: Vec<String> = entries
        .iter()
        .filter(|e| names(e.path()))
        .map(|e| e.path().to_owned())
        .collect();
    if removed.is_empty() {
        return Ok(removed);
    }
    if let Some(array) = doc.get_mut(KEY).and_then(toml_edit::Item::as_array_mut) {
        let mut i = 0;
        array.retain(|_| {
            let k = keep.get(i).copied().unwrap_or(true);
            i += 1;
            k
        });
    }
    write_atomically(file, &doc.to_string())?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_keeps_comments_and_adds_once() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let file = dir.path().join("keel.toml");
        let before = "# my settings\nmodel = \"openai:gpt-5\"  # the usual\n\n[budget]\n# per turn\nmax_steps = 2\n";
        std::fs::write(&file, before).unwrap();
        let canonical = std::fs::canonicalize(&ws).unwrap();
        assert_eq!(
            trust(&file, &ws).unwrap(),
            Trusted::Added(canonical.clone())
        );
        let after = std::fs::read_to_string(&file).unwrap();
        for line in before.lines() {
            assert!(after.contains(line), "{line:?} kept in:\n{after}");
        }
        let table: toml::Table = after.parse().unwrap();
        assert_eq!(
            table[KEY].as_array().unwrap()[0]["path"].as_str(),
            canonical.to_str()
        );
        assert_eq!(
            table[KEY].as_array().unwrap()[0]["keel_toml"].as_str(),
            Some("none")
        );
        assert_eq!(
            table["budget"]["max_steps"].as_integer(),
            Some(2),
            "the key went to the top level, not into [budget]"
        );
        let dotted = dir.path().join("ws/../ws");
        assert!(matches!(
            trust(&file, &dotted).unwrap(),
            Trusted::Already(..)
        ));
        assert_eq!(list(&file).unwrap().len(), 1);
        assert_eq!(remove(&file, &dotted).unwrap().len(), 1);
        assert!(list(&file).unwrap().is_empty());
        assert!(
            std::fs::read_to_string(&file)
                .unwrap()
                .contains("# per turn")
        );
    }

    #[test]
    fn relative_entries_are_refused_naming_the_file() {
        let e = is_trusted(
            Path::new("/x"),
            "none",
            &[TrustEntry::Path("repo".into())],
            Path::new("/cfg/keel.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/cfg/keel.toml") && e.contains("\"repo\""),
            "{e}"
        );
    }
}
