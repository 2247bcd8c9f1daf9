use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{blocking, clip_line, file_failure, parse_args, resolve};
use crate::artifact::ARTIFACT_SCHEME;
use crate::policy::{PathAccess, Subject};
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput};

/// Longest line shown, in characters; longer lines are cut with a marker.
const MAX_LINE_CHARS: usize = 2_000;
/// Largest file read, in bytes.
const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// `read_file {path, offset?, limit?}`: a text file with line numbers (`cat -n` style: the line
/// number right-aligned in 6 columns, a tab, the line). `offset` is the 1-based first line
/// (0 means 1), `limit` the number of lines (default 2,000). Binary files are refused. A path
/// `artifact://<id>` reads a stored artifact (full tool output) the same way.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a text file in the workspace. Returns lines prefixed with their line number and a tab. \
         Use offset (1-based line to start at) and limit (number of lines, default 2000) for large files. \
         Paths are relative to the workspace root. Also reads stored outputs given as artifact://<id>."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the workspace root, or artifact://<id>."},
                "offset": {"type": "integer", "minimum": 0, "description": "1-based line number to start reading at."},
                "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."}
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
        if path.starts_with(ARTIFACT_SCHEME) {
            return Subject::Other(args.to_string());
        }
        Subject::Paths(vec![PathAccess::read(path)])
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let (bytes, shown) = if let Some(id) = args.path.strip_prefix(ARTIFACT_SCHEME) {
            match ctx.artifacts.get(id).await {
                Ok(bytes) => (bytes, args.path.clone()),
                Err(e) => return ToolOutput::error(format!("read_file failed: {e}")),
            }
        } else {
            let resolved = match resolve("read_file", ctx, &args.path) {
                Ok(r) => r,
                Err(out) => return out,
            };
            let shown = resolved.relative.clone();
            // Opened beneath the workspace root and type-checked on the handle: a FIFO or a
            // device is refused before a byte is read.
            let ws = ctx.workspace.clone();
            let rel = resolved.beneath.clone();
            let shown2 = shown.clone();
            let read = blocking("read_file", move || {
                ws.read_regular(&rel, &shown2, MAX_FILE_BYTES)
            })
            .await;
            match read {
                Ok(Ok(bytes)) => (bytes, shown),
                Ok(Err(e)) => return ToolOutput::error(file_failure("read_file", &e)),
                Err(out) => return out,
            }
        };
        render(
            &bytes,
            &shown,
            args.offset,
            args.limit,
            ctx.limits.read_default_lines,
        )
    }
}

fn render(
    bytes: &[u8],
    shown: &str,
    offset: Option<u64>,
    limit: Option<u64>,
    default_lines: usize,
) -> ToolOutput {
    let probe = &bytes[..bytes.len().min(8192)];
    let text = match std::str::from_utf8(bytes) {
        Ok(t) if !probe.contains(&0) => t,
        _ => {
            return ToolOutput::error(format!(
                "read_file failed: `{shown}` is a binary file ({} bytes), not UTF-8 text; read_file only shows text (use shell with xxd or file to inspect it)",
                bytes.len()
            ));
        }
    };
    if text.is_empty() {
        return ToolOutput::success(format!("(`{shown}` is empty: 0 lines)"));
    }
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    let start = offset.unwrap_or(1).max(1) as usize;
    if start > total {
        return ToolOutput::error(format!(
            "read_file failed: offset {start} is past the end of `{shown}`, which has {total} lines; give an offset from 1 to {total}"
        ));
    }
    let limit = limit.map_or(default_lines, |l| l as usize).max(1);
    let end = (start - 1).saturating_add(limit).min(total);
    let mut out = String::new();
    for (i, line) in lines[start - 1..end].iter().enumerate() {
        out.push_str(&format!(
            "{:>6}\t{}\n",
            start + i,
            clip_line(line, MAX_LINE_CHARS)
        ));
    }
    if end < total {
        out.push_str(&format!(
            "… (showing lines {start}-{end} of {total}; call read_file with offset={} to continue)\n",
            end + 1
        ));
    }
    ToolOutput::success(out)
        .with_details(json!({"total_lines": total, "first_line": start, "last_line": end}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_cat_n() {
        let out = render(b"a\nb\r\nc", "f", None, None, 2000);
        assert_eq!(out.content, "     1\ta\n     2\tb\n     3\tc\n");
    }

    #[test]
    fn offset_and_limit_select_lines_and_say_how_to_continue() {
        let out = render(b"1\n2\n3\n4\n", "f", Some(2), Some(2), 2000);
        assert_eq!(
            out.content,
            "     2\t2\n     3\t3\n… (showing lines 2-3 of 4; call read_file with offset=4 to continue)\n"
        );
    }
}
