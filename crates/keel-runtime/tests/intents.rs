//! Durable intents: another process submits and cancels while a worker runs the session.

use std::time::Duration;

use keel_core::{EventBody, SessionStatus, TerminalReason, ToolCallId, ToolCallStatus, TurnId};
use keel_runtime::intent::{INPUT, InputIntent};
use keel_runtime::{MultitaskStrategy, RunOutcome, RuntimeError};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    another_process_cancels_a_running_turn_and_it_ends_aborted_promptly,
    another_process_submits_while_a_turn_runs_and_the_runner_queues_and_runs_it,
    another_process_is_refused_under_reject_while_a_turn_runs,
    another_process_interrupts_the_running_turn_with_new_input,
    another_process_cancels_one_running_tool_call_and_the_turn_continues,
    an_intent_left_unhandled_is_applied_once_when_a_worker_starts,
);

/// A session whose first turn (`first`) is running a 60 s `sleep` call in a spawned run, plus
/// another process's runtime; `then` are the script lines after the call.
async fn running_sleep(
    b: Backend,
    then: &[serde_json::Value],
) -> (
    Fixture,
    TurnId,
    tokio::task::JoinHandle<Result<RunOutcome, RuntimeError>>,
    keel_runtime::Runtime,
) {
    let mut lines = vec![json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]})];
    lines.extend_from_slice(then);
    let f = fixture(b, &lines, |_| {}).await;
    let first = f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let run = spawn_run(&f);
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let other = other_process(&f.db).await;
    (f, first, run, other)
}

/// Spawns `rt.run` for the fixture's session.
fn spawn_run(f: &Fixture) -> tokio::task::JoinHandle<Result<RunOutcome, RuntimeError>> {
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    tokio::spawn(async move { rt.run(tenant, session).await })
}

/// Correctness deadline: the run would otherwise hang for a minute (sleeps of 60 s); the
/// expected time is well under a second.
async fn finish(run: tokio::task::JoinHandle<Result<RunOutcome, RuntimeError>>) -> RunOutcome {
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the run ends within the correctness deadline")
        .unwrap()
        .unwrap()
}

fn queued_count(evs: &[keel_core::Event], turn: TurnId) -> usize {
    evs.iter()
        .filter(|e| e.type_name() == "turn.queued" && e.correlation.turn_id == Some(turn))
        .count()
}

async fn another_process_cancels_a_running_turn_and_it_ends_aborted_promptly(b: Backend) {
    let (f, turn, run, other) = running_sleep(b, &[]).await;
    let cancelled = other.cancel_turn(f.tenant, f.session).await.unwrap();
    assert_eq!(cancelled, turn);
    let out = finish(run).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(out.status, SessionStatus::Idle);
    let evs = f.events().await;
    assert!(evs.iter().any(|e| e.type_name() == "turn.cancel_requested"));
    assert!(
        f.db.store
            .list_intents(f.tenant, f.session)
            .await
            .unwrap()
            .is_empty(),
        "the handled intent is deleted"
    );
}

async fn another_process_submits_while_a_turn_runs_and_the_runner_queues_and_runs_it(b: Backend) {
    let (f, first, run, other) = running_sleep(
        b,
        &[
            json!({"text": "first done"}),
            json!({"text": "second done"}),
        ],
    )
    .await;
    let second = other.submit(f.tenant, f.session, "second").await.unwrap();
    // Returned once journaled: the queued input is durable before the first turn ends.
    assert_eq!(queued_count(&f.events().await, second), 1);
    // Let the first turn go on.
    let id = ToolCallId::from("call_1_0");
    cancel_call_when_running(&f, &id).await;
    let out = finish(run).await;
    let ids: Vec<TurnId> = out.turns.iter().map(|t| t.turn_id).collect();
    assert_eq!(ids, vec![first, second], "both turns ran in this one run");
    assert_eq!(out.turns[1].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[1].final_text, "second done");
}

async fn another_process_is_refused_under_reject_while_a_turn_runs(b: Backend) {
    let (f, first, run, other) = running_sleep(b, &[]).await;
    let err = other
        .submit_with(
            f.tenant,
            f.session,
            "second",
            Some(MultitaskStrategy::Reject),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::TurnInProgress { turn, .. } if turn == first),
        "{err}"
    );
    let queued = f
        .events()
        .await
        .iter()
        .filter(|e| e.type_name() == "turn.queued")
        .count();
    assert_eq!(queued, 1, "nothing written for the refused input");
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    finish(run).await;
}

async fn another_process_interrupts_the_running_turn_with_new_input(b: Backend) {
    let (f, first, run, other) = running_sleep(b, &[json!({"text": "the newer input ran"})]).await;
    let second = other
        .submit_with(
            f.tenant,
            f.session,
            "second",
            Some(MultitaskStrategy::Interrupt),
        )
        .await
        .unwrap();
    let out = finish(run).await;
    assert_eq!(out.turns.len(), 2);
    assert_eq!(out.turns[0].turn_id, first);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(out.turns[1].turn_id, second);
    assert_eq!(out.turns[1].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[1].final_text, "the newer input ran");
}

async fn another_process_cancels_one_running_tool_call_and_the_turn_continues(b: Backend) {
    let (f, _first, run, other) = running_sleep(b, &[json!({"text": "carried on"})]).await;
    other
        .cancel_tool_call(f.tenant, f.session, &ToolCallId::from("call_1_0"))
        .await
        .unwrap();
    let out = finish(run).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "carried on");
    let status = f
        .events()
        .await
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, .. } => Some(*status),
            _ => None,
        })
        .unwrap();
    assert_eq!(status, ToolCallStatus::Cancelled);
}

async fn an_intent_left_unhandled_is_applied_once_when_a_worker_starts(b: Backend) {
    let f = fixture(b, &[json!({"text": "hello"})], |_| {}).await;
    // A handler journaled this input and crashed before deleting the row: the row is posted
    // twice below (once as if already journaled), and the turn must be queued once.
    let turn = TurnId::new();
    let payload = serde_json::to_value(InputIntent {
        turn_id: turn,
        input: "from an intent".into(),
        strategy: None,
        principal_id: None,
        priority: 0,
        compiled: None,
    })
    .unwrap();
    let store = &f.db.store;
    store
        .post_intent(f.tenant, f.session, INPUT, &payload)
        .await
        .unwrap();
    store
        .post_intent(f.tenant, f.session, INPUT, &payload)
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].turn_id, turn);
    assert_eq!(out.turns[0].final_text, "hello");
    assert_eq!(queued_count(&f.events().await, turn), 1);
    assert!(
        store
            .list_intents(f.tenant, f.session)
            .await
            .unwrap()
            .is_empty()
    );
}
