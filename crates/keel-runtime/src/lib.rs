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
//! ## Layout
//! - [`runtime`] — [`Runtime`], the API hosts call. Start reading here.
//! - [`turn`] — the loop: turns, steps, tools, compaction, budgets, recovery.
//! - `effects` — the store's effects table written beside the journal; duplicate-dispatch
//!   detection by operation key.
//! - [`intent`] — durable intents: input and cancellations from processes that do not run the
//!   session.
//! - [`journal`] — [`journal::Journal::append`], the one place the runtime writes events (CAS on
//!   version + lease epoch), and [`journal::Projection`], the model-visible transcript.
//! - [`context`] — [`ContextSnapshot`]: what a step shows the model; token estimates.
//! - [`subscribe`] — [`Subscription`]: replay + live tail + bounded ephemeral deltas.
//! - [`redact`] — [`Redactor`].
//! - [`lease`] — lease owner strings, take-over of dead local workers, heartbeats.
//! - [`config`] — [`SessionConfig`] (pinned per session), [`RuntimeOptions`] (per worker).
//! - [`error`] — [`RuntimeError`], the crate's one error type.
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
//! - [`Runtime::create_session`] pins a [`keel_core::Release`] and a [`SessionConfig`]
//!   (workspace, permission mode and rules, sandbox, budgets, timeouts, compaction, multitask
//!   strategy, secrets) in `session.created`.
//! - [`Runtime::update_config`] changes those settings between turns (`session.config_changed`,
//!   a merge patch the fold applies; every later step on any worker uses the effective config).
//! - [`Runtime::submit`] journals `turn.queued` first (multitask `enqueue` / `reject` /
//!   `interrupt`).
//! - [`Runtime::run`] runs until `idle` or `requires_action` and returns a [`RunOutcome`]: the
//!   session status, the turns that finished (each a [`TurnOutcome`] with terminal reason, usage,
//!   cost, steps, duration and final text) and, for `requires_action`, the [`PendingAction`]s.
//! - [`Runtime::decide_approval`] (approval id, decision, the args hash shown) and
//!   [`Runtime::resolve_effect`] (`committed` / `failed` / `retry`) answer them; then `run` again
//!   — on any worker.
//! - [`Runtime::cancel_turn`] (durable `turn.cancel_requested`) and
//!   [`Runtime::cancel_tool_call`].
//! - `submit`, `cancel_turn` and `cancel_tool_call` work from **any process**: when another live
//!   worker runs the session they post a durable intent that worker handles within moments
//!   (see [`intent`]); no caller waits out a lease.
//! - [`Runtime::subscribe`] from any sequence number; [`Runtime::view`] and
//!   [`Runtime::project_context`] for inspection.
//!
//! ## Recovery
//! A worker that starts (or takes over a lease) folds the journal and continues from where the
//! active turn is: succeeded calls are reused; cancelled calls stay cancelled; a read-only call
//! left running is re-run; a side-effecting call left dispatched becomes `outcome_unknown` and
//! is reconciled by its tool (`Tool::reconcile`) or put to a human (`requires_action`); an
//! idempotent write is dispatched again; a step that was streaming is re-sampled (same step,
//! next attempt) with the same scripted position, because the position is journaled
//! (`responses_consumed` on step events).
//!
//! ## Fault injection
//! `KEEL_CRASH_AT=<n>` kills the process (`kill -9`) right after its n-th journal append;
//! `KEEL_CRASH_LOG=<file>` logs `<n> <site>` for every append (see [`journal`]).

pub mod config;
pub mod context;
pub(crate) mod effects;
pub mod error;
pub mod intent;
pub mod journal;
pub mod lease;
pub mod redact;
pub mod runtime;
pub mod subscribe;
pub mod turn;

pub use config::{MultitaskStrategy, RuntimeOptions, SessionConfig};
pub use context::ContextSnapshot;
pub use error::{Result, RuntimeError};
pub use journal::TurnOutcome;
pub use redact::{REDACTED, Redactor};
pub use runtime::{PendingAction, RunOutcome, Runtime, SessionView};
pub use subscribe::{Delta, DeltaKind, Subscription, SubscriptionItem};
