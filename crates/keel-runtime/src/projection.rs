//! The runtime's own projection of a session's journal ([`Projection`]): the model-visible
//! transcript, the script position, the compaction boundary, sessions rules granted by
//! approvals, each finished turn's [`TurnOutcome`], and the rows of the store's transcript
//! table the events add (see [`crate::transcript`]). [`crate::journal::Journal`] keeps one
//! beside the fold and applies every staged event to both.

use std::collections::HashMap;
use std::sync::Arc;

use keel_core::{
    ApprovalDecision, BudgetLimit, Event, EventBody, HookDecision, HookEvent, SessionState, StepId,
    TerminalReason, ToolCallId, TurnId, Usage, UsageByModel,
};
use keel_model::{Message, ReasoningItem, ToolCall};
use keel_store::TranscriptItem;
use serde_json::Value;

use crate::tokens::estimate_message_tokens;

/// How a finished turn ended, as journaled in `turn.finished`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnOutcome {
    /// The turn.
    pub turn_id: TurnId,
    /// Why it ended.
    pub terminal_reason: TerminalReason,
    /// The exhausted limit, for `budget_exhausted`.
    pub limit: Option<BudgetLimit>,
    /// Tokens used by the turn.
    pub usage: Usage,
    /// Cost of the turn, USD.
    pub cost_usd: f64,
    /// `usage` and `cost_usd` by the model that served each completed step (empty for
    /// journals written before `turn.finished` carried it).
    pub usage_by_model: UsageByModel,
    /// Steps sampled.
    pub num_steps: u32,
    /// Wall-clock duration, ms.
    pub duration_ms: u64,
    /// What went wrong, for `failed`.
    pub error: Option<String>,
    /// The model's last visible text in the turn (the answer, for `completed`).
    pub final_text: String,
}

/// The runtime's projection of the journal, folded alongside [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Projection {
    /// The model-visible transcript, oldest first: one `user` item per started turn, one
    /// `assistant` item per completed step (text and the calls of its final attempt), one `tool`
    /// item per call result, in the order the model proposed the calls. Shared (`Arc`): each
    /// step's snapshot and model request point at these items instead of copying them.
    pub items: Vec<Arc<Message>>,
    /// Estimated tokens of each item, computed once when the item is added.
    pub item_tokens: Vec<u64>,
    /// The provider's count of the last completed step's prompt, when it reported one: the
    /// exact context size at that step. Context estimates count it plus the items added since.
    pub anchor: Option<TokenAnchor>,
    /// Model responses the session consumed (the next request's `response_index`).
    pub position: u64,
    /// The last compaction summary.
    pub summary: Option<String>,
    /// First item after the last compaction boundary.
    pub first_kept: u64,
    /// Attempt in which each call was proposed.
    pub call_attempt: HashMap<ToolCallId, u32>,
    /// Calls of the last assistant item still waiting for their tool item, in proposal order.
    pending: Vec<ToolCallId>,
    /// Sum of finished turns' durations, ms.
    pub finished_turns_ms: u64,
    /// `context_overflow` attempt failures per turn.
    pub overflows: HashMap<TurnId, u32>,
    /// Last assistant text per turn.
    pub last_text: HashMap<TurnId, String>,
    /// Finished turns.
    pub finished: HashMap<TurnId, TurnOutcome>,
    /// (tool, arguments) of calls allowed for the rest of the session.
    pub allowed_for_session: Vec<(String, Value)>,
    /// The active turn's assistant items that have reasoning, journaled or sealed. Requests
    /// send it back only within the turn: `turn.finished` strips it from the turn's items.
    pub turn_reasoning: Vec<TurnReasoning>,
    /// Rows of the store's transcript table the folded events make: one per item, one per
    /// compaction (see [`crate::transcript`]).
    pub rows: u64,
    /// The transcript row of each item.
    pub item_rows: Vec<u64>,
    /// Whether [`Projection::apply`] keeps the rows it makes in `new_rows` (a journal turns it
    /// on once it has folded what the store holds; a plain fold makes none).
    pub(crate) record_rows: bool,
    /// Rows made and not yet taken (the journal stages them with their events).
    pub(crate) new_rows: Vec<TranscriptItem>,
}

