//! The session fold: [`SessionState::apply`] turns a journal into state.
//!
//! `apply` is pure and atomic: it either accepts the event and updates the state, or returns an
//! [`ApplyError`] and leaves the state exactly as it was. Every status change goes through the
//! machine tables ([`check_transition`]); an event that would move a terminal state is refused.
//! Replaying the same events always yields the same state.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::budget::{TerminalReason, Usage, UsageByModel};
use crate::event::{EffectDecision, Event, EventBody, HookDecision, HookEvent};
use crate::ids::{
    ApprovalId, OperationKey, ReleaseId, SessionId, StepId, TenantId, ToolCallId, TurnId,
};
use crate::machine::{
    ApprovalStatus, EffectStatus, SessionStatus, StateMachine, StepStatus, ToolCallStatus,
    TransitionError, TurnStatus, check_transition,
};

/// Why an event cannot be applied. Each variant names the event's sequence number.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApplyError {
    /// The event is not the next one (`seq` must be `version + 1`).
    #[error("event seq {seq} does not follow version {version}")]
    OutOfOrder {
        /// The event's seq.
        seq: u64,
        /// The state's version.
        version: u64,
    },
    /// The event belongs to another session.
    #[error("event seq {seq} belongs to session {found}, not {expected}")]
    WrongSession {
        /// The event's seq.
        seq: u64,
        /// The state's session.
        expected: SessionId,
        /// The event's session.
        found: SessionId,
    },
    /// The first event must be `session.created`, and only the first.
    #[error(
        "event seq {seq} ({event_type}): session.created must be the first event and only the first"
    )]
    Creation {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
    },
    /// A correlation id the event type requires is missing.
    #[error("event seq {seq} ({event_type}) lacks correlation id {field}")]
    MissingCorrelation {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// The event refers to an entity the session does not have.
    #[error("event seq {seq} ({event_type}) refers to unknown {entity} {id}")]
    UnknownEntity {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
        /// `turn`, `step`, `tool_call`, `effect`, `approval`.
        entity: &'static str,
        /// The id.
        id: String,
    },
    /// The event would create an entity that already exists.
    #[error("event seq {seq} ({event_type}) creates {entity} {id}, which already exists")]
    Duplicate {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
        /// The entity kind.
        entity: &'static str,
        /// The id.
        id: String,
    },
    /// The transition is not in the machine's table.
    #[error("event seq {seq} ({event_type}): {source}")]
    Transition {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
        /// The illegal transition.
        source: TransitionError,
    },
    /// The event breaks a rule that is not a single transition (one active turn per session, a
    /// terminal reason that does not finish a turn, a session that is closed…).
    #[error("event seq {seq} ({event_type}): {rule}")]
    Rule {
        /// The event's seq.
        seq: u64,
        /// Its type.
        event_type: &'static str,
        /// The rule, in words.
        rule: &'static str,
    },
}

