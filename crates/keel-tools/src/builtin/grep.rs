use std::path::Path;

use async_trait::async_trait;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

use super::walk::{WalkEnd, overrides, walk_files};
use super::{blocking, clip_line, file_failure, parse_args, resolve};
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use crate::workspace::beneath::EntryKind;

/// Longest matching line shown, in characters.
const MAX_LINE_CHARS: usize = 500;

/// Longest accepted `pattern`, in bytes. A regular expression is compiled to an automaton whose
/// size and search time grow with the pattern; a multi-megabyte pattern from a model can keep a
/// search busy for minutes, so longer ones are a tool error.
pub const MAX_PATTERN_BYTES: usize = 4096;

/// `grep {pattern, path?, glob?, case_insensitive?}`: lines matching the regular expression
/// `pattern` (Rust regex syntax) in files under `path` (a file or directory, default the workspace
/// root), as `path:line:text`. `glob` filters file names like ripgrep's `-g` (`*.rs`, `!*.md`).
/// Honours `.gitignore`; binary files are skipped.
#[derive(Debug, Default, Clone, Copy)]
pub struct Grep;

#[derive(Deserialize)]
struct Args {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        "Search file contents with a regular expression (Rust regex syntax). Returns path:line:text for \
         each matching line. Optional path (file or directory), glob to filter files (e.g. \"*.rs\"), \
         case_insensitive. Files ignored by .gitignore are skipped."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression to search for."},
                "path": {"type": "string", "description": "File or directory to search, relative to the workspace root (default \".\")."},
                "glob": {"type": "string", "description": "Only search files matching this glob (e.g. \"*.rs\")."},
                "case_insensitive": {"type": "boolean", "description": "Match case-insensitively (default false)."}
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
        if args.pattern.len() > MAX_PATTERN_BYTES {
            return ToolOutput::not_performed(format!(
                "grep failed: the pattern is {} bytes; the limit is {MAX_PATTERN_BYTES} bytes, search for a shorter distinctive part",
                args.pattern.len()
            ));
        }
        let matcher = match RegexMatcherBuilder::new()
            .case_insensitive(args.case_insensitive)
            .build(&args.pattern)
        {
            Ok(m) => m,
            Err(e) => {
                return ToolOutput::error(format!(
                    "grep failed: invalid regular expression `{}`: {e}",
                    args.pattern
                ));
            }
        };
        let base = match resolve("grep", ctx, args.path.as_deref().unwrap_or(".")) {
            Ok(r) => r,
            Err(out) => return out,
        };
        if !base.exists {
            return ToolOutput::error(format!(
                "grep failed: `{}` does not exist; give a file or directory relative to the workspace root (list_dir \".\" shows the root)",
                base.relative
            ));
        }
        let overrides = match &args.glob {
            Some(glob) => match overrides(&base.absolute, glob) {
                Ok(o) => Some(o),
                Err(e) => return ToolOutput::error(format!("grep failed: {e}")),
            },
            None => None,
        };
        let ctx2 = ctx.clone();
        let max = ctx.limits.max_listing_entries;
        let searched = blocking("grep", move || {
            let ws = &ctx2.workspace;
            let mut searcher = SearcherBuilder::new()
                .line_number(true)
                .binary_detection(BinaryDetection::quit(0))
                .build();
            let mut lines = Vec::new();
            let mut total = 0usize;
            let mut search = |rel: &Path| {
                if ctx2.cancel.is_cancelled() {
                    return;
                }
                let rel_shown = ws.display_relative(&ws.root().join(rel));
                if ctx2.snapshot.policy.is_path_denied("grep", &rel_shown) {
                    return;
                }
                // Contents are read only through a handle opened beneath the workspace root and
                // checked to be a regular file (a FIFO or device is skipped, never read).
                let Ok(opened) = ws.open_read(rel, &rel_shown) else {
                    return;
                };
                let _ = searcher.search_file(
                    &matcher,
                    &opened.file,
                    Lossy(|line_number, line| {
                        if ctx2.cancel.is_cancelled() {
                            return Ok(false);
                        }
                        total += 1;
                        if lines.len() < max {
                            let text = line.trim_end_matches(['\n', '\r']);
                            lines.push(format!(
                                "{rel_shown}:{line_number}:{}",
                                clip_line(text, MAX_LINE_CHARS)
                            ));
                        }
                        Ok(true)
                    }),
                );
            };
            let end = match ws.kind_beneath(&base.beneath, &base.relative)? {
                // A file named directly is searched whatever the ignore rules say.
                Some(EntryKind::File) => {
                    search(&base.beneath);
                    WalkEnd::Done
                }
                Some(EntryKind::Dir) | None => {
                    walk_files(ws, &base.beneath, overrides, &ctx2.cancel, &mut search)?
                }
                Some(other) => {
                    return Err(crate::ToolsError::FileUse {
                        path: base.relative.clone(),
                        problem: crate::error::FileProblem::NotRegular {
                            kind: other.described(),
                        },
                    });
                }
            };
            if ctx2.cancel.is_cancelled() {
                return Ok(None);
            }
            Ok::<_, crate::ToolsError>((end == WalkEnd::Done).then_some((lines, total)))
        })
        .await;
        let (lines, total) = match searched {
            Ok(Ok(Some(found))) => found,
            Ok(Ok(None)) => return ToolOutput::cancelled("grep was cancelled"),
            Ok(Err(e)) => return ToolOutput::error(file_failure("grep", &e)),
            Err(out) => return out,
        };
        if total == 0 {
            return ToolOutput::success(format!("No matches for `{}`", args.pattern))
                .with_details(json!({"matches": 0}));
        }
        let mut out = lines.join("\n");
        out.push('\n');
        if total > lines.len() {
            out.push_str(&format!(
                "… ({total} matching lines, showing the first {}; narrow the pattern, path or glob)\n",
                lines.len()
            ));
        }
        ToolOutput::success(out).with_details(json!({"matches": total}))
    }
}
