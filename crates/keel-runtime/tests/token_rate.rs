//! Token-aware admission (`RuntimeOptions::token_rate`, issue 13) against the store's token
//! windows: a step that does not fit in the tenant's window of the current minute waits for the
//! next window — it never fails — and each reservation is settled to the usage the model
//! reported. The wait ends early for a drain (the step is left to the next worker) and for a
//! cancelled turn. Windows are whole wall-clock minutes, so the waiting test takes up to a
//! minute; its assertions are on the journal's order and the store's window rows, not on time.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use keel_core::{Budget, Event, EventBody, SessionStatus, TerminalReason};
use keel_model::{ModelClient, ModelRoute, RetryPolicy};
use keel_runtime::{
    DeltaKind, Runtime, RuntimeOptions, SubscriptionItem, TokenRate, config::TOKEN_WINDOW_MS,
};
use keel_store::Store;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_step_over_the_tenant_rate_waits_for_the_next_window,
    a_wait_for_the_token_rate_ends_at_once_for_a_drain_or_a_cancel,
    a_retry_is_admitted_like_a_step_and_a_drained_wait_leaves_it_to_the_next_worker,
);

/// The tenants' limit in the tests, tokens per minute.
const LIMIT: u64 = 1_000;
/// Output projected per request (none names a maximum): alone more than half the limit.
const OUTPUT: u64 = 600;

fn window_of(ms: i64) -> i64 {
    ms - ms.rem_euclid(TOKEN_WINDOW_MS)
}

/// A worker over `db` sampling `model`, whose tenants may use [`LIMIT`] tokens a minute when
/// `limited`.
async fn worker_of(db: &Db, model: Arc<dyn ModelClient>, limited: bool) -> Runtime {
    let mut rate = TokenRate::uniform(LIMIT);
    rate.default_output_tokens = OUTPUT;
    Runtime::new(
        second_store(db).await,
        model,
        registry(),
        RuntimeOptions {
            worker_name: if limited { "limited" } else { "free" }.into(),
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            seal_key: deployment_key(),
            token_rate: limited.then_some(rate),
            ..RuntimeOptions::default()
        },
    )
}

/// A worker over `db` answering from `lines`, whose tenants may use [`LIMIT`] tokens a minute.
async fn limited_worker(db: &Db, lines: &[Value]) -> Runtime {
    worker_of(db, scripted(lines), true).await
}

/// Waits, when less than `margin` is left of the current minute, until the next one starts:
/// what must happen within one window then has that long.
async fn with_time_left_in_the_minute(margin: Duration) {
    let now = Utc::now().timestamp_millis();
    let left = window_of(now) + TOKEN_WINDOW_MS - now;
    if left < i64::try_from(margin.as_millis()).unwrap() {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 50)).await;
    }
}

/// Tokens reserved or used in `tenant`'s window starting at `window` (a reservation of 0).
async fn window_used(store: &dyn Store, tenant: keel_core::TenantId, window: i64) -> u64 {
    store
        .reserve_tokens(tenant, window, 0, i64::MAX.unsigned_abs())
        .await
        .unwrap()
        .used
}

fn step_starts(events: &[Event]) -> Vec<i64> {
    events
        .iter()
        .filter(|e| matches!(e.body, EventBody::StepStarted { .. }))
        .map(|e| e.ts.timestamp_millis())
        .collect()
}

/// Step 1 projects its context plus 600 tokens of output and reports 300 + 100 used; step 2
/// projects more than the 600 left in the minute's window of 1,000 and waits for the next
/// window: its `step.started` comes after the window rolled, the wait was announced, and each
/// window holds exactly the usage its step reported.
async fn a_step_over_the_tenant_rate_waits_for_the_next_window(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))], "usage": {"input_tokens": 300, "output_tokens": 100}}),
        json!({"text": "done", "usage": {"input_tokens": 350, "output_tokens": 50}}),
    ];
    let f = fixture_with(
        b,
        scripted(&lines),
        &["read_file"],
        Budget::default(),
        |_| {},
    )
    .await;
    let rt = limited_worker(&f.db, &lines).await;
    with_time_left_in_the_minute(Duration::from_secs(15)).await;
    rt.submit(f.tenant, f.session, "read the readme")
        .await
        .unwrap();
    let mut sub = rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let out = rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);

    let events = f.events().await;
    let starts = step_starts(&events);
    assert_eq!(starts.len(), 2, "two steps, one attempt each");
    let first = window_of(starts[0]);
    assert_eq!(
        window_of(starts[1]),
        first + TOKEN_WINDOW_MS,
        "step 2 started only once the next window began"
    );
    let store = f.db.store.as_ref();
    assert_eq!(
        window_used(store, f.tenant, first).await,
        400,
        "step 1 settled to the usage it reported"
    );
    assert_eq!(
        window_used(store, f.tenant, first + TOKEN_WINDOW_MS).await,
        400,
        "step 2 settled to the usage it reported"
    );

    // The wait was announced live: the projected tokens, the limit, what the window held.
    let mut waits = Vec::new();
    while let Some(item) = sub.next_timeout(Duration::from_millis(200)).await.unwrap() {
        if let SubscriptionItem::Delta { delta } = item
            && let DeltaKind::TokenRateWait {
                tokens,
                limit,
                used,
                until_ms,
            } = delta.kind
        {
            waits.push((tokens, limit, used, until_ms));
        }
    }
    let [(tokens, limit, used, until_ms)] = waits.as_slice() else {
        panic!("one wait expected: {waits:?}")
    };
    assert!(*tokens > OUTPUT && *tokens + 400 > LIMIT, "{tokens}");
    assert_eq!((*limit, *used), (LIMIT, 400));
    assert_eq!(*until_ms, first + TOKEN_WINDOW_MS);
}

