//! What the fake server streams parses back, through keel-model's own wire parsers, into what
//! it was given.

use keel_model::{ReasoningItem, StreamEvent, Wire, parse_recorded};
use keel_testkit::{FakeResponse, encode};

async fn reasoning_of(wire: Wire, response: &FakeResponse) -> (Vec<ReasoningItem>, String) {
    let body = encode(wire, response).concat();
    let mut items = Vec::new();
    let mut deltas = String::new();
    for ev in parse_recorded(wire, body.as_bytes()).await {
        match ev {
            StreamEvent::Reasoning { item } => items.push(item),
            StreamEvent::ReasoningDelta { text } => deltas.push_str(&text),
            StreamEvent::Error { error } => panic!("{error:?}"),
            _ => {}
        }
    }
    (items, deltas)
}

/// Reasoning items come back exactly, each on its own wire only: Anthropic thinking with its
/// signature and redacted thinking; a Responses reasoning item with its encrypted content and
/// summary; none on OpenAI Chat.
#[tokio::test]
async fn reasoning_items_round_trip_through_the_model_parsers() {
    let thinking = ReasoningItem::Anthropic {
        thinking: "First, 925 / 5.\n\nThat is 185.".into(),
        signature: "EvQBCkYICxgCKkAx+/=sig".into(),
    };
    let redacted = ReasoningItem::AnthropicRedacted {
        data: "EmwKAhgBEgy3va3pzix/LafPsn4a".into(),
    };
    let openai = ReasoningItem::Openai {
        id: "rs_1".into(),
        encrypted_content: Some("gAAAAABpPDIV-enc==".into()),
        summary: vec!["**Planning**\n\nAdd first.".into()],
    };
    let r = FakeResponse::text("185")
        .with_reasoning(thinking.clone())
        .with_reasoning(redacted.clone())
        .with_reasoning(openai.clone())
        .with_tool_call("call_1", "calc", r#"{"a":1}"#);
    let (items, deltas) = reasoning_of(Wire::Anthropic, &r).await;
    assert_eq!(items, vec![thinking, redacted]);
    assert_eq!(deltas, "First, 925 / 5.\n\nThat is 185.");
    let (items, deltas) = reasoning_of(Wire::OpenaiResponses, &r).await;
    assert_eq!(items, vec![openai]);
    assert_eq!(deltas, "**Planning**\n\nAdd first.");
    let (items, deltas) = reasoning_of(Wire::OpenaiChat, &r).await;
    assert!(items.is_empty() && deltas.is_empty());
}
