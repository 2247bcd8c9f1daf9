//! Retries with backoff and a model route with ordered fallbacks.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::client::{EventStream, ModelClient, event_stream};
use crate::error::{ModelError, ProviderError};
use crate::stream::Sink;
use crate::types::{ModelRequest, StreamEvent};

/// How often and how long to retry one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts per model, including the first (at least 1).
    pub max_attempts: u32,
    /// Backoff before the second attempt, in ms; doubled each further attempt.
    pub base_delay_ms: u64,
    /// Cap of any backoff, in ms.
    pub max_delay_ms: u64,
    /// Longest provider retry-after honoured, in ms; a longer one ends retries on this model
    /// (the route moves on rather than stall).
    pub max_retry_after_ms: u64,
}

impl Default for RetryPolicy {
    /// 4 attempts, 500 ms base, 30 s cap, retry-after honoured up to 60 s.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay_ms: 500,
            max_delay_ms: 30_000,
            max_retry_after_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry), in ms: the provider's
    /// retry-after when given, else exponential backoff `base * 2^(retry-1)` capped at
    /// `max_delay_ms`, with "equal jitter" (half fixed, half random) so that clients spread out.
    pub fn delay_ms(&self, retry: u32, retry_after_ms: Option<u64>) -> u64 {
        if let Some(ms) = retry_after_ms {
            return ms;
        }
        let exp = self
            .base_delay_ms
            .saturating_mul(1u64 << retry.saturating_sub(1).min(32));
        let capped = exp.min(self.max_delay_ms);
        let half = capped / 2;
        half + fastrand::u64(0..=capped - half)
    }
}

/// A primary model and ordered fallbacks, possibly across providers, with retries.
///
/// Per model, a retryable failure ([`crate::ErrorKind::retryable`]) is retried up to
/// `max_attempts` with [`RetryPolicy::delay_ms`]; when retries are spent, or the failure is not
/// retryable but [`crate::ErrorKind::falls_back`], the route moves to the next model. Failures of
/// our own request (invalid_request, context_overflow, content_filter) end the step at once.
///
/// The stream reports each attempt (`attempt`, naming the member that serves it), each retry
/// (`retry`, with the delay) and each switch (`fallback`); events between two `attempt` events
/// come from the model the first one names, so usage and cost stay attributed to it. The route's
/// own label (`gpt-4o-mini -> scripted:a.jsonl`) names the route for people; it never names the
/// model that answered, and has no price ([`ModelClient::members`] lists the members).
#[derive(Clone)]
pub struct ModelRoute {
    models: Vec<Arc<dyn ModelClient>>,
    policy: RetryPolicy,
    label: String,
}

impl std::fmt::Debug for ModelRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRoute")
            .field("label", &self.label)
            .field("policy", &self.policy)
            .finish()
    }
}

impl ModelRoute {
    /// A route over `models` (primary first).
    ///
    /// # Errors
    /// [`ModelError::EmptyRoute`] when `models` is empty.
    pub fn new(models: Vec<Arc<dyn ModelClient>>, policy: RetryPolicy) -> Result<Self, ModelError> {
        if models.is_empty() {
            return Err(ModelError::EmptyRoute);
        }
        let label = models
            .iter()
            .map(|m| m.model())
            .collect::<Vec<_>>()
            .join(" -> ");
        Ok(Self {
            models,
            policy,
            label,
        })
    }

    /// The models, primary first.
    pub fn models(&self) -> &[Arc<dyn ModelClient>] {
        &self.models
    }

