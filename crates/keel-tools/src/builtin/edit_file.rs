use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{parse_args, resolve};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};

/// `edit_file {path, old_string, new_string, replace_all?}`: replaces the exact text `old_string`
/// with `new_string`. Without `replace_all`, `old_string` must occur exactly once; zero or several
/// matches are errors that say how many. Everything else in the file is kept byte-for-byte.
#[derive(Debug, Default, Clone, Copy)]
pub struct EditFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> &str {
        "Replace exact text in a workspace file. old_string must match the file exactly (including \
         whitespace and indentation) and, unless replace_all is true, exactly once."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the workspace root."},
                "old_string": {"type": "string", "description": "Exact text to replace."},
                "new_string": {"type": "string", "description": "Replacement text."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        // Re-applying an edit is not always a no-op (new_string may contain old_string).
        EffectClass::SideEffecting
    }

    fn subject(&self, args: &Value) -> Subject {
        let path = args.get("path").and_then(Value::as_str).unwrap_or_default();
        Subject::Paths(vec![PathAccess::write(path)])
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        if args.old_string.is_empty() {
            return ToolOutput::error(
                "edit_file failed: old_string is empty; give the exact text to replace, or use write_file to create a file",
            );
        }
        if args.old_string == args.new_string {
            return ToolOutput::error(
                "edit_file failed: old_string and new_string are identical; nothing would change",
            );
        }
        let resolved = match resolve("edit_file", ctx, &args.path) {
            Ok(r) => r,
            Err(out) => return out,
        };
        let shown = &resolved.relative;
        if !resolved.exists {
            return ToolOutput::error(format!(
                "edit_file failed: `{shown}` does not exist; use write_file to create it"
            ));
        }
        if resolved.absolute.is_dir() {
            return ToolOutput::error(format!("edit_file failed: `{shown}` is a directory"));
        }
        let bytes = match tokio::fs::read(&resolved.absolute).await {
            Ok(b) => b,
            Err(e) => {
                return ToolOutput::error(format!("edit_file failed: cannot read `{shown}`: {e}"));
            }
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return ToolOutput::error(format!(
                "edit_file failed: `{shown}` is not UTF-8 text; edit_file only edits text files"
            ));
        };
        let count = text.matches(args.old_string.as_str()).count();
        if count == 0 {
            return ToolOutput::error(format!(
                "edit_file failed: old_string was not found in `{shown}` (0 matches); read the file and copy the exact text, including whitespace and indentation"
            ));
        }
        if count > 1 && !args.replace_all {
            return ToolOutput::error(format!(
                "edit_file failed: old_string matches {count} times in `{shown}`; include more surrounding lines to make it unique, or set replace_all to true to replace all {count}"
            ));
        }
        let updated = if args.replace_all {
            text.replace(args.old_string.as_str(), &args.new_string)
        } else {
            text.replacen(args.old_string.as_str(), &args.new_string, 1)
        };
        match tokio::fs::write(&resolved.absolute, updated.as_bytes()).await {
            Ok(()) => ToolOutput::success(format!(
                "Edited `{shown}`: replaced {count} occurrence{}",
                if count == 1 { "" } else { "s" }
            ))
            .with_details(json!({"replacements": count})),
            Err(e) => ToolOutput::error(format!("edit_file failed: cannot write `{shown}`: {e}")),
        }
    }
}
