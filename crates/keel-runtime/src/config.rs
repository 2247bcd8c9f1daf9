//! Configuration: per session ([`SessionConfig`], pinned in `session.created` so any worker can
//! resume the session, and changed between turns by `session.config_changed` through
//! [`crate::Runtime::update_config`]) and per worker process ([`RuntimeOptions`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{Budget, TenantId};
use keel_model::PriceTable;
use keel_tools::policy::{PermissionMode, Rule};
use keel_tools::sandbox::SandboxMode;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// What happens to an input submitted while the session has a turn in progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MultitaskStrategy {
    /// Queue it durably; it runs when the active turn ends (default).
    #[default]
    Enqueue,
    /// Refuse it with [`RuntimeError::TurnInProgress`]; nothing is written.
    Reject,
    /// Queue it and cancel the active turn (`turn.cancel_requested`, then `aborted`).
    Interrupt,
}

/// The lowest turn priority ([`SubmitOptions::priority`]).
pub const MIN_PRIORITY: i32 = -100;
/// The highest turn priority ([`SubmitOptions::priority`]).
pub const MAX_PRIORITY: i32 = 100;

/// How [`crate::Runtime::submit_opts`] queues an input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// The multitask strategy, when not the session's.
    pub strategy: Option<MultitaskStrategy>,
    /// The turn's scheduling priority, [`MIN_PRIORITY`]..=[`MAX_PRIORITY`] (default 0): within
    /// a tenant, a scheduler claims sessions of higher priority first (issue 13). Written to the
    /// session's row with the `turn.queued` commit ([`keel_store::AppendExtras::priority`]): a
    /// session's priority is that of its latest submitted turn. Not journaled.
    pub priority: i32,
}

impl SubmitOptions {
    /// Checks the priority's range.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming the range.
    pub fn validate(&self) -> Result<()> {
        if (MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            Ok(())
        } else {
            Err(RuntimeError::InvalidInput(format!(
                "priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {}",
                self.priority
            )))
        }
    }
}

