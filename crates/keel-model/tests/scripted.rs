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

// --- positions in routes: only the scripted model's own responses take a line ----------------

fn fast(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay_ms: 1,
        max_delay_ms: 2,
        max_retry_after_ms: 10_000,
    }
}

fn scripted(name: &str, text: &str) -> Arc<dyn ModelClient> {
    Arc::new(ScriptedModel::new(Script::parse(name, text).unwrap()))
}

/// One step as the runtime runs it: the request at `position`, the position after it.
async fn step(route: &ModelRoute, position: u64) -> (keel_model::ModelResponse, u64) {
    let r = collect(
        route.stream(at(position)),
        route.model(),
        &PriceTable::default(),
    )
    .await;
    let next = position + r.responses_consumed;
    (r, next)
}

#[tokio::test]
async fn failed_http_attempts_before_a_scripted_fallback_take_no_line() {
    let handler: keel_testkit::Handler =
        Arc::new(|_| keel_testkit::Reply::Fault(keel_testkit::Fault::ServerError));
    let server = FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap();
    let http: Arc<dyn ModelClient> = Arc::new(model_for(&server, Wire::OpenaiChat, "gpt-4o"));
    assert!(!http.consumes_responses());
    let fallback = scripted(
        "fallback.jsonl",
        "{\"text\": \"line one\"}\n{\"text\": \"line two\"}\n",
    );
    let route = ModelRoute::new(vec![http, fallback], fast(4)).unwrap();
    assert!(route.consumes_responses(), "a route with a scripted model");

    let attempts: Vec<(String, bool)> = events(&route, at(0))
        .await
        .into_iter()
        .filter_map(|e| match e {
            StreamEvent::Attempt {
                model,
                consumes_response,
                ..
            } => Some((model, consumes_response)),
            _ => None,
        })
        .collect();
    let mut expected = vec![("gpt-4o".to_string(), false); 4];
    expected.push(("scripted:fallback.jsonl".to_string(), true));
    assert_eq!(attempts, expected);

    let (first, position) = step(&route, 0).await;
    assert_eq!(
        (
            first.text.as_str(),
            first.attempts,
            first.responses_consumed
        ),
        ("line one", 5, 1),
        "four failed HTTP attempts, then the script's line 1: {first:?}"
    );
    let (second, position) = step(&route, position).await;
    assert_eq!(
        (second.text.as_str(), second.attempts, position),
        ("line two", 5, 2),
        "the second step gets line 2: {second:?}"
    );
    assert_eq!(server.requests().len(), 12, "4 HTTP attempts per call");
}

#[tokio::test]
async fn a_scripted_error_before_an_http_fallback_takes_its_line_the_http_answer_none() {
    let server = FakeModelServer::start_scripted(
        Script::parse("srv.jsonl", "{\"text\": \"from http\"}\n").unwrap(),
        Pacing::default(),
    )
    .await
    .unwrap();
    let primary = scripted(
        "primary.jsonl",
        "{\"error\": {\"kind\": \"server_error\"}}\n{\"text\": \"primary two\"}\n",
    );
    let http: Arc<dyn ModelClient> = Arc::new(model_for(&server, Wire::OpenaiChat, "gpt-4o"));
    let route = ModelRoute::new(vec![primary, http], fast(1)).unwrap();
    let (first, position) = step(&route, 0).await;
    assert_eq!(
        (first.text.as_str(), first.responses_consumed),
        ("from http", 1),
        "{first:?}"
    );
    let (second, _) = step(&route, position).await;
    assert_eq!(second.text, "primary two");
}

#[tokio::test]
async fn two_scripted_models_in_a_route_share_the_position() {
    let primary = scripted(
        "a.jsonl",
        "{\"error\": {\"kind\": \"server_error\"}}\n{\"error\": {\"kind\": \"server_error\"}}\n{\"text\": \"a3\"}\n{\"text\": \"a4\"}\n",
    );
    let fallback = scripted(
        "b.jsonl",
        "{\"text\": \"b1\"}\n{\"text\": \"b2\"}\n{\"text\": \"b3\"}\n",
    );
    let route = ModelRoute::new(vec![primary, fallback], fast(2)).unwrap();
    let (first, position) = step(&route, 0).await;
    assert_eq!(
        (
            first.text.as_str(),
            first.attempts,
            first.responses_consumed,
            first.model.as_str()
        ),
        ("b3", 3, 3, "scripted:b.jsonl"),
        "a's lines 1 and 2 failed, then b answers from line 3: {first:?}"
    );
    let (second, position) = step(&route, position).await;
    assert_eq!((second.text.as_str(), position), ("a4", 4));
}

#[tokio::test]
async fn a_scripted_model_alone_counts_error_lines_as_before() {
    let model = ScriptedModel::new(script());
    assert!(model.consumes_responses());
    let error = collect(model.stream(at(1)), model.model(), &PriceTable::default()).await;
    assert!(
        matches!(&error.outcome, Outcome::Failed { error } if error.kind == ErrorKind::RateLimited),
        "{error:?}"
    );
    assert_eq!(error.responses_consumed, 1, "an error line is a response");
    let done = collect(model.stream(at(2)), model.model(), &PriceTable::default()).await;
    assert_eq!((done.text.as_str(), done.responses_consumed), ("Done.", 1));

    let alone: Arc<dyn ModelClient> = Arc::new(ScriptedModel::new(script()));
    let route = ModelRoute::new(vec![alone], fast(4)).unwrap();
    let (first, position) = step(&route, 0).await;
    assert_eq!((first.text.as_str(), position), ("Let me look.", 1));
    let (second, position) = step(&route, position).await;
    assert_eq!(
        (second.text.as_str(), second.attempts, position),
        ("Done.", 2, 3),
        "the error line and its retry both count"
    );
}
