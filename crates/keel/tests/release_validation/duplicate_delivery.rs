//! duplicate_delivery — the same input (one `Idempotency-Key`), the same approval decision and
//! the same cancellation, each delivered twice at once to two API nodes (two `keel serve`
//! processes, each with its own worker, on one store), make one turn, one decision and one
//! cancellation: the journal holds exactly one `turn.queued` / `approval.decided` /
//! `turn.cancel_requested` for them, the turn ends exactly once, and the side effect the turn
//! runs happens exactly once (its file has one line).
//!
//! Guarded mechanisms: the idempotency key (the store's `idempotency_begin`: of concurrent
//! requests with one key exactly one runs, the other gets 409 in-flight or the stored answer),
//! decision-once (an approval is decided by one compare-and-set on its row; a repeat of the
//! same decision is a no-op, not a second `approval.decided`), the cancellation intent (a turn
//! already being cancelled is not cancelled again) and the effect claim (a call is dispatched
//! under one operation key, once, whichever worker claims the session).

use std::process::Child;

use serde_json::{Value, json};

use super::harness::{Api, Backend, FreshStore, on_both, poll};
use crate::common::{Env, spawn_serve_with};
use crate::remote::{Options, Served, serve_with};

on_both!(
    tokio the_same_input_twice_makes_one_turn,
    tokio the_same_approval_decision_twice_makes_one_decision,
    tokio the_same_cancel_twice_makes_one_cancellation,
);

/// `[server]` and `[scheduler]` lines of both nodes.
const SETTINGS: &str = "max_permission_mode = \"bypass\"\n\n[scheduler]\npoll_ms = 100\n";

/// Two `keel serve` nodes on one store, one worker each, and an API on each with the admin key
/// of tenant `acme`.
struct TwoNodes {
    env: Env,
    _first: Served,
    second: Child,
    api: [Api; 2],
    _fresh: FreshStore,
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        let _ = self.second.kill();
        let _ = self.second.wait();
    }
}

impl TwoNodes {
    fn start(backend: Backend) -> Self {
        let fresh = FreshStore::new(backend);
        let env = Env::new();
        let first = serve_with(
            &env,
            &Options {
                store: Some(&fresh.location),
                server_toml: SETTINGS,
                args: &["--workers", "1"],
                ..Options::default()
            },
        );
        let (second, addr) = spawn_serve_with(&env, &["--workers", "1"]);
        let api = [
            Api::new(&first.url, Some(&first.key)),
            Api::new(&format!("http://{addr}"), Some(&first.key)),
        ];
        TwoNodes {
            env,
            _first: first,
            second,
            api,
            _fresh: fresh,
        }
    }

    /// A release running the script `lines` with `shell` under `policy`, and a session of it in
    /// the workspace (through node 1); the session id.
    async fn session(&self, name: &str, lines: &[Value], policy: Value) -> String {
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        let rel = format!("{name}.jsonl");
        self.env.write(&rel, &(text.join("\n") + "\n"));
        let script = self.env.path(&rel).display().to_string();
        let release = self.api[0]
            .ok(
                "POST",
                "/v1/releases",
                Some(&json!({
                    "name": name,
                    "model_route": [format!("script:{script}")],
                    "instructions": "You are a test agent.",
                    "tools": ["shell"],
                    "policy": policy,
                })),
            )
            .await;
        let session = self.api[0]
            .ok(
                "POST",
                "/v1/sessions",
                Some(&json!({
                    "release_id": release["release_id"],
                    "workspace": self.env.ws().display().to_string(),
                })),
            )
            .await;
        session["session_id"].as_str().unwrap().to_owned()
    }

    /// Submits `input` to the session (through node 1).
    async fn submit(&self, session: &str, input: &str) {
        self.api[0]
            .ok(
                "POST",
                &format!("/v1/sessions/{session}/turns"),
                Some(&json!({"input": input})),
            )
            .await;
    }

