//! What a server run ended with: its pending decisions and the result line.

use super::*;

/// What the session waits on: approvals whose call waits, and undecided unknown effects.
pub(super) async fn pending(p: &RemoteRun) -> Vec<PendingAction> {
    let sid = p.session.to_string();
    let mut out: Vec<PendingAction> = waiting_approvals(&p.client, &sid, &p.state)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|a| {
            let subagent = match (a.agent, a.session_id.parse().ok()) {
                (Some(agent), Some(session_id)) if a.session_id != sid => {
                    Some(keel_runtime::PendingSubagent { session_id, agent })
                }
                _ => None,
            };
            Some(PendingAction::Approval {
                approval_id: a.approval_id.parse().ok()?,
                tool_call_id: keel_core::ToolCallId::from(a.tool_call_id.as_str()),
                tool_name: a.tool_name,
                arguments: a.arguments,
                args_hash: a.args_hash,
                expires_at: a.expires_at,
                subagent,
            })
        })
        .collect();
    for e in p.state.effects.values() {
        if e.status == keel_core::EffectStatus::OutcomeUnknown && e.decision.is_none() {
            let call = p.state.tool_calls.get(&e.tool_call_id);
            out.push(PendingAction::Effect {
                operation_key: e.key.clone(),
                tool_call_id: e.tool_call_id.clone(),
                tool_name: call.map(|c| c.name.clone()).unwrap_or_default(),
                arguments: call.map(|c| c.arguments.clone()).unwrap_or_default(),
                subagent: None,
            });
        }
    }
    out
}

/// The result line, as `crate::run::result_of` makes it for a local run.
pub(super) async fn result_of(
    p: &RemoteRun,
    driven: &Driven,
    pending: Vec<PendingAction>,
) -> ResultLine {
    let elapsed = u64::try_from(p.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut r = ResultLine::startup_failure(String::new(), elapsed);
    r.session_id = Some(p.session);
    r.error = None;
    let s = &p.state;
    let turn_stats = |turn: Option<TurnId>, r: &mut ResultLine| {
        if let Some(t) = turn.and_then(|t| s.turns.get(&t)) {
            r.usage = t.usage;
            r.cost_usd = t.cost_usd;
            r.usage_by_model = t.usage_by_model.clone();
            r.num_steps = u32::try_from(t.steps.len()).unwrap_or(u32::MAX);
        }
    };
    if !p.continues
        && let Driven::Finished(status) = driven
        && *status != SessionStatus::RequiresAction
    {
        r.continued = Some(false);
        r.terminal_reason = s
            .turn_order
            .last()
            .and_then(|t| s.turns.get(t))
            .and_then(|t| t.terminal_reason)
            .unwrap_or(TerminalReason::Completed);
        return r;
    }
    match driven {
        Driven::Interrupted => {
            r.terminal_reason = TerminalReason::Aborted;
            turn_stats(s.active_turn.or(p.turn), &mut r);
        }
        Driven::Error(e) => {
            r.terminal_reason = TerminalReason::Failed;
            r.error = Some(crate::report::describe(e));
            turn_stats(p.turn, &mut r);
        }
        Driven::Finished(SessionStatus::RequiresAction) => {
            r.terminal_reason = TerminalReason::RequiresAction;
            r.pending = pending;
            turn_stats(s.active_turn, &mut r);
        }
        Driven::Finished(_) => {
            let turn = p.turn.or_else(|| s.turn_order.last().copied());
            let body = match turn {
                Some(t) => p
                    .client
                    .get_turn(&p.session.to_string(), &t.to_string())
                    .await
                    .ok(),
                None => None,
            };
            turn_stats(turn, &mut r);
            match body {
                Some(t) => {
                    r.terminal_reason =
                        named(t.terminal_reason).unwrap_or(TerminalReason::Completed);
                    r.limit = named(t.limit);
                    r.num_steps = t.num_steps;
                    r.duration_ms = t.duration_ms.unwrap_or(r.duration_ms);
                    r.error = t.error.as_deref().map(crate::report::explain_model_failure);
                    r.final_text = t.final_text.unwrap_or_default();
                }
                None => r.terminal_reason = TerminalReason::Completed,
            }
        }
    }
    r.over_limits = over_limits(p, &r);
    r
}

/// A snake_case name the API sends (`budget_exhausted`, `tokens`) as the kernel's enum.
pub(super) fn named<T: serde::de::DeserializeOwned>(v: Option<String>) -> Option<T> {
    v.and_then(|s| serde_json::from_value(serde_json::Value::String(s)).ok())
}

/// As the local run's: the per-turn limits (the session's over the release's) the totals
/// ended above.
pub(super) fn over_limits(p: &RemoteRun, r: &ResultLine) -> Vec<keel_core::BudgetLimit> {
    let Ok(config) = serde_json::from_value::<keel_runtime::SessionConfig>(p.state.config.clone())
    else {
        return Vec::new();
    };
    crate::run::limits_over(config.turn_budget, None, r)
}
