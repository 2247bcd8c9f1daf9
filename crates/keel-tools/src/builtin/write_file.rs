use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{blocking, file_failure, file_probe, parse_args, reconcile_path_call, resolve};
use crate::error::{FileProblem, ToolsError};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, ReconcileOutcome, Tool, ToolContext, ToolOutput};
use crate::workspace::beneath::EntryKind;
use crate::workspace::{ResolvedPath, Workspace};

/// `write_file {path, content}`: writes `content` byte-for-byte (no newline added or changed),
/// creating parent directories; replaces an existing file.
#[derive(Debug, Default, Clone, Copy)]
pub struct WriteFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Write a file in the workspace with exactly the given content (replacing it if it exists, \
         creating parent directories). Prefer edit_file for changing part of an existing file."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the workspace root."},
                "content": {"type": "string", "description": "The complete new content of the file."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::IdempotentWrite
    }

    fn subject(&self, args: &Value) -> Subject {
        let path = args.get("path").and_then(Value::as_str).unwrap_or_default();
        Subject::Paths(vec![PathAccess::write(path)])
    }

    fn can_reconcile(&self) -> bool {
        true
    }

    /// The file's hash before and the hash `content` gives it.
    async fn prepare(&self, args: &Value, ctx: &ToolContext) -> Option<Value> {
        let args: Args = parse_args(self.name(), args.clone()).ok()?;
        let resolved = resolve("write_file", ctx, &args.path).ok()?;
        Some(file_probe(ctx, &resolved, args.content.as_bytes()).await)
    }

    async fn reconcile_call(
        &self,
        _operation_key: &str,
        arguments: &Value,
        probe: Option<&Value>,
        ctx: &ToolContext,
    ) -> ReconcileOutcome {
        reconcile_path_call("write_file", arguments, probe, ctx).await
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let resolved = match resolve("write_file", ctx, &args.path) {
            Ok(r) => r,
            Err(out) => return out,
        };
        let shown = resolved.relative.clone();
        let ws = ctx.workspace.clone();
        let content = args.content.into_bytes();
        let len = content.len();
        let written = blocking("write_file", move || write(&ws, &resolved, &content)).await;
        match written {
            Ok(Ok(created)) => ToolOutput::success(format!(
                "{} `{shown}` ({len} bytes)",
                if created { "Created" } else { "Overwrote" },
            ))
            .with_details(json!({"bytes": len, "created": created})),
            Ok(Err(out)) | Err(out) => out,
        }
    }
}

/// Writes `content` to the regular file at `resolved` atomically (the old content or the new,
/// never a mix: [`Workspace::replace_file`]), creating it and its parent directories as
/// needed, everything beneath the workspace root's handle (see
/// [`crate::workspace::beneath`]): a symlink swapped in after the check is refused, a FIFO or
/// device is refused without being written. Whether the file was created, or the output to
/// give: not performed when nothing was written, failed when the write itself failed.
fn write(ws: &Workspace, resolved: &ResolvedPath, content: &[u8]) -> Result<bool, ToolOutput> {
    let shown = &resolved.relative;
    let not_performed = |e: &ToolsError| ToolOutput::not_performed(file_failure("write_file", e));
    match ws.kind_beneath(&resolved.beneath, shown) {
        Ok(Some(EntryKind::Dir)) => {
            return Err(ToolOutput::not_performed(format!(
                "write_file failed: `{shown}` is a directory; give a file path inside it"
            )));
        }
        Ok(_) => {}
        // A parent that does not exist yet is created below.
        Err(ToolsError::FileUse {
            problem: FileProblem::NotFound,
            ..
        }) => {}
        Err(e) => return Err(not_performed(&e)),
    }
    if let Some(parent) = resolved.beneath.parent()
        && let Err(e) = ws.create_dirs(parent, shown)
    {
        return Err(ToolOutput::not_performed(match e {
            ToolsError::FileUse {
                problem: FileProblem::Io(e),
                ..
            } => format!("write_file failed: cannot create the parent directory of `{shown}`: {e}"),
            e => file_failure("write_file", &e),
        }));
    }
    ws.replace_file(&resolved.beneath, shown, content, true)
        .map_err(|e| match e {
            ToolsError::FileUse {
                problem: FileProblem::Io(e),
                ..
            } => ToolOutput::error(format!("write_file failed: cannot write `{shown}`: {e}")),
            e => not_performed(&e),
        })
}
