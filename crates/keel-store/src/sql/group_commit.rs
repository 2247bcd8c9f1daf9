//! Journal appends: the compare-and-set write shared by both backends, and SQLite's group commit.
//!
//! Group commit (SQLite): an append queues its request, then takes the writer. Whoever holds the
//! writer drains the whole queue and commits it in one `BEGIN IMMEDIATE … COMMIT` (one fsync),
//! with set-wise statements (one `UPDATE … FROM (VALUES …)` for every compare-and-set, one
//! multi-row `INSERT` for every event); a refused compare-and-set writes nothing, and a failing
//! statement makes each request retry alone, so one bad request affects only itself. A request
//! with side-table extras ([`crate::AppendExtras`]) is written in the same transaction inside its
//! own `SAVEPOINT` (compare-and-set, events, extras): if its compare-and-set is refused or an
//! extra fails, it rolls back to the savepoint, so it writes nothing and fails alone while the
//! rest of the batch commits; requests without extras keep the set-wise path. The commit
//! runs in a spawned task: a caller that is cancelled mid-commit cannot leave the writer inside a
//! transaction or abandon other callers' appends. A request whose caller
//! was cancelled before its batch committed may still be committed; callers read the journal to
//! learn the outcome, as after any interrupted write.
//!
//! The scheduler's columns of the session row ([`crate::WorkMark`], priority, schema version)
//! are written by the compare-and-set `UPDATE` itself ([`work_assignments`]), on every path:
//! they cost no statement and keep work-marked appends on the set-wise path. An append that
//! makes a session runnable (0 → 1) wakes `wait_for_work` (a NOTIFY in the PostgreSQL
//! statement; in-process after the SQLite commit).

use std::sync::Arc;

use keel_core::mechanisms::{Mechanism, sql_guard};
use keel_core::{Event, LeaseEpoch, SessionId, StateMachine, TenantId};
use sqlx::{AnyConnection, AnyPool, Connection, Row};
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use super::batch::{Batch, Bind};
use super::extras::Extras;
use super::waiters::Waiters;
use super::{Dialect, now_ms, to_i64};
use crate::error::{Result, StoreError};
use crate::types::AppendExtras;

/// One event row: seq, type, timestamp (Unix ms), encoded envelope.
type EventRow = (i64, &'static str, i64, String);

/// The scheduler's columns an append writes, bound as SQL values.
struct WorkCols {
    /// `runnable` (0/1), `None` to leave it.
    runnable: Option<i32>,
    /// `queued_turns`, `None` to leave it.
    queued: Option<i32>,
    /// `priority`, `None` to leave it.
    priority: Option<i32>,
    /// The highest `schema_version` of the appended events (the row keeps a higher one).
    schema: i32,
}

/// The `SET` assignments of the scheduler's columns (appended after `updated_at = …`), with
/// each value an SQL expression: `runnable_since` becomes `now` when `runnable` goes from 0 to
/// 1, stays while it stays 1, and is NULL while 0; `schema_version` only rises. Expressions on
/// the right read the row's values before the update (both dialects).
fn work_assignments(run: &str, queued: &str, prio: &str, schema: &str, now: &str) -> String {
    format!(
        ", runnable_since = CASE WHEN {run} IS NULL THEN sessions.runnable_since \
         WHEN {run} = 0 THEN NULL \
         WHEN sessions.runnable = 1 AND sessions.runnable_since IS NOT NULL THEN sessions.runnable_since \
         ELSE {now} END, \
         runnable = COALESCE({run}, sessions.runnable), \
         queued_turns = COALESCE({queued}, sessions.queued_turns), \
         priority = COALESCE({prio}, sessions.priority), \
         schema_version = CASE WHEN sessions.schema_version < {schema} THEN {schema} \
         ELSE sessions.schema_version END"
    )
}

/// Binds the values of `work_assignments("?", "?", "?", "?", "?")`, in their order.
fn bind_work<'q>(
    q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    w: &WorkCols,
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    q.bind(w.runnable)
        .bind(w.runnable)
        .bind(now)
        .bind(w.runnable)
        .bind(w.queued)
        .bind(w.priority)
        .bind(w.schema)
        .bind(w.schema)
}

