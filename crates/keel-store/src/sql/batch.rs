//! [`Batch`]: several write statements sent as one round trip where the backend allows it.
//!
//! On SQLite every statement is a message to sqlx's worker thread and a reply (two thread
//! wake-ups); sqlx's SQLite driver runs a query text holding several statements in one message,
//! binding the positional `?` parameters across them in order, and reports each statement's
//! changed rows. A batch joins its statements so, and its caller reads each statement's count
//! afterwards. PostgreSQL prepares one statement per query, so there the statements run one
//! after the other (each its own round trip, as before).
//!
//! A batch runs inside the caller's transaction; an error stops it part-way, and the caller
//! must then roll back (as for any failed statement of a transaction). On SQLite's writer
//! thread ([`super::sqlite_writer`]) a batch runs through rusqlite instead
//! ([`Batch::run_sqlite`]): the statements one after the other on that thread, each prepared
//! once and cached.

use futures_util::TryStreamExt;
use sqlx::{AnyConnection, Executor};

use super::Dialect;
use crate::error::{Result, StoreError};

/// One parameter value of a batched statement (and of a lease write).
pub(crate) enum Bind {
    /// `TEXT`.
    Text(String),
    /// `TEXT` or `NULL`.
    OptText(Option<String>),
    /// `BIGINT`.
    Int(i64),
    /// `BIGINT` or `NULL`.
    OptInt(Option<i64>),
    /// `DOUBLE PRECISION` / `REAL`.
    Real(f64),
    /// `BYTEA` / `BLOB`.
    Blob(Vec<u8>),
}

/// Write statements (`?` placeholders, no `;` inside) to run in order in one transaction.
#[derive(Default)]
pub(crate) struct Batch {
    statements: Vec<(String, Vec<Bind>)>,
}

impl rusqlite::ToSql for Bind {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Bind::Text(s) | Bind::OptText(Some(s)) => ValueRef::Text(s.as_bytes()),
            Bind::OptText(None) | Bind::OptInt(None) => ValueRef::Null,
            Bind::Int(i) | Bind::OptInt(Some(i)) => ValueRef::Integer(*i),
            Bind::Real(f) => ValueRef::Real(*f),
            Bind::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// Binds `values` to `q` in order.
pub(crate) fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    values: Vec<Bind>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for v in values {
        q = match v {
            Bind::Text(s) => q.bind(s),
            Bind::OptText(s) => q.bind(s),
            Bind::Int(i) => q.bind(i),
            Bind::OptInt(i) => q.bind(i),
            Bind::Real(f) => q.bind(f),
            Bind::Blob(b) => q.bind(b),
        };
    }
    q
}

impl Batch {
    /// Adds a statement; returns its index in [`Batch::run`]'s answer.
    pub fn push(&mut self, sql: impl Into<String>, binds: Vec<Bind>) -> usize {
        self.statements.push((sql.into(), binds));
        self.statements.len() - 1
    }

    /// Runs the statements in order on `conn` (inside the caller's transaction) and returns the
    /// rows each changed, by index. SQLite: one round trip for all of them; PostgreSQL: one per
    /// statement.
    ///
    /// # Errors
    /// `Database` for a failed statement (the ones after it did not run; the caller rolls
    /// back), or when SQLite reports another number of statements than were sent.
    pub async fn run(self, conn: &mut AnyConnection, dialect: Dialect) -> Result<Vec<u64>> {
        let n = self.statements.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        if dialect == Dialect::Postgres || n == 1 {
            let mut changed = Vec::with_capacity(n);
            for (sql, binds) in self.statements {
                let sql = dialect.sql(&sql).into_owned();
                let done = bind_all(sqlx::query(&sql), binds)
                    .execute(&mut *conn)
                    .await?;
                changed.push(done.rows_affected());
            }
            return Ok(changed);
        }
        let mut sql = String::new();
        let mut binds = Vec::new();
        for (k, (s, b)) in self.statements.into_iter().enumerate() {
            if k > 0 {
                sql.push_str(";\n");
            }
            sql.push_str(&dialect.sql(&s));
            binds.extend(b);
        }
        let q = bind_all(sqlx::query(&sql), binds);
        // `Executor::fetch_many` yields each statement's result (and any rows, none here).
        let changed: Vec<u64> = (&mut *conn)
            .fetch_many(q)
            .try_filter_map(|step| async move { Ok(step.left().map(|r| r.rows_affected())) })
            .try_collect()
            .await?;
        if changed.len() != n {
            return Err(StoreError::Database(sqlx::Error::Protocol(format!(
                "a batch of {n} statements reported {} results",
                changed.len()
            ))));
        }
        Ok(changed)
    }

    /// [`Batch::run`] on the SQLite writer thread's connection: each statement prepared (and
    /// cached by the connection), bound and stepped in order; returns the rows each changed.
    ///
    /// # Errors
    /// `Database` (or `DiskFull`, `Locked`) for a failed statement; the ones after it did not
    /// run, and the caller rolls back.
    pub fn run_sqlite(self, conn: &rusqlite::Connection) -> Result<Vec<u64>> {
        let mut changed = Vec::with_capacity(self.statements.len());
        for (sql, binds) in self.statements {
            let sql = Dialect::Sqlite.sql(&sql);
            let n = conn
                .prepare_cached(&sql)?
                .execute(rusqlite::params_from_iter(binds.iter()))?;
            changed.push(n as u64);
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use sqlx::Connection;

    /// Three statements in one SQLite round trip: each statement's changed rows come back by
    /// index, parameters bound across them in order; a failing statement fails the batch.
    #[tokio::test]
    async fn a_sqlite_batch_reports_each_statements_changes_in_order() {
        sqlx::any::install_default_drivers();
        let mut conn = AnyConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT)")
            .execute(&mut conn)
            .await
            .unwrap();
        let mut b = Batch::default();
        let two = b.push(
            "INSERT INTO t (k, v) VALUES (?, ?), (?, ?)",
            vec![
                Bind::Text("a".into()),
                Bind::Int(1),
                Bind::Text("b".into()),
                Bind::Int(2),
            ],
        );
        let none = b.push("DELETE FROM t WHERE k = ?", vec![Bind::Text("zz".into())]);
        let one = b.push(
            "UPDATE t SET v = ? WHERE k = ?",
            vec![Bind::Int(7), Bind::Text("b".into())],
        );
        let changed = b.run(&mut conn, Dialect::Sqlite).await.unwrap();
        assert_eq!((changed[two], changed[none], changed[one]), (2, 0, 1));
        let v: i64 = sqlx::query_scalar("SELECT v FROM t WHERE k = 'b'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(v, 7, "the third statement got the fifth and sixth values");

        let mut bad = Batch::default();
        bad.push("DELETE FROM t WHERE k = ?", vec![Bind::Text("a".into())]);
        bad.push(
            "INSERT INTO t (k, v) VALUES (?, ?)",
            vec![Bind::Text("b".into()), Bind::Int(0)],
        );
        assert!(bad.run(&mut conn, Dialect::Sqlite).await.is_err());
    }
}
