//! SQLite's writer thread: journal appends committed on a thread of the store's own, through
//! rusqlite, one message per group-commit batch.
//!
//! sqlx runs every SQLite statement on its connection's worker thread: each statement is a
//! message to that thread and a reply (two thread wake-ups), so an append of four statements
//! (`BEGIN IMMEDIATE`, the compare-and-set, one batch, `COMMIT`) cost eight wake-ups, and the
//! scheduler was the largest share of a step's profile (`docs/BENCHMARKS.md`, "Step overhead:
//! two changes"). The group commit ([`super::group_commit`]) now hands a whole batch of appends
//! to this thread in one message; the thread runs the transaction's statements back to back on
//! its own connection (each statement prepared once and cached) and answers every append
//! itself: one wake-up in, one per waiting caller out.
//!
//! The thread's connection is a second connection to the store's file, set up like the pool's
//! (`busy_timeout` 5 s, WAL, `synchronous = FULL`, `foreign_keys = ON`, as sqlx sets by default).
//! It writes only while its job holds the store's writer lock (the mutex of the sqlx writer
//! connection, which every other write takes), and each side leaves its connection outside any
//! transaction before it lets the lock go (the group commit's leader first lets a rollback
//! sqlx queued for a dropped transaction run, [`super::group_commit::ensure_no_transaction`]),
//! so the two connections do not hold SQLite's write lock against each other; a statement of a
//! dropped sqlx call still running on sqlx's worker is waited for by `busy_timeout`, as another
//! process's writer is. Durability is the same: each batch is one `BEGIN IMMEDIATE … COMMIT`, and
//! callers are answered only after its `COMMIT` returned.
//!
//! What the batch writes, and how a failure is confined to its own request, is unchanged from the
//! sqlx version ([`super::group_commit`]'s module docs): set-wise statements for requests
//! without extras, a `SAVEPOINT` per request with extras, and a retry of each request alone when
//! a set-wise statement fails.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use sqlx::AnyConnection;
use tokio::sync::OwnedMutexGuard;

use super::batch::Bind;
use super::group_commit::{
    AppendRequest, Appended, CLASSIFY, CasFailure, EVENTS_INSERT, EventRow, INSERT_CHUNK, Pending,
    became_runnable, cas_failure, cas_update, set_wise_update, values_insert,
};
use super::waiters::Waiters;
use super::{Dialect, now_ms};
use crate::error::{Result, StoreError};

/// Most requests in one set-wise `UPDATE` (10 parameters each, under SQLite's 32,766 limit).
const UPDATE_CHUNK: usize = 2000;
/// Prepared statements the connection keeps (rusqlite's cache; its default is 16). An append
/// uses about ten distinct texts (the multi-row inserts vary with their row count).
const STATEMENT_CACHE: usize = 64;

/// Work for the thread: runs on its connection.
type Job = Box<dyn FnOnce(&mut WriterConn) + Send>;

/// The handle of the writer thread. Dropping it (with the store) ends the thread once the jobs
/// already sent are done.
pub(crate) struct SqliteWriter {
    jobs: mpsc::Sender<Job>,
}

/// The writer thread's connection.
pub(crate) struct WriterConn {
    conn: Connection,
    path: PathBuf,
}

