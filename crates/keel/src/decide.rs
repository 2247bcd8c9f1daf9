//! `keel approve|deny APPROVAL`: a human's decision on a pending approval, written durably so
//! that the process running the session (or the next `keel resume`) acts on it.

use std::sync::Arc;

use anyhow::Context;
use keel_core::{ApprovalDecision, ApprovalId, ApprovalStatus, Decided, StateMachine};
use keel_store::Store;

use crate::config::Config;
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

/// `text` redacted with the session's redactor — the one every host uses
/// ([`keel_runtime::Runtime::redactor`]): its patterns, the secret values sealed for it, and
/// every secret this process knows (provider keys, `[env]` and `[providers]` values).
async fn redacted(
    store: &Arc<dyn Store>,
    config: &Config,
    session: keel_core::SessionId,
    text: &str,
) -> anyhow::Result<String> {
    let rt = crate::run::bare_runtime(store.clone(), config)?;
    let redactor = rt
        .redactor(local_tenant(), session)
        .await
        .with_context(|| format!("session {session}: cannot read its secrets"))?;
    Ok(redactor.redact_str(text))
}

/// Decides approval `id`; returns a line for people.
///
/// # Errors
/// Unknown approval; a refused decision (already decided otherwise, expired).
pub async fn decide(
    store: &Arc<dyn Store>,
    config: &Config,
    id: ApprovalId,
    decision: ApprovalDecision,
) -> anyhow::Result<String> {
    let tenant = local_tenant();
    let record = store
        .get_approval(tenant, id)
        .await
        .with_context(|| format!("no approval {id} in this store"))?;
    if matches!(
        record.status,
        ApprovalStatus::Pending | ApprovalStatus::Expired
    ) && let Ok((_, state)) = crate::sessions::load_state(store, record.session_id).await
        && let Some(turn) = state.turns.get(&record.turn_id)
        && turn.status.is_terminal()
    {
        anyhow::bail!(
            "approval {id} is no longer pending: its turn ended ({}); `keel resume {}` starts a new turn, where the model may propose the call again",
            turn.status.as_str(),
            record.session_id
        );
    }
    // A second deny stands as the first: the first reason is what the model was (or will be)
    // told, so a new one is not taken, and the line says which reason stands.
    if record.status == ApprovalStatus::Denied
        && let ApprovalDecision::Deny { reason: new } = &decision
    {
        let earlier = match &record.decision {
            Some(ApprovalDecision::Deny { reason }) => reason.clone(),
            _ => String::new(),
        };
        let stands = if earlier == *new || earlier.is_empty() {
            "it already was".to_owned()
        } else {
            format!(
                "it already was, with the reason {earlier:?}, which stands; the new reason is not used"
            )
        };
        return Ok(format!(
            "approval {id} ({} call {}) denied ({stands}); a running session continues, otherwise `keel resume {}`",
            record.tool_name,
            record.tool_call_id,
            top_session(store, record.session_id).await
        ));
    }
    // The reason is stored and shown to the model: redacted with the session's secrets.
    let decision = match decision {
        ApprovalDecision::Deny { reason } => ApprovalDecision::Deny {
            reason: redacted(store, config, record.session_id, &reason).await?,
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
        ApprovalDecision::AllowOnce => "allowed once".to_owned(),
        ApprovalDecision::AllowForSession => format!(
            "allowed for the session ({})",
            granted(store, &record).await
        ),
        ApprovalDecision::Deny { .. } => "denied".to_owned(),
    };
    Ok(format!(
        "approval {id} ({} call {}) {verb}{again}; a running session continues, otherwise `keel resume {}`",
        record.tool_name,
        record.tool_call_id,
        top_session(store, record.session_id).await
    ))
}

/// The top-level session of `session`: itself, or — for a sub-agent session — the session
/// whose `spawn_agent` call started its tree, which is the one to resume (its call re-attaches
/// the child). At most 16 levels up; a row that cannot be read ends the walk.
async fn top_session(
    store: &Arc<dyn Store>,
    session: keel_core::SessionId,
) -> keel_core::SessionId {
    let mut at = session;
    for _ in 0..16 {
        match store.get_session(local_tenant(), at).await {
            Ok(rec) => match rec.parent_session_id {
                Some(parent) => at = parent,
                None => break,
            },
            Err(_) => break,
        }
    }
    at
}

/// What an `allow_for_session` decision on `record` grants, for people: the session rules the
/// runtime derives from the call (`keel_tools::policy::session_rules_for`), e.g. `from now on
/// shell(echo one) runs without asking in this session: that exact command only; others still
/// ask`.
pub async fn granted(store: &Arc<dyn Store>, record: &keel_core::ApprovalRecord) -> String {
    let workspace = match crate::sessions::load_state(store, record.session_id).await {
        Ok((_, state)) => serde_json::from_value::<keel_runtime::SessionConfig>(state.config)
            .map(|c| c.workspace)
            .ok(),
        Err(_) => None,
    };
    grant_of(&record.tool_name, &record.arguments, workspace.as_deref())
}

/// See [`granted`]: the rules for a call of `tool` with `arguments` in `workspace`.
pub fn grant_of(
    tool: &str,
    arguments: &serde_json::Value,
    workspace: Option<&std::path::Path>,
) -> String {
    let rules = workspace
        .and_then(|ws| keel_tools::workspace::Workspace::new(ws).ok())
        .zip(keel_tools::ToolRegistry::with_builtins().ok())
        .map(|(ws, tools)| {
            let call = keel_tools::ValidatedCall {
                call_id: String::new(),
                name: tool.to_owned(),
                arguments: arguments.clone(),
                effect: keel_core::EffectClass::SideEffecting,
                parallel_safe: false,
            };
            let subject = tools.subject(&call, &ws);
            keel_tools::policy::session_rules_for(tool, &subject)
                .iter()
                .map(|r| r.pattern.text().to_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if rules.is_empty() {
        return format!("from now on the same {tool} call runs without asking in this session");
    }
    let exact = rules.iter().any(|r| r.contains('('));
    format!(
        "from now on {} run{} without asking in this session{}",
        rules.join(", "),
        if rules.len() == 1 { "s" } else { "" },
        if exact {
            ": exactly that, nothing wider; any other call still asks"
        } else {
            ""
        }
    )
}
