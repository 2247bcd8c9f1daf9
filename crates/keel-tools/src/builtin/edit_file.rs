use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    blocking, clip_line, file_failure, file_probe, parse_args, reconcile_path_call, resolve,
};
use crate::error::{FileProblem, ToolsError};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, ReconcileOutcome, Tool, ToolContext, ToolOutput};
use crate::workspace::ResolvedPath;

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

    fn can_reconcile(&self) -> bool {
        true
    }

    /// The file's hash before and the hash the edit gives it (nothing when the edit would fail).
    async fn prepare(&self, args: &Value, ctx: &ToolContext) -> Option<Value> {
        let args: Args = parse_args(self.name(), args.clone()).ok()?;
        let (resolved, plan) = plan_edit(&args, ctx).await.ok()?;
        Some(file_probe(ctx, &resolved, plan.updated.as_bytes()).await)
    }

    async fn reconcile_call(
        &self,
        _operation_key: &str,
        arguments: &Value,
        probe: Option<&Value>,
        ctx: &ToolContext,
    ) -> ReconcileOutcome {
        reconcile_path_call("edit_file", arguments, probe, ctx).await
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let (resolved, plan) = match plan_edit(&args, ctx).await {
            Ok(p) => p,
            Err(out) => return out,
        };
        let shown = resolved.relative.clone();
        let EditPlan {
            updated,
            count,
            first_at,
            new_len,
        } = plan;
        let ws = ctx.workspace.clone();
        let written = blocking("edit_file", move || {
            // The file must still be a regular file (beneath the root, never through a
            // symlink, never created: it was read a moment ago); replaced atomically.
            ws.replace_file(
                &resolved.beneath,
                &resolved.relative,
                updated.as_bytes(),
                false,
            )
            .map_err(|e| match e {
                ToolsError::FileUse {
                    problem: FileProblem::Io(e),
                    ..
                } => ToolOutput::error(format!(
                    "edit_file failed: cannot write `{}`: {e}",
                    resolved.relative
                )),
                e => ToolOutput::not_performed(file_failure("edit_file", &e)),
            })?;
            Ok(updated)
        })
        .await;
        match written {
            Ok(Ok(updated)) => {
                let snippet = snippet(&updated, first_at, new_len);
                ToolOutput::success(format!(
                    "Edited `{shown}`: replaced {count} occurrence{}. The edited region{} now reads:\n{snippet}",
                    if count == 1 { "" } else { "s" },
                    if count == 1 { "" } else { " (first occurrence)" },
                ))
                .with_details(json!({"replacements": count}))
            }
            Ok(Err(out)) | Err(out) => out,
        }
    }
}

/// What an edit will do: the file's new text, how many replacements, where the first lands and
/// the length of the replacement text.
struct EditPlan {
    updated: String,
    count: usize,
    first_at: usize,
    new_len: usize,
}

/// Checks an edit and computes its result without writing (shared by the call and its probe).
async fn plan_edit(args: &Args, ctx: &ToolContext) -> Result<(ResolvedPath, EditPlan), ToolOutput> {
    if args.old_string.is_empty() {
        return Err(ToolOutput::not_performed(
            "edit_file failed: old_string is empty; give the exact text to replace, or use write_file to create a file",
        ));
    }
    if args.old_string == args.new_string {
        return Err(ToolOutput::not_performed(
            "edit_file failed: old_string and new_string are identical; nothing would change",
        ));
    }
    let resolved = resolve("edit_file", ctx, &args.path)?;
    let shown = resolved.relative.clone();
    if !resolved.exists {
        return Err(ToolOutput::not_performed(format!(
            "edit_file failed: `{shown}` does not exist; use write_file to create it"
        )));
    }
    let ws = ctx.workspace.clone();
    let (rel, shown2) = (resolved.beneath.clone(), shown.clone());
    let bytes = match blocking("edit_file", move || {
        ws.read_regular(&rel, &shown2, MAX_EDIT_BYTES)
    })
    .await?
    {
        Ok(b) => b,
        Err(ToolsError::FileUse {
            problem: FileProblem::IsDirectory,
            ..
        }) => {
            return Err(ToolOutput::not_performed(format!(
                "edit_file failed: `{shown}` is a directory; give the path of a file inside it"
            )));
        }
        Err(ToolsError::FileUse {
            problem: FileProblem::NotFound,
            ..
        }) => {
            return Err(ToolOutput::not_performed(format!(
                "edit_file failed: `{shown}` does not exist; use write_file to create it"
            )));
        }
        Err(e) => return Err(ToolOutput::not_performed(file_failure("edit_file", &e))),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(ToolOutput::not_performed(format!(
            "edit_file failed: `{shown}` is not UTF-8 text; edit_file only edits text files"
        )));
    };
    let (old_string, new_string, count) = match_edit(&text, &args.old_string, &args.new_string);
    if count == 0 {
        return Err(ToolOutput::not_performed(format!(
            "edit_file failed: old_string was not found in `{shown}` (0 matches); read the file again and copy the exact text, including whitespace and indentation"
        )));
    }
    if count > 1 && !args.replace_all {
        return Err(ToolOutput::not_performed(format!(
            "edit_file failed: old_string matches {count} times in `{shown}`; include more surrounding lines to make it unique, or set replace_all to true to replace all {count}"
        )));
    }
    // Where the (first) replacement lands, for the snippet shown back.
    let first_at = text.find(old_string.as_str()).unwrap_or(0);
    let updated = if args.replace_all {
        text.replace(old_string.as_str(), &new_string)
    } else {
        text.replacen(old_string.as_str(), &new_string, 1)
    };
    Ok((
        resolved,
        EditPlan {
            updated,
            count,
            first_at,
            new_len: new_string.len(),
        },
    ))
}