impl SqliteWriter {
    /// Opens the thread's connection to the (already created and migrated) database at `path`
    /// and starts the thread (`keel-sqlite-writer`).
    ///
    /// # Errors
    /// `Database` when the file cannot be opened or set up; the thread cannot be started.
    pub fn start(path: &Path) -> Result<Self> {
        let mut conn = WriterConn {
            conn: open(path)?,
            path: path.to_owned(),
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("keel-sqlite-writer".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    conn.ensure_no_transaction();
                    // A panicking job (a bug) drops its callers' reply channels, so they get an
                    // error; the thread and its connection stay for the next batch.
                    if std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
                        tracing::error!("a job of the SQLite writer thread panicked");
                    }
                }
            })
            .map_err(|e| {
                StoreError::Database(sqlx::Error::Io(std::io::Error::other(format!(
                    "cannot start the SQLite writer thread: {e}"
                ))))
            })?;
        Ok(SqliteWriter { jobs })
    }

    /// Commits `batch` on the thread, holding `lock` (the store's writer lock) until its
    /// transaction ended, then answers each request through its reply channel and wakes the
    /// waiters of the sessions written. Returns at once: the batch is the thread's from here
    /// (a caller cancelled meanwhile cannot abandon it).
    pub fn commit(
        &self,
        lock: OwnedMutexGuard<AnyConnection>,
        batch: Vec<Pending>,
        waiters: Arc<Waiters>,
    ) {
        // If the thread is gone, the job is dropped with its reply channels: every caller gets
        // the "ended without an answer" error.
        let _ = self.jobs.send(Box::new(move |conn: &mut WriterConn| {
            let results = std::panic::catch_unwind(AssertUnwindSafe(|| run_batch(conn, &batch)));
            // Out of any transaction before the lock goes: the sqlx writer's next statement
            // must not find SQLite's write lock still held by this connection.
            conn.ensure_no_transaction();
            drop(lock);
            match results {
                Ok(results) => answer(batch, results, &waiters),
                // A bug: the batch's reply channels are dropped with it, so each caller gets
                // the "ended without an answer" error and reads the journal.
                Err(_) => tracing::error!("committing a batch of appends panicked"),
            }
        }));
    }

    /// Runs `f` on the thread's connection and returns what it returned (tests: a hand-built
    /// batch, a statement outside the append path).
    ///
    /// # Errors
    /// `Database` when the thread is gone or `f` panicked.
    #[cfg(test)]
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriterConn) -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.jobs.send(Box::new(move |conn: &mut WriterConn| {
            let _ = tx.send(f(conn));
        }));
        rx.await.map_err(|_| {
            StoreError::Database(sqlx::Error::Protocol(
                "the SQLite writer thread did not answer".into(),
            ))
        })
    }
}

/// Opens the writer connection with the pool's settings.
fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(
        "PRAGMA foreign_keys = ON; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;",
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

impl WriterConn {
    /// The connection (tests).
    #[cfg(test)]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Makes sure the connection is outside any transaction: a job that failed half-way (a
    /// panic, a failed `ROLLBACK`) may have left one open, and the next `BEGIN` would fail. A
    /// connection that cannot roll back is replaced by a fresh one.
    fn ensure_no_transaction(&mut self) {
        if self.conn.is_autocommit() {
            return;
        }
        let _ = self.conn.execute_batch("ROLLBACK");
        if self.conn.is_autocommit() {
            return;
        }
        match open(&self.path) {
            Ok(fresh) => self.conn = fresh,
            Err(e) => tracing::warn!(error = %e, "cannot replace the SQLite writer connection"),
        }
    }
}

/// Answers each request of `batch` with its result (a failure of the whole batch to each),
/// waking the version waiters of the sessions written and, when one became runnable, the
/// scheduler's `wait_for_work`.
fn answer(
    batch: Vec<Pending>,
    results: Result<Vec<Result<Appended, CasFailure>>>,
    waiters: &Waiters,
) {
    match results {
        Ok(results) => {
            let mut woke = false;
            for (pending, result) in batch.into_iter().zip(results) {
                if let Ok(a) = &result {
                    waiters.versions.notify_committed(
                        pending.req.session_id,
                        pending.req.tenant_id,
                        a.version,
                    );
                    woke |= a.woke;
                }
                let _ = pending.reply.send(result.map(|a| a.version));
            }
            if woke {
                waiters.work.signal();
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for pending in batch {
                let err = match &e {
                    StoreError::DiskFull { location, detail } => StoreError::DiskFull {
                        location: location.clone(),
                        detail: detail.clone(),
                    },
                    _ => StoreError::Database(sqlx::Error::Protocol(msg.clone())),
                };
                let _ = pending.reply.send(Err(CasFailure::Store(err)));
            }
        }
    }
}

/// Commits a batch. A single request is written alone ([`append_alone`]). More are written
/// with a handful of set-wise statements ([`run_set_wise`]); if any statement fails (a corrupt
/// row, a constraint), that transaction rolls back as a whole and every request is retried
/// alone, so only the faulty one fails.
pub(crate) fn run_batch(
    conn: &mut WriterConn,
    batch: &[Pending],
) -> Result<Vec<Result<Appended, CasFailure>>> {
    if let [alone] = batch {
        // A batch of one is its own transaction: no savepoint, and a failure rolls the whole
        // transaction back, which writes nothing of it, as the savepoint would.
        return Ok(vec![append_alone(&mut conn.conn, &alone.req)]);
    }
    match run_set_wise(&mut conn.conn, batch) {
        Ok(results) => Ok(results),
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "batched append failed; retrying requests one by one");
            let mut results = Vec::with_capacity(batch.len());
            for pending in batch {
                conn.ensure_no_transaction();
                results.push(append_alone(&mut conn.conn, &pending.req));
            }
            Ok(results)
        }
    }
}

