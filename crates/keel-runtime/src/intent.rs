//! Durable intents: how a process that does not run a session asks the worker that does.
//!
//! ARCHITECTURE rule 5: a queued input and a cancellation intent are rows, not futures. When
//! another live worker holds a session's lease, [`crate::Runtime::submit`],
//! [`crate::Runtime::cancel_turn`] and [`crate::Runtime::cancel_tool_call`] post an intent
//! ([`keel_store::Store::post_intent`], no lease needed) and wait until it is handled. The lease
//! holder watches for intents alongside its work (`spawn_watcher`, woken by
//! [`keel_store::Store::wait_for_intent`]) and checks again before it goes idle; a worker that
//! starts or resumes a session handles whatever is left first. Handling journals the intent
//! (`turn.queued`, `turn.cancel_requested`) and deletes its row in the same append
//! ([`keel_store::AppendExtras::consume_intent`]), which commits only if the row is still there.
//!
//! **Accepted or withdrawn, never both.** A poster that waited `lease_wait` in vain withdraws
//! its intent ([`keel_store::Store::delete_intent`]) and, when that deleted the row, answers
//! "busy". A handler that listed the intent before the withdrawal then finds its append refused
//! ([`keel_store::StoreError::IntentGone`]: nothing written) and drops the intent without acting
//! on it; one whose append committed first leaves the poster's withdrawal nothing to delete, and
//! the poster reads the journal. An intent handled without a journal entry (a refusal, a
//! `cancel_tool_call`, one already journaled) is taken by deleting its row first, and acted on
//! only if that deleted it. (Test-only switch: `intent_consume`, keel-core's mechanisms.)
//!
//! **Idempotent.** The poster chooses the ids: an `input` intent carries the new turn's
//! [`TurnId`], a `cancel_turn` intent the turn to cancel. A row whose entry is already in the
//! journal (left by an older build, which journaled and deleted in two steps) is recognised as
//! done (the turn exists; the cancellation is already requested) and only deleted.
//!
//! Kinds and payloads (JSON):
//! - `input` — `{"turn_id", "input", "strategy"?, "principal_id"?, "priority"?}`:
//!   [`crate::Runtime::submit_opts`] (`priority` absent: 0); refused
//!   under `reject` while a turn is active or queued (deleted without a journal entry: the poster
//!   reads that as [`crate::RuntimeError::TurnInProgress`]).
//! - `cancel_turn` — `{"turn_id", "reason"}`: journals `turn.cancel_requested` and stops the
//!   turn if it is the active one.
//! - `cancel_tool_call` — `{"call_id"}`: stops that call if it runs in the handling process (it
//!   then gets a `cancelled` result and the turn continues). Not journaled as an intent of its
//!   own: if the handler dies first, recovery decides the call's fate as for any crash.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_core::{
    Correlation, EventBody, PrincipalId, SessionId, SessionStatus, StateMachine, TenantId,
    ToolCallId, TurnId,
};
use keel_store::Intent;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::MultitaskStrategy;
use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::shared::{Active, Inner};

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
    /// The principal who sent it (journaled as `turn.queued`'s `principal_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<PrincipalId>,
    /// The turn's scheduling priority ([`crate::SubmitOptions::priority`]); absent (intents of
    /// older builds) reads as 0, and one out of range is clamped into it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// How the input pipeline compiled the input (journaled as `turn.queued`'s `compiled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<keel_core::CompiledInput>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Payload of a [`CANCEL_TURN`] intent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelTurnIntent {
    /// The turn to cancel.
    pub turn_id: TurnId,
    /// Why (journaled in `turn.cancel_requested`).
    pub reason: String,
    /// The principal who asked (journaled as its `principal_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<PrincipalId>,
}

/// Payload of a [`CANCEL_TOOL_CALL`] intent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelToolCallIntent {
    /// The call to stop.
    pub call_id: ToolCallId,
    /// The principal who asked (journaled as the cancelled call's `tool_call.finished`
    /// `principal_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<PrincipalId>,
}

/// Handles every intent of the session in `j` (held by this worker), oldest first: journals
/// it and deletes its row in one append, then stops what it names when `active` runs here.
/// Returns how many intents this call took.
///
/// # Errors
/// Store errors and [`RuntimeError::LeaseLost`] (the intent stays for the next holder).
pub(crate) async fn handle_intents(
    inner: &Inner,
    j: &mut Journal,
    active: Option<&Active>,
) -> Result<usize> {
    let intents = inner.store.list_intents(j.tenant, j.session).await?;
    handle_listed(inner, j, active, intents).await
}