/// Settings pinned with a session (journaled, redacted, in `session.created.config`) and changed
/// only by `session.config_changed` ([`crate::Runtime::update_config`]); the effective config is
/// the created one with every change merged in, in journal order. Every field has a default;
/// units are in the names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionConfig {
    /// The workspace every tool path is confined to; `AGENTS.md` is read from its root.
    pub workspace: PathBuf,
    /// Permission mode (`default`, `accept_edits`, `read_only`, `bypass`).
    pub permission_mode: PermissionMode,
    /// Not a setting any more: `allow` rules loosen the policy, so they belong to the release
    /// (`policy.allow`); a new session or a change with any is refused. Read only from journals
    /// of older builds, for a release without policy (see [`crate::pinned`]).
    pub allow: Vec<String>,
    /// `ask` rules added to the release's (`shell(git push *)`, …): they only tighten.
    pub ask: Vec<String>,
    /// `deny` rules added to the release's (`read_file(./secrets/**)`, …): they only tighten.
    pub deny: Vec<String>,
    /// How `shell` is confined. The confined modes need a sandbox launcher registered in the
    /// host process (`keel_tools::sandbox::set_launcher`; the `keel` binary registers itself):
    /// without one a confined call fails, naming what is missing, and nothing runs.
    pub sandbox: SandboxMode,
    /// Confined `shell` commands share the host's network namespace for `AF_INET`/`AF_INET6`
    /// (package installs, test servers), keeping every other sandbox layer; they then also reach
    /// every service listening on the host's loopback interface. Default false: no IP network.
    /// No effect when `sandbox` is `off`. (Absent in journals of older builds: false.)
    pub sandbox_network: bool,
    /// Per-turn limits; fields left `None` fall back to the release's budget.
    pub turn_budget: Budget,
    /// Per-session limits (over all turns).
    pub session_budget: Budget,
    /// Per-tenant daily limits; only `max_tokens` and `max_cost_usd` apply.
    pub tenant_daily_budget: Budget,
    /// What a second input does while a turn is in progress.
    pub multitask: MultitaskStrategy,
    /// The model's context window in tokens, overriding what the model says
    /// (`ModelClient::context_window_tokens`: the built-in table of known models, the smallest
    /// of a route's; [`keel_model::DEFAULT_CONTEXT_WINDOW`] for an unknown model). `None`
    /// (default): the model's. Compaction starts at `compact_at_fraction` of it.
    pub context_window_tokens: Option<u64>,
    /// Compact when the projected context reaches this fraction of the window (default 0.8).
    pub compact_at_fraction: f64,
    /// The same failing call (tool, arguments, error) this many times in a turn ends it with
    /// `loop_detected` (default 3).
    pub loop_threshold: u32,
    /// Time limit of every tool call, ms (default 600,000: 10 min). When it passes the call is
    /// stopped (its token cancelled: `shell` kills its process group) and fails with "timed out
    /// after N ms"; a side effect it had dispatched is `outcome_unknown`; the turn goes on. It
    /// is also the longest `timeout_ms` a `shell` call may ask for (a larger one is clamped to
    /// it). `None` (sessions journaled before this default): the tools' own limits only.
    pub tool_timeout_ms: Option<u64>,
    /// Wall-clock limit of one turn, ms; on expiry everything below is cancelled, dispatched
    /// effects become `outcome_unknown` and the turn ends `failed`.
    pub turn_timeout_ms: Option<u64>,
    /// Time from sending a step's model request to its first content event, ms. It bounds the
    /// whole model call including the route's own retries and fallbacks: when it passes the
    /// stream is closed, the step fails with `error_kind: timeout` and the turn ends `failed`.
    /// (A provider `timeout` error raised inside the route is retried per the route first.)
    pub model_first_token_timeout_ms: Option<u64>,
    /// Time from sending a step's model request to its end, ms; on expiry as for
    /// `model_first_token_timeout_ms`.
    pub model_total_timeout_ms: Option<u64>,
    /// Once a model response has started, the longest it may go without sending a byte, ms
    /// (default 60,000). A stalled stream fails that attempt with a retryable `timeout`: the
    /// route retries it per its policy, then the step fails with `error_kind: timeout`. (The two
    /// model limits above, when set, also replace the model's own per-attempt limits.)
    pub stream_idle_timeout_ms: u64,
    /// How long an approval waits for a decision, ms (default 24 h).
    pub approval_ttl_ms: u64,
    /// Extra secret patterns (regular expressions) redacted from events.
    pub secret_patterns: Vec<String>,
    /// Names of environment variables whose values are secret.
    pub secret_env: Vec<String>,
    /// Keep the model's reasoning (thinking text with its signature, reasoning summaries and
    /// encrypted reasoning items) in the journal, redacted, in `step.completed.reasoning`.
    /// Default false: reasoning is shown live to subscribers, sealed outside the journal for
    /// the turn's tool loop only, and deleted when the turn ends (see [`crate::seal`]).
    pub keep_reasoning: bool,
    /// Settings of the host that created the session, which the runtime stores and never reads
    /// (e.g. the `keel` CLI's `base_url` of an OpenAI-compatible server). Keys are the host's;
    /// values any JSON. Pinned and changeable like every other field.
    pub host: BTreeMap<String, serde_json::Value>,
    /// Set on a child session a `spawn_agent` call started (see [`crate::subagents`]): its
    /// parent, the call and its depth. Absent (and not serialized) on every other session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subagent: Option<SubagentLink>,
}

/// Where a child session comes from ([`SessionConfig::subagent`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentLink {
    /// The session whose call started it.
    pub parent_session_id: keel_core::SessionId,
    /// That call.
    pub tool_call_id: keel_core::ToolCallId,
    /// The agent definition's name.
    pub agent: String,
    /// 1 for a child of a top-level session, 2 for a grandchild, …
    pub depth: u32,
    /// The top-level session of its tree (whose live descendants
    /// [`SubagentOptions::max_descendants`] bounds); absent in configs journaled by earlier
    /// builds (the parent then stands for the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_session_id: Option<keel_core::SessionId>,
}

/// [`SessionConfig::tool_timeout_ms`] by default: 10 min, in ms.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 600_000;

