//! Reading the files keel loads by path — the user config, a workspace's `keel.toml` and
//! `AGENTS.md`, `server.toml`, scripted-model files, the seal key — so that no file placed there
//! can hang keel or exhaust its memory. A repository controls its `keel.toml` and `AGENTS.md`:
//! it can make either a FIFO (a plain read blocks forever), a symlink to `/dev/zero` (a plain
//! read never ends) or a huge file. [`read_regular_file`] is the one way keel reads them.

use std::io::Read;
use std::path::Path;

/// The most keel reads from a configuration file (`keel.toml`, `server.toml`) or an
/// `AGENTS.md`, in bytes: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The most keel reads from a scripted-model file, in bytes: 64 MiB.
pub const MAX_SCRIPT_BYTES: u64 = 64 * 1024 * 1024;

/// The content of the regular file at `path` (a symlink is followed to it), at most `limit`
/// bytes. The type is checked before the file is opened (opening a device can have effects of
/// its own) and again on the open handle, which cannot be raced; the open never blocks (a FIFO
/// swapped in between is refused on the handle, not waited on).
///
/// # Errors
/// The I/O error (`NotFound` when there is no file); `InvalidInput` for anything that is not a
/// regular file (`it is a FIFO, not a regular file; keel reads only regular files here`);
/// `FileTooLarge` past `limit` (`it is larger than 1 MiB (1048576 bytes), the most keel reads
/// from such a file`). Callers name the path.
pub fn read_regular_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    read_checked(path, limit, true)
}

/// As [`read_regular_file`], but a symlink at `path` is refused, not followed (checked before
/// the open, and the open itself uses `O_NOFOLLOW`, so a symlink swapped in is refused too):
/// for files a repository controls by name — its `.keel/agents/*.md` and `.keel/commands/*.md`
/// — which must not turn into `~/.ssh/id_rsa` by a link.
///
/// # Errors
/// As [`read_regular_file`]; `InvalidInput` (`it is a symlink, not a regular file; …`) for a
/// symlink.
pub fn read_regular_file_nofollow(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    read_checked(path, limit, false)
}

fn read_checked(path: &Path, limit: u64, follow: bool) -> std::io::Result<Vec<u8>> {
    let meta = if follow {
        std::fs::metadata(path)?
    } else {
        std::fs::symlink_metadata(path)?
    };
    check_type(&meta)?;
    let file = open_nonblocking(path, follow)?;
    let meta = file.metadata()?;
    check_type(&meta)?;
    if meta.len() > limit {
        return Err(too_large(limit));
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// As [`read_regular_file`], with `None` when there is no file.
///
/// # Errors
/// As [`read_regular_file`], except `NotFound`.
pub fn read_regular_file_if_present(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    match read_regular_file(path, limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn open_nonblocking(path: &Path, follow: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    if !follow {
        flags |= rustix::fs::OFlags::NOFOLLOW;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path, _follow: bool) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

fn check_type(meta: &std::fs::Metadata) -> std::io::Result<()> {
    let file_type = meta.file_type();
    if file_type.is_file() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "it is {}, not a regular file; keel reads only regular files here",
            kind_name(&file_type)
        ),
    ))
}

/// What a file of `file_type` is, for a message: `a directory`, `a FIFO`, `a socket`,
/// `a character device`, `a block device`, `a symlink`, `a special file`, `a regular file`.
pub(crate) fn kind_name(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_file() {
        return "a regular file";
    }
    if file_type.is_dir() {
        return "a directory";
    }
    if file_type.is_symlink() {
        return "a symlink";
    }
    #[cfg(unix)]
    {
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
    }
    "a special file"
}

fn too_large(limit: u64) -> std::io::Error {
    let shown = if limit.is_multiple_of(1024 * 1024) {
        format!("{} MiB ({limit} bytes)", limit / (1024 * 1024))
    } else {
        format!("{limit} bytes")
    };
    std::io::Error::new(
        std::io::ErrorKind::FileTooLarge,
        format!("it is larger than {shown}, the most keel reads from such a file"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_are_read_and_everything_else_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keel.toml");
        std::fs::write(&file, "model = \"x\"\n").unwrap();
        assert_eq!(read_regular_file(&file, 100).unwrap(), b"model = \"x\"\n");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular_file(&link, 100).unwrap().len(), 12);
        let e = read_regular_file_nofollow(&link, 100).unwrap_err();
        assert!(e.to_string().contains("a symlink"), "{e}");
        assert_eq!(read_regular_file_nofollow(&file, 100).unwrap().len(), 12);
        let err = read_regular_file(&file, 5).unwrap_err();
        assert!(err.to_string().contains("larger than 5 bytes"), "{err}");

        let fifo = dir.path().join("fifo.toml");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = read_regular_file(&fifo, MAX_CONFIG_BYTES).unwrap_err();
        assert!(
            err.to_string().contains("it is a FIFO, not a regular file"),
            "{err}"
        );
        let zero = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read_regular_file(&zero, MAX_CONFIG_BYTES).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let err = read_regular_file(dir.path(), MAX_CONFIG_BYTES).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        assert!(
            read_regular_file_if_present(&dir.path().join("none"), 1)
                .unwrap()
                .is_none()
        );
    }
}
