//! Request bodies encoded straight from the request: each wire's body is a `Serialize` value
//! that borrows the [`ModelRequest`](crate::ModelRequest)'s strings, tool schemas and
//! transcript, so a step's body is written to bytes without first building (and cloning the
//! schemas and transcript into) a `serde_json::Value` tree and dropping it (issue 16: that tree
//! was ~0.1–0.3 ms of a step's critical path; `cargo bench -p keel-model --bench request_body`).

use std::fmt;

use serde::ser::{Serialize, SerializeSeq, Serializer};

/// A JSON array of the items `make` yields, serialized without collecting them.
pub(crate) struct Seq<F>(pub F);

impl<F, I> Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let items = (self.0)();
        let mut seq = serializer.serialize_seq(None)?;
        for item in items {
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

/// A tool result's text on the wires without an error flag (the OpenAI ones): the content, or
/// `Error: ` and the content for a failed call whose content does not already begin with
/// `Error:`. Written without building the string.
pub(crate) struct ToolText<'a> {
    pub content: &'a str,
    pub is_error: bool,
}

impl ToolText<'_> {
    fn prefixed(&self) -> bool {
        self.is_error && !self.content.starts_with("Error:")
    }
}

impl fmt::Display for ToolText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefixed() {
            f.write_str("Error: ")?;
        }
        f.write_str(self.content)
    }
}

impl Serialize for ToolText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.prefixed() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_str(self.content)
        }
    }
}

/// A tool call's arguments as the OpenAI wires carry them, a string holding JSON
/// ([`crate::ToolCall::arguments_text`]): an object without the model's own text is written
/// straight into the string (escaped as it is written), without building the text first.
pub(crate) struct ArgumentsText<'a>(pub &'a crate::ToolCall);

impl Serialize for ArgumentsText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.arguments_source() {
            Ok(text) => serializer.serialize_str(text),
            Err(object) => serializer.collect_str(object),
        }
    }
}

/// `"type"`'s value where a wire's object carries a fixed one (`"function"`, `"text"` …).
pub(crate) type Kind = &'static str;

/// The instructions to send: `None` when absent or empty (every wire leaves them out then).
pub(crate) fn instructions(request: &crate::ModelRequest) -> Option<&str> {
    request.instructions.as_deref().filter(|s| !s.is_empty())
}

/// Appends one JSON value to `out`, a list of comma-separated values (the inside of an array):
/// a comma first unless `out` is empty.
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn push_item<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    item: &T,
) -> serde_json::Result<()> {
    if !out.is_empty() {
        out.push(b',');
    }
    serde_json::to_writer(&mut *out, item)
}

/// A wire's items for one transcript message, appended with [`push_item`] (zero or more: an
/// assistant message may become several items, or none).
pub(crate) type WriteItems = fn(&crate::Message, &mut Vec<u8>) -> serde_json::Result<()>;

/// Appends the items of `messages` (the part of a transcript not yet encoded) that no later
/// message can change to `items`, and returns how many of `messages` they settle (the next
/// encoding starts after them) and the encoding of the rest (an item the next message may
/// still change: Anthropic's last message, which a following user-side entry joins).
///
/// # Errors
/// serde_json's encoding error.
pub(crate) fn each_message(
    messages: &[std::sync::Arc<crate::Message>],
    items: &mut Vec<u8>,
    write: WriteItems,
) -> serde_json::Result<(usize, Vec<u8>)> {
    for message in messages {
        write(message, items)?;
    }
    Ok((messages.len(), Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_tools_text_is_prefixed_and_escaped_as_json() {
        let ok = ToolText {
            content: "a \"b\"\n",
            is_error: false,
        };
        let failed = ToolText {
            content: "no \"such\" file\n",
            is_error: true,
        };
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#""a \"b\"\n""#);
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#""Error: no \"such\" file\n""#
        );
        let already = ToolText {
            content: "Error: the arguments are not JSON",
            is_error: true,
        };
        assert_eq!(
            serde_json::to_string(&already).unwrap(),
            r#""Error: the arguments are not JSON""#
        );
    }

    #[test]
    fn arguments_are_the_same_string_written_straight_or_built() {
        use serde_json::json;
        for call in [
            crate::ToolCall::new(
                "c",
                "t",
                json!({"b": "x\"y\n\u{2028}", "a": [1, 2.5, null]}),
            ),
            crate::ToolCall::new("c", "t", json!("not an object")),
            crate::ToolCall {
                raw_arguments: Some("{\"a\": 1}".into()),
                ..crate::ToolCall::new("c", "t", json!({"a": 1}))
            },
        ] {
            assert_eq!(
                serde_json::to_string(&ArgumentsText(&call)).unwrap(),
                serde_json::to_string(&call.arguments_text()).unwrap()
            );
        }
    }

    #[test]
    fn a_seq_can_be_written_twice() {
        let items = [1, 2, 3];
        let seq = Seq(|| items.iter().map(|i| i * 2));
        assert_eq!(serde_json::to_string(&seq).unwrap(), "[2,4,6]");
        assert_eq!(serde_json::to_string(&seq).unwrap(), "[2,4,6]");
    }
}
