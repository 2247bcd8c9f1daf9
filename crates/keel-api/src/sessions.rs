//! Sessions, their settings, turns, journal events and folded state (`/v1/sessions/...`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

use crate::{
    BudgetBody, ModelTotalsBody, MultitaskParam, PermissionModeParam, SandboxParam,
    SessionStatusParam, UsageBody,
};

// --- sessions -------------------------------------------------------------------------------

/// Session settings a client may set: they only tighten what the release allows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsBody {
    /// What runs without asking (at most the server's `max_permission_mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<PermissionModeParam>,
    /// How `shell` is confined (`off` only if the server allows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxParam>,
    /// `ask` rules added to the release's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Vec<String>>,
    /// `deny` rules added to the release's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
    /// Per-turn limits (fields left out fall back to the release's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_budget: Option<BudgetBody>,
    /// Per-session limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_budget: Option<BudgetBody>,
    /// The tenant's daily limits (`max_tokens`, `max_cost_usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_daily_budget: Option<BudgetBody>,
    /// What a second input does while a turn is in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multitask: Option<MultitaskParam>,
    /// Limit of every tool call, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    pub tool_timeout_ms: Option<u64>,
    /// How long an approval waits, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    pub approval_ttl_ms: Option<u64>,
    /// The model's context window, tokens (default: the model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    pub context_window_tokens: Option<u64>,
    /// Journal the model's reasoning (redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_reasoning: Option<bool>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// The release to pin.
    pub release_id: String,
    /// Absolute path of the workspace on the server, under one of its `workspace_roots`.
    pub workspace: String,
    /// Settings; absent fields take the defaults (`default` mode, `workspace_write` sandbox).
    #[serde(default)]
    pub settings: SettingsBody,
}

/// `PATCH /v1/sessions/{session_id}`: settings to change (absent fields stay) and/or the release
/// to re-pin the session to. Both in one request are one commit (both or neither):
/// `session.release_pinned` then `session.config_changed`, so the version moves by the number of
/// events written (one or two).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSessionRequest {
    /// The settings to change (absent: none).
    #[serde(default)]
    pub settings: SettingsBody,
    /// A release of the tenant to re-pin the session to (`POST /v1/releases` gives its id): its
    /// model route, tools and policy rules run from the next turn on. Between turns only;
    /// journaled as `session.release_pinned {from_release_id, to_release_id}` with the caller's
    /// principal. The session's current release, or absent: no re-pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_id: Option<String>,
}

/// A session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionBody {
    /// Its id.
    #[schema(format = Uuid)]
    pub session_id: String,
    /// The release it runs now.
    pub release_id: String,
    /// `created`, `running`, `idle`, `requires_action` or `closed`.
    #[schema(example = "idle")]
    pub status: String,
    /// The journal's version (the last event's seq): also the `ETag`.
    pub version: u64,
    /// The workspace.
    pub workspace: Option<String>,
    /// The effective settings (`null` in lists).
    pub settings: Option<SettingsBody>,
    /// The turn in progress (`null` in lists).
    pub active_turn_id: Option<String>,
    /// Turns waiting to start, oldest first (empty in lists).
    pub queued_turn_ids: Vec<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change of its row.
    pub updated_at: DateTime<Utc>,
}