/// [`SessionConfig::stream_idle_timeout_ms`] by default: 60 s, in ms.
pub const DEFAULT_STREAM_IDLE_TIMEOUT_MS: u64 = 60_000;

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            workspace: PathBuf::from("."),
            permission_mode: PermissionMode::Default,
            allow: Vec::new(),
            ask: Vec::new(),
            deny: Vec::new(),
            sandbox: SandboxMode::WorkspaceWrite,
            sandbox_network: false,
            turn_budget: Budget::default(),
            session_budget: Budget::default(),
            tenant_daily_budget: Budget::default(),
            multitask: MultitaskStrategy::Enqueue,
            context_window_tokens: None,
            compact_at_fraction: 0.8,
            loop_threshold: 3,
            tool_timeout_ms: Some(DEFAULT_TOOL_TIMEOUT_MS),
            turn_timeout_ms: None,
            model_first_token_timeout_ms: None,
            model_total_timeout_ms: None,
            stream_idle_timeout_ms: DEFAULT_STREAM_IDLE_TIMEOUT_MS,
            approval_ttl_ms: 24 * 3600 * 1000,
            secret_patterns: Vec::new(),
            secret_env: Vec::new(),
            keep_reasoning: false,
            host: BTreeMap::new(),
            subagent: None,
        }
    }
}

impl SessionConfig {
    /// The context window a session sampling `model` compacts against: the configured
    /// `context_window_tokens`, else the model's known window, else
    /// [`keel_model::DEFAULT_CONTEXT_WINDOW`].
    pub fn context_window(&self, model: &dyn keel_model::ModelClient) -> u64 {
        self.context_window_tokens
            .or_else(|| model.context_window_tokens())
            .unwrap_or(keel_model::DEFAULT_CONTEXT_WINDOW)
    }

    /// Checks every field a session needs before anything is written.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming the field (a rule that does not parse, …).
    pub fn validate(&self) -> Result<()> {
        let bad = |e: keel_tools::ToolsError| RuntimeError::InvalidInput(e.to_string());
        for r in &self.allow {
            Rule::allow(r).map_err(bad)?;
        }
        for r in &self.ask {
            Rule::ask(r).map_err(bad)?;
        }
        for r in &self.deny {
            Rule::deny(r).map_err(bad)?;
        }
        crate::redact::Redactor::new(&self.secret_patterns, &[])?;
        if !(self.compact_at_fraction > 0.0 && self.compact_at_fraction <= 1.0) {
            return Err(RuntimeError::InvalidInput(format!(
                "compact_at_fraction must be in (0, 1], got {}",
                self.compact_at_fraction
            )));
        }
        if self.context_window_tokens == Some(0) {
            return Err(RuntimeError::InvalidInput(
                "context_window_tokens must be positive".into(),
            ));
        }
        if self.loop_threshold == 0 {
            return Err(RuntimeError::InvalidInput(
                "loop_threshold must be at least 1".into(),
            ));
        }
        for (name, ms) in [
            ("tool_timeout_ms", self.tool_timeout_ms),
            ("turn_timeout_ms", self.turn_timeout_ms),
            (
                "model_first_token_timeout_ms",
                self.model_first_token_timeout_ms,
            ),
            ("model_total_timeout_ms", self.model_total_timeout_ms),
            ("stream_idle_timeout_ms", Some(self.stream_idle_timeout_ms)),
        ] {
            if ms == Some(0) {
                return Err(RuntimeError::InvalidInput(format!(
                    "{name} must be at least 1 ms, got 0"
                )));
            }
        }
        for (name, b) in [
            ("turn_budget", &self.turn_budget),
            ("session_budget", &self.session_budget),
            ("tenant_daily_budget", &self.tenant_daily_budget),
        ] {
            if let Some(c) = b.max_cost_usd
                && !(c.is_finite() && c >= 0.0)
            {
                return Err(RuntimeError::InvalidInput(format!(
                    "{name}.max_cost_usd must be a non-negative number of USD, got {c}"
                )));
            }
        }
        if !self.workspace.is_dir() {
            return Err(RuntimeError::InvalidInput(format!(
                "workspace {} is not a directory",
                self.workspace.display()
            )));
        }
        Ok(())
    }
}

