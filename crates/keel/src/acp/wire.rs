//! The bytes of `keel acp`: standard input is read line by line and checked as JSON-RPC 2.0
//! before the protocol crate sees it, so that a malformed message gets the error the JSON-RPC
//! specification prescribes (the crate itself only logs it): a line that is not JSON gets
//! `-32700 Parse error`, a JSON value that is not a request, notification or response (an
//! array — ACP uses no batches —, no `"jsonrpc": "2.0"`, no method) gets `-32600 Invalid
//! Request`, both with the message's `id` when it has a usable one, else `null`. Unknown methods
//! (`-32601`) and bad parameters (`-32602`) are answered by the protocol crate. Standard output
//! carries only protocol messages, one per line, from one writer task.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The JSON-RPC 2.0 error for a line that is not a well-formed message, or `None` when the line
/// may go to the protocol crate. Blank lines are skipped by the caller.
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
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id.clone()),
        Some(_) => {
            return Some(error(
                Value::Null,
                -32600,
                "Invalid Request",
                "\"id\" must be a string, a number or null",
            ));
        }
        None => None,
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
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

fn error(id: Value, code: i32, message: &str, data: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}})
}

/// The two pipes the protocol connection reads from and writes to, and the tasks that join
/// them to the process's standard input and output.
pub struct Pipes {
    /// What the connection reads: standard input's well-formed lines.
    pub incoming: tokio::io::DuplexStream,
    /// What the connection writes: copied to standard output.
    pub outgoing: tokio::io::DuplexStream,
}

/// Starts the reader of standard input and the writer of standard output (tokio tasks); the
/// reader closes the connection's input at end of input (the client went away).
pub fn stdio() -> Pipes {
    const CAP: usize = 1 << 20;
    let (incoming, mut feed) = tokio::io::duplex(CAP);
    let (outgoing, drain) = tokio::io::duplex(CAP);
    let (errors_tx, mut errors_rx) = mpsc::channel::<Value>(64);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim().is_empty() {
                continue;
            }
            if let Some(reply) = check_line(&line) {
                tracing::warn!("acp: malformed message from the client: {line}");
                if errors_tx.send(reply).await.is_err() {
                    break;
                }
                continue;
            }
            if feed.write_all(line.as_bytes()).await.is_err()
                || feed.write_all(b"\n").await.is_err()
            {
                break;
            }
        }
        let _ = feed.shutdown().await;
    });
    tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        let mut lines = BufReader::new(drain).lines();
        loop {
            let line = tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => line,
                    _ => break,
                },
                Some(reply) = errors_rx.recv() => reply.to_string(),
            };
            if out.write_all(line.as_bytes()).await.is_err()
                || out.write_all(b"\n").await.is_err()
                || out.flush().await.is_err()
            {
                break;
            }
        }
    });
    Pipes { incoming, outgoing }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"x"}"#), None);
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"session/cancel"}"#), None);
    }
}
