//! duplicate_delivery — the same input (one `Idempotency-Key`), the same approval decision and
//! the same cancellation, each delivered twice at once to two API nodes (two `keel serve`
//! processes, each with its own worker, on one store), make one turn, one decision and one
//! cancellation: the journal holds exactly one `turn.queued` / `approval.decided` /
//! `turn.cancel_requested` for them, the turn ends exactly once, and the side effect the turn
//! runs happens exactly once (its file has one line). A conflicting second decision (deny
//! after allow, one after the other or both at once on the two nodes) is refused with 409:
//! exactly one decision is journaled, the one that was answered 2xx.
//!
//! Guarded mechanisms: the idempotency key (the store's `idempotency_begin`: of concurrent
//! requests with one key exactly one runs, the other gets 409 in-flight or the stored answer),
//! decision-once (an approval is decided by one compare-and-set on its row; a repeat of the
//! same decision is a no-op, not a second `approval.decided`), the cancellation intent (a turn
//! already being cancelled is not cancelled again) and the effect claim (a call is dispatched
//! under one operation key, once, whichever worker claims the session).

use std::process::Child;

use serde_json::{Value, json};

use super::harness::{
    Api, Backend, FreshStore, api_session, on_both, pending_approval, poll, script_release,
};
use crate::common::{Env, spawn_serve_with};
use crate::remote::{Options, Served, serve_with};

on_both!(
    tokio the_same_input_twice_makes_one_turn,
    tokio the_same_approval_decision_twice_makes_one_decision,
    tokio a_conflicting_second_decision_is_refused,
    tokio conflicting_decisions_at_once_make_one_decision,
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
        let release =
            script_release(&self.api[0], &self.env, name, lines, &["shell"], policy).await;
        api_session(&self.api[0], &self.env, &release).await
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

    /// The session's only approval, as listed.
    async fn pending_or_decided(&self, session: &str) -> Value {
        let page = self.api[0]
            .ok("GET", &format!("/v1/sessions/{session}/approvals"), None)
            .await;
        let items = page["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{page}");
        items[0].clone()
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
    let (session, path, [body, _]) =
        waiting_on_approval(&nodes, "dup-decision", "decided.txt").await;
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

/// A session whose turn waits on the approval of `echo once >> FILE`; the session, the
/// approval's decision path and the allow and deny bodies.
async fn waiting_on_approval(
    nodes: &TwoNodes,
    name: &str,
    file: &str,
) -> (String, String, [Value; 2]) {
    let session = nodes
        .session(
            name,
            &[
                shell(&format!("echo once >> {file}")),
                json!({"text": "done"}),
            ],
            json!({}),
        )
        .await;
    nodes.submit(&session, "append once").await;
    let approval = pending_approval(&nodes.api[0], &session).await;
    let path = format!(
        "/v1/approvals/{}/decision",
        approval["approval_id"].as_str().unwrap()
    );
    let hash = &approval["args_hash"];
    let allow = json!({"decision": "allow_once", "args_hash": hash});
    let deny = json!({"decision": "deny", "args_hash": hash, "reason": "changed my mind"});
    (session, path, [allow, deny])
}

/// The one `approval.decided` of `events` is `decision` (`allow_once` or `deny`); the turn
/// ended once, `completed`, and the call's line was written once when allowed, never when
/// denied.
fn one_decision(nodes: &TwoNodes, events: &[Value], decision: &str, file: &str) {
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval.decided")
        .collect();
    assert_eq!(decided.len(), 1, "one decision: {decided:?}");
    let text = decided[0]["payload"].to_string();
    assert!(
        text.contains(decision),
        "the answered decision, {decision}: {text}"
    );
    assert_eq!(count(events, "turn.finished"), 1);
    let allowed = decision == "allow_once";
    assert_eq!(count(events, "effect.dispatched"), usize::from(allowed));
    let lines = nodes.lines_of(file);
    assert_eq!(lines.len(), usize::from(allowed), "{lines:?}");
}

/// A `shell` call waits on approval; `allow_once` is posted to node 1 and answered, then a
/// `deny` to node 2 (before the turn ends) and again after it ended: each deny is refused with
/// 409, the approval stays `allowed`, one `approval.decided` (the allow) is journaled and the
/// command ran once.
async fn a_conflicting_second_decision_is_refused(backend: Backend) {
    let nodes = TwoNodes::start(backend);
    let (session, path, [allow, deny]) =
        waiting_on_approval(&nodes, "conflict-in-turn", "in-turn.txt").await;
    let (status, answer) = nodes.api[0].call("POST", &path, Some(&allow), &[]).await;
    assert!((200..300).contains(&status), "{status} {answer}");
    let (status, answer) = nodes.api[1].call("POST", &path, Some(&deny), &[]).await;
    assert_eq!(status, 409, "a deny after the allow: {answer}");
    let events = nodes.until_finished(&session).await;
    for api in &nodes.api {
        let (status, answer) = api.call("POST", &path, Some(&deny), &[]).await;
        assert_eq!(status, 409, "a deny after the turn ended: {answer}");
    }
    let approval = nodes.pending_or_decided(&session).await;
    assert_eq!(approval["status"], "allowed", "{approval}");
    let after = nodes.events(&session).await;
    // The refusals journaled no decision (the turn's last events may still be arriving).
    assert!(after.len() >= events.len());
    one_decision(&nodes, &after, "allow_once", "in-turn.txt");
}

/// A `shell` call waits on approval; `allow_once` to node 1 and `deny` to node 2 at once:
/// exactly one is answered 2xx, the other 409, and the journal holds that one decision (the
/// command ran once if it was the allow, never if it was the deny).
async fn conflicting_decisions_at_once_make_one_decision(backend: Backend) {
    let nodes = TwoNodes::start(backend);
    let (session, path, [allow, deny]) =
        waiting_on_approval(&nodes, "conflict-at-once", "at-once.txt").await;
    let (a, d) = tokio::join!(
        nodes.api[0].call("POST", &path, Some(&allow), &[]),
        nodes.api[1].call("POST", &path, Some(&deny), &[]),
    );
    let statuses = (a.0, d.0);
    let winner = match statuses {
        (200..=299, 409) => "allow_once",
        (409, 200..=299) => "deny",
        _ => panic!("one decision wins, the other gets 409: {a:?} {d:?}"),
    };
    let events = nodes.until_finished(&session).await;
    one_decision(&nodes, &events, winner, "at-once.txt");
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
