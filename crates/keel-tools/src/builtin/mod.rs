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
pub use grep::Grep;
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
        .map_err(|e| ToolOutput::error(format!("{tool} failed: {e}")))
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
