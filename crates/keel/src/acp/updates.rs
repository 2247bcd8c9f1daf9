//! Keel's session events as ACP `session/update` notifications, and Keel's terminal reasons as
//! ACP stop reasons.
//!
//! Live, model text and reasoning come from the runtime's deltas (`agent_message_chunk`,
//! `agent_thought_chunk`) and a step's `step.completed` adds only what the deltas did not show;
//! replayed (`session/load`), the journal alone gives the same updates: each turn's input as a
//! `user_message_chunk`, each step's text and reasoning, each tool call. A tool call is a
//! `tool_call` when proposed (with its kind, the files it touches as locations, and for
//! `edit_file` / `write_file` the change as a diff) and a `tool_call_update` when it starts
//! (`in_progress`) and finishes (`completed` / `failed`, with its output).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agent_client_protocol as acp;
use keel_core::{BudgetLimit, Event, EventBody, TerminalReason, ToolCallStatus};
use keel_runtime::{DeltaKind, SubscriptionItem};
use serde_json::{Value, json};

/// The most characters of a tool's output an update carries (the journal keeps it all).
const OUTPUT_CHARS: usize = 4000;

/// An update from its wire form (`{"sessionUpdate": …, …}`); `None` when the schema rejects it
/// (a bug here, logged).
pub fn update(wire: Value) -> Option<acp::SessionUpdate> {
    match serde_json::from_value(wire.clone()) {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!("acp: not a session update ({e}): {wire}");
            None
        }
    }
}

/// A text chunk of kind `kind` (`agent_message_chunk`, `agent_thought_chunk`,
/// `user_message_chunk`), its control characters replaced ([`printable`]).
pub fn chunk(kind: &str, text: &str) -> Option<acp::SessionUpdate> {
    update(json!({"sessionUpdate": kind, "content": {"type": "text", "text": printable(text)}}))
}

/// `text` with its control characters (C0, DEL and C1: ANSI escapes, carriage returns,
/// backspaces) replaced by U+FFFD, except `\n` and `\t`: what a tool prints (or a model
/// repeats) cannot rewrite what the editor shows (attack review of issue 17).
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// ACP's tool kind of a Keel tool: what an editor shows for it.
pub fn tool_kind(name: &str) -> &'static str {
    match name {
        "read_file" | "memory_read" => "read",
        "write_file" | "edit_file" | "memory_write" => "edit",
        "list_dir" | "glob" | "grep" | "memory_search" => "search",
        "shell" => "execute",
        "spawn_agent" => "think",
        _ if name.starts_with("mcp__") => "other",
        _ => "other",
    }
}

/// A one-line title of a call for people.
pub fn title(name: &str, args: &Value) -> String {
    let s = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default();
    let t = match name {
        "read_file" => format!("Read {}", s("path")),
        "write_file" => format!("Write {}", s("path")),
        "edit_file" => format!("Edit {}", s("path")),
        "list_dir" => format!("List {}", s("path")),
        "glob" => format!("Find {}", s("pattern")),
        "grep" => format!("Search {}", s("pattern")),
        "shell" => format!("Run `{}`", s("command")),
        _ => name.to_owned(),
    };
    one_line(&t, TITLE_MAX_CHARS)
}

/// The longest title, characters; a longer one ends in `…` (the call's content shows it all).
const TITLE_MAX_CHARS: usize = 200;

/// `text` on one line for a title: runs of whitespace (newlines included) as one space, other
/// control characters (ANSI escapes) as U+FFFD, cut at `max` characters ending in `…` — a
/// command padded with spaces or newlines cannot hide its tail in a permission prompt.
fn one_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(' ');
        }
        space = false;
        out.push(if c.is_control() { '\u{FFFD}' } else { c });
    }
    if out.chars().count() > max {
        let mut cut: String = out.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        out
    }
}

