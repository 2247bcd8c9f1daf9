//! Helpers of the fold: hooks, live calls, usage counts, and the status moves every entity makes
//! through its machine table.

use super::*;

impl SessionState {
    /// Folds a `hook.ran`: what the hook decided about the call, approval, prompt or stop it
    /// ran for (see [`HookDecision`]). A tool hook is accepted only before the call is
    /// authorized (`proposed` / `validating`), a `permission_request` hook only while its
    /// approval is pending, and every hook only within the active turn.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_hook(
        &mut self,
        ev: &Event,
        hook: &str,
        event: HookEvent,
        decision: HookDecision,
        reason: &Option<String>,
        arguments: Option<&Value>,
        sealed: bool,
    ) -> Result<(), ApplyError> {
        let (seq, ty, c) = (ev.seq, ev.type_name(), &ev.correlation);
        let cx = Cx { seq, ty };
        let turn_id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
        if self.active_turn != Some(turn_id) {
            return Err(cx.rule("hooks run only within the active turn"));
        }
        let allowed = match event {
            HookEvent::PreToolUse => matches!(
                decision,
                HookDecision::None
                    | HookDecision::Allow
                    | HookDecision::Ask
                    | HookDecision::Deny
                    | HookDecision::Rewrite
            ),
            HookEvent::PermissionRequest => matches!(
                decision,
                HookDecision::None | HookDecision::Allow | HookDecision::Deny
            ),
            HookEvent::UserPromptSubmit => {
                matches!(decision, HookDecision::None | HookDecision::Deny)
            }
            HookEvent::Stop => matches!(decision, HookDecision::None | HookDecision::Continue),
            HookEvent::SessionStart | HookEvent::PostToolUse | HookEvent::PreCompact => {
                decision == HookDecision::None
            }
        };
        if !allowed {
            return Err(cx.rule("this hook event cannot make this decision"));
        }
        if arguments.is_some() != (decision == HookDecision::Rewrite) {
            return Err(cx.rule("a rewrite, and only a rewrite, carries arguments"));
        }
        match event {
            HookEvent::PreToolUse => {
                let id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| cx.missing("tool_call_id"))?;
                let call =
                    self.tool_calls
                        .get_mut(&id)
                        .ok_or_else(|| ApplyError::UnknownEntity {
                            seq,
                            event_type: ty,
                            entity: "tool_call",
                            id: id.to_string(),
                        })?;
                if !matches!(
                    call.status,
                    ToolCallStatus::Proposed | ToolCallStatus::Validating
                ) {
                    return Err(
                        cx.rule("a pre_tool_use hook runs only before the call is authorized")
                    );
                }
                let rank = |d: HookDecision| match d {
                    HookDecision::Deny => 3,
                    HookDecision::Ask => 2,
                    HookDecision::None
                    | HookDecision::Allow
                    | HookDecision::Rewrite
                    | HookDecision::Continue => 1,
                };
                let mut folded = call.hook.clone().unwrap_or(CallHook {
                    decision: HookDecision::None,
                    hook: hook.to_owned(),
                    reason: None,
                    rewritten_by: None,
                });
                // An earlier `allow` stands unless a later hook is stricter; `none` says nothing.
                if decision != HookDecision::None
                    && (folded.decision == HookDecision::None
                        || rank(decision) > rank(folded.decision))
                {
                    folded.decision = decision;
                    folded.hook = hook.to_owned();
                    folded.reason.clone_from(reason);
                }
                if let Some(args) = arguments {
                    call.arguments = args.clone();
                    call.sealed = sealed;
                    folded.rewritten_by = Some(hook.to_owned());
                    // An earlier `allow` answered the input that hook was shown, not this one:
                    // the rewritten call goes back to the policy (an `ask` stays stricter).
                    if folded.decision == HookDecision::Allow {
                        folded.decision = HookDecision::Rewrite;
                        folded.hook = hook.to_owned();
                        folded.reason.clone_from(reason);
                    }
                }
                call.hook = Some(folded);
            }
            HookEvent::PermissionRequest => {
                let id = c.approval_id.ok_or_else(|| cx.missing("approval_id"))?;
                let approval =
                    self.approvals
                        .get_mut(&id)
                        .ok_or_else(|| ApplyError::UnknownEntity {
                            seq,
                            event_type: ty,
                            entity: "approval",
                            id: id.to_string(),
                        })?;
                if approval.status != ApprovalStatus::Pending {
                    return Err(
                        cx.rule("a permission_request hook runs only on a pending approval")
                    );
                }
                // The first hook that decides decides; `none` leaves it to the next, then a human.
                if approval
                    .hook
                    .as_ref()
                    .is_none_or(|(d, _, _)| *d == HookDecision::None)
                {
                    approval.hook = Some((decision, hook.to_owned(), reason.clone()));
                }
            }
            HookEvent::UserPromptSubmit => {
                if let Some(turn) = self.turns.get_mut(&turn_id) {
                    turn.prompt_hooked = true;
                    if decision == HookDecision::Deny && turn.blocked.is_none() {
                        turn.blocked = Some((
                            hook.to_owned(),
                            reason.clone().unwrap_or_else(|| "no reason given".into()),
                        ));
                    }
                }
            }
            HookEvent::Stop => {
                if let Some(turn) = self.turns.get_mut(&turn_id) {
                    let Some(step) = turn.steps.last().copied() else {
                        return Err(cx.rule("a stop hook runs after a step"));
                    };
                    turn.stop_hooked_step = Some(step);
                    if decision == HookDecision::Continue
                        && turn.stop_continue.as_ref().is_none_or(|(s, _)| *s != step)
                    {
                        turn.stop_continues = turn.stop_continues.saturating_add(1);
                        turn.stop_continue = Some((step, hook.to_owned()));
                    }
                }
            }
            HookEvent::SessionStart => self.session_hooked = true,
            HookEvent::PostToolUse | HookEvent::PreCompact => {}
        }
        Ok(())
    }

    /// The call must exist, be unfinished and belong to the active turn: effects and approvals
    /// are only ever opened for a call that can still get its one result.
    pub(super) fn live_call(
        &self,
        call_id: &ToolCallId,
        seq: u64,
        event_type: &'static str,
    ) -> Result<(), ApplyError> {
        let call = self
            .tool_calls
            .get(call_id)
            .ok_or_else(|| ApplyError::UnknownEntity {
                seq,
                event_type,
                entity: "tool_call",
                id: call_id.to_string(),
            })?;
        if call.status.is_terminal() || self.active_turn != Some(call.turn_id) {
            return Err(ApplyError::Rule {
                seq,
                event_type,
                rule: "effects and approvals open only for an unfinished call of the active turn",
            });
        }
        Ok(())
    }

    /// Counts a response's `usage` and `cost_usd` (USD) served by `model` in the turn's and the
    /// session's totals and their per-model breakdown; `step` when it completed a step (else a
    /// failed attempt's, counted only when it used something). Saturating; a cost that is not a
    /// finite, non-negative amount counts as 0.
    pub(super) fn count_usage(
        &mut self,
        turn_id: TurnId,
        model: &str,
        usage: &Usage,
        cost_usd: f64,
        estimated: bool,
        step: bool,
    ) {
        let cost = crate::budget::finite_cost(cost_usd);
        if !step && usage.is_zero() && cost == 0.0 {
            return;
        }
        let add = |totals: &mut crate::budget::ModelTotals| {
            if step {
                totals.add_step(usage, cost);
            } else {
                totals.add_usage(usage, cost);
            }
            totals.estimated |= estimated;
        };
        if let Some(turn) = self.turns.get_mut(&turn_id) {
            turn.usage.add(usage);
            turn.cost_usd += cost;
            add(turn.usage_by_model.entry(model.to_owned()).or_default());
        }
        self.usage.add(usage);
        self.cost_usd += cost;
        add(self.usage_by_model.entry(model.to_owned()).or_default());
    }

    /// Adds a finished child's `steps` served by `model` to the turn's and the session's rows
    /// of that model (the child's tokens and cost went in through [`Self::count_usage`]).
    pub(super) fn count_child_steps(&mut self, turn_id: TurnId, model: &str, steps: u32) {
        if steps == 0 {
            return;
        }
        if let Some(turn) = self.turns.get_mut(&turn_id) {
            let row = turn.usage_by_model.entry(model.to_owned()).or_default();
            row.steps = row.steps.saturating_add(steps);
        }
        let row = self.usage_by_model.entry(model.to_owned()).or_default();
        row.steps = row.steps.saturating_add(steps);
    }

    pub(super) fn step_transition(
        &mut self,
        ev: &Event,
        to: StepStatus,
    ) -> Result<(StepId, TurnId), ApplyError> {
        let id = ev
            .correlation
            .step_id
            .ok_or_else(|| Cx::of(ev).missing("step_id"))?;
        let step = move_entity(&mut self.steps, &id, |s| &mut s.status, to, ev, "step")?;
        Ok((id, step.turn_id))
    }

    pub(super) fn call_transition(
        &mut self,
        ev: &Event,
        to: ToolCallStatus,
    ) -> Result<ToolCallId, ApplyError> {
        let id = ev
            .correlation
            .tool_call_id
            .clone()
            .ok_or_else(|| Cx::of(ev).missing("tool_call_id"))?;
        move_entity(
            &mut self.tool_calls,
            &id,
            |c| &mut c.status,
            to,
            ev,
            "tool_call",
        )?;
        Ok(id)
    }

    pub(super) fn effect_transition(
        &mut self,
        ev: &Event,
        to: EffectStatus,
    ) -> Result<OperationKey, ApplyError> {
        let key = ev
            .correlation
            .operation_key
            .clone()
            .ok_or_else(|| Cx::of(ev).missing("operation_key"))?;
        move_entity(&mut self.effects, &key, |e| &mut e.status, to, ev, "effect")?;
        Ok(key)
    }

    pub(super) fn approval_transition(
        &mut self,
        ev: &Event,
        to: ApprovalStatus,
    ) -> Result<ApprovalId, ApplyError> {
        let id = ev
            .correlation
            .approval_id
            .ok_or_else(|| Cx::of(ev).missing("approval_id"))?;
        move_entity(
            &mut self.approvals,
            &id,
            |a| &mut a.status,
            to,
            ev,
            "approval",
        )?;
        Ok(id)
    }
}

/// Moves the entity `key` of `map` to `to` through its machine's table.
pub(super) fn move_entity<'m, K: Ord + std::fmt::Display, V, S: StateMachine>(
    map: &'m mut BTreeMap<K, V>,
    key: &K,
    status: impl Fn(&mut V) -> &mut S,
    to: S,
    ev: &Event,
    entity: &'static str,
) -> Result<&'m mut V, ApplyError> {
    let (seq, event_type) = (ev.seq, ev.type_name());
    let value = map.get_mut(key).ok_or_else(|| ApplyError::UnknownEntity {
        seq,
        event_type,
        entity,
        id: key.to_string(),
    })?;
    let current = status(value);
    *current = check_transition(*current, to).map_err(|source| ApplyError::Transition {
        seq,
        event_type,
        source,
    })?;
    Ok(value)
}
