//! The turn's spans, following the OpenTelemetry GenAI semantic conventions
//! ([`SEMCONV_VERSION`]: `gen_ai.provider.name`, which replaced `gen_ai.system` in 1.37).
//!
//! **Shape.** The turn is the root span (`invoke_agent {gen_ai.agent.name}`, kind internal),
//! with one child per model attempt (`chat {gen_ai.request.model}`, kind client: a retry or a
//! fallback of a step is a new attempt and a new span) and one per tool call this worker runs
//! (`execute_tool {gen_ai.tool.name}`, kind internal). The session is not a span — it lasts days
//! and moves between workers — but the `gen_ai.conversation.id` attribute of every span. A turn
//! that continues on another worker (after a crash, a drain, or a wait on a human: the run that
//! gives the session back ends the span) gets a new root span there, linked to nothing; its spans
//! share `gen_ai.conversation.id` and `keel.turn.id` with the earlier ones.
//!
//! **Attributes.** Conventions: `gen_ai.operation.name`, `gen_ai.provider.name` (`openai`,
//! `anthropic` from the release's route spec; `keel.scripted` for the scripted model; `_OTHER`),
//! `gen_ai.conversation.id`, `gen_ai.agent.name` (the release's agent name), `gen_ai.agent.id`
//! (the release id), `gen_ai.request.model`, `gen_ai.request.max_tokens` (when set),
//! `gen_ai.request.stream` (true), `gen_ai.response.model` (the provider's name for the model that
//! answered, else the route member that served), `gen_ai.response.finish_reasons` (keel's stop
//! reason: `end_turn`, `tool_use`, `max_tokens`, `stop_sequence`, `refusal`, `content_filter`;
//! recorded as one string, which the `keel` binary's exporter turns into the convention's string
//! array), `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.usage.cache_read.input_tokens`, `gen_ai.usage.cache_creation.input_tokens`,
//! `gen_ai.usage.reasoning.output_tokens`, `gen_ai.tool.name`, `gen_ai.tool.call.id`,
//! `gen_ai.tool.type` (`function`), `error.type`. `gen_ai.response.id` is not recorded: the
//! model adapters' normalized stream does not carry the provider's response id. Keel's own:
//! `keel.session.id`, `keel.turn.id`, `keel.step.id`, `keel.attempt`, `keel.tool_call.id`,
//! `keel.tenant.id`, `keel.worker` (the lease owner, `<name>@<host>:<pid>/pidns:<inode>`), `keel.release.id`,
//! `keel.terminal_reason`, `keel.steps`, `keel.cost_usd`, `keel.usage.estimated`,
//! `keel.tool_call.status`.
//!
//! **Errors.** `error.type` is a low-cardinality class and the span status is `ERROR`: on `chat`
//! the provider error class (`rate_limited`, `timeout`, `context_overflow`, …, see
//! `keel_model::ErrorKind`; `cancelled` when the turn stopped the attempt); on `execute_tool` the
//! call's status when it did not succeed (`failed`, `rejected`, `outcome_unknown`,
//! `unfinished`; a cancelled call records `keel.tool_call.status = cancelled` without an error);
//! on `invoke_agent` the terminal reason of a turn that ended badly (`failed`, `budget_exhausted`,
//! `loop_detected`, `prompt_too_long`; an aborted turn is not an error).
//!
//! **No content.** Spans carry ids, names, counts and classes only: never the input, the model's
//! text or reasoning, tool arguments or outputs, error messages, or any configured secret (no
//! content capture, and no opt-in for it). Log events emitted inside these spans are not
//! exported either (the `keel` binary's exporter takes only spans of [`TARGET`]).
//!
//! **Cost when off.** The spans use [`TARGET`] at `INFO`; with no subscriber interested in it
//! (the `keel` binary's log filter turns it off) they are disabled callsites: no fields are
//! evaluated and nothing is allocated.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use keel_core::{
    EffectStatus, OperationKey, StateMachine, StepId, TerminalReason, ToolCallId, TurnId,
};
use keel_model::{ErrorKind, ProviderError};
use keel_tools::ValidatedCall;
use keel_tools::policy::Policy;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::background::lock;
use crate::driver::Runner;
use crate::error::Result;
use crate::metrics::Metrics;

