//! Timeouts (the turn's wall clock, the model's limits, the tool timeout) and lease loss.
//!
//! A model timeout (`model_first_token_timeout_ms`, `model_total_timeout_ms`) bounds the whole
//! model call of a step, including the route's own retries: when it passes the stream is closed
//! and the step fails with `error_kind: timeout`, which fails the turn. Provider errors of class
//! `timeout` raised inside the route (its HTTP client, a stream silent for
//! `stream_idle_timeout_ms`) are retried per the route first.
//!
//! The turn's wall clock (`turn_budget.max_wall_time_ms`: `keel run --timeout`) cancels
//! whatever runs below the turn at once — the model stream, a scripted delay, a shell command's
//! process group — and the turn ends `budget_exhausted (wall_time)`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::{Budget, BudgetLimit, EventBody, TerminalReason, ToolCallStatus};
use keel_model::{ModelClient, ModelRoute, RetryPolicy};
use keel_runtime::RuntimeError;
use keel_testkit::Pacing;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_model_that_streams_too_long_fails_the_step_at_the_total_timeout,
    a_model_that_never_starts_answering_fails_the_step_at_the_first_token_timeout,
    a_worker_whose_lease_is_taken_over_stops_writing,
    the_turn_wall_clock_kills_a_running_shell_command_at_once,
    the_turn_wall_clock_stops_a_delayed_model_response_before_it_completes,
    a_stream_that_stalls_mid_answer_fails_the_step_after_the_route_s_retries,
    a_shell_timeout_ms_over_the_tool_timeout_is_clamped_to_it,
);

/// Runs the fixture's first turn within `secs` (a correctness deadline) and returns its outcome
/// and how long the run took.
async fn run_within(f: &Fixture, secs: u64) -> (keel_runtime::RunOutcome, Duration) {
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let t0 = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(secs), f.rt.run(f.tenant, f.session))
        .await
        .unwrap_or_else(|_| panic!("the run did not end within {secs} s"))
        .unwrap();
    (out, t0.elapsed())
}

/// Whether process `pid` is gone (or a zombie: it runs no code).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s == "Z" || s == "X"))
            .unwrap_or(false),
    }
}

/// The status and result text of `call`'s one `tool_call.finished`.
fn finished(evs: &[keel_core::Event], call: &str) -> (ToolCallStatus, String) {
    let mut found = evs.iter().filter_map(|e| match &e.body {
        EventBody::ToolCallFinished { status, output, .. }
            if e.correlation.tool_call_id.as_ref().map(|c| c.as_str()) == Some(call) =>
        {
            Some((*status, output.clone()))
        }
        _ => None,
    });
    let first = found
        .next()
        .unwrap_or_else(|| panic!("{call} has no result"));
    assert!(found.next().is_none(), "{call} has two results");
    first
}

/// A real `shell` command (`sleep 30`, in its own process group) and a 1.5 s turn wall clock:
/// the turn ends `budget_exhausted (wall_time)` within a 10x margin, the call has its one
/// (cancelled) result, the dispatched effect is `outcome_unknown`, and the sleeping process is
/// gone. (The issue: `keel run --timeout 5s` with `shell sleep 30` took 30 s. Fixed with the
/// wall-time budget timer in 57d2489; this test passed on the code it was written against.)
async fn the_turn_wall_clock_kills_a_running_shell_command_at_once(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("shell", json!({"command": "sleep 30 & echo $! > sleep.pid; wait"}))]}),
            json!({"text": "never"}),
        ],
        |c| c.turn_budget.max_wall_time_ms = Some(1_500),
    )
    .await;
    let (out, took) = run_within(&f, 60).await;
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::WallTime)),
        "{t:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "a 1.5 s wall clock took {took:?}"
    );
    let evs = f.events().await;
    let (status, _) = finished(&evs, "call_1_0");
    assert_eq!(status, ToolCallStatus::Cancelled);
    let types: Vec<_> = evs.iter().map(|e| e.type_name()).collect();
    assert!(types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert!(!types.contains(&"effect.failed"), "{types:?}");
    let pid: i32 = std::fs::read_to_string(f.ws.path().join("sleep.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SIGKILL takes milliseconds; 10 s is the correctness deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_dead(pid) {
        assert!(Instant::now() < deadline, "sleep {pid} outlived the turn");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A scripted response delayed 30 s and a 1 s turn wall clock: the turn ends by the clock and
/// the response never completes (no `step.completed`, no final text). (The issue: the turn
/// *completed* after 30 s. Fixed in 57d2489 like the test above; this one passed when written.)
async fn the_turn_wall_clock_stops_a_delayed_model_response_before_it_completes(b: Backend) {
    let f = fixture(b, &[json!({"delay_ms": 30_000, "text": "too late"})], |c| {
        c.turn_budget.max_wall_time_ms = Some(1_000)
    })
    .await;
    let (out, took) = run_within(&f, 60).await;
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::WallTime)),
        "{t:?}"
    );
    assert_eq!(t.final_text, "");
    assert!(
        took < Duration::from_secs(10),
        "a 1 s wall clock took {took:?}"
    );
    let types = f.types().await;
    assert!(!types.contains(&"step.completed"), "{types:?}");
}

