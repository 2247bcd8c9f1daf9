//! provider_fallback — when the primary model fails (HTTP 529 `overloaded`, then HTTP 500s on
//! every retry) and the fallback answers, the turn completes on the fallback; the journal shows
//! every attempt (each `step.started` / `step.attempt_failed` naming the member that served it,
//! with its error class) and the switch (the first attempt naming the fallback follows the
//! primary's last failure, which schedules no retry); usage and cost are the answering model's,
//! priced at its price, on its `step.completed`, in `turn.finished`'s `usage_by_model` and in
//! the tenant's usage rows — nothing is attributed to the primary or to the route's label.
//!
//! Guarded mechanism: attribution per attempt (the route's `attempt` events name the member,
//! and the runtime prices and counts each step under that member). The primary is dear and
//! the fallback cheap, so a cost or usage row attributed to the primary (or the route label)
//! fails the exact comparisons below.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_core::{EventBody, TenantId, TerminalReason};
use keel_model::{HttpModel, ModelClient, ModelRoute, Price, PriceTable, ProviderConfig, Wire};
use keel_runtime::{Runtime, RuntimeOptions};
use keel_testkit::{FakeModelServer, FakeResponse, Fault, Handler, Pacing, Reply};

use super::harness::{Backend, FreshStore, config, on_both, release};

on_both!(tokio overloaded_then_failing_primary_completes_on_the_fallback);

/// Attempts the route makes on each model before it switches.
const PRIMARY_ATTEMPTS: u32 = 3;
const PRIMARY: &str = "claude-primary";
const FALLBACK: &str = "gpt-fallback";

/// USD per million tokens.
fn price(input: f64, output: f64) -> Price {
    Price {
        input,
        output,
        cache_read: input,
        cache_write: input,
    }
}

