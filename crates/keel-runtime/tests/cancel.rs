//! Cancellation (turn, one tool, during streaming, during an approval wait) and timeouts.

use std::time::Duration;

use keel_core::{Budget, EventBody, SessionStatus, TerminalReason, ToolCallId, ToolCallStatus};
use keel_testkit::Pacing;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_tool_timeout_fails_that_call_and_the_turn_continues,
    cancelling_the_turn_stops_running_tools_and_gives_every_call_a_result,
    cancelling_one_tool_gives_it_a_cancelled_result_and_the_turn_continues,
    cancelling_during_streaming_closes_the_connection_and_aborts_the_turn,
    cancelling_during_an_approval_wait_aborts_the_suspended_turn,
    a_turn_timeout_makes_dispatched_effects_outcome_unknown_never_failed,
    cancelling_a_turn_nobody_runs_ends_it_and_leaves_the_queued_turn_for_the_next_run,
);

/// Every call of the session has exactly one `tool_call.finished`.
async fn every_call_has_one_result(f: &Fixture) {
    let evs = f.events().await;
    let proposed: Vec<_> = evs
        .iter()
        .filter(|e| e.type_name() == "tool_call.proposed")
        .map(|e| e.correlation.tool_call_id.clone())
        .collect();
    for id in proposed {
        let n = evs
            .iter()
            .filter(|e| e.type_name() == "tool_call.finished" && e.correlation.tool_call_id == id)
            .count();
        assert_eq!(n, 1, "{id:?}");
    }
}

fn status_of(evs: &[keel_core::Event], call: &str) -> ToolCallStatus {
    evs.iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, .. }
                if e.correlation.tool_call_id.as_ref().map(|c| c.as_str()) == Some(call) =>
            {
                Some(*status)
            }
            _ => None,
        })
        .unwrap()
}

async fn cancelling_the_turn_stops_running_tools_and_gives_every_call_a_result(b: Backend) {
    let f = fixture(b, &[json!({"tool_calls": [call("sleep", json!({"ms": 60000})), call("sleep", json!({"ms": 60001}))]})], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "wait").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(out.status, SessionStatus::Idle);
    every_call_has_one_result(&f).await;
    let evs = f.events().await;
    assert_eq!(status_of(&evs, "call_1_0"), ToolCallStatus::Cancelled);
    assert_eq!(status_of(&evs, "call_1_1"), ToolCallStatus::Cancelled);
    assert!(
        f.types().await.contains(&"turn.cancel_requested"),
        "the intent is durable"
    );
}

async fn cancelling_one_tool_gives_it_a_cancelled_result_and_the_turn_continues(b: Backend) {
    let f = fixture(
        b,
        &[json!({"tool_calls": [call("sleep", json!({"ms": 60000})), call("sleep", json!({"ms": 10}))]}), json!({"text": "carried on"})],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "wait").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let id = ToolCallId::from("call_1_0");
    cancel_call_when_running(&f, &id).await;
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "carried on");
    let evs = f.events().await;
    assert_eq!(status_of(&evs, "call_1_0"), ToolCallStatus::Cancelled);
    assert_eq!(status_of(&evs, "call_1_1"), ToolCallStatus::Succeeded);
    every_call_has_one_result(&f).await;
}

async fn cancelling_during_streaming_closes_the_connection_and_aborts_the_turn(b: Backend) {
    let long = "word ".repeat(400);
    let (server, model) = paced_model(
        long,
        Pacing {
            time_to_first_token_ms: 0,
            tokens_per_second: Some(50.0),
        },
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), |_| {}).await;
    f.rt.submit(f.tenant, f.session, "talk").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "step.streaming").await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert!(
        server.wait_for_abandoned(1, Duration::from_secs(20)).await,
        "the HTTP stream was closed"
    );
    let evs = f.events().await;
    let failed = evs.iter().find(|e| e.type_name() == "step.failed").unwrap();
    assert!(
        matches!(&failed.body, EventBody::StepFailed { error_kind, responses_consumed: 0, .. } if error_kind == "cancelled")
    );
}

async fn cancelling_during_an_approval_wait_aborts_the_suspended_turn(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "never"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert_eq!(out.pending.len(), 1);
    // The worker is released: the wait is a row. Any caller can cancel.
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    assert_eq!(view.state.status, SessionStatus::Idle);
    assert_eq!(view.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(
        status_of(&f.events().await, "call_1_0"),
        ToolCallStatus::Cancelled
    );
    assert!(f.counter_lines().is_empty());
    every_call_has_one_result(&f).await;
}

async fn a_turn_timeout_makes_dispatched_effects_outcome_unknown_never_failed(b: Backend) {
    let f = fixture(
        b,
        &[json!({"tool_calls": [call("slow_effect", json!({"ms": 60000}))]})],
        |c| c.turn_timeout_ms = Some(300),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "slow").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), f.rt.run(f.tenant, f.session))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Failed);
    assert!(out.turns[0].error.as_deref().unwrap().contains("timed out"));
    let types = f.types().await;
    assert!(types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert!(!types.contains(&"effect.failed"));
    every_call_has_one_result(&f).await;
}

async fn a_tool_timeout_fails_that_call_and_the_turn_continues(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]}),
            json!({"text": "moved on"}),
        ],
        |c| c.tool_timeout_ms = Some(200),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "wait").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), f.rt.run(f.tenant, f.session))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let evs = f.events().await;
    assert_eq!(status_of(&evs, "call_1_0"), ToolCallStatus::Failed);
    let text = evs
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { output, .. } => Some(output.clone()),
            _ => None,
        })
        .unwrap();
    assert!(text.contains("timed out after 200 ms"), "{text}");
}

/// Review item I: `keel cancel` of a session nobody runs (its turn waits on a human, a
/// follow-up is queued) used `run`, which went on to start the queued turn with the canceller's
/// model (the CLI's placeholder: "scripted:(no model)"), consuming it as a failed turn. Now the
/// cancellation ends the cancelled turn only; the follow-up stays queued, and the next run (with
/// the session's model, at the script position the session stands at) answers it.
async fn cancelling_a_turn_nobody_runs_ends_it_and_leaves_the_queued_turn_for_the_next_run(
    b: Backend,
) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "the follow-up, answered"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
        },
    )
    .await;
    let first = f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let follow_up = f.rt.submit(f.tenant, f.session, "follow-up").await.unwrap();
    let version = f.rt.view(f.tenant, f.session).await.unwrap().state.version;

    // Another process, whose model must never be asked.
    let other = other_process(&f.db).await;
    assert_eq!(other.cancel_turn(f.tenant, f.session).await.unwrap(), first);
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    assert_eq!(view.turns.len(), 1, "{:?}", view.turns);
    assert_eq!(view.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(
        view.state.queue.iter().copied().collect::<Vec<_>>(),
        [follow_up],
        "the follow-up is still queued"
    );
    let after: Vec<&'static str> = f
        .events()
        .await
        .iter()
        .filter(|e| e.seq > version)
        .map(|e| e.type_name())
        .collect();
    assert!(
        !after.contains(&"turn.started") && !after.contains(&"step.started"),
        "nothing ran after the cancellation: {after:?}"
    );
    assert!(f.counter_lines().is_empty());

    // The next run answers the follow-up with the session's model, from where it stands.
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    let t = &out.turns[0];
    assert_eq!(
        (t.turn_id, t.terminal_reason, t.final_text.as_str()),
        (
            follow_up,
            TerminalReason::Completed,
            "the follow-up, answered"
        )
    );
}
