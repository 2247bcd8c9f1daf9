//! Every fault of the fake server, on every wire, becomes exactly the expected normalized result;
//! normal responses round-trip through the server's encoders and our parsers.

use std::time::Duration;

use keel_model::{
    ErrorKind, InvalidArguments, ProviderError, StopReason, StreamEvent, Timeouts, Usage, Wire,
};
use keel_testkit::{FakeModelServer, FakeResponse, Fault, Pacing, Reply};
use serde_json::json;

use crate::{events, hello, model_for};

async fn run(wire: Wire, reply: Reply) -> Vec<StreamEvent> {
    let server = FakeModelServer::start_fixed(reply, Pacing::default())
        .await
        .unwrap();
    events(&model_for(&server, wire, "fake-model"), hello()).await
}

fn error(
    kind: ErrorKind,
    message: &str,
    status: Option<u16>,
    retry_after_ms: Option<u64>,
) -> StreamEvent {
    let mut e = ProviderError::new(kind, message).with_retry_after_ms(retry_after_ms);
    e.status = status;
    StreamEvent::Error { error: e }
}

fn text(t: &str) -> StreamEvent {
    StreamEvent::TextDelta { text: t.into() }
}

/// The canned failing response's usage on the Anthropic wire (its `message_start` counts the
/// prompt): checked and removed, so the rest compares alike on every wire.
fn without_prompt_usage(wire: Wire, mut got: Vec<StreamEvent>) -> Vec<StreamEvent> {
    if wire == Wire::Anthropic {
        let at = got.len().saturating_sub(2);
        assert_eq!(
            got.get(at),
            Some(&StreamEvent::Usage {
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 1,
                    ..Usage::default()
                }
            }),
            "the failed response reports the prompt it was counted for: {got:?}"
        );
        got.remove(at);
    }
    got
}

/// A response that reported usage and then failed still reports it, before its error: on the
/// Anthropic wire `message_start` counts the prompt, then an `error` event ends the stream (or
/// the connection drops, or the stream stalls past the idle limit); on the Responses wire a
/// `response.failed` carries `response.usage`.
#[tokio::test]
async fn a_failed_response_reports_the_usage_it_was_counted_for() {
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"usage\":{\"input_tokens\":100000,\"cache_read_input_tokens\":20,\"output_tokens\":3}}}\n\n".to_owned();
    let block = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_owned();
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n".to_owned();
    let err = keel_testkit::stream_error_frame(Wire::Anthropic, ErrorKind::Overloaded);
    let expected = StreamEvent::Usage {
        usage: Usage {
            input_tokens: 100_020,
            output_tokens: 3,
            cache_read_tokens: 20,
            ..Usage::default()
        },
    };
    let got = run(
        Wire::Anthropic,
        Reply::Frames(vec![start.clone(), block.clone(), delta.clone(), err]),
    )
    .await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], text("Hi"));
    assert_eq!(got[1], expected);
    assert!(
        matches!(&got[2], StreamEvent::Error { error } if error.kind == ErrorKind::Overloaded),
        "{got:?}"
    );
    // The connection drops after the prompt was counted.
    let got = run(
        Wire::Anthropic,
        Reply::Frames(vec![start.clone(), block.clone(), delta.clone()]),
    )
    .await;
    assert_eq!(got[1], expected, "{got:?}");
    assert!(
        matches!(&got[2], StreamEvent::Error { error } if error.kind == ErrorKind::StreamTruncated),
        "{got:?}"
    );
    // Responses: `response.failed` with usage.
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"usage\":{\"input_tokens\":70,\"output_tokens\":2}}}\n\n".to_owned();
    let got = run(Wire::OpenaiResponses, Reply::Frames(vec![failed])).await;
    assert_eq!(
        got[0],
        StreamEvent::Usage {
            usage: Usage {
                input_tokens: 70,
                output_tokens: 2,
                ..Usage::default()
            }
        },
        "{got:?}"
    );
    assert!(matches!(&got[1], StreamEvent::Error { .. }), "{got:?}");
}

