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
/// `Error: ` and the content for a failed call. Written without building the string.
pub(crate) struct ToolText<'a> {
    pub content: &'a str,
    pub is_error: bool,
}

impl fmt::Display for ToolText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_error {
            f.write_str("Error: ")?;
        }
        f.write_str(self.content)
    }
}

impl Serialize for ToolText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_error {
            serializer.collect_str(self)
        } else {
            serializer.serialize_str(self.content)
        }
    }
}

/// `"type"`'s value where a wire's object carries a fixed one (`"function"`, `"text"` …).
pub(crate) type Kind = &'static str;

/// The instructions to send: `None` when absent or empty (every wire leaves them out then).
pub(crate) fn instructions(request: &crate::ModelRequest) -> Option<&str> {
    request.instructions.as_deref().filter(|s| !s.is_empty())
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
    }

    #[test]
    fn a_seq_can_be_written_twice() {
        let items = [1, 2, 3];
        let seq = Seq(|| items.iter().map(|i| i * 2));
        assert_eq!(serde_json::to_string(&seq).unwrap(), "[2,4,6]");
        assert_eq!(serde_json::to_string(&seq).unwrap(), "[2,4,6]");
    }
}
