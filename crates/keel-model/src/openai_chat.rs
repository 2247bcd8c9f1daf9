//! OpenAI Chat Completions (and OpenAI-compatible servers: llama.cpp, vLLM, Ollama, LM Studio):
//! request body and stream parser.
//!
//! Docs: "Chat Completions API — Create chat completion" (messages with roles `system`, `user`,
//! `assistant` with `tool_calls`, `tool` with `tool_call_id`; `tools[].function.parameters`;
//! `stream_options.include_usage`) and "Streaming" (chunks with `choices[].delta`, tool call
//! fragments keyed by `index`, `finish_reason`, a final usage chunk with empty `choices`,
//! `data: [DONE]`).

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::body::{ArgumentsText, Kind, Seq, ToolText, instructions, push_item};
use crate::classify::classify_stream_error;
use crate::stream::{ToolCallAssembler, WireParser, nonempty_str, parse_json, u64_at};
use crate::types::{
    Message, ModelRequest, ReasoningItem, StopReason, StreamEvent, ToolCall, ToolSchema, Usage,
};

/// Maps Chat's `finish_reason`.
fn stop_reason(s: &str) -> StopReason {
    match s {
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        "content_filter" => StopReason::ContentFilter,
        // "stop" and anything new
        _ => StopReason::EndTurn,
    }
}

/// The JSON body of `POST {base}/chat/completions` for `request`, borrowing it (see
/// [`crate::body`]). `legacy_max_tokens` sends `max_tokens` (older compatible servers) instead
/// of `max_completion_tokens`. `tools` is [`tools`] of the request's tool list, encoded
/// (`None` when the list is empty).
pub(crate) fn body<'a>(
    model: &'a str,
    legacy_max_tokens: bool,
    request: &'a ModelRequest,
    tools: Option<&'a RawValue>,
) -> ChatBody<'a> {
    let s = &request.sampling;
    let (max_tokens, max_completion_tokens) = if legacy_max_tokens {
        (s.max_tokens, None)
    } else {
        (None, s.max_tokens)
    };
    ChatBody {
        model,
        tools,
        max_tokens,
        max_completion_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        stop: &s.stop_sequences,
        reasoning_effort: s.reasoning_effort.as_deref(),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
    }
}

/// A Chat Completions request body (docs: "Create chat completion").
#[derive(Serialize)]
///
/// Without `messages`: [`crate::HttpModel`] appends them ([`system_item`], then
/// [`write_items`] of each transcript message), reusing what it encoded for the request
/// before.
pub(crate) struct ChatBody<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'a str>,
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The system prompt as the first of `messages`, encoded; `None` without one.
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn system_item(request: &ModelRequest) -> serde_json::Result<Option<Vec<u8>>> {
    instructions(request)
        .map(|content| serde_json::to_vec(&ChatMessage::System { content }))
        .transpose()
}

/// `message` as one of `messages` ([`crate::body::WriteItems`]).
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn write_items(message: &Message, out: &mut Vec<u8>) -> serde_json::Result<()> {
    push_item(
        out,
        &match message {
            Message::User { content } => ChatMessage::User { content },
            Message::Assistant {
                text, tool_calls, ..
            } => ChatMessage::Assistant {
                content: (!text.is_empty()).then_some(text.as_str()),
                tool_calls: (!tool_calls.is_empty()).then_some(ChatCalls(tool_calls)),
            },
            Message::Tool {
                call_id,
                content,
                is_error,
            } => ChatMessage::Tool {
                tool_call_id: call_id,
                content: ToolText {
                    content,
                    is_error: *is_error,
                },
            },
        },
    )
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// `null` when the model wrote no text.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<ChatCalls<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: ToolText<'a>,
    },
}

/// An assistant message's `tool_calls`.
struct ChatCalls<'a>(&'a [ToolCall]);

impl Serialize for ChatCalls<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Call<'a> {
            id: &'a str,
            #[serde(rename = "type")]
            kind: Kind,
            function: FunctionCall<'a>,
        }
        #[derive(Serialize)]
        struct FunctionCall<'a> {
            name: &'a str,
            arguments: ArgumentsText<'a>,
        }
        Seq(|| {
            self.0.iter().map(|c| Call {
                id: &c.id,
                kind: "function",
                function: FunctionCall {
                    name: &c.name,
                    arguments: ArgumentsText(c),
                },
            })
        })
        .serialize(serializer)
    }
}

/// `tools`: each schema as a `function` tool.
pub(crate) fn tools(tools: &[ToolSchema]) -> impl Serialize + '_ {
    ChatTools(tools)
}

struct ChatTools<'a>(&'a [ToolSchema]);

