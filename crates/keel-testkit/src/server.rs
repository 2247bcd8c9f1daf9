//! The fake model server: a real HTTP/1.1 server on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::serve::ListenerExt;
use keel_model::{ErrorKind, Script, ScriptAction, ScriptEntry, Wire};
use serde_json::{Value, json};

use crate::encode::{FakeResponse, FakeToolCall, encode, provider_names, stream_error_frame};

/// A request the server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Wire protocol, from the path.
    pub wire: Wire,
    /// Request path (`/v1/messages`).
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Parsed JSON body (`null` if it was not JSON).
    pub body: Value,
    /// When it arrived.
    pub received_at: std::time::Instant,
}

impl RecordedRequest {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Ids of tool calls in the request's transcript that have no tool result, per the wire's shape
    /// (Chat: assistant `tool_calls` vs `tool` messages; Responses: `function_call` vs
    /// `function_call_output`; Anthropic: `tool_use` vs `tool_result` blocks). Empty when every
    /// call has its result.
    pub fn unanswered_tool_calls(&self) -> Vec<String> {
        let b = &self.body;
        let arr = |v: &Value| v.as_array().cloned().unwrap_or_default();
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let (calls, results): (Vec<String>, Vec<String>) = match self.wire {
            Wire::OpenaiChat => {
                let msgs = arr(&b["messages"]);
                (
                    msgs.iter()
                        .flat_map(|m| arr(&m["tool_calls"]))
                        .map(|c| s(&c["id"]))
                        .collect(),
                    msgs.iter()
                        .filter(|m| m["role"] == "tool")
                        .map(|m| s(&m["tool_call_id"]))
                        .collect(),
                )
            }
            Wire::OpenaiResponses => {
                let items = arr(&b["input"]);
                (
                    items
                        .iter()
                        .filter(|i| i["type"] == "function_call")
                        .map(|i| s(&i["call_id"]))
                        .collect(),
                    items
                        .iter()
                        .filter(|i| i["type"] == "function_call_output")
                        .map(|i| s(&i["call_id"]))
                        .collect(),
                )
            }
            Wire::Anthropic => {
                let blocks: Vec<Value> = arr(&b["messages"])
                    .iter()
                    .flat_map(|m| arr(&m["content"]))
                    .collect();
                (
                    blocks
                        .iter()
                        .filter(|c| c["type"] == "tool_use")
                        .map(|c| s(&c["id"]))
                        .collect(),
                    blocks
                        .iter()
                        .filter(|c| c["type"] == "tool_result")
                        .map(|c| s(&c["tool_use_id"]))
                        .collect(),
                )
            }
        };
        calls.into_iter().filter(|c| !results.contains(c)).collect()
    }
}

/// A failure the server injects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 429 with `retry-after-ms` and `retry-after` (seconds, rounded up) headers.
    RateLimited {
        /// The wait to advertise, in ms.
        retry_after_ms: u64,
    },
    /// HTTP 500 with the wire's server-error body.
    ServerError,
    /// HTTP 529 (Anthropic `overloaded_error`; also used on the OpenAI wires).
    Overloaded,
    /// HTTP 200, then `after_frames` frames of a canned response, then the connection drops.
    Disconnect {
        /// Frames sent before dropping.
        after_frames: usize,
    },
    /// HTTP 200, then `after_frames` frames of a canned response, then nothing: the connection
    /// stays open and silent until the client closes it (a provider that stalls mid-stream).
    Stall {
        /// Frames sent before going silent.
        after_frames: usize,
    },
    /// HTTP 200, then `after_frames` frames, then a chunk that is not JSON.
    MalformedChunk {
        /// Frames sent before the bad chunk.
        after_frames: usize,
    },
    /// HTTP 200, then `after_frames` frames, then the wire's in-stream `error` event for `kind`.
    StreamError {
        /// The error class.
        kind: ErrorKind,
        /// Frames sent before the error event.
        after_frames: usize,
    },
    /// The HTTP error a provider sends for `kind` (status, body and headers per wire).
    Http(ErrorKind),
    /// As [`Fault::Http`], with retry-after headers when `retry_after_ms` is set and the body's
    /// message replaced when `message` is set.
    HttpError {
        /// The error class.
        kind: ErrorKind,
        /// Advertised wait (`retry-after-ms`, and `retry-after` in seconds rounded up).
        retry_after_ms: Option<u64>,
        /// Message in the error body (default `injected <kind>`).
        message: Option<String>,
    },
}

