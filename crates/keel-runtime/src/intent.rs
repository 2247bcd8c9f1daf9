//! Durable intents: how a process that does not run a session asks the worker that does.
//!
//! ARCHITECTURE rule 5: a queued input and a cancellation intent are rows, not futures. When
//! another live worker holds a session's lease, [`crate::Runtime::submit`],
//! [`crate::Runtime::cancel_turn`] and [`crate::Runtime::cancel_tool_call`] post an intent
//! ([`keel_store::Store::post_intent`], no lease needed) and wait until it is handled. The lease
//! holder watches for intents alongside its work ([`spawn_watcher`], woken by
//! [`keel_store::Store::wait_for_intent`]) and checks again before it goes idle; a worker that
//! starts or resumes a session handles whatever is left first. Handling journals the intent
//! (`turn.queued`, `turn.cancel_requested`) and then deletes the row.
//!
//! **Idempotent.** The poster chooses the ids: an `input` intent carries the new turn's
//! [`TurnId`], a `cancel_turn` intent the turn to cancel. A handler that journals an intent and
//! crashes before deleting it leaves a row the next handler recognises as done (the turn exists;
//! the cancellation is already requested) and only deletes.
//!
//! Kinds and payloads (JSON):
//! - `input` — `{"turn_id", "input", "strategy"?}`: [`crate::Runtime::submit_with`]; refused
//!   under `reject` while a turn is active or queued (deleted without a journal entry: the poster
//!   reads that as [`crate::RuntimeError::TurnInProgress`]).
//! - `cancel_turn` — `{"turn_id", "reason"}`: journals `turn.cancel_requested` and stops the
//!   turn if it is the active one.
//! - `cancel_tool_call` — `{"call_id"}`: stops that call if it runs in the handling process (it
//!   then gets a `cancelled` result and the turn continues). Not journaled as an intent of its
//!   own: if the handler dies first, recovery decides the call's fate as for any crash.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use keel_core::{
    Correlation, EventBody, SessionId, SessionState, StateMachine, TenantId, ToolCallId, TurnId,
};
use keel_store::Intent;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::MultitaskStrategy;
use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::runtime::{Active, Runtime};

/// Intent kind: user input for a new turn.
pub const INPUT: &str = "input";
/// Intent kind: cancel a turn.
pub const CANCEL_TURN: &str = "cancel_turn";
/// Intent kind: cancel one running tool call.
pub const CANCEL_TOOL_CALL: &str = "cancel_tool_call";

/// Payload of an [`INPUT`] intent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InputIntent {
    /// The turn the input becomes (chosen by the poster).
    pub turn_id: TurnId,
    /// The user's message.
    pub input: String,
    /// The multitask strategy, when not the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MultitaskStrategy>,
}

/// Payload of a [`CANCEL_TURN`] intent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelTurnIntent {
    /// The turn to cancel.
    pub turn_id: TurnId,
    /// Why (journaled in `turn.cancel_requested`).
    pub reason: String,
}

/// Payload of a [`CANCEL_TOOL_CALL`] intent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelToolCallIntent {
    /// The call to stop.
    pub call_id: ToolCallId,
}

/// How a posted intent ended for its poster.
pub(crate) enum Posted {
    /// The holder journaled it (the caller's `done` test holds on the state given).
    Handled,
    /// The holder took it without the expected journal entry (a refusal); the latest state.
    Consumed(Box<SessionState>),
    /// Nobody runs the session any more and the poster took its intent back: it now holds the
    /// session and does the work itself.
    Local(crate::runtime::Held),
}

/// How often a poster re-checks its intent while waiting (also bounded by journal wake-ups).
const POLL: Duration = Duration::from_millis(100);

impl Runtime {
    /// Handles every intent of the session in `j` (held by this worker), oldest first: journals
    /// it, stops what it names when `active` runs here, deletes the row. Returns how many rows
    /// this call deleted.
    ///
    /// # Errors
    /// Store errors and [`RuntimeError::LeaseLost`] (the intent stays for the next holder).
    pub(crate) async fn handle_intents(
        &self,
        j: &mut Journal,
        active: Option<&Active>,
    ) -> Result<usize> {
        let store = self.inner.store.clone();
        let intents = store.list_intents(j.tenant, j.session).await?;
        let mut n = 0;
        for intent in intents {
            self.apply_intent(j, active, &intent).await?;
            if let Some(a) = active {
                a.version.store(j.state.version, Ordering::SeqCst);
            }
            if store
                .delete_intent(j.tenant, j.session, &intent.intent_id)
                .await?
            {
                n += 1;
            }
        }
        Ok(n)
    }

