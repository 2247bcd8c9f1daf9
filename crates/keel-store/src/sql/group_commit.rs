//! Journal appends: the compare-and-set write shared by both backends, and SQLite's group commit.
//!
//! Group commit (SQLite): an append queues its request, then takes the writer. Whoever holds the
//! writer drains the whole queue and commits it in one `BEGIN IMMEDIATE … COMMIT` (one fsync),
//! with set-wise statements (one `UPDATE … FROM (VALUES …)` for every compare-and-set, one
//! multi-row `INSERT` for every event); a refused compare-and-set writes nothing, and a failing
//! statement makes each request retry alone, so one bad request affects only itself. The commit
//! runs in a spawned task: a caller that is cancelled mid-commit cannot leave the writer inside a
//! transaction or abandon other callers' appends. A request whose caller
//! was cancelled before its batch committed may still be committed; callers read the journal to
//! learn the outcome, as after any interrupted write.

use std::sync::Arc;

use keel_core::{Event, LeaseEpoch, SessionId, StateMachine, TenantId};
use sqlx::{AnyConnection, Connection, Row};
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use super::waiters::Waiters;
use super::{Dialect, now_ms, to_i64};
use crate::error::{Result, StoreError};

/// One event row: seq, type, timestamp (Unix ms), encoded envelope.
type EventRow = (i64, &'static str, i64, String);

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
}

impl AppendRequest {
    pub fn new(
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        epoch: LeaseEpoch,
        events: &[Event],
    ) -> Result<Self> {
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
        })
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

/// Writes one append inside the caller's transaction. The outer error is a database error; the
/// inner one a refused compare-and-set (nothing written).
pub(crate) async fn apply_one(
    conn: &mut AnyConnection,
    dialect: Dialect,
    req: &AppendRequest,
) -> Result<Result<u64, CasFailure>> {
    let done = sqlx::query(&dialect.sql(
        "UPDATE sessions SET version = version + ?, status = COALESCE(?, status), updated_at = ? \
         WHERE tenant_id = ? AND session_id = ? AND version = ? AND lease_epoch = ? AND lease_owner IS NOT NULL",
    ))
    .bind(req.count)
    .bind(req.status.clone())
    .bind(now_ms())
    .bind(req.tenant.clone())
    .bind(req.session.clone())
    .bind(req.expected)
    .bind(req.epoch)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(Err(classify(conn, dialect, req).await?));
    }
    let insert = dialect.sql(
        "INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES (?, ?, ?, ?, ?, ?)",
    );
    for (seq, ty, ts, body) in &req.rows {
        sqlx::query(&insert)
            .bind(req.tenant.clone())
            .bind(req.session.clone())
            .bind(*seq)
            .bind(*ty)
            .bind(*ts)
            .bind(body.clone())
            .execute(&mut *conn)
            .await?;
    }
    Ok(Ok(u64::try_from(req.expected + req.count).unwrap_or(0)))
}

/// PostgreSQL: the whole append — compare-and-set, event rows and the wake-up notification — as
/// one statement (data-modifying CTEs run atomically in one implicit transaction, one round trip).
/// The events are inserted, and the notification sent, only if the compare-and-set matched.
pub(crate) async fn append_postgres(
    pool: &sqlx::AnyPool,
    channel: &str,
    req: &AppendRequest,
) -> Result<Result<u64, CasFailure>> {
    let mut sql = String::from(
        "WITH upd AS (UPDATE sessions SET version = version + ?, status = COALESCE(?, status), updated_at = ? \
         WHERE tenant_id = ? AND session_id = ? AND version = ? AND lease_epoch = ? AND lease_owner IS NOT NULL \
         RETURNING tenant_id, session_id), \
         ins AS (INSERT INTO events (tenant_id, session_id, seq, type, ts, body) \
         SELECT upd.tenant_id, upd.session_id, v.seq, v.type, v.ts, v.body FROM upd CROSS JOIN (VALUES ",
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
         note AS (SELECT pg_notify(?, ?) FROM upd) \
         SELECT (SELECT count(*) FROM upd) AS updated, (SELECT count(*) FROM note) AS notified",
    );
    let sql = Dialect::Postgres.sql(&sql);
    let mut q = sqlx::query(&sql)
        .bind(req.count)
        .bind(req.status.clone())
        .bind(now_ms())
        .bind(req.tenant.clone())
        .bind(req.session.clone())
        .bind(req.expected)
        .bind(req.epoch);
    for (seq, ty, ts, body) in &req.rows {
        q = q.bind(*seq).bind(*ty).bind(*ts).bind(body.clone());
    }
    let row = q
        .bind(channel.to_owned())
        .bind(req.session.clone())
        .fetch_one(pool)
        .await?;
    if row.try_get::<i64, _>("updated")? == 1 {
        return Ok(Ok(u64::try_from(req.expected + req.count).unwrap_or(0)));
    }
    let mut conn = pool.acquire().await?;
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
            let task = tokio::spawn(commit_batch(guard, batch, waiters));
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

async fn commit_batch(
    mut conn: OwnedMutexGuard<AnyConnection>,
    batch: Vec<Pending>,
    waiters: Arc<Waiters>,
) {
    match run_batch(&mut conn, &batch).await {
        Ok(results) => {
            for (pending, result) in batch.into_iter().zip(results) {
                if result.is_ok() {
                    waiters.notify(pending.req.session_id);
                }
                let _ = pending.reply.send(result);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for pending in batch {
                let _ = pending
                    .reply
                    .send(Err(CasFailure::Store(StoreError::Database(
                        sqlx::Error::Protocol(msg.clone()),
                    ))));
            }
        }
    }
}

/// Most requests in one batched `UPDATE` (6 parameters each, under SQLite's 32,766 limit).
const UPDATE_CHUNK: usize = 2000;
/// Most events in one batched `INSERT` (6 parameters each).
const INSERT_CHUNK: usize = 5000;

/// Commits a batch. The fast path writes the whole batch with a handful of set-wise statements;
/// if any statement fails (a corrupt row, a constraint), the transaction rolls back as a whole and
/// every request is retried alone, so only the faulty one fails.
async fn run_batch(
    conn: &mut AnyConnection,
    batch: &[Pending],
) -> Result<Vec<Result<u64, CasFailure>>> {
    match run_batch_set_wise(conn, batch).await {
        Ok(results) => Ok(results),
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "batched append failed; retrying requests one by one");
            let mut results = Vec::with_capacity(batch.len());
            for pending in batch {
                results.push(append_alone(conn, &pending.req).await);
            }
            Ok(results)
        }
    }
}

