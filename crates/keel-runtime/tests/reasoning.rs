//! Hidden reasoning is not stored (issue 10 item 10): a provider gets its reasoning back
//! unmodified within the turn's tool loop — Anthropic thinking blocks with their signature and
//! redacted thinking, OpenAI Responses encrypted reasoning items — from sealed rows that the
//! turn's end deletes; the journal never holds the thinking text unless the session sets
//! `keep_reasoning`; subscribers still see it live, redacted.
//!
//! Before: `step.completed.reasoning` journaled every item (the thinking text in clear, for
//! ever), redacted — so a thinking block holding a secret came back with `[REDACTED]` in it and a
//! signature that no longer matched — and every later turn sent all earlier reasoning again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use keel_core::{ApprovalDecision, Budget, SessionStatus, TerminalReason};
use keel_model::{HttpModel, ModelClient, ProviderConfig, ReasoningItem, Wire};
use keel_runtime::seal::SealKey;
use keel_runtime::{
    DeltaKind, PendingAction, REDACTED, Runtime, RuntimeOptions, SessionConfig, SubscriptionItem,
};
use keel_store::SealedKind;
use keel_testkit::{FakeModelServer, FakeResponse, Handler, Pacing, RecordedRequest, Reply};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    anthropic_thinking_goes_back_unmodified_within_the_turn_and_is_never_journaled,
    sealed_thinking_survives_a_restart_while_the_turn_waits_for_approval,
    keep_reasoning_journals_the_reasoning_redacted_and_still_sends_it_exact,
    responses_encrypted_reasoning_goes_back_within_the_turn_only,
);

const SECRET: &str = "tok-0123456789ab";
const SIGNATURE: &str = "EvQBCkYICxgCKkAxhD4NUKFzudtZ6NzbZdEiBACIScTz+/qjPViM596iW==";
const REDACTED_DATA: &str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr";

fn thinking() -> String {
    format!("The user wants the readme. Using key {SECRET} would be wrong, so read the file.")
}

fn anthropic_items() -> Vec<ReasoningItem> {
    vec![
        ReasoningItem::Anthropic {
            thinking: thinking(),
            signature: SIGNATURE.into(),
        },
        ReasoningItem::AnthropicRedacted {
            data: REDACTED_DATA.into(),
        },
    ]
}

fn openai_item() -> ReasoningItem {
    ReasoningItem::Openai {
        id: "rs_0183".into(),
        encrypted_content: Some("gAAAAABpPDIVOKrsHNZ0GwsoEKA_IGfuJ5f8Ma_6-Eoj==".into()),
        summary: vec![format!("**Reading the readme** instead of using {SECRET}.")],
    }
}

/// Turn one: reasoning and a `tool` call, then `done`; every later request: `again`.
fn replies(reasoning: Vec<ReasoningItem>, tool: &str, args: &str) -> Vec<FakeResponse> {
    let mut first = FakeResponse::text("").with_tool_call("call_1", tool, args);
    first.reasoning = reasoning;
    vec![
        first,
        FakeResponse::text("done"),
        FakeResponse::text("again"),
    ]
}

/// A fake server answering request n with `replies[n]` (the last one after that), and a model
/// of `wire` over it.
async fn served(wire: Wire, replies: Vec<FakeResponse>) -> (FakeModelServer, Arc<dyn ModelClient>) {
    let n = AtomicUsize::new(0);
    let handler: Handler = Arc::new(move |_: &RecordedRequest| {
        let i = n.fetch_add(1, Ordering::SeqCst).min(replies.len() - 1);
        Reply::Respond(replies[i].clone())
    });
    let server = FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap();
    let model = HttpModel::new(
        wire,
        ProviderConfig::new("test-model")
            .with_base_url(server.base_url(wire))
            .with_api_key("k"),
    )
    .unwrap();
    (server, Arc::new(model))
}

fn secrets(c: &mut SessionConfig) {
    c.secret_patterns = vec!["tok-[0-9a-f]{12}".into()];
}

/// A runtime on the fixture's store with `model` and deployment key `key`, as a restarted
/// process would be.
fn with_key(f: &Fixture, model: Arc<dyn ModelClient>, key: SealKey) -> Runtime {
    Runtime::new(
        f.db.store.clone(),
        model,
        registry(),
        RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            seal_key: key,
            ..RuntimeOptions::default()
        },
    )
}

