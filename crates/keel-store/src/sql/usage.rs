//! The usage ledger's daily rows (tokens and cost per model) and the sealed rows a session's
//! secrets are kept in. Same SQL on both backends.

use keel_core::{SessionId, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{SqlStore, extras, non_negative};
use crate::error::Result;
use crate::types::{SealedKind, UsageRow};

pub(super) fn usage_from_row(row: &AnyRow) -> Result<UsageRow> {
    let day: String = row.try_get("day")?;
    let model: String = row.try_get("model")?;
    let id = format!("{day}/{model}");
    let count =
        |column: &str| -> Result<u64> { non_negative("usage", &id, column, row.try_get(column)?) };
    Ok(UsageRow {
        usage: keel_core::Usage {
            input_tokens: count("input_tokens")?,
            output_tokens: count("output_tokens")?,
            cache_read_tokens: count("cache_read_tokens")?,
            cache_write_tokens: count("cache_write_tokens")?,
            reasoning_tokens: count("reasoning_tokens")?,
        },
        cost_usd: row.try_get("cost_usd")?,
        steps: count("steps")?,
        day,
        model,
    })
}

impl SqlStore {
    pub(super) async fn usage_rows(
        &self,
        tenant: TenantId,
        from_day: &str,
        to_day: &str,
    ) -> Result<Vec<UsageRow>> {
        extras::check_day(from_day)?;
        extras::check_day(to_day)?;
        let rows = sqlx::query(&self.sql(
            "SELECT day, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
             reasoning_tokens, cost_usd, steps FROM usage \
             WHERE tenant_id = ? AND day >= ? AND day <= ? ORDER BY day, model",
        ))
        .bind(tenant.to_string())
        .bind(from_day.to_owned())
        .bind(to_day.to_owned())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter().map(usage_from_row).collect()
    }

    pub(super) async fn sealed_rows_of(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: SealedKind,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = sqlx::query(&self.sql(
            "SELECT item_id, sealed FROM sealed_items \
             WHERE tenant_id = ? AND session_id = ? AND kind = ? ORDER BY item_id",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(kind.as_str())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("item_id")?, r.try_get("sealed")?)))
            .collect()
    }
}
