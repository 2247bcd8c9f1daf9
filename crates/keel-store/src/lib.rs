//! # keel-store — durable storage for Keel
//!
//! **Owns:** the [`Store`] trait and its backends ([`SqlStore`] over SQLite, the embedded default,
//! and PostgreSQL, the shared store for many workers), the embedded schema migrations, the journal
//! append with compare-and-set versions and lease fencing, SQLite group commit, wake-ups
//! (LISTEN/NOTIFY, polling), and everything sessions own: effects, approvals, transcript items,
//! tenant memory, tenant usage totals and budget reservations, artifacts and releases; side-table writes that commit with
//! an append ([`AppendExtras`]) and per-handle commit counts ([`CommitCounts`]).
//!
//! **Must not touch:** session semantics (what an event means is `keel_core::SessionState::apply`'s
//! business — the store only records, orders and fences), model or tool I/O, scheduling policy.
//!
//! ## Layout
//! - [`store`] — the [`Store`] trait: start reading here.
//! - [`sql`] — [`SqlStore`], one implementation for both dialects; group commit and migrations.
//! - [`types`] — records other than events ([`SessionRecord`], [`Lease`], [`EffectRecord`], …).
//! - [`error`] — [`StoreError`], one enum for the crate.
//!
//! ## Opening a store
//! [`open`] takes `sqlite://PATH` (or a bare path) or `postgres://…`.

pub mod error;
pub mod scheduling;
pub mod sql;
pub mod store;
pub mod types;

use std::path::Path;
use std::sync::Arc;

pub use error::{Result, StoreError};
pub use scheduling::{Claim, TenantBacklog, TokenWindow, WorkMark};
pub use sql::{Dialect, SqlStore};
pub use store::{MAX_MEMORY_NAMESPACES, RENEW_BATCH, Store};
pub use types::{
    ApiKeyRecord, AppendExtras, ApprovalQuery, Artifact, ArtifactInfo, CommitCounts, DueSession,
    EffectInsert, EffectRecord, EffectUpdate, IdempotencyBegin, IdempotencyKey, Intent, KeyScope,
    Lease, LeaseInfo, MemoryEntry, NewApiKey, NewSession, ReleaseRecord, Reservation,
    ReservationRow, Role, SealedKey, SealedKind, SessionQuery, SessionRecord, StoredResponse,
    TenantRecord, TranscriptItem, UsageAmount, UsageDelta, UsageReservation, UsageRow,
};

/// Opens a store from a location: `postgres://…` / `postgresql://…` (optionally with
/// `?keel_schema=NAME` to use a schema), `sqlite://PATH`, or a plain file path (SQLite).
///
/// # Errors
/// As [`SqlStore::open_sqlite`] and [`SqlStore::connect_postgres`].
pub async fn open(location: &str) -> Result<Arc<dyn Store>> {
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        let (url, schema) = split_schema(location);
        Ok(Arc::new(
            SqlStore::connect_postgres(&url, schema.as_deref()).await?,
        ))
    } else {
        let path = location.strip_prefix("sqlite://").unwrap_or(location);
        Ok(Arc::new(SqlStore::open_sqlite(Path::new(path)).await?))
    }
}

/// Splits a `keel_schema=NAME` query parameter off a PostgreSQL URL.
fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("keel_schema=") {
            Some(s) => {
                schema = Some(s.to_owned());
                false
            }
            None => true,
        })
        .collect();
    if rest.is_empty() {
        (base.to_owned(), schema)
    } else {
        (format!("{base}?{}", rest.join("&")), schema)
    }
}

#[cfg(test)]
mod tests {
    use super::split_schema;

    #[test]
    fn schema_parameter_is_split_off() {
        assert_eq!(
            split_schema("postgres://h/db"),
            ("postgres://h/db".into(), None)
        );
        assert_eq!(
            split_schema("postgres://h/db?keel_schema=t1&sslmode=disable"),
            ("postgres://h/db?sslmode=disable".into(), Some("t1".into()))
        );
        assert_eq!(
            split_schema("postgres://h/db?keel_schema=t1"),
            ("postgres://h/db".into(), Some("t1".into()))
        );
    }
}
