use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{file_probe, parse_args, reconcile_path_call, resolve};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, ReconcileOutcome, Tool, ToolContext, ToolOutput};

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
        Some(file_probe(&resolved.absolute, args.content.as_bytes()).await)
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
        let shown = &resolved.relative;
        if resolved.absolute.is_dir() {
            return ToolOutput::not_performed(format!(
                "write_file failed: `{shown}` is a directory; give a file path inside it"
            ));
        }
        if let Some(parent) = resolved.absolute.parent()
            && let Err(e) = tokio::fs::create_dir_all(parent).await
        {
            return ToolOutput::not_performed(format!(
                "write_file failed: cannot create the parent directory of `{shown}`: {e}"
            ));
        }
        let existed = resolved.exists;
        match tokio::fs::write(&resolved.absolute, args.content.as_bytes()).await {
            Ok(()) => ToolOutput::success(format!(
                "{} `{shown}` ({} bytes)",
                if existed { "Overwrote" } else { "Created" },
                args.content.len()
            ))
            .with_details(json!({"bytes": args.content.len(), "created": !existed})),
            Err(e) => ToolOutput::error(format!("write_file failed: cannot write `{shown}`: {e}")),
        }
    }
}
