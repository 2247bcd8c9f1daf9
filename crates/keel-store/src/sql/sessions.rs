//! Session rows: created with their release pinned, read, listed by page and filter, scheduled
//! (`wake_at`) and deleted with everything they own. Same SQL on both backends.

use std::time::Duration;

use chrono::{DateTime, Utc};
use keel_core::{LeaseEpoch, ReleaseId, SessionId, SessionStatus, StateMachine, TenantId};
use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row};

use super::rows::expires_ms;
use super::{
    Commit, Dialect, SqlStore, corrupt, non_negative, not_found, now_ms, parse_id, parse_json,
    time_col,
};
use crate::error::{Result, StoreError};
use crate::types::{DueSession, LeaseInfo, NewSession, SessionQuery, SessionRecord};

pub(super) fn session_from_row(row: &AnyRow) -> Result<SessionRecord> {
    let id: String = row.try_get("session_id")?;
    let status: String = row.try_get("status")?;
    let lease_owner: Option<String> = row.try_get("lease_owner")?;
    let lease_expires_at: Option<i64> = row.try_get("lease_expires_at")?;
    let parent: Option<String> = row.try_get("parent_session_id")?;
    let wake_at: Option<i64> = row.try_get("wake_at")?;
    let metadata: String = row.try_get("metadata")?;
    Ok(SessionRecord {
        tenant_id: parse_id("sessions", &row.try_get::<String, _>("tenant_id")?)?,
        session_id: parse_id("sessions", &id)?,
        release_id: ReleaseId(row.try_get("release_id")?),
        parent_session_id: parent
            .as_deref()
            .map(|p| parse_id("sessions", p))
            .transpose()?,
        status: status
            .parse::<SessionStatus>()
            .map_err(|e| corrupt("sessions", &id, e))?,
        version: non_negative("sessions", &id, "version", row.try_get("version")?)?,
        wake_at: wake_at
            .map(|w| time_col("sessions", &id, "wake_at", w))
            .transpose()?,
        lease: match (lease_owner, lease_expires_at) {
            (Some(owner), Some(exp)) => Some(LeaseInfo {
                owner,
                expires_at: time_col("sessions", &id, "lease_expires_at", exp)?,
            }),
            _ => None,
        },
        lease_epoch: LeaseEpoch(non_negative(
            "sessions",
            &id,
            "lease_epoch",
            row.try_get("lease_epoch")?,
        )?),
        metadata: parse_json("sessions", &id, &metadata)?,
        created_at: time_col("sessions", &id, "created_at", row.try_get("created_at")?)?,
        updated_at: time_col("sessions", &id, "updated_at", row.try_get("updated_at")?)?,
    })
}

pub(super) const SESSION_COLS: &str = "tenant_id, session_id, release_id, parent_session_id, status, version, \
    wake_at, lease_owner, lease_epoch, lease_expires_at, metadata, created_at, updated_at";

