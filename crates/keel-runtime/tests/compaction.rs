//! Compaction: at a fraction of the context window, after a provider overflow, and giving up
//! with `prompt_too_long`.

use keel_core::{EventBody, TerminalReason};
use keel_model::Message;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    the_providers_prompt_count_decides_when_to_compact,
    a_compaction_that_overflows_drops_the_oldest_items_first,
    a_context_over_the_threshold_is_compacted_behind_a_boundary,
    a_provider_overflow_compacts_and_retries_the_step_once,
    three_failed_compactions_end_the_turn_with_prompt_too_long,
    a_models_known_window_sets_the_threshold_and_the_override_wins,
);

fn long_text() -> String {
    "lorem ipsum dolor sit amet ".repeat(24)
}

async fn a_context_over_the_threshold_is_compacted_behind_a_boundary(b: Backend) {
    let f = fixture_with(
        b,
        scripted(&[json!({"text": long_text()}), json!({"text": "short"})]),
        &["none"],
        Default::default(),
        |c| {
            c.context_window_tokens = Some(200);
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "short");
    let evs = f.events().await;
    let c = evs
        .iter()
        .find(|e| e.type_name() == "context.compacted")
        .expect("compacted");
    let EventBody::ContextCompacted {
        first_kept_item,
        tokens_before,
        tokens_after,
        ..
    } = &c.body
    else {
        panic!()
    };
    assert_eq!(*first_kept_item, 2, "keeps the second user message");
    assert!(tokens_after < tokens_before);
    // The journal keeps the full history; the model sees the summary then the kept items.
    assert!(
        evs.iter().any(
            |e| matches!(&e.body, EventBody::StepCompleted { text, .. } if *text == long_text())
        )
    );
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let Message::User { content } = &*ctx.messages[0] else {
        panic!()
    };
    assert!(
        content.starts_with(keel_runtime::context::SUMMARY_PREFIX),
        "{content}"
    );
    assert_eq!(ctx.messages.len(), 3, "summary, second input, answer");
}

async fn a_provider_overflow_compacts_and_retries_the_step_once(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"text": "one"}),
            json!({"error": {"kind": "context_overflow"}}),
            json!({"text": "two"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        (
            out.turns[0].terminal_reason,
            out.turns[0].final_text.as_str()
        ),
        (TerminalReason::Completed, "two")
    );
    let types = f.types().await;
    let i = types
        .iter()
        .position(|t| *t == "step.attempt_failed")
        .unwrap();
    assert_eq!(
        &types[i + 1..i + 4],
        [
            "turn.phase_changed",
            "context.compacted",
            "turn.phase_changed"
        ]
    );
    let evs = f.events().await;
    let retried = evs
        .iter()
        .rev()
        .find(|e| e.type_name() == "step.started")
        .unwrap();
    assert_eq!(
        retried.correlation.attempt,
        Some(2),
        "same step, next attempt"
    );
}

