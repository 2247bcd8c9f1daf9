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
use keel_core::{
    Correlation, EventBody, StateMachine, StepId, ToolCallId, ToolCallStatus, TurnId, TurnStatus,
    Usage,
};
use keel_model::{
    ErrorKind, ModelRequest, ProviderError, RequestPurpose, RequestTimeouts, StreamEvent,
};
use serde_json::Value;

use crate::admission::{Admission, used_tokens};

use crate::background::{finished_item, lock, phase_item};
use crate::context::{ContextSnapshot, project};
use crate::driver::Runner;
use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::redact::StreamRedactor;
use crate::subscribe::DeltaKind;

impl Runner {
    /// What the model sees for the next step (the frozen snapshot).
    pub(crate) fn project(&self, j: &Journal) -> Result<ContextSnapshot> {
        let tools = self.tools();
        let policy = crate::authorize::session_policy(&self.release, &self.config, j, &tools)?;
        // What the model is sent is redacted like everything else it sees.
        let agents = crate::context::read_agents_md(&self.workspace)
            .map(|text| self.redactor.redact_str(&text));
        Ok(project(
            &self.release.definition.instructions,
            agents.as_deref(),
            &crate::pinned::offered_tools(&self.release, &tools),
            &tools,
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

    /// `e`, after committing what is staged when the step was to commit it with its request
    /// (`overlap`): an error before the request does not drop the last step's results.
    async fn commit_owed(&self, overlap: bool, e: RuntimeError) -> RuntimeError {
        if overlap && let Err(c) = Box::pin(self.commit("turn.sampling")).await {
            tracing::warn!(session = %self.session, "committing the last step's end: {c}");
        }
        e
    }

    /// Samples step `step` of `turn` as attempt `first_attempt` on a frozen snapshot: streams
    /// the model, stages the step's events (retries and fallbacks are attempts of the same step),
    /// journals each proposed call as its arguments complete and starts allowed read-only ones at
    /// once. A cancelled or timed-out stream stages nothing more: the planner ends the turn.
    ///
    /// With `overlap`, what is staged (the finished step's results, this step's start) commits
    /// while the request goes out: nothing of the answer is handled before it is durable, and
    /// a failed commit drops the request.
    pub(crate) async fn sample(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        first_attempt: u32,
        overlap: bool,
    ) -> Result<()> {
        let snapshot = match Box::pin(self.step_snapshot()).await {
            Ok(s) => s,
            Err(e) => return Err(self.commit_owed(overlap, e).await),
        };
        let turn_token = self.turn_token();
        let position = self.read(|j| j.proj.position).await;
        let mut request: ModelRequest = snapshot.request(RequestPurpose::Step, position);
        // Each attempt is admitted under the tenant's token rate before anything of it is
        // staged: a wait stopped by a cancellation or a drain leaves the step as it was, and the
        // turn loop plans it again (the turn ends, or the drained run stops before it).
        let projected =
            self.projected_tokens(snapshot.estimated_tokens, request.sampling.max_tokens);
        let mut reservation = match Box::pin(self.admit(projected, &turn_token)).await {
            Ok(Admission::Admitted(r)) => r,
            Ok(Admission::Stopped) => {
                if overlap {
                    Box::pin(self.commit("turn.sampling")).await?;
                }
                return Ok(());
            }
            Err(e) => return Err(self.commit_owed(overlap, e).await),
        };
        let _timing = crate::telemetry::StepTimer::start(&self.rt.options.metrics);
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
            .map_or_else(|| self.model.model().to_owned(), |m| (*m).to_owned());
        let mut attempt = first_attempt;
        if let Err(e) = Box::pin(self.stage(vec![(
            Correlation::step(turn, step, attempt),
            EventBody::StepStarted {
                model: model.clone(),
            },
        )]))
        .await
        {
            return Err(self.commit_owed(overlap, e).await);
        }
        let step_token = turn_token.child_token();
        request.cancel = step_token.clone();
        request.timeouts = self.model_timeouts();
        let max_tokens = request.sampling.max_tokens;
        let mut chat = self.chat_span(turn, step, attempt, &model, max_tokens);
        let mut stream = self.model.stream(request);
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
        // When the turn's wall-clock budget runs out (its timer cancels the turn then).
        let limits = self.limits();
        let wall_left = self
            .read(|j| {
                j.state.turns.get(&turn).and_then(|t| {
                    keel_core::plan::wall_time_left_ms(&j.state, t, &limits, chrono::Utc::now())
                })
            })
            .await;
        let turn_ends = [
            turn_deadline,
            wall_left.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms)),
        ]
        .into_iter()
        .flatten()
        .min();
        let mut streaming = false;
        // Calls the current attempt proposed (or re-proposed); others of the step were abandoned.
        let mut seen: std::collections::HashSet<ToolCallId> = std::collections::HashSet::new();
        // Whether the current attempt takes a scripted position (`responses_consumed`): only a
        // scripted model's responses do; a route says per attempt.
        let mut consumes = self.model.consumes_responses();
        let mut text = String::new();
        let mut reasoning: Vec<Value> = Vec::new();
        // What the current attempt used: the provider's reports (summed), or, when it reported
        // none, an estimate from the context sent and the output received (see `attempt_usage`).
        let mut reported: Option<Usage> = None;
        let mut output_bytes: u64 = 0;
        let mut timed_out: Option<&'static str> = None;
        // The attempt failure after which no retry fitted in the model's time limits.
        let mut no_time_left: Option<ProviderError> = None;
        // Calls proposed with an empty id get one (`blank_call_id`): the last one started.
        let mut blank_calls = 0u32;
        let mut blank_current: Option<String> = None;
        // The token-rate wait before a retry was stopped (cancelled, drained): see below.
        let mut admission_stopped = false;
        // Deltas are redacted as streams: a secret split across two deltas is still caught.
        let mut text_out = StreamRedactor::new(self.redactor.clone());
        let mut reasoning_out = StreamRedactor::new(self.redactor.clone());
        let mut args_out: HashMap<String, StreamRedactor> = HashMap::new();
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        // What the stream gave while the overlapped commit was made, in order (`None`: it
        // ended). The stream is read on meanwhile — the answer's bytes are received and parsed
        // while the commit's `fsync` runs — up to its end, a terminal event, or a retry or
        // fallback (the route's next attempt starts only once the runner has handled that
        // event, as without the overlap); nothing of it is handled (staged, shown) before the
        // commit is durable.
        let mut early: std::collections::VecDeque<Option<StreamEvent>> =
            std::collections::VecDeque::new();
        if overlap {
            let commit = self.commit("turn.sampling");
            tokio::pin!(commit);
            let mut reading = true;
            loop {
                tokio::select! {
                    r = &mut commit => {
                        r?;
                        break;
                    }
                    ev = stream.next(), if reading => {
                        reading = ev.as_ref().is_some_and(|e| {
                            !e.is_terminal()
                                && !matches!(
                                    e,
                                    StreamEvent::Retry { .. } | StreamEvent::Fallback { .. }
                                )
                        });
                        early.push_back(ev);
                    }
                }
            }
        }
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
            let ev = if let Some(ev) = early.pop_front() {
                ev
            } else {
                tokio::select! {
                    ev = stream.next() => ev,
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = Some(if turn_deadline == Some(deadline) { "turn" } else { "model" });
                    step_token.cancel();
                    continue;
                }
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
                Box::pin(self.stage(vec![(
                    Correlation::step(turn, step, attempt),
                    EventBody::StepStreaming {},
                )]))
                .await?;
            }
            match ev {
                StreamEvent::TextDelta { text: t } => {
                    let shown = text_out.push(&t);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::Text { text: shown });
                    }
                    output_bytes = output_bytes.saturating_add(t.len() as u64);
                    text.push_str(&t);
                }
                StreamEvent::ReasoningDelta { text: t } => {
                    output_bytes = output_bytes.saturating_add(t.len() as u64);
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
                StreamEvent::ToolCallStart { id, .. } => {
                    if id.trim().is_empty() {
                        blank_calls += 1;
                        blank_current = Some(blank_call_id(step, blank_calls));
                    }
                }
                StreamEvent::ToolCallDelta { id, delta } => {
                    let id = match &blank_current {
                        Some(b) if id.trim().is_empty() => b.clone(),
                        _ => id,
                    };
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
                    raw_arguments,
                } => {
                    output_bytes = output_bytes
                        .saturating_add(name.len() as u64)
                        .saturating_add(raw_arguments.len() as u64);
                    // A call without an id would be sent back to the provider as `""` (and two
                    // of them would collide): it gets one, the same for a re-sampled attempt.
                    let id = if id.trim().is_empty() {
                        blank_current.take().unwrap_or_else(|| {
                            blank_calls += 1;
                            blank_call_id(step, blank_calls)
                        })
                    } else {
                        id
                    };
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
                        .proposed(
                            turn, step, attempt, id, name, arguments, invalid, &snapshot, &seen,
                        )
                        .await?;
                    seen.insert(id);
                }
                StreamEvent::Usage { usage: u } => {
                    reported
                        .get_or_insert_with(Usage::default)
                        .add(&to_core_usage(&u));
                }
                StreamEvent::Completed { .. } if !streaming => {
                    // Nothing streamed (an adapter that let an empty response through, or an
                    // empty scripted line): a classified provider error, never an empty step.
                    break Err(ProviderError::new(
                        ErrorKind::EmptyResponse,
                        "the response completed with no text and no tool call",
                    ));
                }
                StreamEvent::Completed {
                    stop_reason,
                    model: answered,
                } => {
                    chat.answered_by(answered.as_deref());
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
                    // A retry that could only start after a deadline would never happen: the
                    // step ends now, instead of journaling "retrying in N ms" and then failing.
                    // (The next attempt has not streamed: the first-token limit applies to it.)
                    let retry_at =
                        tokio::time::Instant::now() + Duration::from_millis(delay.unwrap_or(0));
                    if let Some(d) = turn_ends.filter(|d| retry_at >= *d) {
                        // The turn's clock runs out first: end as at its deadline (its timer
                        // cancels the turn a moment after it).
                        tokio::select! {
                            () = tokio::time::sleep_until(d + Duration::from_millis(50)) => {}
                            () = step_token.cancelled() => {}
                        }
                        timed_out = Some("turn");
                        step_token.cancel();
                        break Err(error);
                    }
                    if [first_token_deadline, total_deadline]
                        .into_iter()
                        .flatten()
                        .any(|d| retry_at >= d)
                    {
                        timed_out = Some("model");
                        no_time_left = Some(error);
                        break Err(ProviderError::new(
                            ErrorKind::Timeout,
                            "no time left to retry",
                        ));
                    }
                    // What the failed attempt used counts (under the model that served it).
                    let used = self.attempt_usage(
                        &model,
                        reported.take(),
                        streaming.then_some((snapshot.estimated_tokens, output_bytes)),
                    );
                    chat.end(&model, (&used.0, used.1, used.2), Err(error.kind.as_str()));
                    Box::pin(self.settle_tokens(&mut reservation, used_tokens(&used.0))).await;
                    // The next attempt is a model call of its own: admitted like the first.
                    let admitted = Box::pin(self.admit(projected, &step_token)).await?;
                    let failed = (&error, u64::from(consumes && !error.no_response), used);
                    let Admission::Admitted(r) = admitted else {
                        // Cancelled or drained while waiting: the failed attempt is journaled
                        // and nothing of the next one. A cancelled turn ends (the turn loop); a
                        // drained run leaves the step to be sampled again as its next attempt.
                        Box::pin(self.retry_attempt(
                            turn,
                            step,
                            &mut attempt,
                            (&model, None),
                            failed,
                            delay,
                        ))
                        .await?;
                        (streaming, output_bytes, admission_stopped) = (false, 0, true);
                        break Err(error);
                    };
                    reservation = r;
                    Box::pin(self.retry_attempt(
                        turn,
                        step,
                        &mut attempt,
                        (&model, Some(&next)),
                        failed,
                        delay,
                    ))
                    .await?;
                    model = next;
                    chat = self.chat_span(turn, step, attempt, &model, max_tokens);
                    (text, reasoning, output_bytes, streaming) =
                        (String::new(), Vec::new(), 0, false);
                    (blank_calls, blank_current) = (0, None);
                    seen.clear();
                    text_out = StreamRedactor::new(self.redactor.clone());
                    reasoning_out = StreamRedactor::new(self.redactor.clone());
                    args_out.clear();
                }
            }
        };
        drop(stream);
        let corr = Correlation::step(turn, step, attempt);
        // What the last attempt used: reported, else estimated when it produced anything (a
        // completed response always did).
        let produced = streaming || outcome.is_ok();
        let (usage, cost, usage_estimated) = self.attempt_usage(
            &model,
            reported.take(),
            produced.then_some((snapshot.estimated_tokens, output_bytes)),
        );
        Box::pin(self.settle_tokens(&mut reservation, used_tokens(&usage))).await;
        // (An attempt whose retry was stopped while waiting for admission has ended already.)
        chat.end(
            &model,
            (&usage, cost, usage_estimated),
            outcome.as_deref().map_err(|e| {
                let cancelled = step_token.is_cancelled();
                crate::telemetry::attempt_error(e, timed_out.is_some(), cancelled)
            }),
        );
        match outcome {
            Ok(stop_reason) => {
                let mut items = Vec::new();
                // Calls proposed by abandoned attempts of this step are not part of the
                // response: those that never ran are closed, those still running are stopped,
                // and none is shown to the model as this response's (`abandoned_calls`).
                let abandoned: Vec<(ToolCallId, ToolCallStatus)> = self
                    .read(|j| {
                        j.state.steps.get(&step).map_or(Vec::new(), |s| {
                            s.tool_calls
                                .iter()
                                .filter(|c| !seen.contains(*c))
                                .filter_map(|c| {
                                    j.state.tool_calls.get(c).map(|t| (c.clone(), t.status))
                                })
                                .collect()
                        })
                    })
                    .await;
                for (c, status) in &abandoned {
                    if *status == ToolCallStatus::Proposed {
                        items.push(finished_item(
                            turn,
                            step,
                            c,
                            ToolCallStatus::Interrupted,
                            "The call was proposed by an abandoned model attempt and was not run."
                                .into(),
                            true,
                        ));
                    } else if !status.is_terminal() {
                        self.active.cancel_call(c.as_str(), None);
                    }
                }
                items.push((
                    corr,
                    EventBody::StepCompleted {
                        model: model.clone(),
                        stop_reason,
                        usage,
                        usage_estimated,
                        abandoned_calls: abandoned.into_iter().map(|(c, _)| c).collect(),
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
                Box::pin(self.stage(items)).await?;
            }
            Err(_) if admission_stopped => {
                // Everything the stopped step owes is staged (its failed attempt).
                self.join_inflight().await;
                return Ok(());
            }
            Err(error) => {
                if (step_token.is_cancelled() && timed_out.is_none()) || timed_out == Some("turn") {
                    // The turn was cancelled, timed out or the lease lost: the turn loop takes it
                    // from here (it closes the step with `step.failed`, consuming nothing, and
                    // counts what the attempt used).
                    *lock(&self.unsettled_usage) = Some(crate::driver::UnsettledUsage {
                        step,
                        usage,
                        cost_usd: cost,
                        estimated: usage_estimated,
                    });
                    self.join_inflight().await;
                    return Ok(());
                }
                let error = match timed_out {
                    Some(_) => match &no_time_left {
                        Some(last) => ProviderError::new(
                            ErrorKind::Timeout,
                            format!(
                                "the model did not answer within the configured time limit (no time left to retry after {}: {})",
                                last.kind.as_str(),
                                last.message
                            ),
                        ),
                        None => ProviderError::new(
                            ErrorKind::Timeout,
                            "the model did not answer within the configured time limit",
                        ),
                    },
                    None => error,
                };
                if error.kind == ErrorKind::ContextOverflow {
                    // The planner compacts (aggressively), then re-samples the same step.
                    Box::pin(self.stage(vec![(
                        corr,
                        EventBody::StepAttemptFailed {
                            model,
                            error_kind: error.kind.as_str().into(),
                            message: error.message.clone(),
                            retry_in_ms: None,
                            responses_consumed: u64::from(consumes && !error.no_response),
                            usage,
                            cost_usd: cost,
                            usage_estimated,
                        },
                    )]))
                    .await?;
                    self.join_inflight().await;
                    return Ok(());
                }
                self.join_inflight().await;
                // The planner ends the turn `failed`, naming the error.
                Box::pin(self.stage(vec![(
                    corr,
                    EventBody::StepFailed {
                        error_kind: error.kind.as_str().into(),
                        message: error.message.clone(),
                        responses_consumed: u64::from(consumes && !error.no_response),
                        usage,
                        cost_usd: cost,
                        usage_estimated,
                    },
                )]))
                .await?;
            }
        }
        Ok(())
    }

    /// What an attempt served by `model` used, as `(usage, cost in USD, estimated)`: the
    /// provider's `reported` usage, capped per response ([`Usage::capped`]: an absurd report
    /// cannot overflow a sum or a store column); without a report, when the attempt `produced`
    /// output — `(context tokens sent, output bytes received)` — an estimate (the context
    /// estimate the request was built with, and output bytes / 4), so cost and token budgets
    /// still bind; otherwise nothing (a request refused before any output is not billed). The
    /// cost is at `model`'s price (0 when the model has none).
    fn attempt_usage(
        &self,
        model: &str,
        reported: Option<Usage>,
        produced: Option<(u64, u64)>,
    ) -> (Usage, f64, bool) {
        let (usage, estimated) = match (reported, produced) {
            (Some(u), _) => {
                let (capped, was_capped) = u.capped();
                if was_capped {
                    tracing::warn!(
                        session = %self.session, model, reported = ?u,
                        "the provider reported an impossible token count; counted at the cap of {} per response",
                        keel_core::MAX_RESPONSE_TOKENS
                    );
                }
                (capped, false)
            }
            (None, Some((context, output_bytes))) => (
                Usage {
                    input_tokens: context,
                    output_tokens: output_bytes.div_ceil(4),
                    ..Usage::default()
                }
                .capped()
                .0,
                true,
            ),
            (None, None) => return (Usage::default(), 0.0, false),
        };
        let cost = self
            .rt
            .options
            .prices
            .cost_usd(model, &to_model_usage(&usage))
            .map_or(0.0, keel_core::finite_cost);
        self.rt.options.metrics.model_usage(model, &usage, cost);
        (usage, cost, estimated)
    }

    /// Stages the failure of attempt `attempt` (served by `failed`) and, when the step goes on
    /// with `next`, the next attempt's start (`attempt` moves to it).
    async fn retry_attempt(
        &self,
        turn: TurnId,
        step: StepId,
        attempt: &mut u32,
        (failed, next): (&str, Option<&str>),
        (error, responses_consumed, (usage, cost_usd, usage_estimated)): (
            &ProviderError,
            u64,
            (Usage, f64, bool),
        ),
        retry_in_ms: Option<u64>,
    ) -> Result<()> {
        let mut items = vec![(
            Correlation::step(turn, step, *attempt),
            EventBody::StepAttemptFailed {
                model: failed.to_owned(),
                error_kind: error.kind.as_str().into(),
                message: error.message.clone(),
                retry_in_ms,
                responses_consumed,
                usage,
                cost_usd,
                usage_estimated,
            },
        )];
        if let Some(next) = next {
            *attempt += 1;
            items.push((
                Correlation::step(turn, step, *attempt),
                EventBody::StepStarted {
                    model: next.to_owned(),
                },
            ));
        }
        self.stage(items).await?;
        Ok(())
    }
}

/// The id a call proposed without one gets: `call_blank_<step>_<n>` (`n`: the n-th such call of
/// the attempt, from 1). The same for every attempt of the step, so a re-sampled attempt
/// proposing the same call reuses it.
fn blank_call_id(step: StepId, n: u32) -> String {
    let step = step.to_string();
    let tail = step.get(step.len().saturating_sub(12)..).unwrap_or(&step);
    format!("call_blank_{tail}_{n}")
}

fn to_model_usage(u: &Usage) -> keel_model::Usage {
    keel_model::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        reasoning_tokens: u.reasoning_tokens,
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
