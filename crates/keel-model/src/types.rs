//! The normalized request and stream every adapter speaks.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::ProviderError;

/// One model call: everything the model sees for one step, plus how to sample and how to stop.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    /// System prompt. Placement per provider: OpenAI Chat — first message with role `system`;
    /// OpenAI Responses — top-level `instructions`; Anthropic — top-level `system`.
    pub instructions: Option<String>,
    /// The transcript, oldest first. Items are shared (`Arc`): a step's request points at the
    /// session's transcript items instead of copying them.
    pub messages: Vec<Arc<Message>>,
    /// Tools the model may call. Shared (`Arc`): every step (and every session) shown the same
    /// tools points at one list instead of copying the schemas.
    pub tools: Arc<[ToolSchema]>,
    /// Sampling options.
    pub sampling: SamplingOptions,
    /// Why the call is made; compaction requests do not consume scripted lines.
    pub purpose: RequestPurpose,
    /// How many scripted model responses this session already completed, across all its turns,
    /// counting failed attempts (injected error lines) too (the runtime adds
    /// [`crate::ModelResponse::responses_consumed`] after each step). Only responses of models
    /// that [`crate::ModelClient::consumes_responses`] count: attempts of an HTTP provider in
    /// the same route never move it. Only the scripted model uses it: this request gets script
    /// line `response_index + 1`, so a re-sampled step gets the same line and a retry the next
    /// one. [`crate::ModelRoute`] advances it by one for each such attempt it retries or falls
    /// back from. `None` lets the scripted model count itself.
    pub response_index: Option<u64>,
    /// Cancelling it ends the stream at once with [`StreamEvent::Cancelled`] and closes the HTTP
    /// connection.
    pub cancel: CancellationToken,
    /// Time limits of each attempt of this call that replace the model's own (default: none,
    /// the model's [`crate::Timeouts`] hold).
    pub timeouts: crate::client::RequestTimeouts,
}

/// What a request is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestPurpose {
    /// A normal step of a turn.
    #[default]
    Step,
    /// A compaction or summary request (the scripted model answers with a built-in summary).
    Compaction,
}

/// Sampling options; `None` leaves the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingOptions {
    /// Maximum output tokens. Anthropic requires one; the adapter sends its configured default
    /// (8192) when this is `None`.
    pub max_tokens: Option<u32>,
    /// Temperature, 0.0–2.0 (OpenAI) or 0.0–1.0 (Anthropic).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Stop sequences.
    pub stop_sequences: Vec<String>,
    /// OpenAI `reasoning.effort` (`minimal`, `low`, `medium`, `high`).
    pub reasoning_effort: Option<String>,
    /// Anthropic extended thinking budget in tokens (`thinking.budget_tokens`).
    pub thinking_budget_tokens: Option<u32>,
}

/// One transcript entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// User input.
    User {
        /// The text.
        content: String,
    },
    /// A model response: text, tool calls, and opaque reasoning that the provider needs back.
    Assistant {
        /// Visible text (may be empty).
        #[serde(default)]
        text: String,
        /// Tool calls, in the order the model proposed them.
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
        /// Reasoning items to send back (Anthropic thinking with signature, OpenAI encrypted
        /// reasoning). Only items of the provider that will receive the request are sent.
        #[serde(default)]
        reasoning: Vec<ReasoningItem>,
    },
    /// The result of one tool call; every call gets exactly one.
    Tool {
        /// The id of the call it answers.
        call_id: String,
        /// Result text the model reads.
        content: String,
        /// Whether the call failed. Anthropic sends `is_error`; the OpenAI wires have no such
        /// field, so the content is prefixed with `Error: ` instead.
        #[serde(default)]
        is_error: bool,
    },
}