/// Finds `old` in `text`; returns the strings to use and how often they occur. When the exact text
/// does not occur but the file uses CRLF line endings and `old` has bare `\n` (as `read_file` shows
/// lines without their `\r`), the CRLF forms of `old` and `new` are used, so the file keeps its
/// line endings byte-for-byte.
fn match_edit(text: &str, old: &str, new: &str) -> (String, String, usize) {
    let count = text.matches(old).count();
    if count == 0 && text.contains("\r\n") && old.contains('\n') && !old.contains('\r') {
        let old_crlf = old.replace('\n', "\r\n");
        let crlf_count = text.matches(old_crlf.as_str()).count();
        if crlf_count > 0 {
            let new_crlf = if new.contains('\r') {
                new.to_owned()
            } else {
                new.replace('\n', "\r\n")
            };
            return (old_crlf, new_crlf, crlf_count);
        }
    }
    (old.to_owned(), new.to_owned(), count)
}

/// Lines around the replacement that starts at byte `at` and is `len` bytes long, numbered like
/// `read_file` output (at most [`SNIPPET_CONTEXT_LINES`] lines of context on each side and
/// [`SNIPPET_MAX_LINES`] lines in all).
fn snippet(text: &str, at: usize, len: usize) -> String {
    let first = text
        .get(..at)
        .map_or(0, |before| before.matches('\n').count());
    let last = text
        .get(..(at + len).min(text.len()))
        .map_or(first, |upto| upto.matches('\n').count());
    let lines: Vec<&str> = text.lines().collect();
    let start = first.saturating_sub(SNIPPET_CONTEXT_LINES);
    let end = (last + SNIPPET_CONTEXT_LINES + 1)
        .min(lines.len())
        .min(start + SNIPPET_MAX_LINES);
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate().take(end).skip(start) {
        out.push_str(&format!("{:>6}\t{}\n", i + 1, clip_line(line, 500)));
    }
    if out.is_empty() {
        out.push_str("(the file is now empty)\n");
    }
    out
}

/// Largest file edited, in bytes (as `read_file` reads).
const MAX_EDIT_BYTES: u64 = 256 * 1024 * 1024;

/// Context lines shown before and after an edit.
const SNIPPET_CONTEXT_LINES: usize = 4;
/// Most lines shown after an edit.
const SNIPPET_MAX_LINES: usize = 40;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crlf_files_are_matched_with_lf_old_strings_and_keep_crlf() {
        let (old, new, n) = match_edit("a\r\nb\r\nc\r\n", "a\nb", "a\nx\ny");
        assert_eq!(
            (old.as_str(), new.as_str(), n),
            ("a\r\nb", "a\r\nx\r\ny", 1)
        );
        let (old, _, n) = match_edit("a\nb\n", "a\nb", "z");
        assert_eq!((old.as_str(), n), ("a\nb", 1));
    }

    #[test]
    fn snippet_shows_numbered_context_around_the_edit() {
        let text = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n";
        let at = text.find("6").unwrap_or(0);
        assert_eq!(
            snippet(text, at, 1),
            "     2\t2\n     3\t3\n     4\t4\n     5\t5\n     6\t6\n     7\t7\n     8\t8\n     9\t9\n    10\t10\n"
        );
        assert_eq!(snippet("", 0, 0), "(the file is now empty)\n");
    }
}
