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
    a_model_that_never_starts_answering_fails_the_step_at_the_first_token_timeout,
    a_worker_whose_lease_is_taken_over_stops_writing,
);

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
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    // Correctness deadline: without the timeout the first token comes after 60 s.
    let out = tokio::time::timeout(Duration::from_secs(20), f.rt.run(f.tenant, f.session))
        .await
        .expect("the first-token timeout ends the step")
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
