//! Use-time file operations: everything is opened relative to the workspace root's directory
//! handle, never by absolute name, so a path [`Workspace::resolve`] checked cannot be redirected
//! outside the workspace between the check and the use.
//!
//! **How.** The parent directory of a path is opened with `openat2(root, parent, O_PATH,
//! RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`; the last component is then
//! used with `*at` calls relative to that handle, with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`. Where
//! `openat2` is missing (Linux before 5.6, other Unixes) the parent is opened one component at a
//! time with `O_NOFOLLOW | O_DIRECTORY`, which gives the same guarantee. `rustix` makes both
//! safe calls (no `unsafe` here).
//!
//! **Symlinks.** The paths given here are the ones [`Workspace::resolve`] produced: symlinks
//! inside the workspace were already resolved there, so a symlink that points inside keeps
//! working (and policy rules see the real path). A symlink met *here* can only be one that
//! appeared since the check — for example a directory swapped for a symlink to outside with
//! `renameat2(RENAME_EXCHANGE)` — and it is refused ([`ToolsError::PathRefused`]), never
//! followed, not even when it points inside.
//!
//! **File types.** A final component is opened with `O_NONBLOCK | O_NOCTTY` and checked with
//! `fstat` on the open handle (after a `fstatat` check that avoids opening it at all): FIFOs,
//! sockets and devices are refused ([`FileProblem::NotRegular`]) without a byte read or written,
//! so a FIFO cannot block a tool and `/dev/zero` cannot be read without end.
//!
//! **Not covered.** A hard link inside the workspace is a workspace file, whatever other names
//! it has; the sandbox keeps commands from creating links to files outside. Mount points inside
//! the workspace are crossed.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::Workspace;
use crate::error::{FileProblem, ToolsError};

/// Flags of a directory handle used only as the base of `*at` calls.
#[cfg(target_os = "linux")]
const DIR_HANDLE: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);
/// Flags of a directory handle used only as the base of `*at` calls.
#[cfg(not(target_os = "linux"))]
const DIR_HANDLE: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

/// Added to every open of a final component: never follow a symlink, never block on a FIFO,
/// never acquire a controlling terminal, never leak into child processes.
const FINAL: OFlags = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// How `openat2` resolves a parent directory: beneath the root, through no symlink at all.
#[cfg(target_os = "linux")]
const RESOLVE: rustix::fs::ResolveFlags = rustix::fs::ResolveFlags::BENEATH
    .union(rustix::fs::ResolveFlags::NO_SYMLINKS)
    .union(rustix::fs::ResolveFlags::NO_MAGICLINKS);

/// Mode of created files and directories (before the umask), as `std::fs` uses.
const NEW_FILE_MODE: u32 = 0o666;
const NEW_DIR_MODE: u32 = 0o777;

/// Opens the (canonical) workspace root as the handle every use-time open starts from.
pub(super) fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, DIR_HANDLE, Mode::empty())?)
}

/// What is at a path: `fstat` on an open handle, or `fstatat` without following a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix-domain socket.
    Socket,
    /// A character device (`/dev/zero`, a terminal).
    CharDevice,
    /// A block device (a disk, a loop device).
    BlockDevice,
    /// Anything the kernel did not say.
    Unknown,
}

impl EntryKind {
    fn of(file_type: FileType) -> Self {
        match file_type {
            FileType::RegularFile => Self::File,
            FileType::Directory => Self::Dir,
            FileType::Symlink => Self::Symlink,
            FileType::Fifo => Self::Fifo,
            FileType::Socket => Self::Socket,
            FileType::CharacterDevice => Self::CharDevice,
            FileType::BlockDevice => Self::BlockDevice,
            FileType::Unknown => Self::Unknown,
        }
    }

    fn of_stat(stat: &rustix::fs::Stat) -> Self {
        Self::of(FileType::from_raw_mode(stat.st_mode))
    }

