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

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::body::{ArgumentsText, Kind, Seq, ToolText, instructions, push_item};
use crate::classify::classify_stream_error;
use crate::stream::{ToolCallAssembler, WireParser, parse_json, u64_at};
use crate::types::{
    Message, ModelRequest, ReasoningItem, StopReason, StreamEvent, ToolSchema, Usage,
};

/// Whether `model` is an OpenAI reasoning model (o-series, gpt-5 family except the `-chat`
/// variants), which accepts `include: ["reasoning.encrypted_content"]`; other models (gpt-4o,
/// gpt-4.1, gpt-5-chat-latest) reject it with HTTP 400 "Encrypted content is not supported with
/// this model".
pub(crate) fn is_reasoning_model(model: &str) -> bool {
    let family = |prefix: &str| {
        model
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', '@', ':']))
    };
    let reasoning =
        ["o1", "o3", "o4", "gpt-5"].iter().any(|p| family(p)) || model.contains("codex");
    reasoning && !model.contains("-chat")
}

/// The JSON body of `POST {base}/responses` for `request`, borrowing it (see [`crate::body`]).
/// `encrypted_reasoning` asks for encrypted reasoning items (`None`: when the model is a
/// reasoning model, the request sets a reasoning effort, or the transcript already holds
/// encrypted reasoning). `tools` is [`tools`] of the request's tool list, encoded (`None` when
/// the list is empty).
pub(crate) fn body<'a>(
    model: &'a str,
    encrypted_reasoning: Option<bool>,
    request: &'a ModelRequest,
    tools: Option<&'a RawValue>,
) -> ResponsesBody<'a> {
    let s = &request.sampling;
    let replays_reasoning = request.messages.iter().any(|m| {
        matches!(&**m, Message::Assistant { reasoning, .. } if reasoning.iter().any(|r| matches!(
            r, ReasoningItem::Openai { encrypted_content: Some(_), .. })))
    });
    let encrypted_reasoning = encrypted_reasoning.unwrap_or_else(|| {
        is_reasoning_model(model) || s.reasoning_effort.is_some() || replays_reasoning
    });
    ResponsesBody {
        model,
        instructions: instructions(request),
        tools,
        max_output_tokens: s.max_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        reasoning: s.reasoning_effort.as_deref().map(|effort| Reasoning {
            effort,
            summary: "auto",
        }),
        // Keel keeps the transcript itself: nothing is stored server-side, and reasoning
        // models return their reasoning encrypted so that it can be sent back on the next
        // request.
        store: false,
        include: encrypted_reasoning.then_some(["reasoning.encrypted_content"]),
        stream: true,
    }
}

/// A Responses request body (docs: "Create a model response").
///
/// Without `input`: [`crate::HttpModel`] appends it ([`write_items`] of each transcript
/// message), reusing what it encoded for the request before.
#[derive(Serialize)]
pub(crate) struct ResponsesBody<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Reasoning<'a>>,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    include: Option<[&'static str; 1]>,
    stream: bool,
}

#[derive(Serialize)]
struct Reasoning<'a> {
    effort: &'a str,
    summary: &'static str,
}

/// `message` as `input` items ([`crate::body::WriteItems`]): a user message or a tool
/// result is one; an assistant message is its reasoning items that carry their encrypted
/// content (with `store: false` nothing is kept server-side: an item without it would be a
/// dangling reference, HTTP 404), then its text, then its calls.
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn write_items(message: &Message, out: &mut Vec<u8>) -> serde_json::Result<()> {
    match message {
        Message::User { content } => push_item(
            out,
            &Item::Message {
                role: "user",
                content: [Content {
                    kind: "input_text",
                    text: content,
                }],
            },
        ),
        Message::Assistant {
            text,
            tool_calls,
            reasoning,
        } => {
            for item in reasoning {
                if let ReasoningItem::Openai {
                    id,
                    encrypted_content: Some(encrypted_content),
                    summary,
                } = item
                {
                    push_item(
                        out,
                        &Item::Reasoning {
                            id,
                            summary: Summary(summary),
                            encrypted_content,
                        },
                    )?;
                }
            }
            if !text.is_empty() {
                push_item(
                    out,
                    &Item::Message {
                        role: "assistant",
                        content: [Content {
                            kind: "output_text",
                            text,
                        }],
                    },
                )?;
            }
            for call in tool_calls {
                push_item(
                    out,
                    &Item::FunctionCall {
                        call_id: &call.id,
                        name: &call.name,
                        arguments: ArgumentsText(call),
                    },
                )?;
            }
            Ok(())
        }
        Message::Tool {
            call_id,
            content,
            is_error,
        } => push_item(
            out,
            &Item::FunctionCallOutput {
                call_id,
                output: ToolText {
                    content,
                    is_error: *is_error,
                },
            },
        ),
    }
}

/// One `input` item.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
    Message {
        role: &'static str,
        content: [Content<'a>; 1],
    },
    Reasoning {
        id: &'a str,
        summary: Summary<'a>,
        encrypted_content: &'a str,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: ArgumentsText<'a>,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: ToolText<'a>,
    },
}

/// A reasoning item's `summary` parts.
struct Summary<'a>(&'a [String]);

impl Serialize for Summary<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Seq(|| {
            self.0.iter().map(|text| Content {
                kind: "summary_text",
                text,
            })
        })
        .serialize(serializer)
    }
}

