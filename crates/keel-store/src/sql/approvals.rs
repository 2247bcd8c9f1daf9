//! Approval rows: created when a call waits on a human, decided once (compare-and-set on
//! `status = 'pending'`), expired, or withdrawn with their turn. Same SQL on both backends.

use chrono::{DateTime, Utc};
use keel_core::mechanisms::Mechanism;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Decided, PrincipalId, SessionId,
    StateMachine, TenantId, ToolCallId, TurnId,
};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Commit, SqlStore, corrupt, ms_to_time, not_found, now_ms, parse_id, parse_json};
use crate::error::{Result, StoreError};

pub(super) fn approval_from_row(row: &AnyRow) -> Result<ApprovalRecord> {
    let id: String = row.try_get("approval_id")?;
    let status: String = row.try_get("status")?;
    let decision: Option<String> = row.try_get("decision")?;
    let decided_at: Option<i64> = row.try_get("decided_at")?;
    let decided_by: Option<String> = row.try_get("decided_by")?;
    Ok(ApprovalRecord {
        approval_id: parse_id("approvals", &id)?,
        session_id: parse_id("approvals", &row.try_get::<String, _>("session_id")?)?,
        turn_id: parse_id::<TurnId>("approvals", &row.try_get::<String, _>("turn_id")?)?,
        tool_call_id: ToolCallId(row.try_get("tool_call_id")?),
        tool_name: row.try_get("tool_name")?,
        arguments: parse_json("approvals", &id, &row.try_get::<String, _>("arguments")?)?,
        args_hash: row.try_get("args_hash")?,
        status: status
            .parse::<ApprovalStatus>()
            .map_err(|e| corrupt("approvals", &id, e))?,
        decision: decision
            .as_deref()
            .map(|d| {
                serde_json::from_str::<ApprovalDecision>(d)
                    .map_err(|e| corrupt("approvals", &id, e))
            })
            .transpose()?,
        created_at: ms_to_time(row.try_get("created_at")?),
        expires_at: ms_to_time(row.try_get("expires_at")?),
        decided_at: decided_at.map(ms_to_time),
        decided_by: decided_by
            .as_deref()
            .map(|p| parse_id("approvals", p))
            .transpose()?,
    })
}

pub(super) const APPROVAL_COLS: &str = "approval_id, session_id, turn_id, tool_call_id, tool_name, arguments, \
    args_hash, status, decision, created_at, expires_at, decided_at, decided_by";

