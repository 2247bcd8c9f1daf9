//! The turn loop with the scripted model: event order, multi-step turns, multitask strategies,
//! script position across turns, bad input.

use keel_core::{SessionStatus, TerminalReason};
use keel_runtime::{MultitaskStrategy, RuntimeError};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    enqueue_runs_queued_inputs_in_order,
    reject_refuses_input_while_a_turn_is_queued_and_writes_nothing,
    interrupt_aborts_the_active_turn_and_runs_the_new_input,
    empty_input_is_refused_and_nothing_is_written,
    a_bad_config_is_refused_before_anything_is_written,
    a_model_error_fails_the_turn_and_names_it,
    a_text_turn_journals_every_transition_and_ends_with_turn_finished,
    a_multi_step_turn_runs_tools_and_completes,
    the_script_position_carries_across_turns,
    failed_http_attempts_before_a_scripted_fallback_take_no_script_line,
    an_empty_chat_stream_is_retried_then_fails_the_step_cleanly,
    an_injected_empty_response_is_retried_like_a_provider_failure,
);

async fn a_text_turn_journals_every_transition_and_ends_with_turn_finished(b: Backend) {
    let f = fixture(
        b,
        &[json!({"text": "hello there", "usage": {"input_tokens": 10, "output_tokens": 5}})],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "say hi").await.unwrap();
    // The input is durable before anything runs.
    assert_eq!(f.types().await, ["session.created", "turn.queued"]);
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns.len(), 1);
    let t = &out.turns[0];
    assert_eq!(t.terminal_reason, TerminalReason::Completed);
    assert_eq!(t.final_text, "hello there");
    assert_eq!(t.usage.input_tokens, 10);
    assert_eq!(t.num_steps, 1);
    assert_eq!(
        f.types().await,
        [
            "session.created",
            "turn.queued",
            "session.status_changed",
            "turn.started",
            "turn.phase_changed",
            "step.started",
            "step.streaming",
            "step.completed",
            "turn.finished",
            "session.status_changed",
        ]
    );
}

async fn a_multi_step_turn_runs_tools_and_completes(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("read_file", json!({"path": "README.md"})), call("counter", json!({"label": "a"}))]}),
            json!({"tool_calls": [call("counter", json!({"label": "b"}))]}),
            json!({"text": "all done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count twice")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::Completed,
        "{out:?}"
    );
    assert_eq!(out.turns[0].num_steps, 3);
    let lines = f.counter_lines();
    assert_eq!(lines, ["call_1_1 a", "call_2_0 b"]);
    let evs = f.events().await;
    let effects: Vec<_> = evs
        .iter()
        .map(|e| e.type_name())
        .filter(|t| t.starts_with("effect."))
        .collect();
    assert_eq!(
        effects,
        [
            "effect.prepared",
            "effect.dispatched",
            "effect.committed",
            "effect.prepared",
            "effect.dispatched",
            "effect.committed"
        ]
    );
    // Intent before effect: prepared and dispatched are committed before the call starts.
    let pos = |ty: &str, call: &str| {
        evs.iter()
            .position(|e| {
                e.type_name() == ty
                    && e.correlation.tool_call_id.as_ref().map(|c| c.as_str()) == Some(call)
            })
            .unwrap()
    };
    assert!(pos("effect.prepared", "call_1_1") < pos("tool_call.started", "call_1_1"));
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert_eq!(
        ctx.messages.len(),
        1 + 1 + 2 + 1 + 1 + 1,
        "user, assistant, 2 results, assistant, result, assistant"
    );
}

async fn the_script_position_carries_across_turns(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"}), json!({"text": "two"})], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let a = f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let b2 = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(a.turns[0].final_text, "one");
    assert_eq!(b2.turns[0].final_text, "two");
}

async fn failed_http_attempts_before_a_scripted_fallback_take_no_script_line(b: Backend) {
    let handler: keel_testkit::Handler =
        std::sync::Arc::new(|_| keel_testkit::Reply::Fault(keel_testkit::Fault::ServerError));
    let server = keel_testkit::FakeModelServer::start(handler, keel_testkit::Pacing::default())
        .await
        .unwrap();
    let http = keel_model::HttpModel::new(
        keel_model::Wire::OpenaiChat,
        keel_model::ProviderConfig::new("gpt-4o")
            .with_base_url(server.base_url(keel_model::Wire::OpenaiChat))
            .with_api_key("k"),
    )
    .unwrap();
    let policy = keel_model::RetryPolicy {
        max_attempts: 2,
        base_delay_ms: 1,
        max_delay_ms: 2,
        max_retry_after_ms: 1_000,
    };
    let route = keel_model::ModelRoute::new(
        vec![
            std::sync::Arc::new(http),
            scripted(&[json!({"text": "one"}), json!({"text": "two"})]),
        ],
        policy,
    )
    .unwrap();
    let f = fixture_with(
        b,
        std::sync::Arc::new(route),
        &[],
        keel_core::Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let a = f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let b2 = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(a.turns[0].final_text, "one");
    assert_eq!(b2.turns[0].final_text, "two", "line 2, not line 4");
    assert_eq!(server.requests().len(), 4, "two HTTP attempts per step");
}

async fn enqueue_runs_queued_inputs_in_order(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"}), json!({"text": "two"})], |_| {}).await;
    let t1 = f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let t2 = f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let ids: Vec<_> = out.turns.iter().map(|t| t.turn_id).collect();
    assert_eq!(ids, [t1, t2]);
    assert!(
        out.turns
            .iter()
            .all(|t| t.terminal_reason == TerminalReason::Completed)
    );
}

async fn reject_refuses_input_while_a_turn_is_queued_and_writes_nothing(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"})], |c| {
        c.multitask = MultitaskStrategy::Reject
    })
    .await;
    let t1 = f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let before = f.events().await.len();
    let err =
        f.rt.submit(f.tenant, f.session, "second")
            .await
            .unwrap_err();
    assert!(
        matches!(err, RuntimeError::TurnInProgress { turn, .. } if turn == t1),
        "{err}"
    );
    assert_eq!(f.events().await.len(), before);
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns.len(), 1);
}

