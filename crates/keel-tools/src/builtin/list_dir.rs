use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{blocking, file_failure, parse_args, resolve};
use crate::error::{FileProblem, ToolsError};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use crate::workspace::beneath::EntryKind;

/// `list_dir {path}`: the entries of one directory, sorted by name, directories with a trailing
/// `/`, symlinks with a trailing `@`. Entries denied by a path rule are left out.
#[derive(Debug, Default, Clone, Copy)]
pub struct ListDir;

#[derive(Deserialize)]
struct Args {
    path: String,
}

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "List the entries of a workspace directory (directories end with /). Use \".\" for the workspace root."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory path relative to the workspace root (\".\" for the root)."}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }

    fn subject(&self, args: &Value) -> Subject {
        let path = args.get("path").and_then(Value::as_str).unwrap_or_default();
        Subject::Paths(vec![PathAccess::read(path)])
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let resolved = match resolve("list_dir", ctx, &args.path) {
            Ok(r) => r,
            Err(out) => return out,
        };
        let shown = resolved.relative.clone();
        if !resolved.exists {
            return ToolOutput::error(format!(
                "list_dir failed: `{shown}` does not exist; list its parent directory or use glob to find it"
            ));
        }
        // Listed from a handle opened beneath the workspace root, never through a symlink.
        let ws = ctx.workspace.clone();
        let listed = match blocking("list_dir", move || {
            ws.list_beneath(&resolved.beneath, &resolved.relative)
        })
        .await
        {
            Ok(Ok(listed)) => listed,
            Ok(Err(ToolsError::FileUse {
                problem: FileProblem::NotDirectory,
                ..
            })) => {
                return ToolOutput::error(format!(
                    "list_dir failed: `{shown}` is a file, not a directory; use read_file to read it"
                ));
            }
            Ok(Err(ToolsError::FileUse {
                problem: FileProblem::NotFound,
                ..
            })) => {
                return ToolOutput::error(format!(
                    "list_dir failed: `{shown}` does not exist; list its parent directory or use glob to find it"
                ));
            }
            Ok(Err(e)) => return ToolOutput::error(file_failure("list_dir", &e)),
            Err(out) => return out,
        };
        let mut entries = Vec::new();
        for entry in listed {
            let name = crate::workspace::name_text(&entry.name);
            let rel = if shown == "." {
                name.clone()
            } else {
                format!("{shown}/{name}")
            };
            if ctx.snapshot.policy.is_path_denied("list_dir", &rel) {
                continue;
            }
            let suffix = match entry.kind {
                EntryKind::Symlink => "@",
                EntryKind::Dir => "/",
                _ => "",
            };
            entries.push(format!("{name}{suffix}"));
        }
        entries.sort();
        let total = entries.len();
        if total == 0 {
            return ToolOutput::success(format!("(`{shown}` is empty)"));
        }
        let max = ctx.limits.max_listing_entries;
        let mut out = entries.into_iter().take(max).collect::<Vec<_>>().join("\n");
        out.push('\n');
        if total > max {
            out.push_str(&format!("… ({total} entries, showing the first {max})\n"));
        }
        ToolOutput::success(out).with_details(json!({"entries": total}))
    }
}
