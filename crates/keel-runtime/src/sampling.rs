//! The sampling phase: one model step on a frozen context snapshot.
//!
//! Owns the request, the stream, retries and fallbacks (attempts of the same step), timeouts
//! (first token, total, the turn's wall clock), live deltas (redacted as streams), proposed
//! calls (journaled as their arguments complete; allowed read-only calls start at once) and the
//! step's end (`step.completed`, or `step.failed` / a `context_overflow` attempt failure the
//! planner acts on). Everything is staged: the step commits with its calls' phase.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use keel_core::plan::{CallFacts, Verdict};
use keel_core::{
    Correlation, EffectClass, EventBody, StepId, ToolCallId, ToolCallStatus, TurnId, TurnStatus,
    Usage,
};
use keel_model::{
    ErrorKind, ModelRequest, ProviderError, RequestPurpose, RequestTimeouts, StreamEvent,
};
use serde_json::Value;

use crate::context::{ContextSnapshot, project};
use crate::driver::{Runner, finished_item, lock, phase_item};
use crate::error::Result;
use crate::journal::Journal;
use crate::redact::StreamRedactor;
use crate::subscribe::DeltaKind;

impl Runner {
    /// What the model sees for the next step (the frozen snapshot).
    pub(crate) fn project(&self, j: &Journal) -> Result<ContextSnapshot> {
        let policy =
            crate::authorize::session_policy(&self.release, &self.config, j, &self.rt.tools)?;
        Ok(project(
            &self.release.definition.instructions,
            &self.config.workspace,
            &self.release.definition.tools,
            &self.rt.tools,
            policy,
            &j.proj,
            &j.exact_reasoning(),
        ))
    }

    /// The session's model limits for each attempt of a model call: the stream idle limit, and
    /// the first-token and total limits when set (they also bound the whole call, below).
    pub(crate) fn model_timeouts(&self) -> RequestTimeouts {
        RequestTimeouts {
            first_token_ms: self.config.model_first_token_timeout_ms,
            total_ms: self.config.model_total_timeout_ms,
            idle_ms: Some(self.config.stream_idle_timeout_ms),
        }
    }

    /// The snapshot the planner's pass projected, if the journal has not moved since; else a
    /// new projection.
    async fn step_snapshot(&self) -> Result<ContextSnapshot> {
        let j = self.active.journal.lock().await;
        if let Some((v, s)) = lock(&self.snapshot).take()
            && v == j.state.version
        {
            return Ok(s);
        }
        self.project(&j)
    }

