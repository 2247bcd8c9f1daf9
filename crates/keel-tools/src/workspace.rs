//! Workspace confinement, in two steps.
//!
//! 1. **Check** ([`Workspace::resolve`]): a path is resolved against the workspace root and
//!    canonicalized; anything that ends up outside (`..`, absolute paths elsewhere, symlinks
//!    pointing out, dangling symlinks) is refused with an error that says why. Symlinks inside
//!    the workspace are resolved here, so policy rules see the real path.
//! 2. **Use** ([`beneath`]): the file tools then open the checked path relative to the root's
//!    directory handle, never by absolute name, refusing any symlink on the way; a swap between
//!    the check and the use (a directory replaced by a symlink to outside) is refused at the open,
//!    and what is opened is type-checked on the handle (FIFOs, sockets and devices are refused).
//!
//! **Keel's own files.** A host names the paths that are its own ([`Workspace::protecting`]: the
//! `keel` CLI's data and config directories, its store and seal key), which lie inside the
//! workspace when the workspace is the home directory. [`Workspace::resolve`] refuses every path
//! at or under one of them, whatever spelling or symlink leads there, and directory listings
//! ([`Workspace::list_beneath`], so `list_dir`, `glob` and `grep`) leave them out.
//!
//! The shell is confined by the [`crate::sandbox`], not by this module.

pub mod beneath;

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::error::ToolsError;

/// The directory tree tools may touch. Cheap to clone (the root's handle is shared).
#[derive(Debug, Clone)]
pub struct Workspace {
    inner: Arc<Root>,
    /// Canonical paths of the host's own files (see [`Workspace::protecting`]).
    protected: Arc<[PathBuf]>,
}

/// The canonical root and an open handle on it, which every use-time open starts from.
#[derive(Debug)]
struct Root {
    path: PathBuf,
    dir: OwnedFd,
}

/// The open roots of this process by canonical path: workspaces opened on the same directory
/// share one handle (one file descriptor, not one per session: 10,000 sessions on one
/// repository would otherwise hold 10,000 descriptors of it).
static ROOTS: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, std::sync::Weak<Root>>>> =
    std::sync::Mutex::new(None);

/// The shared [`Root`] of the canonical directory `path`: an open one whose handle still names
/// the directory now at `path` (same device, inode and mount, [`identity`]: a directory deleted
/// and made again at the same path, or another mount over it, gets a new handle), or a newly
/// opened one. Entries of dropped roots are pruned
/// when the map has doubled since the last prune (amortized O(1) per open).
///
/// Errors: opening or `stat`ing the directory.
fn shared_root(path: PathBuf) -> std::io::Result<Arc<Root>> {
    let now = identity(rustix::fs::CWD, &path)?;
    let mut guard = ROOTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let roots = guard.get_or_insert_with(Default::default);
    if let Some(root) = roots.get(&path).and_then(std::sync::Weak::upgrade)
        && identity(&root.dir, Path::new(""))? == now
    {
        return Ok(root);
    }
    let dir = beneath::open_root(&path)?;
    let root = Arc::new(Root {
        path: path.clone(),
        dir,
    });
    roots.insert(path, Arc::downgrade(&root));
    if roots.len() >= 64 && roots.len().is_power_of_two() {
        roots.retain(|_, w| w.strong_count() > 0);
    }
    Ok(root)
}

/// What names a directory for [`shared_root`]: device and inode, and on Linux the mount
/// (`statx` `STATX_MNT_ID`): a bind mount of the same directory placed over the path later (a
/// read-only one, say) is another mount, so it gets a handle of its own rather than the old
/// mount's. `path` relative to `dir`; the empty path names `dir` itself.
///
/// Errors: the `stat`.
#[cfg(target_os = "linux")]
fn identity(dir: impl std::os::fd::AsFd, path: &Path) -> std::io::Result<(u64, u64, u64)> {
    use rustix::fs::{AtFlags, StatxFlags};
    let flags = if path.as_os_str().is_empty() {
        AtFlags::EMPTY_PATH
    } else {
        AtFlags::empty()
    };
    let s = rustix::fs::statx(
        dir,
        path,
        flags,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )?;
    Ok((
        (u64::from(s.stx_dev_major) << 32) | u64::from(s.stx_dev_minor),
        s.stx_ino,
        s.stx_mnt_id,
    ))
}

