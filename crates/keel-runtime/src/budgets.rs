//! Budgets and usage: the tenant's daily totals, read from the store's usage table.
//!
//! Turn and session budgets are checked by the planner from the folded state
//! ([`keel_core::plan::budget_exhausted`]); the tenant's day spans sessions and workers, so its
//! usage comes from the store: every `step.completed` adds its tokens and cost to the tenant's
//! per-day, per-model row in the same transaction (see the `effects` module), so
//! concurrent sessions never under-count.

use chrono::Utc;
use keel_core::{Consumed, TenantId};

use crate::driver::Runner;
use crate::error::Result;

/// The tenant's tokens and cost (USD) on UTC day `day` (`YYYY-MM-DD`), summed over models.
///
/// # Errors
/// Store errors (`InvalidInput` for a malformed day).
pub async fn tenant_usage_on(
    store: &dyn keel_store::Store,
    tenant: TenantId,
    day: &str,
) -> Result<(u64, f64)> {
    let rows = store.usage(tenant, day, day).await?;
    Ok(rows.iter().fold((0, 0.0), |(t, c), r| {
        (t + r.usage.total_tokens(), c + r.cost_usd)
    }))
}

impl Runner {
    /// The tenant's usage today when a tenant daily budget is set (the planner's fact).
    pub(crate) async fn tenant_usage_today(&self) -> Result<Option<Consumed>> {
        let daily = self.config.tenant_daily_budget;
        if daily.max_tokens.is_none() && daily.max_cost_usd.is_none() {
            return Ok(None);
        }
        let day = Utc::now().format("%Y-%m-%d").to_string();
        let (tokens, cost_usd) = tenant_usage_on(self.rt.store.as_ref(), self.tenant, &day).await?;
        Ok(Some(Consumed {
            tokens,
            cost_usd,
            ..Consumed::default()
        }))
    }
}