/// A turn as folded from the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnState {
    /// Its id.
    pub id: TurnId,
    /// Current status.
    pub status: TurnStatus,
    /// The user's input.
    pub input: String,
    /// Steps, in order.
    pub steps: Vec<StepId>,
    /// Tokens used.
    pub usage: Usage,
    /// Cost, USD.
    pub cost_usd: f64,
    /// Tokens, cost (USD) and steps per model that served a response (completed steps, and
    /// failed attempts that used tokens).
    pub usage_by_model: UsageByModel,
    /// Tool calls that reached `running`.
    pub tool_calls_run: u32,
    /// What its finished sub-agents spent (`agent.finished`: their steps, tokens, cost and tool
    /// calls, their own children's included). Their tokens and cost are also in `usage` and
    /// `cost_usd`; their steps and tool calls are counted only here (`steps` and
    /// `tool_calls_run` are this session's own), and all four count against the turn's budget.
    pub subagents: crate::budget::Consumed,
    /// Why it ended, once finished.
    pub terminal_reason: Option<TerminalReason>,
    /// When it was queued.
    pub queued_at: DateTime<Utc>,
    /// When it left the queue.
    pub started_at: Option<DateTime<Utc>>,
    /// Why cancellation was requested (`turn.cancel_requested`), if it was.
    pub cancel_requested: Option<String>,
    /// How many steps the turn had when its context was last compacted (`context.compacted`):
    /// equal to `steps.len()` means the next step's context is already compacted.
    pub compacted_at_step: Option<usize>,
    /// Model attempts of the turn that failed with `context_overflow`.
    pub overflows: u32,
    /// The `user_prompt_submit` hooks ran for this turn (`hook.ran`).
    pub prompt_hooked: bool,
    /// A `user_prompt_submit` hook blocked the prompt: the hook and its reason. The turn ends
    /// `aborted` before any step.
    pub blocked: Option<(String, String)>,
    /// The step after which the `stop` hooks last ran.
    pub stop_hooked_step: Option<StepId>,
    /// The step after which a `stop` hook last asked the turn to continue, and that hook.
    pub stop_continue: Option<(StepId, String)>,
    /// How many times `stop` hooks asked the turn to continue (once per step, however many
    /// hooks asked).
    pub stop_continues: u32,
}

/// What `pre_tool_use` hooks decided about a call (folded from its `hook.ran` events).
#[derive(Clone, Debug, PartialEq)]
pub struct CallHook {
    /// The most restrictive decision (`deny` over `ask` over the rest).
    pub decision: HookDecision,
    /// The hook that made it.
    pub hook: String,
    /// Its reason.
    pub reason: Option<String>,
    /// The hook whose rewrite the call runs (its arguments replaced the proposal's).
    pub rewritten_by: Option<String>,
}

/// A step as folded from the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct StepState {
    /// Its id.
    pub id: StepId,
    /// Its turn.
    pub turn_id: TurnId,
    /// Current status.
    pub status: StepStatus,
    /// Current attempt, from 1.
    pub attempt: u32,
    /// Model of the current attempt.
    pub model: String,
    /// Normalized stop reason once completed.
    pub stop_reason: Option<String>,
    /// Calls it proposed, in the model's order.
    pub tool_calls: Vec<ToolCallId>,
    /// Calls of `tool_calls` that failed attempts proposed and the completing response did not
    /// (`step.completed`'s `abandoned_calls`): they get results, but the response is the others.
    pub abandoned: Vec<ToolCallId>,
    /// Its last attempt failed with `context_overflow` and the context was not compacted since:
    /// compact before the next attempt.
    pub overflowed: bool,
    /// Why it failed (`step.failed`): the error class and the message.
    pub failure: Option<(String, String)>,
}

/// A tool call as folded from the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallState {
    /// Its id.
    pub id: ToolCallId,
    /// Its turn.
    pub turn_id: TurnId,
    /// Its step.
    pub step_id: StepId,
    /// Tool name.
    pub name: String,
    /// Arguments as proposed, redacted.
    pub arguments: Value,
    /// Redaction changed `arguments`: the exact ones are sealed outside the journal.
    pub sealed: bool,
    /// Current status.
    pub status: ToolCallStatus,
    /// Times it reached `running` (more than 1 after a re-run).
    pub runs: u32,
    /// The approval it waits or waited on.
    pub approval_id: Option<ApprovalId>,
    /// Its effect, if side-effecting.
    pub operation_key: Option<OperationKey>,
    /// Its one result, once finished: `(output, is_error)`.
    pub result: Option<(String, bool)>,
    /// What `pre_tool_use` hooks decided, once they ran (`hook.ran`).
    pub hook: Option<CallHook>,
}

/// An effect as folded from the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectState {
    /// Its key.
    pub key: OperationKey,
    /// The call it belongs to.
    pub tool_call_id: ToolCallId,
    /// Current status.
    pub status: EffectStatus,
    /// Dispatch attempts so far.
    pub attempts: u32,
    /// Hash of the request.
    pub request_hash: String,
    /// A human's decision on it while `outcome_unknown`, until the worker applies it.
    pub decision: Option<EffectDecision>,
    /// What the tool recorded before dispatch for its `reconcile` (`effect.prepared`).
    pub probe: Option<Value>,
}

