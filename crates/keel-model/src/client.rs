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
    /// The tool lists this model encoded last (at most [`TOOL_LISTS_KEPT`], the newest last)
    /// and their `tools` JSON on this wire. Every step of every session shown the same tools
    /// shares one list (`ModelRequest::tools` is an `Arc`), so its schemas are escaped once, not
    /// at every request (issue 16); a parent and its sub-agents (other lists on the same model)
    /// each keep theirs. The `Arc`s held here keep a list's address from being reused while it
    /// is a key.
    tools_json: std::sync::Mutex<Vec<EncodedTools>>,
    /// The transcripts this model encoded last (at most [`TRANSCRIPTS_KEPT`], the newest
    /// last): a step's transcript is the last step's with messages added
    /// (the same `Arc`s), so only the added ones are escaped and encoded; the rest is copied
    /// (issue 16: escaping the whole transcript at every step was ~16 % of a 199-step run's
    /// instructions).
    transcripts: std::sync::Mutex<Vec<EncodedTranscript>>,
}

/// How many encoded transcripts an [`HttpModel`] keeps (about one per session it serves at
/// once; a session past them is encoded whole at each step, as without the cache).
const TRANSCRIPTS_KEPT: usize = 32;

/// A transcript and its items on one wire ([`crate::body::WriteItems`] of each message,
/// comma-separated, without the brackets).
struct EncodedTranscript {
    messages: Vec<Arc<crate::Message>>,
    items: Vec<u8>,
}

/// How many encoded tool lists an [`HttpModel`] keeps.
const TOOL_LISTS_KEPT: usize = 8;

