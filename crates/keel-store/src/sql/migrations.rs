//! Embedded, versioned schema migrations.
//!
//! Each migration is applied once, in order, inside one transaction that also records it in
//! `keel_migrations` with a checksum of its SQL. Opening a database refuses, with a typed error:
//! a migration version newer than this build knows (`SchemaTooNew`), and a recorded migration
//! whose checksum or name differs from this build's, or a gap in the history
//! (`MigrationMismatch`). Concurrent openers serialize on `BEGIN IMMEDIATE` (SQLite) or an
//! advisory transaction lock (PostgreSQL).
//!
//! **A fresh SQLite database** (no table but `keel_migrations`, nothing recorded) is given the
//! schema the migrations would leave in one script, [`SQLITE_SCHEMA`], and the migrations it
//! holds are recorded as applied, in the same transaction (any later one is replayed).
//! Replaying the history (tables rebuilt, columns added with `ALTER TABLE`, each of which
//! makes SQLite parse the whole schema again) was half of a first `keel run`'s instructions
//! (docs/BENCHMARKS.md, "Cold start and take-over"). The script is generated from the
//! migrations, and a test checks that both paths leave the same database: schema, rows (the
//! FTS5 index's shadow tables included) and the migrations recorded.

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

/// The schema every migration of [`MIGRATIONS`] leaves in an SQLite database, as SQLite records
/// it (`sqlite_master.sql` in creation order, without `keel_migrations`, SQLite's automatic
/// indexes and the shadow tables the FTS5 table makes itself). Generated, never edited:
/// `KEEL_BLESS=1 cargo test -p keel-store fresh_sqlite` rewrites it after a migration is added.
pub(crate) const SQLITE_SCHEMA: &str = include_str!("../../migrations/schema.sqlite.sql");

/// The last migration [`SQLITE_SCHEMA`] holds: a fresh database is given the script and
/// migrations up to this one are recorded as applied; any later one is then replayed as usual
/// (so a script not yet regenerated after a new migration is still correct, only slower). The
/// test that checks the script checks this too.
const SQLITE_SCHEMA_VERSION: i64 = 10;

/// How [`migrate`] brings a fresh SQLite database to the latest schema.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fresh {
    /// [`SQLITE_SCHEMA`] in one script (what opening a store does).
    Squashed,
    /// Every migration in turn, as for a database that has some (tests compare the two).
    Replayed,
}

/// The checksum recorded for a migration: [`content_hash`] of the text `dialect` runs.
fn computed_checksum(m: &Migration, dialect: Dialect) -> String {
    content_hash(&Value::String(m.sql_for(dialect).to_owned()))
}

/// [`computed_checksum`] of every migration, `[SQLite, PostgreSQL]` by version (from 1),
/// written out: hashing the migrations' 16 KB of SQL on every open was 5 % of a one-step
/// `keel run`'s instructions. A test checks each against its migration and prints the table
/// to paste when one is added.
const CHECKSUMS: &[[&str; 2]] = &[
    [
        "sha256:8b27b7cdf52a8666d9f05ff841a3bc1c751313d0f451e8954f972e2bd967245a",
        "sha256:8b27b7cdf52a8666d9f05ff841a3bc1c751313d0f451e8954f972e2bd967245a",
    ],
    [
        "sha256:a06d49a42aa782a71a21995f484c36333f1728e2e074bb89eed1db41daee60ff",
        "sha256:a06d49a42aa782a71a21995f484c36333f1728e2e074bb89eed1db41daee60ff",
    ],
    [
        "sha256:413406ae7ef68c9c67b7985880450411380b18592873a35b0530c1832cd45633",
        "sha256:413406ae7ef68c9c67b7985880450411380b18592873a35b0530c1832cd45633",
    ],
    [
        "sha256:3245e63b52cea878cb422533be1c2eaa66f4cfe6545046ca1e50104c5d35bd8f",
        "sha256:3245e63b52cea878cb422533be1c2eaa66f4cfe6545046ca1e50104c5d35bd8f",
    ],
    [
        "sha256:274f38947f5cb9fdf6a0793d36a927920ee09dd7f40d48509f1c6a8eef5c7d60",
        "sha256:274f38947f5cb9fdf6a0793d36a927920ee09dd7f40d48509f1c6a8eef5c7d60",
    ],
    [
        "sha256:0aad580020371b3e4b7d2d96e4c60837d0a4dd9edb895d22afe75a18d54c5d6b",
        "sha256:0aad580020371b3e4b7d2d96e4c60837d0a4dd9edb895d22afe75a18d54c5d6b",
    ],
    [
        "sha256:4a996e20c62229dc4628083150f4a27dfea8037a2aaafc8ff166a56501c07465",
        "sha256:4a996e20c62229dc4628083150f4a27dfea8037a2aaafc8ff166a56501c07465",
    ],
    [
        "sha256:18d8592ae7b618348ebe40d92e5f9c6a575d5a9ef7150dc291b3c300ae1ad8f3",
        "sha256:18d8592ae7b618348ebe40d92e5f9c6a575d5a9ef7150dc291b3c300ae1ad8f3",
    ],
    [
        "sha256:b8d1a538820b2afbdeed744eff363f49a9ebc2948e937f2a22ccca3b21c13146",
        "sha256:b8d1a538820b2afbdeed744eff363f49a9ebc2948e937f2a22ccca3b21c13146",
    ],
    [
        "sha256:93ae6ce8a1d179e70c3654a3a46d0e743bc5054555547bd4c944fa98cd626089",
        "sha256:930ec2b1a441ab5e2ef21263b08d83a7aa3e6b51d3c439570c61a5de0ce36fe0",
    ],
];

