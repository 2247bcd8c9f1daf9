//! A minimal OpenAI-compatible Chat Completions server for tests that need what the scripted
//! model cannot do: pauses at a chosen point of a stream, `reasoning_content`, a server that
//! never answers, a priced model name. Plain HTTP/1.1 on 127.0.0.1, one thread per connection;
//! request `i` gets reply `i` (the last one again once they run out).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One piece of a reply.
#[derive(Clone, Debug)]
pub enum Part {
    /// An SSE `data:` frame (a JSON chunk, or `[DONE]`).
    Data(String),
    /// Wait this long before the next part.
    Pause(Duration),
}

/// How the server answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP 200 and these SSE parts, then the connection closes.
    Stream(Vec<Part>),
    /// Read the request and never answer (the connection stays open for a minute).
    Silent,
    /// An HTTP error: this status, these extra header lines (`name: value`), a JSON body.
    Error(u16, Vec<String>, String),
}

/// A running server; it lives until the test process ends.
pub struct ChatServer {
    port: u16,
    requests: Arc<AtomicUsize>,
}

impl ChatServer {
    /// Starts a server answering requests with `replies` in order.
    pub fn start(replies: Vec<Reply>) -> Self {
        assert!(!replies.is_empty());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let replies = Arc::new(replies);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let i = counter.fetch_add(1, Ordering::SeqCst);
                let reply = replies[i.min(replies.len() - 1)].clone();
                std::thread::spawn(move || serve(stream, &reply));
            }
        });
        Self { port, requests }
    }

    /// The base URL for `--base-url` (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn serve(mut stream: TcpStream, reply: &Reply) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    match reply {
        Reply::Silent => std::thread::sleep(Duration::from_secs(60)),
        Reply::Error(status, headers, body) => {
            let mut head = format!(
                "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for h in headers {
                head.push_str(h);
                head.push_str("\r\n");
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
        Reply::Stream(parts) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            for part in parts {
                match part {
                    Part::Data(data) => {
                        if stream
                            .write_all(format!("data: {data}\n\n").as_bytes())
                            .and_then(|()| stream.flush())
                            .is_err()
                        {
                            return;
                        }
                    }
                    Part::Pause(d) => std::thread::sleep(*d),
                }
            }
        }
    }
}

/// A Chat Completions chunk with `delta` and `finish_reason` (`null` when `None`).
pub fn chunk(delta: serde_json::Value, finish: Option<&str>) -> Part {
    Part::Data(
        serde_json::json!({
            "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        })
        .to_string(),
    )
}

/// The usage chunk (`stream_options.include_usage`) and `[DONE]`.
pub fn usage_and_done(prompt_tokens: u64, completion_tokens: u64) -> Vec<Part> {
    vec![
        Part::Data(
            serde_json::json!({
                "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o-mini",
                "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}
            })
            .to_string(),
        ),
        Part::Data("[DONE]".into()),
    ]
}

/// A complete text answer.
pub fn text_reply(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
    let mut parts = vec![
        chunk(
            serde_json::json!({"role": "assistant", "content": text}),
            None,
        ),
        chunk(serde_json::json!({}), Some("stop")),
    ];
    parts.extend(usage_and_done(prompt_tokens, completion_tokens));
    Reply::Stream(parts)
}
