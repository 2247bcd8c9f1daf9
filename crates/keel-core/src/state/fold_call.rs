//! The fold of tool call, effect and approval events: a part of [`SessionState::apply`], which has checked the
//! event's order and session and sets the version once this accepts it.

use super::*;

impl SessionState {
    /// Folds one of the tool call, effect and approval events (`ToolCallProposed`,
    /// `ToolCallValidating`, `ToolCallAwaitingApproval`, `ToolCallStarted`, `ToolCallFinished`,
    /// `EffectPrepared`, `EffectDispatched`, `EffectOutcomeUnknown`, `EffectCommitted`,
    /// `EffectFailed`, `EffectDecided`, `ApprovalRequested`, `ApprovalDecided`, `ApprovalExpired`);
    /// any other event is a routing bug in `apply`.
    pub(super) fn fold_call(&mut self, ev: &Event, cx: Cx) -> Result<(), ApplyError> {
        let Cx { seq, ty } = cx;
        let c = &ev.correlation;
        match &ev.body {
            EventBody::ToolCallProposed {
                name,
                arguments,
                sealed,
            } => {
                let turn_id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let step_id = c.step_id.ok_or_else(|| cx.missing("step_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                let step = self
                    .steps
                    .get(&step_id)
                    .ok_or_else(|| cx.unknown("step", step_id.to_string()))?;
                if step.turn_id != turn_id {
                    return Err(cx.rule("a tool call's step must belong to its turn"));
                }
                if self.active_turn != Some(turn_id) {
                    return Err(cx.rule("only the active turn's steps propose tool calls"));
                }
                if step.status.is_terminal() && step.status != StepStatus::Completed {
                    return Err(cx.rule("a failed step proposes no tool calls"));
                }
                if self.tool_calls.contains_key(&call_id) {
                    return Err(ApplyError::Duplicate {
                        seq,
                        event_type: ty,
                        entity: "tool_call",
                        id: call_id.to_string(),
                    });
                }
                self.tool_calls.insert(
                    call_id.clone(),
                    ToolCallState {
                        id: call_id.clone(),
                        turn_id,
                        step_id,
                        name: name.clone(),
                        arguments: arguments.clone(),
                        sealed: *sealed,
                        status: ToolCallStatus::INITIAL,
                        runs: 0,
                        approval_id: None,
                        operation_key: None,
                        result: None,
                        hook: None,
                    },
                );
                if let Some(step) = self.steps.get_mut(&step_id) {
                    step.tool_calls.push(call_id);
                }
            }
            EventBody::ToolCallValidating {} => {
                self.call_transition(ev, ToolCallStatus::Validating)?;
            }
            EventBody::ToolCallAwaitingApproval {} => {
                let approval = c.approval_id.ok_or_else(|| cx.missing("approval_id"))?;
                let id = self.call_transition(ev, ToolCallStatus::AwaitingApproval)?;
                if let Some(call) = self.tool_calls.get_mut(&id) {
                    call.approval_id = Some(approval);
                }
            }
            EventBody::ToolCallStarted {} => {
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                let call = self
                    .tool_calls
                    .get(&call_id)
                    .ok_or_else(|| cx.unknown("tool_call", call_id.to_string()))?;
                // A re-run after a crash starts a `running` call again; otherwise this is a transition.
                if call.status != ToolCallStatus::Running {
                    check_transition(call.status, ToolCallStatus::Running)
                        .map_err(|e| cx.trans(e))?;
                }
                let first_run = call.runs == 0;
                let turn_id = call.turn_id;
                if let Some(call) = self.tool_calls.get_mut(&call_id) {
                    call.status = ToolCallStatus::Running;
                    call.runs += 1;
                }
                if first_run && let Some(turn) = self.turns.get_mut(&turn_id) {
                    turn.tool_calls_run += 1;
                }
            }
            EventBody::ToolCallFinished {
                status,
                output,
                is_error,
            } => {
                if !status.is_terminal() {
                    return Err(cx.rule("tool_call.finished carries a terminal status"));
                }
                let id = self.call_transition(ev, *status)?;
                if let Some(call) = self.tool_calls.get_mut(&id) {
                    call.result = Some((output.clone(), *is_error));
                }
            }
            EventBody::EffectPrepared {
                request_hash,
                probe,
            } => {
                let key = c
                    .operation_key
                    .clone()
                    .ok_or_else(|| cx.missing("operation_key"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                self.live_call(&call_id, seq, ty)?;
                if self.effects.contains_key(&key) {
                    return Err(ApplyError::Duplicate {
                        seq,
                        event_type: ty,
                        entity: "effect",
                        id: key.to_string(),
                    });
                }
                if let Some(call) = self.tool_calls.get_mut(&call_id) {
                    call.operation_key = Some(key.clone());
                }
                self.effects.insert(
                    key.clone(),
                    EffectState {
                        key,
                        tool_call_id: call_id,
                        status: EffectStatus::INITIAL,
                        attempts: 0,
                        request_hash: request_hash.clone(),
                        decision: None,
                        probe: probe.clone(),
                    },
                );
            }
            EventBody::EffectDispatched {} => {
                let key = self.effect_transition(ev, EffectStatus::Dispatched)?;
                if let Some(e) = self.effects.get_mut(&key) {
                    e.attempts += 1;
                    e.decision = None;
                }
            }
            EventBody::EffectOutcomeUnknown {} => {
                self.effect_transition(ev, EffectStatus::OutcomeUnknown)?;
            }
            EventBody::EffectCommitted { .. } => {
                self.effect_transition(ev, EffectStatus::Committed)?;
            }
            EventBody::EffectFailed { .. } => {
                self.effect_transition(ev, EffectStatus::Failed)?;
            }
            EventBody::EffectDecided { decision, .. } => {
                let key = c
                    .operation_key
                    .clone()
                    .ok_or_else(|| cx.missing("operation_key"))?;
                let effect = self
                    .effects
                    .get(&key)
                    .ok_or_else(|| cx.unknown("effect", key.to_string()))?;
                if effect.status != EffectStatus::OutcomeUnknown {
                    return Err(cx.rule("only an outcome_unknown effect is decided by a human"));
                }
                if effect.decision.is_some() {
                    return Err(cx.rule("the effect is already decided"));
                }
                if let Some(e) = self.effects.get_mut(&key) {
                    e.decision = Some(decision.clone());
                }
            }
            EventBody::ApprovalRequested {
                args_hash,
                expires_at,
            } => {
                let id = c.approval_id.ok_or_else(|| cx.missing("approval_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                self.live_call(&call_id, seq, ty)?;
                if self.approvals.contains_key(&id) {
                    return Err(ApplyError::Duplicate {
                        seq,
                        event_type: ty,
                        entity: "approval",
                        id: id.to_string(),
                    });
                }
                self.approvals.insert(
                    id,
                    ApprovalState {
                        id,
                        tool_call_id: call_id,
                        args_hash: args_hash.clone(),
                        status: ApprovalStatus::INITIAL,
                        expires_at: *expires_at,
                        hook: None,
                    },
                );
            }
            EventBody::ApprovalDecided { decision, .. } => {
                self.approval_transition(ev, decision.status())?;
            }
            EventBody::ApprovalExpired {} => {
                self.approval_transition(ev, ApprovalStatus::Expired)?;
            }
            _ => {
                unreachable!("apply routes only tool call, effect and approval events to fold_call")
            }
        }
        Ok(())
    }
}
