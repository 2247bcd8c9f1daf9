//! The request each adapter sends matches the provider's documented shape: instructions
//! placement, tool schemas, tool results paired with their calls, reasoning sent back, headers.
//! Bodies are snapshotted (`tests/snapshots/`): a diff there is a change of what providers see.

use keel_model::{
    Message, ModelRequest, ReasoningItem, SamplingOptions, StreamEvent, ToolCall, ToolSchema, Wire,
};
use keel_testkit::{FakeModelServer, FakeResponse, Pacing, RecordedRequest, Reply};
use serde_json::json;

use crate::{events, model_for};

/// The messages of a request, shared as the runtime shares its transcript.
fn shared(messages: Vec<Message>) -> Vec<std::sync::Arc<Message>> {
    messages.into_iter().map(std::sync::Arc::new).collect()
}

fn transcript() -> ModelRequest {
    ModelRequest {
        instructions: Some("You are Keel's test agent.".into()),
        messages: shared(vec![
            Message::User {
                content: "List the files, then read the first.".into(),
            },
            Message::Assistant {
                text: "Looking.".into(),
                tool_calls: vec![
                    ToolCall::new("call_1", "list_dir", json!({"path": "."})),
                    ToolCall {
                        id: "call_2".into(),
                        name: "shell".into(),
                        arguments: json!({"command": "ls", "timeout_ms": 5000}),
                        // As the model wrote it: key order and spacing kept on the OpenAI wires.
                        raw_arguments: Some(r#"{"timeout_ms": 5000, "command": "ls"}"#.into()),
                    },
                ],
                reasoning: vec![
                    ReasoningItem::Anthropic {
                        thinking: "I should list.".into(),
                        signature: "sig123".into(),
                    },
                    ReasoningItem::Openai {
                        id: "rs_1".into(),
                        encrypted_content: Some("enc".into()),
                        summary: vec!["Listing".into()],
                    },
                ],
            },
            Message::Tool {
                call_id: "call_1".into(),
                content: "a.txt\nb.txt".into(),
                is_error: false,
            },
            Message::Tool {
                call_id: "call_2".into(),
                content: "denied by policy".into(),
                is_error: true,
            },
            Message::User {
                content: "Go on.".into(),
            },
        ]),
        tools: std::sync::Arc::from([ToolSchema {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        }]),
        sampling: SamplingOptions {
            max_tokens: Some(1024),
            temperature: Some(0.5),
            ..SamplingOptions::default()
        },
        ..ModelRequest::default()
    }
}

async fn sent(wire: Wire) -> RecordedRequest {
    let server =
        FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("ok")), Pacing::default())
            .await
            .unwrap();
    let got = events(&model_for(&server, wire, "test-model"), transcript()).await;
    assert!(
        matches!(got.last(), Some(StreamEvent::Completed { .. })),
        "{got:?}"
    );
    let mut requests = server.requests();
    assert_eq!(requests.len(), 1);
    requests.remove(0)
}

#[tokio::test]
async fn openai_chat_request_shape() {
    let r = sent(Wire::OpenaiChat).await;
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.header("authorization"), Some("Bearer test-key"));
    let b = &r.body;
    assert_eq!(
        b["messages"][0],
        json!({"role": "system", "content": "You are Keel's test agent."})
    );
    assert_eq!(
        b["messages"][2]["tool_calls"][0]["function"]["arguments"],
        json!(r#"{"path":"."}"#)
    );
    assert_eq!(
        b["messages"][2]["tool_calls"][1]["function"]["arguments"],
        json!(r#"{"timeout_ms": 5000, "command": "ls"}"#),
        "the model's own argument text goes back verbatim"
    );
    assert_eq!(
        b["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"})
    );
    assert_eq!(
        b["messages"][4]["content"],
        json!("Error: denied by policy")
    );
    assert_eq!(b["tools"][0]["type"], json!("function"));
    assert_eq!(
        b["tools"][0]["function"]["parameters"]["required"],
        json!(["path"])
    );
    assert_eq!(
        (
            b["stream"].clone(),
            b["stream_options"]["include_usage"].clone()
        ),
        (json!(true), json!(true))
    );
    assert!(r.unanswered_tool_calls().is_empty());
    insta::assert_json_snapshot!("openai_chat_body", b);
}

