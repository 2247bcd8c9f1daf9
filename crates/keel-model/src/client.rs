//! The [`ModelClient`] trait and the HTTP adapter behind the three wire protocols.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::classify::classify_http;
use crate::error::{ErrorKind, ModelError, ProviderError};
use crate::stream::{Limits, Sink, Wire, pump};
use crate::types::{ModelRequest, StreamEvent};

/// A stream of normalized events for one model call; it ends after its terminal event
/// (`completed`, `error` or `cancelled`). Dropping it aborts the call and closes the connection.
pub type EventStream = BoxStream<'static, StreamEvent>;

/// A model: one call in, one normalized event stream out.
pub trait ModelClient: Send + Sync {
    /// The model label used in events, usage attribution and price lookup
    /// (`gpt-4o`, `claude-sonnet-4-5`, `scripted:demo.jsonl`).
    fn model(&self) -> &str;

    /// The models this client answers with, in the order it tries them, as
    /// [`ModelClient::model`] labels: itself for a single model; a [`crate::ModelRoute`]'s
    /// primary, then its fallbacks. The first is the one a call goes to first. A response's
    /// usage and cost belong to the member that served it, which a route names in each
    /// [`StreamEvent::Attempt`]; price and account under that member, never the route's label.
    fn members(&self) -> Vec<&str> {
        vec![self.model()]
    }

    /// Starts one call. Never fails up front: every failure arrives as a terminal
    /// [`StreamEvent::Error`]. Must be polled inside a Tokio runtime with the time driver.
    fn stream(&self, request: ModelRequest) -> EventStream;

    /// Whether this model's responses (successes and failures alike) take a position in the
    /// session's [`ModelRequest::response_index`]: true for the scripted model, whose line `k`
    /// answers the session's `k`-th such response; false (the default) for providers that do not
    /// read the index, so their attempts never move a script on. A [`crate::ModelRoute`] is true
    /// when any of its models is, and tells per attempt ([`StreamEvent::Attempt`]).
    fn consumes_responses(&self) -> bool {
        false
    }

    /// The prompt size this model accepts, in tokens, if known: by default the built-in table
    /// ([`crate::context_window`]) looked up by [`ModelClient::model`]. A
    /// [`crate::ModelRoute`] answers the smallest window among its models, so a fallback
    /// never receives a context compacted for a larger one. `None` (an unknown model, the
    /// scripted model): the runtime assumes [`crate::DEFAULT_CONTEXT_WINDOW`] unless
    /// configured.
    fn context_window_tokens(&self) -> Option<u64> {
        crate::cost::context_window(self.model())
    }
}

/// A [`Sink`] feeding a bounded channel.
pub(crate) struct ChannelSink(mpsc::Sender<StreamEvent>);

impl Sink for ChannelSink {
    async fn emit(&mut self, event: StreamEvent) -> bool {
        self.0.send(event).await.is_ok()
    }
}

/// Turns a producer future into an [`EventStream`]. The producer runs inside the returned stream
/// (no task is spawned), so dropping the stream drops the producer and whatever connection it
/// holds.
pub(crate) fn event_stream<F, Fut>(producer: F) -> EventStream
where
    F: FnOnce(ChannelSink) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let work = producer(ChannelSink(tx));
    let driver = futures_util::stream::once(work).filter_map(|()| async { None::<StreamEvent> });
    let events =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
    futures_util::stream::select(driver, events).boxed()
}

/// Time limits of one response (one attempt). `None` disables a limit. Each one that passes ends
/// the response with a `timeout` error, which a [`crate::ModelRoute`] retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// From sending the request to the first content event (text, reasoning or tool call), in ms.
    pub first_token_ms: Option<u64>,
    /// From sending the request to the terminal event, in ms.
    pub total_ms: Option<u64>,
    /// Once content has started, the longest the response may go without receiving a byte, in
    /// ms (keep-alive comments and `ping` events count: they are bytes). A stream that stalls
    /// mid-answer fails after this instead of at the total limit. Missing in older serialized
    /// configs: the default.
    #[serde(default = "default_idle_ms")]
    pub idle_ms: Option<u64>,
}

/// [`Timeouts::idle_ms`] by default: 60 s.
fn default_idle_ms() -> Option<u64> {
    Some(60_000)
}

