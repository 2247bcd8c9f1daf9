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

/// `{"before": <hash of the file now, or null when there is none>, "after": <hash of `after`>}`:
/// the probe a file-writing tool records before it writes.
pub(crate) async fn file_probe(path: &std::path::Path, after: &[u8]) -> Value {
    let before = match tokio::fs::read(path).await {
        Ok(bytes) => Value::String(keel_core::canonical::bytes_hash(&bytes)),
        Err(_) => Value::Null,
    };
    serde_json::json!({"before": before, "after": keel_core::canonical::bytes_hash(after)})
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
    reconcile_file(tool, &resolved.absolute, &resolved.relative, probe).await
}

/// Whether a file write recorded by [`file_probe`] happened: the file has the intended hash
/// (committed), still the one before (not happened: safe to retry), or something else
/// (unknown: a human decides).
pub(crate) async fn reconcile_file(
    tool: &str,
    path: &std::path::Path,
    shown: &str,
    probe: Option<&Value>,
) -> crate::tool::ReconcileOutcome {
    use crate::tool::ReconcileOutcome;
    let Some(probe) = probe else {
        return ReconcileOutcome::Unknown;
    };
    let now = match tokio::fs::read(path).await {
        Ok(bytes) => Value::String(keel_core::canonical::bytes_hash(&bytes)),
        Err(_) => Value::Null,
    };
    if probe.get("after") == Some(&now) {
        ReconcileOutcome::Committed {
            output: ToolOutput::success(format!(
                "{tool}: `{shown}` has the intended content (checked after a crash)"
            )),
        }
    } else if probe.get("before") == Some(&now) {
        ReconcileOutcome::Failed {
            reason: format!("`{shown}` still has its earlier content"),
        }
    } else {
        ReconcileOutcome::Unknown
    }
}
