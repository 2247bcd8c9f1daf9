//! The scripted model: answers from a `.jsonl` script (docs/ARCHITECTURE.md, "Scripted model
//! format"), for tests, demos and replays.
//!
//! **One line, one model response.** Line `k` (1-based) answers the `k`-th model call of the
//! session: a response (`text`, `tool_calls`, `usage`, optional `delay_ms`) or an injected failure
//! (`{"error": {"kind": "overloaded", "retry_after_ms": 100}}`, optional `delay_ms`). A failed
//! attempt consumes its line like any response, so a step retried after an injected error gets
//! the next line, and a turn that failed on an error line leaves the next turn the line after it.
//! Blank lines at the end of the file are ignored; a blank line before the last response is an
//! error (it would shift every later response off its line number).
//!
//! **Position.** The session's position is [`ModelRequest::response_index`]: how many model
//! responses (successful or failed) it already completed, across all turns; the request gets line
//! `response_index + 1`. A re-sampled step (same index) gets the same line again. Only the
//! scripted model's own responses take positions: in a route with an HTTP primary and a scripted
//! fallback, the primary's failed attempts leave the script where it was. Without a
//! `response_index`, the model counts finished responses itself, starting from
//! [`ScriptedModel::starting_at`]. A cancelled call consumes nothing. Compaction requests
//! ([`RequestPurpose::Compaction`]) get a built-in summary and consume nothing. Past the last line
//! the model fails with `invalid_request` naming the file and its line count.
//!
//! **Ids.** A tool call without an `id` gets `call_<line>_<index>`: `line` is the 1-based line
//! number of its response, `index` the 0-based position of the call within the line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::client::{EventStream, ModelClient, event_stream};
use crate::error::{ErrorKind, ModelError, ProviderError};
use crate::stream::Sink;
use crate::types::{Message, ModelRequest, RequestPurpose, StopReason, StreamEvent, Usage};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<RawCall>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    error: Option<RawError>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_tokens: u64,
    #[serde(default)]
    cache_write_tokens: u64,
    #[serde(default)]
    reasoning_tokens: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawError {
    kind: ErrorKind,
    #[serde(default)]
    retry_after_ms: Option<u64>,
    #[serde(default)]
    message: Option<String>,
}

/// One scripted tool call, id resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedCall {
    /// The line's `id`, or `call_<line>_<index>`.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments object (`{}` when absent).
    pub arguments: Value,
}

/// What one script entry does.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptAction {
    /// Answer normally.
    Respond {
        /// Text (may be empty).
        text: String,
        /// Tool calls.
        tool_calls: Vec<ScriptedCall>,
        /// Usage from the line, if given.
        usage: Option<Usage>,
    },
    /// Fail with this error.
    Fail(ProviderError),
}

/// One parsed script entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptEntry {
    /// 1-based line number in the file.
    pub line: usize,
    /// Wait before answering, in ms.
    pub delay_ms: u64,
    /// What to do.
    pub action: ScriptAction,
}

/// A parsed script. Also drives the fake model server in keel-testkit.
#[derive(Debug, Clone)]
pub struct Script {
    name: String,
    /// Entry `i` is line `i + 1`.
    entries: Vec<ScriptEntry>,
}