/// A provider that sends the start of an answer and then stalls with the connection open, over
/// real HTTP, with `stream_idle_timeout_ms = 300` and a route that tries twice: each attempt
/// fails with `timeout` at the idle limit, the route retries once, and the step fails with
/// `error_kind: timeout`. Before the idle limit the step was still sampling after minutes (the
/// HTTP total limit fired after 10 min, then the retry hung again): this test hit its 30 s
/// deadline.
async fn a_stream_that_stalls_mid_answer_fails_the_step_after_the_route_s_retries(b: Backend) {
    let server = keel_testkit::FakeModelServer::start_fixed(
        keel_testkit::Reply::Fault(keel_testkit::Fault::Stall { after_frames: 4 }),
        Pacing::default(),
    )
    .await
    .unwrap();
    let http = keel_model::HttpModel::new(
        keel_model::Wire::Anthropic,
        keel_model::ProviderConfig::new("claude-test")
            .with_base_url(server.anthropic_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    let policy = RetryPolicy {
        max_attempts: 2,
        base_delay_ms: 10,
        max_delay_ms: 10,
        max_retry_after_ms: 1_000,
    };
    let model: Arc<dyn ModelClient> =
        Arc::new(ModelRoute::new(vec![Arc::new(http)], policy).unwrap());
    let f = fixture_with(b, model, &[], Budget::default(), |c| {
        c.stream_idle_timeout_ms = 300;
    })
    .await;
    let (out, _) = run_within(&f, 30).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Failed);
    let evs = f.events().await;
    let kinds: Vec<(&str, String)> = evs
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::StepAttemptFailed { error_kind, .. } => {
                Some(("attempt_failed", error_kind.clone()))
            }
            EventBody::StepFailed { error_kind, .. } => Some(("failed", error_kind.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("attempt_failed", "timeout".to_owned()),
            ("failed", "timeout".to_owned())
        ]
    );
    assert_eq!(server.requests().len(), 2, "one retry");
}

/// Tool timeout 1 s; the model asks `shell sleep 30` with `timeout_ms` 600,000 and then with
/// 10,000,000: each call ends by the tool timeout with a timed-out result and the turn goes on.
/// Before, the second call was refused unrun ("exceeds the maximum of 600000 ms") instead of
/// clamped, and a session's tool timeout could not be set above the shell's fixed 10 min.
async fn a_shell_timeout_ms_over_the_tool_timeout_is_clamped_to_it(b: Backend) {
    let sleep = |ms: u64| call("shell", json!({"command": "sleep 30", "timeout_ms": ms}));
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [sleep(600_000), sleep(10_000_000)]}),
            json!({"text": "moved on"}),
        ],
        |c| c.tool_timeout_ms = Some(1_000),
    )
    .await;
    let (out, took) = run_within(&f, 60).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "moved on");
    // Two sequential 1 s calls, with a 10x margin.
    assert!(
        took < Duration::from_secs(20),
        "two 1 s calls took {took:?}"
    );
    let evs = f.events().await;
    for id in ["call_1_0", "call_1_1"] {
        let (status, text) = finished(&evs, id);
        assert_eq!(status, ToolCallStatus::Failed, "{id}: {text}");
        assert!(text.contains("timed out after 1000 ms"), "{id}: {text}");
    }
}

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