/// The checksum of `m` on `dialect` ([`CHECKSUMS`], computed for a migration not listed).
fn checksum(m: &Migration, dialect: Dialect) -> std::borrow::Cow<'static, str> {
    let column = usize::from(dialect == Dialect::Postgres);
    usize::try_from(m.version - 1)
        .ok()
        .and_then(|i| CHECKSUMS.get(i))
        .map_or_else(
            || computed_checksum(m, dialect).into(),
            |sums| sums[column].into(),
        )
}

/// Brings the connected database to the latest schema; returns the connection.
///
/// (Statements run through `Executor::execute`, not `sqlx::raw_sql`: the latter makes the future
/// fail `Send` for a borrowed connection, so a store could not be opened inside `tokio::spawn`.)
pub(crate) async fn run(mut conn: AnyConnection, dialect: Dialect) -> Result<AnyConnection> {
    migrate(&mut conn, dialect, Fresh::Squashed).await?;
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
        Ok(()) => migrate(&mut conn, Dialect::Postgres, Fresh::Replayed).await,
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

pub(crate) async fn migrate(
    conn: &mut AnyConnection,
    dialect: Dialect,
    fresh: Fresh,
) -> Result<()> {
    let mut tx = match dialect {
        Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
        Dialect::Postgres => conn.begin().await?,
    };
    if dialect == Dialect::Postgres {
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))::text")
            .await?;
    }
    // In the migration's transaction, under its lock: a fresh database's whole set-up is one
    // commit (one fsync on SQLite, not two).
    tx.execute(
        "CREATE TABLE IF NOT EXISTS keel_migrations (\
           version BIGINT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await?;
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
    let squash = fresh == Fresh::Squashed
        && dialect == Dialect::Sqlite
        && applied.is_empty()
        && sqlx::query(
            "SELECT count(*) AS n FROM sqlite_master WHERE tbl_name <> 'keel_migrations'",
        )
        .fetch_one(&mut *tx)
        .await?
        .try_get::<i64, _>("n")?
            == 0;
    if squash {
        tx.execute(SQLITE_SCHEMA).await?;
    }
    let mut recorded = Vec::new();
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
        if !(squash && m.version <= SQLITE_SCHEMA_VERSION) {
            let sql = m.sql_for(dialect).replace("{blob}", dialect.blob_type());
            tx.execute(sql.as_str()).await?;
        }
        recorded.push(m);
    }
    // The migrations applied, recorded by one statement (one round trip to the connection's
    // worker, not one a migration).
    if !recorded.is_empty() {
        let rows = vec!["(?, ?, ?, ?)"; recorded.len()].join(", ");
        let sql = format!(
            "INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES {rows}"
        );
        let sql = dialect.sql(&sql);
        let now = now_ms();
        let mut insert = sqlx::query(&sql);
        for m in recorded {
            insert = insert
                .bind(m.version)
                .bind(m.name)
                .bind(checksum(m, dialect).into_owned())
                .bind(now);
        }
        insert.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::types::Value as Cell;
    use std::path::Path;

    async fn connect(path: &Path) -> AnyConnection {
        sqlx::any::install_default_drivers();
        AnyConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap()
    }

    async fn migrated(path: &Path, fresh: Fresh) {
        let mut conn = connect(path).await;
        migrate(&mut conn, Dialect::Sqlite, fresh).await.unwrap();
        conn.close().await.unwrap();
    }

    /// The script [`SQLITE_SCHEMA`] holds, made from the database at `path`.
    fn schema_script(path: &Path) -> String {
        let db = rusqlite::Connection::open(path).unwrap();
        let shadow: Vec<String> = db
            .prepare("SELECT name FROM pragma_table_list WHERE type = 'shadow'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let mut script = format!(
            "-- Generated from migrations 1-{} by `KEEL_BLESS=1 cargo test -p keel-store fresh_sqlite`:\n\
             -- do not edit. The schema they leave in an SQLite database, which a fresh database is\n\
             -- given in one script (src/sql/migrations.rs, `SQLITE_SCHEMA`).\n",
            MIGRATIONS.last().map_or(0, |m| m.version)
        );
        let mut rows = db
            .prepare(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL \
                 AND tbl_name <> 'keel_migrations' ORDER BY rowid",
            )
            .unwrap();
        let rows = rows
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .unwrap();
        for row in rows {
            let (name, sql) = row.unwrap();
            if !shadow.contains(&name) {
                script.push('\n');
                script.push_str(&sql);
                script.push_str(";\n");
            }
        }
        script
    }

    /// The schema and every row of the database at `path` (of `keel_migrations` all but the
    /// time each was applied), as text.
    fn contents(path: &Path) -> Vec<String> {
        let db = rusqlite::Connection::open(path).unwrap();
        let mut out = Vec::new();
        let mut tables = Vec::new();
        let mut stmt = db
            .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let kind: String = r.get(0).unwrap();
            let name: String = r.get(1).unwrap();
            let sql: Option<String> = r.get(3).unwrap();
            out.push(format!(
                "{kind} {name} {} {sql:?}",
                r.get::<_, String>(2).unwrap()
            ));
            if kind == "table" && !sql.unwrap_or_default().starts_with("CREATE VIRTUAL") {
                tables.push(name);
            }
        }
        for table in tables {
            let columns = if table == "keel_migrations" {
                "version, name, checksum".to_owned()
            } else {
                "*".to_owned()
            };
            let mut stmt = db
                .prepare(&format!("SELECT {columns} FROM \"{table}\" ORDER BY 1"))
                .unwrap();
            let n = stmt.column_count();
            let mut rows = stmt.query([]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                let mut cells: Vec<Cell> = (0..n).map(|i| r.get(i).unwrap()).collect();
                // The FTS5 index's averages record (row 1: row count and tokens per column,
                // varints): a new index leaves it empty, the rebuild migration 10 runs writes
                // the zeros; FTS5 reads an empty record as zeros.
                if table == "memory_fts_data"
                    && cells[0] == Cell::Integer(1)
                    && let Cell::Blob(b) = &mut cells[1]
                {
                    b.retain(|&x| x != 0);
                }
                out.push(format!("{table}: {cells:?}"));
            }
        }
        out
    }

    #[tokio::test]
    async fn a_fresh_sqlite_database_gets_what_replaying_the_migrations_makes() {
        let dir = tempfile::tempdir().unwrap();
        let (replayed, squashed) = (dir.path().join("r.db"), dir.path().join("s.db"));
        migrated(&replayed, Fresh::Replayed).await;
        let script = schema_script(&replayed);
        if std::env::var_os("KEEL_BLESS").is_some() {
            let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/schema.sqlite.sql");
            std::fs::write(file, &script).unwrap();
        } else {
            assert_eq!(
                SQLITE_SCHEMA, script,
                "migrations/schema.sqlite.sql is not what the migrations make: \
                 `KEEL_BLESS=1 cargo test -p keel-store fresh_sqlite` rewrites it"
            );
        }
        assert_eq!(
            Some(SQLITE_SCHEMA_VERSION),
            MIGRATIONS.last().map(|m| m.version),
            "after KEEL_BLESS=1, SQLITE_SCHEMA_VERSION is the last migration's version"
        );
        migrated(&squashed, Fresh::Squashed).await;
        // The script ran, not the migrations: only migration 10's rebuild writes the FTS5
        // averages record (normalized away in `contents`).
        let averages = |path: &Path| -> Vec<u8> {
            rusqlite::Connection::open(path)
                .unwrap()
                .query_row("SELECT block FROM memory_fts_data WHERE id = 1", [], |r| {
                    r.get(0)
                })
                .unwrap()
        };
        assert_eq!(
            (averages(&replayed), averages(&squashed)),
            (vec![0; 3], vec![])
        );
        let (r, s) = (contents(&replayed), contents(&squashed));
        assert!(r.iter().any(|l| l.starts_with("keel_migrations: ")));
        assert_eq!(r, s);
        // Opening the squashed database again finds every migration recorded, checksums equal.
        migrated(&squashed, Fresh::Squashed).await;
        assert_eq!(contents(&squashed), s);
    }

    #[test]
    fn the_written_out_checksums_are_the_migrations() {
        let table: String = MIGRATIONS
            .iter()
            .map(|m| {
                format!(
                    "    [\n        \"{}\",\n        \"{}\",\n    ],\n",
                    computed_checksum(m, Dialect::Sqlite),
                    computed_checksum(m, Dialect::Postgres)
                )
            })
            .collect();
        let listed: String = CHECKSUMS
            .iter()
            .map(|[a, b]| format!("    [\n        \"{a}\",\n        \"{b}\",\n    ],\n"))
            .collect();
        assert_eq!(
            listed, table,
            "CHECKSUMS in migrations.rs should be:\n{table}"
        );
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "versions are 1, 2, …");
        }
    }

    #[tokio::test]
    async fn a_database_with_other_tables_is_migrated_step_by_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE someone_elses (x INTEGER)")
            .unwrap();
        migrated(&path, Fresh::Squashed).await;
        let db = rusqlite::Connection::open(&path).unwrap();
        let recorded: i64 = db
            .query_row("SELECT count(*) FROM keel_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(recorded, MIGRATIONS.len() as i64);
        let tables: i64 = db
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('someone_elses', 'events', 'memory_fts')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 3);
    }
}
