//! The [`Tool`] trait, what a tool gets when it runs ([`ToolContext`]) and what it gives back
//! ([`ToolOutput`], wrapped by the registry into a [`ToolResult`]).

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::artifact::{ArtifactRef, ArtifactSink};
use crate::policy::{Policy, Subject};
use crate::sandbox::Sandbox;
use crate::workspace::Workspace;

/// How a tool affects the world; drives policy defaults and crash recovery (defined in
/// `keel-core`, where the planner reads it).
pub use keel_core::EffectClass;

/// What the model is told about a tool: name, description and the JSON Schema of its input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name the model calls the tool by, e.g. `read_file`.
    pub name: String,
    /// One-paragraph description for the model.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments object; always `additionalProperties: false`.
    pub input_schema: Value,
    /// Effect class.
    pub effect: EffectClass,
    /// Whether calls may run concurrently with other parallel-safe calls of the same step.
    pub parallel_safe: bool,
}

/// A unit of progress a running tool reports (for live UIs; coalescible, never durable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolProgress {
    /// A chunk of process output (UTF-8, lossily decoded).
    Output {
        /// The text.
        text: String,
    },
    /// A human-readable status line.
    Status {
        /// The text.
        text: String,
    },
}

/// Receives progress of running tool calls. Implementations must not block (drop or coalesce instead).
pub trait ProgressSink: Send + Sync {
    /// Reports `progress` for tool call `call_id`.
    fn report(&self, call_id: &str, progress: ToolProgress);
}

/// A [`ProgressSink`] that discards everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn report(&self, _call_id: &str, _progress: ToolProgress) {}
}

/// What was frozen when the step that proposed the call started: the policy it is authorized
/// against (mode, configured rules and session rules at that moment).
#[derive(Debug, Clone, Default)]
pub struct StepSnapshot {
    /// Opaque id of the step (for correlation only).
    pub step_id: String,
    /// The policy in force for this step.
    pub policy: Policy,
}

/// Numeric limits applied while tools run. Every field has a unit in its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolLimits {
    /// Results longer than this many characters (Unicode scalar values) are truncated for the
    /// model, with a pointer to the full text stored as an artifact. Default 30,000.
    pub result_budget_chars: usize,
    /// Shell timeout when the call gives none, in milliseconds. Default 120,000.
    pub shell_default_timeout_ms: u64,
    /// Largest timeout a shell call runs with, in milliseconds: a larger `timeout_ms` is lowered
    /// to it. Default 600,000; the runtime sets the session's tool timeout.
    pub shell_max_timeout_ms: u64,
    /// Shell output shown to the model is capped to this many bytes (head and tail kept). Default 20,000.
    pub shell_output_cap_bytes: usize,
    /// Most bytes of shell output kept in the artifact; beyond that the artifact says it was cut.
    /// Default 32 MiB.
    pub artifact_max_bytes: usize,
    /// Lines `read_file` returns when no `limit` is given. Default 2,000.
    pub read_default_lines: usize,
    /// Most entries returned by `list_dir` and `glob`, and matching lines by `grep`. Default 1,000.
    pub max_listing_entries: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            result_budget_chars: 30_000,
            shell_default_timeout_ms: 120_000,
            shell_max_timeout_ms: 600_000,
            shell_output_cap_bytes: 20_000,
            artifact_max_bytes: 32 * 1024 * 1024,
            read_default_lines: 2_000,
            max_listing_entries: 1_000,
        }
    }
}

/// Everything a tool may use while it runs. Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    /// Id of the tool call being executed (as proposed by the model).
    pub call_id: String,
    /// Cancelled when the call, its step, turn or session is cancelled; tools must stop promptly.
    pub cancel: CancellationToken,
    /// Where live progress goes.
    pub progress: Arc<dyn ProgressSink>,
    /// The workspace every path is confined to.
    pub workspace: Workspace,
    /// The sandbox `shell` runs under.
    pub sandbox: Sandbox,
    /// Where full outputs are stored.
    pub artifacts: Arc<dyn ArtifactSink>,
    /// The step's frozen snapshot.
    pub snapshot: Arc<StepSnapshot>,
    /// Limits.
    pub limits: ToolLimits,
    /// The key of the hashes a tool records about content ([`Tool::prepare`] probes; see
    /// [`crate::keyed_hash`]): the deployment's, so any of its workers can compare them.
    pub hash_key: crate::keyed_hash::HashKey,
    /// Whose call this is — tenant, session, turn, step — when a runtime runs it (`None` for
    /// a tool run outside a session). Tools that act for the session (`spawn_agent`) read it.
    pub scope: Option<CallScope>,
    /// The session the call runs in: filled by the runtime for every call it runs, `None` for
    /// tools run outside a session (tool tests, `keel mcp`). Tools that keep state per tenant,
    /// agent or user (long-term memory) read it and refuse to run without it.
    pub session: Option<Arc<SessionScope>>,
}