impl Script {
    /// Parses script text; `name` (usually the file path) appears in errors.
    ///
    /// # Errors
    /// [`ModelError::ScriptLine`] naming the line of the first invalid entry.
    pub fn parse(name: &str, text: &str) -> Result<Self, ModelError> {
        let mut entries = Vec::new();
        let mut blank: Option<usize> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                blank = blank.or(Some(line));
                continue;
            }
            if let Some(blank) = blank {
                return Err(ModelError::ScriptLine {
                    path: name.to_string(),
                    line: blank,
                    message: "blank line: every line of a script is one model response (line k \
                              answers the k-th call), so only the end of the file may be blank"
                        .into(),
                });
            }
            let bad = |message: String| ModelError::ScriptLine {
                path: name.to_string(),
                line,
                message,
            };
            let parsed: RawLine = serde_json::from_str(raw).map_err(|e| bad(e.to_string()))?;
            let action = match parsed.error {
                Some(err) => {
                    if parsed.text.is_some() || !parsed.tool_calls.is_empty() {
                        return Err(bad(
                            "an error line cannot also carry text or tool_calls".into()
                        ));
                    }
                    let message = err.message.unwrap_or_else(|| {
                        format!("{} injected by script {name} line {line}", err.kind)
                    });
                    ScriptAction::Fail(
                        ProviderError::new(err.kind, message)
                            .with_retry_after_ms(err.retry_after_ms),
                    )
                }
                None => {
                    let mut calls = Vec::new();
                    for (index, call) in parsed.tool_calls.into_iter().enumerate() {
                        let arguments = call
                            .arguments
                            .unwrap_or_else(|| Value::Object(Default::default()));
                        if !arguments.is_object() {
                            return Err(bad(format!(
                                "tool call {index}: arguments must be a JSON object"
                            )));
                        }
                        let id = call.id.unwrap_or_else(|| format!("call_{line}_{index}"));
                        calls.push(ScriptedCall {
                            id,
                            name: call.name,
                            arguments,
                        });
                    }
                    let usage = parsed.usage.map(|u| Usage {
                        input_tokens: u.input_tokens,
                        output_tokens: u.output_tokens,
                        cache_read_tokens: u.cache_read_tokens,
                        cache_write_tokens: u.cache_write_tokens,
                        reasoning_tokens: u.reasoning_tokens,
                    });
                    ScriptAction::Respond {
                        text: parsed.text.unwrap_or_default(),
                        tool_calls: calls,
                        usage,
                    }
                }
            };
            entries.push(ScriptEntry {
                line,
                delay_ms: parsed.delay_ms.unwrap_or(0),
                action,
            });
        }
        Ok(Self {
            name: name.to_string(),
            entries,
        })
    }

    /// Reads and parses a script file.
    ///
    /// # Errors
    /// [`ModelError::ScriptIo`] or [`ModelError::ScriptLine`].
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::ScriptIo {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&shown, &text)
    }

    /// The name given at parse time (the file path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All entries in file order.
    pub fn entries(&self) -> &[ScriptEntry] {
        &self.entries
    }

    /// Number of lines (responses and injected errors; trailing blank lines not counted).
    pub fn line_count(&self) -> usize {
        self.entries.len()
    }

    /// The entry answering the session's model call number `position` (0-based, i.e. its
    /// [`ModelRequest::response_index`]): line `position + 1`.
    ///
    /// # Errors
    /// An `invalid_request` [`ProviderError`] naming the file and its line count when the script
    /// has no such line.
    pub fn entry_for(&self, position: u64) -> Result<&ScriptEntry, ProviderError> {
        usize::try_from(position)
            .ok()
            .and_then(|i| self.entries.get(i))
            .ok_or_else(|| self.exhausted(position))
    }

    /// The error for a request past the end of the script.
    pub fn exhausted(&self, position: u64) -> ProviderError {
        ProviderError {
            no_response: true,
            ..ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "scripted model exhausted: {} has {} lines and model response {} was requested",
                    self.name,
                    self.line_count(),
                    position.saturating_add(1)
                ),
            )
        }
    }
}

/// The model answering from a [`Script`].
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Arc<Script>,
    label: String,
    next: Arc<AtomicU64>,
}

impl ScriptedModel {
    /// A scripted model starting at the script's first response.
    pub fn new(script: Script) -> Self {
        Self::starting_at(script, 0)
    }

    /// A scripted model whose next response (when requests carry no `response_index`) is the
    /// `next_response`-th (0-based), e.g. after `keel resume` of a session that completed that
    /// many responses.
    pub fn starting_at(script: Script, next_response: u64) -> Self {
        let label = format!("scripted:{}", script.name());
        Self {
            script: Arc::new(script),
            label,
            next: Arc::new(AtomicU64::new(next_response)),
        }
    }

    /// Loads `path` and starts at its first response.
    ///
    /// # Errors
    /// See [`Script::from_file`].
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ModelError> {
        Ok(Self::new(Script::from_file(path)?))
    }