/// The `tracing` target of every span here (`keel::telemetry`).
pub const TARGET: &str = "keel::telemetry";

/// The revision of the OpenTelemetry semantic conventions the spans follow.
pub const SEMCONV_VERSION: &str = "1.41.0";

/// `gen_ai.provider.name` of the model named `model` in `route` (a release's model route:
/// `openai:gpt-5`, `anthropic:claude-…`, `script:PATH`): the provider of the spec whose model is
/// `model`, else of a one-spec route; `keel.scripted` for the scripted model; else `_OTHER`.
pub fn provider_name(route: &[String], model: &str) -> &'static str {
    if model.starts_with("scripted:") {
        return "keel.scripted";
    }
    let spec = route
        .iter()
        .find(|s| s.split_once(':').is_some_and(|(_, m)| m.trim() == model))
        .or(match route {
            [only] => Some(only),
            _ => None,
        });
    match spec.and_then(|s| s.split_once(':')).map(|(p, _)| p.trim()) {
        Some("openai" | "openai-chat" | "openai-responses") => "openai",
        Some("anthropic") => "anthropic",
        Some("script" | "scripted") => "keel.scripted",
        _ => "_OTHER",
    }
}

/// The root span of the turn a runner works on (see [`Runner::turn_span`]).
#[derive(Debug, Default)]
pub(crate) struct TurnTrace(Mutex<Option<(TurnId, Span)>>);

/// Observes one model step's duration in `keel_step_latency_seconds` when dropped.
pub(crate) struct StepTimer<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl<'a> StepTimer<'a> {
    /// Starts timing a step.
    pub(crate) fn start(metrics: &'a Metrics) -> Self {
        Self {
            metrics,
            started: Instant::now(),
        }
    }
}

impl Drop for StepTimer<'_> {
    fn drop(&mut self) {
        self.metrics.observe_step(self.started.elapsed());
    }
}

/// One model attempt's `chat` span (see [`Runner::chat_span`]).
pub(crate) struct ChatSpan {
    span: Span,
    /// The provider's name for the model that answered, when it said.
    response_model: Option<String>,
}

impl ChatSpan {
    /// The provider named the model that answered (`StreamEvent::Completed::model`).
    pub(crate) fn answered_by(&mut self, model: Option<&str>) {
        if let Some(m) = model {
            self.response_model = Some(m.to_owned());
        }
    }

    /// Ends the attempt served by `served`, which used `usage` (costing `cost_usd`, an
    /// estimate when `estimated`): `Ok(stop reason)`, or `Err(error class)`. Ending it again
    /// does nothing.
    pub(crate) fn end(
        &mut self,
        served: &str,
        (usage, cost_usd, estimated): (&keel_core::Usage, f64, bool),
        result: std::result::Result<&str, &str>,
    ) {
        let span = std::mem::replace(&mut self.span, Span::none());
        let span = &span;
        span.record(
            "gen_ai.response.model",
            self.response_model.as_deref().unwrap_or(served),
        );
        span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
        span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
        span.record(
            "gen_ai.usage.cache_read.input_tokens",
            int(usage.cache_read_tokens),
        );
        span.record(
            "gen_ai.usage.cache_creation.input_tokens",
            int(usage.cache_write_tokens),
        );
        span.record(
            "gen_ai.usage.reasoning.output_tokens",
            int(usage.reasoning_tokens),
        );
        span.record("keel.usage.estimated", estimated);
        span.record("keel.cost_usd", keel_core::finite_cost(cost_usd));
        match result {
            Ok(stop_reason) => {
                span.record("gen_ai.response.finish_reasons", stop_reason);
            }
            Err(class) => record_error(span, class),
        }
    }
}