/// The session a tool call belongs to (see [`ToolContext::scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallScope {
    /// The tenant.
    pub tenant_id: keel_core::TenantId,
    /// The session.
    pub session_id: keel_core::SessionId,
    /// The turn.
    pub turn_id: keel_core::TurnId,
    /// The step that proposed the call.
    pub step_id: keel_core::StepId,
}

/// Who a tool call runs for: the session's tenant, agent and creator, and its secret check.
#[derive(Clone)]
pub struct SessionScope {
    /// The session's tenant: state a tool keeps for it never reaches another tenant.
    pub tenant_id: keel_core::TenantId,
    /// The session.
    pub session_id: keel_core::SessionId,
    /// The name of the agent of the session's pinned release.
    pub agent: String,
    /// The principal that created the session (the `principal_id` of its `session.created`);
    /// `None` for a session a local host (the CLI) created.
    pub creator: Option<keel_core::PrincipalId>,
    /// The session's secret check: what its redactor would redact.
    pub secrets: Arc<dyn SecretCheck>,
}

impl std::fmt::Debug for SessionScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionScope")
            .field("tenant_id", &self.tenant_id)
            .field("session_id", &self.session_id)
            .field("agent", &self.agent)
            .field("creator", &self.creator)
            .finish_non_exhaustive()
    }
}

/// Tells whether a text holds a secret (the runtime's session redactor implements it).
pub trait SecretCheck: Send + Sync {
    /// Whether `text` holds anything the session would redact (a built-in or configured secret
    /// pattern, or a known secret value), in plain or JSON-escaped spelling.
    fn holds_secret(&self, text: &str) -> bool;
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("call_id", &self.call_id)
            .field("workspace", &self.workspace)
            .field("sandbox", &self.sandbox)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Terminal status of a tool call's result (the `ToolCall` terminal states a result can carry;
/// `interrupted` is assigned by crash recovery, not here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolResultStatus {
    /// The tool did what was asked.
    Succeeded,
    /// The tool ran (or tried to) and failed; the content says why.
    Failed,
    /// The call was cancelled before or while running.
    Cancelled,
    /// The call never ran: invalid arguments, unknown tool, denied by policy or approval, expired.
    Rejected,
}

/// What a tool returns from [`Tool::call`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// Outcome.
    pub status: ToolResultStatus,
    /// Text the model sees.
    pub content: String,
    /// Structured facts for hosts and the journal (e.g. `exit_code`, `duration_ms`, `timed_out`).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
    /// The full output, when it was stored as an artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactRef>,
    /// The tool provably changed nothing (it failed before acting: a check refused the
    /// arguments, the command could not be started). A `failed` output without it may have
    /// acted (a command that ran and exited non-zero): its effect is journaled `committed`.
    /// `rejected` outputs never acted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_performed: bool,
}

impl ToolOutput {
    /// A successful output with `content`.
    pub fn success(content: impl Into<String>) -> Self {
        Self {
            status: ToolResultStatus::Succeeded,
            content: content.into(),
            details: Value::Null,
            artifact: None,
            not_performed: false,
        }
    }

    /// A failed output whose `message` says what failed and why (and ideally what to do).
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            status: ToolResultStatus::Failed,
            content: message.into(),
            details: Value::Null,
            artifact: None,
            not_performed: false,
        }
    }

    /// A rejected output (the call did not run).
    pub fn rejected(message: impl Into<String>) -> Self {
        Self {
            status: ToolResultStatus::Rejected,
            content: message.into(),
            details: Value::Null,
            artifact: None,
            not_performed: false,
        }
    }

    /// A cancelled output.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self {
            status: ToolResultStatus::Cancelled,
            content: message.into(),
            details: Value::Null,
            artifact: None,
            not_performed: false,
        }
    }

    /// A failed output of a call that provably did nothing (see [`ToolOutput::not_performed`]).
    pub fn not_performed(message: impl Into<String>) -> Self {
        Self {
            not_performed: true,
            ..Self::error(message)
        }
    }

    /// Adds structured details.
    #[must_use]
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

/// The one result every tool call gets, ready for the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The tool call id this result answers.
    pub call_id: String,
    /// The tool name as the model gave it (may be unknown).
    pub tool: String,
    /// Outcome.
    pub status: ToolResultStatus,
    /// Text the model sees (already within the result budget).
    pub content: String,
    /// Structured facts (see [`ToolOutput::details`]).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
    /// Where the full output is, if it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactRef>,
    /// Whether `content` was cut to the result budget.
    #[serde(default)]
    pub truncated: bool,
    /// The call provably changed nothing: rejected, or failed before acting (see
    /// [`ToolOutput::not_performed`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_performed: bool,
    /// The tool panicked: nothing is known of what it did (a side effect's outcome is unknown).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub panicked: bool,
}