/// Whether a row returned by a compare-and-set (`runnable`, `runnable_since`) became runnable
/// in the commit made at `now` (in a group commit, possibly by an earlier request of the batch:
/// the batch is one commit).
fn became_runnable(row: &sqlx::any::AnyRow, now: i64) -> Result<bool> {
    let runnable: i64 = row.try_get("runnable")?;
    let since: Option<i64> = row.try_get("runnable_since")?;
    Ok(runnable == 1 && since == Some(now))
}

/// A committed append: the journal's new version, and whether the session became runnable in
/// its commit ([`became_runnable`]).
pub(crate) struct Appended {
    pub version: u64,
    pub woke: bool,
}

/// An append, ready to write.
pub(crate) struct AppendRequest {
    session_id: SessionId,
    tenant: String,
    session: String,
    expected: i64,
    epoch: i64,
    count: i64,
    status: Option<String>,
    rows: Vec<EventRow>,
    /// Side-table writes to commit with the events; `None` when there are none (fast path).
    extras: Option<Extras>,
    /// The scheduler's columns, written by the compare-and-set.
    work: WorkCols,
}

impl AppendRequest {
    pub fn new(
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        epoch: LeaseEpoch,
        events: &[Event],
        extras: &AppendExtras,
    ) -> Result<Self> {
        let (extras_work, priority) = (extras.work, extras.priority);
        let extras = Extras::prepare(session, extras)?;
        let mut rows = Vec::with_capacity(events.len());
        for ev in events {
            let body = ev.encode();
            // Refuse what could never be read back (e.g. a NaN cost encodes as null): a journal
            // row that fails to decode would brick the session.
            Event::decode(&body).map_err(|e| {
                StoreError::InvalidInput(format!(
                    "event seq {} does not survive encoding: {}",
                    ev.seq, e.kind
                ))
            })?;
            rows.push((
                to_i64(ev.seq)?,
                ev.type_name(),
                ev.ts.timestamp_millis(),
                body,
            ));
        }
        Ok(AppendRequest {
            session_id: session,
            tenant: tenant.to_string(),
            session: session.to_string(),
            expected: to_i64(expected_version)?,
            epoch: to_i64(epoch.0)?,
            count: to_i64(events.len() as u64)?,
            status: events
                .iter()
                .rev()
                .find_map(|e| e.body.session_status())
                .map(|s| s.as_str().to_owned()),
            rows,
            extras,
            work: WorkCols {
                runnable: extras_work.map(|w| i32::from(w.runnable)),
                queued: extras_work.map(|w| i32::try_from(w.queued_turns).unwrap_or(i32::MAX)),
                priority,
                schema: events
                    .iter()
                    .map(|e| i32::try_from(e.schema_version).unwrap_or(i32::MAX))
                    .max()
                    .unwrap_or(0),
            },
        })
    }

    /// The journal's version after this append.
    fn new_version(&self) -> u64 {
        u64::try_from(self.expected + self.count).unwrap_or(0)
    }

    /// Writes this request's extras (if any) in the caller's transaction, after its
    /// compare-and-set succeeded, in one batch after the `head` statements (which run even when
    /// there are no extras).
    async fn apply_extras(
        &self,
        conn: &mut AnyConnection,
        dialect: Dialect,
        head: Batch,
    ) -> Result<()> {
        match &self.extras {
            Some(extras) => {
                extras
                    .apply(conn, dialect, &self.tenant, &self.session, head)
                    .await
            }
            None => head.run(conn, dialect).await.map(drop),
        }
    }

    /// The statements inserting this request's event rows (one multi-row `INSERT` per
    /// [`INSERT_CHUNK`] rows), as the head of its extras' batch.
    fn event_inserts(&self) -> Batch {
        let mut batch = Batch::default();
        for chunk in self.rows.chunks(INSERT_CHUNK) {
            let sql = values_insert(
                "INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ",
                "(?, ?, ?, ?, ?, ?)",
                chunk.len(),
            );
            let mut binds = Vec::with_capacity(chunk.len() * 6);
            for (seq, ty, ts, body) in chunk {
                binds.extend([
                    Bind::Text(self.tenant.clone()),
                    Bind::Text(self.session.clone()),
                    Bind::Int(*seq),
                    Bind::Text((*ty).to_owned()),
                    Bind::Int(*ts),
                    Bind::Text(body.clone()),
                ]);
            }
            batch.push(sql, binds);
        }
        batch
    }
}

