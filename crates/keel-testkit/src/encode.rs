//! Encoding a response as each provider's SSE stream, frame by frame.

use keel_model::{ErrorKind, ReasoningItem, StopReason, Usage, Wire, text_chunks};
use serde_json::{Value, json};

/// A tool call the fake server sends.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeToolCall {
    /// Call id (`call_...` / `toolu_...`).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Raw arguments text (usually a JSON object; may be anything, to test invalid arguments).
    pub arguments: String,
}

/// A response the fake server streams.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeResponse {
    /// Reasoning, streamed before the text, each item on the wire it belongs to (others are
    /// left out): Anthropic `thinking` blocks (thinking deltas, then the signature) and
    /// `redacted_thinking` blocks; OpenAI Responses `reasoning` items (summary deltas, then the
    /// item with its `encrypted_content`). OpenAI Chat carries none.
    pub reasoning: Vec<ReasoningItem>,
    /// Text, streamed word by word.
    pub text: String,
    /// Tool calls, streamed after the text.
    pub tool_calls: Vec<FakeToolCall>,
    /// Token counts reported at the end.
    pub usage: Usage,
    /// Stop reason; `None` means tool_use when there are tool calls, else end_turn.
    pub stop_reason: Option<StopReason>,
    /// Model name reported in the stream.
    pub model: String,
}

impl FakeResponse {
    /// A plain text response with made-up usage (10 in, 5 out).
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            reasoning: Vec::new(),
            text: text.into(),
            tool_calls: Vec::new(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            stop_reason: None,
            model: "fake-model".to_string(),
        }
    }

    /// Adds a tool call with `arguments` as JSON text.
    pub fn with_tool_call(mut self, id: &str, name: &str, arguments: &str) -> Self {
        self.tool_calls.push(FakeToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        });
        self
    }

    /// Adds a reasoning item, streamed before the text.
    pub fn with_reasoning(mut self, item: ReasoningItem) -> Self {
        self.reasoning.push(item);
        self
    }

    fn stop(&self) -> StopReason {
        self.stop_reason.unwrap_or(if self.tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        })
    }
}

fn frame(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The SSE frames of `response` on `wire`, in order; each frame is one complete event.
pub fn encode(wire: Wire, response: &FakeResponse) -> Vec<String> {
    match wire {
        Wire::OpenaiChat => encode_chat(response),
        Wire::OpenaiResponses => encode_responses(response),
        Wire::Anthropic => encode_anthropic(response),
    }
}

/// Splits arguments into two fragments (mid-token when long enough), as providers do.
fn split_arguments(args: &str) -> Vec<&str> {
    let mid = (1..args.len()).find(|i| args.is_char_boundary(*i) && *i >= args.len() / 2);
    match mid {
        Some(mid) => vec![&args[..mid], &args[mid..]],
        None if args.is_empty() => vec![],
        None => vec![args],
    }
}

fn encode_chat(r: &FakeResponse) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        frame(
            None,
            &json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": r.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut frames = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    for t in text_chunks(&r.text) {
        frames.push(chunk(json!({"content": t}), Value::Null));
    }
    for (i, call) in r.tool_calls.iter().enumerate() {
        frames.push(chunk(
            json!({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]}),
            Value::Null,
        ));
        for part in split_arguments(&call.arguments) {
            frames.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                Value::Null,
            ));
        }
    }
    let finish = match r.stop() {
        StopReason::ToolUse => "tool_calls",
        StopReason::MaxTokens => "length",
        StopReason::ContentFilter => "content_filter",
        StopReason::EndTurn | StopReason::StopSequence | StopReason::Refusal => "stop",
    };
    frames.push(chunk(json!({}), json!(finish)));
    let u = &r.usage;
    frames.push(frame(
        None,
        &json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": r.model, "choices": [],
                "usage": {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                          "total_tokens": u.input_tokens + u.output_tokens,
                          "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
                          "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}}),
    ));
    frames.push("data: [DONE]\n\n".to_string());
    frames
}

