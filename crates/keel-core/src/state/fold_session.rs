//! The fold of session and turn events: a part of [`SessionState::apply`], which has checked the
//! event's order and session and sets the version once this accepts it.

use super::*;

impl SessionState {
    /// Folds one of the session and turn events (`SessionCreated`, `SessionStatusChanged`,
    /// `SessionConfigChanged`, `SessionReleasePinned`, `TurnQueued`, `TurnCancelRequested`,
    /// `TurnStarted`, `TurnPhaseChanged`, `TurnFinished`); any other event is a routing bug in
    /// `apply`.
    pub(super) fn fold_session(&mut self, ev: &Event, cx: Cx) -> Result<(), ApplyError> {
        let Cx { seq, ty } = cx;
        let c = &ev.correlation;
        match &ev.body {
            EventBody::SessionCreated {
                tenant_id,
                release_id,
                config,
            } => {
                self.session_id = Some(ev.session_id);
                self.tenant_id = Some(*tenant_id);
                self.release_id = Some(release_id.clone());
                self.parent_session_id = c.parent_session_id;
                self.config = config.clone();
                self.status = SessionStatus::Created;
            }
            EventBody::SessionStatusChanged { status, .. } => {
                let to = check_transition(self.status, *status).map_err(|e| cx.trans(e))?;
                if to == SessionStatus::Idle && self.active_turn.is_some() {
                    return Err(cx.rule("a session with an active turn cannot be idle"));
                }
                if to == SessionStatus::Closed && self.active_turn.is_some() {
                    return Err(cx.rule(
                        "a session with an active turn cannot close; finish or abort the turn first",
                    ));
                }
                if to == SessionStatus::RequiresAction && self.active_turn.is_none() {
                    return Err(cx.rule("only a session with an active turn can require action"));
                }
                self.status = to;
            }
            EventBody::SessionConfigChanged { changes } => {
                if !changes.is_object() {
                    return Err(cx.rule("config changes must be a JSON object"));
                }
                // Any time the writer holds the session (the lease and CAS make it the only
                // writer): between turns, while a turn waits on a human, or for a turn a
                // crashed worker left. A step already sampled keeps its frozen snapshot; the
                // next step reads the merged config.
                crate::patch::merge_patch(&mut self.config, changes);
            }
            EventBody::SessionReleasePinned {
                from_release_id,
                to_release_id,
            } => {
                if self.release_id.as_ref() != Some(from_release_id) {
                    return Err(cx.rule(
                        "a re-pin starts from the release the session has pinned (from_release_id)",
                    ));
                }
                if from_release_id == to_release_id {
                    return Err(cx.rule("a re-pin names a release other than the pinned one"));
                }
                if self.active_turn.is_some() {
                    return Err(
                        cx.rule("the release can change only between turns (no active turn)")
                    );
                }
                self.release_id = Some(to_release_id.clone());
            }
            EventBody::TurnQueued { input, .. } => {
                let id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                if self.turns.contains_key(&id) {
                    return Err(ApplyError::Duplicate {
                        seq,
                        event_type: ty,
                        entity: "turn",
                        id: id.to_string(),
                    });
                }
                self.turns.insert(
                    id,
                    TurnState {
                        id,
                        status: TurnStatus::INITIAL,
                        input: input.clone(),
                        steps: Vec::new(),
                        usage: Usage::default(),
                        cost_usd: 0.0,
                        usage_by_model: UsageByModel::new(),
                        tool_calls_run: 0,
                        subagents: crate::budget::Consumed::default(),
                        terminal_reason: None,
                        queued_at: ev.ts,
                        started_at: None,
                        cancel_requested: None,
                        compacted_at_step: None,
                        overflows: 0,
                        prompt_hooked: false,
                        blocked: None,
                        stop_hooked_step: None,
                        stop_continue: None,
                        stop_continues: 0,
                    },
                );
                self.turn_order.push(id);
                self.queue.push_back(id);
            }
            EventBody::TurnCancelRequested { reason } => {
                let id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| cx.unknown("turn", id.to_string()))?;
                if turn.status.is_terminal() {
                    return Err(cx.rule("a finished turn cannot be cancelled"));
                }
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.cancel_requested.get_or_insert_with(|| reason.clone());
                }
            }
            EventBody::TurnStarted {} => {
                let id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| cx.unknown("turn", id.to_string()))?;
                let to = check_transition(turn.status, TurnStatus::Preparing)
                    .map_err(|e| cx.trans(e))?;
                if self.active_turn.is_some() {
                    return Err(cx.rule("another turn is active (one active turn per session)"));
                }
                if self.status != SessionStatus::Running {
                    return Err(cx.rule("a turn starts only in a running session"));
                }
                self.queue.retain(|t| *t != id);
                self.active_turn = Some(id);
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.status = to;
                    turn.started_at = Some(ev.ts);
                }
            }
            EventBody::TurnPhaseChanged { phase } => {
                let id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| cx.unknown("turn", id.to_string()))?;
                if phase.is_terminal() {
                    return Err(cx.rule("a turn ends only with turn.finished"));
                }
                if *phase == TurnStatus::Preparing || *phase == TurnStatus::Queued {
                    return Err(cx.rule(
                        "a turn is queued by turn.queued and leaves the queue by turn.started",
                    ));
                }
                let to = check_transition(turn.status, *phase).map_err(|e| cx.trans(e))?;
                if self.active_turn != Some(id) {
                    return Err(cx.rule("only the active turn changes phase"));
                }
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.status = to;
                }
            }
            EventBody::TurnFinished {
                terminal_reason,
                duration_ms,
                ..
            } => {
                let id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| cx.unknown("turn", id.to_string()))?;
                let status = terminal_reason.turn_status().ok_or_else(|| {
                    cx.rule("requires_action suspends a turn; it does not finish it")
                })?;
                let to = check_transition(turn.status, status).map_err(|e| cx.trans(e))?;
                let open = self
                    .tool_calls
                    .values()
                    .any(|tc| tc.turn_id == id && !tc.status.is_terminal());
                if open {
                    return Err(cx.rule(
                        "every tool call of the turn needs its result before the turn finishes",
                    ));
                }
                if turn
                    .steps
                    .iter()
                    .any(|s| self.steps.get(s).is_some_and(|s| !s.status.is_terminal()))
                {
                    return Err(cx.rule("every step of the turn ends before the turn finishes"));
                }
                if self.active_turn == Some(id) && self.status == SessionStatus::RequiresAction {
                    return Err(cx.rule(
                        "a session that requires action returns to running before its turn finishes",
                    ));
                }
                if self.active_turn == Some(id) {
                    self.active_turn = None;
                }
                self.queue.retain(|t| *t != id);
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.status = to;
                    turn.terminal_reason = Some(*terminal_reason);
                }
                self.finished_turns_ms = self.finished_turns_ms.saturating_add(*duration_ms);
            }
            _ => unreachable!("apply routes only session and turn events to fold_session"),
        }
        Ok(())
    }
}