/// Why a compare-and-set append did not happen.
pub(crate) enum CasFailure {
    /// No such session for the tenant.
    Missing,
    /// The journal is at another version.
    Stale { actual: u64 },
    /// The lease epoch is not current, or the lease was released.
    Lease {
        current: LeaseEpoch,
        owner: Option<String>,
    },
    /// A database error for this request.
    Store(StoreError),
}

/// An append's compare-and-set on the session row (`p`: the table prefix; `version`, `epoch`:
/// the expected version's and lease epoch's expressions): the journal version, and the lease
/// epoch fence (a released lease has no owner). Each part can be turned off in test builds
/// (`keel_core::mechanisms`: `cas_version`, `fencing`).
fn cas_condition(p: &str, version: &str, epoch: &str) -> String {
    format!(
        "{} AND {}",
        sql_guard(Mechanism::CasVersion, &format!("{p}version = {version}")),
        sql_guard(
            Mechanism::Fencing,
            &format!("{p}lease_epoch = {epoch} AND {p}lease_owner IS NOT NULL")
        )
    )
}

/// Writes one append — compare-and-set, then its events and extras as one batch (two round
/// trips to SQLite's worker thread) — inside the caller's transaction. The outer error is a
/// database error or a failed extra (the caller rolls back); the inner one a refused
/// compare-and-set (nothing written).
pub(crate) async fn apply_one(
    conn: &mut AnyConnection,
    dialect: Dialect,
    req: &AppendRequest,
) -> Result<Result<Appended, CasFailure>> {
    let now = now_ms();
    let sql = format!(
        "UPDATE sessions SET version = version + ?, status = COALESCE(?, status), updated_at = ?{} \
         WHERE tenant_id = ? AND session_id = ? AND {} RETURNING runnable, runnable_since",
        work_assignments("?", "?", "?", "?", "?"),
        cas_condition("", "?", "?")
    );
    let sql = dialect.sql(&sql);
    let q = sqlx::query(&sql)
        .bind(req.count)
        .bind(req.status.clone())
        .bind(now);
    let updated = bind_work(q, &req.work, now)
        .bind(req.tenant.clone())
        .bind(req.session.clone())
        .bind(req.expected)
        .bind(req.epoch)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(updated) = updated else {
        return Ok(Err(classify(conn, dialect, req).await?));
    };
    let woke = became_runnable(&updated, now)?;
    req.apply_extras(conn, dialect, req.event_inserts()).await?;
    Ok(Ok(Appended {
        version: req.new_version(),
        woke,
    }))
}