    /// Samples step `step` of `turn` as attempt `first_attempt` on a frozen snapshot: streams
    /// the model, stages the step's events (retries and fallbacks are attempts of the same step),
    /// journals each proposed call as its arguments complete and starts allowed read-only ones at
    /// once. A cancelled or timed-out stream stages nothing more: the planner ends the turn.
    pub(crate) async fn sample(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        first_attempt: u32,
    ) -> Result<()> {
        let snapshot = self.step_snapshot().await?;
        self.skip_compaction
            .store(false, std::sync::atomic::Ordering::SeqCst);
        *self
            .step_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((step, snapshot.policy.clone()));
        // The route member serving the current attempt: the primary first, then whichever
        // member each `attempt` event names. The step's events, price and usage rows are its.
        let mut model = self
            .rt
            .model
            .members()
            .first()
            .map_or_else(|| self.rt.model.model().to_owned(), |m| (*m).to_owned());
        let mut attempt = first_attempt;
        self.stage(vec![(
            Correlation::step(turn, step, attempt),
            EventBody::StepStarted {
                model: model.clone(),
            },
        )])
        .await?;
        let turn_token = self.turn_token();
        let step_token = turn_token.child_token();
        let position = self.read(|j| j.proj.position).await;
        let mut request: ModelRequest = snapshot.request(RequestPurpose::Step, position);
        request.cancel = step_token.clone();
        request.timeouts = self.model_timeouts();
        let mut stream = self.rt.model.stream(request);
        let started = tokio::time::Instant::now();
        let first_token_deadline = self
            .config
            .model_first_token_timeout_ms
            .map(|ms| started + Duration::from_millis(ms));
        let total_deadline = self
            .config
            .model_total_timeout_ms
            .map(|ms| started + Duration::from_millis(ms));
        let turn_started = self
            .read(|j| j.state.turns.get(&turn).and_then(|t| t.started_at))
            .await;
        let turn_deadline = self.turn_deadline(turn_started);
        let mut streaming = false;
        // Calls the current attempt proposed (or re-proposed); others of the step were abandoned.
        let mut seen: std::collections::HashSet<ToolCallId> = std::collections::HashSet::new();
        // Whether the current attempt takes a scripted position (`responses_consumed`): only a
        // scripted model's responses do; a route says per attempt.
        let mut consumes = self.rt.model.consumes_responses();
        let mut text = String::new();
        let mut reasoning: Vec<Value> = Vec::new();
        let mut usage = Usage::default();
        let mut cost = 0.0;
        let mut timed_out: Option<&'static str> = None;
        // Deltas are redacted as streams: a secret split across two deltas is still caught.
        let mut text_out = StreamRedactor::new(self.redactor.clone());
        let mut reasoning_out = StreamRedactor::new(self.redactor.clone());
        let mut args_out: HashMap<String, StreamRedactor> = HashMap::new();
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let outcome: std::result::Result<String, ProviderError> = loop {
            let deadline = [
                if streaming {
                    None
                } else {
                    first_token_deadline
                },
                total_deadline,
                turn_deadline,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(far);
            let ev = tokio::select! {
                ev = stream.next() => ev,
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = Some(if turn_deadline == Some(deadline) { "turn" } else { "model" });
                    step_token.cancel();
                    continue;
                }
            };
            let Some(ev) = ev else {
                break Err(ProviderError::new(
                    ErrorKind::StreamTruncated,
                    "model stream ended without a terminal event",
                ));
            };
            let content = !matches!(
                ev,
                StreamEvent::Attempt { .. }
                    | StreamEvent::Retry { .. }
                    | StreamEvent::Fallback { .. }
            );
            if content && !streaming && !ev.is_terminal() {
                streaming = true;
                self.stage(vec![(
                    Correlation::step(turn, step, attempt),
                    EventBody::StepStreaming {},
                )])
                .await?;
            }
            match ev {
                StreamEvent::TextDelta { text: t } => {
                    let shown = text_out.push(&t);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::Text { text: shown });
                    }
                    text.push_str(&t);
                }
                StreamEvent::ReasoningDelta { text: t } => {
                    let shown = reasoning_out.push(&t);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::Reasoning { text: shown });
                    }
                }
                StreamEvent::Reasoning { item } => {
                    if let Ok(v) = serde_json::to_value(&item) {
                        reasoning.push(v);
                    }
                }
                StreamEvent::ToolCallStart { .. } => {}
                StreamEvent::ToolCallDelta { id, delta } => {
                    let shown = args_out
                        .entry(id.clone())
                        .or_insert_with(|| StreamRedactor::new(self.redactor.clone()))
                        .push(&delta);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::ToolArguments {
                            call_id: id,
                            delta: shown,
                        });
                    }
                }
                StreamEvent::ToolCallEnd {
                    id,
                    name,
                    arguments,
                    invalid,
                    ..
                } => {
                    if let Some(rest) = args_out.remove(&id).map(|mut s| s.finish())
                        && !rest.is_empty()
                    {
                        self.delta(DeltaKind::ToolArguments {
                            call_id: id.clone(),
                            delta: rest,
                        });
                    }
                    let id = self
                        .clone()
                        .proposed(turn, step, attempt, id, name, arguments, invalid, &snapshot)
                        .await?;
                    seen.insert(id);
                }
                StreamEvent::Usage { usage: u } => {
                    let mu = to_core_usage(&u);
                    usage.add(&mu);
                    cost += self.rt.options.prices.cost_usd(&model, &u).unwrap_or(0.0);
                }
                StreamEvent::Completed { .. } if !streaming => {
                    // Nothing streamed (an adapter that let an empty response through, or an
                    // empty scripted line): a classified provider error, never an empty step.
                    break Err(ProviderError::new(
                        ErrorKind::EmptyResponse,
                        "the response completed with no text and no tool call",
                    ));
                }
                StreamEvent::Completed { stop_reason, .. } => {
                    let rest = reasoning_out.finish();
                    if !rest.is_empty() {
                        self.delta(DeltaKind::Reasoning { text: rest });
                    }
                    let rest = text_out.finish();
                    if !rest.is_empty() {
                        self.delta(DeltaKind::Text { text: rest });
                    }
                    break Ok(serde_json::to_value(stop_reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_else(|| "end_turn".into()));
                }
                StreamEvent::Error { error } => break Err(error),
                StreamEvent::Cancelled => {
                    break Err(ProviderError::new(ErrorKind::Timeout, "cancelled"));
                }
                StreamEvent::Attempt {
                    model: serving,
                    consumes_response,
                    ..
                } => (model, consumes) = (serving, consumes_response),
                StreamEvent::Retry { .. } | StreamEvent::Fallback { .. } => {
                    // A new attempt of the same step: what the failed one streamed is dropped.
                    // A retry asks the same model again; a fallback names the next one.
                    let (error, delay, next) = match ev {
                        StreamEvent::Retry { error, delay_ms } => {
                            (error, Some(delay_ms), model.clone())
                        }
                        StreamEvent::Fallback { error, to, .. } => (error, None, to),
                        _ => continue,
                    };
                    let failed = (&error, u64::from(consumes));
                    self.retry_attempt(turn, step, &mut attempt, (&model, &next), failed, delay)
                        .await?;
                    model = next;
                    (text, reasoning, usage, cost, streaming) =
                        (String::new(), Vec::new(), Usage::default(), 0.0, false);
                    seen.clear();
                    text_out = StreamRedactor::new(self.redactor.clone());
                    reasoning_out = StreamRedactor::new(self.redactor.clone());
                    args_out.clear();
                }
            }
        };
        drop(stream);
        let corr = Correlation::step(turn, step, attempt);
        match outcome {
            Ok(stop_reason) => {
                let mut items = Vec::new();
                // Calls proposed by abandoned attempts of this step never ran: close them.
                let stale: Vec<ToolCallId> = self
                    .read(|j| {
                        j.state.steps.get(&step).map_or(Vec::new(), |s| {
                            s.tool_calls
                                .iter()
                                .filter(|c| !seen.contains(*c))
                                .filter(|c| {
                                    j.state
                                        .tool_calls
                                        .get(*c)
                                        .is_some_and(|c| c.status == ToolCallStatus::Proposed)
                                })
                                .cloned()
                                .collect()
                        })
                    })
                    .await;
                for c in stale {
                    items.push(finished_item(
                        turn,
                        step,
                        &c,
                        ToolCallStatus::Interrupted,
                        "The call was proposed by an abandoned model attempt and was not run."
                            .into(),
                        true,
                    ));
                }
                items.push((
                    corr,
                    EventBody::StepCompleted {
                        model: model.clone(),
                        stop_reason,
                        usage,
                        cost_usd: cost,
                        text,
                        // Sealed, and left out of the event unless the session keeps
                        // reasoning, when the journal stages it (`crate::seal`).
                        reasoning,
                        reasoning_sealed: 0,
                        responses_consumed: u64::from(consumes),
                    },
                ));
                let has_calls = self
                    .read(|j| {
                        j.state
                            .steps
                            .get(&step)
                            .is_some_and(|s| !s.tool_calls.is_empty())
                    })
                    .await;
                if has_calls {
                    items.push(phase_item(turn, TurnStatus::ExecutingTools));
                }
                self.stage(items).await?;
            }
            Err(error) => {
                if step_token.is_cancelled() && timed_out.is_none() {
                    // The turn was cancelled or the lease lost: the turn loop takes it from here
                    // (it closes the step with `step.failed`, consuming nothing).
                    self.join_inflight().await;
                    return Ok(());
                }
                let error = match timed_out {
                    Some("turn") => {
                        self.join_inflight().await;
                        return Ok(());
                    }
                    Some(_) => ProviderError::new(
                        ErrorKind::Timeout,
                        "the model did not answer within the configured time limit",
                    ),
                    None => error,
                };
                if error.kind == ErrorKind::ContextOverflow {
                    // The planner compacts (aggressively), then re-samples the same step.
                    self.stage(vec![(
                        corr,
                        EventBody::StepAttemptFailed {
                            model,
                            error_kind: error.kind.as_str().into(),
                            message: error.message.clone(),
                            retry_in_ms: None,
                            responses_consumed: u64::from(consumes),
                        },
                    )])
                    .await?;
                    self.join_inflight().await;
                    return Ok(());
                }
                self.join_inflight().await;
                // The planner ends the turn `failed`, naming the error.
                self.stage(vec![(
                    corr,
                    EventBody::StepFailed {
                        error_kind: error.kind.as_str().into(),
                        message: error.message.clone(),
                        responses_consumed: u64::from(consumes),
                    },
                )])
                .await?;
            }
        }
        Ok(())
    }

    async fn retry_attempt(
        &self,
        turn: TurnId,
        step: StepId,
        attempt: &mut u32,
        (failed, next): (&str, &str),
        (error, responses_consumed): (&ProviderError, u64),
        retry_in_ms: Option<u64>,
    ) -> Result<()> {
        let corr = Correlation::step(turn, step, *attempt);
        *attempt += 1;
        self.stage(vec![
            (
                corr,
                EventBody::StepAttemptFailed {
                    model: failed.to_owned(),
                    error_kind: error.kind.as_str().into(),
                    message: error.message.clone(),
                    retry_in_ms,
                    responses_consumed,
                },
            ),
            (
                Correlation::step(turn, step, *attempt),
                EventBody::StepStarted {
                    model: next.to_owned(),
                },
            ),
        ])
        .await?;
        Ok(())
    }

    /// A call whose arguments are complete: journal it, and start it at once if it is read-only,
    /// parallel-safe and allowed by the step's snapshot.
    #[allow(clippy::too_many_arguments)]
    async fn proposed(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        attempt: u32,
        id: String,
        name: String,
        arguments: Value,
        invalid: Option<keel_model::InvalidArguments>,
        snapshot: &ContextSnapshot,
    ) -> Result<ToolCallId> {
        // A call id is stored as it is (correlation columns, approval rows): one the model made
        // up with a secret in it gets a plain one instead (the transcript uses it both ways).
        let id = if self.redactor.redact_str(&id) == id {
            id
        } else {
            // Deterministic (a re-sampled attempt proposing the same id maps to the same one)
            // and distinct per original id.
            let h = keel_core::canonical::bytes_hash(id.as_bytes());
            format!(
                "call_redacted_{}",
                h.trim_start_matches("sha256:").get(..16).unwrap_or("")
            )
        };
        let call = ToolCallId::from(id.as_str());
        let existing = self
            .read(|j| {
                j.state.tool_calls.get(&call).map(|c| {
                    (
                        c.step_id,
                        c.name.clone(),
                        j.exact_arguments(&call).unwrap_or(Value::Null),
                        c.status,
                    )
                })
            })
            .await;
        let call = match existing {
            // The same call proposed again by a re-sampled attempt of the same step: reuse it.
            Some((s, n, a, _)) if s == step && n == name && a == arguments => {
                return Ok(call);
            }
            // Another call has this id (an earlier step, a model reusing ids): a fresh one that
            // no call of the session has.
            Some(_) => {
                self.read(|j| {
                    (1u32..)
                        .map(|n| match n {
                            1 => format!("{id}_a{attempt}"),
                            n => format!("{id}_a{attempt}_{n}"),
                        })
                        .map(ToolCallId::from)
                        .find(|c| !j.state.tool_calls.contains_key(c))
                        .unwrap_or(call)
                })
                .await
            }
            None => call,
        };
        let corr = Correlation::tool_call(turn, step, call.clone()).with_attempt(attempt);
        let mut items = vec![(
            corr.clone(),
            EventBody::ToolCallProposed {
                name: name.clone(),
                arguments: arguments.clone(),
                sealed: false,
            },
        )];
        if let Some(inv) = invalid {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
            items.push(finished_item(
                turn,
                step,
                &call,
                ToolCallStatus::Failed,
                inv.result_message(),
                true,
            ));
            self.stage(items).await?;
            return Ok(call);
        }
        self.stage(items).await?;
        let facts = self.assess(&call, &name, &arguments, &snapshot.policy);
        // A read-only call starts while the model still streams, unless a tool-call budget is
        // set: then the planner decides which calls fit.
        let limits = self.limits();
        let counted = limits.turn_budget.max_tool_calls.is_some()
            || limits.session_budget.max_tool_calls.is_some();
        if let CallFacts::Valid {
            effect: EffectClass::ReadOnly,
            parallel_safe: true,
            verdict: Verdict::Allow,
            ..
        } = facts
            && !counted
        {
            self.spawn_call(turn, step, call.clone());
        }
        lock(&self.call_facts).insert(call.clone(), facts);
        Ok(call)
    }
}

fn to_core_usage(u: &keel_model::Usage) -> Usage {
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        reasoning_tokens: u.reasoning_tokens,
    }
}
