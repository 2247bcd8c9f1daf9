//! The built-in tools of a coding agent, with exactly the contract in `docs/ARCHITECTURE.md`:
//! `read_file {path, offset?, limit?}`, `write_file {path, content}`,
//! `edit_file {path, old_string, new_string, replace_all?}`, `list_dir {path}`,
//! `glob {pattern, path?}`, `grep {pattern, path?, glob?, case_insensitive?}`,
//! `shell {command, timeout_ms?, workdir?}`.

mod edit_file;
mod glob;
mod grep;
mod list_dir;
mod read_file;
mod shell;
mod walk;
mod write_file;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use edit_file::EditFile;
pub use glob::Glob;
pub use grep::{Grep, MAX_PATTERN_BYTES};
pub use list_dir::ListDir;
pub use read_file::ReadFile;
pub use shell::Shell;
pub use write_file::WriteFile;

use crate::tool::{Tool, ToolContext, ToolOutput};
use crate::workspace::ResolvedPath;

/// All built-in tools.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile),
        Arc::new(WriteFile),
        Arc::new(EditFile),
        Arc::new(ListDir),
        Arc::new(Glob),
        Arc::new(Grep),
        Arc::new(Shell),
    ]
}

/// Deserializes validated arguments; a mismatch (which validation should have caught) becomes an
/// error output rather than a panic.
pub(crate) fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(args)
        .map_err(|e| ToolOutput::rejected(format!("{tool}: invalid arguments: {e}")))
}

/// Resolves `path` in the workspace, or an error output naming the tool and the reason.
pub(crate) fn resolve(
    tool: &str,
    ctx: &ToolContext,
    path: &str,
) -> Result<ResolvedPath, ToolOutput> {
    ctx.workspace
        .resolve(path)
        .map_err(|e| ToolOutput::not_performed(format!("{tool} failed: {e}")))
}

/// Cuts `line` to at most `max` characters, saying how much was cut.
pub(crate) fn clip_line(line: &str, max: usize) -> String {
    let count = line.chars().count();
    if count <= max {
        return line.to_owned();
    }
    let kept: String = line.chars().take(max).collect();
    format!("{kept}… [line cut: {} more characters]", count - max)
}

/// Runs blocking file work (the [`crate::workspace::beneath`] operations) off the async
/// threads; a panicked or cancelled task becomes an error output naming the tool.
pub(crate) async fn blocking<T: Send + 'static>(
    tool: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ToolOutput> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ToolOutput::error(format!("{tool} failed: the file task failed: {e}")))
}

/// The hash of the regular file at `resolved` now (`null` when there is none, or when it cannot
/// be read — a FIFO or device is never read: it cannot be the target of a write either): keyed
/// with the context's hash key when `keyed`, else plain (to compare with an older probe).
async fn hash_now(ctx: &ToolContext, resolved: &ResolvedPath, keyed: bool) -> Value {
    let ws = ctx.workspace.clone();
    let (rel, shown) = (resolved.beneath.clone(), resolved.relative.clone());
    let key = keyed.then(|| ctx.hash_key.clone());
    match blocking("hash", move || ws.hash_regular(&rel, &shown, key.as_ref())).await {
        Ok(Ok(Some(hash))) => Value::String(hash),
        _ => Value::Null,
    }
}

/// `{"before": <hash of the file now, or null when there is none>, "after": <hash of `after`>}`:
/// the probe a file-writing tool records before it writes. Both are keyed hashes
/// (`hmac-sha256:…` under the deployment's key, [`crate::keyed_hash`]): the journal keeps them,
/// and a plain hash of a file holding a weak secret could be reversed by guessing. The file is
/// read beneath the workspace root like every use (a FIFO there cannot block the probe).
pub(crate) async fn file_probe(ctx: &ToolContext, resolved: &ResolvedPath, after: &[u8]) -> Value {
    let before = hash_now(ctx, resolved, true).await;
    serde_json::json!({"before": before, "after": ctx.hash_key.hash(after)})
}

/// Reconciles a file tool's call from its `path` argument and its probe (see
/// [`reconcile_file`]); arguments without a usable path are unknown.
pub(crate) async fn reconcile_path_call(
    tool: &str,
    arguments: &Value,
    probe: Option<&Value>,
    ctx: &ToolContext,
) -> crate::tool::ReconcileOutcome {
    let Some(path) = arguments.get("path").and_then(Value::as_str) else {
        return crate::tool::ReconcileOutcome::Unknown;
    };
    let Ok(resolved) = resolve(tool, ctx, path) else {
        return crate::tool::ReconcileOutcome::Unknown;
    };
    reconcile_file(tool, ctx, &resolved, probe).await
}

/// Whether a file write recorded by [`file_probe`] happened: the file has the intended hash
/// (committed), still the one before (not happened: run again), or something else
/// (unknown: a human decides). A probe of an older journal holds plain `sha256:` hashes and is
/// compared with the file's plain hash; a keyed probe made under another deployment key
/// matches nothing (unknown).
pub(crate) async fn reconcile_file(
    tool: &str,
    ctx: &ToolContext,
    resolved: &ResolvedPath,
    probe: Option<&Value>,
) -> crate::tool::ReconcileOutcome {
    use crate::tool::ReconcileOutcome;
    let Some(probe) = probe else {
        return ReconcileOutcome::Unknown;
    };
    let shown = &resolved.relative;
    let plain = probe
        .get("after")
        .and_then(Value::as_str)
        .is_some_and(|h| h.starts_with(crate::keyed_hash::PLAIN_PREFIX));
    let now = hash_now(ctx, resolved, !plain).await;
    if probe.get("after") == Some(&now) {
        ReconcileOutcome::Committed {
            output: ToolOutput::success(format!(
                "{tool}: `{shown}` has the intended content (checked after a crash)"
            )),
        }
    } else if probe.get("before") == Some(&now) {
        ReconcileOutcome::NotHappened {
            reason: format!("`{shown}` still has its earlier content"),
        }
    } else {
        ReconcileOutcome::Unknown
    }
}

/// The message for a failed use of a workspace file: `<tool> failed: ` and the error, with what
/// to do for the common cases.
pub(crate) fn file_failure(tool: &str, err: &crate::error::ToolsError) -> String {
    use crate::error::{FileProblem, ToolsError};
    let hint = match err {
        ToolsError::FileUse { problem, .. } => match problem {
            FileProblem::NotFound => "; use list_dir or glob to find the right path",
            FileProblem::IsDirectory => "; use list_dir to see its entries",
            FileProblem::NotDirectory => "; use read_file to read it",
            FileProblem::TooLarge { .. } => {
                "; use grep or shell (head, sed -n) to look at parts of it"
            }
            FileProblem::NotRegular { .. } | FileProblem::Io(_) => "",
        },
        _ => "",
    };
    format!("{tool} failed: {err}{hint}")
}
