//! Folding a step's event stream into one response, with usage and cost per model.

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::client::EventStream;
use crate::cost::PriceTable;
use crate::error::ProviderError;
use crate::types::{
    InvalidArguments, Message, ReasoningItem, StopReason, StreamEvent, ToolCall, Usage,
};

/// A tool call of a finished response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseToolCall {
    /// The call as it goes into the transcript.
    pub call: ToolCall,
    /// Set when the call must not be executed; its result is
    /// [`InvalidArguments::result_message`].
    pub invalid: Option<InvalidArguments>,
}

/// Usage of one model within a step, and its cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelUsage {
    /// The model that consumed the tokens.
    pub model: String,
    /// Tokens.
    pub usage: Usage,
    /// Cost in USD; `None` when the price table has no price for the model.
    pub cost_usd: Option<f64>,
}

/// How the step ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// `completed` with this stop reason.
    Completed {
        /// Why the model stopped.
        stop_reason: StopReason,
    },
    /// The last error, after retries and fallbacks.
    Failed {
        /// The error.
        error: ProviderError,
    },
    /// Cancelled by the request's token.
    Cancelled,
}

/// A step's response: the content of the attempt that finished, usage of every attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// Visible text.
    pub text: String,
    /// Tool calls in proposal order.
    pub tool_calls: Vec<ResponseToolCall>,
    /// Reasoning items to keep in the transcript.
    pub reasoning: Vec<ReasoningItem>,
    /// How it ended.
    pub outcome: Outcome,
    /// The model of the last attempt (the one whose content this is).
    pub model: String,
    /// Usage per model, in the order first used; failed attempts that reported usage count too.
    pub usage: Vec<ModelUsage>,
    /// Attempts made (1 without retries).
    pub attempts: u32,
    /// Attempts of models that [`crate::ModelClient::consumes_responses`] (the scripted model)
    /// that ended with a response or an error (a cancelled attempt does not count): the number
    /// of model responses this step adds to the session's
    /// [`crate::ModelRequest::response_index`]. Attempts of other models (an HTTP primary before
    /// a scripted fallback) add nothing. A stream without `attempt` events (a bare client) counts
    /// as one consuming model.
    pub responses_consumed: u64,
    /// Model switches `(from, to)`.
    pub fallbacks: Vec<(String, String)>,
}

impl ModelResponse {
    /// Sum of all usage.
    pub fn total_usage(&self) -> Usage {
        let mut total = Usage::default();
        for u in &self.usage {
            total.add(&u.usage);
        }
        total
    }

    /// Sum of known costs in USD.
    pub fn total_cost_usd(&self) -> f64 {
        self.usage.iter().filter_map(|u| u.cost_usd).sum()
    }

    /// The assistant message for the transcript.
    pub fn assistant_message(&self) -> Message {
        Message::Assistant {
            text: self.text.clone(),
            tool_calls: self.tool_calls.iter().map(|c| c.call.clone()).collect(),
            reasoning: self.reasoning.clone(),
        }
    }
}

/// Consumes `events` into a [`ModelResponse`]. `model` names the producer until an `attempt`
/// event names another; `prices` prices the usage. Content streamed by an attempt that is then
/// retried or abandoned (`retry`, `fallback`) is discarded.
pub async fn collect(mut events: EventStream, model: &str, prices: &PriceTable) -> ModelResponse {
    let mut r = ModelResponse {
        text: String::new(),
        tool_calls: Vec::new(),
        reasoning: Vec::new(),
        outcome: Outcome::Failed {
            error: ProviderError::new(
                crate::ErrorKind::StreamTruncated,
                "stream ended without a terminal event",
            ),
        },
        model: model.to_string(),
        usage: Vec::new(),
        attempts: 1,
        responses_consumed: 0,
        fallbacks: Vec::new(),
    };
    // Whether the current attempt takes a position; `attempt` events say, per model.
    let mut consumes = true;
    while let Some(event) = events.next().await {
        match event {
            StreamEvent::TextDelta { text } => r.text.push_str(&text),
            StreamEvent::ReasoningDelta { .. }
            | StreamEvent::ToolCallStart { .. }
            | StreamEvent::ToolCallDelta { .. } => {}
            StreamEvent::Reasoning { item } => r.reasoning.push(item),
            StreamEvent::ToolCallEnd {
                id,
                name,
                arguments,
                raw_arguments,
                invalid,
            } => r.tool_calls.push(ResponseToolCall {
                call: ToolCall {
                    id,
                    name,
                    arguments,
                    raw_arguments: Some(raw_arguments),
                },
                invalid,
            }),
            StreamEvent::Usage { usage } => {
                let cost = prices.cost_usd(&r.model, &usage);
                match r.usage.iter_mut().find(|u| u.model == r.model) {
                    Some(u) => {
                        u.usage.add(&usage);
                        u.cost_usd = match (u.cost_usd, cost) {
                            (Some(a), Some(b)) => Some(a + b),
                            _ => None,
                        };
                    }
                    None => r.usage.push(ModelUsage {
                        model: r.model.clone(),
                        usage,
                        cost_usd: cost,
                    }),
                }
            }
            StreamEvent::Completed { stop_reason, .. } => {
                r.responses_consumed += u64::from(consumes);
                r.outcome = Outcome::Completed { stop_reason }
            }
            StreamEvent::Error { error } => {
                r.responses_consumed += u64::from(consumes && !error.no_response);
                r.outcome = Outcome::Failed { error }
            }
            StreamEvent::Cancelled => r.outcome = Outcome::Cancelled,
            StreamEvent::Attempt {
                attempt,
                model,
                consumes_response,
            } => {
                r.attempts = attempt;
                r.model = model;
                consumes = consumes_response;
            }
            StreamEvent::Retry { .. } => {
                r.responses_consumed += u64::from(consumes);
                r.text.clear();
                r.tool_calls.clear();
                r.reasoning.clear();
            }
            StreamEvent::Fallback { from, to, .. } => {
                r.responses_consumed += u64::from(consumes);
                r.text.clear();
                r.tool_calls.clear();
                r.reasoning.clear();
                r.fallbacks.push((from, to));
            }
        }
    }
    r
}