impl SqlStore {
    /// Inserts `new`'s row; with `lease = Some((owner, ttl))` the lease is taken in the same
    /// statement (epoch 1). Returns the lease's expiry (Unix ms; 0 without one).
    pub(super) async fn session_create(
        &self,
        tenant: TenantId,
        new: NewSession,
        lease: Option<(&str, Duration)>,
    ) -> Result<i64> {
        let now = now_ms();
        let expires = lease.map_or(0, |(_, ttl)| expires_ms(now, ttl));
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "INSERT INTO sessions (tenant_id, session_id, release_id, parent_session_id, status, version, \
             lease_owner, lease_epoch, lease_expires_at, metadata, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(new.session_id.to_string())
        .bind(new.release_id.0.clone())
        .bind(new.parent_session_id.map(|p| p.to_string()))
        .bind(SessionStatus::Created.as_str())
        .bind(lease.map(|(owner, _)| owner.to_owned()))
        .bind(i64::from(lease.is_some()))
        .bind(lease.map(|_| expires))
        .bind(new.metadata.to_string())
        .bind(now)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "session {} already exists",
                new.session_id
            )));
        }
        self.committed(Commit::Tables);
        Ok(expires)
    }

    pub(super) async fn session_get(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<SessionRecord> {
        let sql =
            format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = ? AND session_id = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("session", session))?;
        session_from_row(&row)
    }

    pub(super) async fn sessions_page(
        &self,
        tenant: TenantId,
        query: &SessionQuery,
    ) -> Result<Vec<SessionRecord>> {
        let mut sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = ?");
        if query.status.is_some() {
            sql.push_str(" AND status = ?");
        }
        if query.wake_before.is_some() {
            sql.push_str(" AND wake_at IS NOT NULL AND wake_at <= ?");
        }
        if query.parent_session_id.is_some() {
            sql.push_str(" AND parent_session_id = ?");
        }
        if query.release_id.is_some() {
            sql.push_str(" AND release_id = ?");
        }
        if query.wake_before.is_some() {
            // Due timers: earliest first.
            sql.push_str(" ORDER BY wake_at, session_id LIMIT ?");
        } else {
            if query.after.is_some() {
                sql.push_str(
                    " AND (created_at, session_id) > \
                     (SELECT created_at, session_id FROM sessions WHERE tenant_id = ? AND session_id = ?)",
                );
            }
            sql.push_str(" ORDER BY created_at, session_id LIMIT ?");
        }
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql).bind(tenant.to_string());
        if let Some(s) = query.status {
            q = q.bind(s.as_str());
        }
        if let Some(w) = query.wake_before {
            q = q.bind(w.timestamp_millis());
        }
        if let Some(p) = query.parent_session_id {
            q = q.bind(p.to_string());
        }
        if let Some(r) = &query.release_id {
            q = q.bind(r.0.clone());
        }
        if let (Some(after), None) = (query.after, query.wake_before) {
            q = q.bind(tenant.to_string()).bind(after.to_string());
        }
        q = q.bind(i64::from(query.limit.unwrap_or(100).min(1000)));
        let rows = q.fetch_all(&self.inner.pool).await?;
        rows.iter().map(session_from_row).collect()
    }

    pub(super) async fn sessions_due(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<DueSession>> {
        let rows = sqlx::query(&self.sql(
            "SELECT tenant_id, session_id, wake_at FROM sessions \
             WHERE wake_at IS NOT NULL AND wake_at <= ? ORDER BY wake_at, session_id LIMIT ?",
        ))
        .bind(before.timestamp_millis())
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("session_id")?;
                Ok(DueSession {
                    tenant_id: parse_id("sessions", &r.try_get::<String, _>("tenant_id")?)?,
                    session_id: parse_id("sessions", &id)?,
                    wake_at: time_col("sessions", &id, "wake_at", r.try_get("wake_at")?)?,
                })
            })
            .collect()
    }

    pub(super) async fn session_set_wake_at(
        &self,
        tenant: TenantId,
        session: SessionId,
        at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE sessions SET wake_at = ?, updated_at = ? WHERE tenant_id = ? AND session_id = ?",
        ))
        .bind(at.map(|t| t.timestamp_millis()))
        .bind(now_ms())
        .bind(tenant.to_string())
        .bind(session.to_string())
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", session));
        }
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn session_delete(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        // The session row goes first: its row lock makes concurrent appends and inserts of owned
        // rows wait for this transaction and then find no session (no orphans).
        let done =
            sqlx::query(&self.sql("DELETE FROM sessions WHERE tenant_id = ? AND session_id = ?"))
                .bind(tenant.to_string())
                .bind(session.to_string())
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", session));
        }
        for table in [
            "events",
            "transcript",
            "effects",
            "approvals",
            "artifacts",
            "intents",
            "sealed_items",
            "usage_reservations",
        ] {
            let sql = format!("DELETE FROM {table} WHERE tenant_id = ? AND session_id = ?");
            sqlx::query(&self.inner.dialect.sql(&sql))
                .bind(tenant.to_string())
                .bind(session.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
    }
}

impl SqlStore {
    pub(super) async fn session_exists<'e, E>(
        &self,
        exec: E,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<bool>
    where
        E: Executor<'e, Database = Any>,
    {
        // PostgreSQL: FOR SHARE holds off a concurrent delete_session until this transaction ends.
        let sql = match self.inner.dialect {
            Dialect::Sqlite => {
                "SELECT 1 AS one FROM sessions WHERE tenant_id = ? AND session_id = ?"
            }
            Dialect::Postgres => {
                "SELECT 1 AS one FROM sessions WHERE tenant_id = $1 AND session_id = $2 FOR SHARE"
            }
        };
        let row = sqlx::query(sql)
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_optional(exec)
            .await?;
        Ok(row.is_some())
    }

    pub(super) async fn require_session(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        if self
            .session_exists(&self.inner.pool, tenant, session)
            .await?
        {
            Ok(())
        } else {
            Err(not_found("session", session))
        }
    }

    pub(super) async fn current_version(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<u64> {
        let row = sqlx::query(
            &self.sql("SELECT version FROM sessions WHERE tenant_id = ? AND session_id = ?"),
        )
        .bind(tenant.to_string())
        .bind(session.to_string())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("session", session))?;
        non_negative("sessions", session, "version", row.try_get("version")?)
    }

    /// Rows of a session-owned table (`select` is `SELECT … FROM table`), optionally in one
    /// status, oldest first then by `id_col`.
    pub(super) async fn list_of_session<T>(
        &self,
        select: &str,
        id_col: &str,
        tenant: TenantId,
        session: SessionId,
        status: Option<&'static str>,
        map: fn(&AnyRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut sql = format!("{select} WHERE tenant_id = ? AND session_id = ?");
        if status.is_some() {
            sql.push_str(" AND status = ?");
        }
        sql.push_str(&format!(" ORDER BY created_at, {id_col}"));
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql)
            .bind(tenant.to_string())
            .bind(session.to_string());
        if let Some(s) = status {
            q = q.bind(s);
        }
        q.fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(map)
            .collect()
    }
}