/// Inserts event rows (each with the request it belongs to) with one multi-row statement per
/// chunk, not one per event: on SQLite each statement is a round trip to sqlx's worker thread.
async fn insert_events(
    conn: &mut AnyConnection,
    dialect: Dialect,
    rows: &[(&AppendRequest, &EventRow)],
) -> Result<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let sql = dialect
            .sql(&values_insert(
                "INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ",
                "(?, ?, ?, ?, ?, ?)",
                chunk.len(),
            ))
            .into_owned();
        let mut q = sqlx::query(&sql);
        for (req, (seq, ty, ts, body)) in chunk {
            q = q
                .bind(req.tenant.clone())
                .bind(req.session.clone())
                .bind(*seq)
                .bind(*ty)
                .bind(*ts)
                .bind(body.clone());
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

/// `head` followed by `n` copies of the parenthesized `tuple`, comma-separated (a multi-row
/// `INSERT … VALUES`).
pub(crate) fn values_insert(head: &str, tuple: &str, n: usize) -> String {
    let mut sql = String::with_capacity(head.len() + n * (tuple.len() + 2));
    sql.push_str(head);
    for k in 0..n {
        if k > 0 {
            sql.push_str(", ");
        }
        sql.push_str(tuple);
    }
    sql
}

/// PostgreSQL: the whole append — compare-and-set, event rows and the wake-up notifications — as
/// one statement (data-modifying CTEs run atomically in one implicit transaction, one round trip).
/// The events are inserted, and the notifications sent, only if the compare-and-set matched
/// (the work notification on `work_channel` only if the session became runnable). With
/// extras, that statement and the extras run in one explicit transaction (the notifications are
/// delivered at its commit); an extra that fails rolls the whole append back.
pub(crate) async fn append_postgres(
    pool: &sqlx::AnyPool,
    channel: &str,
    work_channel: &str,
    req: &AppendRequest,
) -> Result<Result<u64, CasFailure>> {
    let now = now_ms();
    let mut sql = format!(
        "WITH upd AS (UPDATE sessions SET version = version + ?, status = COALESCE(?, status), updated_at = ?{} \
         WHERE tenant_id = ? AND session_id = ? AND {} \
         RETURNING tenant_id, session_id, runnable, runnable_since), \
         ins AS (INSERT INTO events (tenant_id, session_id, seq, type, ts, body) \
         SELECT upd.tenant_id, upd.session_id, v.seq, v.type, v.ts, v.body FROM upd CROSS JOIN (VALUES ",
        work_assignments("?", "?", "?", "?", "?"),
        cas_condition("", "?", "?")
    );
    for k in 0..req.rows.len() {
        sql.push_str(if k == 0 {
            "(?, ?, ?, ?)"
        } else {
            ", (?, ?, ?, ?)"
        });
    }
    sql.push_str(
        ") AS v(seq, type, ts, body) RETURNING 1), \
         note AS (SELECT pg_notify(?, ?) FROM upd), \
         work AS (SELECT pg_notify(?, upd.tenant_id || ':' || upd.session_id) FROM upd \
         WHERE upd.runnable = 1 AND upd.runnable_since = ?) \
         SELECT (SELECT count(*) FROM upd) AS updated, (SELECT count(*) FROM note) AS notified, \
         (SELECT count(*) FROM work) AS woke",
    );
    let sql = Dialect::Postgres.sql(&sql);
    let q = sqlx::query(&sql)
        .bind(req.count)
        .bind(req.status.clone())
        .bind(now);
    let mut q = bind_work(q, &req.work, now)
        .bind(req.tenant.clone())
        .bind(req.session.clone())
        .bind(req.expected)
        .bind(req.epoch);
    for (seq, ty, ts, body) in &req.rows {
        q = q.bind(*seq).bind(*ty).bind(*ts).bind(body.clone());
    }
    let q = q
        .bind(channel.to_owned())
        .bind(req.session.clone())
        .bind(work_channel.to_owned())
        .bind(now);
    let new_version = req.new_version();
    let mut conn = if req.extras.is_none() {
        // Read to the end: the statement's implicit commit (where a full disk or a lost
        // connection fails it) answers after its one row.
        let rows = q.fetch_all(pool).await?;
        let Some(row) = rows.first() else {
            return Err(StoreError::Database(sqlx::Error::RowNotFound));
        };
        if row.try_get::<i64, _>("updated")? == 1 {
            return Ok(Ok(new_version));
        }
        pool.acquire().await?
    } else {
        let mut conn = pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let row = q.fetch_one(&mut *tx).await?;
        if row.try_get::<i64, _>("updated")? == 1 {
            // An error returns early and drops the transaction: it rolls back, events included.
            req.apply_extras(&mut tx, Dialect::Postgres, Batch::default())
                .await?;
            tx.commit().await?;
            return Ok(Ok(new_version));
        }
        tx.rollback().await?;
        conn
    };
    Ok(Err(classify(&mut conn, Dialect::Postgres, req).await?))
}

/// Why the compare-and-set of `req` matched no row.
async fn classify(
    conn: &mut AnyConnection,
    dialect: Dialect,
    req: &AppendRequest,
) -> Result<CasFailure> {
    let row = sqlx::query(&dialect.sql(
        "SELECT version, lease_epoch, lease_owner FROM sessions WHERE tenant_id = ? AND session_id = ?",
    ))
    .bind(req.tenant.clone())
    .bind(req.session.clone())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(CasFailure::Missing);
    };
    let version: i64 = row.try_get("version")?;
    let epoch: i64 = row.try_get("lease_epoch")?;
    let owner: Option<String> = row.try_get("lease_owner")?;
    if epoch != req.epoch || owner.is_none() {
        return Ok(CasFailure::Lease {
            current: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
            owner,
        });
    }
    Ok(CasFailure::Stale {
        actual: u64::try_from(version).unwrap_or(0),
    })
}

struct Pending {
    req: AppendRequest,
    reply: oneshot::Sender<Result<u64, CasFailure>>,
}

/// The queue of appends waiting for the next SQLite commit.
#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: std::sync::Mutex<Vec<Pending>>,
}

