//! `keel acp` and approvals decided outside the plain ask-and-answer: a sub-agent's approval
//! asked in the editor, and an approval decided by `keel approve` while the editor is asked
//! (new-user review of issue 17, round 2: both left the prompt hanging).

use serde_json::{Value, json};

use crate::acp::script;
use crate::acp_wire::{Raw, initialize, request};
use crate::common::{Env, stderr};

/// A `session/request_permission` request read from `keel acp`.
fn is_permission(v: &Value) -> bool {
    v["method"] == "session/request_permission"
}

/// The agent text of the updates in `seen`, joined.
fn agent_text(seen: &[Value]) -> String {
    seen.iter()
        .filter(|v| v["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
        .collect()
}

/// Starts a session in `env`'s workspace and sends the prompt `text` as request 3.
fn prompt(r: &mut Raw, env: &Env, text: &str) -> Value {
    initialize(r);
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
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    ));
    session
}

/// A child's approval reaches the editor as `session/request_permission` whose title names the
/// agent and the child's call; the editor's answer decides it, and the same `session/prompt`
/// finishes with the parent's answer.
#[test]
fn acp_asks_the_editor_for_a_sub_agents_approval_and_the_turn_finishes() {
    let env = Env::new();
    env.write(
        "helper.jsonl",
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"from the child\"}}]}\n{\"text\":\"helper finished\"}\n",
    );
    env.write(
        "config/keel/keel.toml",
        &format!(
            "[agents.helper]\nmodel = \"script:{}\"\ninstructions = \"You help.\"\ntools = [\"write_file\"]\n",
            env.path("helper.jsonl").display()
        ),
    );
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "spawn_agent", "arguments": {"agent": "helper", "prompt": "Write a.txt."}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let mut r = Raw::start(&env, &["--model", &model]);
    prompt(&mut r, &env, "delegate");
    let ask = r.until(is_permission);
    let title = ask["params"]["toolCall"]["title"]
        .as_str()
        .unwrap_or_default();
    assert!(title.contains("a.txt") && title.contains("helper"), "{ask}");
    r.send(&json!({"jsonrpc": "2.0", "id": ask["id"],
                   "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}));
    let answer = r.answer(&json!(3));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "from the child"
    );
    let text = agent_text(&r.seen);
    assert!(text.contains("parent done"), "{text}");
    let (_, status) = r.finish();
    assert!(status.success());
}

/// `keel approve` while the editor's permission request is open: the turn goes on at once
/// with that decision, the editor is told it was decided elsewhere, and the editor's late
/// Reject changes nothing.
#[test]
fn acp_goes_on_when_keel_approve_decides_while_the_editor_is_asked() {
    let env = Env::new();
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "approved"}}]}),
            json!({"text": "wrote it"}),
        ],
    );
    let mut r = Raw::start(&env, &["--model", &model]);
    let session = prompt(&mut r, &env, "write");
    let ask = r.until(is_permission);
    let show: Value = serde_json::from_slice(
        &env.run(&["sessions", "show", session.as_str().unwrap(), "--json"])
            .stdout,
    )
    .unwrap();
    let id = show["pending_approvals"][0]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{show}"));
    let out = env.run(&["approve", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The prompt finishes without the editor's answer.
    let answer = r.answer(&json!(3));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let text = agent_text(&r.seen);
    assert!(
        text.contains("decided outside the editor") && text.contains("allowed once"),
        "{text}"
    );
    assert!(text.contains("wrote it"), "{text}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("b.txt")).unwrap(),
        "approved"
    );
    // The late Reject is ignored: the next prompt runs normally.
    r.send(&json!({"jsonrpc": "2.0", "id": ask["id"],
                   "result": {"outcome": {"outcome": "selected", "optionId": "reject_once"}}}));
    let (_, status) = r.finish();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(env.ws().join("b.txt")).unwrap(),
        "approved"
    );
}
