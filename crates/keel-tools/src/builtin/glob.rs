use async_trait::async_trait;
use globset::GlobBuilder;
use serde::Deserialize;
use serde_json::{Value, json};

use super::walk::{WalkEnd, walk_files};
use super::{blocking, file_failure, parse_args, resolve};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};

/// `glob {pattern, path?}`: files under `path` (default the workspace root) whose path relative to
/// it matches `pattern` (`*` stays within a directory, `**` crosses directories). Honours
/// `.gitignore` (also outside a git repository), `.ignore` and `.git/info/exclude`; hidden files
/// are included, `.git` is not. Results are workspace-relative and sorted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Glob;

#[derive(Deserialize)]
struct Args {
    pattern: String,
    path: Option<String>,
}

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> &str {
        "Find files by glob pattern (e.g. \"**/*.rs\", \"src/*.toml\") relative to path (default the \
         workspace root). Files ignored by .gitignore are skipped."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Glob pattern matched against paths relative to `path`."},
                "path": {"type": "string", "description": "Directory to search, relative to the workspace root (default \".\")."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }

    fn subject(&self, args: &Value) -> Subject {
        let path = args.get("path").and_then(Value::as_str).unwrap_or(".");
        Subject::Paths(vec![PathAccess::read(path)])
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let pattern = args
            .pattern
            .strip_prefix("./")
            .unwrap_or(&args.pattern)
            .to_owned();
        let matcher = match GlobBuilder::new(&pattern).literal_separator(true).build() {
            Ok(g) => g.compile_matcher(),
            Err(e) => {
                return ToolOutput::error(format!(
                    "glob failed: invalid pattern `{}`: {e}",
                    args.pattern
                ));
            }
        };
        let base = match resolve("glob", ctx, args.path.as_deref().unwrap_or(".")) {
            Ok(r) => r,
            Err(out) => return out,
        };
        if !base.exists || !base.absolute.is_dir() {
            return ToolOutput::error(format!(
                "glob failed: `{}` is not an existing directory; give a directory relative to the workspace root, or leave path out to search the whole workspace",
                base.relative
            ));
        }
        let ctx2 = ctx.clone();
        let max = ctx.limits.max_listing_entries;
        let walked = blocking("glob", move || {
            let ws = &ctx2.workspace;
            let mut found = Vec::new();
            let end = walk_files(ws, &base.beneath, None, &ctx2.cancel, |rel| {
                let Ok(rel_to_base) = rel.strip_prefix(&base.beneath) else {
                    return;
                };
                if !matcher.is_match(rel_to_base) {
                    return;
                }
                let rel = ws.display_relative(&ws.root().join(rel));
                if ctx2.snapshot.policy.is_path_denied("glob", &rel) {
                    return;
                }
                found.push(rel);
            })?;
            Ok::<_, crate::ToolsError>((end, found))
        })
        .await;
        let mut found = match walked {
            Ok(Ok((WalkEnd::Done, found))) => found,
            Ok(Ok((WalkEnd::Cancelled, _))) => return ToolOutput::cancelled("glob was cancelled"),
            Ok(Err(e)) => return ToolOutput::error(file_failure("glob", &e)),
            Err(out) => return out,
        };
        found.sort();
        let total = found.len();
        if total == 0 {
            return ToolOutput::success(format!("No files match `{}`", args.pattern))
                .with_details(json!({"matches": 0}));
        }
        let mut out = found.into_iter().take(max).collect::<Vec<_>>().join("\n");
        out.push('\n');
        if total > max {
            out.push_str(&format!(
                "… ({total} files match, showing the first {max}; narrow the pattern or path)\n"
            ));
        }
        ToolOutput::success(out).with_details(json!({"matches": total}))
    }
}