impl Default for Timeouts {
    /// 60 s to the first token, 60 s of silence mid-stream, 10 min in total.
    fn default() -> Self {
        Self {
            first_token_ms: Some(60_000),
            total_ms: Some(600_000),
            idle_ms: default_idle_ms(),
        }
    }
}

impl Timeouts {
    /// These limits with each one `request` sets replacing ours.
    pub fn overridden_by(self, request: &RequestTimeouts) -> Self {
        Self {
            first_token_ms: request.first_token_ms.or(self.first_token_ms),
            total_ms: request.total_ms.or(self.total_ms),
            idle_ms: request.idle_ms.or(self.idle_ms),
        }
    }
}

/// Per-attempt time limits set by the caller of one model call ([`ModelRequest::timeouts`]),
/// each replacing the model's own [`Timeouts`] value when set (`None` keeps the model's). The
/// runtime passes the session's configured limits here, so they hold whatever the host built
/// the model with. Models without a wire (the scripted model) ignore them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTimeouts {
    /// Replaces [`Timeouts::first_token_ms`], ms.
    pub first_token_ms: Option<u64>,
    /// Replaces [`Timeouts::total_ms`], ms.
    pub total_ms: Option<u64>,
    /// Replaces [`Timeouts::idle_ms`], ms.
    pub idle_ms: Option<u64>,
}

/// Configuration of one HTTP model. `Debug` does not show the API key.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct ProviderConfig {
    /// The provider's model id (`gpt-4o`, `claude-sonnet-4-5`).
    pub model: String,
    /// API key; when absent, `OPENAI_API_KEY` or `ANTHROPIC_API_KEY` is read.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Base URL; when absent, `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`, else
    /// `https://api.openai.com/v1` / `https://api.anthropic.com`. OpenAI bases include `/v1`
    /// (requests go to `{base}/chat/completions`, `{base}/responses`); Anthropic bases do not
    /// (`{base}/v1/messages`), as in the providers' SDKs.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Time limits.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Anthropic `max_tokens` when the request sets none (default 8192).
    #[serde(default)]
    pub default_max_tokens: Option<u32>,
    /// Chat Completions only: send `max_tokens` instead of `max_completion_tokens` (older
    /// OpenAI-compatible servers).
    #[serde(default)]
    pub legacy_max_tokens: bool,
    /// Responses only: ask for encrypted reasoning (`include: ["reasoning.encrypted_content"]`).
    /// `None` decides per request: yes for OpenAI reasoning models (o-series, gpt-5 family but
    /// not `-chat`), when a reasoning effort is set, or when the transcript carries encrypted
    /// reasoning; other models reject the field.
    #[serde(default)]
    pub encrypted_reasoning: Option<bool>,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("base_url", &self.base_url)
            .field("timeouts", &self.timeouts)
            .field("default_max_tokens", &self.default_max_tokens)
            .field("legacy_max_tokens", &self.legacy_max_tokens)
            .field("encrypted_reasoning", &self.encrypted_reasoning)
            .finish()
    }
}

impl ProviderConfig {
    /// A configuration for `model` with defaults elsewhere.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            ..Self::default()
        }
    }

    /// Sets the base URL.
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the time limits.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }
}

struct Inner {
    wire: Wire,
    config: ProviderConfig,
    url: String,
    api_key: Option<String>,
    http: reqwest::Client,
    /// What this model encoded for earlier requests and reuses ([`crate::kept`]).
    kept: crate::kept::Kept,
}

/// A model reached over HTTP with one of the three wire protocols. Cheap to clone.
#[derive(Clone)]
pub struct HttpModel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HttpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModel")
            .field("wire", &self.inner.wire)
            .field("model", &self.inner.config.model)
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

impl HttpModel {
    /// OpenAI Chat Completions, or any OpenAI-compatible server (set `base_url`; the key is then
    /// optional).
    ///
    /// # Errors
    /// [`ModelError::MissingApiKey`] when talking to api.openai.com without a key;
    /// [`ModelError::HttpClient`] when the TLS backend cannot start.
    pub fn openai_chat(config: ProviderConfig) -> Result<Self, ModelError> {
        Self::new(Wire::OpenaiChat, config)
    }

    /// OpenAI Responses. Errors as [`HttpModel::openai_chat`].
    ///
    /// # Errors
    /// See [`HttpModel::openai_chat`].
    pub fn openai_responses(config: ProviderConfig) -> Result<Self, ModelError> {
        Self::new(Wire::OpenaiResponses, config)
    }