    /// The kind with its article, as messages name it: `a FIFO`, `a character device`.
    pub fn described(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Dir => "a directory",
            Self::Symlink => "a symlink",
            Self::Fifo => "a FIFO",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
            Self::Unknown => "a file of unknown type",
        }
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEntry {
    /// The name as the directory holds it (any bytes but `/` and NUL).
    pub name: OsString,
    /// Its type, without following a symlink.
    pub kind: EntryKind,
}

/// A regular file opened for reading beneath the root, type-checked on the handle.
#[derive(Debug)]
pub struct OpenedFile {
    /// The open file (blocking mode; reads never touch anything but this file).
    pub file: File,
    /// Its size in bytes when it was opened (`fstat`).
    pub size: u64,
}

impl Workspace {
    /// What is at `rel` (workspace-relative, as [`ResolvedPath::beneath`](super::ResolvedPath)),
    /// without following a final symlink; `None` when nothing is there. `shown` names the path
    /// in errors.
    ///
    /// Errors: [`ToolsError::PathRefused`] when a symlink now stands on the way;
    /// [`ToolsError::FileUse`] for other failures.
    pub fn kind_beneath(&self, rel: &Path, shown: &str) -> Result<Option<EntryKind>, ToolsError> {
        let (parent, name) = self.parent_and_name(rel, shown)?;
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(EntryKind::of_stat(&stat))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_problem(shown, e)),
        }
    }

    /// Opens the regular file at `rel` for reading. A FIFO, socket or device is refused without
    /// being opened for reading (and, if one was swapped in after the type check, on the open
    /// handle before a byte is read).
    ///
    /// Errors: [`ToolsError::PathRefused`] when a symlink now stands on the way;
    /// [`ToolsError::FileUse`] with [`FileProblem::NotFound`], [`FileProblem::IsDirectory`],
    /// [`FileProblem::NotRegular`] or [`FileProblem::Io`].
    pub fn open_read(&self, rel: &Path, shown: &str) -> Result<OpenedFile, ToolsError> {
        let (parent, name) = self.parent_and_name(rel, shown)?;
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => must_be_regular(shown, EntryKind::of_stat(&stat))?,
            Err(e) => return Err(final_error(shown, e, &parent, name)),
        }
        let fd = rustix::fs::openat(&parent, name, OFlags::RDONLY | FINAL, Mode::empty())
            .map_err(|e| final_error(shown, e, &parent, name))?;
        let stat = regular_handle(shown, &fd)?;
        Ok(OpenedFile {
            file: File::from(fd),
            size: u64::try_from(stat.st_size).unwrap_or(0),
        })
    }

    /// The whole content of the regular file at `rel`, at most `limit` bytes.
    ///
    /// Errors: as [`Workspace::open_read`], and [`FileProblem::TooLarge`] when the file is (or
    /// grows while being read to) more than `limit` bytes.
    pub fn read_regular(&self, rel: &Path, shown: &str, limit: u64) -> Result<Vec<u8>, ToolsError> {
        let opened = self.open_read(rel, shown)?;
        let too_large = |size| problem(shown, FileProblem::TooLarge { size, limit });
        if opened.size > limit {
            return Err(too_large(opened.size));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(opened.size).unwrap_or(0));
        (&opened.file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| problem(shown, FileProblem::Io(e)))?;
        if bytes.len() as u64 > limit {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }

    /// The hash of the regular file at `rel`, read in pieces: with `key`, its keyed hash
    /// (`hmac-sha256:<hex>`, [`crate::keyed_hash::HashKey::hash`]); without, `sha256:<hex>` (the
    /// form of `keel_core::canonical::bytes_hash`). `None` when nothing is there.
    ///
    /// Errors: as [`Workspace::open_read`] (other than not found).
    pub fn hash_regular(
        &self,
        rel: &Path,
        shown: &str,
        key: Option<&crate::keyed_hash::HashKey>,
    ) -> Result<Option<String>, ToolsError> {
        let opened = match self.open_read(rel, shown) {
            Ok(opened) => opened,
            Err(ToolsError::FileUse {
                problem: FileProblem::NotFound,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut plain = Sha256::new();
        let mut keyed = key.map(crate::keyed_hash::HashKey::hasher);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match (&opened.file).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => match &mut keyed {
                    Some(h) => h.update(&buf[..n]),
                    None => plain.update(&buf[..n]),
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(problem(shown, FileProblem::Io(e))),
            }
        }
        if let Some(h) = keyed {
            return Ok(Some(h.finish()));
        }
        let mut out = String::from("sha256:");
        for byte in plain.finalize() {
            out.push_str(&format!("{byte:02x}"));
        }
        Ok(Some(out))
    }

    /// Creates the directory `rel` and any missing parents, one component at a time from the
    /// root, never through a symlink.
    ///
    /// Errors: [`ToolsError::PathRefused`] when a symlink stands on the way;
    /// [`ToolsError::FileUse`] with [`FileProblem::Io`] when a part of the path is a file or a
    /// directory cannot be created.
    pub fn create_dirs(&self, rel: &Path, shown: &str) -> Result<(), ToolsError> {
        let parts = components(rel, shown)?;
        let mut dir = rustix::fs::openat(&self.inner.dir, ".", DIR_HANDLE, Mode::empty())
            .map_err(|e| io_problem(shown, e))?;
        let mut walked = PathBuf::new();
        for part in parts {
            walked.push(part);
            let open = |dir: &OwnedFd| {
                rustix::fs::openat(dir, part, DIR_HANDLE | OFlags::NOFOLLOW, Mode::empty())
            };
            let next = match open(&dir) {
                Ok(next) => next,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(NEW_DIR_MODE)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_problem(shown, e)),
                    }
                    open(&dir).map_err(|e| parent_error(shown, e, &dir, part, &walked))?
                }
                Err(e) => return Err(parent_error(shown, e, &dir, part, &walked)),
            };
            dir = next;
        }
        Ok(())
    }

    /// Replaces the regular file at `rel` with `content` atomically: the bytes go to a
    /// temporary file in the same directory (`.keel-write-<16 hex>`, a name derived from the
    /// target's, so a leftover of a crash is reused), which is synced, given the old file's
    /// permission bits (and owner, where the process may set it), then renamed over the target.
    /// A reader — or a crash — sees the old content or the new, never a mix or an empty file;
    /// hard links to the old file keep the old content. With `create` unset the file must exist.
    /// Returns whether the file was created. A FIFO, socket or device at `rel` is refused
    /// without being written; a symlink is never followed.
    ///
    /// Errors: [`ToolsError::PathRefused`] when a symlink now stands on the way;
    /// [`ToolsError::FileUse`] with [`FileProblem::NotFound`] (nothing there and `create`
    /// unset, or a parent missing), [`FileProblem::IsDirectory`], [`FileProblem::NotRegular`] or
    /// [`FileProblem::Io`] (the write, the sync or the rename failed; the target is untouched).
    pub fn replace_file(
        &self,
        rel: &Path,
        shown: &str,
        content: &[u8],
        create: bool,
    ) -> Result<bool, ToolsError> {
        let (parent, name) = self.parent_and_name(rel, shown)?;
        let old = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => {
                must_be_regular(shown, EntryKind::of_stat(&stat))?;
                Some(stat)
            }
            Err(Errno::NOENT) if create => None,
            Err(e) => return Err(final_error(shown, e, &parent, name)),
        };
        let temp = temp_name(name);
        let io = |e: std::io::Error| problem(shown, FileProblem::Io(e));
        // A leftover of a crash (only ever a regular file of ours, or nothing).
        match rustix::fs::unlinkat(&parent, &temp, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(io(e.into())),
        }
        let mode = old.as_ref().map_or(NEW_FILE_MODE, |s| s.st_mode & 0o7777);
        let fd = rustix::fs::openat(
            &parent,
            &temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | FINAL,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| final_error(shown, e, &parent, name))?;
        let written = (|| -> std::io::Result<()> {
            if let Some(stat) = &old {
                // The umask narrowed the create mode; the replacement keeps the old bits.
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(stat.st_mode & 0o7777))?;
                // Only root (or the owner, to a group it is in) may; otherwise the file is
                // the writer's, as any editor's replacement would be.
                let _ = rustix::fs::fchown(
                    &fd,
                    Some(rustix::fs::Uid::from_raw(stat.st_uid)),
                    Some(rustix::fs::Gid::from_raw(stat.st_gid)),
                );
            }
            let mut file = File::from(fd);
            std::io::Write::write_all(&mut file, content)?;
            file.sync_all()?;
            rustix::fs::renameat(&parent, &temp, &parent, name)?;
            Ok(())
        })();
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&parent, &temp, AtFlags::empty());
            return Err(io(e));
        }
        // The rename itself durable: sync the directory (a handle that can be synced).
        if let Ok(dir) = rustix::fs::openat(
            &parent,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            let _ = rustix::fs::fsync(&dir);
        }
        Ok(old.is_none())
    }

    /// The entries of the directory at `rel`, sorted by name (bytes), `.` and `..` and the
    /// host's own files ([`Workspace::protecting`]) left out. The listing is read from a handle
    /// opened beneath the root, never through a symlink.
    ///
    /// Errors: [`ToolsError::PathRefused`] when a symlink now stands on the way;
    /// [`ToolsError::FileUse`] with [`FileProblem::NotFound`], [`FileProblem::NotDirectory`] or
    /// [`FileProblem::Io`].
    pub fn list_beneath(&self, rel: &Path, shown: &str) -> Result<Vec<ListedEntry>, ToolsError> {
        let (parent, name) = self.parent_and_name(rel, shown)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | FINAL,
            Mode::empty(),
        )
        .map_err(|e| final_error(shown, e, &parent, name))?;
        let mut dir = Dir::new(fd).map_err(|e| io_problem(shown, e))?;
        let mut entries = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| io_problem(shown, e))?;
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let name = OsStr::from_bytes(bytes).to_owned();
            // The host's own files are not the tools' to see (`Workspace::protecting`).
            if self
                .protected_by(&self.inner.path.join(rel).join(&name))
                .is_some()
            {
                continue;
            }
            let mut kind = EntryKind::of(entry.file_type());
            if kind == EntryKind::Unknown
                && let Ok(dir_fd) = dir.fd()
                && let Ok(stat) = rustix::fs::statat(dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW)
            {
                kind = EntryKind::of_stat(&stat);
            }
            entries.push(ListedEntry { name, kind });
        }
        entries.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        Ok(entries)
    }

    /// A handle on the parent directory of `rel` (opened beneath the root, through no symlink)
    /// and the last component; for the root itself, the root and `.`.
    fn parent_and_name<'a>(
        &self,
        rel: &'a Path,
        shown: &str,
    ) -> Result<(OwnedFd, &'a OsStr), ToolsError> {
        let parts = components(rel, shown)?;
        let Some((name, parents)) = parts.split_last() else {
            let root = rustix::fs::openat(&self.inner.dir, ".", DIR_HANDLE, Mode::empty())
                .map_err(|e| io_problem(shown, e))?;
            return Ok((root, OsStr::new(".")));
        };
        let parent = open_dir_beneath(self.inner.dir.as_fd(), parents).map_err(|e| match e {
            Errno::LOOP | Errno::XDEV | Errno::NOTDIR => changed(shown),
            Errno::NOENT => problem(shown, FileProblem::NotFound),
            e => io_problem(shown, e),
        })?;
        Ok((parent, name))
    }
}

