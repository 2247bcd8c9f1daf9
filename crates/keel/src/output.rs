//! What `run` and `resume` print: the headless JSONL stream with its closing `result` line, and
//! text for people (streamed, with a spinner per running tool call on a terminal).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use keel_core::{
    BudgetLimit, EventBody, SessionId, StepId, TerminalReason, ToolCallStatus, Usage, UsageByModel,
};
use keel_runtime::{DeltaKind, PendingAction, SubscriptionItem};
use serde::Serialize;

mod text;
pub use text::*;

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
    /// The turn's limits (`tokens`, `cost`) its totals ended above. Limits are checked before
    /// each step, so the step that crosses one still finishes: a turn may end one step over
    /// (`completed` when that step ended it). Left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub over_limits: Vec<BudgetLimit>,
    /// `Some(false)` when this invocation ran no turn (a `keel resume` without a prompt whose
    /// last turn completed): the line then has the last turn's `terminal_reason` with this
    /// invocation's zero usage and own duration. Left out otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continued: Option<bool>,
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
            over_limits: Vec::new(),
            continued: None,
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
    /// A question is about to be asked on the terminal (an approval, also a sub-agent's while
    /// the parent's `spawn_agent` call runs): stop redrawing running calls' spinners, which
    /// would erase the question and what the user types.
    fn pause(&mut self) {}
    /// The question was answered: spinners of calls still running are drawn again.
    fn unpause(&mut self) {}
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
///
/// Ordering: a step's events are journaled together when the step ends, after the live text
/// deltas of its stream, and a read-only call the model proposed mid-stream may run (and be
/// journaled `tool_call.finished`) before its step's `step.completed`. So live text is matched
/// to its step by the deltas' `after_seq` (not by `step.started`, which arrives after them), and
/// without a terminal the lines of a step's calls wait until the step's text has been printed.
/// A delta can also overtake the events journaled before it (they reach a subscriber once
/// committed, or over the server's stream): it waits until they are shown.
pub struct TextPrinter {
    live: bool,
    /// Live text shown, as `(after_seq, text)` of each delta not yet matched to a step.
    streamed: Vec<(u64, String)>,
    /// Seq of the last `step.completed` shown: deltas produced before it are stale.
    completed_seq: u64,
    /// The highest event seq shown (or seeded): a delta produced after a later event waits in
    /// `early` until that event is shown, so text never lands on a running call's spinner
    /// line (whose redraw erases it) or before the line of the call it follows. A delta still
    /// waiting when the stream ends is not lost: its step's `step.completed` shows the text.
    seen_seq: u64,
    /// Deltas waiting for their events, as `(after_seq, text)`, oldest first.
    early: VecDeque<(u64, String)>,
    at_line_start: bool,
    proposed: HashMap<String, String>,
    running: HashMap<String, RunningCall>,
    /// Steps seen starting whose `step.completed` / `step.failed` has not come yet.
    open_steps: HashSet<StepId>,
    /// Without a terminal: lines of calls of an open step, printed after the step's text.
    held: Vec<(StepId, String)>,
    /// A question is on screen: no spinner is drawn ([`Printer::pause`]).
    paused: bool,
    out: Box<dyn Write + Send>,
}

