//! The wire types of the API live in the `keel-api` crate (shared with `keel-client`) and are
//! re-exported here; this module maps them to and from the kernel's types: [`Kernel`] for the
//! enums a client sends, and one function per response body built from a store record.

use std::collections::BTreeMap;

use keel_core::{ApprovalRecord, Budget, StateMachine};

pub use keel_api::*;

/// A wire enum's kernel counterpart.
pub trait Kernel {
    /// The kernel's type.
    type Out;
    /// The kernel's value.
    fn kernel(self) -> Self::Out;
}

impl Kernel for SessionStatusParam {
    type Out = keel_core::SessionStatus;
    fn kernel(self) -> keel_core::SessionStatus {
        use keel_core::SessionStatus as S;
        match self {
            Self::Created => S::Created,
            Self::Running => S::Running,
            Self::Idle => S::Idle,
            Self::RequiresAction => S::RequiresAction,
            Self::Closed => S::Closed,
        }
    }
}

impl Kernel for ApprovalStatusParam {
    type Out = keel_core::ApprovalStatus;
    fn kernel(self) -> keel_core::ApprovalStatus {
        use keel_core::ApprovalStatus as S;
        match self {
            Self::Pending => S::Pending,
            Self::Allowed => S::Allowed,
            Self::Denied => S::Denied,
            Self::Expired => S::Expired,
        }
    }
}

impl Kernel for EffectStatusParam {
    type Out = keel_core::EffectStatus;
    fn kernel(self) -> keel_core::EffectStatus {
        use keel_core::EffectStatus as S;
        match self {
            Self::Prepared => S::Prepared,
            Self::Dispatched => S::Dispatched,
            Self::OutcomeUnknown => S::OutcomeUnknown,
            Self::Committed => S::Committed,
            Self::Failed => S::Failed,
        }
    }
}

impl Kernel for PermissionModeParam {
    type Out = keel_tools::policy::PermissionMode;
    fn kernel(self) -> keel_tools::policy::PermissionMode {
        use keel_tools::policy::PermissionMode as M;
        match self {
            Self::Default => M::Default,
            Self::AcceptEdits => M::AcceptEdits,
            Self::ReadOnly => M::ReadOnly,
            Self::Bypass => M::Bypass,
        }
    }
}

impl Kernel for SandboxParam {
    type Out = keel_tools::sandbox::SandboxMode;
    fn kernel(self) -> keel_tools::sandbox::SandboxMode {
        use keel_tools::sandbox::SandboxMode as M;
        match self {
            Self::Off => M::Off,
            Self::ReadOnly => M::ReadOnly,
            Self::WorkspaceWrite => M::WorkspaceWrite,
        }
    }
}

impl Kernel for MultitaskParam {
    type Out = keel_runtime::MultitaskStrategy;
    fn kernel(self) -> keel_runtime::MultitaskStrategy {
        use keel_runtime::MultitaskStrategy as M;
        match self {
            Self::Enqueue => M::Enqueue,
            Self::Reject => M::Reject,
            Self::Interrupt => M::Interrupt,
        }
    }
}

impl Kernel for RoleParam {
    type Out = keel_store::Role;
    fn kernel(self) -> keel_store::Role {
        match self {
            Self::Admin => keel_store::Role::Admin,
            Self::Operator => keel_store::Role::Operator,
            Self::Viewer => keel_store::Role::Viewer,
        }
    }
}

/// The kernel's budget of a wire budget.
pub fn budget(b: BudgetBody) -> Budget {
    Budget {
        max_steps: b.max_steps,
        max_tokens: b.max_tokens,
        max_cost_usd: b.max_cost_usd,
        max_tool_calls: b.max_tool_calls,
        max_wall_time_ms: b.max_wall_time_ms,
    }
}

/// The wire budget of a kernel budget.
pub fn budget_body(b: Budget) -> BudgetBody {
    BudgetBody {
        max_steps: b.max_steps,
        max_tokens: b.max_tokens,
        max_cost_usd: b.max_cost_usd,
        max_tool_calls: b.max_tool_calls,
        max_wall_time_ms: b.max_wall_time_ms,
    }
}

/// The wire usage of the kernel's.
pub fn usage_body(u: keel_core::Usage) -> UsageBody {
    UsageBody {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        reasoning_tokens: u.reasoning_tokens,
    }
}

/// Usage by model label.
pub fn by_model(m: &keel_core::UsageByModel) -> BTreeMap<String, ModelTotalsBody> {
    m.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                ModelTotalsBody {
                    usage: usage_body(v.usage),
                    cost_usd: v.cost_usd,
                    steps: v.steps,
                },
            )
        })
        .collect()
}

/// A stored key as shown (never the key itself).
pub fn key_body(k: keel_store::ApiKeyRecord) -> KeyBody {
    KeyBody {
        key_id: k.key_id,
        principal_id: k.principal_id.to_string(),
        name: k.principal_name,
        tenant_id: k.tenant_id.map(|t| t.to_string()),
        role: k.role.as_str().to_owned(),
        prefix: k.prefix,
        created_at: k.created_at,
        expires_at: k.expires_at,
        revoked_at: k.revoked_at,
    }
}

/// An approval as shown.
pub fn approval_body(a: ApprovalRecord) -> ApprovalBody {
    ApprovalBody {
        approval_id: a.approval_id.to_string(),
        session_id: a.session_id.to_string(),
        turn_id: a.turn_id.to_string(),
        tool_call_id: a.tool_call_id.to_string(),
        tool_name: a.tool_name,
        arguments: a.arguments,
        args_hash: a.args_hash,
        status: a.status.as_str().to_owned(),
        decision: a.decision.and_then(|d| serde_json::to_value(d).ok()),
        created_at: a.created_at,
        expires_at: a.expires_at,
        decided_at: a.decided_at,
        decided_by: a.decided_by.map(|p| p.to_string()),
        agent: None,
    }
}

/// An effect as shown.
pub fn effect_body(e: keel_store::EffectRecord) -> EffectBody {
    EffectBody {
        operation_key: e.operation_key.0,
        session_id: e.session_id.to_string(),
        tool_call_id: e.tool_call_id.to_string(),
        tool_name: e.tool_name,
        status: e.status.as_str().to_owned(),
        request_hash: e.request_hash,
        attempts: e.attempts,
        outcome: e.outcome,
        error: e.error,
        created_at: e.created_at,
        updated_at: e.updated_at,
    }
}
