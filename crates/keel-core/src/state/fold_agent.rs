//! The fold of hook, sub-agent and compaction events: a part of [`SessionState::apply`], which has checked the
//! event's order and session and sets the version once this accepts it.

use super::*;

impl SessionState {
    /// Folds one of the hook, sub-agent and compaction events (`HookRan`, `AgentSpawned`,
    /// `AgentFinished`, `ContextCompacted`); any other event is a routing bug in `apply`.
    pub(super) fn fold_agent(&mut self, ev: &Event, cx: Cx) -> Result<(), ApplyError> {
        let c = &ev.correlation;
        match &ev.body {
            EventBody::HookRan {
                hook,
                event,
                decision,
                reason,
                arguments,
                sealed,
                ..
            } => self.apply_hook(
                ev,
                hook,
                *event,
                *decision,
                reason,
                arguments.as_ref(),
                *sealed,
            )?,
            EventBody::AgentSpawned {
                agent,
                child_session_id,
                ..
            } => {
                c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                let call = self
                    .tool_calls
                    .get(&call_id)
                    .ok_or_else(|| cx.unknown("tool call", call_id.to_string()))?;
                if call.status.is_terminal() {
                    return Err(cx.rule("a finished call spawns no agent"));
                }
                if self.children.contains_key(child_session_id) {
                    return Err(cx.rule("a child session is spawned once"));
                }
                self.children.insert(
                    *child_session_id,
                    ChildState {
                        agent: agent.clone(),
                        tool_call_id: Some(call_id),
                        finished: None,
                    },
                );
            }
            EventBody::AgentFinished {
                child_session_id,
                reason,
                usage,
                cost_usd,
                usage_by_model,
                tool_calls,
            } => {
                let turn_id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let child = self
                    .children
                    .get_mut(child_session_id)
                    .ok_or_else(|| cx.unknown("child session", child_session_id.to_string()))?;
                if child.finished.is_some() {
                    return Err(cx.rule("a child session finishes once"));
                }
                child.finished = Some(reason.clone());
                let fallback = format!("agent:{}", child.agent);
                // A child's spend counts in the parent's turn: tokens and cost by serving
                // model (in the turn's and session's totals), its steps in the serving models'
                // rows and, with its tool calls, in the turn's `subagents` (not its own steps).
                if usage_by_model.is_empty() {
                    self.count_usage(turn_id, &fallback, usage, *cost_usd, false, false);
                } else {
                    for (model, totals) in usage_by_model {
                        self.count_usage(
                            turn_id,
                            model,
                            &totals.usage,
                            totals.cost_usd,
                            totals.estimated,
                            false,
                        );
                        self.count_child_steps(turn_id, model, totals.steps);
                    }
                }
                if let Some(turn) = self.turns.get_mut(&turn_id) {
                    let spent = &mut turn.subagents;
                    spent.steps = spent.steps.saturating_add(
                        usage_by_model
                            .values()
                            .fold(0u32, |n, t| n.saturating_add(t.steps)),
                    );
                    spent.tokens = spent.tokens.saturating_add(usage.total_tokens());
                    spent.cost_usd += crate::budget::finite_cost(*cost_usd);
                    spent.tool_calls = spent.tool_calls.saturating_add(*tool_calls);
                }
            }
            EventBody::ContextCompacted {
                first_kept_item, ..
            } => {
                if c.turn_id.is_none() && self.active_turn.is_some() {
                    return Err(cx.rule(
                        "a compaction outside a turn (no turn_id) is accepted only between turns",
                    ));
                }
                if *first_kept_item < self.compaction_boundary {
                    return Err(cx.rule("a compaction boundary never moves backwards"));
                }
                self.compaction_boundary = *first_kept_item;
                if let Some(turn) = c.turn_id.and_then(|t| self.turns.get_mut(&t)) {
                    turn.compacted_at_step = Some(turn.steps.len());
                    for s in &turn.steps {
                        if let Some(step) = self.steps.get_mut(s) {
                            step.overflowed = false;
                        }
                    }
                }
            }
            _ => unreachable!(
                "apply routes only hook, sub-agent and compaction events to fold_agent"
            ),
        }
        Ok(())
    }
}
