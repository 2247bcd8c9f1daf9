//! What the runtime's parts share: the worker's [`Inner`] (store, model, tools, options, event
//! hub) and, for each session this process runs, its [`Active`] handle (the journal under a
//! mutex, the cancellation tokens of the turn and of each running call, the calls running here).
//!
//! Owns no behaviour: the driver, the intent handler and the public API all reach a running
//! session through these two types.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use keel_core::{PrincipalId, SessionId, ToolCallId};
use keel_model::ModelClient;
use keel_store::Store;
use tokio_util::sync::CancellationToken;

use crate::background::lock;
use crate::config::RuntimeOptions;
use crate::error::RuntimeError;
use crate::journal::Journal;
use crate::runtime::PendingAction;
use crate::subscribe::Hub;

/// A session being run by this process.
pub(crate) struct Active {
    /// The journal (state, projection, staged events).
    pub(crate) journal: Arc<tokio::sync::Mutex<Journal>>,
    /// The active turn's token; cancelling it stops the stream and every running call.
    pub(crate) turn_cancel: Mutex<Option<CancellationToken>>,
    /// Each running call's token, by call id.
    pub(crate) tool_cancel: Mutex<HashMap<String, CancellationToken>>,
    /// Calls running in this process (started and not yet given their result).
    pub(crate) live_calls: Mutex<HashSet<ToolCallId>>,
    /// Woken whenever a call running here finishes.
    pub(crate) call_done: tokio::sync::Notify,
    /// The durable journal version, for deltas' `after_seq`.
    pub(crate) version: AtomicU64,
    /// Who asked to cancel a running call, by call id (its `tool_call.finished` names them).
    pub(crate) cancelled_by: Mutex<HashMap<String, PrincipalId>>,
    /// The run's lease-lost token: cancelled (before the turn's token, its child) when the
    /// lease is lost or the run's future is dropped — a stop that is not a cancellation.
    pub(crate) lost: CancellationToken,
    /// `spawn_agent` calls running here whose child waits on a human (`crate::subagents`),
    /// by call: what the child waits for, and the token that detaches the call.
    pub(crate) waiting_in_child: Mutex<HashMap<ToolCallId, ChildWait>>,
    /// Calls the driver detached ([`Active::detach_waiting`]): their task ends without a
    /// result, the call stays `running` in the journal, and the next run re-runs it.
    pub(crate) detached: Mutex<HashSet<ToolCallId>>,
    /// What the children of detached calls wait for, for the run's `RunOutcome::pending`.
    pub(crate) child_pending: Mutex<Vec<PendingAction>>,
}

/// What a `spawn_agent` call's child waits for ([`Active::waiting_in_child`]).
pub(crate) struct ChildWait {
    /// The child's pending actions, each labelled with the session that waits.
    pub(crate) pending: Vec<PendingAction>,
    /// Cancelled when the driver detaches the call.
    pub(crate) detach: CancellationToken,
}

impl Active {
    /// A handle for a session whose journal is `journal`, run under `lost`.
    pub(crate) fn new(journal: Journal, lost: CancellationToken) -> Self {
        let version = journal.durable;
        Self {
            journal: Arc::new(tokio::sync::Mutex::new(journal)),
            turn_cancel: Mutex::new(None),
            tool_cancel: Mutex::new(HashMap::new()),
            live_calls: Mutex::new(HashSet::new()),
            call_done: tokio::sync::Notify::new(),
            version: AtomicU64::new(version),
            cancelled_by: Mutex::new(HashMap::new()),
            lost,
            waiting_in_child: Mutex::new(HashMap::new()),
            detached: Mutex::new(HashSet::new()),
            child_pending: Mutex::new(Vec::new()),
        }
    }

    /// The calls whose child waits on a human.
    pub(crate) fn waiting(&self) -> HashSet<ToolCallId> {
        lock(&self.waiting_in_child).keys().cloned().collect()
    }

    /// Detaches every call whose child waits on a human: each is marked detached (its task ends
    /// without a result), what its child waits for is kept for the run's outcome, and its task
    /// is told to stop. Returns the calls detached.
    pub(crate) fn detach_waiting(&self) -> Vec<ToolCallId> {
        let taken: Vec<(ToolCallId, ChildWait)> = lock(&self.waiting_in_child).drain().collect();
        let mut out = Vec::with_capacity(taken.len());
        for (call, wait) in taken {
            lock(&self.detached).insert(call.clone());
            lock(&self.child_pending).extend(wait.pending);
            wait.detach.cancel();
            out.push(call);
        }
        out
    }

    /// Whether `call` was detached (taken out of the record: asked once, by its task).
    pub(crate) fn take_detached(&self, call: &ToolCallId) -> bool {
        lock(&self.detached).remove(call)
    }

    /// Cancels running call `call` (if it runs here) on behalf of `by`; returns whether it
    /// runs here.
    pub(crate) fn cancel_call(&self, call: &str, by: Option<PrincipalId>) -> bool {
        let Some(token) = self.call_token(call) else {
            return false;
        };
        if let Some(p) = by {
            self.cancelled_by
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(call.to_owned(), p);
        }
        token.cancel();
        true
    }

