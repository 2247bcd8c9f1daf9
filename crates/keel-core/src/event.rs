//! The event envelope and the event types.
//!
//! Wire shape (JSON, snake_case), one object per event:
//!
//! ```json
//! {"schema_version": 2, "session_id": "0193…", "seq": 7, "ts": "2026-11-30T02:15:28.123Z",
//!  "type": "tool_call.proposed", "turn_id": "…", "step_id": "…", "tool_call_id": "call_1",
//!  "payload": {"name": "read_file", "arguments": {"path": "README.md"}}}
//! ```
//!
//! Correlation ids (`turn_id`, `step_id`, `attempt`, `tool_call_id`, `operation_key`,
//! `parent_session_id`, `approval_id`) sit in the envelope, present where they apply, so any event
//! can be filtered without knowing its payload; the payload holds the rest. `seq` starts at 1 and is
//! the session's version after the event.
//!
//! [`Event::decode`] refuses an unknown `type` and a `schema_version` newer than
//! [`SCHEMA_VERSION`], and upgrades older versions (see [`upgrade`]). Every refusal is an
//! [`EventDecodeError`] naming the session and sequence number when they could be read.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::ApprovalDecision;
use crate::budget::{BudgetLimit, TerminalReason, Usage, UsageByModel};
use crate::ids::{
    ApprovalId, OperationKey, PrincipalId, ReleaseId, SessionId, StepId, TenantId, ToolCallId,
    TurnId,
};
use crate::machine::{SessionStatus, ToolCallStatus, TurnStatus};

mod envelope;
pub use envelope::*;

mod hooks;
pub use hooks::*;

/// The newest envelope version this build reads and writes. Version history:
/// - 1: timestamp as `ts_ms` (integer, Unix ms).
/// - 2: timestamp as `ts` (RFC 3339 string, UTC).
/// - 3: `hook.ran`, and `approval.decided` naming the `hook` that decided. Only those events
///   are written at 3 ([`EventBody::schema_version`]); every other event is still written at
///   2, so a build of version 2 reads every session that never ran a hook, and its workers
///   leave a session that did to newer ones (the claim's `schema_version` check) instead of
///   failing on an event they cannot read.
/// - 4: `agent.spawned` and `agent.finished` (sub-agents). Only those are written at 4, so a
///   session that never spawned a child stays readable by builds of version 2 and 3, and
///   their workers leave one that did to newer ones.
pub const SCHEMA_VERSION: u32 = 4;

/// Ids that tie an event to the entities it concerns. All optional; each event type documents
/// which it requires.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Correlation {
    /// The turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<StepId>,
    /// Attempt number of a step or an effect dispatch (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<ToolCallId>,
    /// The effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_key: Option<OperationKey>,
    /// The session that spawned this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// The approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<ApprovalId>,
    /// The principal whose request made this change (an API key's principal): present on the
    /// events an authenticated host journals for a caller — `session.created`,
    /// `session.config_changed`, `session.release_pinned`, `session.status_changed` (closed),
    /// `turn.queued`, `turn.cancel_requested`, `approval.decided`, `effect.decided` and the
    /// `tool_call.finished` of a call cancelled on request. Absent for the local CLI, for what
    /// the runtime does on its own, and in journals written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<PrincipalId>,
}

impl Correlation {
    /// Correlation for a turn.
    pub fn turn(turn_id: TurnId) -> Self {
        Correlation {
            turn_id: Some(turn_id),
            ..Self::default()
        }
    }

    /// Correlation for a step attempt.
    pub fn step(turn_id: TurnId, step_id: StepId, attempt: u32) -> Self {
        Correlation {
            turn_id: Some(turn_id),
            step_id: Some(step_id),
            attempt: Some(attempt),
            ..Self::default()
        }
    }

    /// Correlation for a tool call proposed in a step.
    pub fn tool_call(turn_id: TurnId, step_id: StepId, call: ToolCallId) -> Self {
        Correlation {
            turn_id: Some(turn_id),
            step_id: Some(step_id),
            tool_call_id: Some(call),
            ..Self::default()
        }
    }

    /// Adds an operation key.
    pub fn with_operation(mut self, key: OperationKey) -> Self {
        self.operation_key = Some(key);
        self
    }

    /// Adds an approval id.
    pub fn with_approval(mut self, id: ApprovalId) -> Self {
        self.approval_id = Some(id);
        self
    }

    /// Adds an attempt number.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// Names the acting principal, if any.
    pub fn by(mut self, principal: Option<PrincipalId>) -> Self {
        self.principal_id = principal;
        self
    }
}