/// An assistant item of the active turn with reasoning (see [`Projection::turn_reasoning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnReasoning {
    /// The step that produced it.
    pub step: StepId,
    /// Its index in [`Projection::items`].
    pub item: usize,
    /// Reasoning items sealed outside the journal for it (`step.completed.reasoning_sealed`).
    pub sealed: u32,
}

/// A provider-reported prompt size and the transcript it covered (see [`Projection::anchor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenAnchor {
    /// Prompt tokens the provider counted for the step (cache reads and writes included).
    pub input_tokens: u64,
    /// Transcript items that existed when the step was sampled (the request showed
    /// `first_kept..items`).
    pub items: usize,
    /// The compaction boundary at that step.
    pub first_kept: u64,
}

impl Projection {
    fn push(&mut self, m: Message, turn: Option<TurnId>) {
        self.item_tokens.push(estimate_message_tokens(&m));
        if self.record_rows {
            self.new_rows
                .push(crate::transcript::item_row(self.rows, turn, &m));
        }
        self.item_rows.push(self.rows);
        self.rows += 1;
        self.items.push(Arc::new(m));
    }

    fn flush_results(&mut self, state: &SessionState, turn: Option<TurnId>) {
        while let Some(id) = self.pending.first() {
            let Some((content, is_error)) = state.tool_calls.get(id).and_then(|c| c.result.clone())
            else {
                break;
            };
            let id = self.pending.remove(0);
            self.push(
                Message::Tool {
                    call_id: id.to_string(),
                    content,
                    is_error,
                },
                turn,
            );
        }
    }