/// Handles `intents`, as listed by [`handle_intents`] (their posters may have withdrawn some
/// since). What the running turn staged commits first, on its own: an intent's append carries
/// that intent's events only, so one its poster withdrew fails alone
/// ([`keel_store::StoreError::IntentGone`]) and the handler drops it without acting on it.
pub(crate) async fn handle_listed(
    inner: &Inner,
    j: &mut Journal,
    active: Option<&Active>,
    intents: Vec<Intent>,
) -> Result<usize> {
    if intents.is_empty() {
        return Ok(0);
    }
    if j.has_staged() {
        j.commit("intent.flush").await?;
    }
    let mut n = 0;
    for intent in intents {
        let taken = apply_intent(inner, j, active, &intent).await?;
        if let Some(a) = active {
            a.version.store(j.state.version, Ordering::SeqCst);
        }
        n += usize::from(taken);
    }
    Ok(n)
}

/// Takes `intent` without journaling anything (a refusal, a kind with no journal entry, one an
/// earlier handler journaled): deletes its row; `false` when its poster withdrew it first (or
/// another handler took it), and then the caller must not act on it.
async fn take(inner: &Inner, j: &Journal, intent: &Intent) -> Result<bool> {
    Ok(inner
        .store
        .delete_intent(j.tenant, j.session, &intent.intent_id)
        .await?)
}

/// Whether `r`, the result of an append consuming an intent, found the intent gone (withdrawn
/// by its poster): then nothing was journaled and the intent is dropped.
fn withdrawn<T>(r: &Result<T>) -> bool {
    matches!(
        r,
        Err(RuntimeError::Store(
            keel_store::StoreError::IntentGone { .. }
        ))
    )
}

/// Handles one intent; returns whether this handler took it (its entry journaled with the
/// row's deletion, or the row deleted by [`take`]).
async fn apply_intent(
    inner: &Inner,
    j: &mut Journal,
    active: Option<&Active>,
    intent: &Intent,
) -> Result<bool> {
    let session = j.session;
    let bad = |e: serde_json::Error| {
        tracing::warn!(%session, kind = %intent.kind, id = %intent.intent_id, "unreadable intent dropped: {e}");
    };
    match intent.kind.as_str() {
        INPUT => {
            let Ok(p) = serde_json::from_value::<InputIntent>(intent.payload.clone()).map_err(bad)
            else {
                return take(inner, j, intent).await;
            };
            if j.state.turns.contains_key(&p.turn_id) {
                return take(inner, j, intent).await; // journaled by an earlier handler
            }
            let queued = Queued {
                turn: p.turn_id,
                by: p.principal_id,
                priority: p
                    .priority
                    .clamp(crate::config::MIN_PRIORITY, crate::config::MAX_PRIORITY),
                compiled: p.compiled.clone(),
                intent: Some(intent.intent_id.clone()),
            };
            let r = queue_input(j, &p.input, p.strategy, queued).await;
            if withdrawn(&r) {
                return Ok(false);
            }
            match r {
                Ok(_) => {
                    if strategy_is_interrupt(j, p.strategy)
                        && let Some(a) = active
                    {
                        cancel_turn_token(a);
                    }
                    Ok(true)
                }
                // Refusals: the poster sees the intent gone without its turn.
                Err(
                    RuntimeError::TurnInProgress { .. }
                    | RuntimeError::Closed { .. }
                    | RuntimeError::InvalidInput(_),
                ) => take(inner, j, intent).await,
                Err(e) => Err(e),
            }
        }
        CANCEL_TURN => {
            let Ok(p) =
                serde_json::from_value::<CancelTurnIntent>(intent.payload.clone()).map_err(bad)
            else {
                return take(inner, j, intent).await;
            };
            let open = j
                .state
                .turns
                .get(&p.turn_id)
                .is_some_and(|t| !t.status.is_terminal() && t.cancel_requested.is_none());
            if open {
                j.stage(vec![(
                    Correlation::turn(p.turn_id).by(p.principal_id),
                    EventBody::TurnCancelRequested { reason: p.reason },
                )])
                .await?;
                j.extras.consume_intent = Some(intent.intent_id.clone());
                let r = j.commit("turn.cancel_requested").await;
                if withdrawn(&r) {
                    return Ok(false);
                }
                r?;
            } else if !take(inner, j, intent).await? {
                return Ok(false);
            }
            if j.state.active_turn == Some(p.turn_id)
                && let Some(a) = active
            {
                cancel_turn_token(a);
            }
            Ok(true)
        }
        CANCEL_TOOL_CALL => {
            let Ok(p) =
                serde_json::from_value::<CancelToolCallIntent>(intent.payload.clone()).map_err(bad)
            else {
                return take(inner, j, intent).await;
            };
            // Nothing is journaled for it: taking the row is what excludes the poster's
            // withdrawal, so it comes first.
            if !take(inner, j, intent).await? {
                return Ok(false);
            }
            if let Some(a) = active {
                a.cancel_call(p.call_id.as_str(), p.principal_id);
            }
            Ok(true)
        }
        other => {
            tracing::warn!(%session, kind = %other, "intent of an unknown kind dropped");
            take(inner, j, intent).await
        }
    }
}