/// Merges `over` onto `base`: each limit of `over` that is set wins.
pub(crate) fn merge_budget(base: Budget, over: Budget) -> Budget {
    Budget {
        max_steps: over.max_steps.or(base.max_steps),
        max_tokens: over.max_tokens.or(base.max_tokens),
        max_cost_usd: over.max_cost_usd.or(base.max_cost_usd),
        max_tool_calls: over.max_tool_calls.or(base.max_tool_calls),
        max_wall_time_ms: over.max_wall_time_ms.or(base.max_wall_time_ms),
    }
}

/// Settings of one worker process.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Worker name; the lease owner is `<name>@<host>:<pid>/pidns:<inode>`.
    pub worker_name: String,
    /// Lease time-to-live (default 10 s); heartbeats renew it every third of it.
    pub lease_ttl: Duration,
    /// How long to wait for another live worker's lease before [`RuntimeError::SessionBusy`]
    /// (default: one lease TTL plus a second).
    pub lease_wait: Duration,
    /// Prices for cost accounting (USD).
    pub prices: PriceTable,
    /// Where this worker records its metrics (model tokens and cost, tool outcomes, step
    /// latency; see [`crate::metrics`]). Default: a registry of its own; a host that serves
    /// `/metrics` passes the one it renders (clones share it).
    pub metrics: crate::metrics::Metrics,
    /// Capacity of each session's ephemeral delta buffer (default 1024); a subscriber further
    /// behind loses deltas and is told how many.
    pub delta_buffer: usize,
    /// Grace a cancelled tool gets to return its own result before the runtime records one, ms.
    pub cancel_grace_ms: u64,
    /// A phase that keeps events staged longer than this (a long model stream, a slow
    /// read-only tool) commits them early so observers in other processes see it running
    /// (default 200 ms). Fast phases stay one commit each.
    pub checkpoint_after: Duration,
    /// The deployment's key for sealed arguments (see [`crate::seal`]). Default: a random key
    /// of this process ([`crate::seal::SealKey::ephemeral`]); hosts that resume sessions after
    /// a restart load one from a 0600 file ([`crate::seal::SealKey::load_or_create`]), shared
    /// by every worker of the deployment.
    pub seal_key: crate::seal::SealKey,
    /// Environment variables removed from every tool process's environment: the provider API
    /// keys the host reads (default [`crate::redact::PROVIDER_KEY_ENV`]; a host that reads a
    /// key from another variable adds it). Their values are secrets: redacted from every
    /// session this runtime loads, and sealed with it (see `crate::secrets`), whatever the
    /// session's `secret_env` says.
    pub withheld_env: Vec<String>,
    /// Environment variables set in every tool process (the host's configured values, e.g. the
    /// `keel` CLI's `[env]`), whatever their names; secret ones belong in `secret_values` too.
    /// Never journaled.
    pub tool_env: Vec<(String, String)>,
    /// Environment variables whose value in this process is passed to tool processes although
    /// their names look secret (`KEY`, `SECRET`, `TOKEN`, `PASSWORD`) or are in `withheld_env`:
    /// the host's explicit choice (the `keel` CLI's `[env]` entries without a value).
    pub passed_env: Vec<String>,
    /// Paths a confined `shell` command must not see (covered by an empty read-only directory or
    /// `/dev/null`): the host's own data, such as the `keel` CLI's data and config directories,
    /// its store and its seal key. See [`keel_tools::sandbox::Sandbox::hiding`].
    pub hidden_paths: Vec<PathBuf>,
    /// Directories holding the workspaces of many sessions (`keel serve`'s `[server]
    /// workspace_roots`, canonical): a confined `shell` command sees none of them except its
    /// own session's workspace, so one session cannot read or change another's. See
    /// [`keel_tools::sandbox::Sandbox::isolating`].
    pub workspace_roots: Vec<PathBuf>,
    /// Secret values the host knows (a provider key written in its configuration, an `[env]`
    /// value marked secret): redacted from every session this runtime loads, like
    /// `secret_env`'s values, and sealed with the session so a later process that lacks one
    /// still redacts it (see `crate::secrets`). Never journaled.
    pub secret_values: Vec<String>,
    /// Token-aware admission of model calls by each tenant's tokens-per-minute limit (issue 13,
    /// "Scheduling"); `None` (default): no rate limit. See [`TokenRate`].
    pub token_rate: Option<TokenRate>,
    /// The host's hooks (see [`crate::hooks`]): commands and HTTP endpoints run at fixed points
    /// of every session this runtime runs. Default: none. Only a host's own configuration sets
    /// them (they run code); never a session's settings.
    pub hooks: crate::hooks::Hooks,
    /// Bounds and models of sub-agents (`spawn_agent`, see [`crate::subagents`]).
    pub subagents: SubagentOptions,
    /// The host's memory settings (`[memory]`): the size limit every memory write is held to,
    /// the tools' and the API's alike ([`crate::memory::check_entry`]). Default: the agent
    /// scope and 64 KiB.
    pub memory: crate::memory::MemorySettings,
}

