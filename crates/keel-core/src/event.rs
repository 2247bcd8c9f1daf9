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

/// The points in a session where hooks run (`[[hooks.<event>]]` in `keel.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before the session's first turn samples.
    SessionStart,
    /// Before a turn's input reaches the model: may block it or add context.
    UserPromptSubmit,
    /// Before a tool call is authorized: may allow, deny, ask or rewrite its input.
    PreToolUse,
    /// When a call waits on an approval: may decide it.
    PermissionRequest,
    /// After a tool call has its result: may add context to it.
    PostToolUse,
    /// Before older context is summarized.
    PreCompact,
    /// When the turn would complete: may ask it to continue.
    Stop,
}

impl HookEvent {
    /// Every hook event, in the order above.
    pub const ALL: [HookEvent; 7] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PermissionRequest,
        HookEvent::PostToolUse,
        HookEvent::PreCompact,
        HookEvent::Stop,
    ];

    /// The snake_case name (`pre_tool_use`).
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "session_start",
            HookEvent::UserPromptSubmit => "user_prompt_submit",
            HookEvent::PreToolUse => "pre_tool_use",
            HookEvent::PermissionRequest => "permission_request",
            HookEvent::PostToolUse => "post_tool_use",
            HookEvent::PreCompact => "pre_compact",
            HookEvent::Stop => "stop",
        }
    }

    /// Whether its hooks match tool names (`pre_tool_use`, `permission_request`,
    /// `post_tool_use`).
    pub fn is_tool_event(self) -> bool {
        matches!(
            self,
            HookEvent::PreToolUse | HookEvent::PermissionRequest | HookEvent::PostToolUse
        )
    }
}

/// What a hook decided, as journaled in `hook.ran`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookDecision {
    /// No decision: the runtime goes on as without the hook (a hook that only observes, a
    /// `permission_request` hook leaving the approval to a human, a failure that fails open).
    None,
    /// `pre_tool_use`: no objection, and no need to ask (a policy `deny` still refuses);
    /// `permission_request`: the approval is allowed.
    Allow,
    /// `pre_tool_use`: run the call with `arguments` instead (as if allowed).
    Rewrite,
    /// `pre_tool_use`: ask a human even where the policy allows.
    Ask,
    /// `pre_tool_use`: the call is not run, the model sees `reason`; `permission_request`: the
    /// approval is denied; `user_prompt_submit`: the prompt is blocked (the turn ends
    /// `aborted`).
    Deny,
    /// `stop`: the turn goes on with another step, the model seeing `reason`.
    Continue,
}

impl HookDecision {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HookDecision::None => "none",
            HookDecision::Allow => "allow",
            HookDecision::Rewrite => "rewrite",
            HookDecision::Ask => "ask",
            HookDecision::Deny => "deny",
            HookDecision::Continue => "continue",
        }
    }
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

/// One journaled event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Envelope version ([`SCHEMA_VERSION`] when written by this build).
    pub schema_version: u32,
    /// The session whose journal holds it.
    pub session_id: SessionId,
    /// Position in the journal, from 1; the session's version after this event.
    pub seq: u64,
    /// When it was recorded (UTC).
    pub ts: DateTime<Utc>,
    /// Related entity ids.
    #[serde(flatten)]
    pub correlation: Correlation,
    /// Type and payload.
    #[serde(flatten)]
    pub body: EventBody,
}

/// Why a stored or received event could not be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("event {} of session {}: {kind}", seq.map(|s| s.to_string()).unwrap_or_else(|| "?".into()), session_id.map(|s| s.to_string()).unwrap_or_else(|| "?".into()))]
pub struct EventDecodeError {
    /// The session, when it could be read.
    pub session_id: Option<SessionId>,
    /// The sequence number, when it could be read.
    pub seq: Option<u64>,
    /// What is wrong.
    pub kind: DecodeErrorKind,
}

/// What is wrong with an event.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeErrorKind {
    /// Not JSON, or the JSON does not have the envelope's shape.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A `type` this build does not know.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// Written by a newer Keel.
    #[error("schema version {found} is newer than this build supports ({supported}); upgrade keel")]
    NewerSchema {
        /// The event's version.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
}