async fn reasoning_rows(f: &Fixture) -> usize {
    f.db.store
        .sealed_rows(f.tenant, f.session, SealedKind::Reasoning)
        .await
        .unwrap()
        .len()
}

/// The journal, serialized.
async fn journal(f: &Fixture) -> String {
    serde_json::to_string(&f.events().await).unwrap()
}

/// `step.completed` payloads, in order.
async fn completed_steps(f: &Fixture) -> Vec<Value> {
    f.events()
        .await
        .iter()
        .filter(|e| e.type_name() == "step.completed")
        .map(|e| serde_json::to_value(e).unwrap()["payload"].clone())
        .collect()
}

/// The Anthropic request's assistant message that holds the `tool_use` of `call_1`.
fn anthropic_assistant(req: &RecordedRequest) -> Value {
    req.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["role"] == "assistant"
                && m["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|b| b["type"] == "tool_use" && b["id"] == "call_1")
        })
        .cloned()
        .unwrap_or_else(|| panic!("no assistant message with call_1 in {}", req.body))
}

fn expected_thinking_blocks() -> Vec<Value> {
    vec![
        json!({"type": "thinking", "thinking": thinking(), "signature": SIGNATURE}),
        json!({"type": "redacted_thinking", "data": REDACTED_DATA}),
    ]
}

/// Before: the thinking text (and the secret in it) was journaled in `step.completed`; the
/// block came back redacted (a signature mismatch for the provider); later turns sent it again;
/// nothing was deleted. Now: the second request of the turn carries both blocks exactly as the
/// provider streamed them (secret and signature intact), the journal holds neither the text nor
/// the signature (only `reasoning_sealed: 2`), subscribers saw the thinking live but redacted,
/// the turn's end deleted the sealed row, and the next turn is sent without reasoning.
async fn anthropic_thinking_goes_back_unmodified_within_the_turn_and_is_never_journaled(
    b: Backend,
) {
    let (server, model) = served(
        Wire::Anthropic,
        replies(anthropic_items(), "read_file", r#"{"path":"README.md"}"#),
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), secrets).await;
    let mut sub = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    f.rt.submit(f.tenant, f.session, "read the readme")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let content = anthropic_assistant(&requests[1])["content"].clone();
    assert_eq!(
        content.as_array().unwrap()[..2],
        expected_thinking_blocks()[..],
        "the thinking blocks go back first, unmodified: {content}"
    );

    let journal = journal(&f).await;
    assert!(!journal.contains("The user wants the readme"), "{journal}");
    assert!(!journal.contains(SECRET));
    assert!(!journal.contains(SIGNATURE) && !journal.contains(REDACTED_DATA));
    let steps = completed_steps(&f).await;
    assert_eq!(steps[0]["reasoning_sealed"], 2, "{}", steps[0]);
    assert!(steps[0].get("reasoning").is_none(), "{}", steps[0]);
    assert!(steps[1].get("reasoning_sealed").is_none(), "{}", steps[1]);
    assert_eq!(
        reasoning_rows(&f).await,
        0,
        "the turn's end deletes the rows"
    );

    let mut live = String::new();
    while let Some(item) = sub.next_timeout(Duration::from_millis(500)).await.unwrap() {
        if let SubscriptionItem::Delta { delta } = item
            && let DeltaKind::Reasoning { text } = delta.kind
        {
            live.push_str(&text);
        }
    }
    assert_eq!(live, thinking().replace(SECRET, REDACTED), "live, redacted");

    f.rt.submit(f.tenant, f.session, "and now?").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let earlier = anthropic_assistant(&requests[2])["content"].clone();
    assert!(
        earlier
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "thinking" && b["type"] != "redacted_thinking"),
        "a finished turn is sent without reasoning: {earlier}"
    );
}

