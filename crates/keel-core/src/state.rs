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

mod fold_agent;
mod fold_call;
mod fold_session;
mod fold_step;
mod support;

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
        let cx = Cx::of(ev);
        let Cx { seq, ty } = cx;
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
        match &ev.body {
            EventBody::SessionCreated { .. }
            | EventBody::SessionStatusChanged { .. }
            | EventBody::SessionConfigChanged { .. }
            | EventBody::SessionReleasePinned { .. }
            | EventBody::TurnQueued { .. }
            | EventBody::TurnCancelRequested { .. }
            | EventBody::TurnStarted { .. }
            | EventBody::TurnPhaseChanged { .. }
            | EventBody::TurnFinished { .. } => self.fold_session(ev, cx)?,
            EventBody::StepStarted { .. }
            | EventBody::StepStreaming { .. }
            | EventBody::StepAttemptFailed { .. }
            | EventBody::StepCompleted { .. }
            | EventBody::StepFailed { .. } => self.fold_step(ev, cx)?,
            EventBody::ToolCallProposed { .. }
            | EventBody::ToolCallValidating { .. }
            | EventBody::ToolCallAwaitingApproval { .. }
            | EventBody::ToolCallStarted { .. }
            | EventBody::ToolCallFinished { .. }
            | EventBody::EffectPrepared { .. }
            | EventBody::EffectDispatched { .. }
            | EventBody::EffectOutcomeUnknown { .. }
            | EventBody::EffectCommitted { .. }
            | EventBody::EffectFailed { .. }
            | EventBody::EffectDecided { .. }
            | EventBody::ApprovalRequested { .. }
            | EventBody::ApprovalDecided { .. }
            | EventBody::ApprovalExpired { .. } => self.fold_call(ev, cx)?,
            EventBody::HookRan { .. }
            | EventBody::AgentSpawned { .. }
            | EventBody::AgentFinished { .. }
            | EventBody::ContextCompacted { .. } => self.fold_agent(ev, cx)?,
        }
        self.version = seq;
        Ok(())
    }
}

/// What a fold error names: the event's seq and type.
#[derive(Clone, Copy)]
struct Cx {
    seq: u64,
    ty: &'static str,
}

impl Cx {
    /// The seq and type of `ev`.
    fn of(ev: &Event) -> Self {
        Self {
            seq: ev.seq,
            ty: ev.type_name(),
        }
    }

    /// A correlation id the event type requires is missing.
    fn missing(self, field: &'static str) -> ApplyError {
        ApplyError::MissingCorrelation {
            seq: self.seq,
            event_type: self.ty,
            field,
        }
    }

    /// The event refers to an entity the session does not have.
    fn unknown(self, entity: &'static str, id: String) -> ApplyError {
        ApplyError::UnknownEntity {
            seq: self.seq,
            event_type: self.ty,
            entity,
            id,
        }
    }

    /// The transition is not in the machine's table.
    fn trans(self, source: TransitionError) -> ApplyError {
        ApplyError::Transition {
            seq: self.seq,
            event_type: self.ty,
            source,
        }
    }

    /// The event breaks a rule beyond one transition.
    fn rule(self, rule: &'static str) -> ApplyError {
        ApplyError::Rule {
            seq: self.seq,
            event_type: self.ty,
            rule,
        }
    }
}
