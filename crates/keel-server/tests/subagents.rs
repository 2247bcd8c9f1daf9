//! Sub-agents on the server: a release's `agents` (validated, shown in release bodies) are what
//! its sessions' `spawn_agent` starts; the child's answer is the parent's tool result.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(a_server_releases_parent_spawns_a_child_whose_answer_comes_back);

/// Writes a script in the test root; its `script:` route.
pub fn script(s: &TestServer, name: &str, lines: &[Value]) -> String {
    let path = s.root.path().join(format!("{name}.jsonl"));
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    format!("script:{}", path.display())
}

async fn a_server_releases_parent_spawns_a_child_whose_answer_comes_back(b: Backend) {
    let s = start(b).await;
    let child = script(&s, "helper", &[json!({"text": "the child's answer"})]);
    let parent = script(
        &s,
        "parent",
        &[
            json!({"tool_calls": [{"name": "spawn_agent", "arguments": {"agent": "helper", "prompt": "Answer."}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let body = |agents: Value| {
        json!({
            "name": "lead",
            "model_route": [parent.clone()],
            "tools": ["spawn_agent", "read_file"],
            "agents": agents,
        })
    };
    // Refused, naming `agents`: a bad name, an unknown tool, a route the server does not serve.
    for (agents, says) in [
        (json!({"bad name": {}}), "agent name"),
        (
            json!({"helper": {"tools": ["no_such_tool"]}}),
            "unknown tool",
        ),
        (
            json!({"helper": {"model_route": ["nosuch:model"]}}),
            "agent \"helper\"",
        ),
    ] {
        let r = s.post("/v1/releases", &s.admin, &body(agents)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
        assert_eq!(r.body["field"], "agents", "{r:?}");
        assert!(r.body["detail"].as_str().unwrap().contains(says), "{r:?}");
    }
    let agents = json!({"helper": {"instructions": "You help.", "tools": ["read_file"], "model_route": [child]}});
    let r = s
        .post("/v1/releases", &s.admin, &body(agents.clone()))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // Shown as created, in the body and when read back.
    assert_eq!(r.body["agents"], agents, "{r:?}");
    let release = r.body["release_id"].as_str().unwrap().to_owned();
    let read = s.get(&format!("/v1/releases/{release}"), &s.viewer).await;
    assert_eq!(read.body["agents"], agents, "{read:?}");

    let session = s.run_to_idle(&release, "delegate").await;
    let finished = events_of(&s, &session, "tool_call.finished").await;
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0]["payload"]["status"], "succeeded");
    assert_eq!(finished[0]["payload"]["output"], "the child's answer");
    let spawned = events_of(&s, &session, "agent.spawned").await;
    assert_eq!(spawned.len(), 1);
    let child_id = spawned[0]["payload"]["child_session_id"].as_str().unwrap();
    assert_eq!(events_of(&s, &session, "agent.finished").await.len(), 1);
    // The child is a session of the tenant, linked to its parent.
    let c = s.get(&format!("/v1/sessions/{child_id}"), &s.viewer).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let turns = events_of(&s, &session, "turn.finished").await;
    assert_eq!(
        turns.last().unwrap()["payload"]["terminal_reason"],
        "completed",
        "{turns:?}"
    );
}

on_both!(a_childs_approval_is_listed_and_decided_through_its_parent);

/// A child that needs an approval: the parent session's approvals list it, labelled with the
/// child session and the agent, and the parent goes `requires_action` (it does not wait inside
/// its call); deciding it through the API lets the child, then the parent, finish (`idle`).
async fn a_childs_approval_is_listed_and_decided_through_its_parent(b: Backend) {
    let s = start(b).await;
    let child = script(
        &s,
        "writer",
        &[
            json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "c.txt", "content": "child"}}]}),
            json!({"text": "wrote c.txt"}),
        ],
    );
    let parent = script(
        &s,
        "lead",
        &[
            json!({"tool_calls": [{"name": "spawn_agent", "arguments": {"agent": "writer", "prompt": "Write c.txt."}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let r = s
        .post(
            "/v1/releases",
            &s.admin,
            &json!({
                "name": "lead",
                "model_route": [parent],
                "agents": {"writer": {"tools": ["write_file"], "model_route": [child]}},
            }),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let release = r.body["release_id"].as_str().unwrap().to_owned();
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let t = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "delegate"}),
        )
        .await;
    assert_eq!(t.status, StatusCode::ACCEPTED, "{t:?}");
    // The parent's approvals list the child's, labelled.
    let listed = {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let r = s
                .get(
                    &format!("/v1/sessions/{session}/approvals?status=pending"),
                    &s.viewer,
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            if let Some(a) = r.body["items"].as_array().and_then(|i| i.first()) {
                break a.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "no approval listed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    assert_eq!(listed["agent"], "writer", "{listed}");
    assert_eq!(listed["tool_name"], "write_file", "{listed}");
    assert_ne!(listed["session_id"], session.as_str(), "{listed}");
    let spawned = events_of(&s, &session, "agent.spawned").await;
    assert_eq!(
        listed["session_id"], spawned[0]["payload"]["child_session_id"],
        "{listed}"
    );
    // The parent does not hang in its call: it waits on the human too.
    s.wait_session(&session, |b| b["status"] == "requires_action")
        .await;
    // Input to the child session is refused, naming the parent: the child's answer belongs to
    // the parent's call.
    let child_id = listed["session_id"].as_str().unwrap();
    let r = s
        .post(
            &format!("/v1/sessions/{child_id}/turns"),
            &s.operator,
            &json!({"input": "more please"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(r.body.to_string().contains(&session), "{r:?}");
    let approval = listed["approval_id"].as_str().unwrap();
    let d = s
        .post(
            &format!("/v1/approvals/{approval}/decision"),
            &s.operator,
            &json!({"decision": "allow_once", "args_hash": listed["args_hash"]}),
        )
        .await;
    assert_eq!(d.status, StatusCode::OK, "{d:?}");
    s.wait_session(&session, |b| b["status"] == "idle").await;
    let finished = events_of(&s, &session, "tool_call.finished").await;
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(
        finished[0]["payload"]["output"], "wrote c.txt",
        "{finished:?}"
    );
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("c.txt")).unwrap(),
        "child"
    );
}
