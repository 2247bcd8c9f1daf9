//! Provider error classes and the crate's error enum.
//!
//! Every failure a model call can meet — an HTTP status, an in-stream `error` event, a malformed
//! chunk, a dropped connection, a timeout — is classified into one [`ErrorKind`]. The kind decides
//! whether the same model is retried ([`ErrorKind::retryable`]) and whether a [`crate::ModelRoute`]
//! moves on to its next model ([`ErrorKind::falls_back`]).

use serde::{Deserialize, Serialize};

/// The class of a failed model call. Serialized in snake_case (`rate_limited`, ...), the same names
/// the scripted format uses to inject failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// HTTP 429 or `rate_limit_error`; carries retry-after when the provider sent one.
    RateLimited,
    /// HTTP 529 / 503 or Anthropic `overloaded_error`.
    Overloaded,
    /// HTTP 5xx or `api_error` / `server_error`.
    ServerError,
    /// Time to first token or total response time exceeded, HTTP 408/504, or a connect timeout.
    Timeout,
    /// The prompt does not fit the model's context window (OpenAI `context_length_exceeded`,
    /// Anthropic "prompt is too long", HTTP 413).
    ContextOverflow,
    /// The provider rejected our request (HTTP 400/404/422, `invalid_request_error`).
    InvalidRequest,
    /// HTTP 401/403: missing, wrong or unauthorized API key.
    Authentication,
    /// Out of credit: OpenAI `insufficient_quota`, Anthropic `billing_error`, HTTP 402.
    Quota,
    /// The provider's content filter blocked the request or the response.
    ContentFilter,
    /// The stream ended before its terminal event (connection closed, malformed chunk).
    StreamTruncated,
    /// The response completed with nothing in it: no text, no tool call (e.g. a Chat stream
    /// that is only `data: [DONE]`).
    EmptyResponse,
}

impl ErrorKind {
    /// All kinds, in declaration order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::RateLimited,
        ErrorKind::Overloaded,
        ErrorKind::ServerError,
        ErrorKind::Timeout,
        ErrorKind::ContextOverflow,
        ErrorKind::InvalidRequest,
        ErrorKind::Authentication,
        ErrorKind::Quota,
        ErrorKind::ContentFilter,
        ErrorKind::StreamTruncated,
        ErrorKind::EmptyResponse,
    ];

    /// Whether sending the same request to the same model again may succeed: true for
    /// rate_limited, overloaded, server_error, timeout, stream_truncated and empty_response.
    pub fn retryable(self) -> bool {
        match self {
            ErrorKind::RateLimited
            | ErrorKind::Overloaded
            | ErrorKind::ServerError
            | ErrorKind::Timeout
            | ErrorKind::StreamTruncated
            | ErrorKind::EmptyResponse => true,
            ErrorKind::ContextOverflow
            | ErrorKind::InvalidRequest
            | ErrorKind::Authentication
            | ErrorKind::Quota
            | ErrorKind::ContentFilter => false,
        }
    }

    /// Whether a route may move to its next model after this failure (once retries are spent,
    /// for retryable kinds). False for failures caused by our own request or its content —
    /// invalid_request, context_overflow (the runtime compacts instead) and content_filter — since
    /// another model would be sent the same request.
    pub fn falls_back(self) -> bool {
        match self {
            ErrorKind::RateLimited
            | ErrorKind::Overloaded
            | ErrorKind::ServerError
            | ErrorKind::Timeout
            | ErrorKind::StreamTruncated
            | ErrorKind::EmptyResponse
            | ErrorKind::Authentication
            | ErrorKind::Quota => true,
            ErrorKind::ContextOverflow | ErrorKind::InvalidRequest | ErrorKind::ContentFilter => {
                false
            }
        }
    }

    /// The snake_case name (`rate_limited`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::ServerError => "server_error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Authentication => "authentication",
            ErrorKind::Quota => "quota",
            ErrorKind::ContentFilter => "content_filter",
            ErrorKind::StreamTruncated => "stream_truncated",
            ErrorKind::EmptyResponse => "empty_response",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified failure of one model call, as carried by [`crate::StreamEvent::Error`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderError {
    /// The class; decides retry and fallback.
    pub kind: ErrorKind,
    /// Copy of `kind.retryable()`, kept in the serialized form for readers of event logs.
    pub retryable: bool,
    /// Provider's message (or ours), for humans.
    pub message: String,
    /// Wait the provider asked for before retrying, in ms (`retry-after-ms`, `retry-after`
    /// headers, or the body's "try again in" hint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// HTTP status, when the failure came with one (in-stream errors after HTTP 200 have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The model gave no response at all: a scripted model asked for a line past its last
    /// (`docs/ARCHITECTURE.md`, "Scripted model": the k-th response a session *completed* came
    /// from line k), so the failure takes no position in the script. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_response: bool,
}

impl ProviderError {
    /// A new error of `kind` with `message`; no retry-after, no status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            retryable: kind.retryable(),
            message: message.into(),
            retry_after_ms: None,
            status: None,
            no_response: false,
        }
    }

    /// Sets the provider's requested wait in ms.
    pub fn with_retry_after_ms(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        if let Some(ms) = self.retry_after_ms {
            write!(f, " (retry after {ms} ms)")?;
        }
        Ok(())
    }
}

/// Errors of this crate outside the model stream itself (which reports [`ProviderError`]s as
/// events): configuration, script files, recorded-stream files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A provider call failed; see the kind for what to do.
    #[error("model call failed: {0}")]
    Provider(ProviderError),
    /// No API key in the configuration nor in the named environment variable.
    #[error("no API key for {provider}: set it in the configuration or in ${env_var}")]
    MissingApiKey {
        /// Provider name (`openai`, `anthropic`).
        provider: &'static str,
        /// The environment variable that was consulted.
        env_var: &'static str,
    },
    /// The HTTP client could not be built (TLS backend initialisation).
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
    /// A script file could not be read.
    #[error("cannot read script {path}: {source}")]
    ScriptIo {
        /// The script file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A script line is not valid scripted-format JSON.
    #[error("script {path} line {line}: {message}")]
    ScriptLine {
        /// The script file (or the name given to an in-memory script).
        path: String,
        /// 1-based physical line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// An unknown wire name was given (expected openai-chat, openai-responses or anthropic).
    #[error("unknown wire protocol {0:?}: expected openai-chat, openai-responses or anthropic")]
    UnknownWire(String),
    /// A model route was built without any model.
    #[error("a model route needs at least one model")]
    EmptyRoute,
}