/// A tool list and its JSON on one wire.
type EncodedTools = (Arc<[crate::ToolSchema]>, Arc<serde_json::value::RawValue>);

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
                tools_json: std::sync::Mutex::new(Vec::new()),
                transcripts: std::sync::Mutex::new(Vec::new()),
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
        let tools = self.tools_json(&request.tools)?;
        let tools = tools.as_deref();
        match self.inner.wire {
            Wire::OpenaiChat => self.with_transcript(
                &crate::openai_chat::body(&c.model, c.legacy_max_tokens, request, tools),
                "messages",
                crate::openai_chat::system_item(request)?,
                request,
                |rest, items| {
                    crate::body::each_message(rest, items, crate::openai_chat::write_items)
                },
            ),
            Wire::OpenaiResponses => self.with_transcript(
                &crate::openai_responses::body(&c.model, c.encrypted_reasoning, request, tools),
                "input",
                None,
                request,
                |rest, items| {
                    crate::body::each_message(rest, items, crate::openai_responses::write_items)
                },
            ),
            Wire::Anthropic => self.with_transcript(
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

    /// `body` (an object) with the array `key` added last: `first` (an item, encoded), then
    /// the request's messages as `write` encodes them ([`crate::body::each_message`]). The
    /// items of the longest kept transcript that the request's begins with (the same `Arc`s,
    /// in order) are reused and only the messages after them encoded; what they settle is
    /// kept for the next request.
    ///
    /// # Errors
    /// As [`HttpModel::encode_body`].
    fn with_transcript(
        &self,
        body: &impl serde::Serialize,
        key: &str,
        first: Option<Vec<u8>>,
        request: &ModelRequest,
        write: impl Fn(&[Arc<crate::Message>], &mut Vec<u8>) -> serde_json::Result<(usize, Vec<u8>)>,
    ) -> serde_json::Result<Vec<u8>> {
        let messages = &request.messages;
        let kept = self.take_transcript(messages);
        let (mut items, mut encoded) =
            kept.map_or((Vec::new(), Vec::new()), |t| (t.items, t.messages));
        let done = encoded.len();
        let (settled, open) = write(&messages[done..], &mut items)?;
        let mut out = Vec::with_capacity(items.len() + 1024);
        serde_json::to_writer(&mut out, body)?;
        // `{…}` → `{…,"key":[first,items]}`.
        if out.pop() != Some(b'}') {
            return Err(serde::ser::Error::custom("a request body is not an object"));
        }
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key)?;
        out.extend_from_slice(b":[");
        let parts = [first.as_deref().unwrap_or_default(), &items, &open];
        for (k, part) in parts.iter().filter(|p| !p.is_empty()).enumerate() {
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(part);
        }
        out.extend_from_slice(b"]}");
        // Only the newly settled messages are added: copying the whole list would touch every
        // message's reference count at every step.
        encoded.extend_from_slice(&messages[done..done + settled]);
        self.keep_transcript(EncodedTranscript {
            messages: encoded,
            items,
        });
        Ok(out)
    }

    /// Takes out the longest kept transcript that `messages` begins with.
    fn take_transcript(&self, messages: &[Arc<crate::Message>]) -> Option<EncodedTranscript> {
        let mut kept = self
            .inner
            .transcripts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let prefix = |t: &EncodedTranscript| {
            t.messages.len() <= messages.len()
                && t.messages
                    .iter()
                    .zip(messages)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
        };
        let at = (0..kept.len())
            .filter(|&i| prefix(&kept[i]))
            .max_by_key(|&i| kept[i].messages.len())?;
        Some(kept.remove(at))
    }

    /// Keeps `transcript` as the newest, dropping the oldest past [`TRANSCRIPTS_KEPT`].
    fn keep_transcript(&self, transcript: EncodedTranscript) {
        let mut kept = self
            .inner
            .transcripts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() >= TRANSCRIPTS_KEPT {
            kept.remove(0);
        }
        kept.push(transcript);
    }

    /// `tools` as this wire's `tools` array, encoded: `None` for an empty list; a kept
    /// encoding when `tools` is a list it was made of (the same `Arc`), else a new one, kept
    /// for the next requests (the oldest kept one dropped past [`TOOL_LISTS_KEPT`]). The
    /// encoding runs without the lock held.
    ///
    /// # Errors
    /// As [`HttpModel::encode_body`].
    fn tools_json(
        &self,
        tools: &Arc<[crate::ToolSchema]>,
    ) -> serde_json::Result<Option<Arc<serde_json::value::RawValue>>> {
        if tools.is_empty() {
            return Ok(None);
        }
        let kept = || {
            self.inner
                .tools_json
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let find = |kept: &[EncodedTools]| {
            kept.iter()
                .find(|(list, _)| Arc::ptr_eq(list, tools))
                .map(|(_, json)| json.clone())
        };
        if let Some(json) = find(&kept()) {
            return Ok(Some(json));
        }
        let json: Arc<serde_json::value::RawValue> = Arc::from(match self.inner.wire {
            Wire::OpenaiChat => serde_json::value::to_raw_value(&crate::openai_chat::tools(tools)),
            Wire::OpenaiResponses => {
                serde_json::value::to_raw_value(&crate::openai_responses::tools(tools))
            }
            Wire::Anthropic => serde_json::value::to_raw_value(&crate::anthropic::tools(tools)),
        }?);
        let mut kept = kept();
        // Another request may have encoded the same list meanwhile.
        if find(&kept).is_none() {
            if kept.len() == TOOL_LISTS_KEPT {
                kept.remove(0);
            }
            kept.push((tools.clone(), json.clone()));
        }
        Ok(Some(json))
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
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::plain_http;
    use crate::{HttpModel, ModelRequest, ProviderConfig, ToolSchema, Wire};

    fn tool_list(names: &[&str]) -> Arc<[ToolSchema]> {
        names
            .iter()
            .map(|n| ToolSchema {
                name: (*n).to_owned(),
                description: format!("the {n} tool"),
                parameters: json!({"type": "object", "properties": {n.to_string(): {"type": "string"}}}),
            })
            .collect()
    }

    /// The names in a body's `tools` (each wire nests them differently); `None` without tools.
    fn tool_names(body: &Value) -> Option<Vec<String>> {
        let tools = body.get("tools")?.as_array().unwrap();
        Some(
            tools
                .iter()
                .map(|t| {
                    let name = t.get("name").or_else(|| t.pointer("/function/name"));
                    name.and_then(Value::as_str).unwrap().to_owned()
                })
                .collect(),
        )
    }

    /// A body built from a kept transcript is the body a model with nothing kept builds, on
    /// every wire: as the transcript grows by a step, when it diverges
    /// from the kept one (another message where the kept one had its own), when it is shorter
    /// (a re-sampled step), with assistant messages that become no item at all at either end,
    /// with a user entry joining Anthropic's open user message, with and without a system
    /// prompt, and empty.
    #[test]
    fn a_kept_transcript_gives_the_body_a_fresh_encoding_gives() {
        use crate::{Message, ToolCall};
        let user = Arc::new(Message::User {
            content: "go \"now\"\n".into(),
        });
        let call = |k: usize| {
            Arc::new(Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall::new(
                    format!("call_{k}"),
                    "shell",
                    json!({"command": format!("echo {k}")}),
                )],
                reasoning: Vec::new(),
            })
        };
        let result = |k: usize| {
            Arc::new(Message::Tool {
                call_id: format!("call_{k}"),
                content: format!("{k}\n[exit code 0]"),
                is_error: k % 2 == 1,
            })
        };
        let silent = Arc::new(Message::Assistant {
            text: String::new(),
            tool_calls: Vec::new(),
            reasoning: Vec::new(),
        });
        let (c1, r1, c2, r2) = (call(1), result(1), call(2), result(2));
        let transcripts: Vec<Vec<Arc<Message>>> = vec![
            vec![],
            vec![user.clone()],
            vec![user.clone(), c1.clone(), r1.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), c2.clone(), r2.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), call(3), result(3)],
            vec![user.clone(), c1.clone()],
            vec![silent.clone(), user.clone(), c1.clone(), silent.clone()],
            vec![
                silent.clone(),
                user.clone(),
                c1.clone(),
                silent.clone(),
                r1.clone(),
            ],
            vec![silent.clone()],
            // Anthropic: a user entry after a tool result joins the open user message.
            vec![user.clone(), c1.clone(), r1.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), user.clone()],
            vec![
                user.clone(),
                c1.clone(),
                r1.clone(),
                user.clone(),
                silent.clone(),
            ],
            vec![
                user.clone(),
                c1.clone(),
                r1.clone(),
                user.clone(),
                c2.clone(),
                r2.clone(),
            ],
        ];
        for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
            let config = ProviderConfig::new("m").with_base_url("http://127.0.0.1:9/v1");
            let kept = HttpModel::new(wire, config.clone()).unwrap();
            for instructions in [None, Some("be brief".to_owned())] {
                for messages in &transcripts {
                    let request = ModelRequest {
                        instructions: instructions.clone(),
                        messages: messages.clone(),
                        ..ModelRequest::default()
                    };
                    let fresh = HttpModel::new(wire, config.clone()).unwrap();
                    let expected = fresh.request_body(&request).unwrap();
                    assert_eq!(
                        kept.request_body(&request).unwrap(),
                        expected,
                        "{wire:?}: {} messages",
                        messages.len()
                    );
                    if wire == Wire::Anthropic {
                        continue;
                    }
                    let key = if wire == Wire::OpenaiChat {
                        "messages"
                    } else {
                        "input"
                    };
                    let items = expected[key].as_array().unwrap().len();
                    let system = usize::from(wire == Wire::OpenaiChat && instructions.is_some());
                    let silent_ones = messages.iter().filter(|m| Arc::ptr_eq(m, &silent)).count();
                    let expect_items = if wire == Wire::OpenaiChat {
                        messages.len() + system
                    } else {
                        messages.len() - silent_ones
                    };
                    assert_eq!(items, expect_items, "{wire:?}: {expected}");
                }
            }
        }
    }

    /// The encoded tool list is reused only for the list it was made of: another list (even
    /// one of the same length), an empty one and the first one again are each sent as they are,
    /// on every wire, and a list equal to the cached one but not the same `Arc` is encoded
    /// anew to the same JSON.
    #[test]
    fn each_request_is_sent_its_own_tool_list() {
        for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
            let model = HttpModel::new(
                wire,
                ProviderConfig::new("m").with_base_url("http://127.0.0.1:9/v1"),
            )
            .unwrap();
            let (a, b) = (tool_list(&["read", "grep"]), tool_list(&["write", "shell"]));
            let mut request = ModelRequest::default();
            let mut names = |tools: &Arc<[ToolSchema]>| {
                request.tools = tools.clone();
                tool_names(&model.request_body(&request).unwrap())
            };
            let expect = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect());
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            assert_eq!(names(&b), expect(&["write", "shell"]), "{wire:?}");
            assert_eq!(names(&Arc::from([])), None, "{wire:?}");
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            // More lists than are kept, then each again: each still sent its own.
            let many: Vec<Arc<[ToolSchema]>> = (0..super::TOOL_LISTS_KEPT + 3)
                .map(|i| tool_list(&[&format!("t{i}")]))
                .collect();
            for _ in 0..2 {
                for (i, list) in many.iter().enumerate() {
                    assert_eq!(names(list), expect(&[&format!("t{i}")]), "{wire:?}");
                }
            }
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            let first = model.request_body(&request).unwrap();
            request.tools = tool_list(&["read", "grep"]);
            assert_eq!(model.request_body(&request).unwrap(), first, "{wire:?}");
        }
    }

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
