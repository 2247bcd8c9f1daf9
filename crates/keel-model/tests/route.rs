//! Retries honour retry-after; a route falls back on overload, server errors and exhausted
//! retries, never on invalid_request; usage and cost stay with the model that produced them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_model::{
    ErrorKind, ModelClient, ModelRoute, Outcome, PriceTable, RetryPolicy, StopReason, StreamEvent,
    Usage, Wire, collect,
};
use keel_testkit::{FakeModelServer, FakeResponse, Fault, Handler, Pacing, Reply};

use crate::{events, hello, model_for};

fn fast_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay_ms: 5,
        max_delay_ms: 20,
        max_retry_after_ms: 10_000,
    }
}

/// A server whose first `failures` requests get `fault`, then text responses reporting `model`.
async fn flaky(fault: Fault, failures: usize, model: &str) -> FakeModelServer {
    let seen = AtomicUsize::new(0);
    let model = model.to_string();
    let handler: Handler = Arc::new(move |_| {
        if seen.fetch_add(1, Ordering::SeqCst) < failures {
            Reply::Fault(fault.clone())
        } else {
            let mut r = FakeResponse::text("ok");
            r.model = model.clone();
            r.usage = Usage {
                input_tokens: 1_000_000,
                output_tokens: 1_000_000,
                ..Usage::default()
            };
            Reply::Respond(r)
        }
    });
    FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap()
}

fn route(models: Vec<Arc<dyn ModelClient>>, policy: RetryPolicy) -> ModelRoute {
    ModelRoute::new(models, policy).unwrap()
}

#[tokio::test]
async fn retry_waits_the_retry_after_the_provider_asked_for() {
    let server = flaky(
        Fault::RateLimited {
            retry_after_ms: 300,
        },
        1,
        "gpt-4o",
    )
    .await;
    let r = route(
        vec![Arc::new(model_for(&server, Wire::OpenaiChat, "gpt-4o"))],
        fast_policy(3),
    );
    let got = events(&r, hello()).await;
    let retry = got.iter().find_map(|e| match e {
        StreamEvent::Retry { error, delay_ms } => {
            Some((error.kind, error.retry_after_ms, *delay_ms))
        }
        _ => None,
    });
    assert_eq!(retry, Some((ErrorKind::RateLimited, Some(300), 300)));
    assert!(matches!(
        got.last(),
        Some(StreamEvent::Completed {
            stop_reason: StopReason::EndTurn,
            ..
        })
    ));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].received_at - requests[0].received_at;
    assert!(
        waited.as_millis() >= 300,
        "second attempt came after only {waited:?}"
    );
}

