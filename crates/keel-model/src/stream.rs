//! From SSE bytes to normalized events, shared by the three wire adapters.
//!
//! Each wire has a sans-I/O parser ([`WireParser`]) fed one SSE event at a time; [`pump`] drives it
//! over a byte stream (live HTTP body or a recorded file) with the first-token, total and idle
//! deadlines and the cancellation token, and hands normalized events to a [`Sink`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorKind, ModelError, ProviderError};
use crate::types::{InvalidArguments, StopReason, StreamEvent};

/// A provider wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wire {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`), also OpenAI-compatible servers.
    OpenaiChat,
    /// OpenAI Responses (`POST /v1/responses`).
    OpenaiResponses,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
}

impl Wire {
    /// All wires.
    pub const ALL: [Wire; 3] = [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic];

    /// The command-line name (`openai-chat`, `openai-responses`, `anthropic`).
    pub fn as_str(self) -> &'static str {
        match self {
            Wire::OpenaiChat => "openai-chat",
            Wire::OpenaiResponses => "openai-responses",
            Wire::Anthropic => "anthropic",
        }
    }

    /// A fresh parser for one response of this wire.
    pub(crate) fn parser(self) -> Box<dyn WireParser> {
        match self {
            Wire::OpenaiChat => Box::new(crate::openai_chat::ChatParser::default()),
            Wire::OpenaiResponses => Box::new(crate::openai_responses::ResponsesParser::default()),
            Wire::Anthropic => Box::new(crate::anthropic::AnthropicParser::default()),
        }
    }
}

impl std::str::FromStr for Wire {
    type Err = ModelError;

    /// Parses `openai-chat`, `openai-responses` or `anthropic` (snake_case also accepted).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.replace('_', "-").as_str() {
            "openai-chat" => Ok(Wire::OpenaiChat),
            "openai-responses" => Ok(Wire::OpenaiResponses),
            "anthropic" => Ok(Wire::Anthropic),
            _ => Err(ModelError::UnknownWire(s.to_string())),
        }
    }
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sans-I/O parser for one response of one wire.
pub(crate) trait WireParser: Send {
    /// Handles one SSE event (`name` is `message` when the wire sends no `event:` line).
    fn event(&mut self, name: &str, data: &str, out: &mut Vec<StreamEvent>);
    /// Whether a terminal event has been emitted (nothing more will be read).
    fn done(&self) -> bool;
    /// Usage the response reported that no [`StreamEvent::Usage`] carried yet (Anthropic counts
    /// the prompt in `message_start`): [`pump`] emits it before a response that fails or is
    /// cancelled ends, so a failed attempt's tokens are counted. Returns it once.
    fn unreported_usage(&mut self) -> Option<crate::types::Usage> {
        None
    }
}

/// Parses an SSE `data` payload as JSON, or yields the classified error for a malformed chunk.
pub(crate) fn parse_json(data: &str) -> Result<Value, ProviderError> {
    serde_json::from_str(data).map_err(|e| {
        let shown: String = data.chars().take(200).collect();
        ProviderError::new(
            ErrorKind::StreamTruncated,
            format!("malformed chunk ({e}): {shown}"),
        )
    })
}

/// The non-empty string at `key` of `v`.
pub(crate) fn nonempty_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|t| !t.is_empty())
}

/// The `u64` at `pointer` in `v`, 0 when absent.
pub(crate) fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// A tool call being assembled from fragments.
#[derive(Debug)]
struct PendingCall {
    key: String,
    id: String,
    name: String,
    arguments: String,
    ended: bool,
}

/// Assembles tool calls from start/delta/end fragments, keyed by the wire's own handle (Chat:
/// `index`; Responses: item id; Anthropic: block index), and validates arguments.
///
/// A call whose arguments are valid ends as soon as the wire says so. A call whose arguments are
/// not a JSON object is held until the stop reason is known ([`ToolCallAssembler::finish`]): it is
/// marked [`InvalidArguments::Truncated`] when the response stopped at `max_tokens`, else
/// [`InvalidArguments::Malformed`].
#[derive(Debug, Default)]
pub(crate) struct ToolCallAssembler {
    calls: Vec<PendingCall>,
}