/// The primary on the Anthropic wire: its first request answered 529 overloaded, every later
/// one 500. The fallback on the OpenAI Chat wire answers with text and a usage report. Both are
/// real HTTP servers (keel-testkit's fake model server); the route retries each model
/// `PRIMARY_ATTEMPTS` times with 1 ms backoff.
async fn overloaded_then_failing_primary_completes_on_the_fallback(backend: Backend) {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let failing: Handler = Arc::new(move |_| {
        let fault = if counter.fetch_add(1, Ordering::SeqCst) == 0 {
            Fault::Overloaded
        } else {
            Fault::ServerError
        };
        Reply::Fault(fault)
    });
    let primary_server = FakeModelServer::start(failing, Pacing::default())
        .await
        .unwrap();
    let mut answer = FakeResponse::text("answered by the fallback");
    answer.usage.input_tokens = 1_200;
    answer.usage.output_tokens = 300;
    let fallback_server = FakeModelServer::start_fixed(Reply::Respond(answer), Pacing::default())
        .await
        .unwrap();
    let primary = HttpModel::new(
        Wire::Anthropic,
        ProviderConfig::new(PRIMARY)
            .with_base_url(primary_server.anthropic_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    let fallback = HttpModel::new(
        Wire::OpenaiChat,
        ProviderConfig::new(FALLBACK)
            .with_base_url(fallback_server.openai_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    let route = ModelRoute::new(
        vec![Arc::new(primary), Arc::new(fallback)],
        keel_model::RetryPolicy {
            max_attempts: PRIMARY_ATTEMPTS,
            base_delay_ms: 1,
            max_delay_ms: 2,
            max_retry_after_ms: 1_000,
        },
    )
    .unwrap();
    let label = route.model().to_owned();
    // The primary is dear, the fallback cheap.
    let mut prices = PriceTable::default();
    prices.set(PRIMARY, price(100.0, 400.0));
    prices.set(FALLBACK, price(1.0, 2.0));

    let fresh = FreshStore::new(backend);
    let store = fresh.open().await;
    let rt = Runtime::new(
        store.clone(),
        Arc::new(route),
        keel_tools::ToolRegistry::with_builtins().unwrap(),
        RuntimeOptions {
            prices,
            ..RuntimeOptions::default()
        },
    );
    let ws = tempfile::tempdir().unwrap();
    let tenant = TenantId::new();
    let session = rt
        .create_session(tenant, &release("fallback", &[]), config(ws.path()))
        .await
        .unwrap();
    rt.submit(tenant, session, "answer").await.unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), rt.run(tenant, session))
        .await
        .expect("the turn ends within 30 s")
        .unwrap();
    let turn = &out.turns[0];
    assert_eq!(turn.terminal_reason, TerminalReason::Completed, "{turn:?}");
    assert_eq!(turn.final_text, "answered by the fallback");

    // What each server was asked: every primary attempt reached it, the fallback once.
    assert_eq!(primary_server.requests().len(), PRIMARY_ATTEMPTS as usize);
    assert_eq!(fallback_server.requests().len(), 1);

    // Each attempt and the switch, in order.
    let events = store.read(tenant, session, 1, None).await.unwrap();
    let attempts: Vec<(String, String, String, bool)> = events
        .iter()
        .filter_map(|e| {
            let attempt = e
                .correlation
                .attempt
                .map(|a| a.to_string())
                .unwrap_or_default();
            match &e.body {
                EventBody::StepStarted { model } => {
                    Some(("started".into(), model.clone(), attempt, false))
                }
                EventBody::StepAttemptFailed {
                    model,
                    error_kind,
                    retry_in_ms,
                    ..
                } => Some((
                    format!("failed {error_kind}"),
                    model.clone(),
                    attempt,
                    retry_in_ms.is_some(),
                )),
                EventBody::StepCompleted { model, .. } => {
                    Some(("completed".into(), model.clone(), attempt, false))
                }
                _ => None,
            }
        })
        .collect();
    let row = |what: &str, model: &str, attempt: u32, retry: bool| {
        (
            what.to_owned(),
            model.to_owned(),
            attempt.to_string(),
            retry,
        )
    };
    let expected = vec![
        row("started", PRIMARY, 1, false),
        row("failed overloaded", PRIMARY, 1, true),
        row("started", PRIMARY, 2, false),
        row("failed server_error", PRIMARY, 2, true),
        row("started", PRIMARY, 3, false),
        // Retries spent: no retry is scheduled, the route switches.
        row("failed server_error", PRIMARY, 3, false),
        row("started", FALLBACK, 4, false),
        row("completed", FALLBACK, 4, false),
    ];
    assert_eq!(attempts, expected, "route {label}");

    // Usage and cost: the fallback's, at the fallback's price.
    let cost = (1_200.0 * 1.0 + 300.0 * 2.0) / 1e6;
    let completed = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::StepCompleted {
                usage, cost_usd, ..
            } => Some((usage.input_tokens, usage.output_tokens, *cost_usd)),
            _ => None,
        })
        .unwrap();
    assert_eq!((completed.0, completed.1), (1_200, 300));
    assert!((completed.2 - cost).abs() < 1e-12, "{completed:?}");
    assert!((turn.cost_usd - cost).abs() < 1e-12, "{turn:?}");
    let by_model = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TurnFinished { usage_by_model, .. } => Some(usage_by_model.clone()),
            _ => None,
        })
        .expect("turn.finished");
    let models: Vec<&str> = by_model.keys().map(String::as_str).collect();
    assert_eq!(models, [FALLBACK], "{by_model:?}");
    assert_eq!(by_model[FALLBACK].usage.input_tokens, 1_200);
    assert_eq!(by_model[FALLBACK].usage.output_tokens, 300);
    assert_eq!(by_model[FALLBACK].steps, 1);
    assert!((by_model[FALLBACK].cost_usd - cost).abs() < 1e-12);
    let day = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let rows: Vec<(String, u64, u64)> = store
        .usage(tenant, &day, &day)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.model, r.usage.total_tokens(), r.steps))
        .collect();
    assert_eq!(rows, [(FALLBACK.to_owned(), 1_500, 1)]);
}
