//! The directory walk of `glob` and `grep`: ripgrep's ignore rules (the `ignore` crate's
//! matchers), with every directory listed from a handle opened beneath the workspace root
//! ([`Workspace::list_beneath`]) — never by name through a symlink — so a directory swapped for
//! a symlink to outside during a walk is skipped, not listed.
//!
//! Rules, as `ignore::WalkBuilder` with `hidden(false)`, `require_git(false)`, `parents(true)`
//! applies them: `.ignore`, then `.gitignore`, then `.git/info/exclude`, then the global git
//! excludes file; within each, the deepest directory with a matching rule decides (a `!` rule
//! re-includes). Files of the directories above the search base count, up to the filesystem
//! root (above the workspace root they are read by name: they are not the model's to change).
//! A `grep` `glob` filter (an override) comes first. Hidden files are walked; `.git` is not;
//! symlinks are not followed; entries are visited depth first, sorted by name.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::overrides::{Override, OverrideBuilder};
use tokio_util::sync::CancellationToken;

use crate::workspace::Workspace;
use crate::workspace::beneath::{EntryKind, ListedEntry};

/// Largest ignore file read, in bytes; the rest of a longer one is not used.
const MAX_IGNORE_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// How a walk ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    /// Every directory was walked (unreadable ones skipped).
    Done,
    /// The cancel token fired.
    Cancelled,
}

/// The ignore files of one directory.
struct Level {
    ignore: Gitignore,
    gitignore: Gitignore,
    exclude: Gitignore,
}

/// A walk's rules: the override (grep's `glob`), the ignore files of each directory from the
/// filesystem root down to the one being walked, the global excludes.
struct Rules {
    overrides: Option<Override>,
    levels: Vec<Level>,
    global: Gitignore,
}

