//! Model timeouts and lease loss.
//!
//! A model timeout (`model_first_token_timeout_ms`, `model_total_timeout_ms`) bounds the whole
//! model call of a step, including the route's own retries: when it passes the stream is closed
//! and the step fails with `error_kind: timeout`, which fails the turn. Provider errors of class
//! `timeout` raised inside the route (its HTTP client) are retried per the route first.

use std::time::Duration;

use keel_core::{Budget, EventBody, TerminalReason};
use keel_runtime::RuntimeError;
use keel_testkit::Pacing;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_model_that_streams_too_long_fails_the_step_at_the_total_timeout,
    a_model_that_never_starts_answering_fails_the_step_at_the_first_token_timeout,
    a_worker_whose_lease_is_taken_over_stops_writing,
);

/// Runs the fixture's session (correctness deadline 20 s, ten times the slowest timeout used
/// here) and checks the turn failed on a step that failed with `error_kind: timeout`.
async fn run_until_the_step_times_out(f: &Fixture) {
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), f.rt.run(f.tenant, f.session))
        .await
        .expect("the model timeout ends the step")
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Failed);
    let evs = f.events().await;
    let failed = evs.iter().find(|e| e.type_name() == "step.failed").unwrap();
    assert!(
        matches!(&failed.body, EventBody::StepFailed { error_kind, .. } if error_kind == "timeout"),
        "{:?}",
        failed.body
    );
}

async fn a_model_that_never_starts_answering_fails_the_step_at_the_first_token_timeout(b: Backend) {
    let (_server, model) = paced_model(
        "too late".into(),
        Pacing {
            time_to_first_token_ms: 60_000,
            tokens_per_second: None,
        },
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), |c| {
        c.model_first_token_timeout_ms = Some(200);
    })
    .await;
    // Without the timeout the first token comes after 60 s.
    run_until_the_step_times_out(&f).await;
}

async fn a_worker_whose_lease_is_taken_over_stops_writing(b: Backend) {
    let f = fixture(
        b,
        &[json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]})],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "wait").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let store = &f.db.store;
    let rec = store.get_session(f.tenant, f.session).await.unwrap();
    store
        .take_over_lease(
            f.tenant,
            f.session,
            f.rt.owner(),
            rec.lease_epoch,
            "thief",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let taken_at = store
        .get_session(f.tenant, f.session)
        .await
        .unwrap()
        .version;
    // Correctness deadline: the heartbeat notices within a third of the 5 s TTL.
    let r = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the run stops")
        .unwrap();
    assert!(matches!(r, Err(RuntimeError::LeaseLost { .. })), "{r:?}");
    assert_eq!(
        store
            .get_session(f.tenant, f.session)
            .await
            .unwrap()
            .version,
        taken_at,
        "nothing written after the take-over"
    );
    // The journal is intact and still folds.
    f.rt.view(f.tenant, f.session).await.unwrap();
}

/// The total timeout bounds a stream that started answering in time but goes on too long: the
/// connection is closed and the step fails with `error_kind: timeout` after streaming began.
async fn a_model_that_streams_too_long_fails_the_step_at_the_total_timeout(b: Backend) {
    // 600 words at 10 frames per second: a minute to finish; the first text frame comes within
    // about 0.3 s (a tenth of the total timeout).
    let (server, model) = paced_model(
        "word ".repeat(600),
        Pacing {
            time_to_first_token_ms: 0,
            tokens_per_second: Some(10.0),
        },
    )
    .await;
    let f = fixture_with(b, model, &[], Budget::default(), |c| {
        c.model_first_token_timeout_ms = Some(30_000);
        c.model_total_timeout_ms = Some(3_000);
    })
    .await;
    // Without the total timeout the stream ends after about 60 s.
    run_until_the_step_times_out(&f).await;
    let types = f.types().await;
    let streaming = types.iter().position(|t| *t == "step.streaming");
    let failed = types.iter().position(|t| *t == "step.failed");
    assert!(
        streaming.is_some() && streaming < failed,
        "the step had started streaming: {types:?}"
    );
    // The fake server saw its stream abandoned (the connection was closed).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.abandoned_responses() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.abandoned_responses(), 1);
}