/// Opens the directory `parts` (plain components) beneath `root` through no symlink: one
/// `openat2` call where the kernel has it, else [`open_dir_by_components`].
fn open_dir_beneath(root: BorrowedFd<'_>, parts: &[&OsStr]) -> Result<OwnedFd, Errno> {
    #[cfg(target_os = "linux")]
    {
        let path: PathBuf = parts.iter().collect();
        let path = if parts.is_empty() {
            Path::new(".")
        } else {
            path.as_path()
        };
        // EAGAIN: a concurrent rename made the kernel give up on this resolution; retry.
        for _ in 0..8 {
            match rustix::fs::openat2(root, path, DIR_HANDLE, Mode::empty(), RESOLVE) {
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) => break,
                other => return other,
            }
        }
    }
    open_dir_by_components(root, parts)
}

/// Opens the directory `parts` beneath `root` one component at a time, each with `O_NOFOLLOW |
/// O_DIRECTORY` relative to the previous handle: no symlink is followed and (the components
/// being plain names) nothing above `root` is reached. The fallback where `openat2` is missing.
pub(crate) fn open_dir_by_components(
    root: BorrowedFd<'_>,
    parts: &[&OsStr],
) -> Result<OwnedFd, Errno> {
    let mut dir = rustix::fs::openat(root, ".", DIR_HANDLE, Mode::empty())?;
    for part in parts {
        dir = rustix::fs::openat(&dir, *part, DIR_HANDLE | OFlags::NOFOLLOW, Mode::empty())?;
    }
    Ok(dir)
}

