//! The call rules of the `executing_tools` phase: what each open call of the step needs, in proposal order.

use super::*;

/// What one open call of the executing step needs.
pub(super) enum CallNeed {
    /// Something to do now.
    Act(Next),
    /// Running here: wait for it.
    Running,
    /// Only a human can move it (pending approval, undecided effect, or — `child` — what its
    /// child session waits for).
    Human {
        approval: Option<ApprovalId>,
        effect: Option<OperationKey>,
        child: bool,
    },
    /// Allowed and ready: run it (read-only parallel batch, or alone).
    Ready { parallel: bool },
    /// Waiting for facts the driver has not supplied.
    Unknown,
}

/// The `executing_tools` phase: the calls of the turn's last step.
pub(super) fn executing(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
    let Some(step) = turn.steps.last().and_then(|s| state.steps.get(s)) else {
        return Next::EnterPhase {
            turn: turn.id,
            phase: TurnStatus::Sampling,
        };
    };
    let mut rejects = Vec::new();
    let mut asks = Vec::new();
    let mut pre_hooks = Vec::new();
    let mut permission_hooks = Vec::new();
    let mut batch = Vec::new();
    let mut sequential: Option<Next> = None;
    // The model's order holds where one call could see another's effect: a call that is not
    // parallel-safe starts only when every earlier call of the step has its result (it never
    // overtakes one, nor changes what an earlier read is reading), and a parallel-safe call
    // only while no earlier call that is not parallel-safe is open (a read proposed after a
    // write sees the write).
    let mut earlier_open = false;
    let mut seq_blocked = false;
    let mut running = Vec::new();
    let mut human_approvals = Vec::new();
    let mut human_effects = Vec::new();
    let mut human_children = false;
    let mut unknown = false;
    // The tool-call budget: a call that would start past it is refused (with its result).
    let mut calls_left = tool_calls_left(state, turn, &facts.limits, facts.shared.as_ref());
    for call in step
        .tool_calls
        .iter()
        .filter_map(|c| state.tool_calls.get(c))
        .filter(|c| !c.status.is_terminal())
    {
        let parallel_call = is_parallel(facts.calls.get(&call.id));
        let mut need = call_need(state, turn, step.id, call, facts);
        let starts = call.runs == 0
            && matches!(
                need,
                CallNeed::Ready { .. } | CallNeed::Act(Next::RequestApprovals { .. })
            );
        if starts && let Some(left) = calls_left.as_mut() {
            if *left == 0 {
                need = CallNeed::Act(Next::Reject {
                    turn: turn.id,
                    step: step.id,
                    calls: vec![(
                        call.id.clone(),
                        ToolCallStatus::Rejected,
                        format!(
                            "`{}` was not run: the tool-call budget of this turn is spent.",
                            call.name
                        ),
                    )],
                });
            } else {
                *left -= 1;
            }
        }
        match need {
            CallNeed::Act(next) => {
                match next {
                    Next::Reject { mut calls, .. } => rejects.append(&mut calls),
                    Next::RequestApprovals { mut calls, .. } => asks.append(&mut calls),
                    Next::RunHooks {
                        event: HookEvent::PreToolUse,
                        mut calls,
                        ..
                    } => pre_hooks.append(&mut calls),
                    Next::RunHooks {
                        event: HookEvent::PermissionRequest,
                        mut calls,
                        ..
                    } => permission_hooks.append(&mut calls),
                    // Recovery and decisions come first, one at a time, in proposal order.
                    other => return other,
                }
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Running => {
                running.push(call.id.clone());
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Human {
                approval,
                effect,
                child,
            } => {
                human_approvals.extend(approval);
                human_effects.extend(effect);
                human_children |= child;
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Ready { parallel: true } => {
                if !seq_blocked {
                    batch.push(call.id.clone());
                }
            }
            CallNeed::Ready { parallel: false } => {
                if !earlier_open && sequential.is_none() {
                    sequential = Some(ready_alone(state, turn.id, step.id, call, facts));
                }
                seq_blocked = true;
            }
            CallNeed::Unknown => {
                unknown = true;
                if !parallel_call {
                    seq_blocked = true;
                }
            }
        }
        earlier_open = true;
    }
    // Hooks decide before anything of their calls happens (a hook that blocks stops the side
    // effect: the call cannot be dispatched before the decision is journaled).
    for (event, calls) in [
        (HookEvent::PreToolUse, pre_hooks),
        (HookEvent::PermissionRequest, permission_hooks),
    ] {
        if !calls.is_empty() {
            return Next::RunHooks {
                turn: turn.id,
                event,
                calls,
            };
        }
    }
    if !rejects.is_empty() {
        return Next::Reject {
            turn: turn.id,
            step: step.id,
            calls: rejects,
        };
    }
    if !asks.is_empty() {
        return Next::RequestApprovals {
            turn: turn.id,
            step: step.id,
            calls: asks,
        };
    }
    if !batch.is_empty() {
        return Next::Execute {
            turn: turn.id,
            step: step.id,
            calls: batch,
        };
    }
    if let Some(next) = sequential {
        return next;
    }
    if !running.is_empty() {
        return Next::AwaitRunning { calls: running };
    }
    if !human_approvals.is_empty() || !human_effects.is_empty() || human_children {
        return Next::WaitForHuman {
            turn: turn.id,
            approvals: human_approvals,
            effects: human_effects,
        };
    }
    if unknown {
        // Open calls the driver gave no facts for: nothing can be decided about them, so the
        // turn cannot go on; a human (or a retry with facts) must look.
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Failed,
            limit: None,
            error: Some("tool calls could not be assessed".into()),
        };
    }
    Next::EnterPhase {
        turn: turn.id,
        phase: TurnStatus::Sampling,
    }
}

/// Whether a call with `facts` is parallel-safe: valid, read-only and declared parallel-safe by
/// its tool. Such calls run together; any other call runs alone, in the model's order (see
/// the module's rule 6). `None` (no facts yet) is not.
pub fn is_parallel(facts: Option<&CallFacts>) -> bool {
    matches!(
        facts,
        Some(CallFacts::Valid {
            effect: EffectClass::ReadOnly,
            parallel_safe: true,
            ..
        })
    )
}

/// A ready call that runs alone: a dispatch (or the re-run of a read-only call left running).
pub(super) fn ready_alone(
    state: &SessionState,
    turn: TurnId,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> Next {
    let effect = match facts.calls.get(&call.id) {
        Some(CallFacts::Valid { effect, .. }) => *effect,
        _ => EffectClass::SideEffecting,
    };
    let attempt = call
        .operation_key
        .as_ref()
        .and_then(|k| state.effects.get(k))
        .map_or(1, |e| e.attempts + 1);
    Next::Dispatch {
        turn,
        step,
        call: call.id.clone(),
        effect,
        attempt,
    }
}

pub(super) fn call_need(
    state: &SessionState,
    turn: &TurnState,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> CallNeed {
    let cf = facts.calls.get(&call.id);
    if facts.running_here.contains(&call.id) {
        if facts.waiting_in_child.contains(&call.id) {
            return CallNeed::Human {
                approval: None,
                effect: None,
                child: true,
            };
        }
        return CallNeed::Running;
    }
    match call.status {
        ToolCallStatus::Proposed | ToolCallStatus::Validating => match cf {
            None => CallNeed::Unknown,
            Some(CallFacts::AwaitingHook) => CallNeed::Act(Next::RunHooks {
                turn: turn.id,
                event: HookEvent::PreToolUse,
                calls: vec![call.id.clone()],
            }),
            Some(CallFacts::Invalid { status, output }) => CallNeed::Act(Next::Reject {
                turn: turn.id,
                step,
                calls: vec![(call.id.clone(), *status, output.clone())],
            }),
            Some(CallFacts::Valid {
                verdict,
                effect,
                parallel_safe,
                ..
            }) => match verdict {
                Verdict::Deny { reason } => CallNeed::Act(Next::Reject {
                    turn: turn.id,
                    step,
                    calls: vec![(
                        call.id.clone(),
                        ToolCallStatus::Rejected,
                        format!(
                            "Permission denied for `{}`: {reason}. The call was not run; do not retry it unchanged — choose another way or ask the user.",
                            call.name
                        ),
                    )],
                }),
                Verdict::Ask => CallNeed::Act(Next::RequestApprovals {
                    turn: turn.id,
                    step,
                    calls: vec![call.id.clone()],
                }),
                Verdict::Allow => CallNeed::Ready {
                    parallel: *effect == EffectClass::ReadOnly && *parallel_safe,
                },
            },
        },
        ToolCallStatus::AwaitingApproval => awaiting(state, turn.id, step, call, facts),
        ToolCallStatus::Running => recover(state, turn.id, step, call, facts),
        ToolCallStatus::Succeeded
        | ToolCallStatus::Failed
        | ToolCallStatus::Cancelled
        | ToolCallStatus::Rejected
        | ToolCallStatus::Interrupted => CallNeed::Running,
    }
}

/// A call waiting on its approval.
pub(super) fn awaiting(
    state: &SessionState,
    turn: TurnId,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> CallNeed {
    let Some(approval) = call.approval_id.and_then(|a| state.approvals.get(&a)) else {
        return CallNeed::Unknown;
    };
    let apply = |outcome| {
        CallNeed::Act(Next::ApplyApproval {
            turn,
            step,
            call: call.id.clone(),
            approval: approval.id,
            outcome,
        })
    };
    match approval.status {
        ApprovalStatus::Allowed => match facts.calls.get(&call.id) {
            Some(CallFacts::Valid {
                effect,
                parallel_safe,
                ..
            }) => CallNeed::Ready {
                parallel: *effect == EffectClass::ReadOnly && *parallel_safe,
            },
            Some(CallFacts::Invalid { status, output }) => CallNeed::Act(Next::Reject {
                turn,
                step,
                calls: vec![(call.id.clone(), *status, output.clone())],
            }),
            Some(CallFacts::AwaitingHook) | None => CallNeed::Unknown,
        },
        // Journaled with the call's result in one batch; seen open only in a broken journal.
        ApprovalStatus::Denied | ApprovalStatus::Expired => apply(ApprovalOutcome::Expired),
        ApprovalStatus::Pending => {
            // The policy of now comes first: a call asked about under a looser mode is not run
            // once the session's mode (or rules) deny it, whoever allowed it meanwhile.
            if let Some(CallFacts::Valid {
                verdict: Verdict::Deny { reason },
                ..
            }) = facts.calls.get(&call.id)
            {
                return apply(ApprovalOutcome::PolicyDenied {
                    reason: reason.clone(),
                });
            }
            // A `permission_request` hook's journaled decision is the decision (the approvals
            // row follows it); with hooks and none run yet, they run before a human is asked.
            match &approval.hook {
                Some((HookDecision::Allow, _, _)) => {
                    return apply(ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce));
                }
                Some((HookDecision::Deny, hook, reason)) => {
                    return apply(ApprovalOutcome::Denied {
                        reason: match reason {
                            Some(r) if !r.trim().is_empty() => r.clone(),
                            _ => format!("denied by the permission_request hook `{hook}`"),
                        },
                    });
                }
                Some(_) => {}
                None if facts.hooks.permission_request.contains(&call.id)
                    && facts
                        .approvals
                        .get(&approval.id)
                        .is_none_or(|t| t.status == ApprovalStatus::Pending) =>
                {
                    return CallNeed::Act(Next::RunHooks {
                        turn,
                        event: HookEvent::PermissionRequest,
                        calls: vec![call.id.clone()],
                    });
                }
                None => {}
            }
            let Some(table) = facts.approvals.get(&approval.id) else {
                return CallNeed::Human {
                    approval: Some(approval.id),
                    effect: None,
                    child: false,
                };
            };
            match table.status {
                ApprovalStatus::Pending if table.expires_at <= facts.now => {
                    apply(ApprovalOutcome::Expired)
                }
                ApprovalStatus::Pending => CallNeed::Human {
                    approval: Some(approval.id),
                    effect: None,
                    child: false,
                },
                ApprovalStatus::Allowed => {
                    if table.args_hash != approval.args_hash {
                        return apply(ApprovalOutcome::HashMismatch);
                    }
                    match &table.decision {
                        Some(
                            d @ (ApprovalDecision::AllowOnce | ApprovalDecision::AllowForSession),
                        ) => apply(ApprovalOutcome::Allowed(d.clone())),
                        Some(ApprovalDecision::Deny { .. }) | None => {
                            apply(ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce))
                        }
                    }
                }
                ApprovalStatus::Denied => apply(ApprovalOutcome::Denied {
                    reason: match &table.decision {
                        Some(ApprovalDecision::Deny { reason }) if !reason.trim().is_empty() => {
                            reason.clone()
                        }
                        _ => "no reason given".into(),
                    },
                }),
                ApprovalStatus::Expired => apply(ApprovalOutcome::Expired),
            }
        }
    }
}
