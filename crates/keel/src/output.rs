//! What `run` and `resume` print: the headless JSONL stream with its closing `result` line, and
//! text for people (streamed, with a spinner per running tool call on a terminal).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use keel_core::{
    BudgetLimit, EventBody, SessionId, TerminalReason, ToolCallStatus, Usage, UsageByModel,
};
use keel_runtime::{DeltaKind, PendingAction, SubscriptionItem};
use serde::Serialize;

/// The last line of every `--output jsonl` run: why it ended and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultLine {
    /// Always `result`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The session (`null` when keel could not create one).
    pub session_id: Option<SessionId>,
    /// Why the run ended.
    pub terminal_reason: TerminalReason,
    /// The exhausted limit, for `budget_exhausted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<BudgetLimit>,
    /// Tokens of the turn.
    pub usage: Usage,
    /// Cost of the turn, USD.
    pub cost_usd: f64,
    /// `usage` and `cost_usd` by the model that served each step (`{model: {usage, cost_usd,
    /// steps}}`; a fallback's steps under the fallback); left out when no step completed.
    #[serde(skip_serializing_if = "UsageByModel::is_empty")]
    pub usage_by_model: UsageByModel,
    /// Steps sampled in the turn.
    pub num_steps: u32,
    /// Wall-clock duration, ms.
    pub duration_ms: u64,
    /// What went wrong, for `failed` (one line a person can act on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What a human must decide, for `requires_action`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingAction>,
    /// The model's last text of the turn.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub final_text: String,
}

impl ResultLine {
    /// A `failed` result without a session (keel could not start the run).
    pub fn startup_failure(error: String, duration_ms: u64) -> Self {
        Self {
            kind: "result",
            session_id: None,
            terminal_reason: TerminalReason::Failed,
            limit: None,
            usage: Usage::default(),
            cost_usd: 0.0,
            usage_by_model: UsageByModel::new(),
            num_steps: 0,
            duration_ms,
            error: Some(error),
            pending: Vec::new(),
            final_text: String::new(),
        }
    }
}

/// Receives what a run produces, in order.
pub trait Printer: Send {
    /// One subscription item (a durable event or a live delta).
    fn item(&mut self, item: &SubscriptionItem);
    /// A note for people (ignored by machine formats).
    fn note(&mut self, text: &str);
    /// What happened before the first item this printer sees (a resumed session), so that
    /// later events can be shown in context.
    fn seed(&mut self, _state: &keel_core::SessionState) {}
    /// The end of a run.
    fn result(&mut self, result: &ResultLine);
}

/// `--output jsonl`: every durable event as one JSON line, then the result line.
#[derive(Debug, Default)]
pub struct JsonlPrinter;

impl Printer for JsonlPrinter {
    fn item(&mut self, item: &SubscriptionItem) {
        if let SubscriptionItem::Event { event } = item
            && let Ok(line) = serde_json::to_string(event)
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }

    fn note(&mut self, _text: &str) {}