    /// Folds `ev`, already applied to `state`.
    pub fn apply(&mut self, state: &SessionState, ev: &Event) {
        let c = &ev.correlation;
        match &ev.body {
            EventBody::TurnStarted {} => {
                if let Some(t) = c.turn_id.and_then(|t| state.turns.get(&t)) {
                    self.push(
                        Message::User {
                            content: t.input.clone(),
                        },
                        c.turn_id,
                    );
                }
            }
            EventBody::ToolCallProposed { .. } => {
                if let Some(id) = &c.tool_call_id {
                    self.call_attempt.insert(id.clone(), c.attempt.unwrap_or(1));
                }
            }
            EventBody::StepCompleted {
                text,
                reasoning,
                reasoning_sealed,
                responses_consumed,
                usage,
                usage_estimated,
                abandoned_calls,
                ..
            } => {
                self.position += responses_consumed;
                let Some(step) = c.step_id.and_then(|s| state.steps.get(&s)) else {
                    return;
                };
                // The step's request showed the items up to here (results are added after the
                // assistant item), from `first_kept` on.
                // An estimate is no count: the anchor stays a provider's.
                self.anchor = (usage.input_tokens > 0 && !usage_estimated).then_some(TokenAnchor {
                    input_tokens: usage.input_tokens,
                    items: self.items.len(),
                    first_kept: self.first_kept,
                });
                // The calls of the response: those of failed attempts it did not propose again
                // are not the model's in this response (nor are their results shown).
                let calls: Vec<ToolCallId> = step
                    .tool_calls
                    .iter()
                    .filter(|c| !abandoned_calls.contains(c))
                    .cloned()
                    .collect();
                let tool_calls = calls
                    .iter()
                    .filter_map(|id| state.tool_calls.get(id))
                    .map(|tc| {
                        ToolCall::new(tc.id.to_string(), tc.name.clone(), tc.arguments.clone())
                    })
                    .collect();
                // Journaled reasoning (`keep_reasoning`, older journals) is shown until the
                // turn ends; sealed reasoning replaces it in requests (`Journal::exact_reasoning`).
                let reasoning: Vec<ReasoningItem> = reasoning
                    .iter()
                    .filter_map(|v| serde_json::from_value::<ReasoningItem>(v.clone()).ok())
                    .collect();
                if let Some(t) = c.turn_id {
                    self.last_text.insert(t, text.clone());
                }
                if !reasoning.is_empty() || *reasoning_sealed > 0 {
                    self.turn_reasoning.push(TurnReasoning {
                        step: step.id,
                        item: self.items.len(),
                        sealed: *reasoning_sealed,
                    });
                }
                self.push(
                    Message::Assistant {
                        text: text.clone(),
                        tool_calls,
                        reasoning,
                    },
                    c.turn_id,
                );
                self.pending = calls;
                self.flush_results(state, c.turn_id);
            }
            EventBody::StepAttemptFailed {
                responses_consumed,
                error_kind,
                ..
            } => {
                self.position += responses_consumed;
                if error_kind == "context_overflow"
                    && let Some(t) = c.turn_id
                {
                    *self.overflows.entry(t).or_default() += 1;
                }
            }
            EventBody::StepFailed {
                responses_consumed, ..
            } => {
                self.position += responses_consumed;
            }
            EventBody::ToolCallFinished { .. } => self.flush_results(state, c.turn_id),
            // What a hook gives the model: a session_start or user_prompt_submit hook's
            // context after the input, a stop hook's reason to continue.
            EventBody::HookRan {
                hook,
                event,
                decision,
                reason,
                context,
                ..
            } => {
                let text = match (event, decision, context) {
                    (HookEvent::SessionStart | HookEvent::UserPromptSubmit, _, Some(context)) => {
                        Some(format!("[{} hook `{hook}`] {context}", event.as_str()))
                    }
                    (HookEvent::Stop, HookDecision::Continue, _) => Some(format!(
                        "The stop hook `{hook}` asked you to continue: {}",
                        reason.as_deref().unwrap_or("the task is not done yet")
                    )),
                    _ => None,
                };
                if let Some(content) = text {
                    self.push(Message::User { content }, c.turn_id);
                }
            }
            EventBody::ContextCompacted {
                summary,
                first_kept_item,
                ..
            } => {
                // The boundary's row: the first kept item's (or, keeping none, the next row
                // after this summary's).
                let first_kept_row = usize::try_from(*first_kept_item)
                    .ok()
                    .and_then(|i| self.item_rows.get(i).copied())
                    .unwrap_or(self.rows + 1);
                if self.record_rows {
                    self.new_rows.push(crate::transcript::summary_row(
                        self.rows,
                        c.turn_id,
                        summary,
                        first_kept_row,
                    ));
                }
                self.rows += 1;
                self.summary = Some(summary.clone());
                self.first_kept = *first_kept_item;
                self.anchor = None;
            }
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::AllowForSession,
                ..
            } => {
                if let Some(call) = c
                    .approval_id
                    .and_then(|a| state.approvals.get(&a))
                    .and_then(|a| state.tool_calls.get(&a.tool_call_id))
                {
                    self.allowed_for_session
                        .push((call.name.clone(), call.arguments.clone()));
                }
            }
            EventBody::TurnFinished {
                terminal_reason,
                limit,
                usage,
                cost_usd,
                usage_by_model,
                num_steps,
                duration_ms,
                error,
            } => {
                // Reasoning is for the turn's own tool loop; later turns are sent without it.
                for r in std::mem::take(&mut self.turn_reasoning) {
                    if let Some(Message::Assistant { reasoning, .. }) =
                        self.items.get_mut(r.item).map(Arc::make_mut)
                    {
                        reasoning.clear();
                    }
                }
                self.finished_turns_ms += duration_ms;
                if let Some(t) = c.turn_id {
                    self.finished.insert(
                        t,
                        TurnOutcome {
                            turn_id: t,
                            terminal_reason: *terminal_reason,
                            limit: *limit,
                            usage: *usage,
                            cost_usd: *cost_usd,
                            usage_by_model: usage_by_model.clone(),
                            num_steps: *num_steps,
                            duration_ms: *duration_ms,
                            error: error.clone(),
                            final_text: self.last_text.get(&t).cloned().unwrap_or_default(),
                        },
                    );
                }
            }
            _ => {}
        }
    }
}
