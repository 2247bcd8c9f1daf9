//! Anthropic Messages: request body and stream parser.
//!
//! Docs: "Messages API" (request shape: top-level `system`, `messages` alternating user/assistant,
//! `tool_result` blocks in a user message right after the assistant's `tool_use` blocks,
//! `tools[].input_schema`, required `max_tokens`) and "Streaming Messages" (event flow
//! `message_start`, `content_block_start/delta/stop`, `message_delta`, `message_stop`; `ping`
//! anywhere; `error` events after HTTP 200; unknown event types must be ignored).

use serde_json::{Map, Value, json};

use crate::classify::classify_stream_error;
use crate::stream::{ToolCallAssembler, WireParser, insert_common_sampling, parse_json, u64_at};
use crate::types::{Message, ModelRequest, ReasoningItem, StopReason, StreamEvent, Usage};

/// The `anthropic-version` header value sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Maps Anthropic's `stop_reason`.
fn stop_reason(s: &str) -> StopReason {
    match s {
        "tool_use" => StopReason::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "refusal" => StopReason::Refusal,
        // end_turn, pause_turn and anything new: the model handed the turn back.
        _ => StopReason::EndTurn,
    }
}

/// The JSON body of `POST /v1/messages` for `request`.
pub(crate) fn request_body(model: &str, default_max_tokens: u32, request: &ModelRequest) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    // Consecutive user-side entries (user text and tool results) share one user message.
    let mut push = |role: &str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        if let Some(last) = messages.last_mut()
            && last["role"] == role
            && let Some(content) = last["content"].as_array_mut()
        {
            content.extend(blocks);
            return;
        }
        messages.push(json!({"role": role, "content": blocks}));
    };
    for message in &request.messages {
        match &**message {
            Message::User { content } => {
                push("user", vec![json!({"type": "text", "text": content})])
            }
            Message::Tool {
                call_id,
                content,
                is_error,
            } => push(
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}),
                ],
            ),
            Message::Assistant {
                text,
                tool_calls,
                reasoning,
            } => {
                let mut blocks = Vec::new();
                for item in reasoning {
                    match item {
                        ReasoningItem::Anthropic { thinking, signature } => {
                            blocks.push(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
                        }
                        ReasoningItem::AnthropicRedacted { data } => {
                            blocks.push(json!({"type": "redacted_thinking", "data": data}))
                        }
                        ReasoningItem::Openai { .. } | ReasoningItem::OpenaiChat { .. } => {}
                    }
                }
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    let input = if call.arguments.is_object() {
                        call.arguments.clone()
                    } else {
                        json!({})
                    };
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                push("assistant", blocks);
            }
        }
    }
    let s = &request.sampling;
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert(
        "max_tokens".into(),
        json!(s.max_tokens.unwrap_or(default_max_tokens)),
    );
    if let Some(system) = request.instructions.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    insert_common_sampling(&mut body, s);
    if !s.stop_sequences.is_empty() {
        body.insert("stop_sequences".into(), json!(s.stop_sequences));
    }
    if let Some(budget) = s.thinking_budget_tokens {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking { text: String, signature: String },
    Redacted { data: String },
    Tool,
    Other,
}

/// Stream parser for Anthropic Messages.
#[derive(Debug, Default)]
pub(crate) struct AnthropicParser {
    started: bool,
    done: bool,
    model: Option<String>,
    /// Uncached input, cache read, cache write, output (as Anthropic reports them).
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
    /// The usage above went out in a [`StreamEvent::Usage`].
    usage_emitted: bool,
    stop: Option<StopReason>,
    blocks: Vec<(u64, Block)>,
    tools: ToolCallAssembler,
}

impl AnthropicParser {
    fn read_usage(&mut self, usage: &Value) {
        let set = |field: &mut u64, key: &str| {
            if let Some(v) = usage.get(key).and_then(Value::as_u64) {
                *field = v;
            }
        };
        set(&mut self.input, "input_tokens");
        set(&mut self.cache_read, "cache_read_input_tokens");
        set(&mut self.cache_write, "cache_creation_input_tokens");
        set(&mut self.output, "output_tokens");
    }

    /// The usage reported so far: `input_tokens` counts the whole prompt (uncached, cache reads
    /// and cache writes; saturating).
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_write),
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: 0,
        }
    }

    fn fail(&mut self, error: crate::error::ProviderError, out: &mut Vec<StreamEvent>) {
        self.done = true;
        out.push(StreamEvent::Error { error });
    }
}