/// One request in its own transaction; every failure is this request's own. A failed or
/// refused write rolls the transaction back (rusqlite's `Transaction` does on drop), so nothing
/// of the request is written.
fn append_alone(conn: &mut Connection, req: &AppendRequest) -> Result<Appended, CasFailure> {
    let store = |e: rusqlite::Error| CasFailure::Store(e.into());
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(store)?;
    match apply_one(&tx, req) {
        Ok(Ok(appended)) => {
            tx.commit().map_err(store)?;
            Ok(appended)
        }
        Ok(Err(refused)) => Err(refused),
        Err(e) => Err(CasFailure::Store(e)),
    }
}

/// Writes one append — the compare-and-set, then its events and extras as one batch — inside
/// the caller's transaction. The outer error is a database error or a failed extra (the caller
/// rolls back); the inner one a refused compare-and-set (nothing written).
fn apply_one(conn: &Connection, req: &AppendRequest) -> Result<Result<Appended, CasFailure>> {
    /// [`cas_update`]`(slim)` with `RETURNING`, in SQLite's dialect, indexed by `slim`: built
    /// once, not at every commit.
    static CAS: LazyLock<[String; 2]> = LazyLock::new(|| {
        [false, true].map(|slim| {
            let sql = format!("{} RETURNING runnable, runnable_since", cas_update(slim));
            Dialect::Sqlite.sql(&sql).into_owned()
        })
    });
    let now = now_ms();
    let updated = conn
        .prepare_cached(&CAS[usize::from(req.keeps_row_columns())])?
        .query_row(rusqlite::params_from_iter(req.cas_binds(now).iter()), |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?))
        })
        .optional()?;
    let Some((runnable, since)) = updated else {
        return Ok(Err(classify(conn, req)?));
    };
    let head = req.event_inserts();
    match req.extras.as_ref() {
        Some(extras) => extras.apply_sqlite(conn, &req.tenant, &req.session, head)?,
        None => drop(head.run_sqlite(conn)?),
    }
    Ok(Ok(Appended {
        version: req.new_version(),
        woke: became_runnable(runnable, since, now),
    }))
}

/// Why the compare-and-set of `req` matched no row.
fn classify(conn: &Connection, req: &AppendRequest) -> Result<CasFailure> {
    let row = conn
        .prepare_cached(&Dialect::Sqlite.sql(CLASSIFY))?
        .query_row(rusqlite::params![&req.tenant, &req.session], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    Ok(cas_failure(req, row))
}

/// One request with extras inside its own savepoint of the batch's transaction. A refused
/// compare-and-set or a failing write rolls back to the savepoint, so the request writes nothing
/// and fails alone. The outer error (the savepoint itself failed) fails the batch, which is then
/// retried request by request.
fn append_in_savepoint(
    conn: &Connection,
    req: &AppendRequest,
) -> Result<Result<Appended, CasFailure>> {
    conn.execute_batch("SAVEPOINT keel_append")?;
    let outcome = match apply_one(conn, req) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(refused)) => Err(refused),
        Err(e) => Err(CasFailure::Store(e)),
    };
    if outcome.is_err() {
        conn.execute_batch("ROLLBACK TO keel_append")?;
    }
    conn.execute_batch("RELEASE keel_append")?;
    Ok(outcome)
}

