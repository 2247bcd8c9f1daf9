//! keel-model: everything between Keel and a language model.
//!
//! **Owns:** the [`ModelClient`] trait; the normalized request ([`ModelRequest`], [`Message`],
//! [`ToolSchema`]) and stream ([`StreamEvent`]); the adapters for OpenAI Chat Completions (and
//! OpenAI-compatible servers), OpenAI Responses and Anthropic Messages ([`HttpModel`]) with their
//! SSE parsers; the scripted model ([`ScriptedModel`], format in docs/ARCHITECTURE.md); error
//! classification ([`ErrorKind`], [`ProviderError`]); retries and fallback ([`ModelRoute`],
//! [`RetryPolicy`]); time limits ([`Timeouts`], [`RequestTimeouts`]); prices and cost ([`PriceTable`]);
//! context windows of known models ([`context_window`]).
//!
//! **Must not touch:** the journal, transcript storage, budgets or policy. A model call has no
//! side effect besides the HTTP request; what to do with its events is the runtime's business.
//!
//! **Layout**
//! - `types` — request, messages, stream events, usage, stop reasons.
//! - `error` — [`ErrorKind`] (retryable / falls back), [`ProviderError`], [`ModelError`].
//! - `classify` — HTTP status, headers and error bodies → [`ErrorKind`].
//! - `stream` — [`Wire`], the shared SSE pump (deadlines, cancellation), tool call assembly,
//!   [`parse_recorded`], [`parse_chunks`].
//! - `openai_chat`, `openai_responses`, `anthropic` — request body and stream parser per wire.
//! - `body` — what the three bodies share: each is a `Serialize` value borrowing the request,
//!   encoded to bytes without an intermediate `serde_json::Value`.
//! - `client` — [`ModelClient`], [`HttpModel`], [`ProviderConfig`].
//! - `scripted` — [`Script`], [`ScriptedModel`].
//! - `route` — [`ModelRoute`], [`RetryPolicy`].
//! - `response` — [`collect`] a stream into a [`ModelResponse`] with usage and cost per model.
//! - `cost` — [`PriceTable`], [`Price`], [`context_window`].
//!
//! Start reading at [`ModelClient`] and [`StreamEvent`].

mod anthropic;
mod body;
mod classify;
mod client;
mod cost;
mod error;
mod kept;
mod openai_chat;
mod openai_responses;
mod response;
mod route;
mod scripted;
mod stream;
mod types;

pub use anthropic::ANTHROPIC_VERSION;
pub use client::{EventStream, HttpModel, ModelClient, ProviderConfig, RequestTimeouts, Timeouts};
pub use cost::{DEFAULT_CONTEXT_WINDOW, Price, PriceTable, context_window};
pub use error::{ErrorKind, ModelError, ProviderError};
pub use response::{ModelResponse, ModelUsage, Outcome, ResponseToolCall, collect};
pub use route::{ModelRoute, RetryPolicy};
pub use scripted::{
    Script, ScriptAction, ScriptEntry, ScriptedCall, ScriptedModel, scripted_summary, text_chunks,
};
pub use stream::{Wire, parse_chunks, parse_recorded};
pub use types::{
    InvalidArguments, Message, ModelRequest, ReasoningItem, RequestPurpose, SamplingOptions,
    StopReason, StreamEvent, ToolCall, ToolSchema, Usage,
};

/// Re-exported so callers can build [`ModelRequest::cancel`] without naming tokio-util.
pub use tokio_util::sync::CancellationToken;