async fn interrupt_aborts_the_active_turn_and_runs_the_new_input(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]}),
            json!({"text": "second answer"}),
        ],
        |c| c.multitask = MultitaskStrategy::Interrupt,
    )
    .await;
    let t1 = f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let t2 = f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = run.await.unwrap().unwrap();
    let got: Vec<_> = out
        .turns
        .iter()
        .map(|t| (t.turn_id, t.terminal_reason))
        .collect();
    assert_eq!(
        got,
        [
            (t1, TerminalReason::Aborted),
            (t2, TerminalReason::Completed)
        ]
    );
    assert_eq!(out.turns[1].final_text, "second answer");
}

async fn empty_input_is_refused_and_nothing_is_written(b: Backend) {
    let f = fixture(b, &[json!({"text": "x"})], |_| {}).await;
    let err = f.rt.submit(f.tenant, f.session, "   ").await.unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
    assert_eq!(f.types().await, ["session.created"]);
}

async fn a_bad_config_is_refused_before_anything_is_written(b: Backend) {
    let db = db(b).await;
    let rt = runtime(&db, scripted(&[json!({"text": "x"})]));
    let ws = workspace();
    let mut cfg = config(ws.path());
    cfg.deny = vec!["shell(".into()];
    let err = rt
        .create_session(
            keel_core::TenantId::new(),
            &release(&[], Default::default()),
            cfg,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
}

async fn a_model_error_fails_the_turn_and_names_it(b: Backend) {
    let f = fixture(b, &[json!({"error": {"kind": "authentication"}})], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "hi").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Failed);
    assert!(
        out.turns[0]
            .error
            .as_deref()
            .unwrap()
            .contains("authentication"),
        "{out:?}"
    );
}

/// A Chat stream that is only `data: [DONE]` is an `empty_response` provider error: retried by
/// the retry policy, then a failed step and a `failed` turn naming it — never an illegal step
/// transition or a turn left in `sampling`.
async fn an_empty_chat_stream_is_retried_then_fails_the_step_cleanly(b: Backend) {
    let server = keel_testkit::FakeModelServer::start_fixed(
        keel_testkit::Reply::Respond(keel_testkit::FakeResponse::text("")),
        keel_testkit::Pacing::default(),
    )
    .await
    .unwrap();
    let http = keel_model::HttpModel::new(
        keel_model::Wire::OpenaiChat,
        keel_model::ProviderConfig::new("gpt-4o")
            .with_base_url(server.base_url(keel_model::Wire::OpenaiChat))
            .with_api_key("k"),
    )
    .unwrap();
    let policy = keel_model::RetryPolicy {
        max_attempts: 3,
        base_delay_ms: 1,
        max_delay_ms: 2,
        max_retry_after_ms: 1_000,
    };
    let route = keel_model::ModelRoute::new(vec![std::sync::Arc::new(http)], policy).unwrap();
    let f = fixture_with(
        b,
        std::sync::Arc::new(route),
        &[],
        keel_core::Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    let t = &out.turns[0];
    assert_eq!(t.terminal_reason, TerminalReason::Failed, "{t:?}");
    assert!(
        t.error
            .as_deref()
            .unwrap_or_default()
            .contains("empty_response"),
        "{t:?}"
    );
    assert_eq!(server.requests().len(), 3, "retried by the policy");
    let evs = f.events().await;
    let failed = evs.iter().find(|e| e.type_name() == "step.failed").unwrap();
    assert!(
        matches!(&failed.body, keel_core::EventBody::StepFailed { error_kind, .. } if error_kind == "empty_response"),
        "{failed:?}"
    );
    assert_eq!(
        evs.iter()
            .filter(|e| e.type_name() == "step.attempt_failed")
            .count(),
        2
    );
}

/// The scripted model injects `empty_response` like any provider error class; the next line
/// answers the retried attempt.
async fn an_injected_empty_response_is_retried_like_a_provider_failure(b: Backend) {
    let script = scripted(&[
        json!({"error": {"kind": "empty_response"}}),
        json!({"text": "here"}),
    ]);
    let route = keel_model::ModelRoute::new(
        vec![script],
        keel_model::RetryPolicy {
            max_attempts: 2,
            base_delay_ms: 1,
            max_delay_ms: 2,
            max_retry_after_ms: 1_000,
        },
    )
    .unwrap();
    let f = fixture_with(
        b,
        std::sync::Arc::new(route),
        &[],
        keel_core::Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "here");
    assert!(f.types().await.contains(&"step.attempt_failed"));
}
