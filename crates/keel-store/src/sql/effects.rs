//! The effect journal's rows: one per side-effecting call's operation key, inserted
//! `prepared` (a second insert finds the first), moved along the effect state machine
//! ([`keel_core::check_transition`]) by compare-and-set on the current status.

use keel_core::{
    EffectStatus, OperationKey, SessionId, StateMachine, TenantId, ToolCallId, check_transition,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Commit, SqlStore, corrupt, ms_to_time, not_found, now_ms, parse_id, parse_json};
use crate::error::{Result, StoreError};
use crate::types::{EffectInsert, EffectRecord, EffectUpdate};

pub(super) fn effect_from_row(row: &AnyRow) -> Result<EffectRecord> {
    let key: String = row.try_get("operation_key")?;
    let status: String = row.try_get("status")?;
    let outcome: Option<String> = row.try_get("outcome")?;
    Ok(EffectRecord {
        session_id: parse_id("effects", &row.try_get::<String, _>("session_id")?)?,
        tool_call_id: ToolCallId(row.try_get("tool_call_id")?),
        tool_name: row.try_get("tool_name")?,
        status: status
            .parse::<EffectStatus>()
            .map_err(|e| corrupt("effects", &key, e))?,
        request_hash: row.try_get("request_hash")?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?)
            .map_err(|_| corrupt("effects", &key, "attempts out of range"))?,
        outcome: outcome
            .as_deref()
            .map(|o| parse_json("effects", &key, o))
            .transpose()?,
        error: row.try_get("error")?,
        created_at: ms_to_time(row.try_get("created_at")?),
        updated_at: ms_to_time(row.try_get("updated_at")?),
        operation_key: OperationKey(key),
    })
}

pub(super) const EFFECT_COLS: &str = "operation_key, session_id, tool_call_id, tool_name, status, request_hash, \
    attempts, outcome, error, created_at, updated_at";

impl SqlStore {
    pub(super) async fn effect_insert(
        &self,
        tenant: TenantId,
        effect: &EffectRecord,
    ) -> Result<EffectInsert> {
        if effect.status != EffectStatus::Prepared {
            return Err(StoreError::InvalidInput(format!(
                "effect {} must be inserted as prepared, not {}",
                effect.operation_key, effect.status
            )));
        }
        let now = now_ms();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self
            .session_exists(&mut *tx, tenant, effect.session_id)
            .await?
        {
            return Err(not_found("session", effect.session_id));
        }
        let done = sqlx::query(&self.sql(
            "INSERT INTO effects (tenant_id, operation_key, session_id, tool_call_id, tool_name, status, \
             request_hash, attempts, outcome, error, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(effect.operation_key.0.clone())
        .bind(effect.session_id.to_string())
        .bind(effect.tool_call_id.0.clone())
        .bind(effect.tool_name.clone())
        .bind(effect.status.as_str())
        .bind(effect.request_hash.clone())
        .bind(i64::from(effect.attempts))
        .bind(effect.outcome.as_ref().map(Value::to_string))
        .bind(effect.error.clone())
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            tx.commit().await?;
            self.committed(Commit::Tables);
            return Ok(EffectInsert::Inserted);
        }
        let sql =
            format!("SELECT {EFFECT_COLS} FROM effects WHERE tenant_id = ? AND operation_key = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(effect.operation_key.0.clone())
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(EffectInsert::Existing(effect_from_row(&row)?))
    }

    pub(super) async fn effect_update(
        &self,
        tenant: TenantId,
        key: &OperationKey,
        update: EffectUpdate,
    ) -> Result<EffectRecord> {
        check_transition(update.from, update.to)?;
        let attempts_inc = i64::from(update.to == EffectStatus::Dispatched);
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE effects SET status = ?, attempts = attempts + ?, outcome = COALESCE(?, outcome), \
             error = COALESCE(?, error), updated_at = ? WHERE tenant_id = ? AND operation_key = ? AND status = ?",
        ))
        .bind(update.to.as_str())
        .bind(attempts_inc)
        .bind(update.outcome.as_ref().map(Value::to_string))
        .bind(update.error.clone())
        .bind(now_ms())
        .bind(tenant.to_string())
        .bind(key.0.clone())
        .bind(update.from.as_str())
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() > 0 {
            self.committed(Commit::Tables);
        }
        let current = self.effect_get(tenant, key).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "effect {key} is {}, not {}",
                current.status, update.from
            )));
        }
        Ok(current)
    }

    pub(super) async fn effect_get(
        &self,
        tenant: TenantId,
        key: &OperationKey,
    ) -> Result<EffectRecord> {
        let sql =
            format!("SELECT {EFFECT_COLS} FROM effects WHERE tenant_id = ? AND operation_key = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(key.0.clone())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("effect", key))?;
        effect_from_row(&row)
    }

    pub(super) async fn effects_of(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<EffectStatus>,
    ) -> Result<Vec<EffectRecord>> {
        let sql = format!("SELECT {EFFECT_COLS} FROM effects");
        self.list_of_session(
            &sql,
            "operation_key",
            tenant,
            session,
            status.map(|s| s.as_str()),
            effect_from_row,
        )
        .await
    }
}