    /// Who asked to cancel `call`, taken out of the record.
    pub(crate) fn take_canceller(&self, call: &str) -> Option<PrincipalId> {
        self.cancelled_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call)
    }

    /// Cancels the active turn's token, if there is one.
    pub(crate) fn cancel_turn(&self) {
        if let Some(t) = self
            .turn_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            t.cancel();
        }
    }

    /// The token of running call `call`, if it runs here.
    pub(crate) fn call_token(&self, call: &str) -> Option<CancellationToken> {
        self.tool_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(call)
            .cloned()
    }

    /// The calls running here.
    pub(crate) fn live(&self) -> HashSet<ToolCallId> {
        self.live_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One worker process's runtime state (shared by every [`crate::Runtime`] clone).
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) model: Arc<dyn ModelClient>,
    pub(crate) tools: crate::tool_catalog::ToolCatalog,
    pub(crate) options: RuntimeOptions,
    pub(crate) owner: String,
    /// Renews the leases of every run of this runtime, in one store call per round.
    pub(crate) leases: Arc<crate::lease::LeaseKeeper>,
    pub(crate) hub: Hub,
    pub(crate) active: Mutex<HashMap<SessionId, Arc<Active>>>,
    /// This process's queue per session for short holds of its lease.
    pub(crate) gates: crate::hold::Gates,
    /// The leases this process keeps for sessions between its own operations on them.
    pub(crate) parked: crate::hold::Parked,
    /// Child sessions' models by route ([`Inner::model_for`]).
    pub(crate) child_models: Mutex<HashMap<Vec<String>, Arc<dyn ModelClient>>>,
    /// Each parent session's slots for running children (`spawn_agent`), created on first use.
    pub(crate) child_slots: Mutex<HashMap<SessionId, Arc<tokio::sync::Semaphore>>>,
    /// The budgets sub-agent trees share while they run here.
    pub(crate) spend: crate::spend::Pools,
    /// Per top-level session: the slots of its live descendants
    /// ([`crate::config::SubagentOptions::max_descendants`]).
    pub(crate) descendant_slots: Mutex<HashMap<SessionId, Arc<tokio::sync::Semaphore>>>,
    /// Sessions whose lease this process took over from a holder that may still be alive, and
    /// until when an effect that holder left `dispatched` must not be declared
    /// `outcome_unknown` here ([`Inner::note_takeover`]).
    pub(crate) takeovers: Mutex<HashMap<SessionId, tokio::time::Instant>>,
}

impl Inner {
    /// Notes that this process took `session`'s lease just now, from `from_live` (a holder
    /// that may still be alive: a scheduler's claim of an expired lease; `None`: the lease was
    /// free or its holder is dead): until the lease TTL and a tenth have passed, no effect left
    /// `dispatched` is declared `outcome_unknown` here — by then that holder has found the
    /// lease lost and killed its tools, or fenced itself when it lapsed
    /// (`lease::LeaseKeeper`, "The fence"), whatever its clock says.
    pub(crate) fn note_takeover(&self, session: SessionId, from_live: Option<&str>) {
        let Some(prev) = from_live else { return };
        let ttl = self.options.lease_ttl;
        let now = tokio::time::Instant::now();
        tracing::info!(%session, previous = %prev, "took over a lease whose holder may be alive: its dispatched effects wait out its lease");
        let mut map = self
            .takeovers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, at| *at > now);
        map.insert(session, now + ttl + ttl / 10);
    }

    /// Until when a `dispatched` effect of `session` must not be declared `outcome_unknown`
    /// here (see [`Inner::note_takeover`]); `None` when that moment has passed or there was no
    /// such takeover.
    pub(crate) fn settle_after(&self, session: SessionId) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        self.takeovers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .copied()
            .filter(|at| *at > now)
    }

    /// The handle of session `session` if this process runs it.
    pub(crate) fn active(&self, session: SessionId) -> Option<Arc<Active>> {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .cloned()
    }

    /// The model session `session` samples: a child session (`spawn_agent`) samples its
    /// release's route through [`crate::config::SubagentOptions::models`] when the host gave
    /// one (built once per route); every other session, the runtime's own model.
    ///
    /// # Errors
    /// [`RuntimeError::Config`] naming the route when the host cannot build it.
    pub(crate) fn model_for(
        &self,
        session: SessionId,
        release: &keel_core::Release,
        config: &crate::config::SessionConfig,
    ) -> crate::error::Result<Arc<dyn ModelClient>> {
        let route = &release.definition.model_route;
        let (Some(_), Some(factory)) = (&config.subagent, &self.options.subagents.models) else {
            return Ok(self.model.clone());
        };
        let mut models = self
            .child_models
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = models.get(route) {
            return Ok(m.clone());
        }
        let model = factory(route).map_err(|reason| RuntimeError::Config {
            session,
            reason: format!("model route {}: {reason}", route.join(" -> ")),
        })?;
        models.insert(route.clone(), model.clone());
        Ok(model)
    }

    /// The slots of `parent`'s running children (at most
    /// [`crate::config::SubagentOptions::max_concurrent`]).
    pub(crate) fn child_slots(&self, parent: SessionId) -> Arc<tokio::sync::Semaphore> {
        self.child_slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(parent)
            .or_insert_with(|| {
                Arc::new(tokio::sync::Semaphore::new(
                    self.options.subagents.max_concurrent.max(1),
                ))
            })
            .clone()
    }
}

impl Inner {
    /// The slots of the live descendants of the top-level session `root` (at most
    /// [`crate::config::SubagentOptions::max_descendants`]).
    pub(crate) fn descendant_slots(&self, root: SessionId) -> Arc<tokio::sync::Semaphore> {
        self.descendant_slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(root)
            .or_insert_with(|| {
                Arc::new(tokio::sync::Semaphore::new(
                    self.options.subagents.max_descendants.max(1),
                ))
            })
            .clone()
    }
}

/// Removes a call from the running set and wakes the driver when dropped.
pub(crate) struct LiveGuard(pub(crate) Arc<Active>, pub(crate) ToolCallId);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0
            .live_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
        self.0.call_done.notify_waiters();
    }
}