/// A page of sessions.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionPage {
    /// Sessions, oldest first.
    pub items: Vec<SessionBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/sessions`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionListQuery {
    /// Only sessions in this status.
    #[param(inline)]
    pub status: Option<SessionStatusParam>,
    /// Only sessions running this release.
    pub release_id: Option<String>,
    /// From a previous page's `next_cursor`.
    /// A session id.
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Query of paged lists.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// From a previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Query of `GET /v1/tenants`: the cursor is a tenant id.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TenantPageQuery {
    /// From a previous page's `next_cursor`: a tenant id.
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Query of `GET /v1/sessions/{session_id}/turns`: the cursor is a position in the queue.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TurnPageQuery {
    /// From a previous page's `next_cursor`: how many turns come before the page.
    #[param(pattern = r"^[0-9]{1,15}$")]
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

// --- turns ----------------------------------------------------------------------------------

/// `POST /v1/sessions/{session_id}/turns`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitTurnRequest {
    /// The user's message (not blank).
    #[schema(min_length = 1)]
    pub input: String,
    /// What to do if a turn is in progress (default: the session's setting, `enqueue`).
    #[serde(default)]
    pub multitask: Option<MultitaskParam>,
    /// Scheduling priority within the tenant: a worker claims higher first (then the oldest);
    /// -100..=100, default 0.
    #[serde(default)]
    #[schema(minimum = -100, maximum = 100)]
    pub priority: Option<i32>,
}

/// A slash command the input pipeline carried out instead of queuing a turn (`200` from
/// `POST /v1/sessions/{session_id}/turns`): no model saw it as a user message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CommandBody {
    /// The command, without its slash: `help`, `cost`, `status`, `permissions`, `compact`,
    /// `model` or `clear`.
    #[schema(example = "cost")]
    pub command: String,
    /// What it answered or did, for people.
    pub output: String,
    /// The session the input was sent to.
    #[schema(format = Uuid)]
    pub session_id: String,
    /// `/clear`: the new session (same release and settings) to send input to from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Uuid)]
    pub new_session_id: Option<String>,
}

/// What `POST /v1/sessions/{session_id}/turns` made of an input: a queued turn (`202`) or a
/// command carried out (`200`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InputOutcome {
    /// A slash command, carried out.
    Command(CommandBody),
    /// A turn, queued.
    Turn(Box<TurnBody>),
}

/// A turn.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TurnBody {
    /// Its id.
    #[schema(format = Uuid)]
    pub turn_id: String,
    /// Its session.
    #[schema(format = Uuid)]
    pub session_id: String,
    /// `queued`, `preparing`, `sampling`, `executing_tools`, `compacting`, `completed`,
    /// `aborted` or `failed`.
    #[schema(example = "completed")]
    pub status: String,
    /// Why it ended: `completed`, `aborted`, `failed`, `budget_exhausted`, `loop_detected`,
    /// `prompt_too_long`; `requires_action` while it waits on a human; `null` while it runs.
    pub terminal_reason: Option<String>,
    /// The exhausted limit, for `budget_exhausted`.
    pub limit: Option<String>,
    /// The user's input.
    pub input: String,
    /// Tokens used.
    pub usage: UsageBody,
    /// Cost, USD.
    pub cost_usd: f64,
    /// Usage and cost by the model that served each step.
    pub usage_by_model: BTreeMap<String, ModelTotalsBody>,
    /// Model samplings.
    pub num_steps: u32,
    /// When it was queued.
    pub queued_at: DateTime<Utc>,
    /// When it started.
    pub started_at: Option<DateTime<Utc>>,
    /// Wall-clock duration once finished, ms.
    pub duration_ms: Option<u64>,
    /// The model's final text once finished.
    pub final_text: Option<String>,
    /// What went wrong, for `failed`.
    pub error: Option<String>,
    /// Why cancellation was requested, if it was.
    pub cancel_requested: Option<String>,
}

/// A page of turns.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TurnPage {
    /// Turns in the order they were queued.
    pub items: Vec<TurnBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// What a cancellation named.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelledBody {
    /// The session.
    #[schema(format = Uuid)]
    pub session_id: String,
    /// The turn cancelled (for a turn cancellation).
    pub turn_id: Option<String>,
    /// The tool call cancelled (for a call cancellation).
    pub tool_call_id: Option<String>,
}

/// `POST /v1/sessions/{session_id}/cancel` and the tool call's cancel: an optional body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {}

/// `POST /v1/sessions/{session_id}/close`: an optional body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseRequest {}

// --- events and state -----------------------------------------------------------------------

/// Query of `GET /v1/sessions/{session_id}/events`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events with `seq` greater than this (default 0: from the start). For SSE,
    /// `Last-Event-ID` wins when it is larger.
    #[param(minimum = 0)]
    pub after: Option<u64>,
    /// Page size of the JSON form, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// A page of journal events.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    /// Events (the journal's envelope: `schema_version`, `session_id`, `seq`, `ts`, `type`,
    /// correlation ids such as `turn_id` and `principal_id`, `payload`), in `seq` order.
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
    /// The seq to pass as `after` for the next page (the last one returned, or the `after`
    /// given when none was).
    pub next_after: u64,
    /// Whether more events existed when the page was read.
    pub has_more: bool,
}

/// One Server-Sent Event of a `text/event-stream` response (WHATWG HTML, "Server-sent
/// events": the fields of one event; comments such as heartbeats are not events). The
/// document describes each event of the stream with this schema.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SseEvent {
    /// The event type: a journal event's `type` (`turn.finished`), `delta`, `gap`, or
    /// `session.status` on the tenant stream.
    pub event: Option<String>,
    /// The JSON text of the event (the journal envelope, a delta, a session's status).
    pub data: String,
    /// The journal `seq` of a durable event (absent for ephemeral ones).
    pub id: Option<String>,
    /// A reconnection delay the server asks for, ms.
    pub retry: Option<u64>,
}

/// Query of `GET /v1/sessions/{session_id}/state`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// Fold the journal up to this seq (default: all of it); at most 2^63 - 1 (400 beyond).
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub at: Option<u64>,
}

/// A tool call as folded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolCallStateBody {
    /// Its id.
    pub tool_call_id: String,
    /// Its turn.
    pub turn_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as proposed, redacted.
    pub arguments: Value,
    /// Status.
    pub status: String,
    /// The approval it waits or waited on.
    pub approval_id: Option<String>,
    /// Its effect, if side-effecting.
    pub operation_key: Option<String>,
}

/// The session folded from its journal up to `version`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StateBody {
    /// The session.
    pub session_id: String,
    /// The seq folded up to.
    pub version: u64,
    /// Status at that point.
    pub status: String,
    /// The release it ran.
    pub release_id: Option<String>,
    /// The effective settings (the runtime's whole config, redacted); `null` before the
    /// session's first event (`?at=0`).
    #[schema(value_type = Option<Object>)]
    pub config: Value,
    /// Every turn so far.
    pub turns: Vec<TurnBody>,
    /// The turn in progress.
    pub active_turn_id: Option<String>,
    /// Queued turns.
    pub queued_turn_ids: Vec<String>,
    /// Tool calls.
    pub tool_calls: Vec<ToolCallStateBody>,
    /// Effects: operation key → status.
    pub effects: BTreeMap<String, String>,
    /// Approvals: id → status.
    pub approvals: BTreeMap<String, String>,
    /// Session totals: tokens.
    pub usage: UsageBody,
    /// Session totals: USD.
    pub cost_usd: f64,
    /// Session totals by model.
    pub usage_by_model: BTreeMap<String, ModelTotalsBody>,
}