/// Builds the model a child session samples from its release's `model_route` (primary first,
/// then fallbacks); an error says why the route cannot be used.
pub type ModelFactory = Arc<
    dyn Fn(&[String]) -> std::result::Result<Arc<dyn keel_model::ModelClient>, String>
        + Send
        + Sync,
>;

/// [`SubagentOptions::max_depth`] by default.
pub const DEFAULT_SUBAGENT_MAX_DEPTH: u32 = 3;
/// [`SubagentOptions::max_concurrent`] by default.
pub const DEFAULT_SUBAGENT_MAX_CONCURRENT: usize = 8;
/// [`SubagentOptions::max_descendants`] by default.
pub const DEFAULT_SUBAGENT_MAX_DESCENDANTS: usize = 32;
/// The longest `spawn_agent` prompt, in bytes of UTF-8 (64 KiB, as a memory value): a longer
/// one is refused with a tool error the model sees (the prompt is journaled in the parent's
/// call and the child's `turn.queued`; files are for the child to read, not to paste).
pub const MAX_SPAWN_PROMPT_BYTES: usize = 64 * 1024;

/// Sub-agent settings of a worker (the `keel` CLI's `[subagents]` in `keel.toml`).
#[derive(Clone)]
pub struct SubagentOptions {
    /// Deepest child: a session at this depth gets no `spawn_agent` call through (default 3).
    pub max_depth: u32,
    /// Most children of one session running at once; more calls wait for a slot (default 8).
    pub max_concurrent: usize,
    /// Most live descendants (children, grandchildren, …) of one top-level session at once,
    /// in this process; a `spawn_agent` call past it is refused with a tool error, not queued
    /// (default 32; `max_concurrent` alone would allow 8 + 64 + 512 at depth 3).
    pub max_descendants: usize,
    /// The model of a child session, from its release's route. `None`: children sample the
    /// runtime's own model (the one given to [`crate::Runtime::new`]).
    pub models: Option<ModelFactory>,
}

impl Default for SubagentOptions {
    fn default() -> Self {
        Self {
            max_depth: DEFAULT_SUBAGENT_MAX_DEPTH,
            max_concurrent: DEFAULT_SUBAGENT_MAX_CONCURRENT,
            max_descendants: DEFAULT_SUBAGENT_MAX_DESCENDANTS,
            models: None,
        }
    }
}

impl std::fmt::Debug for SubagentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentOptions")
            .field("max_depth", &self.max_depth)
            .field("max_concurrent", &self.max_concurrent)
            .field("max_descendants", &self.max_descendants)
            .field("models", &self.models.is_some())
            .finish()
    }
}

/// Length of a token-rate window, ms: the limits of [`TokenRate`] are per minute, and a
/// window starts on each whole minute of the wall clock (Unix ms divisible by 60,000).
pub const TOKEN_WINDOW_MS: i64 = 60_000;