/// What names a directory for [`shared_root`]: device and inode (see the Linux version).
#[cfg(not(target_os = "linux"))]
fn identity(dir: impl std::os::fd::AsFd, path: &Path) -> std::io::Result<(u64, u64, u64)> {
    let s = if path.as_os_str().is_empty() {
        rustix::fs::fstat(dir)?
    } else {
        rustix::fs::statat(dir, path, rustix::fs::AtFlags::empty())?
    };
    #[allow(clippy::cast_sign_loss, clippy::unnecessary_cast)]
    Ok((s.st_dev as u64, s.st_ino as u64, 0))
}

impl PartialEq for Workspace {
    fn eq(&self, other: &Self) -> bool {
        self.inner.path == other.inner.path
    }
}

impl Eq for Workspace {}

/// A path that was checked to lie inside the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPath {
    /// Absolute, canonical path (the existing prefix canonicalized, any not-yet-existing tail appended).
    pub absolute: PathBuf,
    /// The same path relative to the workspace root, `/`-separated; `.` for the root itself.
    pub relative: String,
    /// The same path relative to the root as raw bytes (empty for the root itself): what the
    /// [`beneath`] operations open relative to the root's handle.
    pub beneath: PathBuf,
    /// Whether the path exists (following symlinks).
    pub exists: bool,
}

