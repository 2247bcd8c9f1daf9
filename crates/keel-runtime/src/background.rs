//! A run's background tasks and the small tools the phase modules share: the checkpoint task
//! (commits what has been staged too long), the turn's wall clock, [`on_worker`],
//! [`AbortOnDrop`], [`lock`], and the constructors of the events every phase stages.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use keel_core::{
    Correlation, EventBody, SessionId, SessionStatus, StepId, ToolCallId, ToolCallStatus, TurnId,
    TurnStatus,
};

use crate::driver::Runner;
use crate::error::RuntimeError;

/// Aborts a background task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `fut` as a task of its own on the current (multi-thread) tokio runtime and waits for
/// its output (on a current-thread runtime, in place); dropping the returned future aborts the
/// task (so it behaves like `fut` awaited in place,
/// except that it runs on a worker thread, where the tasks it spawns start locally). A panic
/// of the task is resumed in the caller.
///
/// Errors: [`crate::RuntimeError::ShuttingDown`] (naming `session`) when the runtime shuts
/// down under the task.
pub(crate) async fn on_worker<T: Send + 'static>(
    session: SessionId,
    fut: impl std::future::Future<Output = crate::Result<T>> + Send + 'static,
) -> crate::Result<T> {
    /// Aborts the task unless it finished.
    struct Guard<T>(Option<tokio::task::JoinHandle<T>>);
    impl<T> Drop for Guard<T> {
        fn drop(&mut self) {
            if let Some(task) = self.0.take() {
                task.abort();
            }
        }
    }
    // On a current-thread runtime there is no other thread to stay off: run in place.
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        return fut.await;
    }
    let mut guard = Guard(Some(tokio::spawn(fut)));
    let joined = match guard.0.as_mut() {
        Some(task) => task.await,
        None => unreachable!("the task is taken only by drop"),
    };
    guard.0 = None;
    match joined {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::RuntimeError::ShuttingDown { session }),
    }
}

/// Locks a std mutex, ignoring poisoning (the data stays usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Runner {
    /// Commits staged events that have waited longer than `checkpoint_after` (a long stream or
    /// a slow read-only tool), so other processes see the phase running. The task sleeps until
    /// the oldest staged event is due, and while nothing is staged until staging starts
    /// ([`crate::journal::Journal::staging`]): a session waiting on its model with everything
    /// committed costs no wake-ups (issue 16: CPU while 10,000 sessions wait).
    pub(crate) fn start_checkpoints(self: &Arc<Self>) -> AbortOnDrop {
        let after = self.rt.options.checkpoint_after;
        let active = self.active.clone();
        let session = self.session;
        AbortOnDrop(tokio::spawn(async move {
            let staging = active.journal.lock().await.staging.clone();
            let mut wait: Option<Duration> = None;
            loop {
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => staging.notified().await,
                }
                let mut j = active.journal.lock().await;
                if j.closed {
                    return;
                }
                let staged_for = j.staged_for();
                // Due in `after - d`, but never sooner than 10 ms from now (a busy phase
                // commits by itself long before).
                wait = staged_for.map(|d| after.saturating_sub(d).max(Duration::from_millis(10)));
                if staged_for.is_some_and(|d| d >= after) {
                    wait = None;
                    match j.commit("checkpoint").await {
                        Ok(v) => active.version.store(v, Ordering::SeqCst),
                        Err(e) => {
                            tracing::debug!(%session, "checkpoint: {e}");
                            // Taken over: stop the run here now, as the lease keeper would at
                            // its next renewal (the journal refuses everything from now on).
                            if matches!(e, RuntimeError::LeaseLost { .. }) {
                                active.lost.cancel();
                            }
                            return;
                        }
                    }
                }
            }
        }))
    }

    /// Arms the turn's wall clock: at the earlier of its `turn_timeout_ms` and what is left of
    /// its wall-time budgets, it cancels everything below the turn (sampling, tools).
    pub(crate) async fn start_timer(&self, turn: TurnId) -> Option<(TurnId, AbortOnDrop)> {
        let limits = self.limits();
        let (started, budget_left) = self
            .read(|j| {
                let t = j.state.turns.get(&turn);
                (
                    t.and_then(|t| t.started_at),
                    t.and_then(|t| {
                        keel_core::plan::wall_time_left_ms(&j.state, t, &limits, Utc::now())
                    }),
                )
            })
            .await;
        // 2 ms past the budget, so the planner's clock (whole ms) sees it spent.
        let budget_at =
            budget_left.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms + 2));
        let at = match (self.turn_deadline(started), budget_at) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let token = self.turn_token();
        Some((
            turn,
            AbortOnDrop(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                token.cancel();
            })),
        ))
    }
}

pub(crate) fn status_item(status: SessionStatus, reason: &str) -> (Correlation, EventBody) {
    (
        Correlation::default(),
        EventBody::SessionStatusChanged {
            status,
            reason: Some(reason.to_owned()),
        },
    )
}

pub(crate) fn phase_item(turn: TurnId, phase: TurnStatus) -> (Correlation, EventBody) {
    (
        Correlation::turn(turn),
        EventBody::TurnPhaseChanged { phase },
    )
}

pub(crate) fn finished_item(
    turn: TurnId,
    step: StepId,
    call: &ToolCallId,
    status: ToolCallStatus,
    output: String,
    is_error: bool,
) -> (Correlation, EventBody) {
    (
        Correlation::tool_call(turn, step, call.clone()),
        EventBody::ToolCallFinished {
            status,
            output,
            is_error,
        },
    )
}
