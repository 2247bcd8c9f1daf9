//! The scripted model follows docs/ARCHITECTURE.md: position from the session, re-sampled steps
//! get the same line, compaction consumes nothing, injected errors and delays, clear exhaustion.
//! The fake server speaks the same scripts over HTTP.

use std::sync::Arc;

use keel_model::{
    ErrorKind, ModelClient, ModelRequest, ModelRoute, Outcome, PriceTable, RequestPurpose,
    RetryPolicy, Script, ScriptedModel, StopReason, StreamEvent, Usage, Wire, collect,
};
use keel_testkit::{FakeModelServer, Pacing};
use serde_json::json;

use crate::{events, hello, model_for};

const SCRIPT: &str = r#"{"text": "Let me look.", "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}], "usage": {"input_tokens": 10, "output_tokens": 5}}
{"error": {"kind": "rate_limited", "retry_after_ms": 20}}
{"text": "Done.", "delay_ms": 10}
"#;

fn script() -> Script {
    Script::parse("demo.jsonl", SCRIPT).unwrap()
}

fn at(index: u64, attempt: u32) -> ModelRequest {
    ModelRequest {
        response_index: Some(index),
        attempt,
        ..hello()
    }
}

#[tokio::test]
async fn first_line_streams_text_tool_call_with_deterministic_id_and_usage() {
    let got = events(&ScriptedModel::new(script()), at(0, 0)).await;
    let args = json!({"command": "ls"});
    assert_eq!(
        got,
        vec![
            StreamEvent::TextDelta {
                text: "Let ".into()
            },
            StreamEvent::TextDelta { text: "me ".into() },
            StreamEvent::TextDelta {
                text: "look.".into()
            },
            StreamEvent::ToolCallStart {
                id: "call_1_0".into(),
                name: "shell".into()
            },
            StreamEvent::ToolCallDelta {
                id: "call_1_0".into(),
                delta: args.to_string()
            },
            StreamEvent::ToolCallEnd {
                id: "call_1_0".into(),
                name: "shell".into(),
                arguments: args,
                invalid: None
            },
            StreamEvent::Usage {
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                }
            },
            StreamEvent::Completed {
                stop_reason: StopReason::ToolUse,
                model: Some("scripted:demo.jsonl".into())
            },
        ]
    );
}

#[tokio::test]
async fn injected_error_then_same_step_retried_gets_its_response_and_resampling_replays() {
    let model = ScriptedModel::new(script());
    let first = events(&model, at(1, 0)).await;
    let mut expected = keel_model::ProviderError::new(
        ErrorKind::RateLimited,
        "rate_limited injected by script demo.jsonl line 2",
    );
    expected.retry_after_ms = Some(20);
    assert_eq!(first, vec![StreamEvent::Error { error: expected }]);
    let second = events(&model, at(1, 1)).await;
    assert_eq!(
        second[0],
        StreamEvent::TextDelta {
            text: "Done.".into()
        }
    );
    assert_eq!(
        events(&model, at(1, 0)).await,
        first,
        "a re-sampled step gets the same line again"
    );
}

#[tokio::test]
async fn route_retries_scripted_errors_honouring_their_retry_after() {
    let model: Arc<dyn ModelClient> = Arc::new(ScriptedModel::new(script()));
    let route = ModelRoute::new(vec![model], RetryPolicy::default()).unwrap();
    let response = collect(
        route.stream(at(1, 0)),
        route.model(),
        &PriceTable::default(),
    )
    .await;
    assert_eq!(
        response.outcome,
        Outcome::Completed {
            stop_reason: StopReason::EndTurn
        }
    );
    assert_eq!((response.text.as_str(), response.attempts), ("Done.", 2));
}

#[tokio::test]
async fn without_response_index_the_model_counts_completed_responses_and_can_start_later() {
    let model = ScriptedModel::new(script());
    let one = collect(model.stream(hello()), model.model(), &PriceTable::default()).await;
    assert_eq!(one.tool_calls[0].call.id, "call_1_0");
    let resumed = ScriptedModel::starting_at(script(), 1);
    let two = collect(
        resumed.stream(ModelRequest {
            attempt: 1,
            ..hello()
        }),
        "s",
        &PriceTable::default(),
    )
    .await;
    assert_eq!(two.text, "Done.");
}

#[tokio::test]
async fn compaction_gets_a_builtin_summary_and_consumes_no_line() {
    let model = ScriptedModel::new(script());
    let summary = ModelRequest {
        purpose: RequestPurpose::Compaction,
        ..hello()
    };
    let r = collect(model.stream(summary), "s", &PriceTable::default()).await;
    assert_eq!(
        r.text,
        "Summary of the conversation so far: 1 messages (1 from the user, 0 tool results)."
    );
    let next = collect(model.stream(hello()), "s", &PriceTable::default()).await;
    assert_eq!(
        next.text, "Let me look.",
        "the summary did not consume line 1"
    );
}

#[tokio::test]
async fn exhausted_script_fails_naming_file_and_line_count() {
    let got = events(&ScriptedModel::new(script()), at(2, 0)).await;
    let [StreamEvent::Error { error }] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert_eq!(
        error.message,
        "scripted model exhausted: demo.jsonl has 3 lines (2 responses) and response 3 was requested"
    );
}

#[tokio::test]
async fn script_file_errors_name_the_file() {
    let err = ScriptedModel::from_file("/nonexistent/demo.jsonl").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot read script /nonexistent/demo.jsonl"),
        "{err}"
    );
}

#[tokio::test]
async fn fake_server_plays_a_script_over_every_wire() {
    for wire in Wire::ALL {
        let server = FakeModelServer::start_scripted(script(), Pacing::default())
            .await
            .unwrap();
        let model = model_for(&server, wire, "m");
        let one = collect(model.stream(hello()), "m", &PriceTable::empty()).await;
        assert_eq!(one.text, "Let me look.", "{wire}");
        assert_eq!(one.tool_calls[0].call.id, "call_1_0", "{wire}");
        assert_eq!(
            one.total_usage(),
            Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            "{wire}"
        );
        let two = events(&model, hello()).await;
        let [StreamEvent::Error { error }] = &two[..] else {
            panic!("{wire}: {two:?}")
        };
        assert_eq!(
            (error.kind, error.retry_after_ms, error.status),
            (ErrorKind::RateLimited, Some(20), Some(429))
        );
        let three = collect(model.stream(hello()), "m", &PriceTable::empty()).await;
        assert_eq!(three.text, "Done.", "{wire}");
        assert_eq!(server.requests().len(), 3);
    }
}