/// A text part (`input_text`, `output_text`, `summary_text`).
#[derive(Serialize)]
struct Content<'a> {
    #[serde(rename = "type")]
    kind: Kind,
    text: &'a str,
}

/// `tools`: each schema as a `function` tool, not strict.
pub(crate) fn tools(tools: &[ToolSchema]) -> impl Serialize + '_ {
    FunctionTools(tools)
}

struct FunctionTools<'a>(&'a [ToolSchema]);

impl Serialize for FunctionTools<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tool<'a> {
            #[serde(rename = "type")]
            kind: Kind,
            name: &'a str,
            description: &'a str,
            parameters: &'a serde_json::Value,
            strict: bool,
        }
        Seq(|| {
            self.0.iter().map(|t| Tool {
                kind: "function",
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
                strict: false,
            })
        })
        .serialize(serializer)
    }
}

/// Stream parser for the Responses API.
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::ToolCall;

    fn request_body(model: &str, encrypted: Option<bool>, request: &ModelRequest) -> Value {
        let mut config = crate::ProviderConfig::new(model).with_base_url("http://127.0.0.1:9/v1");
        config.encrypted_reasoning = encrypted;
        crate::HttpModel::new(crate::Wire::OpenaiResponses, config)
            .unwrap()
            .request_body(request)
            .unwrap()
    }

    #[test]
    fn reasoning_models_are_recognized() {
        for m in [
            "o3",
            "o3-mini",
            "o4-mini-2025-04-16",
            "o1",
            "gpt-5",
            "gpt-5.1",
            "gpt-5-mini",
            "gpt-5.1-codex-max",
            "gpt-5.2-pro",
            "codex-mini-latest",
        ] {
            assert!(is_reasoning_model(m), "{m}");
        }
        for m in [
            "gpt-4o",
            "gpt-4.1-mini",
            "gpt-5-chat-latest",
            "gpt-5.1-chat-latest",
            "o3x",
            "llama3",
        ] {
            assert!(!is_reasoning_model(m), "{m}");
        }
    }

    fn with_reasoning(encrypted: Option<&str>) -> ModelRequest {
        ModelRequest {
            messages: vec![
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall::new("c", "t", json!({}))],
                    reasoning: vec![ReasoningItem::Openai {
                        id: "rs_1".into(),
                        encrypted_content: encrypted.map(str::to_string),
                        summary: vec![],
                    }],
                }
                .into(),
            ],
            ..ModelRequest::default()
        }
    }

    #[test]
    fn include_is_sent_only_where_encrypted_reasoning_is_supported() {
        let plain = ModelRequest::default();
        assert!(
            request_body("gpt-4o", None, &plain)
                .get("include")
                .is_none()
        );
        assert_eq!(request_body("gpt-4o", None, &plain)["store"], json!(false));
        assert_eq!(
            request_body("gpt-5.1", None, &plain)["include"],
            json!(["reasoning.encrypted_content"])
        );
        assert!(
            request_body("gpt-5.1", Some(false), &plain)
                .get("include")
                .is_none()
        );
        assert!(
            request_body("local-model", None, &with_reasoning(Some("e")))
                .get("include")
                .is_some()
        );
    }

    #[test]
    fn incomplete_details_reason_decides_the_stop_reason() {
        for (reason, stop) in [
            ("max_output_tokens", StopReason::MaxTokens),
            ("content_filter", StopReason::ContentFilter),
        ] {
            let mut p = ResponsesParser::default();
            let mut out = Vec::new();
            let data = format!(
                r#"{{"type":"response.incomplete","response":{{"model":"gpt-5","status":"incomplete","incomplete_details":{{"reason":"{reason}"}}}}}}"#
            );
            p.event("response.incomplete", &data, &mut out);
            assert_eq!(
                out.last(),
                Some(&StreamEvent::Completed {
                    stop_reason: stop,
                    model: Some("gpt-5".into())
                }),
                "{reason}"
            );
        }
    }

    #[test]
    fn reasoning_items_without_encrypted_content_are_not_replayed() {
        let body = request_body("o3", None, &with_reasoning(None));
        let types: Vec<&str> = body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["type"].as_str())
            .collect();
        assert_eq!(types, ["function_call"]);
    }
}

#[derive(Debug, Default)]
pub(crate) struct ResponsesParser {
    done: bool,
    model: Option<String>,
    refusal: bool,
    tools: ToolCallAssembler,
}

impl ResponsesParser {
    /// The usage event of a `response.*` event that carries `response.usage`.
    fn usage_of(v: &Value) -> Option<StreamEvent> {
        let usage = v.pointer("/response/usage").filter(|u| u.is_object())?;
        Some(StreamEvent::Usage {
            usage: Usage {
                input_tokens: u64_at(usage, "/input_tokens"),
                output_tokens: u64_at(usage, "/output_tokens"),
                cache_read_tokens: u64_at(usage, "/input_tokens_details/cached_tokens"),
                cache_write_tokens: 0,
                reasoning_tokens: u64_at(usage, "/output_tokens_details/reasoning_tokens"),
            },
        })
    }

    fn finish(&mut self, v: &Value, stop: StopReason, out: &mut Vec<StreamEvent>) {
        self.tools.finish(stop, out);
        out.extend(Self::usage_of(v));
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
                // A failed response still counts the tokens it reports.
                out.extend(Self::usage_of(&v));
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
