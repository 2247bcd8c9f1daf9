//! The embedded store's file: made private (0700 directory, 0600 file) and checked to be a
//! SQLite database before the pool opens it, and its path written as a `sqlite://` URL.

use std::path::Path;

use crate::error::{Result, StoreError};

/// The first 16 bytes of every SQLite 3 database file (<https://www.sqlite.org/fileformat.html>).
pub(super) const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Makes `path` ready to be a private store: its missing directories are created 0700, the
/// file itself 0600 (an existing one is narrowed to 0600; SQLite gives its `-wal` and `-shm`
/// files the database file's mode). A file that exists, is not empty and does not start with
/// the SQLite header is refused at once, instead of a pool time-out later.
pub(super) fn prepare_sqlite_file(path: &Path) -> Result<()> {
    let invalid = |what: String| StoreError::InvalidInput(format!("{}: {what}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(|e| {
            StoreError::InvalidInput(format!("cannot create {}: {e}", dir.display()))
        })?;
    }
    match std::fs::File::open(path) {
        Ok(mut f) => {
            use std::io::Read;
            let meta = f.metadata().map_err(|e| invalid(e.to_string()))?;
            if meta.is_dir() {
                return Err(invalid("is a directory, not a SQLite database file".into()));
            }
            let mut head = [0u8; 16];
            let mut got = 0;
            while got < head.len() {
                match f.read(&mut head[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(invalid(format!("cannot read it: {e}"))),
                }
            }
            if got > 0 && (got < head.len() || &head != SQLITE_MAGIC) {
                return Err(invalid(
                    "is not a SQLite database (its first bytes are not the SQLite header); \
                     name another store file"
                        .into(),
                ));
            }
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                if meta.permissions().mode() & 0o077 != 0 {
                    // Best effort: a file we may read but not chmod stays as it is.
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            match o.open(path) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(invalid(format!("cannot create it: {e}"))),
            }
        }
        Err(e) => Err(invalid(format!("cannot open it: {e}"))),
    }
}

/// Percent-encodes a file path for a `sqlite://` URL (everything but `[A-Za-z0-9/._-]`), so `?`,
/// `%`, `#` and spaces in paths name the file they say.
pub(super) fn percent_encode_path(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
