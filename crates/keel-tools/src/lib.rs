//! # keel-tools — governed tool execution
//!
//! The model only proposes; this crate decides, runs, bounds and records what a tool call does.
//!
//! **Owns:** the [`Tool`](tool::Tool) trait and what a tool gets when it runs
//! ([`ToolContext`](tool::ToolContext)); the [`ToolRegistry`](registry::ToolRegistry) every call
//! goes through (strict JSON Schema validation, authorization, execution, result budget); the
//! pure [`policy`] (permission modes, allow/ask/deny rules, shell command splitting); durable
//! [`approval`]s stored in a [`keel_store::Store`]; workspace confinement
//! ([`workspace::Workspace`]); the [`sandbox`] for `shell` (namespaces, seccomp, Landlock);
//! [`artifact`]s for full outputs; the [`builtin`] tools of a coding agent.
//!
//! **Must not touch:** the journal, sessions, turns or model calls (that is `keel-runtime`), SQL
//! or any backend (approvals and artifacts reach storage only through the `keel_store::Store`
//! trait, or a plain directory for [`artifact::FsArtifactSink`]), and nothing here changes policy
//! because of tool output.
//!
//! ## Layout
//! - [`tool`] — `Tool`, `ToolContext`, `ToolOutput`, `ToolResult`, `EffectClass`, `ToolLimits`.
//! - [`registry`] — `ToolRegistry::dispatch` (validate → authorize → execute), `apply_budget`.
//! - [`policy`] — `Policy::evaluate`, `Rule`, `PermissionMode`, [`policy::shell::analyze`].
//! - [`approval`] — `ApprovalService`: ask → pending approval → decision → run or rejected result.
//! - [`workspace`] — path checks (`Workspace::resolve`) and every file use beneath the root's
//!   handle ([`workspace::beneath`]: no symlink followed, regular files only).
//! - [`sandbox`] — `Sandbox`, `SandboxMode` (`off`, `read_only`, `workspace_write`).
//! - [`artifact`] — `ArtifactSink`, `StoreArtifactSink`, `FsArtifactSink`, `artifact://<id>` pointers.
//! - [`builtin`] — `read_file`, `write_file`, `edit_file`, `list_dir`, `glob`, `grep`, `shell`.
//! - [`error`] — `ToolsError`, the crate's one error type.
//! - [`files`] — `read_regular_file`: how keel reads its configuration, scripts and `AGENTS.md`
//!   by path (regular files only, never blocking, capped).
//!
//! Start reading at [`registry::ToolRegistry::dispatch`].

pub mod approval;
pub mod artifact;
pub mod builtin;
pub mod error;
pub mod files;
pub mod keyed_hash;
pub mod policy;
pub mod registry;
pub mod sandbox;
pub mod tool;
pub mod workspace;

pub use error::ToolsError;
pub use registry::{Dispatch, ToolCallRequest, ToolRegistry, ValidatedCall};
pub use tool::{
    CallScope, EffectClass, SecretCheck, SessionScope, Tool, ToolContext, ToolOutput, ToolProvider,
    ToolResult, ToolResultStatus, ToolSource, ToolSpec,
};
