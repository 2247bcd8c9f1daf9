//! OpenAI Responses: request body and stream parser.
//!
//! Docs: "Responses API — Create a model response" (top-level `instructions`; `input` items
//! `message`, `function_call`, `function_call_output` paired by `call_id`, `reasoning` items sent
//! back with `encrypted_content` when `store` is false and `include` asks for
//! `reasoning.encrypted_content`; `tools[]` of `type: function` with `name` and `parameters` at top
//! level) and "Streaming events" (`response.output_item.added/done`,
//! `response.function_call_arguments.delta`, `response.output_text.delta`,
//! `response.reasoning_summary_text.delta`, `response.completed`, `response.incomplete`,
//! `response.failed`, `error`).

use serde_json::{Map, Value, json};

use crate::classify::classify_stream_error;
use crate::openai_chat::tool_result_text;
use crate::stream::{ToolCallAssembler, WireParser, insert_common_sampling, parse_json, u64_at};
use crate::types::{Message, ModelRequest, ReasoningItem, StopReason, StreamEvent, Usage};

/// The JSON body of `POST {base}/responses` for `request`.
pub(crate) fn request_body(model: &str, request: &ModelRequest) -> Value {
    let mut input = Vec::new();
    for message in &request.messages {
        match message {
            Message::User { content } => input.push(json!({
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": content}]
            })),
            Message::Assistant {
                text,
                tool_calls,
                reasoning,
            } => {
                for item in reasoning {
                    if let ReasoningItem::Openai {
                        id,
                        encrypted_content,
                        summary,
                    } = item
                    {
                        let summary: Vec<Value> = summary
                            .iter()
                            .map(|s| json!({"type": "summary_text", "text": s}))
                            .collect();
                        let mut r = json!({"type": "reasoning", "id": id, "summary": summary});
                        if let Some(enc) = encrypted_content {
                            r["encrypted_content"] = json!(enc);
                        }
                        input.push(r);
                    }
                }
                if !text.is_empty() {
                    input.push(json!({
                        "type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]
                    }));
                }
                for call in tool_calls {
                    input.push(json!({
                        "type": "function_call", "call_id": call.id, "name": call.name,
                        "arguments": call.arguments_text()
                    }));
                }
            }
            Message::Tool {
                call_id,
                content,
                is_error,
            } => input.push(json!({
                "type": "function_call_output", "call_id": call_id,
                "output": tool_result_text(content, *is_error)
            })),
        }
    }
    let s = &request.sampling;
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    if let Some(instructions) = request.instructions.as_deref().filter(|s| !s.is_empty()) {
        body.insert("instructions".into(), json!(instructions));
    }
    body.insert("input".into(), Value::Array(input));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters, "strict": false})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(max) = s.max_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    insert_common_sampling(&mut body, s);
    if let Some(effort) = &s.reasoning_effort {
        body.insert(
            "reasoning".into(),
            json!({"effort": effort, "summary": "auto"}),
        );
    }
    // Keel keeps the transcript itself: nothing stored server-side, reasoning comes back encrypted.
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

/// Stream parser for the Responses API.
#[derive(Debug, Default)]
pub(crate) struct ResponsesParser {
    done: bool,
    model: Option<String>,
    refusal: bool,
    tools: ToolCallAssembler,
}

impl ResponsesParser {
    fn finish(&mut self, v: &Value, stop: StopReason, out: &mut Vec<StreamEvent>) {
        self.tools.finish(stop, out);
        if let Some(usage) = v.pointer("/response/usage").filter(|u| u.is_object()) {
            out.push(StreamEvent::Usage {
                usage: Usage {
                    input_tokens: u64_at(usage, "/input_tokens"),
                    output_tokens: u64_at(usage, "/output_tokens"),
                    cache_read_tokens: u64_at(usage, "/input_tokens_details/cached_tokens"),
                    cache_write_tokens: 0,
                    reasoning_tokens: u64_at(usage, "/output_tokens_details/reasoning_tokens"),
                },
            });
        }
        let model = v
            .pointer("/response/model")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(self.model.clone());
        out.push(StreamEvent::Completed {
            stop_reason: stop,
            model,
        });
        self.done = true;
    }
}

impl WireParser for ResponsesParser {
    fn event(&mut self, _name: &str, data: &str, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        let v = match parse_json(data) {
            Ok(v) => v,
            Err(error) => {
                self.done = true;
                return out.push(StreamEvent::Error { error });
            }
        };
        let text = |key: &str| v.get(key).and_then(Value::as_str).unwrap_or("");
        match text("type") {
            "response.created" => {
                self.model = v
                    .pointer("/response/model")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            "response.output_item.added" => {
                let item = &v["item"];
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
                    self.tools
                        .start(field("id"), field("call_id"), field("name"), out);
                    self.tools.delta(field("id"), field("arguments"), out);
                }
            }
            "response.function_call_arguments.delta" => {
                self.tools.delta(text("item_id"), text("delta"), out)
            }
            "response.output_item.done" => {
                let item = &v["item"];
                let field = |k: &str| item.get(k).and_then(Value::as_str);
                match field("type") {
                    Some("function_call") => {
                        self.tools
                            .end(field("id").unwrap_or(""), field("arguments"), out)
                    }
                    Some("reasoning") => {
                        let summary = item
                            .get("summary")
                            .and_then(Value::as_array)
                            .map(|s| {
                                s.iter()
                                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                                    .map(str::to_string)
                                    .collect()
                            })
                            .unwrap_or_default();
                        out.push(StreamEvent::Reasoning {
                            item: ReasoningItem::Openai {
                                id: field("id").unwrap_or("").to_string(),
                                encrypted_content: field("encrypted_content").map(str::to_string),
                                summary,
                            },
                        });
                    }
                    _ => {}
                }
            }
            "response.output_text.delta" if !text("delta").is_empty() => {
                out.push(StreamEvent::TextDelta {
                    text: text("delta").to_string(),
                });
            }
            "response.refusal.delta" => {
                self.refusal = true;
                if !text("delta").is_empty() {
                    out.push(StreamEvent::TextDelta {
                        text: text("delta").to_string(),
                    });
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta"
                if !text("delta").is_empty() =>
            {
                out.push(StreamEvent::ReasoningDelta {
                    text: text("delta").to_string(),
                });
            }
            "response.completed" => {
                let stop = if self.refusal {
                    StopReason::Refusal
                } else if self.tools.any() {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                };
                self.finish(&v, stop, out);
            }
            "response.incomplete" => {
                let stop = match v
                    .pointer("/response/incomplete_details/reason")
                    .and_then(Value::as_str)
                {
                    Some("content_filter") => StopReason::ContentFilter,
                    _ => StopReason::MaxTokens,
                };
                self.finish(&v, stop, out);
            }
            "response.failed" | "error" => {
                self.done = true;
                out.push(StreamEvent::Error {
                    error: classify_stream_error(&v),
                });
            }
            // response.in_progress, content_part, *.done duplicates, and event types added later
            _ => {}
        }
    }

    fn done(&self) -> bool {
        self.done
    }
}