    /// Anthropic Messages.
    ///
    /// # Errors
    /// [`ModelError::MissingApiKey`] when talking to api.anthropic.com without a key;
    /// [`ModelError::HttpClient`] when the TLS backend cannot start.
    pub fn anthropic(config: ProviderConfig) -> Result<Self, ModelError> {
        Self::new(Wire::Anthropic, config)
    }

    /// A model speaking `wire`.
    ///
    /// # Errors
    /// See [`HttpModel::openai_chat`].
    pub fn new(wire: Wire, config: ProviderConfig) -> Result<Self, ModelError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (provider, key_var, url_var, default_base) = match wire {
            Wire::OpenaiChat | Wire::OpenaiResponses => (
                "openai",
                "OPENAI_API_KEY",
                "OPENAI_BASE_URL",
                "https://api.openai.com/v1",
            ),
            Wire::Anthropic => (
                "anthropic",
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                "https://api.anthropic.com",
            ),
        };
        let base = config
            .base_url
            .clone()
            .or_else(|| env(url_var))
            .unwrap_or_else(|| default_base.to_string());
        let api_key = config.api_key.clone().or_else(|| env(key_var));
        if api_key.is_none() && base == default_base {
            return Err(ModelError::MissingApiKey {
                provider,
                env_var: key_var,
            });
        }
        let base = base.trim_end_matches('/');
        let url = match wire {
            Wire::OpenaiChat => format!("{base}/chat/completions"),
            Wire::OpenaiResponses => format!("{base}/responses"),
            Wire::Anthropic => format!("{base}/v1/messages"),
        };
        // reqwest's rustls backend takes the process-wide provider: ring, as everywhere in keel.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            .tls_backend_rustls()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(30));
        if plain_http(&url) {
            // A plain-HTTP endpoint (a local model server) needs no TLS: trusting no root skips
            // loading and parsing the system's (~19 M instructions, a few ms of every start),
            // and a redirect to `https://` fails certificate verification instead of being
            // trusted.
            http = http.tls_certs_only([]);
        }
        let http = http
            .build()
            .map_err(|e| ModelError::HttpClient(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                wire,
                config,
                url,
                api_key,
                http,
                kept: crate::kept::Kept::default(),
            }),
        })
    }

    /// The wire protocol.
    pub fn wire(&self) -> Wire {
        self.inner.wire
    }

    /// The bytes of the JSON body [`ModelClient::stream`] sends for `request`, encoded straight
    /// from it (no intermediate `serde_json::Value`; see the wire modules for each shape).
    ///
    /// # Errors
    /// serde_json's encoding error, which the request's types cannot cause (every field is a
    /// string, a number, a flag or a `serde_json::Value`); kept so that a later field that could
    /// fail is reported as a classified provider error, not a panic.
    pub fn encode_body(&self, request: &ModelRequest) -> serde_json::Result<Vec<u8>> {
        let c = &self.inner.config;
        let kept = &self.inner.kept;
        let tools = kept.tools(self.inner.wire, &request.tools)?;
        let tools = tools.as_deref();
        match self.inner.wire {
            Wire::OpenaiChat => kept.with_transcript(
                &crate::openai_chat::body(&c.model, c.legacy_max_tokens, request, tools),
                "messages",
                crate::openai_chat::system_item(request)?,
                request,
                |rest, items| {
                    crate::body::each_message(rest, items, crate::openai_chat::write_items)
                },
            ),
            Wire::OpenaiResponses => kept.with_transcript(
                &crate::openai_responses::body(&c.model, c.encrypted_reasoning, request, tools),
                "input",
                None,
                request,
                |rest, items| {
                    crate::body::each_message(rest, items, crate::openai_responses::write_items)
                },
            ),
            Wire::Anthropic => kept.with_transcript(
                &crate::anthropic::body(
                    &c.model,
                    c.default_max_tokens.unwrap_or(8192),
                    request,
                    tools,
                ),
                "messages",
                None,
                request,
                crate::anthropic::write_turns,
            ),
        }
    }

    /// The JSON body this model would send for `request` (for inspection and tests): the
    /// bytes of [`HttpModel::encode_body`], parsed.
    ///
    /// # Errors
    /// As [`HttpModel::encode_body`].
    pub fn request_body(&self, request: &ModelRequest) -> serde_json::Result<serde_json::Value> {
        serde_json::from_slice(&self.encode_body(request)?)
    }
}

