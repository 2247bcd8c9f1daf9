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
//! rest of the batch commits; requests without extras keep the set-wise path. The leader hands
//! the batch, with the writer lock, to the store's writer thread ([`super::sqlite_writer`]),
//! which commits it and answers every request: a caller that is cancelled mid-commit cannot
//! leave the writer inside a transaction or abandon other callers' appends. A request whose caller
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
use tokio::sync::{Mutex, oneshot};

use super::batch::{Batch, Bind, bind_all};
use super::extras::Extras;
use super::sqlite_writer::SqliteWriter;
use super::waiters::Waiters;
use super::{Dialect, now_ms, to_i64};
use crate::error::{Result, StoreError};
use crate::types::AppendExtras;

/// One event row: seq, type, timestamp (Unix ms), encoded envelope.
pub(crate) type EventRow = (i64, &'static str, i64, String);

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

/// The values of `work_assignments("?", "?", "?", "?", "?")`, in their order.
fn work_binds(w: &WorkCols, now: i64) -> [Bind; 8] {
    [
        Bind::OptInt(w.runnable.map(i64::from)),
        Bind::OptInt(w.runnable.map(i64::from)),
        Bind::Int(now),
        Bind::OptInt(w.runnable.map(i64::from)),
        Bind::OptInt(w.queued.map(i64::from)),
        Bind::OptInt(w.priority.map(i64::from)),
        Bind::Int(i64::from(w.schema)),
        Bind::Int(i64::from(w.schema)),
    ]
}

/// Whether a row returned by a compare-and-set (its `runnable` and `runnable_since`) became
/// runnable in the commit made at `now` (in a group commit, possibly by an earlier request of
/// the batch: the batch is one commit).
pub(crate) fn became_runnable(runnable: i64, since: Option<i64>, now: i64) -> bool {
    runnable == 1 && since == Some(now)
}

/// A committed append: the journal's new version, and whether the session became runnable in
/// its commit ([`became_runnable`]).
pub(crate) struct Appended {
    pub version: u64,
    pub woke: bool,
}

/// An append, ready to write.
pub(crate) struct AppendRequest {
    pub(super) session_id: SessionId,
    /// The tenant, typed (the version waiters are told which tenant's session moved on).
    pub(super) tenant_id: TenantId,
    pub(super) tenant: String,
    pub(super) session: String,
    expected: i64,
    epoch: i64,
    count: i64,
    status: Option<String>,
    pub(super) rows: Vec<EventRow>,
    /// Side-table writes to commit with the events; `None` when there are none (fast path).
    pub(super) extras: Option<Extras>,
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
            tenant_id: tenant,
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
    pub(super) fn new_version(&self) -> u64 {
        u64::try_from(self.expected + self.count).unwrap_or(0)
    }

    /// Whether this append leaves the session's status and the scheduler's columns as they
    /// are (no status-changing event, no work columns, no priority): its compare-and-set is then
    /// the slim one ([`cas_update`]`(true)`), which touches no index of `sessions`. Most
    /// appends inside a turn are such.
    pub(super) fn keeps_row_columns(&self) -> bool {
        self.status.is_none()
            && self.work.runnable.is_none()
            && self.work.queued.is_none()
            && self.work.priority.is_none()
    }

    /// The values of [`cas_update`]`(self.keeps_row_columns())` for this request, in their
    /// order.
    pub(super) fn cas_binds(&self, now: i64) -> Vec<Bind> {
        let mut binds = Vec::with_capacity(15);
        if self.keeps_row_columns() {
            let schema = i64::from(self.work.schema);
            binds.extend([
                Bind::Int(self.count),
                Bind::Int(now),
                Bind::Int(schema),
                Bind::Int(schema),
            ]);
        } else {
            binds.extend([
                Bind::Int(self.count),
                Bind::OptText(self.status.clone()),
                Bind::Int(now),
            ]);
            binds.extend(work_binds(&self.work, now));
        }
        binds.extend([
            Bind::Text(self.tenant.clone()),
            Bind::Text(self.session.clone()),
            Bind::Int(self.expected),
            Bind::Int(self.epoch),
        ]);
        binds
    }

    /// Adds this request's row of [`set_wise_update`]'s `VALUES` to `binds`.
    pub(super) fn set_wise_binds(&self, binds: &mut Vec<Bind>) {
        binds.extend([
            Bind::Text(self.tenant.clone()),
            Bind::Text(self.session.clone()),
            Bind::Int(self.expected),
            Bind::Int(self.epoch),
            Bind::Int(self.count),
            Bind::OptText(self.status.clone()),
            Bind::OptInt(self.work.runnable.map(i64::from)),
            Bind::OptInt(self.work.queued.map(i64::from)),
            Bind::OptInt(self.work.priority.map(i64::from)),
            Bind::Int(i64::from(self.work.schema)),
        ]);
    }

    /// Adds the values of one event row of this request (an `events` insert's
    /// `(?, ?, ?, ?, ?, ?)`) to `binds`.
    pub(super) fn event_binds(&self, (seq, ty, ts, body): &EventRow, binds: &mut Vec<Bind>) {
        binds.extend([
            Bind::Text(self.tenant.clone()),
            Bind::Text(self.session.clone()),
            Bind::Int(*seq),
            Bind::Text((*ty).to_owned()),
            Bind::Int(*ts),
            Bind::Text(body.clone()),
        ]);
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
    pub(super) fn event_inserts(&self) -> Batch {
        let mut batch = Batch::default();
        for chunk in self.rows.chunks(INSERT_CHUNK) {
            let sql = values_insert(EVENTS_INSERT, "(?, ?, ?, ?, ?, ?)", chunk.len());
            let mut binds = Vec::with_capacity(chunk.len() * 6);
            for row in chunk {
                self.event_binds(row, &mut binds);
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
pub(super) fn cas_condition(p: &str, version: &str, epoch: &str) -> String {
    format!(
        "{} AND {}",
        sql_guard(Mechanism::CasVersion, &format!("{p}version = {version}")),
        sql_guard(
            Mechanism::Fencing,
            &format!("{p}lease_epoch = {epoch} AND {p}lease_owner IS NOT NULL")
        )
    )
}

/// The `SET` assignments of an append that keeps the status and the scheduler's columns
/// ([`AppendRequest::keeps_row_columns`]): only the version, `updated_at` and the rising
/// `schema_version`. No column of an index on `sessions` is assigned, so SQLite leaves the
/// `sessions_by_status` and `sessions_runnable` entries alone and PostgreSQL can make the update
/// heap-only (HOT); assigning a column its own value still rewrites its index entries.
fn slim_assignments(count: &str, now: &str, schema: &str) -> String {
    format!(
        "version = sessions.version + {count}, updated_at = {now}, \
         schema_version = CASE WHEN sessions.schema_version < {schema} THEN {schema} \
         ELSE sessions.schema_version END"
    )
}

/// An append's compare-and-set `UPDATE` of the session row (no `RETURNING`; values:
/// [`AppendRequest::cas_binds`]): adds the events' count to the version, sets the status and
/// the scheduler's columns (only the version, `updated_at` and `schema_version` when `slim`:
/// [`AppendRequest::keeps_row_columns`]), if the version and the lease epoch are the expected
/// ones.
pub(super) fn cas_update(slim: bool) -> String {
    let set = if slim {
        slim_assignments("?", "?", "?")
    } else {
        format!(
            "version = version + ?, status = COALESCE(?, status), updated_at = ?{}",
            work_assignments("?", "?", "?", "?", "?")
        )
    };
    format!(
        "UPDATE sessions SET {set} WHERE tenant_id = ? AND session_id = ? AND {}",
        cas_condition("", "?", "?")
    )
}

/// SQLite: the compare-and-set of `n` requests without extras as one `UPDATE … FROM (VALUES …)
/// RETURNING session_id, runnable, runnable_since` (values: each request's
/// [`AppendRequest::set_wise_binds`], then `now` twice, or once when `slim`: every request
/// [`AppendRequest::keeps_row_columns`]).
pub(super) fn set_wise_update(n: usize, slim: bool) -> String {
    let mut sql =
        String::from("WITH v(t_id, s_id, exp, ep, cnt, st, run, qt, prio, sv) AS (VALUES ");
    for k in 0..n {
        sql.push_str(if k == 0 {
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        } else {
            ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        });
    }
    let set = if slim {
        slim_assignments("v.cnt", "?", "v.sv")
    } else {
        format!(
            "version = sessions.version + v.cnt, status = COALESCE(v.st, sessions.status), \
             updated_at = ?{}",
            work_assignments("v.run", "v.qt", "v.prio", "v.sv", "?")
        )
    };
    sql.push_str(&format!(
        ") UPDATE sessions SET {set} FROM v \
         WHERE sessions.tenant_id = v.t_id AND sessions.session_id = v.s_id \
         AND {} RETURNING session_id, runnable, runnable_since",
        cas_condition("sessions.", "v.exp", "v.ep")
    ));
    sql
}

/// The head of a multi-row `INSERT` of event rows (each `(?, ?, ?, ?, ?, ?)`:
/// [`AppendRequest::event_binds`]).
pub(super) const EVENTS_INSERT: &str =
    "INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ";

/// Most events in one multi-row `INSERT` (6 parameters each, under SQLite's 32,766 limit).
pub(super) const INSERT_CHUNK: usize = 5000;

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
        "WITH upd AS ({} RETURNING tenant_id, session_id, runnable, runnable_since), \
         ins AS (INSERT INTO events (tenant_id, session_id, seq, type, ts, body) \
         SELECT upd.tenant_id, upd.session_id, v.seq, v.type, v.ts, v.body FROM upd CROSS JOIN (VALUES ",
        cas_update(req.keeps_row_columns())
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
    let mut q = bind_all(sqlx::query(&sql), req.cas_binds(now));
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

/// The session row's version, lease epoch and lease owner: what [`cas_failure`] reads.
pub(super) const CLASSIFY: &str =
    "SELECT version, lease_epoch, lease_owner FROM sessions WHERE tenant_id = ? AND session_id = ?";

/// Why the compare-and-set of `req` matched no row (PostgreSQL; SQLite's writer thread reads
/// the same row itself).
async fn classify(
    conn: &mut AnyConnection,
    dialect: Dialect,
    req: &AppendRequest,
) -> Result<CasFailure> {
    let row = sqlx::query(&dialect.sql(CLASSIFY))
        .bind(req.tenant.clone())
        .bind(req.session.clone())
        .fetch_optional(&mut *conn)
        .await?;
    let row = match row {
        Some(row) => Some((
            row.try_get("version")?,
            row.try_get("lease_epoch")?,
            row.try_get("lease_owner")?,
        )),
        None => None,
    };
    Ok(cas_failure(req, row))
}

/// Why the compare-and-set of `req` matched no row, from the session row's [`CLASSIFY`]
/// columns (`None`: no such session): a lease epoch that is not `req`'s, or a released lease,
/// is `Lease`; otherwise the version moved (`Stale`).
pub(super) fn cas_failure(
    req: &AppendRequest,
    row: Option<(i64, i64, Option<String>)>,
) -> CasFailure {
    let Some((version, epoch, owner)) = row else {
        return CasFailure::Missing;
    };
    if epoch != req.epoch || owner.is_none() {
        return CasFailure::Lease {
            current: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
            owner,
        };
    }
    CasFailure::Stale {
        actual: u64::try_from(version).unwrap_or(0),
    }
}

/// An append queued for the group commit, with its caller's reply channel.
pub(crate) struct Pending {
    pub(super) req: AppendRequest,
    pub(super) reply: oneshot::Sender<Result<u64, CasFailure>>,
}

/// The queue of appends waiting for the next SQLite commit.
#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: std::sync::Mutex<Vec<Pending>>,
}

impl GroupCommit {
    /// Queues `req` and returns once a commit that contains it finished. The caller that takes
    /// `writer` (the store's writer lock) leads: it hands every queued request to the writer
    /// thread (`thread`) as one batch, with the lock, which the thread releases when the batch's
    /// transaction ended.
    pub async fn submit(
        &self,
        req: AppendRequest,
        writer: Arc<Mutex<AnyConnection>>,
        pool: &AnyPool,
        thread: &SqliteWriter,
        waiters: Arc<Waiters>,
    ) -> Result<u64, CasFailure> {
        let (reply, mut answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Pending { req, reply });
        // Wait for the writer or for our answer, whichever comes first: a request committed by
        // another leader returns at once instead of queueing behind the next commit (convoy).
        let mut guard = tokio::select! {
            biased;
            done = &mut answer => return done.unwrap_or_else(|_| Err(aborted())),
            guard = writer.lock_owned() => guard,
        };
        // A write on the sqlx writer whose caller dropped it mid-transaction left its rollback
        // queued on sqlx's worker: let it run before the writer thread begins (no cost when
        // there is none). Cancelled here, our request stays queued for the next leader.
        ensure_no_transaction(&mut guard, pool).await;
        let mut batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        // A request whose caller is gone (cancelled while queued) is dropped, not committed
        // later behind the caller's back: its outcome is "not written".
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            // Someone else committed our request while we waited for the writer.
            drop(guard);
        } else {
            // No await between draining and handing over: the batch cannot be lost to
            // cancellation.
            thread.commit(guard, batch, waiters);
        }
        answer.await.unwrap_or_else(|_| Err(aborted()))
    }
}

fn aborted() -> CasFailure {
    CasFailure::Store(StoreError::Conflict(
        "the append's commit ended without an answer; read the journal to learn the outcome".into(),
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

#[cfg(test)]
mod tests;