    /// The session's journal (through node 2).
    async fn events(&self, session: &str) -> Vec<Value> {
        let page = self.api[1]
            .ok(
                "GET",
                &format!("/v1/sessions/{session}/events?after=0&limit=1000"),
                None,
            )
            .await;
        page["items"]
            .as_array()
            .or_else(|| page.as_array())
            .unwrap_or_else(|| panic!("no events in {page}"))
            .clone()
    }

    /// Waits (≤ 60 s) until the session's journal has a `turn.finished`; the journal then.
    async fn until_finished(&self, session: &str) -> Vec<Value> {
        poll(60, "the turn ends", || async {
            let evs = self.events(session).await;
            evs.iter()
                .any(|e| e["type"] == "turn.finished")
                .then_some(evs)
        })
        .await
    }

    /// The lines of workspace file `name`.
    fn lines_of(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.env.ws().join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn count(events: &[Value], ty: &str) -> usize {
    events.iter().filter(|e| e["type"] == ty).count()
}

fn shell(command: &str) -> Value {
    json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]})
}

/// The same `POST …/turns` with one `Idempotency-Key`, to both nodes at once: one runs (2xx),
/// the other gets the same answer or 409 in-flight; repeated after the turn ended, either
/// node answers with the stored response. One `turn.queued`, one `turn.finished`, the command
/// ran once.
async fn the_same_input_twice_makes_one_turn(backend: Backend) {
    let nodes = TwoNodes::start(backend);
    let session = nodes
        .session(
            "dup-input",
            &[shell("echo once >> input.txt"), json!({"text": "done"})],
            json!({"allow": ["shell"]}),
        )
        .await;
    let path = format!("/v1/sessions/{session}/turns");
    let body = json!({"input": "append once"});
    let headers = [("idempotency-key", "same-input-1")];
    let (a, b) = tokio::join!(
        nodes.api[0].call("POST", &path, Some(&body), &headers),
        nodes.api[1].call("POST", &path, Some(&body), &headers),
    );
    let accepted: Vec<&Value> = [&a, &b]
        .into_iter()
        .filter(|(s, _)| (200..300).contains(s))
        .map(|(_, v)| v)
        .collect();
    for (status, answer) in [&a, &b] {
        assert!(
            (200..300).contains(status)
                || (*status == 409 && answer["type"] == "urn:keel:problem:idempotency-in-flight"),
            "{status} {answer}"
        );
    }
    assert!(!accepted.is_empty(), "one delivery runs: {a:?} {b:?}");
    let turn = accepted[0]["turn_id"].as_str().unwrap().to_owned();
    assert!(accepted.iter().all(|v| v["turn_id"] == turn), "{a:?} {b:?}");

    let events = nodes.until_finished(&session).await;
    // Delivered again after the end, to each node: the stored answer, nothing new.
    for api in &nodes.api {
        let (status, again) = api.call("POST", &path, Some(&body), &headers).await;
        assert!((200..300).contains(&status), "{status} {again}");
        assert_eq!(again["turn_id"], turn.as_str(), "{again}");
    }
    let events_after = nodes.events(&session).await;
    assert_eq!(count(&events_after, "turn.queued"), 1, "one turn");
    assert_eq!(count(&events_after, "turn.finished"), 1, "ended once");
    assert_eq!(count(&events, "effect.dispatched"), 1, "one effect");
    assert_eq!(nodes.lines_of("input.txt"), ["once"]);
}

