//! Embedded, versioned schema migrations.
//!
//! Each migration is applied once, in order, inside one transaction that also records it in
//! `keel_migrations` with a checksum of its SQL. Opening a database refuses, with a typed error:
//! a migration version newer than this build knows (`SchemaTooNew`), and a recorded migration
//! whose checksum or name differs from this build's, or a gap in the history
//! (`MigrationMismatch`). Concurrent openers serialize on `BEGIN IMMEDIATE` (SQLite) or an
//! advisory transaction lock (PostgreSQL).

use keel_core::canonical::content_hash;
use serde_json::Value;
use sqlx::{AnyConnection, Connection, Row};

use super::{Dialect, now_ms};
use crate::error::{Result, StoreError};

/// One migration: SQL with `{blob}` standing for the dialect's binary column type.
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration this build knows, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "journal_and_owned_tables",
    sql: include_str!("../../migrations/0001_journal_and_owned_tables.sql"),
}];

fn checksum(m: &Migration) -> String {
    content_hash(&Value::String(m.sql.to_owned()))
}

/// Brings the connected database to the latest schema.
pub(crate) async fn run(conn: &mut AnyConnection, dialect: Dialect) -> Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS keel_migrations (\
           version BIGINT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *conn)
    .await?;
    let mut tx = match dialect {
        Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
        Dialect::Postgres => conn.begin().await?,
    };
    if dialect == Dialect::Postgres {
        sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext(current_schema()))::text")
            .execute(&mut *tx)
            .await?;
    }
    let applied =
        sqlx::query("SELECT version, name, checksum FROM keel_migrations ORDER BY version")
            .fetch_all(&mut *tx)
            .await?;
    let latest = MIGRATIONS.last().map(|m| m.version).unwrap_or(0);
    let mut applied_versions = Vec::new();
    for row in &applied {
        let version: i64 = row.try_get("version")?;
        let name: String = row.try_get("name")?;
        let sum: String = row.try_get("checksum")?;
        if version > latest {
            return Err(StoreError::SchemaTooNew {
                found: version,
                supported: latest,
            });
        }
        let Some(known) = MIGRATIONS.iter().find(|m| m.version == version) else {
            return Err(StoreError::MigrationMismatch {
                version,
                name,
                reason: "recorded in the database but unknown to this build".into(),
            });
        };
        if known.name != name || checksum(known) != sum {
            return Err(StoreError::MigrationMismatch {
                version,
                name,
                reason: format!(
                    "differs from this build's {:?} (checksum mismatch)",
                    known.name
                ),
            });
        }
        applied_versions.push(version);
    }
    let highest_applied = applied_versions.last().copied().unwrap_or(0);
    for m in MIGRATIONS {
        if applied_versions.contains(&m.version) {
            continue;
        }
        if m.version < highest_applied {
            return Err(StoreError::MigrationMismatch {
                version: m.version,
                name: m.name.to_owned(),
                reason: format!(
                    "missing from the database, which has later migration {highest_applied}"
                ),
            });
        }
        let sql = m.sql.replace("{blob}", dialect.blob_type());
        sqlx::raw_sql(&sql).execute(&mut *tx).await?;
        sqlx::query(&dialect.sql(
            "INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
        ))
        .bind(m.version)
        .bind(m.name)
        .bind(checksum(m))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
