//! The bytes of `keel acp`: standard input is read line by line and checked as JSON-RPC 2.0
//! before the protocol crate sees it, so that a malformed message gets the error the JSON-RPC
//! specification prescribes (the crate itself only logs it, or drops it): a line that is not
//! JSON or not UTF-8 gets `-32700 Parse error`, a JSON value that is not a request,
//! notification or response (an array — ACP uses no batches —, no `"jsonrpc": "2.0"`, no
//! method, an `id` that is not a string or an integer) gets `-32600 Invalid Request`, a line
//! over [`MAX_LINE_BYTES`] too; each with the message's `id` when it has a usable one, else
//! `null`, and reading goes on. An unknown request method gets `-32601` here; bad parameters of
//! a known one (`-32602`) are answered by the protocol crate or the agent. Standard output
//! carries only protocol messages, one per line, from one writer task. At end of input every
//! request still open gets its answer before the connection closes (see [`stdio`]).

use std::collections::HashSet;
use std::sync::Arc;

use agent_client_protocol as acp;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};

/// The longest line (one JSON-RPC message) read from standard input, bytes: 16 MiB. A longer
/// line is skipped up to its end without being buffered, and answered `-32600` with `id` null.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The request methods of an ACP agent (`-32601 Method not found` for any other, extension
/// methods — `_` and a name — included: Keel defines none).
fn known_method(method: &str) -> bool {
    let m = &acp::AGENT_METHOD_NAMES;
    [
        m.initialize,
        m.authenticate,
        m.session_new,
        m.session_load,
        m.session_set_mode,
        m.session_set_config_option,
        m.session_prompt,
        m.session_cancel,
        m.session_list,
    ]
    .contains(&method)
}

/// The first key an object of `line` holds twice (at any depth), when one does.
fn duplicate_key(line: &str) -> Option<String> {
    keel_api::body::duplicate_key(line.as_bytes())
}

/// The JSON-RPC 2.0 error for a line that is not a well-formed message, or `None` when the line
/// may go to the protocol crate. Blank lines are skipped by the caller.
///
/// Beyond the crate's own checks: an `id` that is not a string or an integer the protocol's ids
/// hold (`i64`; `1.5`, `null`, `1e400` or a 20-digit number are not) is `-32600` with `id` null
/// — the crate took `null` for a notification and dropped the others without an answer; an
/// unknown request method is `-32601` whatever its params (the crate checked params first);
/// `initialize` with a `protocolVersion` that is not an integer 0..=65535 is `-32602` (the crate
/// read any string as version 0).
pub fn check_line(line: &str) -> Option<Value> {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Some(error(Value::Null, -32700, "Parse error", &e.to_string())),
    };
    let Value::Object(map) = &value else {
        return Some(error(
            Value::Null,
            -32600,
            "Invalid Request",
            "expected one JSON-RPC 2.0 message object (ACP uses no batches)",
        ));
    };
    let id = match map.get("id") {
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.as_i64().is_some() => Some(id.clone()),
        Some(_) => {
            return Some(error(
                Value::Null,
                -32600,
                "Invalid Request",
                "\"id\" must be a string or an integer (-2^63..2^63)",
            ));
        }
        None => None,
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    // The protocol crate refuses an object with a repeated key (serde's typed parse) without an
    // answer; which of two values would count is unclear, so the message is refused — with
    // its `id` unless that is the repeated key.
    if let Some(key) = duplicate_key(line) {
        return Some(error(
            if key == "id" { Value::Null } else { reply_id },
            -32600,
            "Invalid Request",
            &format!("the key {key:?} appears twice in one object"),
        ));
    }
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error(
            reply_id,
            -32600,
            "Invalid Request",
            "\"jsonrpc\" must be \"2.0\"",
        ));
    }
    let is_response = id.is_some() && (map.contains_key("result") || map.contains_key("error"));
    match map.get("method") {
        Some(Value::String(method)) if id.is_some() && !known_method(method) => Some(error(
            reply_id,
            -32601,
            "Method not found",
            &format!("keel acp has no method {method:?}"),
        )),
        Some(Value::String(method))
            if id.is_some() && method == acp::AGENT_METHOD_NAMES.initialize =>
        {
            let version = &map.get("params").unwrap_or(&Value::Null)["protocolVersion"];
            let valid = version.as_u64().is_some_and(|v| v <= u64::from(u16::MAX));
            (!valid).then(|| {
                error_at(
                    reply_id,
                    -32602,
                    "Invalid params",
                    &format!("protocolVersion must be an integer (ACP's is 1), not {version}"),
                    Some("protocolVersion"),
                )
            })
        }
        Some(Value::String(_)) => None,
        Some(_) => Some(error(
            reply_id,
            -32600,
            "Invalid Request",
            "\"method\" must be a string",
        )),
        None if is_response => None,
        None => Some(error(
            reply_id,
            -32600,
            "Invalid Request",
            "a request or notification needs a \"method\"",
        )),
    }
}

