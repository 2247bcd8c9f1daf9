//! # keel-runtime — the runtime kernel
//!
//! **Owns:** the session actor and its turn loop (Session → Turn → Step → ToolCall), context
//! projection, streaming tool execution, the effect journal in the loop, approvals and
//! `outcome_unknown` decisions as durable waits, cancellation, timeouts, budgets and loop
//! breaking, compaction, crash recovery, leases and heartbeats, and event subscriptions with
//! backpressure and secret redaction.
//!
//! **Must not touch:** SQL or any backend (only the `keel_store::Store` trait), provider wire
//! formats (only `keel_model::ModelClient`), what a tool does (only `keel_tools::ToolRegistry`),
//! argument parsing or terminal output (that is the `keel` binary). The state machines are
//! `keel-core`'s; every transition here is an event the core fold accepts.
//!
//! ## Layout (in reading order)
//! - [`runtime`] — [`Runtime`], the API hosts call: create, configure and run sessions. Start
//!   reading here. `control` (submit, cancel, close, decide) and `inspect` (subscribe, view, the
//!   projected context) add to it.
//! - `driver` — the loop: asks the planner ([`keel_core::plan::next`]) what to do next, does
//!   it, commits once per phase. `facts` gathers the planner's plain inputs.
//! - The phases, one module each: `sampling` (request, stream, retries, fallback, proposals;
//!   `admission` reserves each model call's tokens under the tenant's rate first),
//!   `authorize` (validation and the step's frozen policy: the planner's call facts), `tools`
//!   (parallel and sequential execution, one result per call),
//!   `approvals` (requests, decisions, waiting on humans), `recovery` (calls a dead worker
//!   left running; reconcile), `compaction`, [`budgets`] (the tenant's usage), `turn_end`,
//!   and [`hooks`] (the host's hook commands and HTTP endpoints, each run journaled as
//!   `hook.ran` before its decision takes effect).
//! - `progress` — tool output into the live delta stream, redacted.
//! - [`input`] — the input pipeline: raw input compiled (text, `@path` attachments, slash
//!   commands, user commands) before it enters the loop; [`Runtime::compile_input`].
//! - [`intent`] — durable intents: input and cancellations from processes that do not run the
//!   session. `hold` — holding a journal outside a run. `shared` — the worker's and each
//!   running session's shared handles.
//! - `effects` — the effects and usage rows that commit with the journal; [`transcript`] — the
//!   transcript table's rows (items and compaction boundaries), committed the same way.
//! - [`journal`] — [`journal::Journal`]: staged events and their one commit (CAS on version +
//!   lease epoch); [`projection`] — [`projection::Projection`], the model-visible transcript.
//! - [`context`] — [`ContextSnapshot`]: what a step shows the model; [`tokens`] estimates.
//! - [`subscribe`] — [`Subscription`]: replay + live tail + bounded ephemeral deltas.
//! - [`seal`] — sealed rows, encrypted outside the journal: the exact arguments of calls
//!   whose journaled form was redacted (until the call ends), and the provider reasoning of
//!   the active turn's steps (until the turn ends; hidden reasoning is never journaled unless
//!   `keep_reasoning`).
//! - [`pinned`] — what runs is the pinned release (tools, policy rules, the route a host
//!   builds its model from); re-pinning ([`Runtime::repin`]).
//! - `crash` — the crash-injection hook after each commit (feature `crash-injection`, tests only).
//! - [`telemetry`] — the turn's spans (OpenTelemetry GenAI conventions: `invoke_agent`,
//!   `chat`, `execute_tool`); [`metrics`] — [`metrics::Metrics`], the Prometheus registry the
//!   runtime, the scheduler and the server record into.
//! - [`memory`] — the long-term memory tools (`memory_read`, `memory_write`, `memory_search`)
//!   a host adds to its registry ([`memory::memory_tools`]); they run in the calling session's
//!   tenant and namespace ([`keel_tools::SessionScope`], filled for every call).
//! - [`lease`], [`redact`], [`config`] ([`SessionConfig`] per session, [`RuntimeOptions`] per
//!   worker), [`error`] ([`RuntimeError`], the crate's one error type).
//!
//! ## Using it (for hosts: the CLI, the server, tests)
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn keel_store::Store>, release: keel_core::Release) -> Result<(), keel_runtime::RuntimeError> {
//! use std::sync::Arc;
//! use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
//! let model = Arc::new(keel_model::ScriptedModel::from_file("demo.jsonl").expect("script"));
//! let tools = keel_tools::ToolRegistry::with_builtins()?;
//! let rt = Runtime::new(store, model, tools, RuntimeOptions::default());
//! let tenant = keel_core::TenantId::new();
//! let session = rt.create_session(tenant, &release, SessionConfig { workspace: ".".into(), ..SessionConfig::default() }).await?;
//! rt.submit(tenant, session, "fix the failing test").await?;      // durable before anything runs
//! let mut events = rt.subscribe(tenant, session, 1).await?;         // replay + live tail
//! let outcome = rt.run(tenant, session).await?;                     // until idle / requires_action
//! for action in &outcome.pending { /* decide_approval / resolve_effect, then run again */ }
//! # let _ = (&mut events, action_demo()); Ok(()) }
//! # fn action_demo() {}
//! ```
//!
//! - [`Runtime::create_session`] pins a [`keel_core::Release`] (model route, instructions,
//!   tools, policy rules, default budget: what runs) and a [`SessionConfig`] (workspace,
//!   permission mode, `ask`/`deny` rules, sandbox, budgets, timeouts, compaction, multitask
//!   strategy, secrets) in `session.created`.
//! - [`Runtime::update_config`] changes those settings between turns (`session.config_changed`,
//!   a merge patch the fold applies; every later step on any worker uses the effective config).
//! - [`Runtime::repin`] changes the release between turns (`session.release_pinned`, naming
//!   the old and the new one); [`Runtime::pinned_release`] is the release to build the model
//!   from.
//! - [`Runtime::submit`] journals `turn.queued` first (multitask `enqueue` / `reject` /
//!   `interrupt`); [`Runtime::submit_opts`] also sets the turn's scheduling priority.
//! - [`Runtime::run_claimed`] runs a session a scheduler claimed, under the claim's lease, and
//!   stops at the next durable boundary when drained ([`RunOutcome::drained`]).
//! - [`Runtime::run`] runs until `idle` or `requires_action` and returns a [`RunOutcome`]: the
//!   session status, the turns that finished (each a [`TurnOutcome`] with terminal reason, usage,
//!   cost, steps, duration and final text) and, for `requires_action`, the [`PendingAction`]s.
//! - [`Runtime::decide_approval`] (approval id, decision, the args hash shown) and
//!   [`Runtime::resolve_effect`] (`committed` / `failed` / `retry`) answer them; then `run` again
//!   — on any worker.
//! - [`Runtime::cancel_turn`] (durable `turn.cancel_requested`) and
//!   [`Runtime::cancel_tool_call`].
//! - [`Runtime::close_session`] ends a session for good (`session.status_changed(closed)`;
//!   refused while a turn is open or a worker runs it); a closed session takes no input.
//! - `submit`, `cancel_turn` and `cancel_tool_call` work from **any process**: when another live
//!   worker runs the session they post a durable intent that worker handles within moments
//!   (see [`intent`]); no caller waits out a lease.
//! - [`Runtime::subscribe`] from any sequence number; [`Runtime::view`] and
//!   [`Runtime::project_context`] for inspection.
//!
//! ## Recovery
//! Not a separate code path: a worker that starts (or takes over a lease) folds the journal and
//! asks the planner, which answers from the state exactly as it would have before the crash: succeeded calls are reused; cancelled calls stay cancelled; a read-only call
//! left running is re-run; a side-effecting call left dispatched becomes `outcome_unknown` and
//! is reconciled by its tool (`Tool::reconcile_call`, e.g. `write_file`/`edit_file` from the
//! file hashes recorded in the intent) or put to a human (`requires_action`); an idempotent
//! write without a check is dispatched again; a step that was streaming is re-sampled (same step,
//! next attempt) with the same scripted position, because the position is journaled
//! (`responses_consumed` on step events).
//!
//! ## Fault injection
//! Only in builds with the `crash-injection` feature (keel-runtime's own tests; never a host's
//! normal or release build, see [`CRASH_INJECTION`]): `KEEL_CRASH_AT=<n>` kills the process
//! (`kill -9`) right after its n-th journal commit; `KEEL_CRASH_LOG=<file>` logs `<n> <site>`
//! for every commit (see `crash`).

// Reading order: the API hosts call, the driver and its planner inputs, the phase modules,
// then the journal and what everything stands on. (Blank lines keep rustfmt from sorting.)
pub mod runtime;

pub(crate) mod creation;

pub(crate) mod control;

pub(crate) mod inspect;

pub(crate) mod driver;

pub(crate) mod background;

pub(crate) mod facts;

pub(crate) mod sampling;

pub(crate) mod proposal;

pub(crate) mod admission;

pub(crate) mod authorize;

pub(crate) mod tools;

pub(crate) mod approvals;

pub(crate) mod recovery;

pub(crate) mod compaction;

pub mod hooks;

pub mod budgets;

pub(crate) mod turn_end;

pub(crate) mod progress;

pub mod intent;

pub mod input;

pub(crate) mod hold;

pub(crate) mod shared;
/// The tools a step sees (built-ins plus a release's MCP tools).
pub(crate) mod tool_catalog;
/// The tool lists steps show the model, built once per registry and shared.
pub(crate) mod tool_schemas;

pub(crate) mod effects;

pub mod transcript;

pub mod journal;

pub mod projection;

pub mod context;

pub mod tokens;

pub mod subscribe;

pub mod lease;

pub mod scheduler;

pub mod redact;

pub mod memory;

pub mod seal;

pub(crate) mod secrets;

pub mod pinned;

pub mod config;

pub mod metrics;

pub mod telemetry;

pub mod error;

pub(crate) mod crash;
/// The budget a sub-agent tree shares while it runs.
pub(crate) mod spend;
/// `spawn_agent`: child sessions.
pub mod subagents;

#[cfg(test)]
pub(crate) mod test_support;

pub use config::{
    DEFAULT_SUBAGENT_MAX_DESCENDANTS, MAX_PRIORITY, MAX_SPAWN_PROMPT_BYTES, MIN_PRIORITY,
    ModelFactory, MultitaskStrategy, RuntimeOptions, SessionConfig, SubagentLink, SubagentOptions,
    SubmitOptions, TokenRate,
};
pub use context::ContextSnapshot;
pub use crash::CRASH_INJECTION;
pub use error::{Result, RuntimeError};
pub use journal::TurnOutcome;
pub use pinned::Repin;
pub use proposal::MAX_ARGUMENT_DEPTH;
pub use redact::{REDACTED, Redactor};
pub use runtime::{PendingAction, PendingSubagent, RunOutcome, Runtime, SessionView};
pub use secrets::host_redactor;
pub use subscribe::{Delta, DeltaKind, Subscription, SubscriptionItem};
