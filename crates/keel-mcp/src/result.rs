//! A `tools/call` result as the model sees it: one text within the result budget (the registry
//! cuts it and keeps the whole in an artifact), facts for hosts in the details.
//!
//! | MCP content | text the model sees |
//! |---|---|
//! | `text` | the text |
//! | `image`, `audio` | `[image: image/png, 1234 bytes, not shown]` (keel's results are text) |
//! | `resource_link` | `[resource link: NAME <URI>]` and its description |
//! | `resource` (embedded) | `[resource URI]` then its text, or `[resource URI: MIME, N bytes, not shown]` for a blob |
//! | `structuredContent` | its JSON, when there is no other content (else in the details) |
//! | `isError: true` | a `failed` result with the same text |

use keel_tools::ToolOutput;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// Largest structured content, in characters of JSON, copied into a result's details (larger
/// ones are shown in the text only).
const MAX_DETAILS_CHARS: usize = 16_384;

/// Bytes a base64 text of `len` characters decodes to (approximately, padding ignored).
fn decoded_len(len: usize) -> usize {
    len / 4 * 3
}

fn describe_block(block: &Value) -> String {
    let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let kind = str_of(block, "type");
    match kind.as_str() {
        "text" => str_of(block, "text"),
        "image" | "audio" => format!(
            "[{kind}: {}, {} bytes, not shown]",
            str_of(block, "mimeType"),
            decoded_len(str_of(block, "data").len())
        ),
        "resource_link" => {
            let mut text = format!(
                "[resource link: {} <{}>]",
                str_of(block, "name"),
                str_of(block, "uri")
            );
            let description = str_of(block, "description");
            if !description.is_empty() {
                text.push(' ');
                text.push_str(&description);
            }
            text
        }
        "resource" => {
            let resource = block.get("resource").cloned().unwrap_or(Value::Null);
            let uri = str_of(&resource, "uri");
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => format!("[resource {uri}]\n{text}"),
                None => format!(
                    "[resource {uri}: {}, {} bytes, not shown]",
                    str_of(&resource, "mimeType"),
                    decoded_len(str_of(&resource, "blob").len())
                ),
            }
        }
        other => format!("[{other} content, not shown]"),
    }
}

/// Maps `result` to a tool output (see the module docs).
pub fn map_result(result: &CallToolResult) -> ToolOutput {
    let value = serde_json::to_value(result).unwrap_or(Value::Null);
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut parts: Vec<String> = blocks.iter().map(describe_block).collect();
    let structured = value.get("structuredContent").cloned();
    if parts.is_empty()
        && let Some(structured) = &structured
    {
        parts.push(serde_json::to_string_pretty(structured).unwrap_or_default());
    }
    let mut text = parts.join("\n");
    if text.is_empty() {
        text = "(the tool returned no content)".into();
    }
    let mut details = json!({
        "content_types": blocks.iter().map(|b| b.get("type").cloned().unwrap_or(Value::Null)).collect::<Vec<_>>(),
    });
    if let Some(structured) = structured
        && serde_json::to_string(&structured).map_or(0, |s| s.len()) <= MAX_DETAILS_CHARS
    {
        details["structured_content"] = structured;
    }
    let output = if result.is_error == Some(true) {
        ToolOutput::error(text)
    } else {
        ToolOutput::success(text)
    };
    output.with_details(details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_tools::ToolResultStatus;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn every_content_kind_becomes_text() {
        let out = map_result(&result(json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "description": "the file"},
            {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "inside b"}},
            {"type": "resource", "resource": {"uri": "file:///c.bin", "blob": "AAAAAAAA", "mimeType": "application/octet-stream"}},
        ]})));
        assert_eq!(out.status, ToolResultStatus::Succeeded);
        assert_eq!(
            out.content,
            "hello\n[image: image/png, 3 bytes, not shown]\n[resource link: a.txt <file:///a.txt>] the file\n[resource file:///b.txt]\ninside b\n[resource file:///c.bin: application/octet-stream, 6 bytes, not shown]"
        );
    }

    #[test]
    fn structured_content_alone_is_shown_and_is_error_fails() {
        let out = map_result(&result(
            json!({"content": [], "structuredContent": {"n": 1}, "isError": true}),
        ));
        assert_eq!(out.status, ToolResultStatus::Failed);
        assert_eq!(out.content, "{\n  \"n\": 1\n}");
        assert_eq!(out.details["structured_content"], json!({"n": 1}));
        let empty = map_result(&result(json!({"content": []})));
        assert_eq!(empty.content, "(the tool returned no content)");
    }
}
