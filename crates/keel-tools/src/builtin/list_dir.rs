use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{parse_args, resolve};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};

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
        if !resolved.absolute.is_dir() {
            return ToolOutput::error(format!(
                "list_dir failed: `{shown}` is a file, not a directory; use read_file to read it"
            ));
        }
        let mut reader = match tokio::fs::read_dir(&resolved.absolute).await {
            Ok(r) => r,
            Err(e) => {
                return ToolOutput::error(format!("list_dir failed: cannot read `{shown}`: {e}"));
            }
        };
        let mut entries = Vec::new();
        loop {
            match reader.next_entry().await {
                Ok(Some(entry)) => {
                    let name = crate::workspace::name_text(&entry.file_name());
                    let rel = if shown == "." {
                        name.clone()
                    } else {
                        format!("{shown}/{name}")
                    };
                    if ctx.snapshot.policy.is_path_denied("list_dir", &rel) {
                        continue;
                    }
                    let suffix = match entry.file_type().await {
                        Ok(t) if t.is_symlink() => "@",
                        Ok(t) if t.is_dir() => "/",
                        _ => "",
                    };
                    entries.push(format!("{name}{suffix}"));
                }
                Ok(None) => break,
                Err(e) => {
                    return ToolOutput::error(format!(
                        "list_dir failed: cannot read `{shown}`: {e}"
                    ));
                }
            }
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