impl ToolCallAssembler {
    /// Starts a call; a second start for the same key is ignored.
    pub(crate) fn start(&mut self, key: &str, id: &str, name: &str, out: &mut Vec<StreamEvent>) {
        if self.calls.iter().any(|c| c.key == key) {
            return;
        }
        self.calls.push(PendingCall {
            key: key.to_string(),
            id: id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
            ended: false,
        });
        out.push(StreamEvent::ToolCallStart {
            id: id.to_string(),
            name: name.to_string(),
        });
    }

    /// Appends an argument fragment; empty fragments and unknown keys are ignored.
    pub(crate) fn delta(&mut self, key: &str, delta: &str, out: &mut Vec<StreamEvent>) {
        if delta.is_empty() {
            return;
        }
        if let Some(call) = self.calls.iter_mut().find(|c| c.key == key && !c.ended) {
            call.arguments.push_str(delta);
            out.push(StreamEvent::ToolCallDelta {
                id: call.id.clone(),
                delta: delta.to_string(),
            });
        }
    }

    /// Ends a call if its arguments are valid; `complete` replaces the accumulated text when the
    /// wire repeats the full arguments (Responses `output_item.done`).
    pub(crate) fn end(&mut self, key: &str, complete: Option<&str>, out: &mut Vec<StreamEvent>) {
        let Some(call) = self.calls.iter_mut().find(|c| c.key == key && !c.ended) else {
            return;
        };
        if let Some(full) = complete {
            call.arguments = full.to_string();
        }
        if let Ok(arguments) = parse_arguments(&call.arguments) {
            call.ended = true;
            out.push(StreamEvent::ToolCallEnd {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments,
                raw_arguments: call.arguments.clone(),
                invalid: None,
            });
        }
    }

    /// Ends every call still open, given the response's stop reason.
    pub(crate) fn finish(&mut self, stop: StopReason, out: &mut Vec<StreamEvent>) {
        for call in self.calls.iter_mut().filter(|c| !c.ended) {
            call.ended = true;
            let (arguments, invalid) = match parse_arguments(&call.arguments) {
                Ok(args) => (args, None),
                Err(_) if stop == StopReason::MaxTokens => (
                    Value::String(call.arguments.clone()),
                    Some(InvalidArguments::Truncated),
                ),
                Err(error) => (
                    Value::String(call.arguments.clone()),
                    Some(InvalidArguments::Malformed { error }),
                ),
            };
            out.push(StreamEvent::ToolCallEnd {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments,
                raw_arguments: call.arguments.clone(),
                invalid,
            });
        }
    }

    /// Whether any call was started.
    pub(crate) fn any(&self) -> bool {
        !self.calls.is_empty()
    }
}

/// Parses tool arguments: empty text is `{}`; anything else must be a JSON object.
fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("expected a JSON object".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Where [`pump`] delivers events.
pub(crate) trait Sink {
    /// Delivers one event; false when the receiver is gone (stop reading).
    fn emit(&mut self, event: StreamEvent) -> impl std::future::Future<Output = bool> + Send;
}

impl Sink for Vec<StreamEvent> {
    async fn emit(&mut self, event: StreamEvent) -> bool {
        self.push(event);
        true
    }
}

/// Deadlines and cancellation for one response.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// Fails with `timeout` unless a content event (text, reasoning, tool call, completion)
    /// arrives within this duration of the request being sent.
    pub first_token: Option<Duration>,
    /// Fails with `timeout` unless the response completes within this duration.
    pub total: Option<Duration>,
    /// After the first content event, fails with `timeout` when no bytes at all arrive for this
    /// long (SSE comments and pings count).
    pub idle: Option<Duration>,
    /// When the request was sent.
    pub started: Option<Instant>,
    /// Ends the stream with `cancelled`.
    pub cancel: CancellationToken,
}