/// The tenant's window of this minute is full. A run that waits for it stops at once when it is
/// drained — returning drained with the turn active, no step started and nothing reserved —
/// and a turn cancelled while it waits ends `aborted` at once.
async fn a_wait_for_the_token_rate_ends_at_once_for_a_drain_or_a_cancel(b: Backend) {
    let lines = [json!({"text": "never sent"})];
    let f = fixture(b, &lines, |_| {}).await;
    let rt = limited_worker(&f.db, &lines).await;
    with_time_left_in_the_minute(Duration::from_secs(20)).await;
    let window = window_of(Utc::now().timestamp_millis());
    let full =
        f.db.store
            .reserve_tokens(f.tenant, window, LIMIT, LIMIT)
            .await
            .unwrap();
    assert!(full.admitted);
    rt.submit(f.tenant, f.session, "hello").await.unwrap();

    // Drained while waiting.
    let mut sub = rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let (run, drain) = spawn_claimed(&rt, f.tenant, f.session).await;
    wait_for_rate_wait(&mut sub).await;
    drain.cancel();
    let out = run.await.unwrap();
    assert!(out.drained, "{out:?}");
    assert_eq!(
        window_of(Utc::now().timestamp_millis()),
        window,
        "the drained run did not wait for the window"
    );
    let events = f.events().await;
    assert!(events.iter().any(|e| e.type_name() == "turn.started"));
    assert!(step_starts(&events).is_empty(), "no step started");
    assert!(
        f.rt.view(f.tenant, f.session)
            .await
            .unwrap()
            .state
            .active_turn
            .is_some()
    );
    assert_eq!(
        window_used(f.db.store.as_ref(), f.tenant, window).await,
        LIMIT,
        "nothing more reserved"
    );

    // Cancelled while waiting.
    let mut sub = rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let run = {
        let (rt, tenant, session) = (rt.clone(), f.tenant, f.session);
        tokio::spawn(async move { rt.run(tenant, session).await })
    };
    wait_for_rate_wait(&mut sub).await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let out = run.await.unwrap().unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_eq!(
        window_of(Utc::now().timestamp_millis()),
        window,
        "the cancelled turn did not wait for the window"
    );
    assert!(step_starts(&f.events().await).is_empty(), "no step started");
}

/// A step's attempt fails (an injected `overloaded` error, 2.5 s in) and its route retries it;
/// meanwhile another worker of the tenant filled the minute's window. The retry is a model call
/// of its own: it waits for the rate, and a drain during that wait returns with the failed
/// attempt journaled and nothing of the next one. A worker without a limit then re-samples the
/// step as its next attempt (the script's next line) and the turn completes.
async fn a_retry_is_admitted_like_a_step_and_a_drained_wait_leaves_it_to_the_next_worker(
    b: Backend,
) {
    let lines = [
        json!({"error": {"kind": "overloaded", "retry_after_ms": 1}, "delay_ms": 2500}),
        json!({"text": "done"}),
    ];
    let route = |lines: &[Value]| -> Arc<dyn ModelClient> {
        let policy = RetryPolicy {
            max_attempts: 2,
            base_delay_ms: 1,
            max_delay_ms: 2,
            max_retry_after_ms: 1_000,
        };
        Arc::new(ModelRoute::new(vec![scripted(lines)], policy).unwrap())
    };
    let f = fixture(b, &lines, |_| {}).await;
    let rt = worker_of(&f.db, route(&lines), true).await;
    with_time_left_in_the_minute(Duration::from_secs(20)).await;
    let window = window_of(Utc::now().timestamp_millis());
    rt.submit(f.tenant, f.session, "hello").await.unwrap();
    let mut sub = rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let (run, drain) = spawn_claimed(&rt, f.tenant, f.session).await;
    // The first attempt has its reservation; another worker of the tenant takes the rest.
    wait_for_event(&f.db.store, f.tenant, f.session, "step.started").await;
    let other =
        f.db.store
            .reserve_tokens(f.tenant, window, LIMIT, i64::MAX.unsigned_abs())
            .await
            .unwrap();
    assert!(other.admitted && other.used > LIMIT, "{other:?}");
    wait_for_rate_wait(&mut sub).await;
    drain.cancel();
    let out = run.await.unwrap();
    assert!(out.drained, "{out:?}");
    let events = f.events().await;
    let types: Vec<&str> = events.iter().map(Event::type_name).collect();
    assert_eq!(
        types
            .iter()
            .filter(|t| t.starts_with("step."))
            .copied()
            .collect::<Vec<_>>(),
        ["step.started", "step.attempt_failed"],
        "the failed attempt, nothing of the next: {types:?}"
    );
    assert_eq!(
        window_used(f.db.store.as_ref(), f.tenant, window).await,
        LIMIT,
        "the failed attempt produced nothing: its reservation was released"
    );

    let free = worker_of(&f.db, route(&lines), false).await;
    let out = free.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "done");
    let attempts: Vec<u32> = f
        .events()
        .await
        .iter()
        .filter(|e| matches!(e.body, EventBody::StepStarted { .. }))
        .filter_map(|e| e.correlation.attempt)
        .collect();
    assert_eq!(attempts, [1, 2], "the same step's next attempt");
}

/// Waits (≤ 20 s) for a `token_rate_wait` delta.
async fn wait_for_rate_wait(sub: &mut keel_runtime::Subscription) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "no token_rate_wait delta within 20 s");
        if let Some(SubscriptionItem::Delta { delta }) = sub.next_timeout(left).await.unwrap()
            && matches!(delta.kind, DeltaKind::TokenRateWait { .. })
        {
            return;
        }
    }
}
