//! The scripted model follows docs/ARCHITECTURE.md: the k-th model response of the session
//! (failed attempts included) comes from line k, re-sampled steps get the same line, compaction
//! consumes nothing, injected errors and delays work, exhaustion names the file and its line
//! count. The fake server speaks the same scripts over HTTP.

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

fn at(index: u64) -> ModelRequest {
    ModelRequest {
        response_index: Some(index),
        ..hello()
    }
}

#[tokio::test]
async fn first_line_streams_text_tool_call_with_deterministic_id_and_usage() {
    let got = events(&ScriptedModel::new(script()), at(0)).await;
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
                arguments: args.clone(),
                raw_arguments: args.to_string(),
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
async fn an_error_line_is_a_response_retry_gets_the_next_line_resampling_the_same() {
    let model = ScriptedModel::new(script());
    let first = events(&model, at(1)).await;
    let mut expected = keel_model::ProviderError::new(
        ErrorKind::RateLimited,
        "rate_limited injected by script demo.jsonl line 2",
    );
    expected.retry_after_ms = Some(20);
    assert_eq!(first, vec![StreamEvent::Error { error: expected }]);
    let second = events(&model, at(2)).await;
    assert_eq!(
        second[0],
        StreamEvent::TextDelta {
            text: "Done.".into()
        }
    );
    assert_eq!(
        events(&model, at(1)).await,
        first,
        "a re-sampled step gets the same line again"
    );
}

#[tokio::test]
async fn route_retries_scripted_errors_on_the_next_line_honouring_retry_after() {
    let model: Arc<dyn ModelClient> = Arc::new(ScriptedModel::new(script()));
    let route = ModelRoute::new(vec![model], RetryPolicy::default()).unwrap();
    let started = std::time::Instant::now();
    let response = collect(route.stream(at(1)), route.model(), &PriceTable::default()).await;
    assert!(
        started.elapsed().as_millis() >= 30,
        "retry-after 20 ms + delay 10 ms"
    );
    assert_eq!(
        response.outcome,
        Outcome::Completed {
            stop_reason: StopReason::EndTurn
        }
    );
    assert_eq!(
        (
            response.text.as_str(),
            response.attempts,
            response.responses_consumed
        ),
        ("Done.", 2, 2)
    );
}

#[tokio::test]
async fn a_turn_failed_on_an_error_line_leaves_the_next_line_to_the_next_turn() {
    let script = Script::parse(
        "fail.jsonl",
        "{\"error\": {\"kind\": \"invalid_request\"}}\n{\"text\": \"recovered\"}\n",
    )
    .unwrap();
    let model: Arc<dyn ModelClient> = Arc::new(ScriptedModel::new(script));
    let route = ModelRoute::new(vec![model], RetryPolicy::default()).unwrap();
    let failed = collect(route.stream(at(0)), route.model(), &PriceTable::default()).await;
    assert!(
        matches!(&failed.outcome, Outcome::Failed { error } if error.kind == ErrorKind::InvalidRequest),
        "{failed:?}"
    );
    assert_eq!((failed.attempts, failed.responses_consumed), (1, 1));
    let next = collect(
        route.stream(at(failed.responses_consumed)),
        route.model(),
        &PriceTable::default(),
    )
    .await;
    assert_eq!(next.text, "recovered");
}

#[tokio::test]
async fn without_response_index_the_model_counts_every_finished_response() {
    let model = ScriptedModel::new(script());
    let one = collect(model.stream(hello()), model.model(), &PriceTable::default()).await;
    assert_eq!(one.tool_calls[0].call.id, "call_1_0");
    let two = events(&model, hello()).await;
    assert!(
        matches!(&two[..], [StreamEvent::Error { error }] if error.kind == ErrorKind::RateLimited),
        "{two:?}"
    );
    let three = collect(model.stream(hello()), "s", &PriceTable::default()).await;
    assert_eq!(three.text, "Done.");

    let resumed = ScriptedModel::starting_at(script(), 2);
    let again = collect(resumed.stream(hello()), "s", &PriceTable::default()).await;
    assert_eq!(
        again.text, "Done.",
        "after keel resume: the next unused line"
    );
}

#[tokio::test]
async fn a_cancelled_call_consumes_no_line() {
    let model = ScriptedModel::new(script());
    let cancel = keel_model::CancellationToken::new();
    cancel.cancel();
    let got = events(&model, ModelRequest { cancel, ..hello() }).await;
    assert_eq!(got, vec![StreamEvent::Cancelled]);
    let next = collect(model.stream(hello()), "s", &PriceTable::default()).await;
    assert_eq!(next.text, "Let me look.");
}

#[tokio::test]
async fn delay_ms_delays_the_response() {
    let model = ScriptedModel::new(script());
    let started = std::time::Instant::now();
    let got = events(&model, at(2)).await;
    assert!(
        started.elapsed().as_millis() >= 10,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(got.last(), Some(StreamEvent::Completed { .. })));
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
    let got = events(&ScriptedModel::new(script()), at(3)).await;
    let [StreamEvent::Error { error }] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert_eq!(
        error.message,
        "scripted model exhausted: demo.jsonl has 3 lines and model response 4 was requested"
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

#[tokio::test]
async fn fake_server_honours_script_delay_retry_after_and_exhaustion() {
    let script = Script::parse(
        "srv.jsonl",
        r#"{"error": {"kind": "overloaded", "retry_after_ms": 40}, "delay_ms": 100}
{"error": {"kind": "content_filter"}}
"#,
    )
    .unwrap();
    for wire in Wire::ALL {
        let server = FakeModelServer::start_scripted(script.clone(), Pacing::default())
            .await
            .unwrap();
        let model = model_for(&server, wire, "m");
        let started = std::time::Instant::now();
        let one = events(&model, hello()).await;
        assert!(started.elapsed().as_millis() >= 100, "{wire}: delay_ms");
        let [StreamEvent::Error { error }] = &one[..] else {
            panic!("{wire}: {one:?}")
        };
        assert_eq!(
            (error.kind, error.retry_after_ms, error.status),
            (ErrorKind::Overloaded, Some(40), Some(529)),
            "{wire}"
        );
        assert_eq!(
            error.message, "overloaded injected by script srv.jsonl line 1",
            "{wire}"
        );
        let two = events(&model, hello()).await;
        assert!(
            matches!(&two[..], [StreamEvent::Error { error }] if error.kind == ErrorKind::ContentFilter),
            "{wire}: {two:?}"
        );
        let three = events(&model, hello()).await;
        let [StreamEvent::Error { error }] = &three[..] else {
            panic!("{wire}: {three:?}")
        };
        assert_eq!(
            (error.kind, error.message.as_str()),
            (
                ErrorKind::InvalidRequest,
                "scripted model exhausted: srv.jsonl has 2 lines and model response 3 was requested"
            ),
            "{wire}"
        );
    }
}
