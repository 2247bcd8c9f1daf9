//! The crate's one error type.
//!
//! Most failures a model can cause (bad arguments, a path outside the workspace, a missing file) are
//! *not* errors of this type: they become a [`crate::ToolResult`] with status `failed` or `rejected`
//! that the model reads and recovers from. [`ToolsError`] is for callers of the crate (the runtime):
//! misconfiguration, an unavailable sandbox, storage failures, approval misuse.

use std::path::PathBuf;

/// Everything that can go wrong in `keel-tools` that is the caller's concern rather than the model's.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// Two tools with the same name were registered.
    #[error("tool `{name}` is already registered; tool names must be unique")]
    DuplicateTool {
        /// The clashing tool name.
        name: String,
    },
    /// A tool's input schema could not be compiled or is not strict.
    #[error("tool `{tool}` declares an invalid input schema: {reason}")]
    InvalidSchema {
        /// The tool whose schema is wrong.
        tool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A policy rule string could not be parsed.
    #[error("invalid policy rule `{rule}`: {reason}")]
    InvalidRule {
        /// The rule as written, e.g. `shell(cargo test *`.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The workspace root does not exist or cannot be canonicalized.
    #[error("workspace root {path} is unusable: {source}")]
    WorkspaceRoot {
        /// The root as given.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A path resolves outside the workspace (`..`, an absolute path elsewhere, a symlink pointing
    /// out) or cannot be resolved at all.
    #[error("path `{path}` refused: {reason}")]
    PathRefused {
        /// The path as the caller gave it.
        path: String,
        /// Why it was refused, phrased for a model to act on.
        reason: String,
    },
    /// The requested sandbox cannot be enforced on this kernel; nothing was run.
    #[error("sandbox `{mode}` is unavailable on this system: {reason}")]
    SandboxUnavailable {
        /// The requested mode (`read_only` or `workspace_write`).
        mode: String,
        /// What the kernel lacks.
        reason: String,
    },
    /// An artifact could not be stored or read.
    #[error("artifact `{id}`: {reason}")]
    Artifact {
        /// The artifact id (or the name being created).
        id: String,
        /// What went wrong.
        reason: String,
    },
    /// No approval with this id exists.
    #[error("approval `{approval_id}` does not exist")]
    ApprovalNotFound {
        /// The id asked for.
        approval_id: String,
    },
    /// A decision was made for arguments other than the ones the approval was requested for.
    #[error(
        "approval `{approval_id}` was requested for arguments with hash {expected}, but the decision names hash {actual}; decide on the exact arguments shown"
    )]
    ApprovalArgsMismatch {
        /// The approval.
        approval_id: String,
        /// Hash stored with the approval.
        expected: String,
        /// Hash presented with the decision.
        actual: String,
    },
    /// A second, different decision was made on an approval that is already decided.
    #[error("approval `{approval_id}` is already {status}; a different decision cannot replace it")]
    ApprovalConflict {
        /// The approval.
        approval_id: String,
        /// Its current terminal status.
        status: String,
    },
    /// A decision arrived after the approval expired.
    #[error(
        "approval `{approval_id}` expired at {expired_at_ms} ms since the epoch; the call was rejected"
    )]
    ApprovalExpired {
        /// The approval.
        approval_id: String,
        /// When it expired (milliseconds since the Unix epoch).
        expired_at_ms: i64,
    },
    /// The store (approvals, artifacts) failed.
    #[error("store: {0}")]
    Store(#[source] keel_store::StoreError),
    /// An I/O error outside any tool call (for example creating the sandbox's temp dir).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}