/// A tool call as kept in the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider's id (`call_...`, `toolu_...`) or the scripted `call_<line>_<index>`.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments object. Invalid calls (see [`InvalidArguments`]) keep their raw text as a JSON
    /// string and are sent back to providers as `{}`.
    pub arguments: Value,
    /// The arguments exactly as the model wrote them (key order, spacing), when they came from a
    /// provider. The OpenAI wires carry arguments as a string and get this text back verbatim,
    /// so the replayed transcript is what the model produced; `arguments` (keys sorted) is what
    /// tools and approvals see. `None` for calls built in code: `arguments` is serialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
}

impl ToolCall {
    /// A call with parsed `arguments` and no raw text.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
            raw_arguments: None,
        }
    }

    /// The arguments text to send to a wire that carries them as a string (OpenAI Chat
    /// `function.arguments`, Responses `function_call.arguments`): the model's own text when the
    /// call is valid and it is known, else the serialized object; `{}` for an invalid call.
    pub fn arguments_text(&self) -> std::borrow::Cow<'_, str> {
        match self.arguments_source() {
            Ok(text) => text.into(),
            Err(object) => object.to_string().into(),
        }
    }

    /// Where [`ToolCall::arguments_text`] comes from: `Ok` the text to send as it is (the
    /// model's own, or `{}`), `Err` the object to serialize (so a body can write it straight
    /// into its string field).
    pub(crate) fn arguments_source(&self) -> Result<&str, &Value> {
        if !self.arguments.is_object() {
            return Ok("{}");
        }
        match self.raw_arguments.as_deref() {
            Some(raw) if !raw.trim().is_empty() => Ok(raw),
            _ => Err(&self.arguments),
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// Tool name (`read_file`, `mcp__server__tool`).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// Provider-specific reasoning the provider needs to receive back on the next request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case")]
pub enum ReasoningItem {
    /// Anthropic `thinking` block (docs: "Extended thinking — preserving thinking blocks").
    Anthropic {
        /// The thinking text.
        thinking: String,
        /// The signature that must be sent back unchanged.
        signature: String,
    },
    /// Anthropic `redacted_thinking` block.
    AnthropicRedacted {
        /// Opaque data.
        data: String,
    },
    /// Reasoning text an OpenAI-compatible Chat Completions server streamed in `delta`'s
    /// `reasoning_content` (DeepSeek, vLLM, llama.cpp) or `reasoning` (Ollama, OpenRouter):
    /// one item per response. The Chat wire has no field to send it back in, so no request
    /// carries it; it is kept (sealed, or journaled with `keep_reasoning`) and counted like
    /// every other item.
    OpenaiChat {
        /// The reasoning text, as streamed.
        text: String,
    },
    /// OpenAI Responses `reasoning` item (docs: "Reasoning — encrypted reasoning items").
    Openai {
        /// Item id (`rs_...`).
        id: String,
        /// `encrypted_content`, present when `include: ["reasoning.encrypted_content"]` was sent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
        /// Summary texts.
        #[serde(default)]
        summary: Vec<String>,
    },
}

/// Token counts of one response. `input_tokens` counts the whole prompt including cached parts,
/// so `input_tokens - cache_read_tokens - cache_write_tokens` were billed at the plain input
/// price; `output_tokens` includes `reasoning_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cache reads and writes.
    pub input_tokens: u64,
    /// Generated tokens, including reasoning.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic `cache_creation_input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (OpenAI `reasoning_tokens`).
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Field-wise sum (saturating: a provider can report any count).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }

    /// Whether every count is zero.
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }
}

/// Why the model stopped, normalized to Anthropic's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished (Chat `stop`, Anthropic `end_turn`/`pause_turn`, Responses `completed`).
    EndTurn,
    /// The model wants tool results (Chat `tool_calls`, Anthropic `tool_use`, Responses with a
    /// `function_call` item).
    ToolUse,
    /// Output limit reached (Chat `length`, Anthropic `max_tokens`, Responses incomplete with
    /// `max_output_tokens`).
    MaxTokens,
    /// A stop sequence matched (Anthropic `stop_sequence`).
    StopSequence,
    /// The model refused (Anthropic `refusal`, OpenAI `refusal` content).
    Refusal,
    /// Output was filtered (Chat `content_filter`, Responses incomplete with `content_filter`).
    ContentFilter,
}