/// The error class of an attempt that ended with `error`: `timeout` when a time limit stopped
/// it, `cancelled` when the turn did (a cancellation, a lost lease), else the provider's class.
pub(crate) fn attempt_error(
    error: &ProviderError,
    timed_out: bool,
    cancelled: bool,
) -> &'static str {
    if timed_out {
        ErrorKind::Timeout.as_str()
    } else if cancelled {
        "cancelled"
    } else {
        error.kind.as_str()
    }
}

/// A count as an integer attribute (`tracing-opentelemetry` exports `u64` fields as strings).
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn record_error(span: &Span, class: &str) {
    span.record("error.type", class);
    span.record("otel.status_code", "error");
    span.record("otel.status_description", class);
}

impl Runner {
    /// The root span of `turn` on this worker: opened when this run first sees the turn
    /// active (started here, or resumed from the journal), ended by [`Runner::end_turn_span`]
    /// when the turn finishes or, at the latest, when the run ends.
    pub(crate) fn turn_span(&self, turn: TurnId) -> Span {
        let mut slot = lock(&self.trace.0);
        if let Some((t, span)) = slot.as_ref()
            && *t == turn
        {
            return span.clone();
        }
        let def = &self.release.definition;
        let primary = self
            .rt
            .model
            .members()
            .first()
            .map_or_else(|| self.model.model().to_owned(), |m| (*m).to_owned());
        let span = tracing::info_span!(
            target: TARGET,
            parent: None,
            "invoke_agent",
            otel.name = %if def.name.is_empty() { "invoke_agent".to_owned() } else { format!("invoke_agent {}", def.name) },
            otel.kind = "internal",
            otel.status_code = Empty,
            otel.status_description = Empty,
            gen_ai.operation.name = "invoke_agent",
            gen_ai.provider.name = provider_name(&def.model_route, &primary),
            gen_ai.agent.name = %def.name,
            gen_ai.agent.id = %self.release.id,
            gen_ai.conversation.id = %self.session,
            gen_ai.request.model = %primary,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            "error.type" = Empty,
            keel.session.id = %self.session,
            keel.turn.id = %turn,
            keel.tenant.id = %self.tenant,
            keel.worker = %self.rt.owner,
            keel.release.id = %self.release.id,
            keel.terminal_reason = Empty,
            keel.steps = Empty,
            keel.cost_usd = Empty,
        );
        *slot = Some((turn, span.clone()));
        span
    }

    /// Ends `turn`'s root span, recording how the turn ended (its terminal reason, steps, usage
    /// and cost over the whole turn, as journaled).
    pub(crate) async fn end_turn_span(&self, turn: TurnId) {
        let span = {
            let mut slot = lock(&self.trace.0);
            match slot.take() {
                Some((t, span)) if t == turn => span,
                other => {
                    *slot = other;
                    return;
                }
            }
        };
        if span.is_disabled() {
            return;
        }
        let Some(outcome) = self.read(|j| j.proj.finished.get(&turn).cloned()).await else {
            return;
        };
        span.record("keel.terminal_reason", outcome.terminal_reason.as_str());
        span.record("keel.steps", i64::from(outcome.num_steps));
        span.record("keel.cost_usd", keel_core::finite_cost(outcome.cost_usd));
        span.record("gen_ai.usage.input_tokens", int(outcome.usage.input_tokens));
        span.record(
            "gen_ai.usage.output_tokens",
            int(outcome.usage.output_tokens),
        );
        match outcome.terminal_reason {
            TerminalReason::Completed
            | TerminalReason::Aborted
            | TerminalReason::RequiresAction => {}
            TerminalReason::Failed
            | TerminalReason::BudgetExhausted
            | TerminalReason::LoopDetected
            | TerminalReason::PromptTooLong => {
                record_error(&span, outcome.terminal_reason.as_str());
            }
        }
    }

