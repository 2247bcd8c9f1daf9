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
use sqlx::{AnyConnection, Connection, Executor, Row};

use super::{Dialect, now_ms};
use crate::error::{Result, StoreError};

/// One migration: SQL with `{blob}` standing for the dialect's binary column type.
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: MigrationSql,
}

/// A migration's SQL: one text for both dialects, or one per dialect where they cannot share it
/// (full-text search: FTS5 on SQLite, tsvector on PostgreSQL). The checksum recorded is of the
/// text the database ran.
pub(crate) enum MigrationSql {
    /// The same SQL on SQLite and PostgreSQL.
    Both(&'static str),
    /// Dialect-specific SQL.
    PerDialect {
        sqlite: &'static str,
        postgres: &'static str,
    },
}

impl Migration {
    /// The SQL `dialect` runs (before `{blob}` is replaced).
    fn sql_for(&self, dialect: Dialect) -> &'static str {
        match (&self.sql, dialect) {
            (MigrationSql::Both(sql), _) => sql,
            (MigrationSql::PerDialect { sqlite, .. }, Dialect::Sqlite) => sqlite,
            (MigrationSql::PerDialect { postgres, .. }, Dialect::Postgres) => postgres,
        }
    }
}

/// Every migration this build knows, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "journal_and_owned_tables",
        sql: MigrationSql::Both(include_str!(
            "../../migrations/0001_journal_and_owned_tables.sql"
        )),
    },
    Migration {
        version: 2,
        name: "intents",
        sql: MigrationSql::Both(include_str!("../../migrations/0002_intents.sql")),
    },
    Migration {
        version: 3,
        name: "usage",
        sql: MigrationSql::Both(include_str!("../../migrations/0003_usage.sql")),
    },
    Migration {
        version: 4,
        name: "sealed_arguments",
        sql: MigrationSql::Both(include_str!("../../migrations/0004_sealed_arguments.sql")),
    },
    Migration {
        version: 5,
        name: "usage_reservations",
        sql: MigrationSql::Both(include_str!("../../migrations/0005_usage_reservations.sql")),
    },
    Migration {
        version: 6,
        name: "sealed_items",
        sql: MigrationSql::Both(include_str!("../../migrations/0006_sealed_items.sql")),
    },
    Migration {
        version: 7,
        name: "api_access",
        sql: MigrationSql::Both(include_str!("../../migrations/0007_api_access.sql")),
    },
    Migration {
        version: 8,
        name: "workspace_claims",
        sql: MigrationSql::Both(include_str!("../../migrations/0008_workspace_claims.sql")),
    },
    Migration {
        version: 9,
        name: "scheduling",
        sql: MigrationSql::Both(include_str!("../../migrations/0009_scheduling.sql")),
    },
    Migration {
        version: 10,
        name: "memory_search",
        sql: MigrationSql::PerDialect {
            sqlite: include_str!("../../migrations/0010_memory_search.sqlite.sql"),
            postgres: include_str!("../../migrations/0010_memory_search.postgres.sql"),
        },
    },
];

fn checksum(m: &Migration, dialect: Dialect) -> String {
    content_hash(&Value::String(m.sql_for(dialect).to_owned()))
}

/// Brings the connected database to the latest schema; returns the connection.
///
/// (Statements run through `Executor::execute`, not `sqlx::raw_sql`: the latter makes the future
/// fail `Send` for a borrowed connection, so a store could not be opened inside `tokio::spawn`.)
pub(crate) async fn run(mut conn: AnyConnection, dialect: Dialect) -> Result<AnyConnection> {
    migrate(&mut conn, dialect).await?;
    Ok(conn)
}

/// PostgreSQL: under one session-level advisory lock (so processes opening the same fresh database
/// at once take turns instead of racing on the catalog), creates `schema` if given, switches to it
/// with `search_path` (`SET search_path …`), migrates, unlocks and closes the connection.
pub(crate) async fn setup_postgres(
    mut conn: AnyConnection,
    schema: Option<&str>,
    search_path: Option<&'static str>,
) -> Result<()> {
    conn.execute("SELECT pg_advisory_lock(7365415)::text")
        .await?;
    let create = schema.map(|s| format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
    let mut setup = Ok(());
    if let (Some(create), Some(sp)) = (&create, search_path) {
        setup = conn.execute(create.as_str()).await.map(|_| ());
        if setup.is_ok() {
            setup = conn.execute(sp).await.map(|_| ());
        }
    }
    let setup = match setup {
        Ok(()) => migrate(&mut conn, Dialect::Postgres).await,
        Err(e) => Err(e.into()),
    };
    let unlock = conn
        .execute("SELECT pg_advisory_unlock(7365415)::text")
        .await;
    setup?;
    unlock?;
    conn.close().await?;
    Ok(())
}

async fn migrate(conn: &mut AnyConnection, dialect: Dialect) -> Result<()> {
    conn.execute(
        "CREATE TABLE IF NOT EXISTS keel_migrations (\
           version BIGINT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await?;
    let mut tx = match dialect {
        Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
        Dialect::Postgres => conn.begin().await?,
    };
    if dialect == Dialect::Postgres {
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))::text")
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
            if keel_core::mechanisms::is_off(keel_core::mechanisms::Mechanism::SchemaVersionCheck) {
                continue;
            }
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
        if known.name != name || checksum(known, dialect) != sum {
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
        let sql = m.sql_for(dialect).replace("{blob}", dialect.blob_type());
        tx.execute(sql.as_str()).await?;
        sqlx::query(&dialect.sql(
            "INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
        ))
        .bind(m.version)
        .bind(m.name)
        .bind(checksum(m, dialect))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
