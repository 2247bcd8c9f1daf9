//! `keel --server URL approve|deny|resolve|cancel`: a human's decisions and cancellations,
//! with the local commands' checks, lines and exit codes.

use std::process::ExitCode;

use anyhow::Context;
use keel_client::api::{ApprovalDecisionParam, EffectDecisionParam};
use keel_core::{ApprovalDecision, EffectDecision, EffectStatus, StateMachine};
use serde_json::Value;

use super::{Server, explain, known_session, load_state, with_client};

/// `keel --server URL approve|deny APPROVAL`: the same checks and line as locally.
///
/// # Errors
/// Unknown approval, a refused decision, server errors.
pub fn decide(
    server: &Server,
    approval: &str,
    decision: ApprovalDecision,
) -> anyhow::Result<ExitCode> {
    let id = crate::decide::parse_approval(approval)?;
    with_client(server, |client| async move {
        let record = match client.get_approval(&id.to_string()).await {
            Ok(r) => r,
            Err(e) if e.status() == Some(404) => {
                anyhow::bail!("no approval {id} on the server at {}", client.base_url())
            }
            Err(e) => return Err(explain(&client, e)),
        };
        let (_, state) = load_state(&client, &record.session_id).await?;
        if record.status == "pending"
            && let Ok(turn) = record.turn_id.parse::<keel_core::TurnId>()
            && let Some(turn) = state.turns.get(&turn)
            && turn.status.is_terminal()
        {
            anyhow::bail!(
                "approval {id} is no longer pending: its turn ended ({}); `{k} resume {}` starts a new turn, where the model may propose the call again",
                turn.status.as_str(),
                record.session_id,
                k = crate::output::hint_command(),
            );
        }
        if record.status == "denied"
            && let ApprovalDecision::Deny { reason: new } = &decision
        {
            let earlier = record
                .decision
                .as_ref()
                .and_then(|d| d.get("reason"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let stands = if earlier == *new || earlier.is_empty() {
                "it already was".to_owned()
            } else {
                format!(
                    "it already was, with the reason {earlier:?}, which stands; the new reason is not used"
                )
            };
            println!(
                "approval {id} ({} call {}) denied ({stands}); a running session continues, otherwise `{k} resume {}`",
                record.tool_name,
                record.tool_call_id,
                record.session_id,
                k = crate::output::hint_command()
            );
            return Ok(());
        }
        let already = record.status != "pending";
        let (param, reason) = match &decision {
            ApprovalDecision::AllowOnce => (ApprovalDecisionParam::AllowOnce, None),
            ApprovalDecision::AllowForSession => (ApprovalDecisionParam::AllowForSession, None),
            ApprovalDecision::Deny { reason } => {
                (ApprovalDecisionParam::Deny, Some(reason.as_str()))
            }
        };
        let decided = client
            .decide_approval(&id.to_string(), param, &record.args_hash, reason)
            .await
            .map_err(|e| explain(&client, e))
            .with_context(|| format!("cannot decide approval {id}"))?;
        let verb = match decision {
            ApprovalDecision::AllowOnce => "allowed once".to_owned(),
            ApprovalDecision::AllowForSession => {
                let workspace = serde_json::from_value::<keel_runtime::SessionConfig>(state.config)
                    .ok()
                    .map(|c| c.workspace);
                format!(
                    "allowed for the session ({})",
                    crate::decide::grant_of(
                        &decided.tool_name,
                        &decided.arguments,
                        workspace.as_deref()
                    )
                )
            }
            ApprovalDecision::Deny { .. } => "denied".to_owned(),
        };
        let again = if already { " (it already was)" } else { "" };
        println!(
            "approval {id} ({} call {}) {verb}{again}; a running session continues, otherwise `{k} resume {}`",
            decided.tool_name,
            decided.tool_call_id,
            decided.session_id,
            k = crate::output::hint_command()
        );
        Ok(())
    })
}

/// `keel --server URL resolve KEY --as …`.
///
/// # Errors
/// Unknown effect, an effect not waiting for a decision, server errors.
pub fn resolve(server: &Server, key: &str, decision: EffectDecision) -> anyhow::Result<ExitCode> {
    let key = keel_core::OperationKey(key.trim().to_owned());
    with_client(server, |client| async move {
        let session = key
            .as_str()
            .split('/')
            .next()
            .and_then(|s| s.parse::<keel_core::SessionId>().ok())
            .with_context(|| {
                format!(
                    "{:?} is not an operation key (`keel sessions show SESSION` lists them)",
                    key.as_str()
                )
            })?;
        let sid = known_session(&client, &session.to_string())
            .await?
            .to_string();
        let (_, state) = load_state(&client, &sid).await?;
        let effect = state.effects.get(&key);
        let tool = effect
            .and_then(|e| state.tool_calls.get(&e.tool_call_id))
            .map(|c| c.name.clone())
            .with_context(|| format!("session {session} has no effect {key}"))?;
        let (verb, param, reason) = match &decision {
            EffectDecision::Committed { outcome } => (
                "committed",
                EffectDecisionParam::Committed,
                outcome.as_str().map(str::to_owned),
            ),
            EffectDecision::Failed { error } => {
                ("failed", EffectDecisionParam::Failed, Some(error.clone()))
            }
            EffectDecision::Retry => ("to be retried", EffectDecisionParam::Retry, None),
        };
        if effect.is_some_and(|e| {
            e.decision
                .as_ref()
                .is_some_and(|d| std::mem::discriminant(d) == std::mem::discriminant(&decision))
        }) {
            println!(
                "effect {key} ({tool}) marked {verb} (it already was); `keel resume {session}` continues the session"
            );
            return Ok(());
        }
        if effect.is_some_and(|e| e.status != EffectStatus::OutcomeUnknown) {
            tracing::debug!("effect {key} is not outcome_unknown; the server decides");
        }
        client
            .decide_effect(&sid, key.as_str(), param, reason.as_deref())
            .await
            .map_err(|e| explain(&client, e))
            .with_context(|| format!("cannot resolve effect {key}"))?;
        println!(
            "effect {key} ({tool}) marked {verb}; `keel resume {session}` continues the session"
        );
        Ok(())
    })
}

/// `keel --server URL cancel SESSION`.
///
/// # Errors
/// Unknown session, no turn to cancel, server errors.
pub fn cancel(server: &Server, session: &str) -> anyhow::Result<ExitCode> {
    let session = session.to_owned();
    with_client(server, |client| async move {
        let id = known_session(&client, &session).await?;
        let cancelled = client
            .cancel_turn(&id.to_string())
            .await
            .map_err(|e| explain(&client, e))
            .with_context(|| format!("cannot cancel session {id}"))?;
        let turn = cancelled.turn_id.unwrap_or_default();
        println!("cancelled turn {turn} of session {id}; `keel resume {id}` continues it");
        Ok(())
    })
}
