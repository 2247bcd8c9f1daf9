//! Token estimates for transcript items when no provider count is at hand: bytes / 4.

use keel_model::Message;

/// Estimated tokens of a text: ceil(bytes / 4).
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// Estimated tokens of one transcript item (text plus 4 tokens of framing).
pub fn estimate_message_tokens(m: &Message) -> u64 {
    4 + match m {
        Message::User { content } | Message::Tool { content, .. } => estimate_tokens(content),
        Message::Assistant {
            text, tool_calls, ..
        } => {
            estimate_tokens(text)
                + tool_calls
                    .iter()
                    .map(|c| {
                        estimate_tokens(&c.name) + estimate_tokens(&c.arguments.to_string()) + 4
                    })
                    .sum::<u64>()
        }
    }
}