impl GroupCommit {
    /// Queues `req` and returns once a commit that contains it finished.
    pub async fn submit(
        &self,
        req: AppendRequest,
        writer: Arc<Mutex<AnyConnection>>,
        pool: &AnyPool,
        waiters: Arc<Waiters>,
    ) -> Result<u64, CasFailure> {
        let (reply, mut answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Pending { req, reply });
        // Wait for the writer or for our answer, whichever comes first: a request committed by
        // another leader returns at once instead of queueing behind the next commit (convoy).
        let guard = tokio::select! {
            biased;
            done = &mut answer => return done.unwrap_or_else(|_| Err(aborted())),
            guard = writer.lock_owned() => guard,
        };
        let mut batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        // A request whose caller is gone (cancelled while queued) is dropped, not committed
        // later behind the caller's back: its outcome is "not written".
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            // Someone else committed our request while we waited for the writer.
            drop(guard);
        } else {
            // No await between draining and spawning: the batch cannot be lost to cancellation.
            let task = tokio::spawn(commit_batch(guard, pool.clone(), batch, waiters));
            let _ = task.await;
        }
        answer.await.unwrap_or_else(|_| Err(aborted()))
    }
}

fn aborted() -> CasFailure {
    CasFailure::Store(StoreError::Conflict(
        "the append's commit task ended without an answer; read the journal to learn the outcome"
            .into(),
    ))
}

/// Makes sure `conn` (the SQLite writer) is outside any transaction before it is used: a
/// failed `COMMIT` (a full disk: SQLite rolled the transaction back itself) can leave sqlx
/// believing one is still open, and every later `BEGIN` would then fail with "begin_with at
/// non-zero transaction depth". A pending rollback is given a chance to run first (a ping);
/// a connection still marked in a transaction is replaced by a fresh one from `pool`.
pub(crate) async fn ensure_no_transaction(conn: &mut AnyConnection, pool: &AnyPool) {
    if !conn.is_in_transaction() {
        return;
    }
    let _ = conn.ping().await;
    if !conn.is_in_transaction() {
        return;
    }
    match pool.acquire().await {
        Ok(fresh) => *conn = fresh.detach(),
        Err(e) => tracing::warn!(error = %e, "cannot replace the SQLite writer connection"),
    }
}

async fn commit_batch(
    mut conn: OwnedMutexGuard<AnyConnection>,
    pool: AnyPool,
    batch: Vec<Pending>,
    waiters: Arc<Waiters>,
) {
    ensure_no_transaction(&mut conn, &pool).await;
    match run_batch(&mut conn, &pool, &batch).await {
        Ok(results) => {
            let mut woke = false;
            for (pending, result) in batch.into_iter().zip(results) {
                if let Ok(a) = &result {
                    waiters.versions.notify(pending.req.session_id);
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

/// Most requests in one batched `UPDATE` (6 parameters each, under SQLite's 32,766 limit).
const UPDATE_CHUNK: usize = 2000;
/// Most events in one batched `INSERT` (6 parameters each).
const INSERT_CHUNK: usize = 5000;

/// Commits a batch. A single request is written alone ([`append_alone`]). The fast path writes
/// the whole batch with a handful of set-wise statements;
/// if any statement fails (a corrupt row, a constraint), the transaction rolls back as a whole and
/// every request is retried alone, so only the faulty one fails.
async fn run_batch(
    conn: &mut AnyConnection,
    pool: &AnyPool,
    batch: &[Pending],
) -> Result<Vec<Result<Appended, CasFailure>>> {
    if let [alone] = batch {
        // A batch of one is its own transaction: no savepoint (two statements, each a round
        // trip to the worker thread, saved on the common single-session path), and a failure
        // rolls the whole transaction back, which writes nothing of it, as the savepoint would.
        let result = append_alone(conn, &alone.req).await;
        ensure_no_transaction(conn, pool).await;
        return Ok(vec![result]);
    }
    match run_batch_set_wise(conn, batch).await {
        Ok(results) => Ok(results),
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "batched append failed; retrying requests one by one");
            let mut results = Vec::with_capacity(batch.len());
            for pending in batch {
                ensure_no_transaction(conn, pool).await;
                results.push(append_alone(conn, &pending.req).await);
            }
            ensure_no_transaction(conn, pool).await;
            Ok(results)
        }
    }
}

/// One request in its own transaction; every failure is this request's own.
async fn append_alone(
    conn: &mut AnyConnection,
    req: &AppendRequest,
) -> Result<Appended, CasFailure> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| CasFailure::Store(e.into()))?;
    match apply_one(&mut tx, Dialect::Sqlite, req).await {
        Ok(Ok(v)) => {
            tx.commit().await.map_err(|e| CasFailure::Store(e.into()))?;
            Ok(v)
        }
        Ok(Err(refused)) => Err(refused),
        // A failed write (an extra included): dropping the transaction rolls it back.
        Err(e) => Err(CasFailure::Store(e)),
    }
}

/// One request with extras inside its own savepoint of the batch's transaction: compare-and-set,
/// events, extras. A refused compare-and-set or a failing write rolls back to the savepoint, so
/// the request writes nothing and fails alone. The outer error (the savepoint itself failed, e.g.
/// the transaction is gone) fails the batch, which is then retried request by request.
async fn append_in_savepoint(
    conn: &mut AnyConnection,
    req: &AppendRequest,
) -> Result<Result<Appended, CasFailure>> {
    sqlx::query("SAVEPOINT keel_append")
        .execute(&mut *conn)
        .await?;
    let outcome = match apply_one(conn, Dialect::Sqlite, req).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(refused)) => Err(refused),
        Err(e) => Err(CasFailure::Store(e)),
    };
    if outcome.is_err() {
        sqlx::query("ROLLBACK TO keel_append")
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("RELEASE keel_append")
        .execute(&mut *conn)
        .await?;
    Ok(outcome)
}