impl SqlStore {
    pub(super) async fn approval_create(&self, tenant: TenantId, a: &ApprovalRecord) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, a.session_id).await? {
            return Err(not_found("session", a.session_id));
        }
        let done = sqlx::query(&self.sql(
            "INSERT INTO approvals (tenant_id, approval_id, session_id, turn_id, tool_call_id, tool_name, \
             arguments, args_hash, status, decision, created_at, expires_at, decided_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(a.approval_id.to_string())
        .bind(a.session_id.to_string())
        .bind(a.turn_id.to_string())
        .bind(a.tool_call_id.0.clone())
        .bind(a.tool_name.clone())
        .bind(a.arguments.to_string())
        .bind(a.args_hash.clone())
        .bind(a.status.as_str())
        .bind(a.decision.as_ref().map(|d| serde_json::to_string(d).unwrap_or_default()))
        .bind(a.created_at.timestamp_millis())
        .bind(a.expires_at.timestamp_millis())
        .bind(a.decided_at.map(|t| t.timestamp_millis()))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "approval {} already exists",
                a.approval_id
            )));
        }
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn approval_get(
        &self,
        tenant: TenantId,
        id: ApprovalId,
    ) -> Result<ApprovalRecord> {
        let sql = format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE tenant_id = ? AND approval_id = ?"
        );
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(id.to_string())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("approval", id))?;
        approval_from_row(&row)
    }

    pub(super) async fn approval_decide(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
        by: Option<PrincipalId>,
    ) -> Result<Decided> {
        // Decide against the current row, then write only if it is still pending (compare-and-set);
        // a racing decision makes the second round see the winner and answer idempotently or refuse.
        for _ in 0..3 {
            let current = self.approval_get(tenant, id).await?;
            let next = match current.decide(decision.clone(), args_hash, now)? {
                Decided::Already(rec) => return Ok(Decided::Already(rec)),
                Decided::Now(next) => next,
            };
            let mut conn = self.write_conn().await?;
            let mut tx = self.begin(&mut conn).await?;
            // The decision is work for whichever worker claims the session: it is due now (an
            // earlier wake-up time stays), and the workers are woken. The session row is
            // written first, as appends and deletions lock it before the approval rows (no
            // deadlock on PostgreSQL); a refused decision rolls it back.
            let due = now.timestamp_millis().min(now_ms());
            sqlx::query(&self.sql(
                "UPDATE sessions SET wake_at = ? WHERE tenant_id = ? AND session_id = ? \
                 AND (wake_at IS NULL OR wake_at > ?)",
            ))
            .bind(due)
            .bind(tenant.to_string())
            .bind(current.session_id.to_string())
            .bind(due)
            .execute(&mut *tx)
            .await?;
            let done = sqlx::query(&self.sql(&format!(
                "UPDATE approvals SET status = ?, decision = ?, decided_at = ?, decided_by = ? \
                 WHERE tenant_id = ? AND approval_id = ? AND {}",
                keel_core::mechanisms::sql_guard(Mechanism::DecisionOnce, "status = 'pending'")
            )))
            .bind(next.status.as_str())
            .bind(
                next.decision
                    .as_ref()
                    .map(|d| serde_json::to_string(d).unwrap_or_default()),
            )
            .bind(now.timestamp_millis())
            .bind(by.map(|p| p.to_string()))
            .bind(tenant.to_string())
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                self.note_work(&mut tx, tenant, current.session_id).await?;
                tx.commit().await?;
                self.committed(Commit::Tables);
                self.woke_locally();
                // Return the row as stored (timestamps at the store's millisecond precision).
                drop(conn);
                return Ok(Decided::Now(self.approval_get(tenant, id).await?));
            }
            tx.rollback().await?;
        }
        Err(StoreError::Conflict(format!(
            "approval {id} kept changing while being decided"
        )))
    }

    pub(super) async fn approval_expire(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE approvals SET status = 'expired', decided_at = ? \
             WHERE tenant_id = ? AND approval_id = ? AND status = 'pending' AND expires_at <= ?",
        ))
        .bind(now.timestamp_millis())
        .bind(tenant.to_string())
        .bind(id.to_string())
        .bind(now.timestamp_millis())
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() > 0 {
            self.committed(Commit::Tables);
        }
        let rec = self.approval_get(tenant, id).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "approval {id} is {} and expires at {}; not expired at {now}",
                rec.status, rec.expires_at
            )));
        }
        Ok(rec)
    }

    pub(super) async fn approvals_withdraw(
        &self,
        tenant: TenantId,
        session: SessionId,
        turn: TurnId,
        now: DateTime<Utc>,
    ) -> Result<Vec<ApprovalId>> {
        let mut conn = self.write_conn().await?;
        let rows = sqlx::query(&self.sql(
            "UPDATE approvals SET status = 'expired', decided_at = ? \
             WHERE tenant_id = ? AND session_id = ? AND turn_id = ? AND status = 'pending' \
             RETURNING approval_id",
        ))
        .bind(now.timestamp_millis())
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(turn.to_string())
        .fetch_all(&mut *conn)
        .await?;
        drop(conn);
        if !rows.is_empty() {
            self.committed(Commit::Tables);
        }
        rows.iter()
            .map(|r| parse_id("approvals", &r.try_get::<String, _>("approval_id")?))
            .collect()
    }

    pub(super) async fn approvals_of(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<ApprovalStatus>,
    ) -> Result<Vec<ApprovalRecord>> {
        let sql = format!("SELECT {APPROVAL_COLS} FROM approvals");
        self.list_of_session(
            &sql,
            "approval_id",
            tenant,
            session,
            status.map(|s| s.as_str()),
            approval_from_row,
        )
        .await
    }
}
