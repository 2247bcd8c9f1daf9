//! `keel approve|deny APPROVAL`: a human's decision on a pending approval, written durably so
//! that the process running the session (or the next `keel resume`) acts on it.

use std::sync::Arc;

use anyhow::Context;
use keel_core::{ApprovalDecision, ApprovalId, ApprovalStatus, Decided, StateMachine};
use keel_store::Store;

use crate::store::local_tenant;

/// Parses an approval id with an actionable error.
///
/// # Errors
/// When `text` is not an approval id.
pub fn parse_approval(text: &str) -> anyhow::Result<ApprovalId> {
    text.trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "{text:?} is not an approval id (`keel sessions show SESSION` lists pending approvals)"
        )
    })
}

/// `text` redacted with the secrets `session` pinned (patterns, secret variables) and the
/// built-in ones.
async fn redacted(
    store: &Arc<dyn Store>,
    session: keel_core::SessionId,
    text: &str,
) -> anyhow::Result<String> {
    let (_, state) = crate::sessions::load_state(store, session).await?;
    let config: keel_runtime::SessionConfig = serde_json::from_value(state.config)
        .with_context(|| format!("session {session}: its pinned settings cannot be read"))?;
    let redactor =
        keel_runtime::redact::Redactor::new(&config.secret_patterns, &config.secret_env)?;
    Ok(redactor.redact_str(text))
}

/// Decides approval `id`; returns a line for people.
///
/// # Errors
/// Unknown approval; a refused decision (already decided otherwise, expired).
pub async fn decide(
    store: &Arc<dyn Store>,
    id: ApprovalId,
    decision: ApprovalDecision,
) -> anyhow::Result<String> {
    let tenant = local_tenant();
    let record = store
        .get_approval(tenant, id)
        .await
        .with_context(|| format!("no approval {id} in this store"))?;
    if record.status == ApprovalStatus::Pending
        && let Ok((_, state)) = crate::sessions::load_state(store, record.session_id).await
        && let Some(turn) = state.turns.get(&record.turn_id)
        && turn.status.is_terminal()
    {
        anyhow::bail!(
            "approval {id} is no longer pending: its turn ended ({}); `keel resume {}` starts a new turn, where the model may propose the call again",
            turn.status.as_str(),
            record.session_id
        );
    }
    // A second deny stands as the first (its reason is kept), as a second approve does.
    if record.status == ApprovalStatus::Denied && matches!(decision, ApprovalDecision::Deny { .. })
    {
        return Ok(format!(
            "approval {id} ({} call {}) denied (it already was); a running session continues, otherwise `keel resume {}`",
            record.tool_name, record.tool_call_id, record.session_id
        ));
    }
    // The reason is stored and shown to the model: redacted with the session's secrets.
    let decision = match decision {
        ApprovalDecision::Deny { reason } => ApprovalDecision::Deny {
            reason: redacted(store, record.session_id, &reason).await?,
        },
        other => other,
    };
    let decided = store
        .decide_approval(
            tenant,
            id,
            decision.clone(),
            &record.args_hash,
            chrono::Utc::now(),
        )
        .await
        .with_context(|| format!("cannot decide approval {id}"))?;
    let (record, again) = match decided {
        Decided::Now(r) => (r, ""),
        Decided::Already(r) => (r, " (it already was)"),
    };
    let verb = match decision {
        ApprovalDecision::AllowOnce => "allowed once",
        ApprovalDecision::AllowForSession => "allowed for the session",
        ApprovalDecision::Deny { .. } => "denied",
    };
    Ok(format!(
        "approval {id} ({} call {}) {verb}{again}; a running session continues, otherwise `keel resume {}`",
        record.tool_name, record.tool_call_id, record.session_id
    ))
}