impl std::fmt::Debug for TextPrinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextPrinter")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl TextPrinter {
    /// A printer to standard output; `live` streams deltas and draws spinners (for a terminal).
    pub fn new(live: bool) -> Self {
        Self::to_writer(live, Box::new(std::io::stdout()))
    }

    /// A printer to `out`.
    pub fn to_writer(live: bool, out: Box<dyn Write + Send>) -> Self {
        Self {
            live,
            streamed: Vec::new(),
            completed_seq: 0,
            seen_seq: 0,
            early: VecDeque::new(),
            at_line_start: true,
            proposed: HashMap::new(),
            running: HashMap::new(),
            open_steps: HashSet::new(),
            held: Vec::new(),
            paused: false,
            out,
        }
    }

    fn out(&mut self, text: &str) {
        let _ = self.out.write_all(visible(text).as_bytes());
        let _ = self.out.flush();
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

    /// A line about a call of `step`: held while the step's text is still to come (without a
    /// terminal), else printed.
    fn call_line(&mut self, step: Option<StepId>, text: String) {
        match step {
            Some(s) if !self.live && self.open_steps.contains(&s) => self.held.push((s, text)),
            _ => self.line(&text),
        }
    }

    /// Prints the held lines of `step` (every held line when `None`).
    fn release(&mut self, step: Option<StepId>) {
        let (now, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(s, _)| step.is_none_or(|step| *s == step));
        self.held = keep;
        for (_, text) in now {
            self.line(&text);
        }
    }

    /// Shows a text delta produced after event `after_seq`, unless its step was shown
    /// complete already.
    fn live_text(&mut self, after_seq: u64, text: &str) {
        if after_seq >= self.completed_seq {
            self.streamed.push((after_seq, text.to_owned()));
            self.out(text);
        }
    }

    /// The live text streamed before event `seq` (deltas produced before it was journaled),
    /// taken out of the buffer.
    fn streamed_before(&mut self, seq: u64) -> String {
        let (before, after): (Vec<_>, Vec<_>) = std::mem::take(&mut self.streamed)
            .into_iter()
            .partition(|(after_seq, _)| *after_seq < seq);
        self.streamed = after;
        before.into_iter().map(|(_, t)| t).collect()
    }

    /// A spinner for a running call labelled `label`, started `elapsed` ago (on a terminal
    /// only, and not while a question is on screen).
    fn spinner(&mut self, label: &str, elapsed: Duration) -> Option<ProgressBar> {
        if !self.live || self.paused {
            return None;
        }
        if !self.at_line_start {
            self.out("\n");
        }
        let pb = ProgressBar::new_spinner().with_elapsed(elapsed);
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
            pb.set_style(style);
        }
        pb.set_message(visible(label).into_owned());
        pb.enable_steady_tick(Duration::from_millis(100));
        Some(pb)
    }

    fn event(&mut self, seq: u64, body: &EventBody, step: Option<StepId>, call: Option<&str>) {
        match body {
            EventBody::StepStarted { .. } => {
                if let Some(s) = step {
                    self.open_steps.insert(s);
                }
            }
            EventBody::StepCompleted { text, .. } => {
                self.completed_seq = seq;
                // Live deltas may have shown the text (or part of it) already: show the rest.
                let shown = self.streamed_before(seq);
                let rest = unshown_rest(&shown, text).trim_end().to_owned();
                if !rest.is_empty() {
                    if shown.is_empty() {
                        self.line(&rest);
                    } else {
                        self.out(&rest);
                    }
                }
                if !self.at_line_start {
                    self.out("\n");
                }
                if let Some(s) = step {
                    self.open_steps.remove(&s);
                }
                self.release(step);
            }
            EventBody::StepFailed { .. } => {
                self.completed_seq = seq;
                // What the failed step streamed stays on screen, ended by a newline.
                let _ = self.streamed_before(seq);
                if !self.at_line_start {
                    self.out("\n");
                }
                if let Some(s) = step {
                    self.open_steps.remove(&s);
                }
                self.release(step);
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
                let spinner = self.spinner(&label, Duration::ZERO);
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
                self.call_line(step, format!("{mark} {label}{took}{status_name}"));
                if *is_error || *status != ToolCallStatus::Succeeded {
                    self.call_line(step, format!("  {}", one_line(output, 200)));
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
            EventBody::TurnFinished { .. } => self.release(None),
            // A hook that decided something says so; one that only observed stays quiet.
            EventBody::HookRan {
                hook,
                event,
                duration_ms,
                decision,
                reason,
                ..
            } if *decision != keel_core::HookDecision::None => {
                let reason = reason
                    .as_deref()
                    .map(|r| format!(": {}", one_line(r, 160)))
                    .unwrap_or_default();
                self.line(&format!(
                    "↪ hook {hook} ({}) {}{reason} ({duration_ms} ms)",
                    event.as_str(),
                    decision.as_str()
                ));
            }
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
                self.event(
                    event.seq,
                    &event.body,
                    event.correlation.step_id,
                    call.as_deref(),
                );
                self.seen_seq = self.seen_seq.max(event.seq);
                while let Some((after_seq, _)) = self.early.front()
                    && *after_seq <= self.seen_seq
                {
                    if let Some((after_seq, text)) = self.early.pop_front() {
                        self.live_text(after_seq, &text);
                    }
                }
            }
            SubscriptionItem::Delta { delta } => {
                if let DeltaKind::Text { text } = &delta.kind
                    && self.live
                {
                    if delta.after_seq > self.seen_seq {
                        self.early.push_back((delta.after_seq, text.clone()));
                    } else {
                        self.live_text(delta.after_seq, text);
                    }
                }
            }
            SubscriptionItem::Gap { .. } => {}
        }
    }

    fn note(&mut self, text: &str) {
        self.line(text);
    }

    fn seed(&mut self, state: &keel_core::SessionState) {
        self.seen_seq = self.seen_seq.max(state.version);
        for call in state.tool_calls.values() {
            let args = one_line(&call.arguments.to_string(), 100);
            self.proposed
                .insert(call.id.as_str().to_owned(), format!("{} {args}", call.name));
        }
    }

    fn pause(&mut self) {
        self.paused = true;
        for call in self.running.values_mut() {
            if let Some(pb) = call.spinner.take() {
                pb.finish_and_clear();
            }
        }
    }

    fn unpause(&mut self) {
        self.paused = false;
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in ids {
            let Some(call) = self.running.get(&id) else {
                continue;
            };
            let (label, elapsed) = (call.label.clone(), call.started.elapsed());
            let spinner = self.spinner(&label, elapsed);
            if let Some(call) = self.running.get_mut(&id) {
                call.spinner = spinner;
            }
        }
    }

    fn result(&mut self, r: &ResultLine) {
        self.release(None);
        for (_, call) in self.running.drain() {
            if let Some(pb) = call.spinner {
                pb.finish_and_clear();
            }
        }
        let session = r
            .session_id
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into());
        if r.continued == Some(false) {
            self.line(&format!(
                "nothing to continue: session {session}'s last turn ended {}; give a follow-up with: keel resume {session} \"…\"",
                r.terminal_reason.as_str()
            ));
            return;
        }
        let limit = r
            .limit
            .and_then(|l| serde_json::to_value(l).ok())
            .and_then(|v| v.as_str().map(|s| format!(" ({s})")))
            .unwrap_or_default();
        self.line(&format!(
            "── {}{limit} · {} · {} · ${:.4} · {:.1}s · session {session}",
            r.terminal_reason.as_str(),
            count(r.num_steps, "step"),
            count(r.usage.total_tokens(), "token"),
            r.cost_usd,
            Duration::from_millis(r.duration_ms).as_secs_f64(),
        ));
        if r.terminal_reason == TerminalReason::BudgetExhausted {
            self.line(&format!(
                "   {}; then: {} resume {session}",
                raise_hint(r.limit),
                hint_command()
            ));
        }
        if !r.over_limits.is_empty() {
            let names: Vec<String> = r
                .over_limits
                .iter()
                .filter_map(|l| serde_json::to_value(l).ok())
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            self.line(&format!(
                "   over the turn's {} limit: limits are checked before each step, and the step that crossed it finished",
                names.join(" and ")
            ));
        }
        if r.usage_by_model.len() > 1 {
            // More than one model served the turn (a fallback answered): say who spent what.
            let by: Vec<String> = r
                .usage_by_model
                .iter()
                .map(|(model, t)| {
                    format!(
                        "{} {} {} ${:.4}",
                        model_label(model),
                        count(t.steps, "step"),
                        count(t.usage.total_tokens(), "token"),
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
            let whose = subagent_label(p);
            match p {
                PendingAction::Approval {
                    approval_id,
                    tool_name,
                    arguments,
                    ..
                } => self.line(&format!(
                    "needs approval: {tool_name}{whose}\n{}\n  {k} approve {approval_id}   or   {k} deny {approval_id} --reason TEXT\n  then: {k} resume {session}",
                    approval_text(tool_name, arguments),
                    k = hint_command()
                )),
                PendingAction::Effect {
                    operation_key,
                    tool_name,
                    ..
                } => self.line(&format!(
                    "outcome unknown: {tool_name} ({operation_key}){whose}\n  {k} resolve {operation_key} --as committed|failed|retry\n  then: {k} resume {session}",
                    k = hint_command()
                )),
            }
        }
        if r.terminal_reason == TerminalReason::Aborted {
            self.line(&format!("resume with: {} resume {session}", hint_command()));
        }
    }
}

/// What to change to give a turn more of `limit` after it ended `budget_exhausted`: the
/// keel.toml key (and the `keel run` flag, where there is one). The limit may also be a
/// session or daily budget, set where it was given.
pub fn raise_hint(limit: Option<BudgetLimit>) -> String {
    let (what, how) = match limit {
        Some(BudgetLimit::Steps) => ("steps", "[budget] max_steps in keel.toml, or --max-steps N"),
        Some(BudgetLimit::Tokens) => ("tokens", "[budget] max_tokens in keel.toml"),
        Some(BudgetLimit::Cost) => (
            "cost",
            "[budget] max_cost_usd in keel.toml, or --max-cost-usd USD",
        ),
        Some(BudgetLimit::ToolCalls) => ("tool calls", "[budget] max_tool_calls in keel.toml"),
        Some(BudgetLimit::WallTime) => (
            "wall time",
            "[budget] timeout in keel.toml, or --timeout DURATION",
        ),
        None => ("a budget", "the [budget] section of keel.toml"),
    };
    format!(
        "the turn ran out of {what}: to allow more, raise {how} (a session or daily budget is raised where it was set)"
    )
}

/// `" (agent `NAME`, session ID)"` for a pending action of a sub-agent session (what the
/// run's session waits on in its child), empty for the session's own.
pub fn subagent_label(p: &PendingAction) -> String {
    p.subagent()
        .map(|s| format!(" (agent `{}`, session {})", s.agent, s.session_id))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