impl ModelClient for HttpModel {
    fn model(&self) -> &str {
        &self.inner.config.model
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let inner = self.inner.clone();
        // The body is encoded here, before the wait: a call waiting for its first token holds
        // the bytes it sent, not the JSON tree they were built from nor the request.
        let body = self.encode_body(&request);
        let call = Call {
            cancel: request.cancel,
            timeouts: request.timeouts,
        };
        event_stream(move |mut sink| async move {
            run(inner, body, call, &mut sink).await;
        })
    }
}

/// Whether `url` is plain HTTP (scheme `http`, any case: RFC 3986 §3.1).
fn plain_http(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("http"))
}

/// What a call's stream keeps of its [`ModelRequest`] once the body is encoded.
struct Call {
    cancel: tokio_util::sync::CancellationToken,
    timeouts: RequestTimeouts,
}

fn reqwest_error(e: &reqwest::Error) -> ProviderError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::ServerError
    };
    ProviderError::new(kind, format!("HTTP request failed: {e}"))
}

async fn run(
    inner: Arc<Inner>,
    body: serde_json::Result<Vec<u8>>,
    request: Call,
    sink: &mut ChannelSink,
) {
    let started = Instant::now();
    let t = inner.config.timeouts.overridden_by(&request.timeouts);
    let limits = Limits {
        first_token: t.first_token_ms.map(Duration::from_millis),
        total: t.total_ms.map(Duration::from_millis),
        idle: t.idle_ms.map(Duration::from_millis),
        started: Some(started),
        cancel: request.cancel.clone(),
    };
    let far = started + Duration::from_secs(365 * 24 * 3600);
    let header_deadline = [limits.first_token, limits.total]
        .into_iter()
        .flatten()
        .map(|d| started + d)
        .min()
        .unwrap_or(far);

    let mut http = inner
        .http
        .post(&inner.url)
        .header("content-type", "application/json");
    http = match (inner.wire, &inner.api_key) {
        (Wire::Anthropic, key) => {
            let http = http.header("anthropic-version", crate::anthropic::ANTHROPIC_VERSION);
            match key {
                Some(key) => http.header("x-api-key", key),
                None => http,
            }
        }
        (_, Some(key)) => http.bearer_auth(key),
        (_, None) => http,
    };
    let bytes = match body {
        Ok(b) => b,
        Err(e) => {
            let error = ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("cannot encode request: {e}"),
            );
            let _ = sink.emit(StreamEvent::Error { error }).await;
            return;
        }
    };
    let response = tokio::select! {
        biased;
        () = request.cancel.cancelled() => {
            let _ = sink.emit(StreamEvent::Cancelled).await;
            return;
        }
        () = tokio::time::sleep_until(header_deadline) => {
            let error = ProviderError::new(ErrorKind::Timeout, "no response headers within the time limit");
            let _ = sink.emit(StreamEvent::Error { error }).await;
            return;
        }
        r = http.body(bytes).send() => r,
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            let _ = sink
                .emit(StreamEvent::Error {
                    error: reqwest_error(&e),
                })
                .await;
            return;
        }
    };
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let total_deadline = limits.total.map_or(far, |d| started + d);
        let text = tokio::select! {
            biased;
            () = request.cancel.cancelled() => {
                let _ = sink.emit(StreamEvent::Cancelled).await;
                return;
            }
            // A slow error body must not outlive the response's time limit; the status alone
            // still classifies it.
            () = tokio::time::sleep_until(total_deadline) => String::new(),
            text = response.text() => text.unwrap_or_default(),
        };
        let error = classify_http(status.as_u16(), &headers, &text);
        let _ = sink.emit(StreamEvent::Error { error }).await;
        return;
    }
    pump(response.bytes_stream(), inner.wire.parser(), limits, sink).await;
}

#[cfg(test)]
mod tests {
    use super::plain_http;

    /// Only an `http` scheme (any case) skips the system's roots; `https`, a missing scheme
    /// and look-alikes keep them.
    #[test]
    fn only_an_http_scheme_is_plain() {
        for url in [
            "http://127.0.0.1:8080/v1/chat/completions",
            "HTTP://localhost/v1/messages",
        ] {
            assert!(plain_http(url), "{url}");
        }
        for url in [
            "https://api.openai.com/v1/responses",
            "httpx://h/v1",
            "127.0.0.1:8080/v1",
            "https+http://h",
            "",
        ] {
            assert!(!plain_http(url), "{url}");
        }
    }
}
