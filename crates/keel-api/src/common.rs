//! Enums a client sends, budgets, token usage, and the problem+json error body.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

// --- enums a client sends -------------------------------------------------------------------

/// A session's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatusParam {
    /// Created, nothing ran yet.
    Created,
    /// A worker runs it.
    Running,
    /// Nothing to do.
    Idle,
    /// Waiting on a human.
    RequiresAction,
    /// Closed for good.
    Closed,
}

/// An approval's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatusParam {
    /// Waiting for a decision.
    Pending,
    /// Allowed.
    Allowed,
    /// Denied.
    Denied,
    /// Nobody decided in time.
    Expired,
}

/// An effect's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EffectStatusParam {
    /// Intent journaled.
    Prepared,
    /// May have started.
    Dispatched,
    /// Unknown after a crash or a stop: a human decides.
    OutcomeUnknown,
    /// It happened.
    Committed,
    /// It did not happen.
    Failed,
}

/// What runs without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionModeParam {
    /// Read-only tools; everything else asks.
    Default,
    /// As default, plus file edits inside the workspace.
    AcceptEdits,
    /// Nothing that writes runs.
    ReadOnly,
    /// Everything runs unless a rule says otherwise.
    Bypass,
}

/// How `shell` is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxParam {
    /// No confinement.
    Off,
    /// Writes only a private temp dir; no network.
    ReadOnly,
    /// Writes the workspace and a private temp dir; no network.
    WorkspaceWrite,
}

/// What a new input does while a turn is in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MultitaskParam {
    /// Queue it.
    Enqueue,
    /// Refuse it (409) while a turn is active or queued.
    Reject,
    /// Queue it and cancel the active turn.
    Interrupt,
}

/// A key's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoleParam {
    /// The tenant's keys and releases, and everything an operator may do.
    Admin,
    /// Sessions, turns, approvals, effects, cancellation, memory; and reading.
    Operator,
    /// Reading only.
    Viewer,
}

// --- shared shapes --------------------------------------------------------------------------

/// Limits on steps, tokens, cost, tool calls and wall time; absent fields are unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetBody {
    /// Most model samplings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    pub max_steps: Option<u32>,
    /// Most input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub max_tokens: Option<u64>,
    /// Most cost, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub max_cost_usd: Option<f64>,
    /// Most tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    pub max_tool_calls: Option<u32>,
    /// Most wall-clock time, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub max_wall_time_ms: Option<u64>,
}

/// Tokens of model responses. Units: tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageBody {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Completion tokens, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Output tokens spent on reasoning.
    pub reasoning_tokens: u64,
}

/// One model's share of a turn's or session's usage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelTotalsBody {
    /// Tokens of its responses.
    pub usage: UsageBody,
    /// Their cost, USD, at this model's price.
    pub cost_usd: f64,
    /// Steps it answered.
    pub steps: u32,
}

// --- errors ---------------------------------------------------------------------------------

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem details object. `type` is a URN naming the kind of problem
/// (`urn:keel:problem:not-found`); `field`, `id` and `limit` name what is at fault when there is
/// one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URN naming the kind of problem (`urn:keel:problem:<kind>`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong and what to do about it.
    pub detail: String,
    /// The request field at fault (a JSON pointer-like path such as `settings.sandbox`, a
    /// query parameter or a header name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The id at fault (a session, approval, key …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The server limit that refused the request (`workspace_roots`, `max_permission_mode`,
    /// `allow_sandbox_off`, `body_limit_bytes`, `max_streams_per_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}
