//! `keel acp` driven with raw JSON-RPC lines over a subprocess's standard input: malformed
//! input the SDK client cannot send, and the end of input mid-turn.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::acp::script;
use crate::common::Env;

/// Far beyond anything these tests wait for (a correctness deadline, not a timing).
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

/// `keel acp` with its standard output read line by line on a thread.
pub(crate) struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every message read so far.
    pub(crate) seen: Vec<Value>,
}

impl Raw {
    pub(crate) fn start(env: &Env, args: &[&str]) -> Self {
        let mut child = env
            .keel()
            .arg("acp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Raw {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    pub(crate) fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub(crate) fn send(&mut self, v: &Value) {
        self.send_bytes(v.to_string().as_bytes());
    }

    /// The next message on standard output (each must be one JSON-RPC 2.0 message).
    pub(crate) fn next(&mut self) -> Option<Value> {
        let line = self.lines.recv_timeout(DEADLINE).ok()?;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
        self.seen.push(v.clone());
        Some(v)
    }

    /// Reads until the first message `pick` accepts.
    pub(crate) fn until(&mut self, pick: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self
                .next()
                .unwrap_or_else(|| panic!("standard output ended: {:?}", self.seen));
            if pick(&v) {
                return v;
            }
        }
    }

    /// The answer to request `id` (read already, or next).
    pub(crate) fn answer(&mut self, id: &Value) -> Value {
        let id = id.clone();
        let is_it = move |v: &Value| v["id"] == id && v.get("method").is_none();
        match self.seen.iter().find(|v| is_it(v)) {
            Some(v) => v.clone(),
            None => self.until(is_it),
        }
    }

    /// Closes standard input, reads standard output to its end, and returns the exit status.
    pub(crate) fn finish(mut self) -> (Vec<Value>, std::process::ExitStatus) {
        drop(self.stdin.take());
        while self.next().is_some() {}
        (self.seen.clone(), self.child.wait().unwrap())
    }
}

pub(crate) fn initialize(r: &mut Raw) {
    r.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1, "clientCapabilities": {}}}));
    assert_eq!(r.answer(&json!(1))["result"]["protocolVersion"], 1);
}

pub(crate) fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// JSON-RPC 2.0 edges, each answered with the specification's code, and reading goes on after
/// each (attack review of issue 17: an invalid UTF-8 line ended the connection, odd ids got no
/// answer, an unknown method without params was -32602, bad `cwd` / `mcpServers` -32603, an
/// `initialize` with protocolVersion "x" succeeded, and lines had no size cap).
#[test]
fn acp_json_rpc_edges_get_the_specs_answers_and_reading_goes_on() {
    let env = Env::new();
    let mut r = Raw::start(&env, &["--model", "script:none.jsonl"]);
    r.send_bytes(b"{\"jsonrpc\": \"2.0\", \"id\": 90, \"method\": \"initialize\xff\"}");
    for id in ["1.5", "null", "123456789012345678901"] {
        r.send_bytes(
            format!(r#"{{"jsonrpc": "2.0", "id": {id}, "method": "initialize", "params": {{}}}}"#)
                .as_bytes(),
        );
    }
    // Over the 16 MiB cap: skipped, answered, not held.
    let mut long = b"{\"jsonrpc\": \"2.0\", \"id\": 91, \"method\": \"x\", \"params\": \"".to_vec();
    long.resize(16 * 1024 * 1024 + 100, b'a');
    long.extend_from_slice(b"\"}");
    r.send_bytes(&long);
    r.send(&json!({"jsonrpc": "2.0", "id": 10, "method": "no/such_method"}));
    r.send(&request(11, "initialize", json!({"protocolVersion": "x"})));
    r.send(&request(
        12,
        "session/new",
        json!({"cwd": "relative/dir", "mcpServers": []}),
    ));
    r.send(&request(
        13,
        "session/new",
        json!({"cwd": env.path("missing"), "mcpServers": []}),
    ));
    r.send(&request(
        14,
        "session/new",
        json!({"cwd": env.ws(), "mcpServers": [{"name": "a__b", "command": "x", "args": [], "env": []}]}),
    ));
    initialize(&mut r);
    let code = |v: &Value| v["error"]["code"].as_i64();
    assert_eq!(code(&r.answer(&json!(10))), Some(-32601));
    assert_eq!(code(&r.answer(&json!(11))), Some(-32602));
    for id in [12, 13] {
        let e = r.answer(&json!(id));
        assert_eq!(code(&e), Some(-32602), "{e}");
        assert_eq!(e["error"]["data"]["field"], "cwd", "{e}");
    }
    let e = r.answer(&json!(14));
    assert_eq!(code(&e), Some(-32602), "{e}");
    assert_eq!(e["error"]["data"]["field"], "mcpServers[0]", "{e}");
    let (seen, status) = r.finish();
    assert!(status.success());
    let mut nulls: Vec<i64> = seen
        .iter()
        .filter(|v| v["id"].is_null())
        .filter_map(code)
        .collect();
    nulls.sort_unstable();
    assert_eq!(nulls, [-32700, -32600, -32600, -32600, -32600], "{seen:?}");
}

/// Standard input closing mid-turn cancels the turn as SIGTERM does: the running call gets its
/// result, the open `session/prompt` its answer (`cancelled`), and `keel acp` exits 0. Before
/// that, `session/load` of the session prompting on this connection is refused (it would
/// double every update).
#[test]
fn acp_end_of_input_mid_turn_cancels_the_turn_and_answers_the_prompt() {
    let env = Env::new();
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}),
            json!({"text": "never"}),
        ],
    );
    let mut r = Raw::start(&env, &["--model", &model, "--permission-mode", "bypass"]);
    initialize(&mut r);
    r.send(&request(
        2,
        "session/new",
        json!({"cwd": env.ws(), "mcpServers": []}),
    ));
    let session = r.answer(&json!(2))["result"]["sessionId"].clone();
    assert!(session.is_string(), "{:?}", r.seen);
    r.send(&request(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait"}]}),
    ));
    r.until(|v| v["params"]["update"]["status"] == "in_progress");
    r.send(&request(
        4,
        "session/load",
        json!({"sessionId": session, "cwd": env.ws(), "mcpServers": []}),
    ));
    let refused = r.answer(&json!(4));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(refused["error"]["data"]["field"], "sessionId", "{refused}");

    let (seen, status) = r.finish();
    assert!(status.success(), "{status:?}");
    let answer = seen
        .iter()
        .find(|v| v["id"] == 3 && v.get("method").is_none())
        .unwrap_or_else(|| panic!("the prompt got no answer: {seen:?}"));
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    let events = env.run(&["sessions", "events", session.as_str().unwrap()]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("tool_call.finished"), "{events}");
    let user_chunks = seen
        .iter()
        .filter(|v| v["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .count();
    assert_eq!(user_chunks, 0, "nothing was replayed: {seen:?}");
}

/// `authenticate` with the provider key missing answers `auth_required` naming the variable
/// (it answered `{}`: the editor thought it was signed in).
#[test]
fn acp_authenticate_without_the_key_is_auth_required_naming_the_variable() {
    let env = Env::new();
    let mut r = Raw::start(&env, &["--model", "openai:gpt-5"]);
    initialize(&mut r);
    r.send(&request(
        2,
        "authenticate",
        json!({"methodId": "provider_key_env"}),
    ));
    let e = r.answer(&json!(2));
    assert_eq!(e["error"]["code"], -32000, "{e}");
    assert_eq!(e["error"]["data"]["env_var"], "OPENAI_API_KEY", "{e}");
    let (_, status) = r.finish();
    assert!(status.success());
}
