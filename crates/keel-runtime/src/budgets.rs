//! Budgets and usage: the tenant's daily budget as a reservation, and the tenant's daily totals.
//!
//! Turn and session budgets are checked by the planner from the folded state
//! ([`keel_core::plan::budget_exhausted`]); the tenant's day spans sessions and workers, so it
//! lives in the store. Every `step.completed` adds its tokens and cost to the tenant's per-day,
//! per-model row in the same transaction as the event (the `effects` module's side rows).
//!
//! **Reservation before each step.** Before the planner is asked about a new step, the driver
//! reserves that step's worst case ([`step_worst_case`]: the context it will send plus
//! [`OUTPUT_ALLOWANCE_TOKENS`], priced at the dearest model of the route) against the tenant's
//! daily limits ([`keel_store::Store::reserve_usage`]): granted only while the day's usage plus
//! the other running sessions' reservations is under each limit, and capped at what is left. The
//! step's end releases it in the commit that adds its real usage (`step.completed`,
//! `step.failed` or `turn.finished` stage [`keel_store::AppendExtras::release_reservation`]); a
//! crashed worker's reservation lapses with its lease. The planner sees the day's usage as its
//! fact: usage at a limit ends the turn `budget_exhausted` naming `tokens` or `cost`. When only
//! other sessions' reservations hold the rest, the step waits for one of them to settle.
//!
//! So N sessions running at once overshoot the tenant's day by at most what their in-flight
//! steps use beyond their reservations: at most one step per running session, and at most one
//! step (the last, whose reservation was capped) when the worst cases hold. Before reservations,
//! each session only checked that the day's usage was under the limit, so every running session
//! could start a step on the same remaining budget.

use std::time::Duration;

use chrono::Utc;
use keel_core::{Consumed, TenantId};
use keel_store::{Reservation, StoreError, UsageAmount, UsageReservation};

use crate::driver::Runner;
use crate::error::{Result, RuntimeError};

/// Output tokens a step is assumed to produce at most when reserving, tokens. Requests carry no
/// `max_tokens`, so no provider bound is known; this is the Anthropic adapter's default.
pub const OUTPUT_ALLOWANCE_TOKENS: u64 = 8_192;

/// How often a step whose budget other sessions hold asks again, ms.
const BUSY_POLL_MS: u64 = 100;

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
    Ok(rows.iter().fold((0u64, 0.0), |(t, c), r| {
        (
            t.saturating_add(r.usage.total_tokens()),
            c + keel_core::finite_cost(r.cost_usd),
        )
    }))
}

/// The worst case of a step that sends about `context_tokens` tokens, for its reservation:
/// tokens (context plus [`OUTPUT_ALLOWANCE_TOKENS`]) and their cost in USD at the dearest price
/// among `members` (the route's models; an unpriced model counts as free).
pub fn step_worst_case(
    context_tokens: u64,
    members: &[&str],
    prices: &keel_model::PriceTable,
) -> UsageAmount {
    let usage = keel_model::Usage {
        input_tokens: context_tokens,
        output_tokens: OUTPUT_ALLOWANCE_TOKENS,
        ..keel_model::Usage::default()
    };
    let cost_usd = members
        .iter()
        .filter_map(|m| prices.cost_usd(m, &usage))
        .filter(|c| c.is_finite())
        .fold(0.0, f64::max);
    UsageAmount {
        tokens: context_tokens.saturating_add(OUTPUT_ALLOWANCE_TOKENS),
        cost_usd,
    }
}

impl Runner {
    /// Reserves the next step's worst case against the tenant's daily budget, when one is set,
    /// waiting while other sessions' reservations hold the rest of it. Returns the day's usage
    /// (the planner's fact: at a limit, it ends the turn), or `None` without a tenant budget or
    /// when the turn was cancelled while waiting.
    ///
    /// # Errors
    /// [`RuntimeError::LeaseLost`] when another worker took the session over; store errors.
    pub(crate) async fn reserve_step(&self, context_tokens: u64) -> Result<Option<Consumed>> {
        let daily = self.config.tenant_daily_budget;
        if daily.max_tokens.is_none() && daily.max_cost_usd.is_none() {
            return Ok(None);
        }
        let worst = step_worst_case(
            context_tokens,
            &self.model.members(),
            &self.rt.options.prices,
        );
        let epoch = self.read(|j| j.epoch).await;
        let token = self.turn_token();
        let consumed = |used: UsageAmount| Consumed {
            tokens: used.tokens,
            cost_usd: used.cost_usd,
            ..Consumed::default()
        };
        loop {
            let ask = UsageReservation {
                session_id: self.session,
                lease_epoch: epoch,
                day: Utc::now().format("%Y-%m-%d").to_string(),
                tokens: worst.tokens,
                cost_usd: worst.cost_usd,
                max_tokens: daily.max_tokens,
                max_cost_usd: daily.max_cost_usd,
            };
            match self.rt.store.reserve_usage(self.tenant, &ask).await {
                Ok(Reservation::Granted { used, .. } | Reservation::Exhausted { used, .. }) => {
                    return Ok(Some(consumed(used)));
                }
                Ok(Reservation::Busy {
                    limit,
                    used,
                    reserved,
                }) => {
                    tracing::debug!(
                        session = %self.session, limit = ?limit, used_tokens = used.tokens,
                        reserved_tokens = reserved.tokens,
                        "tenant budget held by other sessions' steps; waiting"
                    );
                }
                Err(StoreError::LeaseLost { .. }) => return Err(self.lease_lost()),
                Err(e) => return Err(RuntimeError::Store(e)),
            }
            tokio::select! {
                () = token.cancelled() => return Ok(None),
                () = tokio::time::sleep(Duration::from_millis(BUSY_POLL_MS)) => {}
            }
        }
    }
}
