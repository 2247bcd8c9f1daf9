//! The effects table beside the journal.
//!
//! The journal is authoritative for every effect (`effect.*` events). The store's effects table
//! (operation key → status, request hash, attempts, outcome) is written alongside it so that
//! other workers and operators can query effects without folding journals
//! (`list_effects(session, Some(OutcomeUnknown))`), and so that a second dispatch of the same
//! operation key is detected *across workers*: before a first dispatch the runtime inserts the
//! row as `prepared` ([`keel_store::Store::insert_effect`]); an existing row that is no longer
//! `prepared` means the operation was dispatched before, and the call is not dispatched again
//! (it goes to reconciliation or a human as `outcome_unknown`).
//!
//! After each journal append that touches effects the rows are moved to the journal's status by
//! compare-and-set ([`sync`]); a worker that starts a session reconciles the whole table with
//! the journal ([`reconcile`]), so a crash between the append and the row update heals on the
//! next run. A row that cannot follow (the table's transition table refuses the move) is logged
//! and left: the journal wins.

use std::collections::HashMap;

use chrono::Utc;
use keel_core::state::EffectState;
use keel_core::{EffectStatus, OperationKey, SessionState, StateMachine, TenantId};
use keel_store::{EffectInsert, EffectRecord, EffectUpdate, Store, StoreError};
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

/// What a first dispatch of `rec` finds in the table.
pub(crate) enum Claim {
    /// The row is new or still `prepared` (a worker that crashed before journaling): dispatch.
    Dispatch,
    /// The key was dispatched before (the row's status is given): do not dispatch again.
    Duplicate(EffectStatus),
}

/// Inserts the row for a first dispatch; see [`Claim`].
///
/// # Errors
/// Store errors.
pub(crate) async fn claim(
    store: &dyn Store,
    tenant: TenantId,
    rec: &EffectRecord,
) -> Result<Claim> {
    Ok(match store.insert_effect(tenant, rec).await? {
        EffectInsert::Inserted => Claim::Dispatch,
        EffectInsert::Existing(row) if row.status == EffectStatus::Prepared => Claim::Dispatch,
        EffectInsert::Existing(row) => Claim::Duplicate(row.status),
    })
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