/// A turn waits on the approval of a `shell` call; the same `allow_once` decision is posted to
/// both nodes at once. Both answer 2xx (a repeated identical decision is a no-op); the journal
/// holds one `approval.decided`, the call is dispatched once (its line written once) and the
/// turn ends once, `completed`.
async fn the_same_approval_decision_twice_makes_one_decision(backend: Backend) {
    let nodes = TwoNodes::start(backend);
    let session = nodes
        .session(
            "dup-decision",
            &[shell("echo once >> decided.txt"), json!({"text": "done"})],
            json!({}),
        )
        .await;
    nodes.submit(&session, "append once").await;
    let approval = poll(60, "the call waits on a human", || async {
        let page = nodes.api[0]
            .ok("GET", &format!("/v1/sessions/{session}/approvals"), None)
            .await;
        page["items"]
            .as_array()
            .and_then(|items| items.iter().find(|a| a["status"] == "pending").cloned())
    })
    .await;
    let path = format!(
        "/v1/approvals/{}/decision",
        approval["approval_id"].as_str().unwrap()
    );
    let body = json!({"decision": "allow_once", "args_hash": approval["args_hash"]});
    let (a, b) = tokio::join!(
        nodes.api[0].call("POST", &path, Some(&body), &[]),
        nodes.api[1].call("POST", &path, Some(&body), &[]),
    );
    for (status, answer) in [&a, &b] {
        assert!((200..300).contains(status), "{status} {answer}");
        assert_eq!(answer["status"], "allowed", "{answer}");
    }
    let events = nodes.until_finished(&session).await;
    assert_eq!(count(&events, "approval.decided"), 1, "one decision");
    assert_eq!(count(&events, "effect.dispatched"), 1, "one dispatch");
    assert_eq!(count(&events, "turn.finished"), 1);
    let finished = events
        .iter()
        .find(|e| e["type"] == "turn.finished")
        .unwrap();
    assert_eq!(
        finished["payload"]["terminal_reason"], "completed",
        "{finished}"
    );
    assert_eq!(nodes.lines_of("decided.txt"), ["once"], "one effect");
}

/// A turn runs a `shell` call that writes a line and sleeps; the same cancellation is posted to
/// both nodes at once. One is accepted (the other too, or 409 when the turn had already
/// ended); the journal holds one `turn.cancel_requested`, the
/// turn ends once (`aborted`), the call has exactly one result, and the command ran once.
async fn the_same_cancel_twice_makes_one_cancellation(backend: Backend) {
    let nodes = TwoNodes::start(backend);
    let session = nodes
        .session(
            "dup-cancel",
            &[
                shell("echo once >> cancelled.txt; sleep 30"),
                json!({"text": "never"}),
            ],
            json!({"allow": ["shell"]}),
        )
        .await;
    nodes.submit(&session, "start and wait").await;
    poll(60, "the command runs", || async {
        (!nodes.lines_of("cancelled.txt").is_empty()).then_some(())
    })
    .await;
    let path = format!("/v1/sessions/{session}/cancel");
    let empty = json!({});
    let (a, b) = tokio::join!(
        nodes.api[0].call("POST", &path, Some(&empty), &[]),
        nodes.api[1].call("POST", &path, Some(&empty), &[]),
    );
    // Each is accepted, or — when the first already ended the turn — refused as having
    // nothing left to cancel (409); at least one is accepted.
    for (status, answer) in [&a, &b] {
        assert!(
            (200..300).contains(status)
                || (*status == 409 && answer["type"] == "urn:keel:problem:conflict"),
            "{status} {answer}"
        );
    }
    assert!(
        [&a, &b].iter().any(|(s, _)| (200..300).contains(s)),
        "{a:?} {b:?}"
    );
    // Both answers are in: each cancellation was journaled or found the turn being cancelled.
    let events = nodes.until_finished(&session).await;
    assert_eq!(
        count(&events, "turn.cancel_requested"),
        1,
        "one cancellation"
    );
    assert_eq!(count(&events, "turn.finished"), 1);
    let finished = events
        .iter()
        .find(|e| e["type"] == "turn.finished")
        .unwrap();
    assert_eq!(
        finished["payload"]["terminal_reason"], "aborted",
        "{finished}"
    );
    assert_eq!(
        count(&events, "tool_call.finished"),
        1,
        "one result for the call"
    );
    assert_eq!(count(&events, "effect.dispatched"), 1, "one dispatch");
    assert_eq!(nodes.lines_of("cancelled.txt"), ["once"]);
}
