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
    /// A workspace file could not be used as the tool asked. Found at use time, on the open
    /// handle (after [`ToolsError::PathRefused`] checks passed), e.g. a FIFO where a regular file
    /// is expected.
    #[error("`{path}` {problem}")]
    FileUse {
        /// The path as shown to the model (workspace-relative).
        path: String,
        /// What is wrong with it.
        problem: FileProblem,
    },
    /// The requested sandbox cannot be set up (a layer the kernel lacks, a missing or
    /// mismatched launcher: `reason` names it); nothing was run.
    #[error("sandbox `{mode}` is unavailable: {reason}")]
    SandboxUnavailable {
        /// The requested mode (`read_only` or `workspace_write`).
        mode: String,
        /// What is missing: the kernel's layer, or the launcher's problem.
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

/// Why a workspace file could not be used ([`ToolsError::FileUse`]); each reads as the end of
/// "`path` …".
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// Nothing exists at the path (at use time).
    #[error("does not exist")]
    NotFound,
    /// A directory where a file was expected.
    #[error("is a directory")]
    IsDirectory,
    /// A file (or something else) where a directory was expected.
    #[error("is not a directory")]
    NotDirectory,
    /// A FIFO, socket, device or symlink where a regular file was expected. It was not read or
    /// written (a FIFO would block forever, a device could be read without end).
    #[error("is {kind}, not a regular file; the file tools only read and write regular files")]
    NotRegular {
        /// What it is instead, with its article: `a FIFO`, `a socket`, `a character device`,
        /// `a block device`, `a symlink`.
        kind: &'static str,
    },
    /// Larger than the tool reads.
    #[error("is {size} bytes, larger than the {limit}-byte limit")]
    TooLarge {
        /// Its size in bytes (from `fstat` on the open handle).
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// Any other I/O failure.
    #[error("cannot be used: {0}")]
    Io(#[source] std::io::Error),
}