#[tokio::test]
async fn openai_responses_request_shape() {
    let r = sent(Wire::OpenaiResponses).await;
    assert_eq!(r.path, "/v1/responses");
    assert_eq!(r.header("authorization"), Some("Bearer test-key"));
    let b = &r.body;
    assert_eq!(b["instructions"], json!("You are Keel's test agent."));
    let types: Vec<&str> = b["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "message",
            "reasoning",
            "message",
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output",
            "message"
        ]
    );
    assert_eq!(b["input"][1]["encrypted_content"], json!("enc"));
    assert_eq!(
        b["input"][4],
        json!({"type": "function_call", "call_id": "call_2", "name": "shell",
               "arguments": r#"{"timeout_ms": 5000, "command": "ls"}"#})
    );
    assert_eq!(
        b["input"][6],
        json!({"type": "function_call_output", "call_id": "call_2", "output": "Error: denied by policy"})
    );
    assert_eq!(b["tools"][0]["name"], json!("read_file"));
    assert_eq!(b["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(b["store"], json!(false));
    assert!(r.unanswered_tool_calls().is_empty());
    insta::assert_json_snapshot!("openai_responses_body", b);
}

#[tokio::test]
async fn anthropic_request_shape() {
    let r = sent(Wire::Anthropic).await;
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.header("x-api-key"), Some("test-key"));
    assert_eq!(
        r.header("anthropic-version"),
        Some(keel_model::ANTHROPIC_VERSION)
    );
    let b = &r.body;
    assert_eq!(b["system"], json!("You are Keel's test agent."));
    assert_eq!(b["max_tokens"], json!(1024));
    let roles: Vec<&str> = b["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user"],
        "tool results and the next user text share one user message"
    );
    assert_eq!(
        b["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": "I should list.", "signature": "sig123"})
    );
    assert_eq!(
        b["messages"][2]["content"][1],
        json!({"type": "tool_result", "tool_use_id": "call_2", "content": "denied by policy", "is_error": true})
    );
    assert_eq!(
        b["messages"][1]["content"][3],
        json!({"type": "tool_use", "id": "call_2", "name": "shell", "input": {"command": "ls", "timeout_ms": 5000}})
    );
    assert_eq!(
        b["messages"][2]["content"][0]["type"],
        json!("tool_result"),
        "tool results open the user message right after the tool_use"
    );
    assert_eq!(b["tools"][0]["input_schema"]["required"], json!(["path"]));
    assert!(r.unanswered_tool_calls().is_empty());
    insta::assert_json_snapshot!("anthropic_body", b);
}

#[tokio::test]
async fn unanswered_tool_calls_are_detected_on_every_wire() {
    let server =
        FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("ok")), Pacing::default())
            .await
            .unwrap();
    let mut request = transcript();
    request
        .messages
        .retain(|m| !matches!(&**m, Message::Tool { call_id, .. } if call_id == "call_2"));
    for wire in Wire::ALL {
        events(&model_for(&server, wire, "m"), request.clone()).await;
    }
    for r in server.requests() {
        assert_eq!(
            r.unanswered_tool_calls(),
            vec!["call_2".to_string()],
            "{}",
            r.wire
        );
    }
}

#[tokio::test]
async fn invalid_tool_call_arguments_are_sent_back_as_empty_objects() {
    let server =
        FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("ok")), Pacing::default())
            .await
            .unwrap();
    let request = ModelRequest {
        messages: shared(vec![
            Message::User {
                content: "write".into(),
            },
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c".into(),
                    name: "write_file".into(),
                    arguments: json!("{\"path\": \"a"),
                    raw_arguments: Some("{\"path\": \"a".into()),
                }],
                reasoning: vec![],
            },
            Message::Tool {
                call_id: "c".into(),
                content: keel_model::InvalidArguments::Truncated.result_message(),
                is_error: true,
            },
        ]),
        ..ModelRequest::default()
    };
    for wire in Wire::ALL {
        events(&model_for(&server, wire, "m"), request.clone()).await;
    }
    let r = server.requests();
    assert_eq!(
        r[0].body["messages"][1]["tool_calls"][0]["function"]["arguments"],
        json!("{}")
    );
    assert_eq!(r[1].body["input"][1]["arguments"], json!("{}"));
    assert_eq!(r[2].body["messages"][1]["content"][0]["input"], json!({}));
}

/// A sampling setting reaches the provider as the user wrote it: `temperature = 0.7` (an `f32`)
/// is sent as `0.7`, not as the `f64` nearest the `f32` (`0.699999988079071`, which bodies
/// built through a `serde_json::Value` sent), on every wire.
#[tokio::test]
async fn sampling_floats_are_sent_as_written_on_every_wire() {
    for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
        let server = FakeModelServer::start_fixed(
            Reply::Respond(FakeResponse::text("ok")),
            Pacing::default(),
        )
        .await
        .unwrap();
        let mut request = transcript();
        request.sampling.temperature = Some(0.7);
        request.sampling.top_p = Some(0.9);
        let model = model_for(&server, wire, "test-model");
        let bytes = model.encode_body(&request).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.contains(r#""temperature":0.7,"#) && text.contains(r#""top_p":0.9,"#),
            "{wire:?}: {text}"
        );
        events(&model, request).await;
        let sent = server.requests().remove(0).body;
        assert_eq!(
            (sent["temperature"].as_f64(), sent["top_p"].as_f64()),
            (Some(0.7), Some(0.9)),
            "{wire:?}"
        );
        assert_eq!(
            model.request_body(&transcript()).unwrap()["model"],
            json!("test-model")
        );
    }
}

/// A failed call's result that already says `Error:` (the runtime's message for invalid
/// arguments does) gets no second `Error: ` on the wires without an error flag.
#[test]
fn a_failed_result_is_marked_error_once_on_the_openai_wires() {
    let mut request = transcript();
    request.messages = shared(vec![
        Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall::new("c1", "shell", json!("not an object"))],
            reasoning: vec![],
        },
        Message::Tool {
            call_id: "c1".into(),
            content: keel_model::InvalidArguments::Truncated.result_message(),
            is_error: true,
        },
    ]);
    for wire in [Wire::OpenaiChat, Wire::OpenaiResponses] {
        let model = keel_model::HttpModel::new(
            wire,
            keel_model::ProviderConfig::new("gpt-4o").with_api_key("k"),
        )
        .unwrap();
        let body = model.request_body(&request).unwrap();
        let text = body.to_string();
        assert!(
            text.contains(r#""Error: the tool call's arguments were truncated"#),
            "{text}"
        );
        assert!(!text.contains("Error: Error:"), "{wire:?}: {text}");
    }
}