/// An approval as folded from the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalState {
    /// Its id.
    pub id: ApprovalId,
    /// The call it is bound to.
    pub tool_call_id: ToolCallId,
    /// Hash of the call's arguments.
    pub args_hash: String,
    /// Current status.
    pub status: ApprovalStatus,
    /// What the `permission_request` hooks decided, once they ran: the decision (`allow`,
    /// `deny`, or `none` — left to a human), the hook that made it, its reason.
    pub hook: Option<(HookDecision, String, Option<String>)>,
    /// Expiry.
    pub expires_at: DateTime<Utc>,
}

/// A session folded from its journal.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SessionState {
    /// The session (set by `session.created`).
    pub session_id: Option<SessionId>,
    /// Owner.
    pub tenant_id: Option<TenantId>,
    /// The release the session runs: the one pinned in `session.created`, or the last
    /// `session.release_pinned`'s `to_release_id`.
    pub release_id: Option<ReleaseId>,
    /// Parent session, for spawned agents.
    pub parent_session_id: Option<SessionId>,
    /// Host settings: those pinned at creation with every `session.config_changed` merged in,
    /// in order (the effective config).
    pub config: Value,
    /// Current status (`created` before the first event too).
    pub status: SessionStatus,
    /// Last applied seq; 0 when empty.
    pub version: u64,
    /// Turns by id.
    pub turns: BTreeMap<TurnId, TurnState>,
    /// Turn ids in the order they were queued.
    pub turn_order: Vec<TurnId>,
    /// Queued turns not yet started, oldest first.
    pub queue: VecDeque<TurnId>,
    /// The turn that has started and not finished.
    pub active_turn: Option<TurnId>,
    /// Steps by id.
    pub steps: BTreeMap<StepId, StepState>,
    /// Tool calls by id.
    pub tool_calls: BTreeMap<ToolCallId, ToolCallState>,
    /// Effects by key.
    pub effects: BTreeMap<OperationKey, EffectState>,
    /// Approvals by id.
    pub approvals: BTreeMap<ApprovalId, ApprovalState>,
    /// Index of the first transcript item after the last compaction boundary.
    pub compaction_boundary: u64,
    /// Session totals: tokens.
    pub usage: Usage,
    /// Session totals: USD.
    pub cost_usd: f64,
    /// Session totals: completed steps.
    pub num_steps: u32,
    /// Session totals per model that served a response (tokens, USD, steps; failed attempts
    /// that used tokens count too).
    pub usage_by_model: UsageByModel,
    /// Sum of finished turns' durations (`turn.finished` `duration_ms`), ms.
    pub finished_turns_ms: u64,
    /// The `session_start` hooks ran (`hook.ran`).
    pub session_hooked: bool,
    /// Child sessions its `spawn_agent` calls started (`agent.spawned`), by child id.
    pub children: BTreeMap<SessionId, ChildState>,
}

/// A child session a `spawn_agent` call of this session started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChildState {
    /// The agent definition's name.
    pub agent: String,
    /// The call that started it.
    pub tool_call_id: Option<ToolCallId>,
    /// Its turn's terminal reason, once `agent.finished` is journaled.
    pub finished: Option<String>,
}

impl Default for SessionStatus {
    fn default() -> Self {
        SessionStatus::INITIAL
    }
}