/// The files a call touches, absolute (as ACP asks), with the first line read when known.
pub fn locations(workspace: &Path, args: &Value) -> Vec<Value> {
    let Some(path) = args.get("path").and_then(Value::as_str) else {
        return Vec::new();
    };
    let mut loc = json!({"path": absolute(workspace, path)});
    if let Some(line) = args.get("offset").and_then(Value::as_u64) {
        loc["line"] = json!(line.max(1));
    }
    vec![loc]
}

fn absolute(workspace: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_owned()
    } else {
        workspace.join(p)
    }
}

/// Most bytes of a file's current text read for a `write_file` diff preview.
const PREVIEW_MAX_BYTES: u64 = 1 << 20;

/// The current text of the file a `write_file` at `path` would replace, for its diff preview:
/// only a regular file inside the workspace ([`keel_tools::workspace::Workspace::resolve`]),
/// read without following a symlink or blocking (a FIFO, a device), at most
/// [`PREVIEW_MAX_BYTES`], UTF-8. Anything else previews as a new file (`None`). The preview is
/// built before policy decides, in every mode, so it reads nothing the call itself could not
/// (attack review of issue 17: a proposed write to a FIFO hung the agent, and one to
/// `/proc/self/environ` sent its provider keys to the editor).
fn current_text(workspace: &Path, path: &str) -> Option<String> {
    let ws = keel_tools::workspace::Workspace::new(workspace).ok()?;
    let resolved = ws.resolve(path).ok()?;
    let bytes =
        keel_tools::files::read_regular_file_nofollow(&resolved.absolute, PREVIEW_MAX_BYTES)
            .ok()?;
    String::from_utf8(bytes).ok()
}

/// What a pending call shows beside its title: the diff of an edit ([`diff`]) or the whole
/// command of a shell call (the title is one cut line), in a code fence longer than any run of
/// backticks in it (a command's own ```` ``` ```` does not end the fence). Control characters
/// are replaced ([`printable`]; a diff keeps the `\r` of its `\r\n` line ends).
pub fn content(workspace: &Path, name: &str, args: &Value) -> Vec<Value> {
    if name == "shell"
        && let Some(command) = args.get("command").and_then(Value::as_str)
    {
        return vec![json!({
            "type": "content",
            "content": {"type": "text", "text": fenced("sh", &printable(command))},
        })];
    }
    diff(workspace, name, args).into_iter().collect()
}

/// `text` in a Markdown code fence of `info`'s language, the fence one backtick longer than
/// the longest run of backticks in `text` (three at least).
pub fn fenced(info: &str, text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat((longest + 1).max(3));
    format!("{fence}{info}\n{text}\n{fence}")
}