fn strategy_is_interrupt(j: &Journal, strategy: Option<MultitaskStrategy>) -> bool {
    strategy_of(j, strategy) == MultitaskStrategy::Interrupt
}

fn cancel_turn_token(a: &Active) {
    a.cancel_turn();
}

/// The multitask strategy for an input: the one given, else the session's.
pub(crate) fn strategy_of(j: &Journal, strategy: Option<MultitaskStrategy>) -> MultitaskStrategy {
    strategy.unwrap_or_else(|| j.config().map(|c| c.multitask).unwrap_or_default())
}

/// The turn an input becomes: its id, who sent it, its scheduling priority.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) turn: TurnId,
    pub(crate) by: Option<PrincipalId>,
    /// Written to the session's row with the commit ([`keel_store::AppendExtras::priority`]).
    pub(crate) priority: i32,
    /// Journaled as `turn.queued`'s `compiled`.
    pub(crate) compiled: Option<keel_core::CompiledInput>,
    /// The intent the input came in, consumed with the `turn.queued` commit
    /// ([`keel_store::AppendExtras::consume_intent`]); `None` for input given here.
    pub(crate) intent: Option<String>,
}

/// Journals `input` as turn `queued.turn` by the multitask strategy (the caller holds `j`):
/// `enqueue` queues it; `reject` refuses it while a turn is active or queued; `interrupt`
/// queues it and requests the cancellation of every open turn. The turn's priority commits
/// with it, and so does the deletion of the intent it came in (if any).
///
/// # Errors
/// [`RuntimeError::Closed`], [`RuntimeError::TurnInProgress`], store errors
/// ([`keel_store::StoreError::IntentGone`] when its intent was withdrawn: nothing written).
pub(crate) async fn queue_input(
    j: &mut Journal,
    input: &str,
    strategy: Option<MultitaskStrategy>,
    queued: Queued,
) -> Result<TurnId> {
    let Queued {
        turn,
        by,
        priority,
        compiled,
        intent,
    } = queued;
    if j.state.status == SessionStatus::Closed {
        return Err(RuntimeError::Closed { session: j.session });
    }
    let strategy = strategy_of(j, strategy);
    let busy = j
        .state
        .active_turn
        .or_else(|| j.state.queue.front().copied());
    let mut items = vec![(
        Correlation::turn(turn).by(by),
        EventBody::TurnQueued {
            input: input.to_owned(),
            compiled,
        },
    )];
    match (strategy, busy) {
        (MultitaskStrategy::Reject, Some(t)) => {
            return Err(RuntimeError::TurnInProgress {
                session: j.session,
                turn: t,
            });
        }
        (MultitaskStrategy::Interrupt, _) => {
            let open: Vec<TurnId> = j
                .state
                .active_turn
                .into_iter()
                .chain(j.state.queue.iter().copied())
                .filter(|t| {
                    j.state
                        .turns
                        .get(t)
                        .is_some_and(|t| t.cancel_requested.is_none())
                })
                .collect();
            for t in open {
                items.push((
                    Correlation::turn(t).by(by),
                    EventBody::TurnCancelRequested {
                        reason: "interrupted by a newer input".into(),
                    },
                ));
            }
        }
        _ => {}
    }
    j.stage(items).await?;
    // Only once the turn is staged: a refused stage leaves nothing for a later commit.
    j.extras.priority = Some(priority);
    j.extras.consume_intent = intent;
    j.commit("turn.queued").await?;
    Ok(turn)
}

/// How long one wait of the intent watcher lasts: the store wakes it when an intent is posted
/// (and polls at its own fallback interval meanwhile), so a long wait costs no queries; each new
/// wait reads the intents once.
const WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Watches the store for intents while this worker runs the session and handles them under the
/// journal lock, until `stop` is cancelled or the run closes the journal.
pub(crate) fn spawn_watcher(
    rt: Arc<Inner>,
    tenant: TenantId,
    session: SessionId,
    active: Arc<Active>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let store = rt.store.clone();
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
                r = store.wait_for_intent(tenant, session, WATCH_TIMEOUT) => r,
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
            let r = handle_intents(&rt, &mut j, Some(&active)).await;
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

#[cfg(test)]
mod tests;