    /// The `chat` span of attempt `attempt` of `step`, asking `model` for at most `max_tokens`
    /// (when set), a child of the turn's root span.
    pub(crate) fn chat_span(
        &self,
        turn: TurnId,
        step: StepId,
        attempt: u32,
        model: &str,
        max_tokens: Option<u32>,
    ) -> ChatSpan {
        let parent = self.turn_span(turn);
        let span = tracing::info_span!(
            target: TARGET,
            parent: &parent,
            "chat",
            otel.name = %format!("chat {model}"),
            otel.kind = "client",
            otel.status_code = Empty,
            otel.status_description = Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = provider_name(&self.release.definition.model_route, model),
            gen_ai.conversation.id = %self.session,
            gen_ai.request.model = %model,
            gen_ai.request.max_tokens = max_tokens.map(i64::from),
            gen_ai.request.stream = true,
            gen_ai.response.model = Empty,
            gen_ai.response.finish_reasons = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.usage.cache_read.input_tokens = Empty,
            gen_ai.usage.cache_creation.input_tokens = Empty,
            gen_ai.usage.reasoning.output_tokens = Empty,
            "error.type" = Empty,
            keel.session.id = %self.session,
            keel.turn.id = %turn,
            keel.step.id = %step,
            keel.attempt = i64::from(attempt),
            keel.tenant.id = %self.tenant,
            keel.worker = %self.rt.owner,
            keel.usage.estimated = Empty,
            keel.cost_usd = Empty,
        );
        ChatSpan {
            span,
            response_model: None,
        }
    }

    /// Runs one validated call ([`Runner::run_call`]) inside its `execute_tool` span (a child
    /// of the turn's root span), then records how it ended on the span and in
    /// `keel_tool_calls_total`.
    pub(crate) async fn run_traced(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        v: ValidatedCall,
        policy: Policy,
    ) -> Result<()> {
        let name = v.name.clone();
        let parent = self.turn_span(turn);
        let span = tracing::info_span!(
            target: TARGET,
            parent: &parent,
            "execute_tool",
            otel.name = %format!("execute_tool {name}"),
            otel.kind = "internal",
            otel.status_code = Empty,
            otel.status_description = Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %name,
            gen_ai.tool.call.id = %call,
            "gen_ai.tool.type" = "function",
            gen_ai.conversation.id = %self.session,
            "error.type" = Empty,
            keel.session.id = %self.session,
            keel.turn.id = %turn,
            keel.step.id = %step,
            keel.tool_call.id = %call,
            keel.tenant.id = %self.tenant,
            keel.worker = %self.rt.owner,
            keel.tool_call.status = Empty,
        );
        let r = self
            .clone()
            .run_call(turn, step, call.clone(), v, policy)
            .instrument(span.clone())
            .await;
        let key = OperationKey::for_call(self.session, step, &call);
        let outcome = self
            .read(|j| match j.state.tool_calls.get(&call).map(|c| c.status) {
                Some(s) if s.is_terminal() => s.as_str(),
                _ if j
                    .state
                    .effects
                    .get(&key)
                    .is_some_and(|e| e.status == EffectStatus::OutcomeUnknown) =>
                {
                    "outcome_unknown"
                }
                _ => "unfinished",
            })
            .await;
        self.rt.options.metrics.tool_call(&name, outcome);
        span.record("keel.tool_call.status", outcome);
        if !matches!(outcome, "succeeded" | "cancelled") {
            record_error(&span, outcome);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_comes_from_the_route_spec_that_names_the_model() {
        let route = vec![
            "openai:gpt-5".to_owned(),
            "anthropic:claude-sonnet-4-5".to_owned(),
        ];
        assert_eq!(provider_name(&route, "gpt-5"), "openai");
        assert_eq!(provider_name(&route, "claude-sonnet-4-5"), "anthropic");
        assert_eq!(provider_name(&route, "unknown"), "_OTHER");
        assert_eq!(
            provider_name(&["openai-responses:o4".to_owned()], "o4-2025"),
            "openai"
        );
        assert_eq!(
            provider_name(&["script:demo.jsonl".to_owned()], "scripted:demo.jsonl"),
            "keel.scripted"
        );
    }
}
