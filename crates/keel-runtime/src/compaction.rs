//! The compaction phase: older transcript summarized behind a boundary.
//!
//! The summary is a model call of its own (`RequestPurpose::Compaction`, which takes no
//! scripted position); the boundary is the first transcript item kept. After a provider
//! overflow only the newest item group is kept. Failures are counted per turn; the planner
//! ends the turn `prompt_too_long` when compaction cannot bring the context under the window.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use keel_core::{Correlation, EventBody, TurnId, TurnStatus};
use keel_model::{ErrorKind, Message, ModelRequest, RequestPurpose};

use crate::admission::Admission;
use crate::background::{lock, phase_item};
use crate::context::boundaries;
use crate::driver::Runner;
use crate::error::Result;

impl Runner {
    /// Summarizes older transcript behind a boundary (`context.compacted`). `aggressive` keeps
    /// only the latest item group (after a provider overflow). A compaction that fails is
    /// counted; the planner ends the turn `prompt_too_long` when too many did.
    pub(crate) async fn compact(&self, turn: TurnId, aggressive: bool) -> Result<()> {
        let status = self
            .read(|j| j.state.turns.get(&turn).map(|t| t.status))
            .await;
        if status != Some(TurnStatus::Compacting) {
            self.stage(vec![phase_item(turn, TurnStatus::Compacting)])
                .await?;
        }
        let hooks = self.pre_compact_hooks(turn, aggressive).await;
        self.stage(hooks).await?;
        let snapshot = {
            let j = self.active.journal.lock().await;
            self.project(&j)?
        };
        let (from, cands, items, tokens, prev) = self
            .read(|j| {
                (
                    j.proj.first_kept,
                    boundaries(&j.proj, j.proj.first_kept),
                    j.proj.items.clone(),
                    j.proj.item_tokens.clone(),
                    j.proj.summary.clone(),
                )
            })
            .await;
        let target = (self.limits().context_window_tokens as f64 * self.config.compact_at_fraction
            / 2.0) as u64;
        let keep_from = if aggressive {
            cands.last().copied()
        } else {
            cands
                .iter()
                .copied()
                .find(|c| {
                    tokens[usize::try_from(*c).unwrap_or(usize::MAX).min(tokens.len())..]
                        .iter()
                        .sum::<u64>()
                        <= target
                })
                .or_else(|| cands.last().copied())
        };
        let Some(keep_from) = keep_from else {
            return self.compaction_failed(turn).await;
        };
        let lo = usize::try_from(from).unwrap_or(0);
        let hi = usize::try_from(keep_from).unwrap_or(0).min(items.len());
        let mut input: Vec<Arc<Message>> = items[lo..hi].to_vec();
        loop {
            let position = self.read(|j| j.proj.position).await;
            let request = ModelRequest {
                cancel: self.turn_token().child_token(),
                timeouts: self.model_timeouts(),
                ..summary_request(prev.as_deref(), &input, None, position)
            };
            // Admitted under the tenant's token rate like a step (one reservation for the whole
            // call); a stopped wait leaves the turn compacting, planned again by the turn loop.
            let context = request
                .messages
                .iter()
                .map(|m| crate::tokens::estimate_message_tokens(m))
                .sum::<u64>()
                + request
                    .instructions
                    .as_deref()
                    .map_or(0, crate::tokens::estimate_tokens);
            let projected = self.projected_tokens(context, request.sampling.max_tokens);
            let mut reservation = match self.admit(projected, &request.cancel).await? {
                Admission::Admitted(r) => r,
                Admission::Stopped => return Ok(()),
            };
            let resp = keel_model::collect(
                self.model.stream(request),
                self.model.model(),
                &self.rt.options.prices,
            )
            .await;
            let used = resp
                .usage
                .iter()
                .map(|u| u.usage.input_tokens.saturating_add(u.usage.output_tokens))
                .fold(0u64, u64::saturating_add);
            self.settle_tokens(&mut reservation, used).await;
            match resp.outcome {
                keel_model::Outcome::Completed { .. } => {
                    let summary = resp.text;
                    let after: u64 = tokens[hi..].iter().sum::<u64>()
                        + crate::context::estimate_tokens(&summary);
                    self.stage(vec![
                        (
                            Correlation::turn(turn),
                            EventBody::ContextCompacted {
                                summary,
                                first_kept_item: keep_from,
                                tokens_before: snapshot.estimated_tokens,
                                tokens_after: after,
                                requested: false,
                                focus: None,
                            },
                        ),
                        phase_item(turn, TurnStatus::Sampling),
                    ])
                    .await?;
                    return Ok(());
                }
                keel_model::Outcome::Cancelled => return Ok(()),
                keel_model::Outcome::Failed { error } => {
                    if self.count_compaction_failure(turn).await {
                        return Ok(());
                    }
                    if error.kind == ErrorKind::ContextOverflow && !input.is_empty() {
                        // Drop the oldest item group first.
                        let mut cut = 1;
                        while cut < input.len() && matches!(*input[cut], Message::Tool { .. }) {
                            cut += 1;
                        }
                        input.drain(..cut);
                        continue;
                    }
                    return self.back_to_sampling().await;
                }
            }
        }
    }

    /// Counts a failed compaction of `turn`; true when the turn has had too many (the planner
    /// ends it `prompt_too_long`).
    async fn count_compaction_failure(&self, turn: TurnId) -> bool {
        let local = {
            let mut f = lock(&self.compaction_failures);
            let n = f.entry(turn).or_default();
            *n += 1;
            *n
        };
        let overflows = self
            .read(|j| j.state.turns.get(&turn).map_or(0, |t| t.overflows))
            .await;
        local + overflows.saturating_sub(1) >= self.limits().max_compaction_failures
    }

    async fn compaction_failed(&self, turn: TurnId) -> Result<()> {
        if self.count_compaction_failure(turn).await {
            return Ok(());
        }
        self.back_to_sampling().await
    }

    /// A compaction that did not happen: sample on without compacting again before the step.
    async fn back_to_sampling(&self) -> Result<()> {
        self.skip_compaction.store(true, Ordering::SeqCst);
        let turn = self.read(|j| j.state.active_turn).await;
        if let Some(turn) = turn {
            self.stage(vec![phase_item(turn, TurnStatus::Sampling)])
                .await?;
        }
        Ok(())
    }
}

/// The request for a summary of `input` (the transcript items behind the new boundary), after
/// the earlier summary `prev`; `focus` (from `/compact FOCUS`) says what the summary must keep.
/// `position` is the session's scripted position (a compaction takes none of its own).
pub(crate) fn summary_request(
    prev: Option<&str>,
    input: &[Arc<Message>],
    focus: Option<&str>,
    position: u64,
) -> ModelRequest {
    let mut messages = vec![Arc::new(Message::User {
        content: match prev {
            Some(s) => format!("{}{s}", crate::context::SUMMARY_PREFIX),
            None => "The conversation to summarize follows.".into(),
        },
    })];
    messages.extend(input.iter().cloned());
    let mut ask = String::from(
        "Summarize the conversation above for your own later use: the user's goals, decisions, facts learned, files touched and work still open. Be concise.",
    );
    if let Some(focus) = focus.filter(|f| !f.trim().is_empty()) {
        ask.push_str(&format!(" Focus the summary on: {}", focus.trim()));
    }
    messages.push(Arc::new(Message::User { content: ask }));
    ModelRequest {
        instructions: Some("You write compact, faithful summaries of agent conversations.".into()),
        messages,
        purpose: RequestPurpose::Compaction,
        response_index: Some(position),
        ..ModelRequest::default()
    }
}