async fn three_failed_compactions_end_the_turn_with_prompt_too_long(b: Backend) {
    let overflow = json!({"error": {"kind": "context_overflow"}});
    let f = fixture(
        b,
        &[
            json!({"text": "one"}),
            overflow.clone(),
            overflow.clone(),
            overflow,
            json!({"text": "never"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::PromptTooLong,
        "{out:?}"
    );
    let overflows = f
        .types()
        .await
        .iter()
        .filter(|t| **t == "step.attempt_failed")
        .count();
    assert_eq!(overflows, 3);
}

/// A summary request that itself overflows drops the oldest transcript items first and tries
/// again (fake provider: compaction requests with more than 6 messages overflow).
async fn a_compaction_that_overflows_drops_the_oldest_items_first(b: Backend) {
    use std::sync::{Arc, Mutex};

    use keel_model::{ErrorKind, HttpModel, ProviderConfig, Wire};
    use keel_testkit::{FakeModelServer, FakeResponse, Fault, Handler, Pacing, Reply};

    let step = Arc::new(Mutex::new(0usize));
    let summary_sizes = Arc::new(Mutex::new(Vec::new()));
    let (s2, sizes2) = (step.clone(), summary_sizes.clone());
    let handler: Handler = Arc::new(move |req| {
        let is_summary = req.body["system"]
            .as_str()
            .is_some_and(|s| s.contains("summaries"));
        let n = req.body["messages"].as_array().map_or(0, Vec::len);
        if is_summary {
            sizes2.lock().unwrap().push(n);
            return if n > 6 {
                Reply::Fault(Fault::Http(ErrorKind::ContextOverflow))
            } else {
                Reply::Respond(FakeResponse::text("a short summary"))
            };
        }
        let mut k = s2.lock().unwrap();
        *k += 1;
        match *k {
            1..=3 => Reply::Respond(FakeResponse::text(format!("answer {k}"))),
            4 => Reply::Fault(Fault::Http(ErrorKind::ContextOverflow)),
            _ => Reply::Respond(FakeResponse::text("fits now")),
        }
    });
    let server = FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap();
    let model = HttpModel::new(
        Wire::Anthropic,
        ProviderConfig::new("fake")
            .with_base_url(server.anthropic_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    let f = fixture_with(b, Arc::new(model), &["none"], Default::default(), |_| {}).await;
    for input in ["one", "two", "three", "four"] {
        f.rt.submit(f.tenant, f.session, input).await.unwrap();
    }
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let last = out.turns.last().unwrap();
    assert_eq!(
        (last.terminal_reason, last.final_text.as_str()),
        (TerminalReason::Completed, "fits now"),
        "{out:?}"
    );
    let sizes = summary_sizes.lock().unwrap().clone();
    assert!(
        sizes.len() >= 2 && sizes[0] > 6 && *sizes.last().unwrap() <= 6,
        "{sizes:?}"
    );
    // (The Anthropic wire merges adjacent user messages, so counts fall by one or two.)
    assert!(
        sizes.windows(2).all(|w| w[1] <= w[0]),
        "no retry sends more: {sizes:?}"
    );
    let evs = f.events().await;
    assert!(evs.iter().any(|e| e.type_name() == "context.compacted"));
}

/// The last step's `usage.input_tokens` is the context size the provider counted: a short
/// transcript the provider says is 170k tokens (of a 200k window, compacting at 0.8) is compacted
/// before the next step, where a byte estimate alone would never compact it; a small count does
/// not compact.
async fn the_providers_prompt_count_decides_when_to_compact(b: Backend) {
    for (input_tokens, compacts) in [(170_000u64, true), (1_000, false)] {
        let f = fixture(
            b,
            &[
                json!({"text": "one", "tool_calls": [call("sleep", json!({"ms": 0}))], "usage": {"input_tokens": input_tokens, "output_tokens": 5}}),
                json!({"text": "two"}),
            ],
            |_| {},
        )
        .await;
        f.rt.submit(f.tenant, f.session, "go").await.unwrap();
        let out = f.rt.run(f.tenant, f.session).await.unwrap();
        assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
        let compacted: Vec<u64> = f
            .events()
            .await
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::ContextCompacted { tokens_before, .. } => Some(*tokens_before),
                _ => None,
            })
            .collect();
        if compacts {
            assert_eq!(compacted.len(), 1, "{compacted:?}");
            assert!(
                (170_000..171_000).contains(&compacted[0]),
                "the provider's count plus the items added since: {compacted:?}"
            );
        } else {
            assert!(compacted.is_empty(), "{compacted:?}");
        }
    }
}

/// A scripted model that answers under another model's name (its window is the named model's).
struct Named {
    inner: std::sync::Arc<dyn keel_model::ModelClient>,
    name: &'static str,
}

impl keel_model::ModelClient for Named {
    fn model(&self) -> &str {
        self.name
    }
    fn stream(&self, request: keel_model::ModelRequest) -> keel_model::EventStream {
        self.inner.stream(request)
    }
    fn consumes_responses(&self) -> bool {
        self.inner.consumes_responses()
    }
}

/// The threshold follows the model's known context window: a 110k-token prompt is over 80% of
/// gpt-4o's 128k window, so the next step compacts — under the old fixed 200k window (and for a
/// model with a larger window, or a configured `context_window_tokens`) it would not.
/// Before, every model had a 200,000-token window and this context was never compacted.
async fn a_models_known_window_sets_the_threshold_and_the_override_wins(b: Backend) {
    for (name, window, compacts) in [
        ("gpt-4o", None, true),
        ("gpt-4o-2024-08-06", None, true),
        ("gpt-4.1", None, false),
        ("claude-sonnet-4-5", None, false),
        ("gpt-4o", Some(200_000), false),
        ("gpt-4.1", Some(128_000), true),
    ] {
        let model = Named {
            inner: scripted(&[
                json!({"text": "one", "tool_calls": [call("sleep", json!({"ms": 0}))], "usage": {"input_tokens": 110_000, "output_tokens": 5}}),
                json!({"text": "two"}),
            ]),
            name,
        };
        let f = fixture_with(
            b,
            std::sync::Arc::new(model),
            &[],
            Default::default(),
            |c| c.context_window_tokens = window,
        )
        .await;
        f.rt.submit(f.tenant, f.session, "go").await.unwrap();
        let out = f.rt.run(f.tenant, f.session).await.unwrap();
        assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
        let compacted = f
            .types()
            .await
            .iter()
            .filter(|t| **t == "context.compacted")
            .count();
        assert_eq!(
            compacted,
            usize::from(compacts),
            "{name} with window {window:?}"
        );
    }
}