    async fn run(self, mut request: ModelRequest, sink: &mut impl Sink) {
        let mut attempt = 0u32;
        let max_attempts = self.policy.max_attempts.max(1);
        for (position, model) in self.models.iter().enumerate() {
            let mut tries = 0u32;
            let failure = loop {
                tries += 1;
                attempt += 1;
                if !sink
                    .emit(StreamEvent::Attempt {
                        attempt,
                        model: model.model().to_string(),
                        consumes_response: model.consumes_responses(),
                    })
                    .await
                {
                    return;
                }
                let Some(error) = forward(model.stream(request.clone()), sink).await else {
                    return;
                };
                // A failed scripted attempt was a model response of the session (its error line
                // is consumed): the next attempt gets the next position. Other providers' failures
                // take no position, so a scripted fallback starts where the session stands.
                if model.consumes_responses() && !error.no_response {
                    request.response_index = request.response_index.map(|i| i.saturating_add(1));
                }
                let retry_after_too_long = error
                    .retry_after_ms
                    .is_some_and(|ms| ms > self.policy.max_retry_after_ms);
                if !error.kind.retryable() || tries >= max_attempts || retry_after_too_long {
                    break error;
                }
                let delay_ms = self.policy.delay_ms(tries, error.retry_after_ms);
                if !sink.emit(StreamEvent::Retry { error, delay_ms }).await {
                    return;
                }
                tokio::select! {
                    biased;
                    () = request.cancel.cancelled() => {
                        let _ = sink.emit(StreamEvent::Cancelled).await;
                        return;
                    }
                    () = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                }
            };
            match self.models.get(position + 1) {
                Some(next)
                    if failure.kind.falls_back()
                        && !keel_core::mechanisms::is_off(
                            keel_core::mechanisms::Mechanism::Fallback,
                        ) =>
                {
                    let event = StreamEvent::Fallback {
                        from: model.model().to_string(),
                        to: next.model().to_string(),
                        error: failure,
                    };
                    if !sink.emit(event).await {
                        return;
                    }
                }
                _ => {
                    let _ = sink.emit(StreamEvent::Error { error: failure }).await;
                    return;
                }
            }
        }
    }
}

/// Forwards one attempt's events; returns its error (not forwarded) if it failed, `None` when it
/// completed, was cancelled, or the sink went away.
async fn forward(mut events: EventStream, sink: &mut impl Sink) -> Option<ProviderError> {
    while let Some(event) = events.next().await {
        match event {
            StreamEvent::Error { error } => return Some(error),
            other => {
                let terminal = other.is_terminal();
                if !sink.emit(other).await || terminal {
                    return None;
                }
            }
        }
    }
    Some(ProviderError::new(
        crate::error::ErrorKind::StreamTruncated,
        "model stream ended without a terminal event",
    ))
}

impl ModelClient for ModelRoute {
    fn model(&self) -> &str {
        &self.label
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let route = self.clone();
        event_stream(move |mut sink| async move { route.run(request, &mut sink).await })
    }

    fn consumes_responses(&self) -> bool {
        self.models.iter().any(|m| m.consumes_responses())
    }

    fn members(&self) -> Vec<&str> {
        self.models.iter().flat_map(|m| m.members()).collect()
    }

    fn context_window_tokens(&self) -> Option<u64> {
        self.models
            .iter()
            .filter_map(|m| m.context_window_tokens())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_has_the_smallest_known_window_of_its_models() {
        let http = |m: &str| -> Arc<dyn ModelClient> {
            Arc::new(
                crate::HttpModel::new(
                    crate::Wire::OpenaiChat,
                    crate::ProviderConfig::new(m).with_api_key("k"),
                )
                .unwrap(),
            )
        };
        let route = |ms: &[&str]| {
            ModelRoute::new(ms.iter().map(|m| http(m)).collect(), RetryPolicy::default()).unwrap()
        };
        assert_eq!(http("gpt-4.1").context_window_tokens(), Some(1_047_576));
        assert_eq!(
            route(&["gpt-4.1", "gpt-4o"]).context_window_tokens(),
            Some(128_000)
        );
        assert_eq!(
            route(&["my-local-model", "claude-sonnet-4-5"]).context_window_tokens(),
            Some(200_000)
        );
        assert_eq!(route(&["my-local-model"]).context_window_tokens(), None);
    }

    #[test]
    fn backoff_doubles_with_equal_jitter_and_caps() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_delay_ms: 100,
            max_delay_ms: 1000,
            max_retry_after_ms: 5000,
        };
        for _ in 0..100 {
            let d1 = p.delay_ms(1, None);
            let d3 = p.delay_ms(3, None);
            let d9 = p.delay_ms(9, None);
            assert!((50..=100).contains(&d1), "{d1}");
            assert!((200..=400).contains(&d3), "{d3}");
            assert!((500..=1000).contains(&d9), "{d9}");
        }
        assert_eq!(p.delay_ms(1, Some(1234)), 1234);
    }
}