impl WireParser for AnthropicParser {
    fn event(&mut self, _name: &str, data: &str, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        let v = match parse_json(data) {
            Ok(v) => v,
            Err(e) => return self.fail(e, out),
        };
        let index = u64_at(&v, "/index");
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                // A repeated message_start (seen from some proxies) must not reset or double-count.
                if self.started {
                    return;
                }
                self.started = true;
                self.model = v
                    .pointer("/message/model")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(usage) = v.pointer("/message/usage") {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => {
                let block = &v["content_block"];
                let kind = match block.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        if let Some(text) = block
                            .get("text")
                            .and_then(Value::as_str)
                            .filter(|t| !t.is_empty())
                        {
                            out.push(StreamEvent::TextDelta {
                                text: text.to_string(),
                            });
                        }
                        Block::Text
                    }
                    "thinking" => Block::Thinking {
                        text: block
                            .get("thinking")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        signature: block
                            .get("signature")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    },
                    "redacted_thinking" => Block::Redacted {
                        data: block
                            .get("data")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    },
                    "tool_use" => {
                        let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                        let name = block.get("name").and_then(Value::as_str).unwrap_or("");
                        self.tools.start(&index.to_string(), id, name, out);
                        // Input given whole at start (non-empty) counts as the arguments.
                        if let Some(input) = block
                            .get("input")
                            .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()))
                        {
                            self.tools
                                .delta(&index.to_string(), &input.to_string(), out);
                        }
                        Block::Tool
                    }
                    _ => Block::Other,
                };
                self.blocks.push((index, kind));
            }
            "content_block_delta" => {
                let delta = &v["delta"];
                let text_of = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                let block = self
                    .blocks
                    .iter_mut()
                    .rev()
                    .find(|(i, _)| *i == index)
                    .map(|(_, b)| b);
                match delta.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text_delta" => {
                        let text = text_of("text");
                        if !text.is_empty() {
                            out.push(StreamEvent::TextDelta {
                                text: text.to_string(),
                            });
                        }
                    }
                    "thinking_delta" => {
                        let text = text_of("thinking");
                        if let Some(Block::Thinking { text: acc, .. }) = block {
                            acc.push_str(text);
                        }
                        if !text.is_empty() {
                            out.push(StreamEvent::ReasoningDelta {
                                text: text.to_string(),
                            });
                        }
                    }
                    "signature_delta" => {
                        if let Some(Block::Thinking { signature, .. }) = block {
                            signature.push_str(text_of("signature"));
                        }
                    }
                    "input_json_delta" => {
                        self.tools
                            .delta(&index.to_string(), text_of("partial_json"), out)
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let pos = self.blocks.iter().rposition(|(i, _)| *i == index);
                match pos.map(|p| self.blocks.remove(p).1) {
                    Some(Block::Thinking { text, signature }) => out.push(StreamEvent::Reasoning {
                        item: ReasoningItem::Anthropic {
                            thinking: text,
                            signature,
                        },
                    }),
                    Some(Block::Redacted { data }) => out.push(StreamEvent::Reasoning {
                        item: ReasoningItem::AnthropicRedacted { data },
                    }),
                    Some(Block::Tool) => self.tools.end(&index.to_string(), None, out),
                    Some(Block::Text) | Some(Block::Other) | None => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    let stop = stop_reason(reason);
                    self.stop = Some(stop);
                    self.tools.finish(stop, out);
                }
                if let Some(usage) = v.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => {
                let stop = self.stop.unwrap_or(if self.tools.any() {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                });
                self.tools.finish(stop, out);
                self.usage_emitted = true;
                out.push(StreamEvent::Usage {
                    usage: self.usage(),
                });
                out.push(StreamEvent::Completed {
                    stop_reason: stop,
                    model: self.model.clone(),
                });
                self.done = true;
            }
            "error" => {
                let error = classify_stream_error(&v);
                self.fail(error, out);
            }
            // ping and event types added after this adapter was written
            _ => {}
        }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn unreported_usage(&mut self) -> Option<Usage> {
        let usage = self.usage();
        if self.usage_emitted || usage.is_zero() {
            return None;
        }
        self.usage_emitted = true;
        Some(usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_to_the_normalized_set() {
        let cases = [
            ("end_turn", StopReason::EndTurn),
            ("pause_turn", StopReason::EndTurn),
            ("tool_use", StopReason::ToolUse),
            ("max_tokens", StopReason::MaxTokens),
            ("model_context_window_exceeded", StopReason::MaxTokens),
            ("stop_sequence", StopReason::StopSequence),
            ("refusal", StopReason::Refusal),
            ("something_new", StopReason::EndTurn),
        ];
        for (wire, normalized) in cases {
            assert_eq!(stop_reason(wire), normalized, "{wire}");
        }
    }
}