/// Before: the blocks lived only in the journal. Now they live in a sealed row, so they must
/// survive the process: the turn stops in `requires_action` after the first step (the row
/// stays — the tool loop is still open), a new runtime with the same deployment key resumes
/// after the approval and still sends both blocks back unmodified; the turn's end deletes the
/// row.
async fn sealed_thinking_survives_a_restart_while_the_turn_waits_for_approval(b: Backend) {
    let key = SealKey::ephemeral();
    let (server, model) = served(
        Wire::Anthropic,
        replies(
            anthropic_items(),
            "write_file",
            r#"{"path":"notes.txt","content":"read it\n"}"#,
        ),
    )
    .await;
    let f = fixture_with(b, model.clone(), &[], Budget::default(), |c| {
        secrets(c);
        c.permission_mode = PermissionMode::Default;
    })
    .await;
    let first = with_key(&f, model.clone(), key.clone());
    first
        .submit(f.tenant, f.session, "take notes")
        .await
        .unwrap();
    let out = first.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert_eq!(reasoning_rows(&f).await, 1, "kept while the turn waits");
    let Some(PendingAction::Approval {
        approval_id,
        args_hash,
        ..
    }) = out.pending.first().cloned()
    else {
        panic!("no approval pending: {:?}", out.pending);
    };
    first
        .decide_approval(
            f.tenant,
            approval_id,
            ApprovalDecision::AllowOnce,
            &args_hash,
        )
        .await
        .unwrap();
    drop(first);

    let second = with_key(&f, model, key);
    let out = second.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(
        std::fs::read_to_string(f.ws.path().join("notes.txt")).unwrap(),
        "read it\n"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let content = anthropic_assistant(&requests[1])["content"].clone();
    assert_eq!(
        content.as_array().unwrap()[..2],
        expected_thinking_blocks()[..],
        "{content}"
    );
    assert!(!journal(&f).await.contains(SIGNATURE));
    assert_eq!(reasoning_rows(&f).await, 0);
}

/// With `keep_reasoning = true` the items are journaled as before, redacted (the secret in the
/// thinking text is `[REDACTED]` in the journal), while the request still gets them exact from
/// the sealed row — a redacted block would fail its signature check.
async fn keep_reasoning_journals_the_reasoning_redacted_and_still_sends_it_exact(b: Backend) {
    let (server, model) = served(
        Wire::Anthropic,
        replies(anthropic_items(), "read_file", r#"{"path":"README.md"}"#),
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), |c| {
        secrets(c);
        c.keep_reasoning = true;
    })
    .await;
    f.rt.submit(f.tenant, f.session, "read the readme")
        .await
        .unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let steps = completed_steps(&f).await;
    assert_eq!(steps[0]["reasoning_sealed"], 2);
    assert_eq!(
        steps[0]["reasoning"][0]["thinking"],
        thinking().replace(SECRET, REDACTED)
    );
    assert_eq!(steps[0]["reasoning"][0]["signature"], SIGNATURE);
    assert_eq!(steps[0]["reasoning"][1]["data"], REDACTED_DATA);
    assert!(!journal(&f).await.contains(SECRET));
    let content = anthropic_assistant(&server.requests()[1])["content"].clone();
    assert_eq!(
        content.as_array().unwrap()[..2],
        expected_thinking_blocks()[..]
    );
    assert_eq!(reasoning_rows(&f).await, 0);
}

/// The OpenAI Responses wire: the encrypted reasoning item (with its summary) goes back exactly
/// before the function call within the turn, is not journaled, and a finished turn is sent
/// without it. Before: it was journaled with its summary text and replayed in every later turn.
async fn responses_encrypted_reasoning_goes_back_within_the_turn_only(b: Backend) {
    let (server, model) = served(
        Wire::OpenaiResponses,
        replies(vec![openai_item()], "read_file", r#"{"path":"README.md"}"#),
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), secrets).await;
    f.rt.submit(f.tenant, f.session, "read the readme")
        .await
        .unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let reasoning_in = |req: &RecordedRequest| -> Vec<Value> {
        req.body["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .cloned()
            .collect()
    };
    let requests = server.requests();
    let ReasoningItem::Openai {
        encrypted_content,
        summary,
        ..
    } = openai_item()
    else {
        unreachable!()
    };
    assert_eq!(
        reasoning_in(&requests[1]),
        vec![json!({
            "type": "reasoning", "id": "rs_0183",
            "summary": [{"type": "summary_text", "text": summary[0]}],
            "encrypted_content": encrypted_content,
        })]
    );
    let input = requests[1].body["input"].as_array().unwrap().clone();
    let at = |ty: &str| input.iter().position(|i| i["type"] == ty).unwrap();
    assert!(at("reasoning") < at("function_call"), "{input:?}");
    let journal = journal(&f).await;
    assert!(!journal.contains("Reading the readme") && !journal.contains("gAAAAAB"));
    assert_eq!(completed_steps(&f).await[0]["reasoning_sealed"], 1);
    assert_eq!(reasoning_rows(&f).await, 0);

    f.rt.submit(f.tenant, f.session, "and now?").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert!(reasoning_in(&server.requests()[2]).is_empty());
}