impl Rules {
    /// Whether the entry at absolute `path` is left out.
    fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        if let Some(overrides) = &self.overrides {
            match overrides.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        let kinds: [fn(&Level) -> &Gitignore; 3] =
            [|l| &l.ignore, |l| &l.gitignore, |l| &l.exclude];
        for kind in kinds {
            for level in self.levels.iter().rev() {
                match kind(level).matched(path, is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
        }
        self.global.matched(path, is_dir).is_ignore()
    }
}

/// The override matcher for grep's `glob` filter, rooted at absolute `base`.
///
/// Errors: a message naming the glob when it does not compile.
pub(crate) fn overrides(base: &Path, glob: &str) -> Result<Override, String> {
    let mut builder = OverrideBuilder::new(base);
    builder
        .add(glob)
        .map_err(|e| format!("invalid glob `{glob}`: {e}"))?;
    builder
        .build()
        .map_err(|e| format!("invalid glob `{glob}`: {e}"))
}

/// Walks the directory `base` (workspace-relative, as `ResolvedPath::beneath`) and calls
/// `visit` with the workspace-relative path of every regular file that is not ignored, depth
/// first in name order. A directory that cannot be listed beneath the root (gone, or swapped for
/// a symlink) is skipped. Errors listing `base` itself are returned.
pub(crate) fn walk_files(
    ws: &Workspace,
    base: &Path,
    overrides: Option<Override>,
    cancel: &CancellationToken,
    mut visit: impl FnMut(&Path),
) -> Result<WalkEnd, crate::ToolsError> {
    let root = ws.root();
    let base: PathBuf = base
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    let base = base.as_path();
    let shown = ws.display_relative(&root.join(base));
    let base_entries = ws.list_beneath(base, &shown)?;
    let mut rules = Rules {
        overrides,
        levels: Vec::new(),
        global: Gitignore::global().0,
    };
    // Directories above the workspace root: read by name (outside the workspace; filters only).
    let mut above: Vec<&Path> = root.ancestors().skip(1).collect();
    above.reverse();
    for dir in above {
        rules.levels.push(level_above_root(dir));
    }
    // The root down to the base's parent, read beneath the root.
    let mut prefix = PathBuf::new();
    for part in base.iter() {
        let listed = ws.list_beneath(&prefix, &shown).unwrap_or_default();
        rules.levels.push(level_beneath(ws, &prefix, &listed));
        prefix.push(part);
    }
    rules.levels.push(level_beneath(ws, base, &base_entries));

    /// One directory being walked: its path and the entries still to visit.
    struct Frame {
        dir: PathBuf,
        entries: std::vec::IntoIter<ListedEntry>,
    }
    let mut stack = vec![Frame {
        dir: base.to_path_buf(),
        entries: base_entries.into_iter(),
    }];
    while let Some(frame) = stack.last_mut() {
        if cancel.is_cancelled() {
            return Ok(WalkEnd::Cancelled);
        }
        let Some(entry) = frame.entries.next() else {
            stack.pop();
            rules.levels.pop();
            continue;
        };
        if entry.name == OsStr::new(".git") {
            continue;
        }
        let rel = frame.dir.join(&entry.name);
        match entry.kind {
            EntryKind::File if !rules.ignored(&root.join(&rel), false) => visit(&rel),
            EntryKind::Dir => {
                if rules.ignored(&root.join(&rel), true) {
                    continue;
                }
                let shown = ws.display_relative(&root.join(&rel));
                // Gone or swapped for a symlink since it was listed: skipped, never followed.
                let Ok(entries) = ws.list_beneath(&rel, &shown) else {
                    continue;
                };
                rules.levels.push(level_beneath(ws, &rel, &entries));
                stack.push(Frame {
                    dir: rel,
                    entries: entries.into_iter(),
                });
            }
            // Symlinks are not followed; FIFOs, sockets and devices are not searched.
            _ => {}
        }
    }
    Ok(WalkEnd::Done)
}

/// The ignore files of workspace directory `dir` (whose entries are `entries`), read beneath the
/// root like every workspace file (regular files only, at most [`MAX_IGNORE_FILE_BYTES`]).
fn level_beneath(ws: &Workspace, dir: &Path, entries: &[ListedEntry]) -> Level {
    let abs = ws.root().join(dir);
    let has = |name: &str, kind: EntryKind| {
        entries
            .iter()
            .any(|e| e.name == OsStr::new(name) && e.kind == kind)
    };
    let read = |rel: PathBuf| {
        let shown = ws.display_relative(&ws.root().join(&rel));
        ws.open_read(&rel, &shown).ok().map(|opened| {
            let mut bytes = Vec::new();
            let _ = opened
                .file
                .take(MAX_IGNORE_FILE_BYTES)
                .read_to_end(&mut bytes);
            bytes
        })
    };
    let matcher = |present: bool, file: &str| {
        if !present {
            return Gitignore::empty();
        }
        match read(dir.join(file)) {
            Some(bytes) => build(&abs, &abs.join(file), &bytes),
            None => Gitignore::empty(),
        }
    };
    Level {
        ignore: matcher(has(".ignore", EntryKind::File), ".ignore"),
        gitignore: matcher(has(".gitignore", EntryKind::File), ".gitignore"),
        exclude: matcher(has(".git", EntryKind::Dir), ".git/info/exclude"),
    }
}

/// The ignore files of `dir`, a directory above the workspace root, read by name: regular
/// files only, opened without blocking, at most [`MAX_IGNORE_FILE_BYTES`].
fn level_above_root(dir: &Path) -> Level {
    let matcher = |file: &str| {
        let path = dir.join(file);
        match read_outside(&path) {
            Some(bytes) => build(dir, &path, &bytes),
            None => Gitignore::empty(),
        }
    };
    Level {
        ignore: matcher(".ignore"),
        gitignore: matcher(".gitignore"),
        exclude: matcher(".git/info/exclude"),
    }
}

/// A regular file outside the workspace, without blocking on a FIFO.
fn read_outside(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_IGNORE_FILE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// A matcher rooted at `dir` from the lines of the ignore file `file` (lines that do not compile
/// are left out, as ripgrep does).
fn build(dir: &Path, file: &Path, bytes: &[u8]) -> Gitignore {
    let mut builder = GitignoreBuilder::new(dir);
    for line in String::from_utf8_lossy(bytes).lines() {
        let _ = builder.add_line(Some(file.to_path_buf()), line);
    }
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the walk visits, workspace-relative.
    fn walked(ws: &Workspace, base: &str, glob: Option<&str>) -> Vec<String> {
        let base = Path::new(base);
        let overrides = glob.map(|g| overrides(&ws.root().join(base), g).unwrap());
        let mut out = Vec::new();
        walk_files(ws, base, overrides, &CancellationToken::new(), |rel| {
            out.push(rel.to_string_lossy().into_owned())
        })
        .unwrap();
        out
    }

    /// What `ignore::WalkBuilder` (the walker glob and grep used before) yields, with the same
    /// options.
    fn ignore_crate(root: &Path, base: &str, glob: Option<&str>) -> Vec<String> {
        let base_abs = root.join(base);
        let mut builder = ignore::WalkBuilder::new(&base_abs);
        builder
            .hidden(false)
            .require_git(false)
            .git_ignore(true)
            .git_exclude(true)
            .ignore(true)
            .parents(true)
            .sort_by_file_path(|a, b| a.cmp(b))
            .filter_entry(|e| e.file_name() != ".git");
        if let Some(glob) = glob {
            builder.overrides(overrides(&base_abs, glob).unwrap());
        }
        builder
            .build()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
            .map(|e| {
                e.path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    #[test]
    fn the_walk_applies_the_same_ignore_rules_as_the_ignore_crate() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = [
            (".gitignore", "*.log\ntarget/\n!keep.log\n/only-root.txt\n"),
            (".ignore", "secret-*\n!secret-ok\n"),
            ("a.log", "x"),
            ("keep.log", "x"),
            ("only-root.txt", "x"),
            ("src/only-root.txt", "x"),
            ("src/lib.rs", "x"),
            ("src/.gitignore", "*.tmp\n!important.log\ngenerated/\n"),
            ("src/x.tmp", "x"),
            ("src/important.log", "x"),
            ("src/generated/g.rs", "x"),
            ("src/deep/er/f.rs", "x"),
            ("src/deep/.ignore", "*.rs\n"),
            ("src/deep/er/g.md", "x"),
            ("target/debug/out", "x"),
            ("secret-1", "x"),
            ("secret-ok", "x"),
            (".hidden/h.txt", "x"),
            ("docs/a.md", "x"),
            ("docs/b.txt", "x"),
            (".git/info/exclude", "excluded.txt\n"),
            (".git/config", "x"),
            ("excluded.txt", "x"),
        ];
        for (path, content) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let ws = Workspace::new(root).unwrap();
        let all = walked(&ws, ".", None);
        for (kept, why) in [
            ("keep.log", "re-included by `!keep.log`"),
            ("src/important.log", "re-included in src/.gitignore"),
            ("src/only-root.txt", "`/only-root.txt` is anchored"),
            ("secret-ok", "re-included in .ignore"),
            (".hidden/h.txt", "hidden files are walked"),
        ] {
            assert!(all.contains(&kept.to_owned()), "{kept}: {why}; {all:?}");
        }
        for gone in [
            "a.log",
            "only-root.txt",
            "src/x.tmp",
            "src/generated/g.rs",
            "src/deep/er/f.rs",
            "target/debug/out",
            "secret-1",
            "excluded.txt",
            ".git/config",
        ] {
            assert!(
                !all.contains(&gone.to_owned()),
                "{gone} is ignored; {all:?}"
            );
        }
        for (base, glob) in [
            (".", None),
            ("src", None),
            ("src/deep", None),
            (".", Some("*.md")),
            (".", Some("!*.log")),
            ("src", Some("*.log")),
        ] {
            let ours = walked(&ws, base, glob);
            assert!(!ours.is_empty(), "{base} {glob:?}");
            assert_eq!(
                ours,
                ignore_crate(ws.root(), base, glob),
                "base {base}, glob {glob:?}"
            );
        }
    }
}