/// Why a tool call's arguments cannot be used. Such a call is never executed; its result tells the
/// model why ([`InvalidArguments::result_message`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum InvalidArguments {
    /// The output limit cut the arguments off (stop reason `max_tokens`).
    Truncated,
    /// The arguments are not a JSON object.
    Malformed {
        /// The JSON parser's complaint.
        error: String,
    },
}

impl InvalidArguments {
    /// The tool result text the model should read for this call.
    pub fn result_message(&self) -> String {
        match self {
            InvalidArguments::Truncated => {
                "Error: the tool call's arguments were truncated because the response \
                 reached max_tokens; the call was not executed. Retry with shorter arguments."
                    .to_string()
            }
            InvalidArguments::Malformed { error } => format!(
                "Error: the tool call's arguments are not a valid JSON object ({error}); the call was \
                 not executed."
            ),
        }
    }
}

/// One normalized stream event. A step's stream ends with exactly one of `completed`, `error` or
/// `cancelled`. Serialized as one JSON object with a `type` tag (`{"type":"text_delta","text":"Hi"}`),
/// the format `keel model parse` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Visible text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// Reasoning text (thinking, reasoning summary). Not part of the durable transcript.
    ReasoningDelta {
        /// The new text.
        text: String,
    },
    /// A finished reasoning item the provider needs back on the next request; keep it in the
    /// assistant message ([`Message::Assistant::reasoning`]).
    Reasoning {
        /// The item.
        item: ReasoningItem,
    },
    /// A tool call begins.
    ToolCallStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// A fragment of a tool call's JSON arguments.
    ToolCallDelta {
        /// Call id.
        id: String,
        /// Raw fragment (may split a token).
        delta: String,
    },
    /// A tool call's arguments are complete.
    ToolCallEnd {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// The parsed arguments object (`{}` when the model sent none); for an invalid call, the
        /// raw text as a JSON string.
        arguments: Value,
        /// The arguments text exactly as streamed (all deltas joined, or the provider's final
        /// copy); empty when the model sent none.
        raw_arguments: String,
        /// Set when the call must not be executed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invalid: Option<InvalidArguments>,
    },
    /// Token counts of the response.
    Usage {
        /// The counts.
        usage: Usage,
    },
    /// The response finished normally.
    Completed {
        /// Why it stopped.
        stop_reason: StopReason,
        /// Model that produced it, as the provider named it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// The call failed; terminal.
    Error {
        /// The classified failure.
        error: ProviderError,
    },
    /// The request's cancellation token fired; terminal.
    Cancelled,
    /// Emitted by [`crate::ModelRoute`] before each attempt: what follows (until the next
    /// `attempt`) comes from this model.
    Attempt {
        /// 1-based attempt number within the step (across fallbacks).
        attempt: u32,
        /// Model label ([`crate::ModelClient::model`]).
        model: String,
        /// Whether this attempt's response or failure takes a position in the session's
        /// [`ModelRequest::response_index`] ([`crate::ModelClient::consumes_responses`] of the
        /// model): true for a scripted model, false for an HTTP provider.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        consumes_response: bool,
    },
    /// Emitted by [`crate::ModelRoute`]: the attempt failed and will be retried on the same model
    /// after `delay_ms`. Discard anything the failed attempt streamed.
    Retry {
        /// The failure.
        error: ProviderError,
        /// Wait before the next attempt, in ms.
        delay_ms: u64,
    },
    /// Emitted by [`crate::ModelRoute`]: moving from one model to the next. Discard anything the
    /// failed attempt streamed.
    Fallback {
        /// Model that failed.
        from: String,
        /// Model tried next.
        to: String,
        /// The failure that caused the switch.
        error: ProviderError,
    },
}

impl StreamEvent {
    /// Whether this event ends a stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            StreamEvent::Completed { .. } | StreamEvent::Error { .. } | StreamEvent::Cancelled
        )
    }
}
