//! Token-aware admission of model calls (issue 13, "Scheduling"): each call reserves its
//! projected tokens in the tenant's token window of the current minute before it is sent, waits
//! for the next window when there is no room, and settles to what it used afterwards. The
//! rules are [`crate::config::TokenRate`]'s; the windows are the store's
//! ([`keel_store::Store::reserve_tokens`], [`keel_store::Store::settle_tokens`]).

use std::time::Duration;

use chrono::Utc;
use keel_core::Usage;
use tokio_util::sync::CancellationToken;

use crate::config::TOKEN_WINDOW_MS;
use crate::driver::Runner;
use crate::error::Result;
use crate::subscribe::DeltaKind;

/// Tokens reserved for one model call in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The window's start, Unix ms.
    pub(crate) window_start: i64,
    /// Tokens reserved.
    pub(crate) tokens: u64,
}

/// What admission answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Go ahead; `None` when the tenant has no limit (nothing was reserved).
    Admitted(Option<Reservation>),
    /// The wait for room was stopped: `cancel` fired (the turn was cancelled or the lease
    /// lost) or the run is drained. Nothing is reserved; the call must not be sent.
    Stopped,
}

/// Tokens a call used, for settling its reservation: input plus output.
pub(crate) fn used_tokens(usage: &Usage) -> u64 {
    usage.input_tokens.saturating_add(usage.output_tokens)
}

/// The start of the window holding `now_ms` (Unix ms).
pub(crate) fn window_of(now_ms: i64) -> i64 {
    now_ms - now_ms.rem_euclid(TOKEN_WINDOW_MS)
}

impl Runner {
    /// The tokens a request with `context_tokens` of estimated context and `max_output` (its
    /// `sampling.max_tokens`) is projected to use.
    pub(crate) fn projected_tokens(&self, context_tokens: u64, max_output: Option<u32>) -> u64 {
        let output = max_output.map_or_else(
            || {
                self.rt
                    .options
                    .token_rate
                    .as_ref()
                    .map_or(0, |r| r.default_output_tokens)
            },
            u64::from,
        );
        context_tokens.saturating_add(output)
    }

    /// Reserves `tokens` for the next model call under the tenant's limit, waiting for the next
    /// window while the current one has no room. The wait ends early — [`Admission::Stopped`] —
    /// when `cancel` fires or the run is drained.
    ///
    /// # Errors
    /// Store errors (the run fails as on any store error; the session continues elsewhere).
    pub(crate) async fn admit(&self, tokens: u64, cancel: &CancellationToken) -> Result<Admission> {
        let Some(limit) = self
            .rt
            .options
            .token_rate
            .as_ref()
            .and_then(|r| r.limit(self.tenant))
        else {
            return Ok(Admission::Admitted(None));
        };
        loop {
            let now = Utc::now().timestamp_millis();
            let window_start = window_of(now);
            let w = self
                .rt
                .store
                .reserve_tokens(self.tenant, window_start, tokens, limit)
                .await?;
            if w.admitted {
                return Ok(Admission::Admitted(Some(Reservation {
                    window_start,
                    tokens,
                })));
            }
            let until_ms = window_start + TOKEN_WINDOW_MS;
            tracing::info!(
                tenant = %self.tenant, session = %self.session, tokens, limit, used = w.used, until_ms,
                "waiting for the tenant's token rate"
            );
            self.delta(DeltaKind::TokenRateWait {
                tokens,
                limit,
                used: w.used,
                until_ms,
            });
            // A few ms past the boundary, so the next try lands in the new window.
            let nap = Duration::from_millis(u64::try_from(until_ms - now).unwrap_or(0) + 5);
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = cancel.cancelled() => return Ok(Admission::Stopped),
                () = self.drain.cancelled() => return Ok(Admission::Stopped),
            }
        }
    }

    /// Settles `reservation` (taken) to `used` tokens (see [`used_tokens`]): the window then
    /// counts what the call used instead of what it was projected to. A store error is logged:
    /// the window ends within a minute anyway.
    pub(crate) async fn settle_tokens(&self, reservation: &mut Option<Reservation>, used: u64) {
        let Some(r) = reservation.take() else {
            return;
        };
        let used = i64::try_from(used).unwrap_or(i64::MAX);
        let delta = used.saturating_sub(i64::try_from(r.tokens).unwrap_or(i64::MAX));
        if delta == 0 {
            return;
        }
        if let Err(e) = self
            .rt
            .store
            .settle_tokens(self.tenant, r.window_start, delta)
            .await
        {
            tracing::warn!(tenant = %self.tenant, session = %self.session, "settling reserved tokens: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_on_the_minute() {
        assert_eq!(window_of(0), 0);
        assert_eq!(window_of(59_999), 0);
        assert_eq!(window_of(60_000), 60_000);
        assert_eq!(window_of(1_700_000_012_345), 1_699_999_980_000);
        assert_eq!(window_of(-1), -60_000);
    }

    #[test]
    fn used_tokens_are_input_plus_output() {
        let u = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_tokens: 100,
            ..Usage::default()
        };
        assert_eq!(used_tokens(&u), 15);
    }
}