impl SessionState {
    /// Folds a whole journal.
    ///
    /// # Errors
    /// The first event that cannot be applied.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a Event>) -> Result<Self, ApplyError> {
        let mut state = SessionState::default();
        for ev in events {
            state.apply(ev)?;
        }
        Ok(state)
    }

    /// Tool calls not yet finished, in proposal order within their steps.
    pub fn open_tool_calls(&self) -> impl Iterator<Item = &ToolCallState> {
        self.steps
            .values()
            .flat_map(|s| s.tool_calls.iter())
            .filter_map(|id| self.tool_calls.get(id))
            .filter(|c| !c.status.is_terminal())
    }

    /// Applies one event.
    ///
    /// # Errors
    /// [`ApplyError`] naming the event's seq; the state is unchanged.
    pub fn apply(&mut self, ev: &Event) -> Result<(), ApplyError> {
        let seq = ev.seq;
        let ty = ev.type_name();
        if seq != self.version + 1 {
            return Err(ApplyError::OutOfOrder {
                seq,
                version: self.version,
            });
        }
        let is_create = matches!(ev.body, EventBody::SessionCreated { .. });
        match self.session_id {
            None if !is_create => {
                return Err(ApplyError::Creation {
                    seq,
                    event_type: ty,
                });
            }
            Some(_) if is_create => {
                return Err(ApplyError::Creation {
                    seq,
                    event_type: ty,
                });
            }
            Some(expected) if expected != ev.session_id => {
                return Err(ApplyError::WrongSession {
                    seq,
                    expected,
                    found: ev.session_id,
                });
            }
            _ => {}
        }
        if self.status == SessionStatus::Closed {
            return Err(ApplyError::Rule {
                seq,
                event_type: ty,
                rule: "the session is closed",
            });
        }
        let c = &ev.correlation;
        let missing = |field| ApplyError::MissingCorrelation {
            seq,
            event_type: ty,
            field,
        };
        let unknown = |entity, id: String| ApplyError::UnknownEntity {
            seq,
            event_type: ty,
            entity,
            id,
        };
        let trans = |source| ApplyError::Transition {
            seq,
            event_type: ty,
            source,
        };
        let rule = |rule| ApplyError::Rule {
            seq,
            event_type: ty,
            rule,
        };

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
                let to = check_transition(self.status, *status).map_err(trans)?;
                if to == SessionStatus::Idle && self.active_turn.is_some() {
                    return Err(rule("a session with an active turn cannot be idle"));
                }
                if to == SessionStatus::Closed && self.active_turn.is_some() {
                    return Err(rule(
                        "a session with an active turn cannot close; finish or abort the turn first",
                    ));
                }
                if to == SessionStatus::RequiresAction && self.active_turn.is_none() {
                    return Err(rule(
                        "only a session with an active turn can require action",
                    ));
                }
                self.status = to;
            }
            EventBody::SessionConfigChanged { changes } => {
                if !changes.is_object() {
                    return Err(rule("config changes must be a JSON object"));
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
                    return Err(rule(
                        "a re-pin starts from the release the session has pinned (from_release_id)",
                    ));
                }
                if from_release_id == to_release_id {
                    return Err(rule("a re-pin names a release other than the pinned one"));
                }
                if self.active_turn.is_some() {
                    return Err(rule(
                        "the release can change only between turns (no active turn)",
                    ));
                }
                self.release_id = Some(to_release_id.clone());
            }
            EventBody::TurnQueued { input, .. } => {
                let id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
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
                let id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| unknown("turn", id.to_string()))?;
                if turn.status.is_terminal() {
                    return Err(rule("a finished turn cannot be cancelled"));
                }
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.cancel_requested.get_or_insert_with(|| reason.clone());
                }
            }
            EventBody::TurnStarted {} => {
                let id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| unknown("turn", id.to_string()))?;
                let to = check_transition(turn.status, TurnStatus::Preparing).map_err(trans)?;
                if self.active_turn.is_some() {
                    return Err(rule("another turn is active (one active turn per session)"));
                }
                if self.status != SessionStatus::Running {
                    return Err(rule("a turn starts only in a running session"));
                }
                self.queue.retain(|t| *t != id);
                self.active_turn = Some(id);
                if let Some(turn) = self.turns.get_mut(&id) {
                    turn.status = to;
                    turn.started_at = Some(ev.ts);
                }
            }
            EventBody::TurnPhaseChanged { phase } => {
                let id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| unknown("turn", id.to_string()))?;
                if phase.is_terminal() {
                    return Err(rule("a turn ends only with turn.finished"));
                }
                if *phase == TurnStatus::Preparing || *phase == TurnStatus::Queued {
                    return Err(rule(
                        "a turn is queued by turn.queued and leaves the queue by turn.started",
                    ));
                }
                let to = check_transition(turn.status, *phase).map_err(trans)?;
                if self.active_turn != Some(id) {
                    return Err(rule("only the active turn changes phase"));
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
                let id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let turn = self
                    .turns
                    .get(&id)
                    .ok_or_else(|| unknown("turn", id.to_string()))?;
                let status = terminal_reason.turn_status().ok_or_else(|| {
                    rule("requires_action suspends a turn; it does not finish it")
                })?;
                let to = check_transition(turn.status, status).map_err(trans)?;
                let open = self
                    .tool_calls
                    .values()
                    .any(|tc| tc.turn_id == id && !tc.status.is_terminal());
                if open {
                    return Err(rule(
                        "every tool call of the turn needs its result before the turn finishes",
                    ));
                }
                if turn
                    .steps
                    .iter()
                    .any(|s| self.steps.get(s).is_some_and(|s| !s.status.is_terminal()))
                {
                    return Err(rule("every step of the turn ends before the turn finishes"));
                }
                if self.active_turn == Some(id) && self.status == SessionStatus::RequiresAction {
                    return Err(rule(
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
            EventBody::StepStarted { model } => {
                let turn_id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let step_id = c.step_id.ok_or_else(|| missing("step_id"))?;
                let attempt = c.attempt.ok_or_else(|| missing("attempt"))?;
                let turn = self
                    .turns
                    .get(&turn_id)
                    .ok_or_else(|| unknown("turn", turn_id.to_string()))?;
                if turn.status != TurnStatus::Sampling {
                    return Err(rule("a step starts only while its turn is sampling"));
                }
                match self.steps.get(&step_id) {
                    None => {
                        if attempt != 1 {
                            return Err(rule("a new step starts at attempt 1"));
                        }
                        self.steps.insert(
                            step_id,
                            StepState {
                                id: step_id,
                                turn_id,
                                status: StepStatus::INITIAL,
                                attempt,
                                model: model.clone(),
                                stop_reason: None,
                                tool_calls: Vec::new(),
                                abandoned: Vec::new(),
                                overflowed: false,
                                failure: None,
                            },
                        );
                        if let Some(turn) = self.turns.get_mut(&turn_id) {
                            turn.steps.push(step_id);
                        }
                    }
                    Some(step) => {
                        if step.turn_id != turn_id {
                            return Err(rule("a step belongs to one turn"));
                        }
                        if attempt <= step.attempt {
                            return Err(rule("a retried step's attempt number must grow"));
                        }
                        // A retry: a streaming attempt goes back to `started`; one that failed before
                        // its first token is already there.
                        let to = if step.status == StepStatus::Started {
                            StepStatus::Started
                        } else {
                            check_transition(step.status, StepStatus::Started).map_err(trans)?
                        };
                        if let Some(step) = self.steps.get_mut(&step_id) {
                            step.status = to;
                            step.attempt = attempt;
                            step.model = model.clone();
                        }
                    }
                }
            }
            EventBody::StepStreaming {} => {
                self.step_transition(ev, StepStatus::Streaming)?;
            }
            EventBody::StepAttemptFailed {
                error_kind,
                model,
                usage,
                cost_usd,
                usage_estimated,
                ..
            } => {
                let step_id = c.step_id.ok_or_else(|| missing("step_id"))?;
                let step = self
                    .steps
                    .get(&step_id)
                    .ok_or_else(|| unknown("step", step_id.to_string()))?;
                if step.status.is_terminal() {
                    return Err(rule("a finished step has no further attempts"));
                }
                // What the failed attempt used counts like a completed step's usage.
                let turn_id = step.turn_id;
                self.count_usage(turn_id, model, usage, *cost_usd, *usage_estimated, false);
                if error_kind == "context_overflow" {
                    if let Some(step) = self.steps.get_mut(&step_id) {
                        step.overflowed = true;
                    }
                    if let Some(turn) = self.turns.get_mut(&turn_id) {
                        turn.overflows += 1;
                    }
                }
            }
            EventBody::StepCompleted {
                model,
                stop_reason,
                usage,
                cost_usd,
                usage_estimated,
                abandoned_calls,
                ..
            } => {
                let (step_id, turn_id) = self.step_transition(ev, StepStatus::Completed)?;
                if let Some(step) = self.steps.get_mut(&step_id) {
                    step.stop_reason = Some(stop_reason.clone());
                    step.abandoned = abandoned_calls
                        .iter()
                        .filter(|c| step.tool_calls.contains(c))
                        .cloned()
                        .collect();
                }
                self.count_usage(turn_id, model, usage, *cost_usd, *usage_estimated, true);
                self.num_steps = self.num_steps.saturating_add(1);
            }
            EventBody::StepFailed {
                error_kind,
                message,
                usage,
                cost_usd,
                usage_estimated,
                ..
            } => {
                let (step_id, turn_id) = self.step_transition(ev, StepStatus::Failed)?;
                let mut model = String::new();
                if let Some(step) = self.steps.get_mut(&step_id) {
                    step.failure = Some((error_kind.clone(), message.clone()));
                    model.clone_from(&step.model);
                }
                if !usage.is_zero() || *cost_usd != 0.0 {
                    self.count_usage(turn_id, &model, usage, *cost_usd, *usage_estimated, false);
                }
            }
            EventBody::ToolCallProposed {
                name,
                arguments,
                sealed,
            } => {
                let turn_id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let step_id = c.step_id.ok_or_else(|| missing("step_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
                let step = self
                    .steps
                    .get(&step_id)
                    .ok_or_else(|| unknown("step", step_id.to_string()))?;
                if step.turn_id != turn_id {
                    return Err(rule("a tool call's step must belong to its turn"));
                }
                if self.active_turn != Some(turn_id) {
                    return Err(rule("only the active turn's steps propose tool calls"));
                }
                if step.status.is_terminal() && step.status != StepStatus::Completed {
                    return Err(rule("a failed step proposes no tool calls"));
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
                let approval = c.approval_id.ok_or_else(|| missing("approval_id"))?;
                let id = self.call_transition(ev, ToolCallStatus::AwaitingApproval)?;
                if let Some(call) = self.tool_calls.get_mut(&id) {
                    call.approval_id = Some(approval);
                }
            }
            EventBody::ToolCallStarted {} => {
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
                let call = self
                    .tool_calls
                    .get(&call_id)
                    .ok_or_else(|| unknown("tool_call", call_id.to_string()))?;
                // A re-run after a crash starts a `running` call again; otherwise this is a transition.
                if call.status != ToolCallStatus::Running {
                    check_transition(call.status, ToolCallStatus::Running).map_err(trans)?;
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
                    return Err(rule("tool_call.finished carries a terminal status"));
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
                    .ok_or_else(|| missing("operation_key"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
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
                    .ok_or_else(|| missing("operation_key"))?;
                let effect = self
                    .effects
                    .get(&key)
                    .ok_or_else(|| unknown("effect", key.to_string()))?;
                if effect.status != EffectStatus::OutcomeUnknown {
                    return Err(rule("only an outcome_unknown effect is decided by a human"));
                }
                if effect.decision.is_some() {
                    return Err(rule("the effect is already decided"));
                }
                if let Some(e) = self.effects.get_mut(&key) {
                    e.decision = Some(decision.clone());
                }
            }
            EventBody::ApprovalRequested {
                args_hash,
                expires_at,
            } => {
                let id = c.approval_id.ok_or_else(|| missing("approval_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
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
                c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let call_id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
                let call = self
                    .tool_calls
                    .get(&call_id)
                    .ok_or_else(|| unknown("tool call", call_id.to_string()))?;
                if call.status.is_terminal() {
                    return Err(rule("a finished call spawns no agent"));
                }
                if self.children.contains_key(child_session_id) {
                    return Err(rule("a child session is spawned once"));
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
                let turn_id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
                let child = self
                    .children
                    .get_mut(child_session_id)
                    .ok_or_else(|| unknown("child session", child_session_id.to_string()))?;
                if child.finished.is_some() {
                    return Err(rule("a child session finishes once"));
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
                    return Err(rule(
                        "a compaction outside a turn (no turn_id) is accepted only between turns",
                    ));
                }
                if *first_kept_item < self.compaction_boundary {
                    return Err(rule("a compaction boundary never moves backwards"));
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
        }
        self.version = seq;
        Ok(())
    }

    /// Folds a `hook.ran`: what the hook decided about the call, approval, prompt or stop it
    /// ran for (see [`HookDecision`]). A tool hook is accepted only before the call is
    /// authorized (`proposed` / `validating`), a `permission_request` hook only while its
    /// approval is pending, and every hook only within the active turn.
    #[allow(clippy::too_many_arguments)]
    fn apply_hook(
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
        let rule = |rule| ApplyError::Rule {
            seq,
            event_type: ty,
            rule,
        };
        let missing = |field| ApplyError::MissingCorrelation {
            seq,
            event_type: ty,
            field,
        };
        let turn_id = c.turn_id.ok_or_else(|| missing("turn_id"))?;
        if self.active_turn != Some(turn_id) {
            return Err(rule("hooks run only within the active turn"));
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
            return Err(rule("this hook event cannot make this decision"));
        }
        if arguments.is_some() != (decision == HookDecision::Rewrite) {
            return Err(rule("a rewrite, and only a rewrite, carries arguments"));
        }
        match event {
            HookEvent::PreToolUse => {
                let id = c
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| missing("tool_call_id"))?;
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
                    return Err(rule(
                        "a pre_tool_use hook runs only before the call is authorized",
                    ));
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
                let id = c.approval_id.ok_or_else(|| missing("approval_id"))?;
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
                    return Err(rule(
                        "a permission_request hook runs only on a pending approval",
                    ));
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
                        return Err(rule("a stop hook runs after a step"));
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
    fn live_call(
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
    fn count_usage(
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
    fn count_child_steps(&mut self, turn_id: TurnId, model: &str, steps: u32) {
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

    fn step_transition(
        &mut self,
        ev: &Event,
        to: StepStatus,
    ) -> Result<(StepId, TurnId), ApplyError> {
        let id = ev
            .correlation
            .step_id
            .ok_or_else(|| missing(ev, "step_id"))?;
        let step = move_entity(&mut self.steps, &id, |s| &mut s.status, to, ev, "step")?;
        Ok((id, step.turn_id))
    }

    fn call_transition(
        &mut self,
        ev: &Event,
        to: ToolCallStatus,
    ) -> Result<ToolCallId, ApplyError> {
        let id = ev
            .correlation
            .tool_call_id
            .clone()
            .ok_or_else(|| missing(ev, "tool_call_id"))?;
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

    fn effect_transition(
        &mut self,
        ev: &Event,
        to: EffectStatus,
    ) -> Result<OperationKey, ApplyError> {
        let key = ev
            .correlation
            .operation_key
            .clone()
            .ok_or_else(|| missing(ev, "operation_key"))?;
        move_entity(&mut self.effects, &key, |e| &mut e.status, to, ev, "effect")?;
        Ok(key)
    }

    fn approval_transition(
        &mut self,
        ev: &Event,
        to: ApprovalStatus,
    ) -> Result<ApprovalId, ApplyError> {
        let id = ev
            .correlation
            .approval_id
            .ok_or_else(|| missing(ev, "approval_id"))?;
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

fn missing(ev: &Event, field: &'static str) -> ApplyError {
    ApplyError::MissingCorrelation {
        seq: ev.seq,
        event_type: ev.type_name(),
        field,
    }
}

/// Moves the entity `key` of `map` to `to` through its machine's table.
fn move_entity<'m, K: Ord + std::fmt::Display, V, S: StateMachine>(
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