    /// The script.
    pub fn script(&self) -> &Script {
        &self.script
    }
}

/// The built-in summary the scripted model gives compaction requests.
pub fn scripted_summary(request: &ModelRequest) -> String {
    let users = request
        .messages
        .iter()
        .filter(|m| matches!(&***m, Message::User { .. }))
        .count();
    let tools = request
        .messages
        .iter()
        .filter(|m| matches!(&***m, Message::Tool { .. }))
        .count();
    format!(
        "Summary of the conversation so far: {} messages ({users} from the user, {tools} tool results).",
        request.messages.len()
    )
}

/// Splits text into word-sized deltas (each keeps its trailing whitespace), the granularity the
/// scripted model and the fake server stream at.
pub fn text_chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut in_space = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            in_space = true;
        } else if in_space {
            chunks.push(&text[start..i]);
            start = i;
            in_space = false;
        }
    }
    if start < text.len() {
        chunks.push(&text[start..]);
    }
    chunks
}

/// Rough token estimate (4 bytes a token, at least 1) for scripted usage when a line gives none.
fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4).max(1)
}

fn request_size(request: &ModelRequest) -> usize {
    let text: usize = request
        .messages
        .iter()
        .map(|m| match &**m {
            Message::User { content } | Message::Tool { content, .. } => content.len(),
            Message::Assistant {
                text, tool_calls, ..
            } => {
                text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            }
        })
        .sum();
    text + request.instructions.as_deref().map_or(0, str::len)
}

impl ModelClient for ScriptedModel {
    fn model(&self) -> &str {
        &self.label
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let this = self.clone();
        event_stream(move |mut sink| async move {
            this.run(request, &mut sink).await;
        })
    }

    fn consumes_responses(&self) -> bool {
        true
    }
}

impl ScriptedModel {
    async fn run(&self, request: ModelRequest, sink: &mut impl Sink) {
        if request.purpose == RequestPurpose::Compaction {
            let summary = scripted_summary(&request);
            let usage = Usage {
                input_tokens: estimate_tokens(request_size(&request)),
                output_tokens: estimate_tokens(summary.len()),
                ..Usage::default()
            };
            let events = [
                StreamEvent::TextDelta { text: summary },
                StreamEvent::Usage { usage },
                StreamEvent::Completed {
                    stop_reason: StopReason::EndTurn,
                    model: Some(self.label.clone()),
                },
            ];
            for e in events {
                if !sink.emit(e).await {
                    return;
                }
            }
            return;
        }
        let index = request
            .response_index
            .unwrap_or_else(|| self.next.load(Ordering::SeqCst));
        let entry = match self.script.entry_for(index) {
            Ok(entry) => entry.clone(),
            Err(error) => {
                let _ = sink.emit(StreamEvent::Error { error }).await;
                return;
            }
        };
        if entry.delay_ms > 0 {
            tokio::select! {
                biased;
                () = request.cancel.cancelled() => {
                    let _ = sink.emit(StreamEvent::Cancelled).await;
                    return;
                }
                () = tokio::time::sleep(Duration::from_millis(entry.delay_ms)) => {}
            }
        }
        let events = match entry.action {
            ScriptAction::Fail(error) => vec![StreamEvent::Error { error }],
            ScriptAction::Respond {
                text,
                tool_calls,
                usage,
            } => self.response_events(&request, text, tool_calls, usage),
        };
        for event in events {
            if request.cancel.is_cancelled() {
                let _ = sink.emit(StreamEvent::Cancelled).await;
                return;
            }
            // The line is consumed once its outcome is delivered (before the terminal event, so a
            // consumer that stops reading at it cannot skip the count).
            if event.is_terminal() && request.response_index.is_none() {
                self.next.store(index + 1, Ordering::SeqCst);
            }
            if !sink.emit(event).await {
                return;
            }
        }
    }