/// What the server answers one request with.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Stream this response.
    Respond(FakeResponse),
    /// Inject this failure.
    Fault(Fault),
    /// HTTP 200 streaming exactly these SSE frames (each a complete `event:`/`data:` block
    /// ending in a blank line), paced like a response: for streams no encoder makes (a usage
    /// report and then an error event, a response without usage).
    Frames(Vec<String>),
    /// Wait `delay_ms` before sending anything (not even headers), then answer with `reply`.
    Delayed {
        /// The wait, in ms.
        delay_ms: u64,
        /// The answer after the wait.
        reply: Box<Reply>,
    },
}

/// Computes the reply to a request.
pub type Handler = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

/// Latency of responses.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pacing {
    /// Wait before the first frame, in ms (headers go out at once).
    pub time_to_first_token_ms: u64,
    /// Frames per second after the first; `None` sends all frames at once.
    pub tokens_per_second: Option<f64>,
}

struct Shared {
    handler: Handler,
    pacing: Pacing,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Streamed bodies dropped before their last frame: the client closed the connection.
    abandoned: AtomicUsize,
}

/// A running fake model server; stops when dropped.
pub struct FakeModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeModelServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeModelServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reply for script entry `entry`: its response or failure, after its `delay_ms`.
pub fn reply_for(entry: &ScriptEntry) -> Reply {
    let reply = match &entry.action {
        ScriptAction::Respond {
            text,
            tool_calls,
            usage,
        } => {
            let mut r = FakeResponse::text(text.clone());
            r.tool_calls = tool_calls
                .iter()
                .map(|c| FakeToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.to_string(),
                })
                .collect();
            if let Some(u) = usage {
                r.usage = *u;
            }
            Reply::Respond(r)
        }
        // An empty response is a 200 with nothing in it, as a provider sends it.
        ScriptAction::Fail(e) if e.kind == ErrorKind::EmptyResponse => {
            Reply::Respond(FakeResponse::text(""))
        }
        ScriptAction::Fail(e) => Reply::Fault(match e.kind {
            ErrorKind::StreamTruncated => Fault::Disconnect { after_frames: 2 },
            kind => Fault::HttpError {
                kind,
                retry_after_ms: e.retry_after_ms,
                message: Some(e.message.clone()),
            },
        }),
    };
    if entry.delay_ms > 0 {
        Reply::Delayed {
            delay_ms: entry.delay_ms,
            reply: Box::new(reply),
        }
    } else {
        reply
    }
}

impl FakeModelServer {
    /// Starts a server answering with `handler`.
    ///
    /// # Errors
    /// When 127.0.0.1 cannot be bound.
    pub async fn start(handler: Handler, pacing: Pacing) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            handler,
            pacing,
            requests: Mutex::new(Vec::new()),
            abandoned: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        // Small separate writes meet Nagle's algorithm and delayed ACKs (~40 ms): no delay.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// Starts a server answering request `n` (1-based, in arrival order, any wire) with script
    /// line `n`, as the scripted model does; error lines become the provider's HTTP error for
    /// their kind with their retry-after (`stream_truncated`: a mid-stream disconnect), and
    /// `delay_ms` delays the answer ([`reply_for`]). Past the end it answers HTTP 400
    /// invalid_request naming the script and its line count.
    ///
    /// # Errors
    /// When 127.0.0.1 cannot be bound.
    pub async fn start_scripted(script: Script, pacing: Pacing) -> std::io::Result<Self> {
        let next = Mutex::new(0usize);
        let handler: Handler = Arc::new(move |_req| {
            let mut n = next.lock().unwrap_or_else(PoisonError::into_inner);
            let position = u64::try_from(*n).unwrap_or(u64::MAX);
            let reply = match script.entry_for(position) {
                Ok(entry) => reply_for(entry),
                Err(error) => Reply::Fault(Fault::HttpError {
                    kind: error.kind,
                    retry_after_ms: None,
                    message: Some(error.message),
                }),
            };
            *n += 1;
            reply
        });
        Self::start(handler, pacing).await
    }

