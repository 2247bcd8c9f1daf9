//! # keel-core — the vocabulary of Keel, pure and I/O-free
//!
//! **Owns:** typed ids, the vocabulary's state machines as transition tables, the event envelope and
//! event types, the session fold (`SessionState::apply`), approvals' decision rules, budgets, usage,
//! terminal reasons, releases and content hashes, and the planner (state → the next action).
//!
//! **Must not touch:** files, sockets, clocks (callers pass timestamps in), databases, async
//! runtimes. Everything here is deterministic so that replaying a journal always gives the same state.
//!
//! ## Layout
//! - [`ids`] — `SessionId`, `TurnId`, `StepId`, … (UUIDv7), `ToolCallId`, `OperationKey`, `LeaseEpoch`.
//! - [`machine`] — [`SessionStatus`], [`TurnStatus`], [`StepStatus`], [`ToolCallStatus`],
//!   [`EffectStatus`], [`ApprovalStatus`] and [`check_transition`], the one function every component
//!   uses to move a state.
//! - [`event`] — [`Event`] (envelope + [`EventBody`]), decoding with schema upgrade.
//! - [`state`] — [`SessionState`], the fold. Start reading here.
//! - [`approval`] — [`ApprovalRecord`] and its decision rules.
//! - [`budget`] — [`Budget`], [`Usage`], [`ModelTotals`] (usage by model), [`TerminalReason`],
//!   [`BudgetLimit`].
//! - [`release`] — [`Release`] (content-hashed [`AgentDefinition`]), [`Tenant`], [`Principal`].
//! - [`canonical`] — canonical JSON and `sha256:` content hashes.
//! - [`patch`] — JSON merge patches, the shape of `session.config_changed`.
//! - [`plan`] — the planner: [`plan::next`] says from the folded state what the runtime does
//!   next ([`Next`]); the runtime's driver does it.
//! - [`mechanisms`] — test-only switches that turn a guarded mechanism off (and a clock offset),
//!   compiled in only with the `mechanism-switches` feature (dev-dependencies only).

pub mod approval;
pub mod budget;
pub mod canonical;
pub mod event;
pub mod ids;
pub mod machine;
pub mod mechanisms;
pub mod patch;
pub mod plan;
pub mod release;
pub mod state;
pub mod text;

pub use approval::{ApprovalDecision, ApprovalError, ApprovalRecord, Decided, args_hash};
pub use budget::{
    Budget, BudgetLimit, Consumed, MAX_RESPONSE_TOKENS, ModelTotals, TerminalReason, Usage,
    UsageByModel, finite_cost,
};
pub use event::{
    Attachment, CompiledInput, Correlation, DecodeErrorKind, EVENT_TYPES, EffectDecision, Event,
    EventBody, EventDecodeError, HookDecision, HookEvent, SCHEMA_VERSION,
};
pub use ids::{
    ApprovalId, LeaseEpoch, OperationKey, PrincipalId, ReleaseId, SessionId, StepId, TenantId,
    ToolCallId, TurnId,
};
pub use machine::{
    ApprovalStatus, EffectStatus, Machine, SessionStatus, StateMachine, StepStatus, ToolCallStatus,
    TransitionError, TurnStatus, UnknownState, check_transition,
};
pub use patch::{merge_diff, merge_patch};
pub use plan::{EffectClass, Next};
pub use release::{AgentDefinition, Principal, PrincipalKind, Release, Tenant};
pub use state::{ApplyError, ChildState, SessionState};