impl ToolResult {
    /// Wraps a tool's output for call `call_id` of tool `tool`.
    pub fn from_output(call_id: &str, tool: &str, output: ToolOutput) -> Self {
        Self {
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            status: output.status,
            content: output.content,
            details: output.details,
            artifact: output.artifact,
            truncated: false,
            not_performed: output.not_performed || output.status == ToolResultStatus::Rejected,
            panicked: false,
        }
    }

    /// Whether the model should read this as an error (`is_error` in provider wire formats).
    pub fn is_error(&self) -> bool {
        self.status != ToolResultStatus::Succeeded
    }
}

/// What a tool's `reconcile` found out about an operation whose outcome was unknown after a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReconcileOutcome {
    /// The side effect happened; this is its result.
    Committed {
        /// The result to record.
        output: ToolOutput,
    },
    /// The side effect was attempted and failed; the call ends with this error.
    Failed {
        /// Why, for the model.
        reason: String,
    },
    /// The side effect provably did not happen (the world is as it was before the dispatch),
    /// so dispatching it again cannot do it twice: the runtime journals `effect.decided`
    /// `retry` (`reconciled: true`) and runs the call again.
    NotHappened {
        /// What showed it, for the journal and logs.
        reason: String,
    },
    /// The tool could not tell; a human must decide.
    Unknown,
}

/// An action the model can take. Implementations are stateless or internally synchronized.
///
/// The registry validates arguments against [`Tool::input_schema`] before [`Tool::call`] runs, so
/// `call` may deserialize them with confidence (but must still not panic on surprises).
#[async_trait]
pub trait Tool: Send + Sync {
    /// Name the model calls the tool by (`[a-zA-Z0-9_-]+`; MCP tools are `mcp__<server>__<tool>`).
    fn name(&self) -> &str;

    /// Description for the model.
    fn description(&self) -> &str;

    /// JSON Schema of the arguments object. Must have `"type": "object"` and
    /// `"additionalProperties": false`; the registry refuses it otherwise.
    fn input_schema(&self) -> Value;

    /// Effect class.
    fn effect(&self) -> EffectClass;

    /// Whether the call may run concurrently with other parallel-safe calls.
    fn parallel_safe(&self) -> bool {
        self.effect() == EffectClass::ReadOnly
    }

    /// What policy rules are matched against for these (already validated) arguments. The default
    /// is the arguments' compact JSON, which `tool(<glob>)` rules match.
    fn subject(&self, args: &Value) -> Subject {
        Subject::Other(args.to_string())
    }

    /// Whether [`Tool::reconcile`] can look outcomes up.
    fn can_reconcile(&self) -> bool {
        false
    }

    /// Looks up the outcome of a side effect dispatched under `operation_key` whose result was lost
    /// in a crash. The default cannot tell ([`ReconcileOutcome::Unknown`]).
    async fn reconcile(&self, _operation_key: &str, _ctx: &ToolContext) -> ReconcileOutcome {
        ReconcileOutcome::Unknown
    }

    /// Records, just before a side effect is dispatched, what [`Tool::reconcile_call`] will need
    /// to tell afterwards whether it happened (journaled in `effect.prepared` as `probe`). The
    /// default records nothing.
    async fn prepare(&self, _args: &Value, _ctx: &ToolContext) -> Option<Value> {
        None
    }

    /// Looks up the outcome of call `arguments` dispatched under `operation_key` whose result
    /// was lost in a crash, with what [`Tool::prepare`] recorded (`probe`). The default asks
    /// [`Tool::reconcile`].
    async fn reconcile_call(
        &self,
        operation_key: &str,
        _arguments: &Value,
        _probe: Option<&Value>,
        ctx: &ToolContext,
    ) -> ReconcileOutcome {
        self.reconcile(operation_key, ctx).await
    }

    /// Runs the call. Never panics; every failure is a [`ToolOutput`] saying what failed and why.
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput;
}

/// Tools that come from outside the process and can change while a session runs (an MCP
/// server's tool list). The runtime lists them again for the next step's snapshot when
/// [`ToolSource::generation`] moved, never for the step in progress.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// A number that changes whenever the tools may have changed (a list-change notification,
    /// a restart). Cheap: read before every step.
    fn generation(&self) -> u64;

    /// The tools now, and one notice per tool or server left out (not started, list failed).
    async fn tools(&self) -> (Vec<Arc<dyn Tool>>, Vec<String>);
}

/// Where the tools of a release's external sources come from (its MCP servers): the runtime
/// asks once per release and workspace, and lists the sources again when their generation
/// moves.
#[async_trait]
pub trait ToolProvider: Send + Sync {
    /// The sources of the tools `release` names (started if need be), running in `workspace`,
    /// and one notice per source that could not be set up (a bad entry, a server that did not
    /// start: its tools are not offered).
    async fn sources(
        &self,
        release: &keel_core::Release,
        workspace: &std::path::Path,
    ) -> (Vec<Arc<dyn ToolSource>>, Vec<String>);
}
