//! Opening the store a command works on, with errors a person can act on.

use std::sync::Arc;

use keel_core::TenantId;
use keel_store::{Store, StoreError};

use crate::config::mask_url_password;

/// The tenant of everything the local CLI creates: one fixed id, so that any `keel` process on
/// the same store sees the same sessions.
pub fn local_tenant() -> TenantId {
    TenantId::local()
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the SQLite file's write lock for longer than the busy timeout.
    #[error(
        "the store {location} is locked by another process ({detail}); wait for it to finish or use another --store"
    )]
    Locked {
        /// The store location (password masked).
        location: String,
        /// The database's message.
        detail: String,
    },
    /// The database was written by a newer keel.
    #[error(
        "the store {location} has schema version {found}, newer than this keel supports ({supported}); upgrade keel or use another --store"
    )]
    TooNew {
        /// The store location (password masked).
        location: String,
        /// Version in the database.
        found: i64,
        /// Version this build knows.
        supported: i64,
    },
    /// Anything else (unreachable server, unreadable file, …).
    #[error("cannot open the store {location}: {source}")]
    Other {
        /// The store location (password masked).
        location: String,
        /// The store's error.
        source: StoreError,
    },
}

/// Opens `location` (`sqlite://PATH`, a path, or `postgres://…`).
///
/// # Errors
/// [`OpenError`] naming the location.
pub async fn open(location: &str) -> Result<Arc<dyn Store>, OpenError> {
    guard_directory(location);
    let shown = mask_url_password(location);
    keel_store::open(location).await.map_err(|e| match e {
        StoreError::Locked(detail) => OpenError::Locked {
            location: shown,
            detail,
        },
        StoreError::SchemaTooNew { found, supported } => OpenError::TooNew {
            location: shown,
            found,
            supported,
        },
        source => OpenError::Other {
            location: shown,
            source,
        },
    })
}

/// The directory of a SQLite store, checked before it is opened: keel's own data directory
/// (`$XDG_DATA_HOME/keel`, which holds the default store and `seal.key`) is narrowed to 0700
/// when group or others may enter it, as the store file is narrowed to 0600; any other
/// directory is left as it is, with a warning when everyone may write it (without the sticky
/// bit: anyone could replace the database). Both are said on standard error. Nothing for PostgreSQL.
fn guard_directory(location: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = match location.split_once("://") {
        Some(("sqlite", rest)) => rest,
        Some(_) => return,
        None => location,
    };
    let path = path.split('?').next().unwrap_or(path);
    let Some(dir) = std::path::Path::new(path).parent() else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    let Ok(meta) = std::fs::metadata(dir) else {
        return; // created 0700 by the store
    };
    let mode = meta.permissions().mode() & 0o7777;
    let own = crate::config::Locations::from_env()
        .data_dir
        .and_then(|d| std::fs::canonicalize(d).ok())
        .zip(std::fs::canonicalize(dir).ok())
        .is_some_and(|(data, dir)| data == dir);
    if own && mode & 0o077 != 0 {
        match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
            Ok(()) => eprintln!(
                "keel: narrowed {} from {:o} to 0700: it holds the session store and the seal key",
                dir.display(),
                mode & 0o777
            ),
            Err(e) => eprintln!(
                "keel: warning: {} is mode {:o}, and it holds the session store and the seal key; narrowing it to 0700 failed: {e}",
                dir.display(),
                mode & 0o777
            ),
        }
    } else if !own && mode & 0o002 != 0 && mode & 0o1000 == 0 {
        eprintln!(
            "keel: warning: the store's directory {} is writable by everyone (mode {:o}): anyone could replace the database; chmod o-w it or choose another --store",
            dir.display(),
            mode & 0o777
        );
    }
}

/// Environment variable naming the deployment's seal-key file (default: `seal.key` in the user
/// data directory, `$XDG_DATA_HOME/keel`).
pub const SEAL_KEY_ENV: &str = "KEEL_SEAL_KEY_FILE";

/// The key the runtime seals the exact arguments of unfinished calls with
/// ([`keel_runtime::seal`]): read from `$KEEL_SEAL_KEY_FILE` or `seal.key` in the user data
/// directory, created there (0600, in a 0700 directory) on first use. Every `keel` process on
/// the same store must use the same file, so an approved call can run after a restart. Without
/// a data directory the key lives only in this process.
///
/// # Errors
/// A key file that cannot be read or created, is not 32 bytes, or others can read.
pub fn seal_key() -> anyhow::Result<keel_runtime::seal::SealKey> {
    let path = match std::env::var_os(SEAL_KEY_ENV).filter(|p| !p.is_empty()) {
        Some(p) => std::path::PathBuf::from(p),
        None => match crate::config::Locations::from_env().data_dir {
            Some(dir) => dir.join("seal.key"),
            None => return Ok(keel_runtime::seal::SealKey::ephemeral()),
        },
    };
    Ok(keel_runtime::seal::SealKey::load_or_create(&path)?)
}