impl Event {
    /// Builds an event at `seq` for `session_id`, stamped `ts`, in the oldest schema version
    /// that can carry `body` ([`EventBody::schema_version`]).
    pub fn new(
        session_id: SessionId,
        seq: u64,
        ts: DateTime<Utc>,
        correlation: Correlation,
        body: EventBody,
    ) -> Self {
        Event {
            schema_version: body.schema_version(),
            session_id,
            seq,
            ts,
            correlation,
            body,
        }
    }

    /// The event type name.
    pub fn type_name(&self) -> &'static str {
        self.body.type_name()
    }

    /// Serializes to the JSON wire shape (see the module docs).
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: all map keys are strings and no Serialize impl errs.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses, upgrades and checks one event.
    ///
    /// # Errors
    /// [`EventDecodeError`] with the session and sequence number where readable: malformed JSON or
    /// envelope, an unknown `type`, or a `schema_version` above [`SCHEMA_VERSION`].
    pub fn decode(json: &str) -> Result<Event, EventDecodeError> {
        let value: Value = serde_json::from_str(json).map_err(|e| EventDecodeError {
            session_id: None,
            seq: None,
            kind: DecodeErrorKind::Malformed(e.to_string()),
        })?;
        Self::decode_value(value)
    }

    /// As [`Event::decode`], from an already parsed value.
    ///
    /// # Errors
    /// See [`Event::decode`].
    pub fn decode_value(mut value: Value) -> Result<Event, EventDecodeError> {
        let session_id = value
            .get("session_id")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<SessionId>().ok());
        let seq = value.get("seq").and_then(Value::as_u64);
        let err = |kind| EventDecodeError {
            session_id,
            seq,
            kind,
        };
        let version = match value.get("schema_version").and_then(Value::as_u64) {
            Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
            None => {
                return Err(err(DecodeErrorKind::Malformed(
                    "missing schema_version".into(),
                )));
            }
        };
        if version == 0 {
            return Err(err(DecodeErrorKind::Malformed(
                "schema_version 0 does not exist".into(),
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(err(DecodeErrorKind::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            }));
        }
        upgrade(&mut value, version).map_err(|m| err(DecodeErrorKind::Malformed(m)))?;
        match value.get("type").and_then(Value::as_str) {
            None => return Err(err(DecodeErrorKind::Malformed("missing type".into()))),
            Some(t) if !EVENT_TYPES.contains(&t) => {
                return Err(err(DecodeErrorKind::UnknownType(t.to_owned())));
            }
            Some(_) => {}
        }
        serde_json::from_value(value).map_err(|e| err(DecodeErrorKind::Malformed(e.to_string())))
    }
}