/// The plain components of a workspace-relative path; anything else (`..`, a root, a prefix)
/// is refused — [`Workspace::resolve`] never produces them.
/// The temporary name [`Workspace::replace_file`] writes `name`'s new content under: hidden,
/// short whatever `name`'s length, and the same for the same target (a crash's leftover is
/// replaced, not accumulated).
fn temp_name(name: &OsStr) -> OsString {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    OsString::from(format!(".keel-write-{hex}"))
}

fn components<'a>(rel: &'a Path, shown: &str) -> Result<Vec<&'a OsStr>, ToolsError> {
    let mut parts = Vec::new();
    for component in rel.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(ToolsError::PathRefused {
                    path: shown.to_owned(),
                    reason: "it is not a plain path inside the workspace".into(),
                });
            }
        }
    }
    Ok(parts)
}

/// `Ok` for a regular file; the matching refusal for anything else.
fn must_be_regular(shown: &str, kind: EntryKind) -> Result<(), ToolsError> {
    match kind {
        EntryKind::File => Ok(()),
        EntryKind::Dir => Err(problem(shown, FileProblem::IsDirectory)),
        // The checked path had its symlinks resolved: a symlink here appeared since.
        EntryKind::Symlink => Err(changed(shown)),
        other => Err(problem(
            shown,
            FileProblem::NotRegular {
                kind: other.described(),
            },
        )),
    }
}