/// How the input pipeline compiled a turn's input (`turn.queued`'s `compiled`): journaled with
/// the turn before it takes effect, so what the model was shown can be traced to what was typed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompiledInput {
    /// What the user typed, unexpanded.
    pub raw: String,
    /// The user-defined command (`/NAME` from a `.keel/commands/NAME.md` file) whose text became
    /// the prompt, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The file that command came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_file: Option<String>,
    /// The files `@path` mentions attached, in order of mention.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// One file an `@path` mention attached to a turn's input.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The path as mentioned (relative to the workspace).
    pub path: String,
    /// Characters of the file's content shown (as `read_file` shows it: numbered lines).
    pub chars: u64,
    /// The content was cut to the result budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// What happened. The serde tag is the event type name (dotted lowercase); fields are the payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload")]
pub enum EventBody {
    /// First event of every session. Correlation: optional `parent_session_id`.
    #[serde(rename = "session.created")]
    SessionCreated {
        /// Owner.
        tenant_id: TenantId,
        /// The pinned release.
        release_id: ReleaseId,
        /// Host-specific settings pinned for the session's life (workspace, permission mode,
        /// sandbox, budgets), redacted.
        #[serde(default)]
        config: Value,
    },
    /// The session moved to `status` (checked against the session table).
    #[serde(rename = "session.status_changed")]
    SessionStatusChanged {
        /// The new state.
        status: SessionStatus,
        /// Why, for people.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The session's settings changed: `changes` is a JSON merge patch (RFC 7386, see
    /// [`crate::patch`]) over the config of `session.created` and every earlier change, in
    /// journal order. Accepted only between turns — no active turn, or the active turn suspended
    /// in `requires_action` — and never in a closed session; it takes effect from the next
    /// step, tool call and turn a worker runs. Correlation: none.
    #[serde(rename = "session.config_changed")]
    SessionConfigChanged {
        /// A JSON object: keys replace the config's, nested objects merge, `null` removes.
        changes: Value,
    },
    /// The session was re-pinned: from the next turn on it runs release `to_release_id` (model
    /// route, instructions, tools, policy rules, default budget) instead of `from_release_id`,
    /// which must be the release it had pinned (`session.created` or the last re-pin). Accepted
    /// only with no active turn (a turn runs one release from start to end) and never in a
    /// closed session; the two ids differ. Correlation: none.
    #[serde(rename = "session.release_pinned")]
    SessionReleasePinned {
        /// The release the session ran until now.
        from_release_id: ReleaseId,
        /// The release it runs from now on.
        to_release_id: ReleaseId,
    },
    /// User input accepted; the turn is `queued`. Correlation: `turn_id`.
    #[serde(rename = "turn.queued")]
    TurnQueued {
        /// The user's message as the model sees it (after the input pipeline: a user
        /// command's prompt, attached files).
        input: String,
        /// How the input pipeline compiled it (`keel_runtime::input`), when it did anything
        /// beyond plain text: what was typed, the user command expanded, the files attached.
        /// Absent in journals written before the pipeline and for plain text (old readers
        /// ignore it; no schema bump).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compiled: Option<CompiledInput>,
    },
    /// Someone asked to cancel the turn (a user, or a newer input with the multitask strategy
    /// `interrupt`). A durable intent: whichever worker runs the session next aborts the turn.
    /// Correlation: `turn_id`.
    #[serde(rename = "turn.cancel_requested")]
    TurnCancelRequested {
        /// Why, for people (`cancelled by user`, `interrupted by a newer input`).
        reason: String,
    },
    /// The turn left the queue (`preparing`). Correlation: `turn_id`.
    #[serde(rename = "turn.started")]
    TurnStarted {},
    /// The turn entered `sampling`, `executing_tools` or `compacting`. Correlation: `turn_id`.
    #[serde(rename = "turn.phase_changed")]
    TurnPhaseChanged {
        /// The new, non-terminal phase.
        phase: TurnStatus,
    },
    /// The turn ended; the turn's last event. Correlation: `turn_id`.
    #[serde(rename = "turn.finished")]
    TurnFinished {
        /// Why it ended (never `requires_action`).
        terminal_reason: TerminalReason,
        /// The exhausted limit, when the reason is `budget_exhausted`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<BudgetLimit>,
        /// Tokens used by the turn: its completed steps and its failed attempts (retries,
        /// fallbacks, a step that failed for good), reported or estimated.
        usage: Usage,
        /// Cost of the turn, USD.
        cost_usd: f64,
        /// `usage` and `cost_usd` broken down by the model that served each response (a
        /// fallback's steps under the fallback, priced at its price; failed attempts that used
        /// tokens under the model that served them). Absent (empty) in journals written before
        /// it existed and in turns where no model used anything.
        #[serde(default, skip_serializing_if = "UsageByModel::is_empty")]
        usage_by_model: UsageByModel,
        /// Steps sampled.
        num_steps: u32,
        /// Wall-clock duration, ms.
        duration_ms: u64,
        /// What went wrong, for `failed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A step attempt started. Correlation: `turn_id`, `step_id`, `attempt`.
    #[serde(rename = "step.started")]
    StepStarted {
        /// The model this attempt asks: one member of the route (its label, e.g. `gpt-4o`),
        /// never the route as a whole; a fallback's attempt names the fallback.
        model: String,
    },
    /// The first response event of the attempt arrived. Correlation: `step_id`, `attempt`.
    #[serde(rename = "step.streaming")]
    StepStreaming {},
    /// An attempt failed and will be retried or abandoned. Correlation: `step_id`, `attempt`.
    #[serde(rename = "step.attempt_failed")]
    StepAttemptFailed {
        /// The model (route member) whose attempt failed.
        model: String,
        /// Provider error class (`rate_limited`, `overloaded`, …).
        error_kind: String,
        /// Provider message.
        message: String,
        /// Delay before the next attempt, ms, if one follows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_in_ms: Option<u64>,
        /// Model responses this attempt consumed (0 for a cancelled attempt): the session's script
        /// position advances by it (see `keel_model::ModelRequest::response_index`).
        #[serde(default = "one")]
        responses_consumed: u64,
        /// Tokens the failed attempt used (what the provider reported before the failure, or an
        /// estimate, see `usage_estimated`): counted in the turn's and session's usage, the
        /// budgets and the tenant's usage rows under `model`, like a completed step's. Absent
        /// (zero) when the attempt reported none, and in older journals.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
        /// Their cost, USD, at `model`'s price.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        cost_usd: f64,
        /// `usage` is the runtime's estimate (the provider reported none).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        usage_estimated: bool,
    },
    /// The step's response ended. Correlation: `step_id`, `attempt`.
    #[serde(rename = "step.completed")]
    StepCompleted {
        /// The model (route member) that served the response: `usage` and `cost_usd` are its,
        /// priced at its price, and the tenant's usage rows count them under it.
        model: String,
        /// Normalized stop reason (`end_turn`, `tool_use`, `max_tokens`, …).
        stop_reason: String,
        /// Tokens of this response.
        usage: Usage,
        /// Cost of this response, USD.
        cost_usd: f64,
        /// The response's visible text (the assistant message of the transcript), redacted.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        /// Provider reasoning items (opaque to the core), redacted. Journaled only when the
        /// session keeps reasoning (`keep_reasoning`), and by builds before hidden reasoning was
        /// sealed; otherwise empty: hidden reasoning is never stored past its turn.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<Value>,
        /// How many reasoning items of the response were sealed, exact, outside the journal
        /// (the runtime's sealed rows, kind `reasoning`, keyed by the step) so they can be sent
        /// back unmodified within the turn's tool loop; the row is deleted with the turn's
        /// `turn.finished`. Absent (0) when there were none, and in older journals.
        #[serde(default, skip_serializing_if = "is_zero")]
        reasoning_sealed: u32,
        /// Model responses this attempt consumed (the script position advances by it).
        #[serde(default = "one")]
        responses_consumed: u64,
        /// `usage` (and so `cost_usd`) is the runtime's estimate: the provider reported no usage,
        /// so the context sent and the output received were counted (bytes / 4) and priced, and
        /// budgets still bind. Absent (false) when the provider reported usage.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        usage_estimated: bool,
        /// Calls of the step that earlier, failed attempts proposed and this response did not:
        /// they are not part of the response (the transcript's assistant item leaves them and
        /// their results out). Absent (empty) when there were none, and in older journals.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        abandoned_calls: Vec<ToolCallId>,
    },
    /// The step failed for good. Correlation: `step_id`.
    #[serde(rename = "step.failed")]
    StepFailed {
        /// Provider error class (`cancelled` when the turn was cancelled).
        error_kind: String,
        /// Message.
        message: String,
        /// Model responses the failed attempt consumed (0 when it was cancelled).
        #[serde(default = "one")]
        responses_consumed: u64,
        /// Tokens the failed (or cancelled) attempt used, as in `step.attempt_failed`: counted
        /// under the model the step's last `step.started` names. Absent (zero) when none were
        /// reported, and in older journals.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
        /// Their cost, USD.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        cost_usd: f64,
        /// `usage` is the runtime's estimate.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        usage_estimated: bool,
    },
    /// The model proposed a call. Correlation: `turn_id`, `step_id`, `tool_call_id`.
    #[serde(rename = "tool_call.proposed")]
    ToolCallProposed {
        /// Tool name as the model wrote it.
        name: String,
        /// Arguments as the model wrote them (any JSON; validation comes next), redacted.
        arguments: Value,
        /// Redaction changed the arguments: the exact ones are sealed outside the journal (the
        /// runtime's sealed rows, kind `arguments`) until the call ends, and the call never runs
        /// with these. Absent (false) in journals written before it existed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sealed: bool,
    },
    /// Validation and policy evaluation began. Correlation: `tool_call_id`.
    #[serde(rename = "tool_call.validating")]
    ToolCallValidating {},
    /// Waiting on a human. Correlation: `tool_call_id`, `approval_id`.
    #[serde(rename = "tool_call.awaiting_approval")]
    ToolCallAwaitingApproval {},
    /// The tool started running (again, after a crash, for a read-only call). Correlation:
    /// `tool_call_id`.
    #[serde(rename = "tool_call.started")]
    ToolCallStarted {},
    /// The call's one result. Correlation: `tool_call_id`.
    #[serde(rename = "tool_call.finished")]
    ToolCallFinished {
        /// Terminal state.
        status: ToolCallStatus,
        /// The result text as the model sees it (after truncation).
        output: String,
        /// Whether the model sees it as an error.
        is_error: bool,
    },
    /// Intent of a side effect journaled. Correlation: `tool_call_id`, `operation_key`.
    #[serde(rename = "effect.prepared")]
    EffectPrepared {
        /// The hash of the request (tool and exact arguments, canonical JSON): keyed with the
        /// deployment's hash key (`hmac-sha256:<hex>`, see `keel_tools::keyed_hash`), so it
        /// reveals nothing of arguments whose journaled form is redacted. Older journals hold
        /// [`crate::canonical::content_hash`] (`sha256:<hex>`).
        request_hash: String,
        /// What the tool recorded before dispatch so that its `reconcile` can tell afterwards
        /// whether the effect happened (e.g. `write_file`: the file's keyed hash before and the
        /// keyed hash it will have after; older journals hold plain `sha256:` hashes). Absent
        /// for tools that record nothing; older events have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probe: Option<Value>,
    },
    /// The side effect may start. Correlation: `operation_key`, `attempt`.
    #[serde(rename = "effect.dispatched")]
    EffectDispatched {},
    /// The run ended while dispatched. Correlation: `operation_key`.
    #[serde(rename = "effect.outcome_unknown")]
    EffectOutcomeUnknown {},
    /// It happened. Correlation: `operation_key`.
    #[serde(rename = "effect.committed")]
    EffectCommitted {
        /// What the tool (or a human) reported.
        outcome: Value,
    },
    /// It did not happen. Correlation: `operation_key`.
    #[serde(rename = "effect.failed")]
    EffectFailed {
        /// Why.
        error: String,
    },
    /// Someone decided what an `outcome_unknown` effect did: a human (`keel resolve`, the API),
    /// or — only `retry`, with `reconciled: true` — the tool's reconcile, which proved the
    /// effect did not happen (a file write whose file still has the content it had before).
    /// The worker applies it: `committed` and `failed` finish the call with that result,
    /// `retry` dispatches it again as a new attempt. Correlation: `operation_key`.
    #[serde(rename = "effect.decided")]
    EffectDecided {
        /// The decision.
        decision: EffectDecision,
        /// The tool's reconcile decided (no human); absent (false) in older journals.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reconciled: bool,
    },
    /// A human decision was requested. Correlation: `tool_call_id`, `approval_id`.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        /// [`crate::approval::args_hash`] of the call's arguments.
        args_hash: String,
        /// When it expires.
        expires_at: DateTime<Utc>,
    },
    /// A human decided (or a `permission_request` hook, named in `hook`). Correlation:
    /// `approval_id`, and `principal_id` for a human's decision through an authenticated host.
    #[serde(rename = "approval.decided")]
    ApprovalDecided {
        /// The decision.
        decision: ApprovalDecision,
        /// The `permission_request` hook that decided, when no human did (its `hook.ran` comes
        /// first). Absent for a human's decision and in journals written before hooks existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hook: Option<String>,
    },
    /// Nobody decided in time. Correlation: `approval_id`.
    #[serde(rename = "approval.expired")]
    ApprovalExpired {},
    /// Older transcript was summarized; the model sees `summary` then the items from
    /// `first_kept_item`. The journal keeps the full history. Correlation: `turn_id` (the
    /// turn that compacted), or none for a compaction asked for between turns (`/compact`,
    /// accepted only with no active turn).
    #[serde(rename = "context.compacted")]
    ContextCompacted {
        /// The summary text.
        summary: String,
        /// Index of the first transcript item after the boundary.
        first_kept_item: u64,
        /// Estimated tokens before and after, for people.
        tokens_before: u64,
        /// Estimated tokens after.
        tokens_after: u64,
        /// Asked for between turns (`/compact`, see `keel_runtime::input`): the event has no
        /// `turn_id`. Such an event is written in envelope schema 3 (older builds cannot fold a
        /// compaction without a turn, and leave the session to newer ones). Absent (false)
        /// for a compaction of a turn.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        requested: bool,
        /// What `/compact FOCUS` asked the summary to keep.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        focus: Option<String>,
    },
    /// A hook ran (see `keel_runtime::hooks`): what it answered, journaled before it takes
    /// effect, so a decided hook is never run again for the same call, approval, prompt or stop
    /// after a crash. Correlation: `turn_id`; also `step_id` and `tool_call_id` for
    /// `pre_tool_use` and `post_tool_use`, `approval_id` for `permission_request`.
    #[serde(rename = "hook.ran")]
    HookRan {
        /// The hook's name (configured, or `<event>#<n>`: its position in the event's list).
        hook: String,
        /// The hook event it ran for.
        event: HookEvent,
        /// How long it ran, ms.
        duration_ms: u64,
        /// What it decided (after `fail_closed` applied to a failure).
        decision: HookDecision,
        /// Its reason (a deny's text the model or the user sees), redacted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// `rewrite`: the tool call's new input, redacted. The call runs it (validated again
        /// against the tool's schema; an approval's hash is of it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Value>,
        /// Redaction changed `arguments`: the exact ones are sealed outside the journal like a
        /// proposal's (the sealed `arguments` row of the call) until the call ends.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sealed: bool,
        /// Context the hook added for the model (`session_start`, `user_prompt_submit`,
        /// `post_tool_use`), redacted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<String>,
        /// Why the hook failed (a timeout, an exit status, an answer that is not the expected
        /// JSON, an HTTP error), redacted; its `decision` is then `deny` when it fails closed,
        /// else `none`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The `spawn_agent` call of the correlation (`turn_id`, `step_id`, `tool_call_id`) started
    /// a child session — or, after a crash, found the one it had started and re-attached it.
    /// Journaled once per call, before the child's first turn runs.
    #[serde(rename = "agent.spawned")]
    AgentSpawned {
        /// The agent definition's name (a key of the parent release's `agents`).
        agent: String,
        /// The child session: derived from the parent session, step and call
        /// ([`SessionId::for_child`]), so a re-run of the call finds it.
        child_session_id: SessionId,
        /// The release the child runs.
        release_id: ReleaseId,
    },
    /// The child of the correlation's `spawn_agent` call stopped: its turn ended (`reason` is
    /// its terminal reason) and what it used is added to the parent's turn and session usage
    /// (per model, as failed attempts are: no step is counted), so the parent's budgets see a
    /// child's spend. At most one per child.
    #[serde(rename = "agent.finished")]
    AgentFinished {
        /// The child session.
        child_session_id: SessionId,
        /// The child turn's terminal reason (`completed`, `aborted`, `failed`,
        /// `budget_exhausted`, …).
        reason: String,
        /// What the child's turn used in all (children of the child included).
        #[serde(default)]
        usage: Usage,
        /// Its cost, USD.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        cost_usd: f64,
        /// The same by serving model.
        #[serde(default, skip_serializing_if = "UsageByModel::is_empty")]
        usage_by_model: UsageByModel,
        /// Tool calls the child's turn ran (reached `running`), its own children's included;
        /// counted against the parent turn's `max_tool_calls`. Absent (0) in journals written
        /// before it existed.
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        tool_calls: u32,
    },
}

fn one() -> u64 {
    1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_f64(n: &f64) -> bool {
    *n == 0.0
}

/// A human's decision on an effect whose outcome is unknown after a crash or timeout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum EffectDecision {
    /// It happened; `outcome` (the recorded or supplied one) is the call's result.
    Committed {
        /// The outcome the model sees.
        #[serde(default)]
        outcome: Value,
    },
    /// It did not happen; the model sees a failure saying `error`.
    Failed {
        /// Why.
        error: String,
    },
    /// Dispatch it again as a new attempt.
    Retry,
}

/// Every event type name, in declaration order.
pub const EVENT_TYPES: &[&str] = &[
    "session.created",
    "session.status_changed",
    "session.config_changed",
    "session.release_pinned",
    "turn.queued",
    "turn.cancel_requested",
    "turn.started",
    "turn.phase_changed",
    "turn.finished",
    "step.started",
    "step.streaming",
    "step.attempt_failed",
    "step.completed",
    "step.failed",
    "tool_call.proposed",
    "tool_call.validating",
    "tool_call.awaiting_approval",
    "tool_call.started",
    "tool_call.finished",
    "effect.prepared",
    "effect.dispatched",
    "effect.outcome_unknown",
    "effect.committed",
    "effect.failed",
    "effect.decided",
    "approval.requested",
    "approval.decided",
    "approval.expired",
    "context.compacted",
    "hook.ran",
    "agent.spawned",
    "agent.finished",
];

impl EventBody {
    /// The oldest envelope version that carries this body (see [`SCHEMA_VERSION`]): 4 for
    /// `agent.spawned` and `agent.finished`, 3 for `hook.ran`, an `approval.decided` naming a
    /// hook and a `context.compacted` requested between turns, 2 for everything else.
    pub fn schema_version(&self) -> u32 {
        match self {
            EventBody::AgentSpawned { .. } | EventBody::AgentFinished { .. } => 4,
            EventBody::HookRan { .. }
            | EventBody::ApprovalDecided { hook: Some(_), .. }
            | EventBody::ContextCompacted {
                requested: true, ..
            } => 3,
            _ => 2,
        }
    }

    /// The event type name (`turn.started`, …).
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::SessionCreated { .. } => "session.created",
            EventBody::SessionStatusChanged { .. } => "session.status_changed",
            EventBody::SessionConfigChanged { .. } => "session.config_changed",
            EventBody::SessionReleasePinned { .. } => "session.release_pinned",
            EventBody::TurnQueued { .. } => "turn.queued",
            EventBody::TurnCancelRequested { .. } => "turn.cancel_requested",
            EventBody::TurnStarted {} => "turn.started",
            EventBody::TurnPhaseChanged { .. } => "turn.phase_changed",
            EventBody::TurnFinished { .. } => "turn.finished",
            EventBody::StepStarted { .. } => "step.started",
            EventBody::StepStreaming {} => "step.streaming",
            EventBody::StepAttemptFailed { .. } => "step.attempt_failed",
            EventBody::StepCompleted { .. } => "step.completed",
            EventBody::StepFailed { .. } => "step.failed",
            EventBody::ToolCallProposed { .. } => "tool_call.proposed",
            EventBody::ToolCallValidating {} => "tool_call.validating",
            EventBody::ToolCallAwaitingApproval {} => "tool_call.awaiting_approval",
            EventBody::ToolCallStarted {} => "tool_call.started",
            EventBody::ToolCallFinished { .. } => "tool_call.finished",
            EventBody::EffectPrepared { .. } => "effect.prepared",
            EventBody::EffectDispatched {} => "effect.dispatched",
            EventBody::EffectOutcomeUnknown {} => "effect.outcome_unknown",
            EventBody::EffectCommitted { .. } => "effect.committed",
            EventBody::EffectFailed { .. } => "effect.failed",
            EventBody::EffectDecided { .. } => "effect.decided",
            EventBody::ApprovalRequested { .. } => "approval.requested",
            EventBody::ApprovalDecided { .. } => "approval.decided",
            EventBody::ApprovalExpired {} => "approval.expired",
            EventBody::ContextCompacted { .. } => "context.compacted",
            EventBody::HookRan { .. } => "hook.ran",
            EventBody::AgentSpawned { .. } => "agent.spawned",
            EventBody::AgentFinished { .. } => "agent.finished",
        }
    }

    /// The session status this event sets, if it is a `session.status_changed`.
    pub fn session_status(&self) -> Option<SessionStatus> {
        match self {
            EventBody::SessionCreated { .. } => Some(SessionStatus::Created),
            EventBody::SessionStatusChanged { status, .. } => Some(*status),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