/// One request in its own transaction; every failure is this request's own.
async fn append_alone(conn: &mut AnyConnection, req: &AppendRequest) -> Result<u64, CasFailure> {
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
        // Dropping the transaction rolls it back.
        Err(e) => Err(CasFailure::Store(e)),
    }
}

/// One transaction: per round (each session at most once per round, in arrival order), one
/// `UPDATE … FROM (VALUES …) RETURNING` does every compare-and-set; then one multi-row `INSERT`
/// writes the events of the requests that won.
async fn run_batch_set_wise(
    conn: &mut AnyConnection,
    batch: &[Pending],
) -> Result<Vec<Result<u64, CasFailure>>> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut results: Vec<Option<Result<u64, CasFailure>>> =
        (0..batch.len()).map(|_| None).collect();
    let mut won: Vec<usize> = Vec::with_capacity(batch.len());
    let mut remaining: Vec<usize> = (0..batch.len()).collect();
    let now = now_ms();
    while !remaining.is_empty() {
        let mut seen = std::collections::HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = remaining
            .iter()
            .partition(|&&i| seen.insert(batch[i].req.session.as_str()));
        for chunk in round.chunks(UPDATE_CHUNK) {
            let mut sql = String::from("WITH v(t_id, s_id, exp, ep, cnt, st) AS (VALUES ");
            for k in 0..chunk.len() {
                sql.push_str(if k == 0 {
                    "(?, ?, ?, ?, ?, ?)"
                } else {
                    ", (?, ?, ?, ?, ?, ?)"
                });
            }
            sql.push_str(
                ") UPDATE sessions SET version = sessions.version + v.cnt, \
                 status = COALESCE(v.st, sessions.status), updated_at = ? FROM v \
                 WHERE sessions.tenant_id = v.t_id AND sessions.session_id = v.s_id \
                 AND sessions.version = v.exp AND sessions.lease_epoch = v.ep \
                 AND sessions.lease_owner IS NOT NULL RETURNING session_id",
            );
            let mut q = sqlx::query(&sql);
            for &i in chunk {
                let r = &batch[i].req;
                q = q
                    .bind(r.tenant.clone())
                    .bind(r.session.clone())
                    .bind(r.expected)
                    .bind(r.epoch)
                    .bind(r.count)
                    .bind(r.status.clone());
            }
            let rows = q.bind(now).fetch_all(&mut *tx).await?;
            let mut updated = std::collections::HashSet::new();
            for row in rows {
                updated.insert(row.try_get::<String, _>("session_id")?);
            }
            for &i in chunk {
                let r = &batch[i].req;
                if updated.contains(&r.session) {
                    results[i] = Some(Ok(u64::try_from(r.expected + r.count).unwrap_or(0)));
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
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut sql =
            String::from("INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ");
        for k in 0..chunk.len() {
            sql.push_str(if k == 0 {
                "(?, ?, ?, ?, ?, ?)"
            } else {
                ", (?, ?, ?, ?, ?, ?)"
            });
        }
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
        q.execute(&mut *tx).await?;
    }
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
