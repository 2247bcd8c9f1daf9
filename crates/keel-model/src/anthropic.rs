//! Anthropic Messages: request body and stream parser.
//!
//! Docs: "Messages API" (request shape: top-level `system`, `messages` alternating user/assistant,
//! `tool_result` blocks in a user message right after the assistant's `tool_use` blocks,
//! `tools[].input_schema`, required `max_tokens`) and "Streaming Messages" (event flow
//! `message_start`, `content_block_start/delta/stop`, `message_delta`, `message_stop`; `ping`
//! anywhere; `error` events after HTTP 200; unknown event types must be ignored).

use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::body::{Kind, Seq, instructions};
use crate::classify::classify_stream_error;
use crate::stream::{ToolCallAssembler, WireParser, parse_json, u64_at};
use crate::types::{
    Message, ModelRequest, ReasoningItem, StopReason, StreamEvent, ToolSchema, Usage,
};

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

/// The JSON body of `POST /v1/messages` for `request`, borrowing it (see [`crate::body`]).
/// `default_max_tokens` stands in for the request's `max_tokens` when it has none (Anthropic
/// requires one). `tools` is [`tools`] of the request's tool list, encoded (`None` when the list
/// is empty).
pub(crate) fn body<'a>(
    model: &'a str,
    default_max_tokens: u32,
    request: &'a ModelRequest,
    tools: Option<&'a RawValue>,
) -> AnthropicBody<'a> {
    let s = &request.sampling;
    AnthropicBody {
        model,
        max_tokens: s.max_tokens.unwrap_or(default_max_tokens),
        system: instructions(request),
        tools,
        temperature: s.temperature,
        top_p: s.top_p,
        stop_sequences: &s.stop_sequences,
        thinking: s.thinking_budget_tokens.map(|budget_tokens| Thinking {
            kind: "enabled",
            budget_tokens,
        }),
        stream: true,
    }
}

/// `messages` as the wire's messages (as [`crate::body::each_message`] does for the other
/// wires): consecutive user-side
/// entries (user text and tool results) share one user message, and an assistant message
/// with no block is left out. Every message but the last is appended to `items` (roles
/// alternate, so nothing later changes them); the last, which the next message may still
/// extend, is returned encoded with the index of its first entry in `messages`.
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn write_turns<'a>(
    messages: &'a [std::sync::Arc<Message>],
    items: &mut Vec<u8>,
) -> serde_json::Result<(usize, Vec<u8>)> {
    let mut turns: Vec<(usize, Turn<'a>)> = Vec::new();
    for (at, message) in messages.iter().enumerate() {
        let mut push = |role: &'static str, blocks: &mut dyn Iterator<Item = Content<'a>>| {
            let mut blocks = blocks.peekable();
            if blocks.peek().is_none() {
                return;
            }
            match turns.last_mut() {
                Some((_, last)) if last.role == role => last.content.extend(blocks),
                _ => turns.push((
                    at,
                    Turn {
                        role,
                        content: blocks.collect(),
                    },
                )),
            }
        };
        match &**message {
            Message::User { content } => {
                push(
                    "user",
                    &mut std::iter::once(Content::Text { text: content }),
                );
            }
            Message::Tool {
                call_id,
                content,
                is_error,
            } => push(
                "user",
                &mut std::iter::once(Content::ToolResult {
                    tool_use_id: call_id,
                    content,
                    is_error: *is_error,
                }),
            ),
            Message::Assistant {
                text,
                tool_calls,
                reasoning,
            } => {
                let thinking = reasoning.iter().filter_map(|item| match item {
                    ReasoningItem::Anthropic {
                        thinking,
                        signature,
                    } => Some(Content::Thinking {
                        thinking,
                        signature,
                    }),
                    ReasoningItem::AnthropicRedacted { data } => {
                        Some(Content::RedactedThinking { data })
                    }
                    ReasoningItem::Openai { .. } | ReasoningItem::OpenaiChat { .. } => None,
                });
                let text = (!text.is_empty()).then_some(Content::Text { text });
                let calls = tool_calls.iter().map(|call| Content::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    // An invalid call's arguments go back as `{}`.
                    input: call.arguments.is_object().then_some(&call.arguments),
                });
                push("assistant", &mut thinking.chain(text).chain(calls));
            }
        }
    }
    let Some((open_at, open)) = turns.pop() else {
        return Ok((messages.len(), Vec::new()));
    };
    for (_, turn) in &turns {
        crate::body::push_item(items, turn)?;
    }
    Ok((open_at, serde_json::to_vec(&open)?))
}

/// A Messages request body (docs: "Messages API").
///
/// Without `messages`: [`crate::HttpModel`] appends them ([`write_turns`]), reusing the
/// messages it encoded for the request before.
#[derive(Serialize)]
pub(crate) struct AnthropicBody<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    stream: bool,
}

#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: Kind,
    budget_tokens: u32,
}

/// One message: a role and its content blocks.
#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Content<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Content<'a> {
    Text {
        text: &'a str,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        #[serde(serialize_with = "object_or_empty")]
        input: Option<&'a Value>,
    },
}

/// A tool call's `input`: its arguments object, or `{}`.
fn object_or_empty<S: serde::Serializer>(
    input: &Option<&Value>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match input {
        Some(v) => v.serialize(serializer),
        None => serializer.serialize_map(Some(0))?.end(),
    }
}

/// `tools`: name, description and `input_schema` of each.
pub(crate) fn tools(tools: &[ToolSchema]) -> impl Serialize + '_ {
    Tools(tools)
}

struct Tools<'a>(&'a [ToolSchema]);

impl Serialize for Tools<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tool<'a> {
            name: &'a str,
            description: &'a str,
            input_schema: &'a Value,
        }
        Seq(|| {
            self.0.iter().map(|t| Tool {
                name: &t.name,
                description: &t.description,
                input_schema: &t.parameters,
            })
        })
        .serialize(serializer)
    }
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
