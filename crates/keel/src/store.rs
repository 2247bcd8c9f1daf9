//! Opening the store a command works on, with errors a person can act on.

use std::sync::Arc;

use keel_core::TenantId;
use keel_store::{Store, StoreError};

use crate::config::mask_url_password;

/// The tenant of everything the local CLI creates: one fixed id, so that any `keel` process on
/// the same store sees the same sessions.
pub fn local_tenant() -> TenantId {
    TenantId(uuid::Uuid::from_u128(1))
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