fn is_content(event: &StreamEvent) -> bool {
    matches!(
        event,
        StreamEvent::TextDelta { .. }
            | StreamEvent::ReasoningDelta { .. }
            | StreamEvent::Reasoning { .. }
            | StreamEvent::ToolCallStart { .. }
            | StreamEvent::Completed { .. }
            | StreamEvent::Error { .. }
    )
}

/// Reads SSE events from `bytes` into `parser` until a terminal event, the end of the stream
/// (`stream_truncated`), a deadline (`timeout`: first token, total, or no bytes for the idle
/// limit once content has started) or cancellation (`cancelled`), delivering every normalized
/// event to `sink`. Returns when the stream is over or the sink is gone.
pub(crate) async fn pump<S, B, E>(
    bytes: S,
    mut parser: Box<dyn WireParser>,
    limits: Limits,
    sink: &mut impl Sink,
) where
    S: Stream<Item = Result<B, E>> + Send + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let started = limits.started.unwrap_or_else(Instant::now);
    let far = started + Duration::from_secs(365 * 24 * 3600);
    let total_deadline = limits.total.map(|d| started + d).unwrap_or(far);
    let mut first_token_deadline = limits.first_token.map(|d| started + d);
    // When bytes last arrived, ms after `started`: any chunk counts, even one that completes no
    // SSE event (a keep-alive comment), so the idle limit measures silence, not slowness.
    let last_bytes_ms = Arc::new(AtomicU64::new(0));
    let since_start = move || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let seen = last_bytes_ms.clone();
    let bytes = bytes.inspect(move |_| seen.store(since_start(), Ordering::Relaxed));
    let last_bytes = || started + Duration::from_millis(last_bytes_ms.load(Ordering::Relaxed));
    let mut events = bytes.eventsource();
    let mut out = Vec::new();
    let mut queue = VecDeque::new();
    // Whether the response carried anything: a completion without text or tool calls is an
    // `empty_response` error (retryable), never an empty answer.
    let mut saw_content = false;
    // Whether a content event arrived: from then on the idle limit applies.
    let mut started_content = false;
    loop {
        let idle_deadline = limits
            .idle
            .filter(|_| started_content)
            .map(|d| last_bytes() + d);
        let deadline = [first_token_deadline, idle_deadline]
            .into_iter()
            .flatten()
            .fold(total_deadline, Instant::min);
        let next = tokio::select! {
            biased;
            () = limits.cancel.cancelled() => {
                drop(events);
                if let Some(usage) = parser.unreported_usage() {
                    let _ = sink.emit(StreamEvent::Usage { usage }).await;
                }
                let _ = sink.emit(StreamEvent::Cancelled).await;
                return;
            }
            () = tokio::time::sleep_until(deadline) => {
                let now = Instant::now();
                let which = if first_token_deadline.is_some_and(|d| d <= total_deadline) {
                    "no first token within the time-to-first-token limit".to_owned()
                } else if now >= total_deadline {
                    "response not complete within the total time limit".to_owned()
                } else if let Some(idle) = limits.idle
                    && now >= last_bytes() + idle
                {
                    format!(
                        "the stream stalled: no data for {} ms mid-response (the stream idle limit)",
                        idle.as_millis()
                    )
                } else {
                    // Bytes arrived meanwhile: the idle deadline moved on.
                    continue;
                };
                let error = ProviderError::new(ErrorKind::Timeout, which);
                if let Some(usage) = parser.unreported_usage() {
                    let _ = sink.emit(StreamEvent::Usage { usage }).await;
                }
                let _ = sink.emit(StreamEvent::Error { error }).await;
                return;
            }
            next = events.next() => next,
        };
        match next {
            Some(Ok(event)) => parser.event(&event.event, &event.data, &mut out),
            Some(Err(EventStreamError::Transport(e))) => out.push(StreamEvent::Error {
                error: ProviderError::new(
                    ErrorKind::StreamTruncated,
                    format!("connection failed mid-stream: {e}"),
                ),
            }),
            Some(Err(e)) => out.push(StreamEvent::Error {
                error: ProviderError::new(
                    ErrorKind::StreamTruncated,
                    format!("unreadable stream: {e}"),
                ),
            }),
            None => out.push(StreamEvent::Error {
                error: ProviderError::new(
                    ErrorKind::StreamTruncated,
                    "the stream ended before its terminal event (connection closed)",
                ),
            }),
        }
        queue.extend(out.drain(..));
        while let Some(mut event) = queue.pop_front() {
            if is_content(&event) {
                first_token_deadline = None;
                started_content = true;
            }
            if matches!(
                event,
                StreamEvent::TextDelta { .. }
                    | StreamEvent::ToolCallStart { .. }
                    | StreamEvent::ToolCallEnd { .. }
            ) {
                saw_content = true;
            }
            if !saw_content && matches!(event, StreamEvent::Completed { .. }) {
                event = StreamEvent::Error {
                    error: ProviderError::new(
                        ErrorKind::EmptyResponse,
                        "the response completed with no text and no tool call",
                    ),
                };
            }
            if matches!(event, StreamEvent::Error { .. })
                && let Some(usage) = parser.unreported_usage()
                && !sink.emit(StreamEvent::Usage { usage }).await
            {
                return;
            }
            let terminal = event.is_terminal();
            if !sink.emit(event).await || terminal {
                return;
            }
        }
        if parser.done() {
            return;
        }
    }
}