#[tokio::test]
async fn text_and_tool_calls_round_trip_on_every_wire() {
    let response = FakeResponse::text("Let me look.")
        .with_tool_call("call_a", "read_file", r#"{"path":"src/main.rs"}"#)
        .with_tool_call("call_b", "list_dir", "{}");
    let start = |id: &str, name: &str| StreamEvent::ToolCallStart {
        id: id.into(),
        name: name.into(),
    };
    let delta = |id: &str, d: &str| StreamEvent::ToolCallDelta {
        id: id.into(),
        delta: d.into(),
    };
    let end_a = StreamEvent::ToolCallEnd {
        id: "call_a".into(),
        name: "read_file".into(),
        arguments: json!({"path": "src/main.rs"}),
        raw_arguments: r#"{"path":"src/main.rs"}"#.into(),
        invalid: None,
    };
    let end_b = StreamEvent::ToolCallEnd {
        id: "call_b".into(),
        name: "list_dir".into(),
        arguments: json!({}),
        raw_arguments: "{}".into(),
        invalid: None,
    };
    let usage = StreamEvent::Usage {
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        },
    };
    let done = StreamEvent::Completed {
        stop_reason: StopReason::ToolUse,
        model: Some("fake-model".into()),
    };
    let mut text_and_a = vec![
        text("Let "),
        text("me "),
        text("look."),
        start("call_a", "read_file"),
        delta("call_a", r#"{"path":"sr"#),
        delta("call_a", r#"c/main.rs"}"#),
    ];
    let b = [
        start("call_b", "list_dir"),
        delta("call_b", "{"),
        delta("call_b", "}"),
    ];
    // Chat ends every call at finish_reason; Anthropic and Responses end each call on its own.
    let chat = [
        text_and_a.clone(),
        b.to_vec(),
        vec![end_a.clone(), end_b.clone(), usage.clone(), done.clone()],
    ]
    .concat();
    text_and_a.push(end_a);
    let per_call = [text_and_a, b.to_vec(), vec![end_b, usage, done]].concat();
    for wire in Wire::ALL {
        let got = run(wire, Reply::Respond(response.clone())).await;
        let expected = if wire == Wire::OpenaiChat {
            &chat
        } else {
            &per_call
        };
        assert_eq!(&got, expected, "{wire}");
    }
}

#[tokio::test]
async fn tool_call_cut_by_max_tokens_is_invalid_truncated_on_every_wire() {
    let mut response = FakeResponse::text("").with_tool_call(
        "call_w",
        "write_file",
        r#"{"path":"a","content":"lor"#,
    );
    response.stop_reason = Some(StopReason::MaxTokens);
    for wire in Wire::ALL {
        let got = run(wire, Reply::Respond(response.clone())).await;
        let n = got.len();
        assert_eq!(
            got[n - 3],
            StreamEvent::ToolCallEnd {
                id: "call_w".into(),
                name: "write_file".into(),
                arguments: json!(r#"{"path":"a","content":"lor"#),
                raw_arguments: r#"{"path":"a","content":"lor"#.into(),
                invalid: Some(InvalidArguments::Truncated),
            },
            "{wire}"
        );
        assert_eq!(
            got[n - 1],
            StreamEvent::Completed {
                stop_reason: StopReason::MaxTokens,
                model: Some("fake-model".into())
            },
            "{wire}"
        );
    }
}

/// A response with no text and no tool call (a Chat stream that is only `data: [DONE]`, an
/// Anthropic message with no content block, a Responses response with no output item) is a
/// classified, retryable `empty_response`, never a completion.
#[tokio::test]
async fn an_empty_response_is_classified_empty_response_on_every_wire() {
    for wire in Wire::ALL {
        let got = run(wire, Reply::Respond(FakeResponse::text(""))).await;
        let Some(StreamEvent::Error { error }) = got.last() else {
            panic!("{wire}: {got:?}")
        };
        assert_eq!(error.kind, ErrorKind::EmptyResponse, "{wire}: {got:?}");
        assert!(error.retryable);
        assert!(
            !got.iter()
                .any(|e| matches!(e, StreamEvent::Completed { .. })),
            "{wire}: {got:?}"
        );
    }
}

/// The issue's exact stream: a Chat response whose whole body is `data: [DONE]` (no role
/// chunk, no finish reason, no usage). Before, it ended the step as a completion with nothing in
/// it ("illegal step transition started -> completed"); it is a retryable `empty_response`.
#[tokio::test]
async fn a_chat_stream_of_only_done_is_empty_response() {
    let got = run(
        Wire::OpenaiChat,
        Reply::Frames(vec!["data: [DONE]\n\n".to_owned()]),
    )
    .await;
    let [StreamEvent::Error { error }] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(error.kind, ErrorKind::EmptyResponse, "{error}");
    assert!(error.retryable);
}

#[tokio::test]
async fn http_429_carries_retry_after_from_headers() {
    for wire in Wire::ALL {
        let got = run(
            wire,
            Reply::Fault(Fault::RateLimited {
                retry_after_ms: 1500,
            }),
        )
        .await;
        assert_eq!(
            got,
            vec![error(
                ErrorKind::RateLimited,
                "injected rate_limited",
                Some(429),
                Some(1500)
            )],
            "{wire}"
        );
    }
}

#[tokio::test]
async fn http_500_is_server_error() {
    for wire in Wire::ALL {
        let got = run(wire, Reply::Fault(Fault::ServerError)).await;
        assert_eq!(
            got,
            vec![error(
                ErrorKind::ServerError,
                "injected server_error",
                Some(500),
                None
            )],
            "{wire}"
        );
    }
}

#[tokio::test]
async fn http_529_is_overloaded() {
    for wire in Wire::ALL {
        let got = run(wire, Reply::Fault(Fault::Overloaded)).await;
        assert_eq!(
            got,
            vec![error(
                ErrorKind::Overloaded,
                "injected overloaded",
                Some(529),
                None
            )],
            "{wire}"
        );
    }
}

#[tokio::test]
async fn every_error_kind_sent_as_http_error_is_classified_back_to_itself() {
    for wire in Wire::ALL {
        // Neither is an HTTP error: a cut stream and an empty 200 response are classified so.
        for kind in ErrorKind::ALL
            .into_iter()
            .filter(|k| !matches!(k, ErrorKind::StreamTruncated | ErrorKind::EmptyResponse))
        {
            let got = run(wire, Reply::Fault(Fault::Http(kind))).await;
            let [StreamEvent::Error { error }] = &got[..] else {
                panic!("{wire} {kind}: {got:?}")
            };
            assert_eq!(error.kind, kind, "{wire}: {error}");
            assert_eq!(error.retryable, kind.retryable());
        }
    }
}

#[tokio::test]
async fn mid_stream_disconnect_is_stream_truncated_after_the_partial_content() {
    let expected_text = |wire| match wire {
        // chat: role chunk, "This "; responses: created, item added, "This "; anthropic:
        // message_start, ping, block start, "This "
        Wire::OpenaiChat => 2,
        Wire::OpenaiResponses => 3,
        Wire::Anthropic => 4,
    };
    for wire in Wire::ALL {
        let got = run(
            wire,
            Reply::Fault(Fault::Disconnect {
                after_frames: expected_text(wire),
            }),
        )
        .await;
        // Anthropic counted the prompt in `message_start`: the failed response reports it.
        let got = without_prompt_usage(wire, got);
        assert_eq!(got.len(), 2, "{wire}: {got:?}");
        assert_eq!(got[0], text("This "), "{wire}");
        let StreamEvent::Error { error } = &got[1] else {
            panic!("{wire}: {got:?}")
        };
        assert_eq!(
            (error.kind, error.retryable, error.status),
            (ErrorKind::StreamTruncated, true, None),
            "{wire}"
        );
        assert!(
            error.message.starts_with("connection failed mid-stream"),
            "{wire}: {}",
            error.message
        );
    }
}

#[tokio::test]
async fn malformed_chunk_is_stream_truncated_naming_the_chunk() {
    for wire in Wire::ALL {
        let got = run(
            wire,
            Reply::Fault(Fault::MalformedChunk { after_frames: 1 }),
        )
        .await;
        let got = without_prompt_usage(wire, got);
        let [StreamEvent::Error { error }] = &got[..] else {
            panic!("{wire}: {got:?}")
        };
        assert_eq!(error.kind, ErrorKind::StreamTruncated, "{wire}");
        assert!(
            error.message.starts_with("malformed chunk ("),
            "{wire}: {}",
            error.message
        );
        assert!(
            error.message.contains(r#"{"type": "content_block_delta""#),
            "{wire}: {}",
            error.message
        );
    }
}

#[tokio::test]
async fn in_stream_error_event_after_200_is_classified() {
    for wire in Wire::ALL {
        let reply = Reply::Fault(Fault::StreamError {
            kind: ErrorKind::Overloaded,
            after_frames: 1,
        });
        let got = without_prompt_usage(wire, run(wire, reply).await);
        assert_eq!(
            got,
            vec![error(
                ErrorKind::Overloaded,
                "injected overloaded",
                None,
                None
            )],
            "{wire}"
        );
        let reply = Reply::Fault(Fault::StreamError {
            kind: ErrorKind::RateLimited,
            after_frames: 0,
        });
        let got = run(wire, reply).await;
        assert_eq!(
            got,
            vec![error(
                ErrorKind::RateLimited,
                "injected rate_limited",
                None,
                None
            )],
            "{wire}"
        );
    }
}

#[tokio::test]
async fn slow_first_token_hits_the_time_to_first_token_limit() {
    let pacing = Pacing {
        time_to_first_token_ms: 5_000,
        tokens_per_second: None,
    };
    let server = FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("late")), pacing)
        .await
        .unwrap();
    let timeouts = Timeouts {
        first_token_ms: Some(100),
        total_ms: Some(60_000),
        ..Timeouts::default()
    };
    for wire in Wire::ALL {
        let config = keel_model::ProviderConfig::new("m")
            .with_base_url(server.base_url(wire))
            .with_api_key("k")
            .with_timeouts(timeouts);
        let model = keel_model::HttpModel::new(wire, config).unwrap();
        let got = events(&model, hello()).await;
        assert_eq!(
            got,
            vec![error(
                ErrorKind::Timeout,
                "no first token within the time-to-first-token limit",
                None,
                None
            )],
            "{wire}"
        );
    }
}

#[tokio::test]
async fn slow_stream_hits_the_total_time_limit_after_first_tokens() {
    let pacing = Pacing {
        time_to_first_token_ms: 0,
        tokens_per_second: Some(20.0),
    };
    let text = "one two three four five six seven eight nine ten eleven twelve";
    let server = FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text(text)), pacing)
        .await
        .unwrap();
    let config = keel_model::ProviderConfig::new("m")
        .with_base_url(server.openai_base_url())
        .with_api_key("k")
        .with_timeouts(Timeouts {
            first_token_ms: Some(10_000),
            total_ms: Some(200),
            ..Timeouts::default()
        });
    let model = keel_model::HttpModel::openai_chat(config).unwrap();
    let got = events(&model, hello()).await;
    assert!(matches!(got[0], StreamEvent::TextDelta { .. }), "{got:?}");
    assert_eq!(
        got.last(),
        Some(&error(
            ErrorKind::Timeout,
            "response not complete within the total time limit",
            None,
            None
        ))
    );
}