/// One transaction: per round (each session at most once per round, in arrival order), one
/// `UPDATE … FROM (VALUES …) RETURNING` does the compare-and-set of every request without extras,
/// and each request with extras is written in its own savepoint ([`append_in_savepoint`]); then
/// multi-row `INSERT`s write the events of the requests without extras that won.
fn run_set_wise(
    conn: &mut Connection,
    batch: &[Pending],
) -> Result<Vec<Result<Appended, CasFailure>>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut results: Vec<Option<Result<Appended, CasFailure>>> =
        (0..batch.len()).map(|_| None).collect();
    let mut won: Vec<usize> = Vec::with_capacity(batch.len());
    let mut remaining: Vec<usize> = (0..batch.len()).collect();
    let now = now_ms();
    while !remaining.is_empty() {
        let mut seen = HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = remaining
            .iter()
            .partition(|&&i| seen.insert(batch[i].req.session.as_str()));
        let (plain, with_extras): (Vec<usize>, Vec<usize>) = round
            .into_iter()
            .partition(|&i| batch[i].req.extras.is_none());
        for &i in &with_extras {
            results[i] = Some(append_in_savepoint(&tx, &batch[i].req)?);
        }
        for chunk in plain.chunks(UPDATE_CHUNK) {
            let slim = chunk.iter().all(|&i| batch[i].req.keeps_row_columns());
            let sql = set_wise_update(chunk.len(), slim);
            let mut binds = Vec::with_capacity(chunk.len() * 10 + 2);
            for &i in chunk {
                batch[i].req.set_wise_binds(&mut binds);
            }
            binds.push(Bind::Int(now));
            if !slim {
                binds.push(Bind::Int(now));
            }
            let mut updated = HashMap::new();
            {
                let mut stmt = tx.prepare(&Dialect::Sqlite.sql(&sql))?;
                let mut rows = stmt.query(rusqlite::params_from_iter(binds.iter()))?;
                while let Some(row) = rows.next()? {
                    let woke = became_runnable(row.get(1)?, row.get(2)?, now);
                    updated.insert(row.get::<_, String>(0)?, woke);
                }
            }
            for &i in chunk {
                let r = &batch[i].req;
                if let Some(&woke) = updated.get(&r.session) {
                    results[i] = Some(Ok(Appended {
                        version: r.new_version(),
                        woke,
                    }));
                    won.push(i);
                } else {
                    results[i] = Some(Err(classify(&tx, r)?));
                }
            }
        }
        remaining = later;
    }
    let rows: Vec<(&AppendRequest, &EventRow)> = won
        .iter()
        .flat_map(|&i| {
            batch[i]
                .req
                .rows
                .iter()
                .map(move |row| (&batch[i].req, row))
        })
        .collect();
    insert_events(&tx, &rows)?;
    tx.commit()?;
    Ok(results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(CasFailure::Store(StoreError::Conflict(
                    "append not processed".into(),
                )))
            })
        })
        .collect())
}

/// Inserts event rows (each with the request it belongs to) with one multi-row statement per
/// [`INSERT_CHUNK`] rows.
fn insert_events(conn: &Connection, rows: &[(&AppendRequest, &EventRow)]) -> Result<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let sql = values_insert(EVENTS_INSERT, "(?, ?, ?, ?, ?, ?)", chunk.len());
        let mut binds = Vec::with_capacity(chunk.len() * 6);
        for (req, row) in chunk {
            req.event_binds(row, &mut binds);
        }
        conn.prepare(&Dialect::Sqlite.sql(&sql))?
            .execute(rusqlite::params_from_iter(binds.iter()))?;
    }
    Ok(())
}