/// Per-tenant token-rate admission (issue 13): before each model call — every attempt of a
/// step, and each compaction summary — the runtime reserves the call's *projected* tokens (the
/// step's estimated context, [`crate::ContextSnapshot::estimated_tokens`], plus the request's
/// maximum output: `sampling.max_tokens`, else [`TokenRate::default_output_tokens`]) in the
/// tenant's window of the current minute ([`keel_store::Store::reserve_tokens`], window start in
/// Unix ms, see [`TOKEN_WINDOW_MS`]). When the window has no room the call waits for the next
/// window and tries again — it never fails for rate — and the wait is announced (a tracing
/// event `waiting for the tenant's token rate` with tenant, session, tokens and limit, and a
/// [`crate::DeltaKind::TokenRateWait`] delta). The wait ends early when the turn is cancelled
/// (the turn then ends as cancelled) or the run is drained ([`crate::Runtime::run_claimed`]:
/// the step is left for the next worker). After the call the reservation is settled to what
/// it used ([`keel_store::Store::settle_tokens`]: input + output tokens, reported or, without a
/// report, estimated as for budgets; nothing for an attempt that produced nothing). A run
/// stopped between the two (a crash, a dropped future) leaves its reservation in that minute's
/// window. The store admits a reservation larger than the limit into an empty window, so one
/// oversized call runs alone instead of never.
#[derive(Clone)]
pub struct TokenRate {
    limit: Arc<dyn Fn(TenantId) -> Option<u64> + Send + Sync>,
    /// Output tokens projected for a request that names no maximum (default 8,192: the
    /// Anthropic adapter's default `max_tokens`).
    pub default_output_tokens: u64,
}

/// [`TokenRate::default_output_tokens`] by default.
pub const DEFAULT_PROJECTED_OUTPUT_TOKENS: u64 = 8_192;

impl TokenRate {
    /// Limits read per call from `limit`: the tenant's tokens per minute, `None` for a tenant
    /// without a limit (its calls are not reserved at all). Called before every model call, so
    /// a changed limit applies to the next one; keep it cheap (a map lookup).
    pub fn per_tenant(limit: impl Fn(TenantId) -> Option<u64> + Send + Sync + 'static) -> Self {
        Self {
            limit: Arc::new(limit),
            default_output_tokens: DEFAULT_PROJECTED_OUTPUT_TOKENS,
        }
    }

    /// The same limit, in tokens per minute, for every tenant.
    pub fn uniform(tokens_per_minute: u64) -> Self {
        Self::per_tenant(move |_| Some(tokens_per_minute))
    }

    /// `tenant`'s limit in tokens per minute, if it has one.
    pub fn limit(&self, tenant: TenantId) -> Option<u64> {
        (self.limit)(tenant)
    }
}

impl std::fmt::Debug for TokenRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRate")
            .field("default_output_tokens", &self.default_output_tokens)
            .finish_non_exhaustive()
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            worker_name: format!(
                "keel-worker-{}",
                &keel_core::SessionId::new().to_string()[24..]
            ),
            lease_ttl: Duration::from_secs(10),
            lease_wait: Duration::from_secs(11),
            prices: PriceTable::default(),
            metrics: crate::metrics::Metrics::default(),
            delta_buffer: 1024,
            cancel_grace_ms: 5_000,
            checkpoint_after: Duration::from_millis(200),
            seal_key: crate::seal::SealKey::ephemeral(),
            withheld_env: crate::redact::PROVIDER_KEY_ENV
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            secret_values: Vec::new(),
            tool_env: Vec::new(),
            passed_env: Vec::new(),
            hidden_paths: Vec::new(),
            workspace_roots: Vec::new(),
            token_rate: None,
            hooks: crate::hooks::Hooks::default(),
            subagents: SubagentOptions::default(),
            memory: crate::memory::MemorySettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config journaled before the stream idle limit and the default tool timeout reads with
    /// the idle default, and keeps its explicit "no tool timeout".
    #[test]
    fn older_journaled_configs_read_with_the_new_defaults() {
        let old: SessionConfig =
            serde_json::from_value(serde_json::json!({"tool_timeout_ms": null})).unwrap();
        assert_eq!(old.stream_idle_timeout_ms, DEFAULT_STREAM_IDLE_TIMEOUT_MS);
        assert_eq!(old.tool_timeout_ms, None);
        assert_eq!(
            SessionConfig::default().tool_timeout_ms,
            Some(DEFAULT_TOOL_TIMEOUT_MS)
        );
    }

    #[test]
    fn a_zero_timeout_is_refused_naming_the_field() {
        let c = SessionConfig {
            stream_idle_timeout_ms: 0,
            ..SessionConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("stream_idle_timeout_ms must be at least 1 ms"),
            "{e}"
        );
    }
}