impl Workspace {
    /// Opens the workspace rooted at `root`, which must exist; it is canonicalized and opened
    /// once here (the handle every use-time open starts from; it keeps naming the same directory
    /// if the root is renamed later).
    ///
    /// Errors: [`ToolsError::WorkspaceRoot`] if `root` does not exist, is not a directory or
    /// cannot be opened.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, ToolsError> {
        let root = root.as_ref();
        let canonical =
            std::fs::canonicalize(root).map_err(|source| ToolsError::WorkspaceRoot {
                path: root.to_path_buf(),
                source,
            })?;
        if !canonical.is_dir() {
            return Err(ToolsError::WorkspaceRoot {
                path: root.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let inner = shared_root(canonical).map_err(|source| ToolsError::WorkspaceRoot {
            path: root.to_path_buf(),
            source,
        })?;
        Ok(Self {
            inner,
            protected: Arc::from(Vec::new()),
        })
    }

    /// The same workspace, refusing `paths` — the host's own files, such as the `keel` CLI's
    /// data and config directories, its store and seal key — to the file tools: a path at or
    /// under one of them is refused by [`Workspace::resolve`] (naming the reason), and
    /// directory listings leave them out. Each path is canonicalized now as far as it exists
    /// (the rest appended), like a path the tools resolve; paths outside the workspace change
    /// nothing (the tools cannot reach them anyway).
    #[must_use]
    pub fn protecting(mut self, paths: &[PathBuf]) -> Self {
        self.protected = paths
            .iter()
            .map(|p| canonical_as_far_as_it_exists(p))
            .collect();
        self
    }

    /// The protected path `absolute` (canonical) lies at or under, if any.
    pub(crate) fn protected_by(&self, absolute: &Path) -> Option<&Path> {
        self.protected
            .iter()
            .find(|p| absolute.starts_with(p))
            .map(PathBuf::as_path)
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.inner.path
    }

    /// Resolves `path` (relative to the root, or absolute inside it) to a checked [`ResolvedPath`].
    ///
    /// Errors: [`ToolsError::PathRefused`] when the path is empty, leaves the workspace lexically
    /// (`../x`, `/etc/passwd`), passes through a symlink that points outside, or names a dangling
    /// symlink (whose target could be created outside).
    pub fn resolve(&self, path: &str) -> Result<ResolvedPath, ToolsError> {
        let refuse = |reason: String| ToolsError::PathRefused {
            path: path.to_owned(),
            reason,
        };
        if path.is_empty() {
            return Err(refuse(
                "the path is empty; give a path relative to the workspace root".into(),
            ));
        }
        if path.contains('\0') {
            return Err(refuse("the path contains a NUL byte".into()));
        }
        let joined = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            self.inner.path.join(path)
        };
        // Lexical normalization first: `..` that climbs above the root is refused outright.
        let mut normal = PathBuf::new();
        for component in joined.components() {
            match component {
                Component::Prefix(p) => normal.push(p.as_os_str()),
                Component::RootDir => normal.push("/"),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !normal.pop() {
                        return Err(refuse("`..` climbs above the filesystem root".into()));
                    }
                }
                Component::Normal(part) => {
                    let part = decode_name(&normal, part);
                    normal.push(part);
                }
            }
        }
        if !normal.starts_with(self.inner.path.as_path()) {
            return Err(refuse(format!(
                "it resolves outside the workspace ({}); paths must stay inside the workspace root",
                if Path::new(path).is_absolute() {
                    "absolute path elsewhere"
                } else {
                    "`..` leaves the workspace"
                }
            )));
        }
        // Canonicalize the longest existing prefix; the rest must not exist (yet).
        let mut existing = normal.clone();
        let mut tail: Vec<std::ffi::OsString> = Vec::new();
        let canonical_prefix = loop {
            match std::fs::canonicalize(&existing) {
                Ok(canonical) => break canonical,
                Err(_) => {
                    if std::fs::symlink_metadata(&existing).is_ok() {
                        return Err(refuse(format!(
                            "`{}` is a symlink whose target does not exist; refusing to follow it",
                            self.display_relative(&existing)
                        )));
                    }
                    match existing.file_name() {
                        Some(name) => {
                            tail.push(name.to_owned());
                            existing.pop();
                        }
                        None => return Err(refuse("no part of the path exists".into())),
                    }
                }
            }
        };
        if !canonical_prefix.starts_with(self.inner.path.as_path()) {
            return Err(refuse(format!(
                "`{}` is a symlink that points outside the workspace (to {})",
                self.display_relative(&existing),
                canonical_prefix.display()
            )));
        }
        let exists = tail.is_empty();
        let mut absolute = canonical_prefix;
        for part in tail.iter().rev() {
            absolute.push(part);
        }
        if let Some(own) = self.protected_by(&absolute) {
            return Err(refuse(format!(
                "`{}` is keel's own (under `{}`: keel's store, seal key or configuration, which \
                 keel keeps from every tool); the file tools do not read, write or list it",
                self.display_relative(&absolute),
                self.display_relative(own)
            )));
        }
        let relative = self.display_relative(&absolute);
        let beneath = absolute
            .strip_prefix(self.inner.path.as_path())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok(ResolvedPath {
            absolute,
            relative,
            beneath,
            exists,
        })
    }

    /// The forms of `path` that policy rules are matched against (pure lexical work plus one
    /// canonicalization): the lexically normalized path (workspace-relative, or absolute when it
    /// leaves the workspace) and, when it differs, the path after resolving symlinks.
    pub fn policy_paths(&self, path: &str) -> Vec<String> {
        let joined = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            self.inner.path.join(path)
        };
        let mut normal = PathBuf::new();
        for component in joined.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other.as_os_str()),
            }
        }
        let mut out = vec![self.display_relative(&normal)];
        if let Ok(resolved) = self.resolve(path) {
            if !out.contains(&resolved.relative) {
                out.push(resolved.relative);
            }
        } else if let Ok(canonical) = std::fs::canonicalize(&normal) {
            let shown = self.display_relative(&canonical);
            if !out.contains(&shown) {
                out.push(shown);
            }
        }
        out
    }

    /// `path` relative to the root, `/`-separated, `.` for the root; absolute paths outside are
    /// shown as they are.
    pub fn display_relative(&self, path: &Path) -> String {
        match path.strip_prefix(self.inner.path.as_path()) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel
                .components()
                .map(|c| name_text(c.as_os_str()))
                .collect::<Vec<_>>()
                .join("/"),
            Err(_) => path.display().to_string(),
        }
    }
}