#[tokio::test]
async fn every_attempt_is_reported_and_attempts_are_bounded() {
    let server = flaky(Fault::ServerError, usize::MAX, "m").await;
    let r = route(
        vec![Arc::new(model_for(
            &server,
            Wire::Anthropic,
            "claude-sonnet-4-5",
        ))],
        fast_policy(3),
    );
    let got = events(&r, hello()).await;
    let kinds: Vec<&str> = got
        .iter()
        .map(|e| match e {
            StreamEvent::Attempt { .. } => "attempt",
            StreamEvent::Retry { .. } => "retry",
            StreamEvent::Error { .. } => "error",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["attempt", "retry", "attempt", "retry", "attempt", "error"]
    );
    assert_eq!(server.requests().len(), 3);
    let StreamEvent::Retry { delay_ms, .. } = &got[3] else {
        panic!()
    };
    assert!(
        (5..=20).contains(delay_ms),
        "backoff {delay_ms} outside policy"
    );
}

async fn fallback_case(fault: Fault) -> (Vec<StreamEvent>, FakeModelServer, FakeModelServer) {
    let primary = flaky(fault.clone(), usize::MAX, "unused").await;
    let secondary = flaky(fault, 0, "claude-haiku-4-5-20251001").await;
    let r = route(
        vec![
            Arc::new(model_for(&primary, Wire::OpenaiResponses, "gpt-5.1")),
            Arc::new(model_for(&secondary, Wire::Anthropic, "claude-haiku-4-5")),
        ],
        fast_policy(2),
    );
    (events(&r, hello()).await, primary, secondary)
}

#[tokio::test]
async fn route_falls_back_across_providers_on_overload() {
    let (got, primary, secondary) = fallback_case(Fault::Overloaded).await;
    assert_eq!(
        primary.requests().len(),
        2,
        "primary retried up to max_attempts"
    );
    assert_eq!(secondary.requests().len(), 1);
    let fallback = got.iter().find_map(|e| match e {
        StreamEvent::Fallback { from, to, error } => Some((from.as_str(), to.as_str(), error.kind)),
        _ => None,
    });
    assert_eq!(
        fallback,
        Some(("gpt-5.1", "claude-haiku-4-5", ErrorKind::Overloaded))
    );
    assert_eq!(
        got.last(),
        Some(&StreamEvent::Completed {
            stop_reason: StopReason::EndTurn,
            model: Some("claude-haiku-4-5-20251001".into())
        })
    );
}

#[tokio::test]
async fn route_falls_back_on_server_error() {
    let (got, primary, secondary) = fallback_case(Fault::ServerError).await;
    assert_eq!(
        (primary.requests().len(), secondary.requests().len()),
        (2, 1)
    );
    assert!(got.iter().any(
        |e| matches!(e, StreamEvent::Fallback { error, .. } if error.kind == ErrorKind::ServerError)
    ));
    assert!(matches!(got.last(), Some(StreamEvent::Completed { .. })));
}

#[tokio::test]
async fn route_falls_back_at_once_on_non_retryable_provider_failure() {
    let (got, primary, secondary) = fallback_case(Fault::Http(ErrorKind::Authentication)).await;
    assert_eq!(
        (primary.requests().len(), secondary.requests().len()),
        (1, 1)
    );
    assert!(matches!(got.last(), Some(StreamEvent::Completed { .. })));
}

#[tokio::test]
async fn route_never_falls_back_on_invalid_request() {
    for kind in [ErrorKind::InvalidRequest, ErrorKind::ContextOverflow] {
        let (got, primary, secondary) = fallback_case(Fault::Http(kind)).await;
        assert_eq!(
            (primary.requests().len(), secondary.requests().len()),
            (1, 0),
            "{kind}"
        );
        assert!(
            !got.iter()
                .any(|e| matches!(e, StreamEvent::Fallback { .. })),
            "{kind}"
        );
        assert!(
            matches!(got.last(), Some(StreamEvent::Error { error }) if error.kind == kind),
            "{kind}"
        );
    }
}

#[tokio::test]
async fn usage_and_cost_stay_with_the_model_that_produced_them() {
    // Primary streams text and usage, then the connection drops; the fallback answers.
    let seen = AtomicUsize::new(0);
    let handler: Handler = Arc::new(move |_| {
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::Fault(Fault::StreamError {
                kind: ErrorKind::Overloaded,
                after_frames: 4,
            })
        } else {
            Reply::Fault(Fault::Overloaded)
        }
    });
    let primary = FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap();
    let secondary = flaky(Fault::ServerError, 0, "gpt-4o-mini-2024-07-18").await;
    let r = route(
        vec![
            Arc::new(model_for(&primary, Wire::Anthropic, "claude-sonnet-4-5")),
            Arc::new(model_for(&secondary, Wire::OpenaiChat, "gpt-4o-mini")),
        ],
        fast_policy(2),
    );
    let response = collect(r.stream(hello()), r.model(), &PriceTable::default()).await;
    assert_eq!(
        response.outcome,
        Outcome::Completed {
            stop_reason: StopReason::EndTurn
        }
    );
    assert_eq!(
        response.text, "ok",
        "text of the failed attempt was discarded"
    );
    assert_eq!(response.model, "gpt-4o-mini");
    assert_eq!(response.attempts, 3);
    assert_eq!(
        response.fallbacks,
        vec![("claude-sonnet-4-5".to_string(), "gpt-4o-mini".to_string())]
    );
    // The failed Anthropic attempt was counted for its prompt (`message_start`: 10 in, 1 out)
    // before it broke: that usage stays with it, at its price.
    assert_eq!(response.usage.len(), 2, "{:?}", response.usage);
    assert_eq!(response.usage[0].model, "claude-sonnet-4-5");
    assert_eq!(
        (
            response.usage[0].usage.input_tokens,
            response.usage[0].usage.output_tokens
        ),
        (10, 1)
    );
    // 10 input at $3/M + 1 output at $15/M
    assert!((response.usage[0].cost_usd.unwrap() - 45e-6).abs() < 1e-12);
    assert_eq!(response.usage[1].model, "gpt-4o-mini");
    // 1M input at $0.15 + 1M output at $0.60
    assert!((response.usage[1].cost_usd.unwrap() - 0.75).abs() < 1e-9);
}

/// Each attempt names the route member that serves it, and the route lists its members (primary
/// first): what the runtime prices and accounts a step under, instead of the route's label
/// (`gpt-4o-mini -> scripted:…`, which names no model and, being a prefix match of `gpt-4o`,
/// was priced at the primary family's price).
#[tokio::test]
async fn a_route_lists_its_members_and_each_attempt_names_the_one_serving_it() {
    let (got, _primary, _secondary) = fallback_case(Fault::ServerError).await;
    let attempts: Vec<&str> = got
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Attempt { model, .. } => Some(model.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, ["gpt-5.1", "gpt-5.1", "claude-haiku-4-5"]);
    let primary = flaky(Fault::ServerError, 0, "m").await;
    let r = route(
        vec![
            Arc::new(model_for(&primary, Wire::OpenaiChat, "gpt-4o-mini")),
            Arc::new(model_for(&primary, Wire::Anthropic, "claude-haiku-4-5")),
        ],
        fast_policy(1),
    );
    assert_eq!(r.members(), ["gpt-4o-mini", "claude-haiku-4-5"]);
    assert_eq!(r.model(), "gpt-4o-mini -> claude-haiku-4-5");
    let one = model_for(&primary, Wire::OpenaiChat, "gpt-4o");
    assert_eq!(one.members(), ["gpt-4o"]);
}
