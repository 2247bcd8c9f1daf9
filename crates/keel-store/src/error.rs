//! The store's one error type.

use chrono::{DateTime, Utc};
use keel_core::{
    ApprovalError, EventDecodeError, LeaseEpoch, SessionId, TransitionError, UnknownState,
};

/// Everything a [`crate::Store`] call can fail with. Variants name the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such entity for this tenant (a session of another tenant is reported the same way).
    #[error("{entity} {id} not found")]
    NotFound {
        /// `session`, `effect`, `approval`, `artifact`, `release`.
        entity: &'static str,
        /// The id that was asked for.
        id: String,
    },
    /// The disk holding the store is full (SQLite `SQLITE_FULL`, PostgreSQL `53100
    /// disk_full`): nothing of the failed write was committed. `location` names the database
    /// file (or server) when known.
    #[error(
        "the disk is full: cannot write {location} ({detail}); free some space, then try again (nothing committed was lost)"
    )]
    DiskFull {
        /// The store file or server, or "the store".
        location: String,
        /// The database's message.
        detail: String,
    },
    /// Compare-and-set failed: the journal moved since the caller read it. Nothing was written.
    #[error("session {session}: stale version {expected}, the journal is at {actual}")]
    StaleVersion {
        /// The session.
        session: SessionId,
        /// The version the caller expected.
        expected: u64,
        /// The version in the store.
        actual: u64,
    },
    /// The caller's lease is no longer the current one (it expired and was taken over, or was
    /// released). Nothing was written.
    #[error("session {session}: lease epoch {held} is no longer current (current epoch {current}{})", owner.as_ref().map(|o| format!(", held by {o}")).unwrap_or_default())]
    LeaseLost {
        /// The session.
        session: SessionId,
        /// The epoch the caller presented.
        held: LeaseEpoch,
        /// The current epoch.
        current: LeaseEpoch,
        /// The current holder, if any.
        owner: Option<String>,
    },
    /// Another owner holds an unexpired lease.
    #[error("session {session} is leased by {owner} until {expires_at}")]
    LeaseHeld {
        /// The session.
        session: SessionId,
        /// The holder.
        owner: String,
        /// When the lease expires unless renewed.
        expires_at: DateTime<Utc>,
    },
    /// A conditional write found another state than it required (e.g. an effect that is no longer
    /// in the status the caller moved it from, a transcript index holding a different item).
    #[error("conflict: {0}")]
    Conflict(String),
    /// An append that consumes an intent ([`crate::AppendExtras::consume_intent`]) found the
    /// intent row gone: its poster withdrew it (and answered its caller "busy") or another
    /// handler consumed it. Nothing of the append was written; the handler must drop the
    /// intent without acting on it.
    #[error(
        "session {session}: intent {intent_id} is gone (withdrawn by its poster or taken by another handler); nothing was appended"
    )]
    IntentGone {
        /// The session.
        session: SessionId,
        /// The intent the append was to consume.
        intent_id: String,
    },
    /// An append that dispatches an effect for the first time ([`crate::AppendExtras::claims`])
    /// found the key's row already past `prepared` (or held by another session): a dispatch the
    /// session's journal lacks. Nothing of the append was written; the caller must not run the
    /// effect (its outcome is unknown to this journal).
    #[error(
        "effect {key} was already dispatched by another writer (its row is past `prepared`); nothing was appended"
    )]
    EffectClaimed {
        /// The operation key.
        key: String,
    },
    /// An illegal state transition was asked for.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// An approval decision was refused.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
    /// The caller passed something malformed (non-contiguous seqs, an event of another session…).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A stored event cannot be read back.
    #[error("corrupt journal row: {0}")]
    CorruptEvent(#[from] EventDecodeError),
    /// A stored row (not an event) cannot be read back.
    #[error("corrupt {table} row {id}: {reason}")]
    CorruptRow {
        /// The table.
        table: &'static str,
        /// The row's key.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// The database was written by a newer Keel.
    #[error(
        "store schema version {found} is newer than this build supports ({supported}); upgrade keel"
    )]
    SchemaTooNew {
        /// Highest migration applied in the database.
        found: i64,
        /// Highest migration this build knows.
        supported: i64,
    },
    /// The database's migration history does not match this build's (a migration is missing or
    /// was changed).
    #[error("store migration {version} ({name}): {reason}")]
    MigrationMismatch {
        /// Migration version.
        version: i64,
        /// Its name.
        name: String,
        /// What differs.
        reason: String,
    },
    /// The database is locked by another process for longer than the busy timeout.
    #[error("the store is locked by another process: {0}")]
    Locked(String),
    /// Any other database or connection error.
    #[error("database error: {0}")]
    Database(sqlx::Error),
}

impl StoreError {
    /// Whether this is the connection pool's acquire timeout: every pooled connection stayed
    /// in use (overload, not a fault; hosts answer "busy, retry").
    #[must_use]
    pub fn is_pool_timeout(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::PoolTimedOut))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let msg = db.message();
            if msg.contains("database is locked") || msg.contains("database is busy") {
                return StoreError::Locked(msg.to_owned());
            }
            if msg.contains("database or disk is full")
                || db.code().as_deref() == Some("13")
                || db.code().as_deref() == Some("53100")
            {
                return StoreError::DiskFull {
                    location: "the store".into(),
                    detail: msg.to_owned(),
                };
            }
        }
        StoreError::Database(e)
    }
}

impl From<rusqlite::Error> for StoreError {
    /// The SQLite writer thread's errors (`src/sql/sqlite_writer.rs`), classified as sqlx's are:
    /// `SQLITE_BUSY` / `SQLITE_LOCKED` are `Locked`, `SQLITE_FULL` is `DiskFull`; any other
    /// error is `Database`, carrying SQLite's message and extended result code.
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        if let rusqlite::Error::SqliteFailure(f, msg) = &e {
            let msg = msg.clone().unwrap_or_else(|| f.to_string());
            match f.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                    return StoreError::Locked(msg);
                }
                ErrorCode::DiskFull => {
                    return StoreError::DiskFull {
                        location: "the store".into(),
                        detail: msg,
                    };
                }
                _ => {}
            }
        }
        StoreError::Database(sqlx::Error::Database(Box::new(SqliteWriterError(e))))
    }
}

/// An error of the SQLite writer thread's connection (rusqlite), as a database error of sqlx's
/// kind so that [`StoreError::Database`] carries it with its message and code.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SqliteWriterError(rusqlite::Error);

impl sqlx::error::DatabaseError for SqliteWriterError {
    fn message(&self) -> &str {
        match &self.0 {
            rusqlite::Error::SqliteFailure(_, Some(msg)) => msg,
            _ => "SQLite error",
        }
    }

    /// SQLite's extended result code (<https://www.sqlite.org/rescode.html>), as sqlx reports it.
    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        match &self.0 {
            rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code.to_string().into()),
            _ => None,
        }
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use rusqlite::ffi;
        use sqlx::error::ErrorKind;
        match &self.0 {
            rusqlite::Error::SqliteFailure(f, _) => match f.extended_code {
                ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                    ErrorKind::UniqueViolation
                }
                ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
                ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
                ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
                _ => ErrorKind::Other,
            },
            _ => ErrorKind::Other,
        }
    }
}

impl From<UnknownState> for StoreError {
    fn from(e: UnknownState) -> Self {
        StoreError::CorruptRow {
            table: "status",
            id: e.name.clone(),
            reason: e.to_string(),
        }
    }
}

/// Shorthand.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