/// Checks on the open handle that it is a regular file (the check that cannot be raced) and puts
/// it back in blocking mode.
fn regular_handle(shown: &str, fd: &OwnedFd) -> Result<rustix::fs::Stat, ToolsError> {
    let stat = rustix::fs::fstat(fd).map_err(|e| io_problem(shown, e))?;
    must_be_regular(shown, EntryKind::of_stat(&stat))?;
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| io_problem(shown, e))?;
    rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK).map_err(|e| io_problem(shown, e))?;
    Ok(stat)
}

/// The error for a failed open or stat of the final component `name` in `parent`.
fn final_error(shown: &str, e: Errno, parent: &OwnedFd, name: &OsStr) -> ToolsError {
    match e {
        Errno::LOOP | Errno::XDEV => changed(shown),
        Errno::NOENT => problem(shown, FileProblem::NotFound),
        Errno::ISDIR => problem(shown, FileProblem::IsDirectory),
        Errno::NOTDIR => match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if !is_dir_or_symlink(&stat) => problem(shown, FileProblem::NotDirectory),
            _ => changed(shown),
        },
        // A socket, a FIFO without a reader (opened for writing) or a device without a driver,
        // swapped in after the type check.
        Errno::NXIO | Errno::AGAIN | Errno::NODEV => {
            match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) if EntryKind::of_stat(&stat) != EntryKind::File => {
                    match must_be_regular(shown, EntryKind::of_stat(&stat)) {
                        Err(refusal) => refusal,
                        Ok(()) => io_problem(shown, e),
                    }
                }
                _ => io_problem(shown, e),
            }
        }
        e => io_problem(shown, e),
    }
}