impl Serialize for ChatTools<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tool<'a> {
            #[serde(rename = "type")]
            kind: Kind,
            function: Function<'a>,
        }
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            description: &'a str,
            parameters: &'a serde_json::Value,
        }
        Seq(|| {
            self.0.iter().map(|t| Tool {
                kind: "function",
                function: Function {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
        })
        .serialize(serializer)
    }
}

/// Stream parser for Chat Completions.
#[derive(Debug, Default)]
pub(crate) struct ChatParser {
    done: bool,
    model: Option<String>,
    stop: Option<StopReason>,
    refusal: bool,
    usage: Option<Usage>,
    tools: ToolCallAssembler,
    /// The response's reasoning text so far (`reasoning_content` / `reasoning` deltas).
    reasoning: String,
}

impl ChatParser {
    fn complete(&mut self, out: &mut Vec<StreamEvent>) {
        let default = if self.refusal {
            StopReason::Refusal
        } else if self.tools.any() {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        let stop = match self.stop {
            Some(StopReason::EndTurn) if self.refusal => StopReason::Refusal,
            Some(stop) => stop,
            None => default,
        };
        self.tools.finish(stop, out);
        if !self.reasoning.is_empty() {
            out.push(StreamEvent::Reasoning {
                item: ReasoningItem::OpenaiChat {
                    text: std::mem::take(&mut self.reasoning),
                },
            });
        }
        if let Some(usage) = self.usage.take() {
            out.push(StreamEvent::Usage { usage });
        }
        out.push(StreamEvent::Completed {
            stop_reason: stop,
            model: self.model.clone(),
        });
        self.done = true;
    }
}

impl WireParser for ChatParser {
    fn event(&mut self, _name: &str, data: &str, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        if data.trim() == "[DONE]" {
            return self.complete(out);
        }
        let v = match parse_json(data) {
            Ok(v) => v,
            Err(error) => {
                self.done = true;
                return out.push(StreamEvent::Error { error });
            }
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.done = true;
            return out.push(StreamEvent::Error {
                error: classify_stream_error(&v),
            });
        }
        if self.model.is_none() {
            self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            let reasoning = u64_at(usage, "/completion_tokens_details/reasoning_tokens");
            self.usage = Some(Usage {
                input_tokens: u64_at(usage, "/prompt_tokens"),
                output_tokens: u64_at(usage, "/completion_tokens"),
                cache_read_tokens: u64_at(usage, "/prompt_tokens_details/cached_tokens"),
                cache_write_tokens: 0,
                reasoning_tokens: reasoning,
            });
        }
        // Keel asks for one choice (n = 1); other indexes are ignored.
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| u64_at(c, "/index") == 0))
        else {
            return;
        };
        let delta = &choice["delta"];
        for key in ["reasoning_content", "reasoning"] {
            if let Some(text) = nonempty_str(delta, key) {
                self.reasoning.push_str(text);
                out.push(StreamEvent::ReasoningDelta {
                    text: text.to_string(),
                });
            }
        }
        if let Some(text) = nonempty_str(delta, "content") {
            out.push(StreamEvent::TextDelta {
                text: text.to_string(),
            });
        }
        if let Some(text) = nonempty_str(delta, "refusal") {
            self.refusal = true;
            out.push(StreamEvent::TextDelta {
                text: text.to_string(),
            });
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, call) in calls.iter().enumerate() {
                let key = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64)
                    .to_string();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    let name = call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    self.tools.start(&key, id, name, out);
                }
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    self.tools.delta(&key, args, out);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            let stop = match stop_reason(reason) {
                // Some compatible servers (Ollama, vLLM, Gemini's endpoint) end tool calls with
                // "stop": the calls decide.
                StopReason::EndTurn if self.tools.any() => StopReason::ToolUse,
                stop => stop,
            };
            self.stop = Some(stop);
            self.tools.finish(stop, out);
        }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn unreported_usage(&mut self) -> Option<Usage> {
        self.usage.take().filter(|u| !u.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map_to_the_normalized_set() {
        let cases = [
            ("stop", StopReason::EndTurn),
            ("tool_calls", StopReason::ToolUse),
            ("function_call", StopReason::ToolUse),
            ("length", StopReason::MaxTokens),
            ("content_filter", StopReason::ContentFilter),
        ];
        for (wire, normalized) in cases {
            assert_eq!(stop_reason(wire), normalized, "{wire}");
        }
    }

    #[test]
    fn refusal_delta_completes_as_refusal() {
        let mut p = ChatParser::default();
        let mut out = Vec::new();
        p.event(
            "message",
            r#"{"model":"gpt-4o","choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}"#,
            &mut out,
        );
        p.event(
            "message",
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            &mut out,
        );
        p.event("message", "[DONE]", &mut out);
        assert_eq!(
            out.last(),
            Some(&StreamEvent::Completed {
                stop_reason: StopReason::Refusal,
                model: Some("gpt-4o".into())
            })
        );
    }

    /// A compatible server's `reasoning_content` (DeepSeek, vLLM) streams live as deltas and
    /// ends as one reasoning item, so the runtime can keep or count it. Before, only the
    /// deltas came: `--keep-reasoning` journaled nothing, not even a count.
    #[test]
    fn reasoning_content_ends_as_one_reasoning_item() {
        let mut p = ChatParser::default();
        let mut out = Vec::new();
        for data in [
            r#"{"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"reasoning_content":"Let me "},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think."},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Answer."},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ] {
            p.event("message", data, &mut out);
        }
        let items: Vec<&StreamEvent> = out
            .iter()
            .filter(|e| matches!(e, StreamEvent::Reasoning { .. }))
            .collect();
        assert_eq!(
            items,
            [&StreamEvent::Reasoning {
                item: ReasoningItem::OpenaiChat {
                    text: "Let me think.".into()
                }
            }]
        );
        assert!(matches!(out.last(), Some(StreamEvent::Completed { .. })));
    }
}
