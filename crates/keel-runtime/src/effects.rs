//! The effects table and the usage table beside the journal.
//!
//! The journal is authoritative for every effect (`effect.*` events). The store's effects table
//! (operation key → status, request hash, attempts, outcome) follows it so that other workers
//! and operators can query effects without folding journals
//! (`list_effects(session, Some(OutcomeUnknown))`). Each staged `effect.*` event derives the
//! effect's row ([`side_rows`]), and the row commits in the same store transaction as the event
//! ([`keel_store::AppendExtras`]): the table can never claim a dispatch the journal does not
//! have. The same goes for usage: every `step.completed` adds its tokens and cost to the
//! tenant's per-day, per-model totals in that transaction, and ends the session's reservation
//! against the tenant's day (as `step.failed` and `turn.finished` do; see [`crate::budgets`]);
//! a failed attempt's usage (`step.attempt_failed`, `step.failed`) is added the same way under
//! the model that served it.
//!
//! A worker that starts a session reconciles the whole table with the journal ([`reconcile`]),
//! which repairs rows written by builds that kept the table apart from the journal. A row that
//! cannot follow (the table's transition table refuses the move) is logged and left: the
//! journal wins.

use std::collections::HashMap;

use chrono::Utc;
use keel_core::mechanisms::{Mechanism, is_off};
use keel_core::state::EffectState;
use keel_core::{
    EffectStatus, Event, EventBody, OperationKey, SessionState, StateMachine, TenantId,
};
use keel_store::{
    AppendExtras, EffectInsert, EffectRecord, EffectUpdate, Store, StoreError, UsageDelta,
};
use serde_json::Value;

use crate::error::Result;

/// A new `prepared` row for `effect` of `state`'s session.
pub(crate) fn record(
    state: &SessionState,
    key: &OperationKey,
    tool_call_id: &keel_core::ToolCallId,
    tool_name: &str,
    request_hash: &str,
) -> Option<EffectRecord> {
    let now = Utc::now();
    Some(EffectRecord {
        operation_key: key.clone(),
        session_id: state.session_id?,
        tool_call_id: tool_call_id.clone(),
        tool_name: tool_name.to_owned(),
        status: EffectStatus::Prepared,
        request_hash: request_hash.to_owned(),
        attempts: 0,
        outcome: None,
        error: None,
        created_at: now,
        updated_at: now,
    })
}

/// The side-table rows event `ev` (already folded into `state`) brings: its effect's row as the
/// journal now has it, the usage of a completed step, or a re-pin's new release for the session
/// row. Merged into `extras`, which commit with
/// the event.
pub(crate) fn side_rows(state: &SessionState, ev: &Event, extras: &mut AppendExtras) {
    let (outcome, error) = match &ev.body {
        EventBody::SessionReleasePinned { to_release_id, .. } => {
            // The session row follows the re-pin in the same commit.
            extras.release_id = Some(to_release_id.clone());
            return;
        }
        EventBody::StepCompleted {
            model,
            usage,
            cost_usd,
            ..
        } => {
            extras.usage.push(usage_row(ev, model, usage, *cost_usd, 1));
            extras.release_reservation = true;
            return;
        }
        // A failed attempt's usage counts too, under the model that served it (a retry goes
        // on under the step's reservation).
        EventBody::StepAttemptFailed {
            model,
            usage,
            cost_usd,
            ..
        } => {
            if !usage.is_zero() || keel_core::finite_cost(*cost_usd) > 0.0 {
                extras.usage.push(usage_row(ev, model, usage, *cost_usd, 0));
            }
            return;
        }
        // The step ended (or the turn): its reservation against the tenant's day ends with it,
        // in the commit that counts what its last attempt used.
        EventBody::StepFailed {
            usage, cost_usd, ..
        } => {
            if !usage.is_zero() || keel_core::finite_cost(*cost_usd) > 0.0 {
                let model = ev
                    .correlation
                    .step_id
                    .and_then(|s| state.steps.get(&s))
                    .map(|s| s.model.clone())
                    .unwrap_or_default();
                extras
                    .usage
                    .push(usage_row(ev, &model, usage, *cost_usd, 0));
            }
            extras.release_reservation = true;
            return;
        }
        EventBody::TurnFinished { .. } => {
            extras.release_reservation = true;
            return;
        }
        EventBody::EffectPrepared { .. }
        | EventBody::EffectDispatched {}
        | EventBody::EffectOutcomeUnknown {} => (None, None),
        EventBody::EffectCommitted { outcome } => (Some(outcome.clone()), None),
        EventBody::EffectFailed { error } => (None, Some(error.clone())),
        _ => return,
    };
    // A first dispatch claims its key: the append is refused if the table records a dispatch
    // this journal lacks (`StoreError::EffectClaimed`). A settled effect claims nothing.
    if let Some(key) = &ev.correlation.operation_key {
        match &ev.body {
            EventBody::EffectPrepared { .. } if !is_off(Mechanism::EffectClaim) => {
                if !extras.claims.contains(key) {
                    extras.claims.push(key.clone());
                }
            }
            EventBody::EffectPrepared { .. } | EventBody::EffectDispatched {} => {}
            _ => extras.claims.retain(|k| k != key),
        }
    }
    let Some(effect) = ev
        .correlation
        .operation_key
        .as_ref()
        .and_then(|k| state.effects.get(k))
    else {
        return;
    };
    let name = state
        .tool_calls
        .get(&effect.tool_call_id)
        .map_or("", |c| c.name.as_str());
    let Some(mut row) = record(
        state,
        &effect.key,
        &effect.tool_call_id,
        name,
        &effect.request_hash,
    ) else {
        return;
    };
    row.status = effect.status;
    row.attempts = effect.attempts;
    row.created_at = ev.ts;
    row.updated_at = ev.ts;
    match extras
        .effects
        .iter_mut()
        .find(|r| r.operation_key == effect.key)
    {
        Some(existing) => {
            row.created_at = existing.created_at;
            row.outcome = outcome.or(existing.outcome.take());
            row.error = error.or(existing.error.take());
            *existing = row;
        }
        None => {
            row.outcome = outcome;
            row.error = error;
            extras.effects.push(row);
        }
    }
}