/// [`printable`], keeping a `\r` that ends a line (`\r\n`): a diff of a file with Windows line
/// ends stays that diff.
fn printable_lines(text: &str) -> String {
    text.split("\r\n")
        .map(printable)
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// The change an edit proposes, as ACP diff content: `edit_file`'s old and new string,
/// `write_file`'s new content over the file's current text (none for a new file; see
/// [`current_text`]).
pub fn diff(workspace: &Path, name: &str, args: &Value) -> Option<Value> {
    let raw = args.get("path")?.as_str()?;
    let path = absolute(workspace, raw);
    match name {
        "edit_file" => Some(json!({
            "type": "diff",
            "path": path,
            "oldText": printable_lines(args.get("old_string")?.as_str()?),
            "newText": printable_lines(args.get("new_string")?.as_str()?),
        })),
        "write_file" => Some(json!({
            "type": "diff",
            "path": path,
            "oldText": current_text(workspace, raw).map(|t| printable_lines(&t)),
            "newText": printable_lines(args.get("content")?.as_str()?),
        })),
        _ => None,
    }
}

/// The `tool_call` of a proposed call (status `pending`).
pub fn tool_call(workspace: &Path, id: &str, name: &str, args: &Value) -> Value {
    json!({
        "sessionUpdate": "tool_call",
        "toolCallId": id,
        "title": title(name, args),
        "kind": tool_kind(name),
        "status": "pending",
        "locations": locations(workspace, args),
        "content": content(workspace, name, args),
        "rawInput": args,
    })
}

/// Turns session items into updates: remembers what live deltas showed of the open step.
#[derive(Debug)]
pub struct Mapper {
    workspace: PathBuf,
    /// Live text shown since the last `step.completed`.
    streamed: String,
    /// Live reasoning shown since then.
    thought: bool,
    /// Replaying the journal (no deltas; turn inputs are shown).
    replay: bool,
    names: HashMap<String, String>,
    /// The highest event seq seen: a delta produced after a later event waits in `early`
    /// until that event is shown (a step's text never overtakes the previous call's result).
    seen_seq: u64,
    early: std::collections::VecDeque<keel_runtime::Delta>,
    /// Seq of the last `step.completed` / `step.failed` shown: a delta produced before it
    /// that arrives only now is stale (its step's text was shown whole).
    completed_seq: u64,
    /// The updates of the open step's calls, held: the journal has a step's
    /// `tool_call.proposed` before its `step.completed`, which carries the text the model
    /// wrote before them, and a read-only call proposed mid-stream may start and finish before
    /// it; they are shown after that text (when the deltas did not show it first — they can
    /// lag behind the events under load — or on replay).
    proposed: Vec<acp::SessionUpdate>,
    /// A `step.started` was shown and its `step.completed` / `step.failed` not yet.
    step_open: bool,
    /// Calls whose updates are held in `proposed` until the open step's text is shown.
    held_calls: std::collections::HashSet<String>,
}

impl Mapper {
    /// A mapper for a session working in `workspace`; `replay` for `session/load`.
    pub fn new(workspace: PathBuf, replay: bool) -> Self {
        Self {
            workspace,
            streamed: String::new(),
            thought: false,
            replay,
            names: HashMap::new(),
            seen_seq: 0,
            early: std::collections::VecDeque::new(),
            completed_seq: 0,
            proposed: Vec::new(),
            step_open: false,
            held_calls: std::collections::HashSet::new(),
        }
    }

    /// The updates one subscription item gives.
    pub fn item(&mut self, item: &SubscriptionItem) -> Vec<acp::SessionUpdate> {
        match item {
            SubscriptionItem::Event { event } => {
                // Deltas produced before this event first (a step's text before its
                // `step.completed`), then the event, then those that waited for it.
                let mut out = self.flush(event.seq.saturating_sub(1));
                out.extend(self.event(event));
                self.seen_seq = self.seen_seq.max(event.seq);
                out.extend(self.flush(self.seen_seq));
                out
            }
            SubscriptionItem::Delta { delta } if delta.after_seq > self.seen_seq => {
                self.early.push_back(delta.clone());
                Vec::new()
            }
            SubscriptionItem::Delta { delta } => self.delta(delta),
            SubscriptionItem::Gap { .. } => Vec::new(),
        }
    }

    /// Sets the last journal version already shown (the subscription starts after it).
    pub fn after(mut self, seq: u64) -> Self {
        self.seen_seq = seq;
        self
    }

    fn flush(&mut self, upto: u64) -> Vec<acp::SessionUpdate> {
        let mut out = Vec::new();
        while self.early.front().is_some_and(|d| d.after_seq <= upto) {
            if let Some(d) = self.early.pop_front() {
                out.extend(self.delta(&d));
            }
        }
        out
    }

    fn delta(&mut self, delta: &keel_runtime::Delta) -> Vec<acp::SessionUpdate> {
        if delta.after_seq < self.completed_seq {
            return Vec::new();
        }
        match &delta.kind {
            DeltaKind::Text { text } => {
                self.streamed.push_str(text);
                let mut out: Vec<_> = chunk("agent_message_chunk", text).into_iter().collect();
                // The open step's text is shown: the calls it proposed may follow it.
                out.append(&mut self.proposed);
                self.held_calls.clear();
                out
            }
            DeltaKind::Reasoning { text } => {
                self.thought = true;
                chunk("agent_thought_chunk", text).into_iter().collect()
            }
            _ => Vec::new(),
        }
    }

    /// The updates one journal event gives.
    pub fn event(&mut self, event: &Event) -> Vec<acp::SessionUpdate> {
        let call = event
            .correlation
            .tool_call_id
            .as_ref()
            .map(|c| c.as_str().to_owned());
        let mut out = Vec::new();
        // Held while the open step's text is not shown: its proposals, and what its held
        // calls do next (started, finished) in journal order.
        let held = self.step_open
            && (matches!(event.body, EventBody::ToolCallProposed { .. })
                && self.streamed.is_empty()
                || call.as_ref().is_some_and(|c| self.held_calls.contains(c)));
        if !held
            && !matches!(
                event.body,
                EventBody::ToolCallProposed { .. } | EventBody::StepCompleted { .. }
            )
        {
            out.append(&mut self.proposed);
            self.held_calls.clear();
        }
        if held {
            if let Some(c) = &call {
                self.held_calls.insert(c.clone());
            }
            let mut updates = self.event_updates(event, call);
            if matches!(event.body, EventBody::ToolCallProposed { .. }) {
                return updates;
            }
            self.proposed.append(&mut updates);
            return Vec::new();
        }
        out.extend(self.event_updates(event, call));
        out
    }

    /// The updates `event` gives of itself (`call`: its tool call id); a proposal's
    /// `tool_call` goes to `proposed`, shown after the step's text.
    fn event_updates(&mut self, event: &Event, call: Option<String>) -> Vec<acp::SessionUpdate> {
        let mut out = Vec::new();
        match &event.body {
            EventBody::StepStarted { .. } => self.step_open = true,
            EventBody::TurnQueued { input, .. } if self.replay => {
                out.extend(chunk("user_message_chunk", input));
            }
            EventBody::StepCompleted {
                text, reasoning, ..
            } => {
                if !self.thought {
                    for r in reasoning {
                        if let Some(t) = reasoning_text(r) {
                            out.extend(chunk("agent_thought_chunk", &t));
                        }
                    }
                }
                let rest = text.strip_prefix(self.streamed.as_str()).unwrap_or(text);
                if !rest.is_empty() && (self.streamed.is_empty() || rest.len() < text.len()) {
                    out.extend(chunk("agent_message_chunk", rest));
                }
                self.streamed.clear();
                self.thought = false;
                self.completed_seq = event.seq;
                self.step_open = false;
                out.append(&mut self.proposed);
                self.held_calls.clear();
            }
            EventBody::StepFailed { .. } => {
                self.streamed.clear();
                self.thought = false;
                self.completed_seq = event.seq;
                self.step_open = false;
            }
            EventBody::ToolCallProposed {
                name, arguments, ..
            } => {
                if let Some(id) = call {
                    self.names.insert(id.clone(), name.clone());
                    let mut u = tool_call(&self.workspace, &id, name, arguments);
                    if self.replay && name == "write_file" {
                        // The file's text now is not what the write replaced: the diff shows
                        // no old text (unknown) rather than the new text twice.
                        if let Some(Value::Object(d)) = u.pointer_mut("/content/0") {
                            d.insert("oldText".into(), Value::Null);
                        }
                    }
                    self.proposed.extend(update(u));
                }
            }
            EventBody::ToolCallStarted {} => {
                if let Some(id) = call {
                    out.extend(update(json!({
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": id,
                        "status": "in_progress",
                    })));
                }
            }
            EventBody::ToolCallFinished {
                status,
                output,
                is_error,
            } => {
                if let Some(id) = call {
                    let failed = *is_error || *status != ToolCallStatus::Succeeded;
                    let text = printable(&output.chars().take(OUTPUT_CHARS).collect::<String>());
                    out.extend(update(json!({
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": id,
                        "status": if failed { "failed" } else { "completed" },
                        "content": [{"type": "content", "content": {"type": "text", "text": text}}],
                        "rawOutput": {"status": status, "output": text},
                    })));
                }
            }
            _ => {}
        }
        out
    }
}

/// The text of one journaled reasoning item (`{"text": …}` or a `summary` list of them).
fn reasoning_text(item: &Value) -> Option<String> {
    if let Some(t) = item.get("text").and_then(Value::as_str) {
        return Some(t.to_owned());
    }
    let parts: Vec<&str> = item
        .get("summary")?
        .as_array()?
        .iter()
        .filter_map(|s| s.get("text").and_then(Value::as_str))
        .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// How a turn ends for the editor: a stop reason with the last message that says why, or a
/// JSON-RPC error carrying Keel's reason (README, "Editors (ACP)", has the table).
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// `session/prompt` answers with this stop reason, after `message` (if any) as an
    /// `agent_message_chunk`.
    Stop(acp::StopReason, Option<String>),
    /// `session/prompt` answers with a JSON-RPC error (code -32603, `data.terminal_reason`).
    Error(String),
}

/// The stop reason of a turn that ended with `reason`: `limit` the budget limit hit,
/// `last_stop` the last step's model stop reason, `failure` the last failed step's error kind,
/// `error` the turn's error.
pub fn ending(
    reason: TerminalReason,
    limit: Option<BudgetLimit>,
    last_stop: Option<&str>,
    failure: Option<&str>,
    error: Option<&str>,
) -> Ending {
    use acp::StopReason as S;
    let why = |s: String| Some(s);
    match reason {
        TerminalReason::Completed if matches!(last_stop, Some("max_tokens" | "length")) => {
            Ending::Stop(
                S::MaxTokens,
                why("\n\n(keel: the model reached its output token limit)".into()),
            )
        }
        TerminalReason::Completed if matches!(last_stop, Some("refusal" | "content_filter")) => {
            Ending::Stop(
                S::Refusal,
                why("\n\n(keel: the model refused, or the provider's content filter stopped it)".into()),
            )
        }
        TerminalReason::Completed => Ending::Stop(S::EndTurn, None),
        TerminalReason::Aborted => Ending::Stop(
            S::Cancelled,
            why("\n\n(keel: the turn was cancelled)".into()),
        ),
        TerminalReason::BudgetExhausted => {
            let limit = limit.map_or("a".to_owned(), |l| {
                serde_json::to_value(l)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            });
            let stop = if limit == "tokens" {
                S::MaxTokens
            } else {
                S::MaxTurnRequests
            };
            Ending::Stop(
                stop,
                why(format!(
                    "\n\n(keel: the turn stopped at its {limit} budget; raise it in keel.toml [budget])"
                )),
            )
        }
        TerminalReason::LoopDetected => Ending::Stop(
            S::MaxTurnRequests,
            why("\n\n(keel: the model repeated the same tool calls; the turn was stopped)".into()),
        ),
        TerminalReason::Failed if failure == Some("content_filter") => Ending::Stop(
            S::Refusal,
            why("\n\n(keel: the provider's content filter refused the response)".into()),
        ),
        TerminalReason::Failed => Ending::Error(format!(
            "the turn failed: {}",
            error.unwrap_or("no error recorded")
        )),
        TerminalReason::PromptTooLong => Ending::Error(format!(
            "the prompt is too long for the model's context window even after compaction{}",
            error.map(|e| format!(": {e}")).unwrap_or_default()
        )),
        TerminalReason::RequiresAction => Ending::Error(
            "the turn waits on a decision the editor cannot give (an effect whose outcome is unknown): `keel resolve`, then prompt again".into(),
        ),
    }
}

#[cfg(test)]
mod tests;