fn encode_responses(r: &FakeResponse) -> Vec<String> {
    let mut seq = 0u64;
    let mut ev = |frames: &mut Vec<String>, ty: &str, mut body: Value| {
        body["type"] = json!(ty);
        body["sequence_number"] = json!(seq);
        seq += 1;
        frames.push(frame(Some(ty), &body));
    };
    let mut frames = Vec::new();
    let response = |status: &str| json!({"id": "resp_fake", "object": "response", "status": status, "model": r.model, "output": []});
    ev(
        &mut frames,
        "response.created",
        json!({"response": response("in_progress")}),
    );
    let mut index = 0;
    for item in &r.reasoning {
        let ReasoningItem::Openai {
            id,
            encrypted_content,
            summary,
        } = item
        else {
            continue;
        };
        let mut added = json!({"id": id, "type": "reasoning", "summary": []});
        let parts: Vec<Value> = summary
            .iter()
            .map(|t| json!({"type": "summary_text", "text": t}))
            .collect();
        let mut done = json!({"id": id, "type": "reasoning", "summary": parts});
        if let Some(enc) = encrypted_content {
            added["encrypted_content"] = json!(enc);
            done["encrypted_content"] = json!(enc);
        }
        ev(
            &mut frames,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        for (i, text) in summary.iter().enumerate() {
            let at = json!({"item_id": id, "output_index": index, "summary_index": i});
            let with = |mut v: Value, k: &str, x: Value| {
                v[k] = x;
                v
            };
            ev(
                &mut frames,
                "response.reasoning_summary_part.added",
                with(
                    at.clone(),
                    "part",
                    json!({"type": "summary_text", "text": ""}),
                ),
            );
            for t in text_chunks(text) {
                ev(
                    &mut frames,
                    "response.reasoning_summary_text.delta",
                    with(at.clone(), "delta", json!(t)),
                );
            }
            ev(
                &mut frames,
                "response.reasoning_summary_text.done",
                with(at.clone(), "text", json!(text)),
            );
            ev(
                &mut frames,
                "response.reasoning_summary_part.done",
                with(at, "part", json!({"type": "summary_text", "text": text})),
            );
        }
        ev(
            &mut frames,
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
        index += 1;
    }
    if !r.text.is_empty() {
        let item = json!({"id": "msg_fake", "type": "message", "role": "assistant", "status": "in_progress", "content": []});
        ev(
            &mut frames,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        for t in text_chunks(&r.text) {
            ev(
                &mut frames,
                "response.output_text.delta",
                json!({"item_id": "msg_fake", "output_index": index, "content_index": 0, "delta": t}),
            );
        }
        let done = json!({"id": "msg_fake", "type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": r.text, "annotations": []}]});
        ev(
            &mut frames,
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
        index += 1;
    }
    for call in &r.tool_calls {
        let item_id = format!("fc_{}", call.id);
        let item = |args: &str, status: &str| {
            json!({"id": item_id, "type": "function_call", "status": status, "arguments": args,
                   "call_id": call.id, "name": call.name})
        };
        ev(
            &mut frames,
            "response.output_item.added",
            json!({"output_index": index, "item": item("", "in_progress")}),
        );
        for part in split_arguments(&call.arguments) {
            ev(
                &mut frames,
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": part}),
            );
        }
        if r.stop() != StopReason::MaxTokens {
            ev(
                &mut frames,
                "response.output_item.done",
                json!({"output_index": index, "item": item(&call.arguments, "completed")}),
            );
        }
        index += 1;
    }
    let u = &r.usage;
    let usage = json!({"input_tokens": u.input_tokens, "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
                       "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
                       "total_tokens": u.input_tokens + u.output_tokens});
    let mut done = response("completed");
    done["usage"] = usage;
    match r.stop() {
        StopReason::MaxTokens | StopReason::ContentFilter => {
            let reason = if r.stop() == StopReason::MaxTokens {
                "max_output_tokens"
            } else {
                "content_filter"
            };
            done["status"] = json!("incomplete");
            done["incomplete_details"] = json!({"reason": reason});
            ev(
                &mut frames,
                "response.incomplete",
                json!({"response": done}),
            );
        }
        _ => ev(&mut frames, "response.completed", json!({"response": done})),
    }
    frames
}

fn encode_anthropic(r: &FakeResponse) -> Vec<String> {
    let ev = |frames: &mut Vec<String>, ty: &str, mut body: Value| {
        body["type"] = json!(ty);
        frames.push(frame(Some(ty), &body));
    };
    let mut frames = Vec::new();
    let u = &r.usage;
    let uncached = u
        .input_tokens
        .saturating_sub(u.cache_read_tokens + u.cache_write_tokens);
    ev(
        &mut frames,
        "message_start",
        json!({"message": {"id": "msg_fake", "type": "message", "role": "assistant", "content": [], "model": r.model,
                           "stop_reason": null, "stop_sequence": null,
                           "usage": {"input_tokens": uncached, "cache_read_input_tokens": u.cache_read_tokens,
                                     "cache_creation_input_tokens": u.cache_write_tokens, "output_tokens": 1}}}),
    );
    ev(&mut frames, "ping", json!({}));
    let mut index = 0;
    for item in &r.reasoning {
        match item {
            ReasoningItem::Anthropic {
                thinking,
                signature,
            } => {
                ev(
                    &mut frames,
                    "content_block_start",
                    json!({"index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                );
                for t in text_chunks(thinking) {
                    ev(
                        &mut frames,
                        "content_block_delta",
                        json!({"index": index, "delta": {"type": "thinking_delta", "thinking": t}}),
                    );
                }
                ev(
                    &mut frames,
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "signature_delta", "signature": signature}}),
                );
            }
            ReasoningItem::AnthropicRedacted { data } => ev(
                &mut frames,
                "content_block_start",
                json!({"index": index, "content_block": {"type": "redacted_thinking", "data": data}}),
            ),
            ReasoningItem::Openai { .. } | ReasoningItem::OpenaiChat { .. } => continue,
        }
        ev(&mut frames, "content_block_stop", json!({"index": index}));
        index += 1;
    }
    if !r.text.is_empty() {
        ev(
            &mut frames,
            "content_block_start",
            json!({"index": index, "content_block": {"type": "text", "text": ""}}),
        );
        for t in text_chunks(&r.text) {
            ev(
                &mut frames,
                "content_block_delta",
                json!({"index": index, "delta": {"type": "text_delta", "text": t}}),
            );
        }
        ev(&mut frames, "content_block_stop", json!({"index": index}));
        index += 1;
    }
    for call in &r.tool_calls {
        ev(
            &mut frames,
            "content_block_start",
            json!({"index": index, "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}),
        );
        for part in split_arguments(&call.arguments) {
            ev(
                &mut frames,
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": part}}),
            );
        }
        ev(&mut frames, "content_block_stop", json!({"index": index}));
        index += 1;
    }
    let stop = match r.stop() {
        StopReason::EndTurn | StopReason::ContentFilter => "end_turn",
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::Refusal => "refusal",
    };
    ev(
        &mut frames,
        "message_delta",
        json!({"delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": u.output_tokens}}),
    );
    ev(&mut frames, "message_stop", json!({}));
    frames
}

/// The in-stream error event of `wire` for `kind` (sent after HTTP 200).
pub fn stream_error_frame(wire: Wire, kind: ErrorKind) -> String {
    let (anthropic_type, openai_code) = provider_names(kind);
    match wire {
        Wire::Anthropic => frame(
            Some("error"),
            &json!({"type": "error", "error": {"type": anthropic_type, "message": format!("injected {kind}")}}),
        ),
        Wire::OpenaiResponses => frame(
            Some("error"),
            &json!({"type": "error", "code": openai_code, "message": format!("injected {kind}"), "param": null}),
        ),
        Wire::OpenaiChat => frame(
            None,
            &json!({"error": {"type": openai_code, "code": openai_code, "message": format!("injected {kind}")}}),
        ),
    }
}

/// The providers' error names for `kind`: (Anthropic `error.type`, OpenAI `error.code`).
pub(crate) fn provider_names(kind: ErrorKind) -> (&'static str, &'static str) {
    match kind {
        ErrorKind::RateLimited => ("rate_limit_error", "rate_limit_exceeded"),
        ErrorKind::Overloaded => ("overloaded_error", "server_is_overloaded"),
        ErrorKind::ServerError | ErrorKind::StreamTruncated | ErrorKind::EmptyResponse => {
            ("api_error", "server_error")
        }
        ErrorKind::Timeout => ("timeout_error", "timeout"),
        ErrorKind::ContextOverflow => ("request_too_large", "context_length_exceeded"),
        ErrorKind::InvalidRequest => ("invalid_request_error", "invalid_value"),
        ErrorKind::Authentication => ("authentication_error", "invalid_api_key"),
        ErrorKind::Quota => ("billing_error", "insufficient_quota"),
        ErrorKind::ContentFilter => ("invalid_request_error", "content_filter"),
    }
}