    /// Starts a server giving the same reply to every request.
    ///
    /// # Errors
    /// When 127.0.0.1 cannot be bound.
    pub async fn start_fixed(reply: Reply, pacing: Pacing) -> std::io::Result<Self> {
        Self::start(Arc::new(move |_| reply.clone()), pacing).await
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL for OpenAI clients (`http://127.0.0.1:PORT/v1`).
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Base URL for Anthropic clients (`http://127.0.0.1:PORT`).
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The base URL a client of `wire` should use.
    pub fn base_url(&self, wire: Wire) -> String {
        match wire {
            Wire::Anthropic => self.anthropic_base_url(),
            Wire::OpenaiChat | Wire::OpenaiResponses => self.openai_base_url(),
        }
    }

    /// How many streamed (paced) responses were abandoned before their last frame because the
    /// client closed the connection. Counted when the server notices the close, which is when
    /// it next polls the socket or writes to it.
    pub fn abandoned_responses(&self) -> usize {
        self.shared.abandoned.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` until [`FakeModelServer::abandoned_responses`] reaches `n`; returns
    /// whether it did.
    pub async fn wait_for_abandoned(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.abandoned_responses() >= n {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn wire_of(path: &str) -> Option<Wire> {
    if path.ends_with("/chat/completions") {
        Some(Wire::OpenaiChat)
    } else if path.ends_with("/responses") {
        Some(Wire::OpenaiResponses)
    } else if path.ends_with("/messages") {
        Some(Wire::Anthropic)
    } else {
        None
    }
}

fn build(status: u16, headers: &[(&str, String)], body: Body) -> Response {
    let mut builder = Response::builder().status(status);
    for (k, v) in headers {
        builder = builder.header(*k, v);
    }
    builder
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let Some(wire) = wire_of(&path) else {
        return build(404, &[], Body::from(format!("no such endpoint: {path}")));
    };
    let request = RecordedRequest {
        wire,
        path,
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    v.to_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        received_at: std::time::Instant::now(),
    };
    let mut reply = (shared.handler)(&request);
    shared
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(request);
    while let Reply::Delayed {
        delay_ms,
        reply: next,
    } = reply
    {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        reply = *next;
    }
    let sse = [
        ("content-type", "text/event-stream".to_string()),
        ("cache-control", "no-cache".to_string()),
    ];
    let canned = || {
        encode(
            wire,
            &FakeResponse::text("This answer will not finish as it should."),
        )
    };
    match reply {
        Reply::Respond(response) => {
            let frames = encode(wire, &response);
            build(200, &sse, paced_body(frames, &shared, Tail::None))
        }
        Reply::Frames(frames) => build(200, &sse, paced_body(frames, &shared, Tail::None)),
        Reply::Fault(Fault::Disconnect { after_frames }) => build(
            200,
            &sse,
            paced_body(first(canned(), after_frames), &shared, Tail::Disconnect),
        ),
        Reply::Fault(Fault::Stall { after_frames }) => build(
            200,
            &sse,
            paced_body(first(canned(), after_frames), &shared, Tail::Stall),
        ),
        Reply::Fault(Fault::MalformedChunk { after_frames }) => {
            let mut frames = first(canned(), after_frames);
            frames.push(
                "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"ty\n\n"
                    .to_string(),
            );
            build(200, &sse, paced_body(frames, &shared, Tail::None))
        }
        Reply::Fault(Fault::StreamError { kind, after_frames }) => {
            let mut frames = first(canned(), after_frames);
            frames.push(stream_error_frame(wire, kind));
            build(200, &sse, paced_body(frames, &shared, Tail::None))
        }
        Reply::Fault(Fault::RateLimited { retry_after_ms }) => {
            http_error(wire, ErrorKind::RateLimited, Some(retry_after_ms), None)
        }
        Reply::Fault(Fault::ServerError) => http_error(wire, ErrorKind::ServerError, None, None),
        Reply::Fault(Fault::Overloaded) => http_error(wire, ErrorKind::Overloaded, None, None),
        Reply::Fault(Fault::Http(kind)) => http_error(wire, kind, None, None),
        Reply::Fault(Fault::HttpError {
            kind,
            retry_after_ms,
            message,
        }) => http_error(wire, kind, retry_after_ms, message),
        // Unwrapped above.
        Reply::Delayed { .. } => build(500, &[], Body::from("nested delay")),
    }
}

fn first(mut frames: Vec<String>, n: usize) -> Vec<String> {
    frames.truncate(n);
    frames
}

/// The HTTP error a provider of `wire` sends for `kind`.
fn http_error(
    wire: Wire,
    kind: ErrorKind,
    retry_after_ms: Option<u64>,
    message: Option<String>,
) -> Response {
    let status = match kind {
        ErrorKind::RateLimited => 429,
        ErrorKind::Overloaded => 529,
        ErrorKind::ServerError | ErrorKind::StreamTruncated | ErrorKind::EmptyResponse => 500,
        ErrorKind::Timeout => 504,
        ErrorKind::ContextOverflow | ErrorKind::InvalidRequest | ErrorKind::ContentFilter => 400,
        ErrorKind::Authentication => 401,
        ErrorKind::Quota => {
            if wire == Wire::Anthropic {
                402
            } else {
                429
            }
        }
    };
    let message = message.unwrap_or_else(|| match kind {
        ErrorKind::ContextOverflow => {
            "prompt is too long: 210000 tokens > 200000 maximum".to_string()
        }
        ErrorKind::ContentFilter => "Output blocked by content filtering policy".to_string(),
        other => format!("injected {other}"),
    });
    // Anthropic reports a content filter only in the message of an invalid_request_error.
    let message = if kind == ErrorKind::ContentFilter && !message.contains("content filtering") {
        format!("Output blocked by content filtering policy: {message}")
    } else {
        message
    };
    let (anthropic_type, openai_code) = provider_names(kind);
    let body = match wire {
        Wire::Anthropic => {
            json!({"type": "error", "error": {"type": anthropic_type, "message": message}})
        }
        _ => {
            json!({"error": {"message": message, "type": openai_code, "param": null, "code": openai_code}})
        }
    };
    let mut headers = vec![("content-type", "application/json".to_string())];
    if let Some(ms) = retry_after_ms {
        headers.push(("retry-after-ms", ms.to_string()));
        headers.push(("retry-after", ms.div_ceil(1000).to_string()));
    }
    build(status, &headers, Body::from(body.to_string()))
}

enum Tail {
    None,
    Disconnect,
    /// Never end: the body stays open and sends nothing more.
    Stall,
}

/// Counts a streamed body as abandoned if it is dropped before its end.
struct EndGuard {
    shared: Arc<Shared>,
    ended: bool,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.ended {
            self.shared.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The response body: one buffer (a single write) when there is no pacing, else frames paced
/// by time to first token and tokens per second; `Tail::Disconnect` aborts the connection after
/// the last frame, `Tail::Stall` keeps it open and silent. A paced body dropped before its end
/// counts as abandoned.
fn paced_body(frames: Vec<String>, shared: &Arc<Shared>, tail: Tail) -> Body {
    let pacing = shared.pacing;
    let unpaced = pacing.time_to_first_token_ms == 0 && pacing.tokens_per_second.is_none();
    if unpaced && matches!(tail, Tail::None) {
        return Body::from(frames.concat());
    }
    let gap = pacing
        .tokens_per_second
        .filter(|t| *t > 0.0)
        .map(|tps| Duration::from_secs_f64(1.0 / tps));
    // Without a per-token rate, everything after the first-token wait goes out as one chunk.
    let chunks: Vec<String> = if gap.is_some() {
        frames
    } else {
        vec![frames.concat()]
    };
    let guard = EndGuard {
        shared: shared.clone(),
        ended: false,
    };
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), 0usize, tail, guard),
        move |(mut it, n, tail, mut guard)| async move {
            match it.next() {
                Some(chunk) => {
                    let wait = if n == 0 {
                        Duration::from_millis(pacing.time_to_first_token_ms)
                    } else {
                        gap.unwrap_or_default()
                    };
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    Some((
                        Ok::<_, std::io::Error>(Bytes::from(chunk)),
                        (it, n + 1, tail, guard),
                    ))
                }
                None if matches!(tail, Tail::Stall) => {
                    // Silent until the client goes away (then the guard counts the body as
                    // abandoned).
                    std::future::pending::<()>().await;
                    None
                }
                None => {
                    guard.ended = true;
                    match tail {
                        Tail::Disconnect => {
                            // Let the frames already written reach the client before the drop.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            let error = std::io::Error::new(
                                std::io::ErrorKind::ConnectionAborted,
                                "injected disconnect",
                            );
                            Some((Err(error), (it, n + 1, Tail::None, guard)))
                        }
                        Tail::None | Tail::Stall => None,
                    }
                }
            }
        },
    );
    Body::from_stream(stream)
}
