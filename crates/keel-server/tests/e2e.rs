//! A scripted session end to end through the API alone: create a release and a session,
//! submit a turn, approve the call it waits on, watch SSE until `turn.finished` (the model's
//! text as ephemeral deltas between), and the tenant-wide stream report its status changes.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(a_scripted_session_runs_end_to_end_over_http);

async fn a_scripted_session_runs_end_to_end_over_http(b: Backend) {
    let s = start(b).await;
    let release = s
        .release(
            "writer",
            &[
                json!({"tool_calls": [call("write_file", json!({"path": "out.txt", "content": "hi\n"}))], "usage": {"input_tokens": 10, "output_tokens": 5}}),
                json!({"text": "wrote out.txt", "usage": {"input_tokens": 12, "output_tokens": 3}}),
            ],
            &["write_file", "read_file"],
        )
        .await;
    // The same definition again is the same release.
    let again = s.release("writer", &[json!({"tool_calls": [call("write_file", json!({"path": "out.txt", "content": "hi\n"}))], "usage": {"input_tokens": 10, "output_tokens": 5}}), json!({"text": "wrote out.txt", "usage": {"input_tokens": 12, "output_tokens": 3}})], &["write_file", "read_file"]).await;
    assert_eq!(again, release);
    let created = s.session(&release, json!({})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(
        created.header("etag").unwrap(),
        format!("\"{}\"", created.body["version"])
    );
    let session = created.body["session_id"].as_str().unwrap().to_owned();
    let mut sse = s
        .sse(&format!("/v1/sessions/{session}/events"), &s.viewer, None)
        .await;
    assert_eq!(sse.status, StatusCode::OK);
    let mut statuses = s.sse("/v1/events", &s.viewer, None).await;
    assert_eq!(statuses.status, StatusCode::OK);
    let turn = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "write out.txt"}),
        )
        .await;
    assert_eq!(turn.status, StatusCode::ACCEPTED, "{turn:?}");
    let turn_id = turn.body["turn_id"].as_str().unwrap().to_owned();
    // The call waits on a human: find it among the tenant's pending approvals.
    let approval = loop {
        let page = s.get("/v1/approvals?status=pending", &s.viewer).await;
        if let Some(a) = page.body["items"].as_array().and_then(|a| a.first()) {
            break a.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(approval["tool_name"], "write_file");
    let waiting = s
        .wait_session(&session, |b| b["status"] == "requires_action")
        .await;
    assert_eq!(waiting["active_turn_id"], Value::from(turn_id.clone()));
    let t = s
        .get(
            &format!("/v1/sessions/{session}/turns/{turn_id}"),
            &s.viewer,
        )
        .await;
    assert_eq!(t.body["terminal_reason"], "requires_action");
    // The tenant-wide stream says so (the session waits until the decision below).
    until_status(&mut statuses, &session, "requires_action").await;
    let decided = s
        .post(
            &format!(
                "/v1/approvals/{}/decision",
                approval["approval_id"].as_str().unwrap()
            ),
            &s.operator,
            &json!({"decision": "allow_once", "args_hash": approval["args_hash"]}),
        )
        .await;
    assert_eq!(decided.status, StatusCode::OK, "{decided:?}");
    assert_eq!(decided.body["status"], "allowed");
    // Watch the stream until the turn finishes.
    let mut types = Vec::new();
    let mut last_seq = 0u64;
    let mut deltas = 0;
    let finished = loop {
        let f = sse
            .next()
            .await
            .expect("the stream ended before turn.finished");
        if let Some(id) = &f.id {
            let seq: u64 = id.parse().unwrap();
            assert!(seq > last_seq, "ids increase: {seq} after {last_seq}");
            last_seq = seq;
        }
        let data: Value = serde_json::from_str(&f.data).unwrap();
        match f.event.as_deref() {
            Some("delta") | Some("gap") => {
                assert!(f.id.is_none(), "an ephemeral frame has no id: {f:?}");
                assert_eq!(data["ephemeral"], true);
                deltas += usize::from(f.event.as_deref() == Some("delta"));
            }
            Some(ty) => {
                assert_eq!(data["type"], ty);
                assert_eq!(data["seq"].as_u64(), Some(last_seq));
                types.push(ty.to_owned());
                if ty == "turn.finished" {
                    break data;
                }
            }
            None => panic!("an event without a type: {f:?}"),
        }
    };
    assert_eq!(finished["payload"]["terminal_reason"], "completed");
    // The model's text streamed live, as ephemeral deltas beside the durable events.
    assert!(deltas > 0, "no delta streamed: {types:?}");
    let version = until_status(&mut statuses, &session, "idle").await;
    assert!(
        version >= last_seq,
        "idle at {version}, finished at {last_seq}"
    );
    for ty in [
        "session.created",
        "turn.queued",
        "approval.requested",
        "approval.decided",
        "tool_call.finished",
        "turn.finished",
    ] {
        assert!(types.iter().any(|t| t == ty), "{ty} missing from {types:?}");
    }
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("out.txt")).unwrap(),
        "hi\n"
    );
    let t = s
        .get(
            &format!("/v1/sessions/{session}/turns/{turn_id}"),
            &s.viewer,
        )
        .await;
    assert_eq!(t.body["status"], "completed", "{t:?}");
    assert_eq!(t.body["terminal_reason"], "completed");
    assert_eq!(t.body["final_text"], "wrote out.txt");
    assert_eq!(t.body["num_steps"], 2);
    assert_eq!(t.body["usage"]["input_tokens"], 22);
    assert!(
        t.body["usage_by_model"]
            .as_object()
            .is_some_and(|m| m.len() == 1),
        "{}",
        t.body
    );
    // Who did what is in the journal: the operator created, submitted and approved.
    let events = s
        .get(
            &format!("/v1/sessions/{session}/events?limit=1000"),
            &s.viewer,
        )
        .await;
    let keys = s.get("/v1/keys", &s.admin).await;
    let operator = keys.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "olga")
        .unwrap()["principal_id"]
        .clone();
    for ty in ["session.created", "turn.queued", "approval.decided"] {
        let ev = events.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == ty)
            .unwrap();
        assert_eq!(ev["principal_id"], operator, "{ty}: {ev}");
    }
    // Usage by tenant, day and model.
    let usage = s.get("/v1/usage", &s.viewer).await;
    assert_eq!(usage.status, StatusCode::OK);
    assert_eq!(usage.body["total_tokens"], 30);
}

/// Reads the tenant-wide stream until it reports `session` in `status`; returns the version.
async fn until_status(sse: &mut Sse, session: &str, status: &str) -> u64 {
    loop {
        let f = sse
            .next()
            .await
            .unwrap_or_else(|| panic!("the tenant stream ended before {session} was {status}"));
        assert_eq!(f.event.as_deref(), Some("session.status"), "{f:?}");
        let data: Value = serde_json::from_str(&f.data).unwrap();
        if data["session_id"] == session && data["status"] == status {
            return data["version"].as_u64().unwrap();
        }
    }
}