/// The id of a request (`id` and `method`) in a well-formed line, as its JSON text.
fn request_id(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("method")?;
    Some(v.get("id")?.to_string())
}

/// The id of a response (`id`, no `method`) the agent writes, as its JSON text.
fn response_id(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v.get("method").is_some() {
        return None;
    }
    Some(v.get("id")?.to_string())
}

/// One line of standard input, read without holding more than [`MAX_LINE_BYTES`] of it.
enum Line {
    /// A whole line, without its `\n`.
    Whole(Vec<u8>),
    /// A line longer than [`MAX_LINE_BYTES`], skipped to its end.
    TooLong,
    /// End of input.
    End,
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Line {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = match r.fill_buf().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("acp: standard input: {e}");
                return Line::End;
            }
        };
        if buf.is_empty() {
            return match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Whole(line),
            };
        }
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE_BYTES {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            return if too_long {
                Line::TooLong
            } else {
                Line::Whole(line)
            };
        }
    }
}

/// The JSON-RPC names of the standard error codes, as the protocol crate sends them in
/// `message`, with the snake_case `reason` Keel's errors carry for each.
const GENERIC: [(&str, &str); 5] = [
    ("Parse error", "parse_error"),
    ("Invalid Request", "invalid_request"),
    ("Method not found", "method_not_found"),
    ("Invalid params", "invalid_params"),
    ("Internal error", "internal"),
];

/// An error answer the protocol crate wrote itself (a request whose params do not parse:
/// `-32602` with the code's name as `message` and serde's text as a bare string `data`) in
/// Keel's shape ([`error`]): the text as `message`, `data` `{"reason", "message"}`. Any other
/// line — Keel's own errors, results, notifications — is returned as it is.
fn reshape_error(line: String) -> String {
    // Only a line with an error object can need it (a quote inside a JSON string is escaped).
    if !line.contains("\"error\":") {
        return line;
    }
    let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(&line) else {
        return line;
    };
    if map.contains_key("method") {
        return line;
    }
    let Some(Value::Object(e)) = map.get_mut("error") else {
        return line;
    };
    let Some(reason) = e
        .get("message")
        .and_then(Value::as_str)
        .and_then(|m| GENERIC.iter().find(|(name, _)| *name == m))
        .map(|(_, reason)| *reason)
    else {
        return line;
    };
    let text = match e.get("data") {
        Some(Value::String(d)) if !d.is_empty() => d.clone(),
        None | Some(Value::Null) | Some(Value::String(_)) => e
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        // Structured data is already Keel's (or carries what the client needs): kept.
        Some(_) => return line,
    };
    e.insert("message".into(), json!(text));
    e.insert("data".into(), json!({"reason": reason, "message": text}));
    Value::Object(map).to_string()
}

/// A JSON-RPC 2.0 error answer in the shape every Keel ACP error has (README "Editors (ACP)",
/// [`super::agent::failure`]): the useful text as `message` (what an editor shows) and `data`
/// `{"reason": REASON, "message": TEXT}`, plus `field` when one request field is at fault.
/// `kind` is the JSON-RPC name of `code` ("Parse error", …), turned into its reason
/// ([`GENERIC`]).
fn error(id: Value, code: i32, kind: &str, text: &str) -> Value {
    error_at(id, code, kind, text, None)
}

/// [`error`] naming the request field at fault (`data.field`).
fn error_at(id: Value, code: i32, kind: &str, text: &str, field: Option<&str>) -> Value {
    let reason = GENERIC
        .iter()
        .find(|(name, _)| *name == kind)
        .map_or("internal", |(_, reason)| reason);
    let mut data = json!({"reason": reason, "message": text});
    if let Some(f) = field {
        data["field"] = json!(f);
    }
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": text, "data": data}})
}