/// The usage row of `usage` tokens costing `cost_usd` USD served by `model`, counting `steps`
/// completed steps, on the day of `ev`. A cost that is not a finite, non-negative amount is 0.
fn usage_row(
    ev: &Event,
    model: &str,
    usage: &keel_core::Usage,
    cost_usd: f64,
    steps: u32,
) -> UsageDelta {
    UsageDelta {
        day: ev.ts.format("%Y-%m-%d").to_string(),
        model: model.to_owned(),
        usage: *usage,
        cost_usd: keel_core::finite_cost(cost_usd),
        steps,
    }
}

/// Moves `row` (or a new row, when `None`) to the journal's `effect` by compare-and-set, through
/// `dispatched` when the table needs the step. `outcome` / `error` are recorded with `committed` /
/// `failed`.
pub(crate) async fn sync(
    store: &dyn Store,
    tenant: TenantId,
    state: &SessionState,
    effect: &EffectState,
    row: Option<EffectRecord>,
    outcome: Option<Value>,
    error: Option<String>,
) {
    let key = &effect.key;
    let mut status = match row {
        Some(r) => r.status,
        None => {
            let name = state
                .tool_calls
                .get(&effect.tool_call_id)
                .map_or("", |c| c.name.as_str());
            let Some(rec) = record(state, key, &effect.tool_call_id, name, &effect.request_hash)
            else {
                return;
            };
            match store.insert_effect(tenant, &rec).await {
                Ok(EffectInsert::Inserted) => EffectStatus::Prepared,
                Ok(EffectInsert::Existing(r)) => r.status,
                Err(e) => {
                    tracing::warn!(%key, "effects table: insert failed: {e}");
                    return;
                }
            }
        }
    };
    while status != effect.status {
        let to = if EffectStatus::can_transition(status, effect.status) {
            effect.status
        } else if status == EffectStatus::Prepared {
            EffectStatus::Dispatched
        } else {
            tracing::warn!(%key, table = %status.as_str(), journal = %effect.status.as_str(), "effects table cannot follow the journal; the journal wins");
            return;
        };
        let update = EffectUpdate {
            from: status,
            to,
            outcome: (to == EffectStatus::Committed)
                .then(|| outcome.clone())
                .flatten(),
            error: (to == EffectStatus::Failed)
                .then(|| error.clone())
                .flatten(),
        };
        match store.update_effect(tenant, key, update).await {
            Ok(r) => status = r.status,
            Err(StoreError::Conflict(_)) => match store.get_effect(tenant, key).await {
                Ok(r) => status = r.status, // moved meanwhile: try again from there
                Err(e) => {
                    tracing::warn!(%key, "effects table: {e}");
                    return;
                }
            },
            Err(e) => {
                tracing::warn!(%key, "effects table: update failed: {e}");
                return;
            }
        }
    }
}

/// Brings the session's effects table in line with its journal (after recovery).
///
/// # Errors
/// Store errors listing the table.
pub(crate) async fn reconcile(
    store: &dyn Store,
    tenant: TenantId,
    state: &SessionState,
) -> Result<()> {
    let Some(session) = state.session_id else {
        return Ok(());
    };
    if state.effects.is_empty() {
        return Ok(());
    }
    let mut rows: HashMap<OperationKey, EffectRecord> = store
        .list_effects(tenant, session, None)
        .await?
        .into_iter()
        .map(|r| (r.operation_key.clone(), r))
        .collect();
    for effect in state.effects.values() {
        let row = rows.remove(&effect.key);
        if row.as_ref().is_some_and(|r| r.status == effect.status) {
            continue;
        }
        let outcome = committed_outcome(state, effect);
        sync(store, tenant, state, effect, row, outcome, None).await;
    }
    Ok(())
}

/// The call's result text, as the outcome of a committed effect recorded after the fact.
fn committed_outcome(state: &SessionState, effect: &EffectState) -> Option<Value> {
    (effect.status == EffectStatus::Committed)
        .then(|| state.tool_calls.get(&effect.tool_call_id))
        .flatten()
        .and_then(|c| c.result.as_ref())
        .map(|(content, _)| serde_json::json!({"content": content}))
}