/// One transaction: per round (each session at most once per round, in arrival order), one
/// `UPDATE … FROM (VALUES …) RETURNING` does the compare-and-set of every request without extras,
/// and each request with extras is written in its own savepoint ([`append_in_savepoint`]); then
/// one multi-row `INSERT` writes the events of the requests without extras that won.
async fn run_batch_set_wise(
    conn: &mut AnyConnection,
    batch: &[Pending],
) -> Result<Vec<Result<Appended, CasFailure>>> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut results: Vec<Option<Result<Appended, CasFailure>>> =
        (0..batch.len()).map(|_| None).collect();
    let mut won: Vec<usize> = Vec::with_capacity(batch.len());
    let mut remaining: Vec<usize> = (0..batch.len()).collect();
    let now = now_ms();
    while !remaining.is_empty() {
        let mut seen = std::collections::HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = remaining
            .iter()
            .partition(|&&i| seen.insert(batch[i].req.session.as_str()));
        let (plain, with_extras): (Vec<usize>, Vec<usize>) = round
            .into_iter()
            .partition(|&i| batch[i].req.extras.is_none());
        for &i in &with_extras {
            results[i] = Some(append_in_savepoint(&mut tx, &batch[i].req).await?);
        }
        for chunk in plain.chunks(UPDATE_CHUNK) {
            let mut sql =
                String::from("WITH v(t_id, s_id, exp, ep, cnt, st, run, qt, prio, sv) AS (VALUES ");
            for k in 0..chunk.len() {
                sql.push_str(if k == 0 {
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                } else {
                    ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                });
            }
            sql.push_str(&format!(
                ") UPDATE sessions SET version = sessions.version + v.cnt, \
                 status = COALESCE(v.st, sessions.status), updated_at = ?{} FROM v \
                 WHERE sessions.tenant_id = v.t_id AND sessions.session_id = v.s_id \
                 AND {} RETURNING session_id, runnable, runnable_since",
                work_assignments("v.run", "v.qt", "v.prio", "v.sv", "?"),
                cas_condition("sessions.", "v.exp", "v.ep")
            ));
            let mut q = sqlx::query(&sql);
            for &i in chunk {
                let r = &batch[i].req;
                q = q
                    .bind(r.tenant.clone())
                    .bind(r.session.clone())
                    .bind(r.expected)
                    .bind(r.epoch)
                    .bind(r.count)
                    .bind(r.status.clone())
                    .bind(r.work.runnable)
                    .bind(r.work.queued)
                    .bind(r.work.priority)
                    .bind(r.work.schema);
            }
            let rows = q.bind(now).bind(now).fetch_all(&mut *tx).await?;
            let mut updated = std::collections::HashMap::new();
            for row in rows {
                let woke = became_runnable(&row, now)?;
                updated.insert(row.try_get::<String, _>("session_id")?, woke);
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
                    results[i] = Some(Err(classify(&mut tx, Dialect::Sqlite, r).await?));
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
    insert_events(&mut tx, Dialect::Sqlite, &rows).await?;
    tx.commit().await?;
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

#[cfg(test)]
mod tests;