    fn response_events(
        &self,
        request: &ModelRequest,
        text: String,
        tool_calls: Vec<ScriptedCall>,
        usage: Option<Usage>,
    ) -> Vec<StreamEvent> {
        let mut events: Vec<StreamEvent> = text_chunks(&text)
            .into_iter()
            .map(|t| StreamEvent::TextDelta {
                text: t.to_string(),
            })
            .collect();
        for call in &tool_calls {
            let args = call.arguments.to_string();
            events.push(StreamEvent::ToolCallStart {
                id: call.id.clone(),
                name: call.name.clone(),
            });
            events.push(StreamEvent::ToolCallDelta {
                id: call.id.clone(),
                delta: args.clone(),
            });
            events.push(StreamEvent::ToolCallEnd {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                raw_arguments: args,
                invalid: None,
            });
        }
        let output_size = text.len()
            + tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.to_string().len())
                .sum::<usize>();
        let usage = usage.unwrap_or(Usage {
            input_tokens: estimate_tokens(request_size(request)),
            output_tokens: estimate_tokens(output_size),
            ..Usage::default()
        });
        events.push(StreamEvent::Usage { usage });
        let stop_reason = if tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        events.push(StreamEvent::Completed {
            stop_reason,
            model: Some(self.label.clone()),
        });
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = r#"{"text": "hello there", "usage": {"input_tokens": 10, "output_tokens": 5}}
{"error": {"kind": "overloaded", "retry_after_ms": 100}}
{"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}, {"id": "mine", "name": "read_file", "arguments": {"path": "a"}}], "delay_ms": 5}

"#;

    #[test]
    fn ids_are_call_line_index() {
        let script = Script::parse("s.jsonl", SCRIPT).unwrap();
        assert_eq!(script.line_count(), 3, "trailing blank lines do not count");
        let ScriptAction::Respond { tool_calls, .. } = &script.entry_for(2).unwrap().action else {
            panic!("expected a response")
        };
        assert_eq!(tool_calls[0].id, "call_3_0");
        assert_eq!(tool_calls[1].id, "mine");
    }

    #[test]
    fn position_k_is_line_k_plus_one_error_lines_included() {
        let script = Script::parse("s.jsonl", SCRIPT).unwrap();
        let lines: Vec<usize> = (0..3).map(|k| script.entry_for(k).unwrap().line).collect();
        assert_eq!(lines, [1, 2, 3]);
        assert!(matches!(
            script.entry_for(1).unwrap().action,
            ScriptAction::Fail(ProviderError {
                kind: ErrorKind::Overloaded,
                retry_after_ms: Some(100),
                ..
            })
        ));
        assert_eq!(script.entry_for(2).unwrap().delay_ms, 5);
    }

    #[test]
    fn exhausted_script_names_file_and_line_count() {
        let script = Script::parse("demo.jsonl", SCRIPT).unwrap();
        let err = script.entry_for(3).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
        assert_eq!(
            err.message,
            "scripted model exhausted: demo.jsonl has 3 lines and model response 4 was requested"
        );
        assert_eq!(
            script.entry_for(u64::MAX).unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }

    #[test]
    fn invalid_lines_are_reported_with_their_number() {
        let err = Script::parse("x.jsonl", "{\"text\": \"a\"}\n{\"txet\": 1}\n").unwrap_err();
        assert!(
            err.to_string().starts_with("script x.jsonl line 2:"),
            "{err}"
        );
        let err = Script::parse("x.jsonl", "{\"error\": {\"kind\": \"nope\"}}").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err = Script::parse("x.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("script x.jsonl line 2: blank line"),
            "{err}"
        );
        let err = Script::parse(
            "x.jsonl",
            "{\"error\": {\"kind\": \"timeout\"}, \"text\": \"a\"}",
        )
        .unwrap_err();
        assert!(err.to_string().contains("cannot also carry text"), "{err}");
    }

    #[test]
    fn text_chunks_keep_all_text() {
        let text = "Hello  there, world!\nok";
        assert_eq!(text_chunks(text).concat(), text);
        assert_eq!(
            text_chunks(text),
            vec!["Hello  ", "there, ", "world!\n", "ok"]
        );
        assert!(text_chunks("").is_empty());
    }
}
