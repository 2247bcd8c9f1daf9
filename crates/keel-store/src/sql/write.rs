//! How the store writes: the connection a write takes (SQLite's one writer, or a pooled
//! PostgreSQL connection), its transaction, the disk-full error naming the store, and the
//! count of committed writes ([`crate::Store::commits`]).

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, Connection};

use super::{Dialect, SqlStore, group_commit};
use crate::error::{Result, StoreError};

/// The counters behind [`CommitCounts`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) journal: AtomicU64,
    pub(super) journal_row_columns: AtomicU64,
    pub(super) tables: AtomicU64,
    pub(super) leases: AtomicU64,
}

/// Which [`CommitCounts`] counter a committed write adds to.
#[derive(Clone, Copy)]
pub(super) enum Commit {
    Journal,
    Tables,
    Leases,
}

/// A connection to write on: SQLite's writer, or a pooled PostgreSQL connection.
pub(super) enum WriteConn {
    Writer(tokio::sync::OwnedMutexGuard<AnyConnection>),
    Pooled(PoolConnection<Any>),
}

impl std::ops::Deref for WriteConn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            WriteConn::Writer(g) => g,
            WriteConn::Pooled(c) => c,
        }
    }
}

impl std::ops::DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            WriteConn::Writer(g) => &mut *g,
            WriteConn::Pooled(c) => &mut *c,
        }
    }
}

impl SqlStore {
    /// Counts one committed write (called once per write call, after its commit).
    pub(super) fn committed(&self, kind: Commit) {
        let c = &self.inner.commits;
        let counter = match kind {
            Commit::Journal => &c.journal,
            Commit::Tables => &c.tables,
            Commit::Leases => &c.leases,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection to write on: SQLite's one writer (no transaction left open on it), or
    /// one from the PostgreSQL pool.
    pub(super) async fn write_conn(&self) -> Result<WriteConn> {
        match &self.inner.writer {
            Some(w) => {
                let mut guard = w.clone().lock_owned().await;
                group_commit::ensure_no_transaction(&mut guard, &self.inner.pool).await;
                Ok(WriteConn::Writer(guard))
            }
            None => Ok(WriteConn::Pooled(self.inner.pool.acquire().await?)),
        }
    }

    /// `e`, naming this store's file or server when it says the disk is full.
    pub(super) fn located(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::DiskFull { detail, .. } => StoreError::DiskFull {
                location: self.inner.location.clone(),
                detail,
            },
            other => other,
        }
    }

    /// Begins a write transaction: `BEGIN IMMEDIATE` on SQLite (the write lock at once).
    pub(super) async fn begin<'c>(
        &self,
        conn: &'c mut AnyConnection,
    ) -> Result<sqlx::Transaction<'c, Any>> {
        Ok(match self.inner.dialect {
            Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => conn.begin().await?,
        })
    }
}