    fn result(&mut self, result: &ResultLine) {
        if let Ok(line) = serde_json::to_string(result) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

struct RunningCall {
    label: String,
    started: Instant,
    spinner: Option<ProgressBar>,
}

/// Text for people. On a terminal (`live`), model text streams as it arrives and each running
/// tool call shows a spinner, then its duration.
pub struct TextPrinter {
    live: bool,
    /// Text of the current step already shown from live deltas.
    streamed: String,
    /// Seq of the last `step.completed` shown: later text deltas of that step are stale.
    completed_seq: u64,
    at_line_start: bool,
    proposed: HashMap<String, String>,
    running: HashMap<String, RunningCall>,
}

impl std::fmt::Debug for TextPrinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextPrinter")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

/// Whether `c` must not reach a terminal raw: control characters other than newline and tab
/// (ESC, BEL, CR, C1 controls, …) would move the cursor, clear the screen or set the title.
fn is_unsafe(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` made safe for a terminal: ESC becomes `␛`, every other control character except
/// newline and tab becomes `\u{…}`. Untrusted output (model text, tool arguments and outputs,
/// stored prompts) stays data in every human-readable rendering; JSON output is not passed
/// through this.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\u{1b}' => out.push('␛'),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A writer that passes everything through [`visible`]; for human-readable listings.
#[derive(Debug)]
pub struct Visible<W: Write>(pub W);

impl<W: Write> Write for Visible<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(visible(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Shortens `text` to its first line and at most `max` characters, made [`visible`].
pub fn one_line(text: &str, max: usize) -> String {
    let text = visible(text);
    let first = text.lines().next().unwrap_or_default();
    let more = text.lines().nth(1).is_some();
    if first.chars().count() > max {
        format!("{}…", first.chars().take(max).collect::<String>())
    } else if more {
        format!("{first} …")
    } else {
        first.to_owned()
    }
}

impl TextPrinter {
    /// A printer; `live` streams deltas and draws spinners (for a terminal).
    pub fn new(live: bool) -> Self {
        Self {
            live,
            streamed: String::new(),
            completed_seq: 0,
            at_line_start: true,
            proposed: HashMap::new(),
            running: HashMap::new(),
        }
    }

    fn out(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(visible(text).as_bytes());
        let _ = out.flush();
        if let Some(last) = text.chars().last() {
            self.at_line_start = last == '\n';
        }
    }

    fn line(&mut self, text: &str) {
        if !self.at_line_start {
            self.out("\n");
        }
        self.out(&format!("{text}\n"));
    }

    fn event(&mut self, body: &EventBody, call: Option<&str>) {
        match body {
            EventBody::StepStarted { .. } => self.streamed.clear(),
            EventBody::StepCompleted { text, .. } => {
                // Deltas may have shown part of the text before the event arrived: show the rest.
                let streamed = std::mem::take(&mut self.streamed);
                match text.strip_prefix(streamed.as_str()) {
                    Some(rest) if !streamed.is_empty() => {
                        let rest = rest.trim_end().to_owned();
                        self.out(&rest);
                        if !self.at_line_start {
                            self.out("\n");
                        }
                    }
                    _ if !text.is_empty() => {
                        let text = text.clone();
                        self.line(text.trim_end());
                    }
                    _ => {}
                }
            }
            EventBody::StepAttemptFailed {
                error_kind,
                message,
                retry_in_ms,
                ..
            } => {
                let retry = retry_in_ms
                    .map(|ms| format!(", retrying in {ms} ms"))
                    .unwrap_or_default();
                self.line(&format!(
                    "! model {error_kind}: {}{retry}",
                    one_line(message, 160)
                ));
            }
            EventBody::ToolCallProposed {
                name, arguments, ..
            } => {
                if let Some(id) = call {
                    let args = one_line(&arguments.to_string(), 100);
                    self.proposed
                        .insert(id.to_owned(), format!("{name} {args}"));
                }
            }
            EventBody::ToolCallStarted {} => {
                let Some(id) = call else { return };
                let label = self
                    .proposed
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| id.to_owned());
                let spinner = self.live.then(|| {
                    if !self.at_line_start {
                        self.out("\n");
                    }
                    let pb = ProgressBar::new_spinner();
                    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                        pb.set_style(style);
                    }
                    pb.set_message(visible(&label).into_owned());
                    pb.enable_steady_tick(Duration::from_millis(100));
                    pb
                });
                self.running.insert(
                    id.to_owned(),
                    RunningCall {
                        label,
                        started: Instant::now(),
                        spinner,
                    },
                );
            }
            EventBody::ToolCallFinished {
                status,
                output,
                is_error,
            } => {
                let Some(id) = call else { return };
                let (label, took) = match self.running.remove(id) {
                    Some(r) => {
                        if let Some(pb) = r.spinner {
                            pb.finish_and_clear();
                        }
                        (r.label, Some(r.started.elapsed()))
                    }
                    None => (
                        self.proposed
                            .get(id)
                            .cloned()
                            .unwrap_or_else(|| id.to_owned()),
                        None,
                    ),
                };
                let mark = match status {
                    ToolCallStatus::Succeeded if !is_error => "✓",
                    ToolCallStatus::Succeeded | ToolCallStatus::Failed => "✗",
                    _ => "⊘",
                };
                let took = took
                    .map(|d| format!(" ({:.1}s)", d.as_secs_f64()))
                    .unwrap_or_default();
                let status_name = match status {
                    ToolCallStatus::Succeeded if !is_error => String::new(),
                    other => format!(
                        " [{}]",
                        serde_json::to_value(other)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    ),
                };
                self.line(&format!("{mark} {label}{took}{status_name}"));
                if *is_error || *status != ToolCallStatus::Succeeded {
                    self.line(&format!("  {}", one_line(output, 200)));
                }
            }
            EventBody::TurnCancelRequested { reason } => {
                self.line(&format!("⊘ cancelling the turn ({reason})"));
            }
            EventBody::ContextCompacted {
                tokens_before,
                tokens_after,
                ..
            } => self.line(&format!(
                "… context compacted ({tokens_before} → {tokens_after} tokens)"
            )),
            _ => {}
        }
    }
}

impl Printer for TextPrinter {
    fn item(&mut self, item: &SubscriptionItem) {
        match item {
            SubscriptionItem::Event { event } => {
                let call = event
                    .correlation
                    .tool_call_id
                    .as_ref()
                    .map(|c| c.as_str().to_owned());
                if matches!(event.body, EventBody::StepCompleted { .. }) {
                    self.completed_seq = event.seq;
                }
                self.event(&event.body, call.as_deref());
            }
            SubscriptionItem::Delta { delta } => {
                if let DeltaKind::Text { text } = &delta.kind
                    && self.live
                    && delta.after_seq >= self.completed_seq
                {
                    self.streamed.push_str(text);
                    self.out(text);
                }
            }
            SubscriptionItem::Gap { .. } => {}
        }
    }

    fn note(&mut self, text: &str) {
        self.line(text);
    }

    fn seed(&mut self, state: &keel_core::SessionState) {
        for call in state.tool_calls.values() {
            let args = one_line(&call.arguments.to_string(), 100);
            self.proposed
                .insert(call.id.as_str().to_owned(), format!("{} {args}", call.name));
        }
    }

    fn result(&mut self, r: &ResultLine) {
        for (_, call) in self.running.drain() {
            if let Some(pb) = call.spinner {
                pb.finish_and_clear();
            }
        }
        let session = r
            .session_id
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into());
        let limit = r
            .limit
            .and_then(|l| serde_json::to_value(l).ok())
            .and_then(|v| v.as_str().map(|s| format!(" ({s})")))
            .unwrap_or_default();
        self.line(&format!(
            "── {}{limit} · {} steps · {} tokens · ${:.4} · {:.1}s · session {session}",
            r.terminal_reason.as_str(),
            r.num_steps,
            r.usage.total_tokens(),
            r.cost_usd,
            Duration::from_millis(r.duration_ms).as_secs_f64(),
        ));
        if r.usage_by_model.len() > 1 {
            // More than one model served the turn (a fallback answered): say who spent what.
            let by: Vec<String> = r
                .usage_by_model
                .iter()
                .map(|(model, t)| {
                    format!(
                        "{model} {} steps {} tokens ${:.4}",
                        t.steps,
                        t.usage.total_tokens(),
                        t.cost_usd
                    )
                })
                .collect();
            self.line(&format!("   by model: {}", by.join(" · ")));
        }
        if let Some(e) = &r.error {
            self.line(&format!("error: {e}"));
        }
        for p in &r.pending {
            match p {
                PendingAction::Approval {
                    approval_id,
                    tool_name,
                    arguments,
                    ..
                } => self.line(&format!(
                    "needs approval: {tool_name} {}\n  keel approve {approval_id}   or   keel deny {approval_id} --reason TEXT\n  then: keel resume {session}",
                    one_line(&arguments.to_string(), 160)
                )),
                PendingAction::Effect {
                    operation_key,
                    tool_name,
                    ..
                } => self.line(&format!(
                    "outcome unknown: {tool_name} ({operation_key})\n  keel resolve {operation_key} --as committed|failed|retry\n  then: keel resume {session}"
                )),
            }
        }
        if r.terminal_reason == TerminalReason::Aborted {
            self.line(&format!("resume with: keel resume {session}"));
        }
    }
}