    async fn apply_intent(
        &self,
        j: &mut Journal,
        active: Option<&Active>,
        intent: &Intent,
    ) -> Result<()> {
        let session = j.session;
        let bad = |e: serde_json::Error| {
            tracing::warn!(%session, kind = %intent.kind, id = %intent.intent_id, "unreadable intent dropped: {e}");
        };
        match intent.kind.as_str() {
            INPUT => {
                let Ok(p) =
                    serde_json::from_value::<InputIntent>(intent.payload.clone()).map_err(bad)
                else {
                    return Ok(());
                };
                if j.state.turns.contains_key(&p.turn_id) {
                    return Ok(()); // journaled by an earlier handler
                }
                match self.submit_held(j, &p.input, p.strategy, p.turn_id).await {
                    Ok(_) => {
                        if strategy_is_interrupt(j, p.strategy)
                            && let Some(a) = active
                        {
                            cancel_turn_token(a);
                        }
                        Ok(())
                    }
                    // Refusals: the poster sees the intent gone without its turn.
                    Err(
                        RuntimeError::TurnInProgress { .. }
                        | RuntimeError::Closed { .. }
                        | RuntimeError::InvalidInput(_),
                    ) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            CANCEL_TURN => {
                let Ok(p) =
                    serde_json::from_value::<CancelTurnIntent>(intent.payload.clone()).map_err(bad)
                else {
                    return Ok(());
                };
                let open = j
                    .state
                    .turns
                    .get(&p.turn_id)
                    .is_some_and(|t| !t.status.is_terminal() && t.cancel_requested.is_none());
                if open {
                    j.append(
                        "turn.cancel_requested",
                        vec![(
                            Correlation::turn(p.turn_id),
                            EventBody::TurnCancelRequested { reason: p.reason },
                        )],
                    )
                    .await?;
                }
                if j.state.active_turn == Some(p.turn_id)
                    && let Some(a) = active
                {
                    cancel_turn_token(a);
                }
                Ok(())
            }
            CANCEL_TOOL_CALL => {
                let Ok(p) = serde_json::from_value::<CancelToolCallIntent>(intent.payload.clone())
                    .map_err(bad)
                else {
                    return Ok(());
                };
                if let Some(t) = active.and_then(|a| {
                    a.tool_cancel
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(p.call_id.as_str())
                        .cloned()
                }) {
                    t.cancel();
                }
                Ok(())
            }
            other => {
                tracing::warn!(%session, kind = %other, "intent of an unknown kind dropped");
                Ok(())
            }
        }
    }

    /// Posts an intent for a session another live worker runs and waits until it is handled:
    /// `done` holds on the journal ([`Posted::Handled`]), the row disappears without it
    /// ([`Posted::Consumed`]), or the lease frees up and the intent is taken back
    /// ([`Posted::Local`]). After `lease_wait` without any of these the intent is taken back and
    /// the call fails with [`RuntimeError::SessionBusy`].
    pub(crate) async fn post_and_wait(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: &str,
        payload: &serde_json::Value,
        done: impl Fn(&SessionState) -> bool,
    ) -> Result<Posted> {
        let store = self.inner.store.clone();
        let intent = store.post_intent(tenant, session, kind, payload).await?;
        let deadline = tokio::time::Instant::now() + self.inner.options.lease_wait;
        let mut version = 0;
        let mut state = self.fold(tenant, session).await?;
        loop {
            if state.version != version {
                version = state.version;
                if done(&state) {
                    return Ok(Posted::Handled);
                }
            }
            let pending = store
                .list_intents(tenant, session)
                .await?
                .iter()
                .any(|i| i.intent_id == intent.intent_id);
            if !pending {
                // Handlers journal before they delete: this read is final.
                let state = self.fold(tenant, session).await?;
                return Ok(if done(&state) {
                    Posted::Handled
                } else {
                    Posted::Consumed(Box::new(state))
                });
            }
            let owner = match self.hold_now(tenant, session).await? {
                Ok(held) => {
                    if store
                        .delete_intent(tenant, session, &intent.intent_id)
                        .await?
                    {
                        return Ok(Posted::Local(held));
                    }
                    self.unhold(tenant, held).await;
                    continue; // handled meanwhile: the next pass sees it
                }
                Err(holder) => holder,
            };
            if tokio::time::Instant::now() >= deadline
                && store
                    .delete_intent(tenant, session, &intent.intent_id)
                    .await?
            {
                return Err(RuntimeError::SessionBusy { session, owner });
            }
            let v = store
                .wait_for_version(tenant, session, version, POLL)
                .await?;
            if v != version {
                state = self.fold(tenant, session).await?;
            }
        }
    }

    /// The session's state folded from its journal (no lease).
    pub(crate) async fn fold(&self, tenant: TenantId, session: SessionId) -> Result<SessionState> {
        Ok(self.view(tenant, session).await?.state)
    }
}

fn strategy_is_interrupt(j: &Journal, strategy: Option<MultitaskStrategy>) -> bool {
    crate::runtime::strategy_of(j, strategy) == MultitaskStrategy::Interrupt
}

fn cancel_turn_token(a: &Active) {
    if let Some(t) = a
        .turn_cancel
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        t.cancel();
    }
}

/// Watches the store for intents while this worker runs the session and handles them under the
/// journal lock, until `stop` is cancelled or the run closes the journal.
pub(crate) fn spawn_watcher(
    rt: Runtime,
    tenant: TenantId,
    session: SessionId,
    active: Arc<Active>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let store = rt.inner.store.clone();
        let pause = |d: Duration| {
            let stop = stop.clone();
            async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(d) => {}
                }
            }
        };
        loop {
            let has = tokio::select! {
                () = stop.cancelled() => return,
                r = store.wait_for_intent(tenant, session, Duration::from_secs(1)) => r,
            };
            match has {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(%session, "waiting for intents: {e}");
                    pause(Duration::from_millis(200)).await;
                    continue;
                }
            }
            let mut j = active.journal.lock().await;
            if j.closed || stop.is_cancelled() {
                return;
            }
            let r = rt.handle_intents(&mut j, Some(&active)).await;
            drop(j);
            match r {
                Ok(0) => pause(Duration::from_millis(20)).await,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%session, "handling intents: {e}");
                    pause(Duration::from_millis(200)).await;
                }
            }
        }
    })
}
