//! Turn priorities (`Runtime::submit_opts`, issue 13): a documented range, checked before
//! anything is written; written to the session's row with the turn (also when the input travels
//! as an intent to the worker running the session), where a scheduler's claims read it.

use std::time::Duration;

use chrono::Utc;
use keel_core::{Budget, SCHEMA_VERSION, SessionId, TurnId};
use keel_runtime::{MAX_PRIORITY, MIN_PRIORITY, RuntimeError, SubmitOptions};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_priority_out_of_range_is_refused_and_nothing_is_written,
    claims_follow_priorities_also_submitted_through_an_intent,
);

/// Submits a turn to `session` at `priority` through `rt`.
async fn submit_to(
    rt: &keel_runtime::Runtime,
    f: &Fixture,
    session: SessionId,
    priority: i32,
) -> Result<TurnId, RuntimeError> {
    rt.submit_opts(
        f.tenant,
        session,
        "go",
        SubmitOptions {
            priority,
            ..SubmitOptions::default()
        },
    )
    .await
}

/// Submits a turn to the fixture's session at `priority`.
async fn submit_at(f: &Fixture, priority: i32) -> Result<TurnId, RuntimeError> {
    submit_to(&f.rt, f, f.session, priority).await
}

async fn a_priority_out_of_range_is_refused_and_nothing_is_written(b: Backend) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let before = f.events().await.len();
    for priority in [MIN_PRIORITY - 1, MAX_PRIORITY + 1, i32::MIN, i32::MAX] {
        let e = submit_at(&f, priority).await.unwrap_err();
        assert!(
            matches!(&e, RuntimeError::InvalidInput(m) if m.contains("between -100 and 100")),
            "{e}"
        );
    }
    assert_eq!(f.events().await.len(), before, "nothing written");
    for priority in [MIN_PRIORITY, 0, MAX_PRIORITY] {
        submit_at(&f, priority).await.unwrap();
    }
    assert_eq!(f.events().await.len(), before + 3, "three turns queued");
}

/// Three sessions of a tenant with a queued turn each: A at the default priority, B at 50
/// (submitted with the session free), C at 90 — submitted from another process while a worker
/// runs C, so it travels as an intent the worker journals. A scheduler claims C, then B, then A.
async fn claims_follow_priorities_also_submitted_through_an_intent(b: Backend) {
    let lines = [
        json!({"text": "slow", "delay_ms": 2500}),
        json!({"text": "unused"}),
    ];
    let f = fixture(b, &lines, |_| {}).await;
    let release = release(&[], Budget::default());
    let session_a = f.session;
    let session_b =
        f.rt.create_session(f.tenant, &release, config(f.ws.path()))
            .await
            .unwrap();
    let session_c =
        f.rt.create_session(f.tenant, &release, config(f.ws.path()))
            .await
            .unwrap();
    submit_to(&f.rt, &f, session_a, 0).await.unwrap();
    submit_to(&f.rt, &f, session_b, 50).await.unwrap();

    // C: a worker runs its first turn; meanwhile another process submits at 90 (an intent),
    // then the worker is drained, leaving the new turn queued.
    submit_to(&f.rt, &f, session_c, 0).await.unwrap();
    let (run, drain) = spawn_claimed(&f.rt, f.tenant, session_c).await;
    wait_for_event(&f.db.store, f.tenant, session_c, "turn.started").await;
    let other = other_process(&f.db).await;
    submit_to(&other, &f, session_c, 90).await.unwrap();
    drain.cancel();
    let out = run.await.unwrap();
    assert!(out.drained, "{out:?}");
    assert_eq!(out.turns.len(), 1, "the first turn finished");
    let events = f.db.store.read(f.tenant, session_c, 1, None).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.type_name() == "turn.queued")
            .count(),
        2
    );

    let mut claimed = Vec::new();
    while let Some(c) =
        f.db.store
            .claim_session(
                f.tenant,
                "scheduler",
                Duration::from_secs(5),
                Utc::now(),
                SCHEMA_VERSION,
                u64::MAX,
            )
            .await
            .unwrap()
    {
        claimed.push(c.lease.session_id);
    }
    assert_eq!(claimed, [session_c, session_b, session_a]);
}