#[tokio::test]
async fn connection_refused_is_a_retryable_server_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let config = keel_model::ProviderConfig::new("m")
        .with_base_url(url)
        .with_api_key("k");
    let got = events(
        &keel_model::HttpModel::openai_chat(config).unwrap(),
        hello(),
    )
    .await;
    let [StreamEvent::Error { error }] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(
        (error.kind, error.retryable),
        (ErrorKind::ServerError, true)
    );
}

/// A provider that starts answering, then goes silent with the connection open, fails with a
/// retryable `timeout` at the idle limit on every wire. Before the idle limit existed the stream
/// waited out the total limit (10 minutes by default), and a route then retried into the same
/// hang.
#[tokio::test]
async fn a_stream_that_stalls_mid_answer_fails_with_timeout_at_the_idle_limit() {
    let server = FakeModelServer::start_fixed(
        Reply::Fault(Fault::Stall { after_frames: 4 }),
        Pacing::default(),
    )
    .await
    .unwrap();
    for wire in Wire::ALL {
        let config = keel_model::ProviderConfig::new("m")
            .with_base_url(server.base_url(wire))
            .with_api_key("k")
            .with_timeouts(Timeouts {
                first_token_ms: Some(10_000),
                total_ms: Some(60_000),
                idle_ms: Some(300),
            });
        let model = keel_model::HttpModel::new(wire, config).unwrap();
        // Correctness deadline: 20 s, far past the 0.3 s limit and far short of the 60 s total.
        let got = tokio::time::timeout(Duration::from_secs(20), events(&model, hello()))
            .await
            .expect("the idle limit ends the stalled stream");
        assert!(
            got.iter()
                .any(|e| matches!(e, StreamEvent::TextDelta { .. })),
            "{wire}: the answer had started: {got:?}"
        );
        assert_eq!(
            got.last(),
            Some(&error(
                ErrorKind::Timeout,
                "the stream stalled: no data for 300 ms mid-response (the stream idle limit)",
                None,
                None
            )),
            "{wire}"
        );
        let Some(StreamEvent::Error { error }) = got.last() else {
            unreachable!()
        };
        assert!(error.retryable, "{wire}: a stall is worth another attempt");
    }
    assert!(
        server.wait_for_abandoned(3, Duration::from_secs(10)).await,
        "each stalled connection was closed"
    );
}

/// The caller's per-request limit (what the runtime passes from the session's
/// `stream_idle_timeout_ms`) replaces the model's own: a model built with the default 60 s idle
/// limit fails a stalled stream at the request's 300 ms.
#[tokio::test]
async fn a_request_idle_limit_replaces_the_model_s_own() {
    let server = FakeModelServer::start_fixed(
        Reply::Fault(Fault::Stall { after_frames: 4 }),
        Pacing::default(),
    )
    .await
    .unwrap();
    let model = model_for(&server, Wire::OpenaiChat, "m");
    let mut request = hello();
    request.timeouts.idle_ms = Some(300);
    let got = tokio::time::timeout(Duration::from_secs(20), events(&model, request))
        .await
        .expect("the request's idle limit ends the stalled stream");
    assert!(
        matches!(got.last(), Some(StreamEvent::Error { error }) if error.kind == ErrorKind::Timeout && error.message.contains("300 ms")),
        "{got:?}"
    );
}
