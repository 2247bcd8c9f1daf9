//! Approvals and effects, and the decisions on them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::{ApprovalStatusParam, EffectStatusParam};

// --- approvals and effects ------------------------------------------------------------------

/// An approval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalBody {
    /// Its id.
    #[schema(format = Uuid)]
    pub approval_id: String,
    /// Its session.
    #[schema(format = Uuid)]
    pub session_id: String,
    /// Its turn.
    pub turn_id: String,
    /// The call it is bound to.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// The call's arguments as shown to people (secrets redacted).
    pub arguments: Value,
    /// The hash a decision must name.
    pub args_hash: String,
    /// `pending`, `allowed`, `denied` or `expired`.
    #[schema(example = "pending")]
    pub status: String,
    /// The decision, once decided.
    #[schema(value_type = Option<Object>)]
    pub decision: Option<Value>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When it expires.
    pub expires_at: DateTime<Utc>,
    /// When it was decided or expired.
    pub decided_at: Option<DateTime<Utc>>,
    /// Who decided (a principal id), when decided through the API.
    pub decided_by: Option<String>,
    /// The sub-agent whose call it is, when `session_id` is a child session a `spawn_agent`
    /// call of the listed session (or of one of its children) started; `null` for the
    /// session's own calls. Decide it like any approval: the child, then the parent, continue.
    #[serde(default)]
    pub agent: Option<String>,
}

/// A page of approvals.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalPage {
    /// Approvals, oldest first.
    pub items: Vec<ApprovalBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/approvals`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ApprovalListQuery {
    /// Only approvals in this status (e.g. `pending`).
    #[param(inline)]
    pub status: Option<ApprovalStatusParam>,
    /// From a previous page's `next_cursor`.
    /// An approval id.
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// A decision on an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecisionParam {
    /// Run this call once.
    AllowOnce,
    /// Run it, and the same call pattern from now on in this session.
    AllowForSession,
    /// Do not run it; the model sees `reason`.
    Deny,
}

/// `POST /v1/approvals/{approval_id}/decision`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideApprovalRequest {
    /// The decision.
    pub decision: ApprovalDecisionParam,
    /// The `args_hash` of the approval as the decider saw it: a decision binds to exactly
    /// those arguments.
    #[schema(min_length = 1)]
    pub args_hash: String,
    /// Why (for `deny`: shown to the model).
    #[serde(default)]
    pub reason: Option<String>,
}

/// An effect.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EffectBody {
    /// Its key (`<session>/<step>/<call>`).
    pub operation_key: String,
    /// Its session.
    pub session_id: String,
    /// The call.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// `prepared`, `dispatched`, `outcome_unknown`, `committed` or `failed`.
    #[schema(example = "outcome_unknown")]
    pub status: String,
    /// Hash of the exact request.
    pub request_hash: String,
    /// Dispatch attempts.
    pub attempts: u32,
    /// The recorded outcome, once committed.
    pub outcome: Option<Value>,
    /// The error, once failed.
    pub error: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A list of effects.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EffectPage {
    /// Effects, oldest first.
    pub items: Vec<EffectBody>,
    /// Always `null`: a session's effects come in one page.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/sessions/{session_id}/effects`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EffectListQuery {
    /// Only effects in this status (e.g. `outcome_unknown`).
    #[param(inline)]
    pub status: Option<EffectStatusParam>,
}

/// What a human says an `outcome_unknown` effect did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EffectDecisionParam {
    /// It happened.
    Committed,
    /// It did not happen.
    Failed,
    /// Dispatch it again.
    Retry,
}

/// `POST /v1/sessions/{session_id}/effects/{operation_key}/decision`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideEffectRequest {
    /// The decision.
    pub decision: EffectDecisionParam,
    /// A note the model sees with the result (`committed`: the outcome; `failed`: the error).
    #[serde(default)]
    pub reason: Option<String>,
}

/// An effect decision, recorded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EffectDecidedBody {
    /// The session.
    pub session_id: String,
    /// The effect.
    pub operation_key: String,
    /// `committed`, `failed` or `retry`.
    pub decision: String,
}