/// The error for a failed open of the intermediate directory `part` (of `walked`) in `dir`.
fn parent_error(shown: &str, e: Errno, dir: &OwnedFd, part: &OsStr, walked: &Path) -> ToolsError {
    match e {
        Errno::LOOP | Errno::XDEV => changed(shown),
        // Unless it is (still) a non-directory, a symlink was swapped in (and maybe out again).
        Errno::NOTDIR => match rustix::fs::statat(dir, part, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if !is_dir_or_symlink(&stat) => problem(
                shown,
                FileProblem::Io(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!(
                        "`{}` is a file, not a directory",
                        walked
                            .components()
                            .map(|c| super::name_text(c.as_os_str()))
                            .collect::<Vec<_>>()
                            .join("/")
                    ),
                )),
            ),
            _ => changed(shown),
        },
        e => io_problem(shown, e),
    }
}

fn is_dir_or_symlink(stat: &rustix::fs::Stat) -> bool {
    matches!(
        EntryKind::of_stat(stat),
        EntryKind::Dir | EntryKind::Symlink
    )
}

/// The refusal for a path that changed between its check and its use.
fn changed(shown: &str) -> ToolsError {
    ToolsError::PathRefused {
        path: shown.to_owned(),
        reason: "it changed after it was checked: a symlink (or a file) now stands where a \
                 directory or file was. Files are opened beneath the workspace root and never \
                 through a symlink, so nothing outside the workspace was touched; look at the \
                 path again (list_dir) and retry"
            .into(),
    }
}

fn problem(shown: &str, problem: FileProblem) -> ToolsError {
    ToolsError::FileUse {
        path: shown.to_owned(),
        problem,
    }
}

fn io_problem(shown: &str, e: Errno) -> ToolsError {
    problem(shown, FileProblem::Io(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_component_fallback_refuses_a_symlinked_directory() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        let root = open_root(dir.path()).unwrap();
        assert!(open_dir_by_components(root.as_fd(), &[OsStr::new("real")]).is_ok());
        let err = open_dir_by_components(root.as_fd(), &[OsStr::new("link")]).unwrap_err();
        assert!(
            matches!(err, Errno::LOOP | Errno::NOTDIR),
            "a symlink component must be refused, got {err:?}"
        );
    }

    #[test]
    fn hash_regular_matches_the_core_bytes_hash() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &bytes).unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        assert_eq!(
            ws.hash_regular(Path::new("f"), "f", None).unwrap(),
            Some(keel_core::canonical::bytes_hash(&bytes))
        );
        let key = crate::keyed_hash::HashKey::derive(b"k", "test");
        assert_eq!(
            ws.hash_regular(Path::new("f"), "f", Some(&key)).unwrap(),
            Some(key.hash(&bytes))
        );
        assert_eq!(ws.hash_regular(Path::new("g"), "g", None).unwrap(), None);
    }

    #[test]
    fn dot_dot_is_refused_even_if_a_caller_passes_it() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let err = ws.open_read(Path::new("../etc/passwd"), "x").unwrap_err();
        assert!(matches!(err, ToolsError::PathRefused { .. }), "{err}");
    }
}