/// `path` made absolute and canonical as far as it exists, the rest appended as written.
fn canonical_as_far_as_it_exists(path: &Path) -> PathBuf {
    let mut existing = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut tail = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(&existing) {
            let mut out = canonical;
            out.extend(tail.iter().rev());
            return out;
        }
        match existing.file_name() {
            Some(name) => {
                tail.push(name.to_owned());
                existing.pop();
            }
            None => return path.to_path_buf(),
        }
    }
}

/// A file name as text that round-trips through [`Workspace::resolve`]: valid UTF-8 as it is;
/// in a name that is not valid UTF-8 each byte that is not part of a valid character is
/// written `\xNN` (two lowercase hex digits), e.g. the Latin-1 name `caf\xe9.txt`.
pub fn name_text(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// One path component as a tool gave it: when no entry of that literal name exists in `dir`
/// and its `\xNN` escapes decode to a name that is not valid UTF-8, that name (the form
/// [`name_text`] writes); otherwise the component as it is.
fn decode_name(dir: &Path, part: &std::ffi::OsStr) -> std::ffi::OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = part.as_bytes();
    if !bytes.windows(2).any(|w| w == b"\\x") || std::fs::symlink_metadata(dir.join(part)).is_ok() {
        return part.to_owned();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'\\'
            && bytes.get(i + 1) == Some(&b'x')
            && let (Some(h), Some(l)) = (
                bytes.get(i + 2).and_then(|b| hex(*b)),
                bytes.get(i + 3).and_then(|b| hex(*b)),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(0));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if std::str::from_utf8(&out).is_ok() {
        return part.to_owned();
    }
    std::ffi::OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_on_one_directory_share_one_handle_until_it_is_replaced() {
        use std::os::fd::AsRawFd;
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let a = Workspace::new(&root).unwrap();
        let b = Workspace::new(&root).unwrap();
        assert!(
            Arc::ptr_eq(&a.inner, &b.inner),
            "one descriptor for one directory"
        );
        // The directory is removed and made again at the same path: a new workspace names the
        // new one (its handle is new), the old ones keep naming the one they opened.
        std::fs::write(root.join("old.txt"), "old").unwrap();
        std::fs::rename(&root, parent.path().join("moved")).unwrap();
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("new.txt"), "new").unwrap();
        let c = Workspace::new(&root).unwrap();
        assert!(!Arc::ptr_eq(&a.inner, &c.inner));
        assert_ne!(a.inner.dir.as_raw_fd(), c.inner.dir.as_raw_fd());
        assert!(c.resolve("new.txt").unwrap().exists);
        let held = rustix::fs::fstat(&a.inner.dir).unwrap();
        let moved = rustix::fs::stat(parent.path().join("moved")).unwrap();
        assert_eq!((held.st_dev, held.st_ino), (moved.st_dev, moved.st_ino));
        // Once every workspace on a directory is dropped, its handle is closed.
        let canonical = std::fs::canonicalize(&root).unwrap();
        drop(c);
        let roots = ROOTS.lock().unwrap();
        let entry = roots.as_ref().unwrap().get(&canonical).unwrap();
        assert!(entry.upgrade().is_none());
    }

    #[test]
    fn root_resolves_to_dot() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let r = ws.resolve(".").unwrap();
        assert_eq!(r.relative, ".");
        assert!(r.exists);
    }

    #[test]
    fn dot_dot_inside_the_workspace_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        assert_eq!(ws.resolve("a/../b.txt").unwrap().relative, "b.txt");
    }

    #[test]
    fn missing_root_is_an_error() {
        let err = Workspace::new("/definitely/not/here").unwrap_err();
        assert!(matches!(err, ToolsError::WorkspaceRoot { .. }));
    }
}