/// Parses a recorded SSE body (as saved from a provider) into normalized events. The same parser
/// and pump as live streams; a missing final blank line (files trimmed when saved) is supplied.
/// A body that ends before its terminal event yields a final `stream_truncated` error.
pub async fn parse_recorded(wire: Wire, body: &[u8]) -> Vec<StreamEvent> {
    let mut owned = body.to_vec();
    while owned
        .last()
        .is_some_and(|b| *b == b'\r' || *b == b'\n' || *b == b' ')
    {
        owned.pop();
    }
    owned.extend_from_slice(b"\n\n");
    let bytes = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(owned)]);
    let mut events = Vec::new();
    pump(bytes, wire.parser(), Limits::default(), &mut events).await;
    events
}

/// Parses a response body delivered in `chunks`, exactly as a live HTTP body is read: the same
/// SSE decoding, parser and pump as [`crate::HttpModel`], with no deadlines, no cancellation and
/// no repair of a missing final blank line (unlike [`parse_recorded`]). Whatever the bytes, the
/// result ends with exactly one terminal event (`completed`, or an `error` classified as
/// `stream_truncated`, `empty_response` or the provider's own error kind) and holds no other;
/// how the body is split into chunks does not change the events (error messages aside).
///
/// For fuzzing and replaying byte streams; see docs/RELIABILITY.md.
pub async fn parse_chunks<B: AsRef<[u8]> + Send>(
    wire: Wire,
    chunks: impl IntoIterator<Item = B>,
) -> Vec<StreamEvent> {
    let chunks: Vec<Result<B, std::convert::Infallible>> = chunks.into_iter().map(Ok).collect();
    let mut events = Vec::new();
    pump(
        futures_util::stream::iter(chunks),
        wire.parser(),
        Limits::default(),
        &mut events,
    )
    .await;
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn assembler_holds_invalid_call_until_stop_reason() {
        let mut a = ToolCallAssembler::default();
        let mut out = Vec::new();
        a.start("0", "c1", "shell", &mut out);
        a.delta("0", "{\"command\": \"l", &mut out);
        a.end("0", None, &mut out);
        assert_eq!(
            out.len(),
            2,
            "invalid call must not end before the stop reason"
        );
        a.finish(StopReason::MaxTokens, &mut out);
        assert_eq!(
            out.last(),
            Some(&StreamEvent::ToolCallEnd {
                id: "c1".into(),
                name: "shell".into(),
                arguments: json!("{\"command\": \"l"),
                raw_arguments: "{\"command\": \"l".into(),
                invalid: Some(InvalidArguments::Truncated),
            })
        );
    }

    #[test]
    fn assembler_marks_non_object_as_malformed_and_empty_as_empty_object() {
        let mut a = ToolCallAssembler::default();
        let mut out = Vec::new();
        a.start("0", "c1", "t", &mut out);
        a.delta("0", "[1]", &mut out);
        a.start("1", "c2", "u", &mut out);
        a.end("1", None, &mut out);
        a.finish(StopReason::ToolUse, &mut out);
        assert!(
            matches!(&out[3], StreamEvent::ToolCallEnd { id, arguments, invalid: None, .. } if id == "c2" && arguments == &json!({}))
        );
        assert!(
            matches!(&out[4], StreamEvent::ToolCallEnd { id, invalid: Some(InvalidArguments::Malformed { .. }), .. } if id == "c1")
        );
    }

    /// Chat Completions frames: `text`, a finish chunk and `[DONE]`.
    fn chat(text: &str) -> (String, String) {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        (
            chunk(json!({"role": "assistant", "content": text}), Value::Null),
            chunk(json!({}), json!("stop")) + "data: [DONE]\n\n",
        )
    }

    /// A body of `(wait before, chunk)` pairs, then open and silent for good.
    fn timed(chunks: Vec<(u64, String)>) -> impl Stream<Item = Result<String, String>> + Unpin {
        let body = futures_util::stream::iter(chunks).then(|(ms, chunk)| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(chunk)
        });
        Box::pin(body.chain(futures_util::stream::pending()))
    }

    fn idle_limits(ms: u64) -> Limits {
        Limits {
            idle: Some(Duration::from_millis(ms)),
            ..Limits::default()
        }
    }

    /// Keep-alive comments complete no event, but they are bytes: a slow answer that keeps its
    /// connection alive is not a stall. (Time is paused: the waits are virtual.)
    #[tokio::test(start_paused = true)]
    async fn keep_alive_bytes_hold_off_the_idle_limit() {
        let (start, end) = chat("thinking");
        let mut chunks = vec![(0, start)];
        chunks.extend((0..10).map(|_| (200, ": keep-alive\n\n".to_owned())));
        chunks.push((200, end));
        let mut out = Vec::new();
        pump(
            timed(chunks),
            Wire::OpenaiChat.parser(),
            idle_limits(300),
            &mut out,
        )
        .await;
        assert!(
            matches!(out.last(), Some(StreamEvent::Completed { .. })),
            "{out:?}"
        );
    }

    /// Silence after the first content fails the response at the idle limit, not before; silence
    /// before any content is the first-token limit's business.
    #[tokio::test(start_paused = true)]
    async fn silence_after_content_is_a_timeout_at_the_idle_limit() {
        let (start, _) = chat("half an ans");
        let begun = Instant::now();
        let mut out = Vec::new();
        pump(
            timed(vec![(5_000, start)]),
            Wire::OpenaiChat.parser(),
            idle_limits(300),
            &mut out,
        )
        .await;
        let waited = begun.elapsed();
        assert!(
            matches!(out.last(), Some(StreamEvent::Error { error }) if error.kind == ErrorKind::Timeout),
            "{out:?}"
        );
        // 5 s before the first byte (no first-token limit here), then 300 ms of silence.
        assert_eq!(waited, Duration::from_millis(5_300));
    }

    #[test]
    fn wire_names_round_trip() {
        for wire in Wire::ALL {
            assert_eq!(wire.as_str().parse::<Wire>().unwrap(), wire);
        }
        assert!("gemini".parse::<Wire>().is_err());
    }
}
