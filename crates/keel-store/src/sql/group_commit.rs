//! Journal appends: the compare-and-set write shared by both backends, and SQLite's group commit.
//!
//! Group commit (SQLite): an append queues its request, then takes the writer. Whoever holds the
//! writer drains the whole queue and commits it in one `BEGIN IMMEDIATE … COMMIT` (one fsync),
//! each request inside its own savepoint so a failed compare-and-set or a bad row affects only
//! that request. The commit runs in a spawned task: a caller that is cancelled mid-commit cannot
//! leave the writer inside a transaction or abandon other callers' appends. A request whose caller
//! was cancelled before its batch committed may still be committed; callers read the journal to
//! learn the outcome, as after any interrupted write.

use std::sync::Arc;

use keel_core::{Event, LeaseEpoch, SessionId, StateMachine, TenantId};
use sqlx::{AnyConnection, Connection, Row};
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use super::waiters::Waiters;
use super::{Dialect, now_ms, to_i64};
use crate::error::{Result, StoreError};

/// An append, ready to write.
pub(crate) struct AppendRequest {
    session_id: SessionId,
    tenant: String,
    session: String,
    expected: i64,
    epoch: i64,
    count: i64,
    status: Option<String>,
    rows: Vec<(i64, &'static str, i64, String)>,
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
            rows.push((
                to_i64(ev.seq)?,
                ev.type_name(),
                ev.ts.timestamp_millis(),
                ev.encode(),
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
        let row = sqlx::query(&dialect.sql(
            "SELECT version, lease_epoch, lease_owner FROM sessions WHERE tenant_id = ? AND session_id = ?",
        ))
        .bind(req.tenant.clone())
        .bind(req.session.clone())
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(Err(CasFailure::Missing));
        };
        let version: i64 = row.try_get("version")?;
        let epoch: i64 = row.try_get("lease_epoch")?;
        let owner: Option<String> = row.try_get("lease_owner")?;
        if epoch != req.epoch || owner.is_none() {
            return Ok(Err(CasFailure::Lease {
                current: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
                owner,
            }));
        }
        return Ok(Err(CasFailure::Stale {
            actual: u64::try_from(version).unwrap_or(0),
        }));
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
        let (reply, answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Pending { req, reply });
        let guard = writer.lock_owned().await;
        let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            // Someone else committed our request while we waited for the writer.
            drop(guard);
        } else {
            // No await between draining and spawning: the batch cannot be lost to cancellation.
            let task = tokio::spawn(commit_batch(guard, batch, waiters));
            let _ = task.await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(CasFailure::Store(StoreError::Conflict(
                "the append's commit task ended without an answer; read the journal to learn the outcome".into(),
            )))
        })
    }
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

async fn run_batch(
    conn: &mut AnyConnection,
    batch: &[Pending],
) -> Result<Vec<Result<u64, CasFailure>>> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut results = Vec::with_capacity(batch.len());
    for pending in batch {
        sqlx::query("SAVEPOINT keel_append")
            .execute(&mut *tx)
            .await?;
        let result = match apply_one(&mut tx, Dialect::Sqlite, &pending.req).await {
            Ok(r) => r,
            Err(e) => Err(CasFailure::Store(e)),
        };
        if result.is_err() {
            sqlx::query("ROLLBACK TO keel_append")
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("RELEASE keel_append").execute(&mut *tx).await?;
        results.push(result);
    }
    tx.commit().await?;
    Ok(results)
}