/// Upgrades an event object written at `from` to [`SCHEMA_VERSION`], in place.
///
/// # Errors
/// A message when a field the upgrade needs is missing or has the wrong type.
pub fn upgrade(value: &mut Value, from: u32) -> Result<(), String> {
    let Some(obj) = value.as_object_mut() else {
        return Err("event is not a JSON object".into());
    };
    let mut version = from;
    if version < 2 {
        // v1 → v2: `ts_ms` (Unix ms) became `ts` (RFC 3339).
        let ms = obj
            .remove("ts_ms")
            .and_then(|v| v.as_i64())
            .ok_or("schema 1 event without integer ts_ms")?;
        let ts = DateTime::<Utc>::from_timestamp_millis(ms).ok_or("ts_ms out of range")?;
        obj.insert("ts".into(), Value::String(ts.to_rfc3339()));
        version = 2;
    }
    obj.insert("schema_version".into(), Value::from(version));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample_bodies() -> Vec<EventBody> {
        vec![
            EventBody::SessionCreated {
                tenant_id: TenantId::new(),
                release_id: ReleaseId::from("sha256:00"),
                config: json!({"workspace": "/w"}),
            },
            EventBody::SessionStatusChanged {
                status: SessionStatus::Running,
                reason: None,
            },
            EventBody::SessionConfigChanged {
                changes: json!({"permission_mode": "bypass", "turn_budget": {"max_steps": 1}}),
            },
            EventBody::SessionReleasePinned {
                from_release_id: ReleaseId::from("sha256:00"),
                to_release_id: ReleaseId::from("sha256:01"),
            },
            EventBody::TurnQueued {
                input: "fix the bug\n\n<attached>".into(),
                compiled: Some(CompiledInput {
                    raw: "/fix @src/a.rs".into(),
                    command: Some("fix".into()),
                    command_file: Some(".keel/commands/fix.md".into()),
                    attachments: vec![Attachment {
                        path: "src/a.rs".into(),
                        chars: 12,
                        truncated: false,
                    }],
                }),
            },
            EventBody::TurnCancelRequested {
                reason: "cancelled by user".into(),
            },
            EventBody::TurnStarted {},
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
            EventBody::TurnFinished {
                terminal_reason: TerminalReason::BudgetExhausted,
                limit: Some(BudgetLimit::Steps),
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                cost_usd: 0.25,
                usage_by_model: [(
                    "openai:gpt-5".to_owned(),
                    crate::ModelTotals {
                        usage: Usage {
                            input_tokens: 10,
                            output_tokens: 5,
                            ..Usage::default()
                        },
                        cost_usd: 0.25,
                        steps: 3,
                        estimated: false,
                    },
                )]
                .into(),
                num_steps: 3,
                duration_ms: 1200,
                error: None,
            },
            EventBody::StepStarted {
                model: "openai:gpt-5".into(),
            },
            EventBody::StepStreaming {},
            EventBody::StepAttemptFailed {
                model: "openai:gpt-5".into(),
                error_kind: "rate_limited".into(),
                message: "slow down".into(),
                retry_in_ms: Some(100),
                responses_consumed: 1,
                usage: Usage {
                    input_tokens: 7,
                    ..Usage::default()
                },
                cost_usd: 0.01,
                usage_estimated: false,
            },
            EventBody::StepCompleted {
                model: "openai:gpt-5".into(),
                stop_reason: "tool_use".into(),
                usage: Usage::default(),
                cost_usd: 0.0,
                text: "calling a tool".into(),
                reasoning: vec![json!({"provider": "openai", "id": "rs_1"})],
                reasoning_sealed: 0,
                responses_consumed: 1,
                usage_estimated: false,
                abandoned_calls: Vec::new(),
            },
            EventBody::StepFailed {
                error_kind: "authentication".into(),
                message: "bad key".into(),
                responses_consumed: 1,
                usage: Usage::default(),
                cost_usd: 0.0,
                usage_estimated: false,
            },
            EventBody::ToolCallProposed {
                name: "shell".into(),
                arguments: json!({"command": "ls"}),
                sealed: false,
            },
            EventBody::ToolCallValidating {},
            EventBody::ToolCallAwaitingApproval {},
            EventBody::ToolCallStarted {},
            EventBody::ToolCallFinished {
                status: ToolCallStatus::Succeeded,
                output: "a\nb".into(),
                is_error: false,
            },
            EventBody::EffectPrepared {
                request_hash: "sha256:ab".into(),
                probe: Some(json!({"before": null, "after": "sha256:cd"})),
            },
            EventBody::EffectDispatched {},
            EventBody::EffectOutcomeUnknown {},
            EventBody::EffectCommitted {
                outcome: json!({"exit_code": 0}),
            },
            EventBody::EffectFailed {
                error: "not found".into(),
            },
            EventBody::EffectDecided {
                decision: EffectDecision::Retry,
                reconciled: false,
            },
            EventBody::ApprovalRequested {
                args_hash: "sha256:cd".into(),
                expires_at: Utc::now(),
            },
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::Deny {
                    reason: "no".into(),
                },
                hook: None,
            },
            EventBody::ApprovalExpired {},
            EventBody::ContextCompacted {
                summary: "s".into(),
                first_kept_item: 4,
                tokens_before: 1000,
                tokens_after: 100,
                requested: false,
                focus: None,
            },
            EventBody::HookRan {
                hook: "audit".into(),
                event: HookEvent::PreToolUse,
                duration_ms: 12,
                decision: HookDecision::Rewrite,
                reason: Some("use the dry run".into()),
                arguments: Some(json!({"command": "make -n"})),
                sealed: false,
                context: None,
                error: None,
            },
            EventBody::AgentSpawned {
                agent: "reviewer".into(),
                child_session_id: SessionId::new(),
                release_id: ReleaseId::from("sha256:01"),
            },
            EventBody::AgentFinished {
                child_session_id: SessionId::new(),
                reason: "completed".into(),
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                cost_usd: 0.01,
                usage_by_model: UsageByModel::new(),
                tool_calls: 3,
            },
        ]
    }

    /// A compaction asked for between turns (no turn) is written at 3: a schema-2 build could
    /// not fold it.
    #[test]
    fn a_requested_compaction_is_written_at_schema_3() {
        let body = EventBody::ContextCompacted {
            summary: "s".into(),
            first_kept_item: 4,
            tokens_before: 1000,
            tokens_after: 100,
            requested: true,
            focus: Some("the API".into()),
        };
        let ev = Event::new(
            SessionId::new(),
            1,
            Utc::now(),
            Correlation::default(),
            body,
        );
        assert_eq!(ev.schema_version, 3);
        let back = Event::decode(&ev.encode()).unwrap();
        assert_eq!(back.body, ev.body);
    }

    /// A journal written before hooks existed reads as before: `approval.decided` without
    /// `hook`.
    /// Hook events are the only ones a schema-2 build cannot read: they alone are written at
    /// 3 (and sub-agent events, which a schema-3 build cannot read, at 4), so a session
    /// without them stays readable (and claimable) by older workers.
    #[test]
    fn only_hook_and_agent_events_are_written_above_schema_2() {
        for body in sample_bodies() {
            let ev = Event::new(
                SessionId::new(),
                1,
                Utc::now(),
                Correlation::default(),
                body,
            );
            let hook = matches!(
                ev.body,
                EventBody::HookRan { .. } | EventBody::ApprovalDecided { hook: Some(_), .. }
            );
            let agent = matches!(
                ev.body,
                EventBody::AgentSpawned { .. } | EventBody::AgentFinished { .. }
            );
            let expected = if agent {
                4
            } else if hook {
                3
            } else {
                2
            };
            assert_eq!(ev.schema_version, expected, "{:?}", ev.body);
            let v: Value = serde_json::from_str(&ev.encode()).unwrap();
            assert_eq!(v["schema_version"], ev.schema_version);
        }
        let human = EventBody::ApprovalDecided {
            decision: ApprovalDecision::AllowOnce,
            hook: None,
        };
        assert_eq!(human.schema_version(), 2);
    }

    #[test]
    fn an_approval_decided_without_a_hook_reads_as_before() {
        let body: EventBody = serde_json::from_value(
            json!({"type": "approval.decided", "payload": {"decision": {"decision": "allow_once"}}}),
        )
        .unwrap();
        assert_eq!(
            body,
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::AllowOnce,
                hook: None
            }
        );
    }

    #[test]
    fn an_effect_prepared_without_a_probe_reads_as_before() {
        // As written before `probe` existed.
        let body: EventBody = serde_json::from_value(
            json!({"type": "effect.prepared", "payload": {"request_hash": "sha256:ab"}}),
        )
        .unwrap();
        assert_eq!(
            body,
            EventBody::EffectPrepared {
                request_hash: "sha256:ab".into(),
                probe: None
            }
        );
    }

    #[test]
    fn every_event_type_round_trips_through_json() {
        let bodies = sample_bodies();
        assert_eq!(bodies.len(), EVENT_TYPES.len(), "one sample per event type");
        let session = SessionId::new();
        for (i, body) in bodies.into_iter().enumerate() {
            assert_eq!(body.type_name(), EVENT_TYPES[i]);
            let corr = Correlation::tool_call(TurnId::new(), StepId::new(), "call_1".into())
                .with_attempt(2)
                .with_operation(OperationKey::from("k"))
                .with_approval(ApprovalId::new());
            let ev = Event::new(session, i as u64 + 1, Utc::now(), corr, body);
            let text = ev.encode();
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["type"], EVENT_TYPES[i]);
            assert_eq!(v["schema_version"], ev.body.schema_version());
            assert_eq!(v["tool_call_id"], "call_1");
            assert_eq!(Event::decode(&text).unwrap(), ev);
        }
    }

    #[test]
    fn absent_correlation_ids_are_omitted() {
        let ev = Event::new(
            SessionId::new(),
            1,
            Utc::now(),
            Correlation::turn(TurnId::new()),
            EventBody::TurnStarted {},
        );
        let v: Value = serde_json::from_str(&ev.encode()).unwrap();
        assert!(v.get("step_id").is_none());
        assert!(v.get("turn_id").is_some());
    }

    #[test]
    fn a_newer_schema_is_refused_with_session_and_seq() {
        let s = SessionId::new();
        let text = json!({"schema_version": 99, "session_id": s.to_string(), "seq": 5, "type": "turn.started"})
            .to_string();
        let err = Event::decode(&text).unwrap_err();
        assert_eq!(err.session_id, Some(s));
        assert_eq!(err.seq, Some(5));
        assert_eq!(
            err.kind,
            DecodeErrorKind::NewerSchema {
                found: 99,
                supported: SCHEMA_VERSION
            }
        );
        assert!(err.to_string().contains("upgrade keel"), "{err}");
    }

    #[test]
    fn an_unknown_type_is_refused_with_session_and_seq() {
        let s = SessionId::new();
        let text = json!({"schema_version": 2, "session_id": s.to_string(), "seq": 3,
            "ts": "2026-01-01T00:00:00Z", "type": "turn.teleported"})
        .to_string();
        let err = Event::decode(&text).unwrap_err();
        assert_eq!(
            err.kind,
            DecodeErrorKind::UnknownType("turn.teleported".into())
        );
        assert_eq!((err.session_id, err.seq), (Some(s), Some(3)));
    }

    #[test]
    fn a_schema_1_event_is_upgraded() {
        let s = SessionId::new();
        let t = TurnId::new();
        let text = json!({"schema_version": 1, "session_id": s.to_string(), "seq": 2,
            "ts_ms": 1_764_468_928_123_i64, "type": "turn.queued", "turn_id": t.to_string(),
            "payload": {"input": "hi"}})
        .to_string();
        let ev = Event::decode(&text).unwrap();
        assert_eq!(ev.schema_version, 2);
        assert_eq!(ev.ts.timestamp_millis(), 1_764_468_928_123);
        assert_eq!(ev.correlation.turn_id, Some(t));
        assert_eq!(
            ev.body,
            EventBody::TurnQueued {
                input: "hi".into(),
                compiled: None
            }
        );
    }

    #[test]
    fn schema_version_zero_is_refused() {
        let text =
            json!({"schema_version": 0, "session_id": SessionId::new().to_string(), "seq": 1,
            "ts_ms": 0, "type": "turn.started"})
            .to_string();
        assert!(matches!(
            Event::decode(&text).unwrap_err().kind,
            DecodeErrorKind::Malformed(_)
        ));
    }

    #[test]
    fn malformed_events_are_typed_errors() {
        assert!(matches!(
            Event::decode("{").unwrap_err().kind,
            DecodeErrorKind::Malformed(_)
        ));
        let s = SessionId::new();
        let bad_payload = json!({"schema_version": 2, "session_id": s.to_string(), "seq": 1,
            "ts": "2026-01-01T00:00:00Z", "type": "turn.queued", "payload": {"input": 5}})
        .to_string();
        let err = Event::decode(&bad_payload).unwrap_err();
        assert!(matches!(err.kind, DecodeErrorKind::Malformed(_)));
        assert_eq!(err.seq, Some(1));
        let v1_without_ts = json!({"schema_version": 1, "session_id": s.to_string(), "seq": 1, "type": "turn.started"});
        assert!(matches!(
            Event::decode(&v1_without_ts.to_string()).unwrap_err().kind,
            DecodeErrorKind::Malformed(_)
        ));
    }
}