/// The two pipes the protocol connection reads from and writes to, and the tasks that join
/// them to the process's standard input and output.
pub struct Pipes {
    /// What the connection reads: standard input's well-formed lines.
    pub incoming: tokio::io::DuplexStream,
    /// What the connection writes: copied to standard output.
    pub outgoing: tokio::io::DuplexStream,
    /// Set when standard input ends (the client went away or closed its end): the agent cancels
    /// its running turns ([`super::agent::KeelAgent::disconnected`]).
    pub eof: watch::Receiver<bool>,
}

/// How long, after standard input ends, the requests still open may take to be answered
/// (their turns are cancelled, so a cancelled tool call's result is all they wait for) before
/// the connection closes anyway.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The requests the client sent that the agent has not answered yet (ids as JSON text).
#[derive(Default)]
struct Open {
    ids: std::sync::Mutex<HashSet<String>>,
    changed: tokio::sync::Notify,
}

impl Open {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn drained(&self) {
        loop {
            let changed = self.changed.notified();
            if self.set().is_empty() {
                return;
            }
            changed.await;
        }
    }
}

/// Starts the reader of standard input and the writer of standard output (tokio tasks). At end
/// of input the reader sets [`Pipes::eof`], waits until every request the client sent has its
/// answer (bounded by [`DRAIN`]), then closes the connection's input.
pub fn stdio() -> Pipes {
    const CAP: usize = 1 << 20;
    let (incoming, mut feed) = tokio::io::duplex(CAP);
    let (outgoing, drain) = tokio::io::duplex(CAP);
    let (errors_tx, mut errors_rx) = mpsc::channel::<Value>(64);
    let (eof_tx, eof) = watch::channel(false);
    let open = Arc::new(Open::default());
    let reading = open.clone();
    tokio::spawn(async move {
        let mut input = BufReader::new(tokio::io::stdin());
        loop {
            let reply = match read_line(&mut input).await {
                Line::End => break,
                Line::TooLong => Some(error(
                    Value::Null,
                    -32600,
                    "Invalid Request",
                    &format!("a message longer than {MAX_LINE_BYTES} bytes was skipped"),
                )),
                Line::Whole(bytes) => match String::from_utf8(bytes) {
                    Err(e) => Some(error(
                        Value::Null,
                        -32700,
                        "Parse error",
                        &format!("not UTF-8: {e}"),
                    )),
                    Ok(line) if line.trim().is_empty() => continue,
                    Ok(line) => match check_line(&line) {
                        Some(reply) => {
                            tracing::warn!("acp: malformed message from the client: {line}");
                            Some(reply)
                        }
                        None => {
                            if let Some(id) = request_id(&line) {
                                reading.set().insert(id);
                            }
                            if feed.write_all(line.as_bytes()).await.is_err()
                                || feed.write_all(b"\n").await.is_err()
                            {
                                break;
                            }
                            None
                        }
                    },
                },
            };
            if let Some(reply) = reply
                && errors_tx.send(reply).await.is_err()
            {
                break;
            }
        }
        let _ = eof_tx.send(true);
        if tokio::time::timeout(DRAIN, reading.drained())
            .await
            .is_err()
        {
            tracing::warn!("acp: requests still open {DRAIN:?} after standard input ended");
        }
        let _ = feed.shutdown().await;
    });
    tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        let mut lines = BufReader::new(drain).lines();
        // After a failed write (the client closed standard output) the lines are still read:
        // the connection must not block on a full pipe, and answered requests are counted.
        let mut broken = false;
        loop {
            let line = tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => line,
                    _ => break,
                },
                Some(reply) = errors_rx.recv() => reply.to_string(),
            };
            let line = reshape_error(line);
            if !broken
                && (out.write_all(line.as_bytes()).await.is_err()
                    || out.write_all(b"\n").await.is_err()
                    || out.flush().await.is_err())
            {
                broken = true;
            }
            if let Some(id) = response_id(&line)
                && open.set().remove(&id)
            {
                open.changed.notify_waiters();
            }
        }
    });
    Pipes {
        incoming,
        outgoing,
        eof,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crates_own_errors_get_keels_shape_and_other_lines_pass_as_they_are() {
        let crate_error = r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":"Invalid params","data":"missing field `sessionId`"}}"#;
        let v: Value = serde_json::from_str(&reshape_error(crate_error.into())).unwrap();
        assert_eq!(v["id"], 5);
        assert_eq!(v["error"]["code"], -32602);
        assert_eq!(v["error"]["message"], "missing field `sessionId`");
        assert_eq!(
            v["error"]["data"],
            json!({"reason": "invalid_params", "message": "missing field `sessionId`"})
        );
        for kept in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"error":{"message":"Invalid params"}}}"#,
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"cwd must be absolute","data":{"reason":"invalid_params","message":"cwd must be absolute","field":"cwd"}}}"#,
        ] {
            assert_eq!(reshape_error(kept.into()), kept);
        }
    }

    #[test]
    fn malformed_lines_get_json_rpc_error_codes() {
        let code = |l: &str| check_line(l).map(|e| (e["error"]["code"].clone(), e["id"].clone()));
        assert_eq!(code("{not json"), Some((json!(-32700), Value::Null)));
        assert_eq!(code("[1,2]"), Some((json!(-32600), Value::Null)));
        assert_eq!(
            code(r#"{"id":7,"method":"initialize"}"#),
            Some((json!(-32600), json!(7)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":"a"}"#),
            Some((json!(-32600), json!("a")))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
            Some((json!(-32600), Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#),
            None
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"session/cancel"}"#), None);
        // An unknown notification is ignored (notifications get no answer); Keel has no
        // extension methods.
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"x"}"#), None);
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"_x"}"#), None);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"_keel/x"}"#),
            Some((json!(-32601), json!(1)))
        );
    }

    /// JSON-RPC 2.0 edges the protocol crate left unanswered or answered with the wrong code
    /// (attack review of issue 17).
    #[test]
    fn ids_methods_and_protocol_versions_get_the_specs_codes() {
        let code = |l: &str| check_line(l).map(|e| (e["error"]["code"].clone(), e["id"].clone()));
        // A number JSON allows but no double holds is a parse error to serde_json: still an
        // answer, with id null.
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1e400,"method":"initialize"}"#),
            Some((json!(-32700), Value::Null))
        );
        for id in ["1.5", "null", "1e300", "123456789012345678901", "true"] {
            assert_eq!(
                code(&format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize"}}"#
                )),
                Some((json!(-32600), Value::Null)),
                "{id}"
            );
        }
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"session/new","params":{}}"#
            ),
            None
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":2,"method":"no/such"}"#),
            Some((json!(-32601), json!(2)))
        );
        for version in [r#""x""#, "1.5", "-1", "65536", "null"] {
            assert_eq!(
                code(&format!(
                    r#"{{"jsonrpc":"2.0","id":3,"method":"initialize","params":{{"protocolVersion":{version}}}}}"#
                )),
                Some((json!(-32602), json!(3))),
                "{version}"
            );
        }
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":1}}"#
            ),
            None
        );
    }

    /// A repeated key anywhere is `-32600`, answered with the id unless the id is what repeats
    /// (the crate dropped such a message without an answer, and end of input then waited).
    #[test]
    fn repeated_keys_are_invalid_requests() {
        let code = |l: &str| check_line(l).map(|e| (e["error"]["code"].clone(), e["id"].clone()));
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1},"id":2}"#
            ),
            Some((json!(-32600), Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":4,"method":"initialize","method":"session/new"}"#),
            Some((json!(-32600), json!(4)))
        );
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":"/a","cwd":"/b"}}"#
            ),
            Some((json!(-32600), json!(5)))
        );
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":6,"method":"session/new","params":{"a":[{"x":1},{"x":2}]}}"#
            ),
            None
        );
    }

    /// A line over the cap is skipped to its end without being held, and the next line reads.
    #[tokio::test]
    async fn a_line_over_the_cap_is_skipped_and_reading_goes_on() {
        let mut input = vec![b'x'; MAX_LINE_BYTES + 10];
        input.extend_from_slice(b"\nnext\n\xff\xfe\n");
        let mut r = BufReader::with_capacity(4096, &input[..]);
        assert!(matches!(read_line(&mut r).await, Line::TooLong));
        assert!(matches!(read_line(&mut r).await, Line::Whole(l) if l == b"next"));
        assert!(matches!(read_line(&mut r).await, Line::Whole(l) if l == b"\xff\xfe"));
        assert!(matches!(read_line(&mut r).await, Line::End));
    }
}
