//! The public face of the runtime: [`Runtime`] and what its calls return.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, Correlation, EffectDecision, EffectStatus,
    EventBody, OperationKey, Release, SessionId, SessionState, SessionStatus, StateMachine,
    TenantId, ToolCallId, ToolCallStatus, TurnId,
};
use keel_model::ModelClient;
use keel_store::{Lease, NewSession, Store};
use keel_tools::ToolRegistry;
use keel_tools::approval::ApprovalService;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::{MultitaskStrategy, RuntimeOptions, SessionConfig};
use crate::context::ContextSnapshot;
use crate::error::{Result, RuntimeError};
use crate::intent::{self, CancelToolCallIntent, CancelTurnIntent, InputIntent, Posted};
use crate::journal::{Journal, TurnOutcome};
use crate::lease;
use crate::redact::Redactor;
use crate::subscribe::{Hub, Subscription};
use crate::turn::Runner;

/// Something a human must do before a `requires_action` session can continue.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingAction {
    /// Decide an approval with [`Runtime::decide_approval`].
    Approval {
        /// The approval.
        approval_id: ApprovalId,
        /// The call it is bound to.
        tool_call_id: ToolCallId,
        /// Tool name.
        tool_name: String,
        /// Exact arguments.
        arguments: Value,
        /// Hash the decision must name.
        args_hash: String,
        /// When it expires (the call is then rejected).
        expires_at: chrono::DateTime<Utc>,
    },
    /// Say what an `outcome_unknown` effect did with [`Runtime::resolve_effect`].
    Effect {
        /// The effect.
        operation_key: OperationKey,
        /// The call.
        tool_call_id: ToolCallId,
        /// Tool name.
        tool_name: String,
        /// Arguments of the call.
        arguments: Value,
    },
}

/// What [`Runtime::run`] returns when the session stops for now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunOutcome {
    /// The session.
    pub session_id: SessionId,
    /// `idle` (no more work), `requires_action` (see `pending`), `created` (nothing ever ran).
    pub status: SessionStatus,
    /// Journal version at the end.
    pub version: u64,
    /// Turns that finished during this run, in order.
    pub turns: Vec<TurnOutcome>,
    /// What a human must do, when `status` is `requires_action`.
    pub pending: Vec<PendingAction>,
}

/// A session's state as folded from its journal.
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The fold.
    pub state: SessionState,
    /// Every finished turn's outcome.
    pub turns: Vec<TurnOutcome>,
}

/// A session being run by this process.
pub(crate) struct Active {
    pub(crate) journal: Arc<tokio::sync::Mutex<Journal>>,
    pub(crate) turn_cancel: Mutex<Option<CancellationToken>>,
    pub(crate) tool_cancel: Mutex<HashMap<String, CancellationToken>>,
    pub(crate) live_calls: Mutex<HashSet<ToolCallId>>,
    pub(crate) version: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) model: Arc<dyn ModelClient>,
    pub(crate) tools: Arc<ToolRegistry>,
    pub(crate) options: RuntimeOptions,
    pub(crate) owner: String,
    pub(crate) hub: Hub,
    pub(crate) active: Mutex<HashMap<SessionId, Arc<Active>>>,
}

/// The runtime kernel of one worker process. Cheap to clone; share one per process.
///
/// Sessions are durable: every call below works from the journal, so any worker (this process
/// after a restart, or another one sharing the store) can continue a session.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("owner", &self.inner.owner)
            .field("store", &self.inner.store.backend())
            .field("model", &self.inner.model.model())
            .finish_non_exhaustive()
    }
}

/// The journal of a session, held either by a run in this process or under a short lease.
pub(crate) enum Held {
    Local(tokio::sync::OwnedMutexGuard<Journal>),
    Leased(Box<Journal>, Lease),
}

impl Held {
    fn journal(&mut self) -> &mut Journal {
        match self {
            Held::Local(g) => g,
            Held::Leased(j, _) => j,
        }
    }
}

impl Runtime {
    /// A runtime over `store`, sampling `model` (a [`keel_model::ModelRoute`], an
    /// [`keel_model::HttpModel`] or a [`keel_model::ScriptedModel`]) for every session it runs,
    /// with `tools` (filtered per session by the release's `tools` list and the policy).
    pub fn new(
        store: Arc<dyn Store>,
        model: Arc<dyn ModelClient>,
        tools: ToolRegistry,
        options: RuntimeOptions,
    ) -> Self {
        let owner = lease::owner_string(&options.worker_name);
        let hub = Hub::new(options.delta_buffer);
        Self {
            inner: Arc::new(Inner {
                store,
                model,
                tools: Arc::new(tools),
                options,
                owner,
                hub,
                active: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// This worker's lease owner string (`<name>@<host>:<pid>`).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Creates a session pinned to `release` with `config`: stores the release, creates the
    /// session row and journals `session.created` (config redacted). Nothing runs yet.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a bad config (nothing written); store errors.
    pub async fn create_session(
        &self,
        tenant: TenantId,
        release: &Release,
        config: SessionConfig,
    ) -> Result<SessionId> {
        config.validate()?;
        if !release.verify() {
            return Err(RuntimeError::InvalidInput(format!(
                "release {} does not match its definition's hash",
                release.id
            )));
        }
        let store = &self.inner.store;
        store.put_release(tenant, release).await?;
        let session = SessionId::new();
        store
            .create_session(
                tenant,
                NewSession {
                    session_id: session,
                    release_id: release.id.clone(),
                    parent_session_id: None,
                    metadata: serde_json::json!({"workspace": config.workspace}),
                },
            )
            .await?;
        let mut held = self.hold(tenant, session).await?;
        let cfg = serde_json::to_value(&config)
            .map_err(|e| RuntimeError::InvalidInput(format!("config: {e}")))?;
        let r = held
            .journal()
            .append(
                "session.created",
                vec![(
                    Correlation::default(),
                    EventBody::SessionCreated {
                        tenant_id: tenant,
                        release_id: release.id.clone(),
                        config: cfg,
                    },
                )],
            )
            .await;
        self.unhold(tenant, held).await;
        r?;
        Ok(session)
    }

    /// Changes the session's settings: `change` edits a copy of the effective config (the one
    /// pinned in `session.created` with every earlier change merged in); the result is validated
    /// as [`Runtime::create_session`] validates a config, and the difference is journaled as
    /// `session.config_changed` (a JSON merge patch). Every later step, tool call and turn — on
    /// any worker, after a restart too — uses the new settings: permission mode and rules,
    /// sandbox, budgets, timeouts, compaction, multitask strategy, `host`. A change equal to the
    /// current config writes nothing. Allowed between turns and while the active turn waits on a
    /// human (`requires_action`); an approval already requested keeps waiting for its decision.
    /// Returns the effective config afterwards.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a bad value (rule, fraction, workspace, negative cost)
    /// or a change of `secret_patterns`/`secret_env` (fixed at creation);
    /// [`RuntimeError::TurnRunning`]; [`RuntimeError::SessionBusy`] when a worker (this process
    /// or another) is running the session — change it once that run returns;
    /// [`RuntimeError::Closed`]; [`RuntimeError::Config`]; store errors. Nothing is written on
    /// error.
    pub async fn update_config(
        &self,
        tenant: TenantId,
        session: SessionId,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<SessionConfig> {
        let held = match self.hold_now(tenant, session).await? {
            Ok(Held::Local(g)) => {
                drop(g);
                return Err(RuntimeError::SessionBusy {
                    session,
                    owner: self.inner.owner.clone(),
                });
            }
            Ok(held) => held,
            Err(owner) => return Err(RuntimeError::SessionBusy { session, owner }),
        };
        let mut held = held;
        let r = Self::update_held(held.journal(), change).await;
        self.unhold(tenant, held).await;
        r
    }

    async fn update_held(
        j: &mut Journal,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<SessionConfig> {
        let session = j.session;
        if j.state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        if let Some(turn) = j.state.active_turn
            && j.state.status != SessionStatus::RequiresAction
        {
            return Err(RuntimeError::TurnRunning { session, turn });
        }
        let old = config_of(j)?;
        let mut new = old.clone();
        change(&mut new);
        if new.secret_patterns != old.secret_patterns || new.secret_env != old.secret_env {
            return Err(RuntimeError::InvalidInput(format!(
                "session {session}: secret_patterns and secret_env are fixed when the session is created"
            )));
        }
        new.validate()?;
        let value = |c: &SessionConfig| {
            serde_json::to_value(c).map_err(|e| RuntimeError::InvalidInput(format!("config: {e}")))
        };
        let changes = keel_core::merge_diff(&value(&old)?, &value(&new)?);
        if changes.as_object().is_some_and(serde_json::Map::is_empty) {
            return Ok(new);
        }
        j.append(
            "session.config_changed",
            vec![(
                Correlation::default(),
                EventBody::SessionConfigChanged { changes },
            )],
        )
        .await?;
        config_of(j)
    }

    /// Accepts user input into the journal (`turn.queued`) before anything else happens, by the
    /// session's multitask strategy: `enqueue` queues it; `reject` refuses it while a turn is
    /// active or queued; `interrupt` queues it and journals `turn.cancel_requested` for the
    /// active turn. If this process is running the session, the running loop picks the turn up;
    /// otherwise call [`Runtime::run`].
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for empty input; [`RuntimeError::TurnInProgress`] under
    /// `reject`; [`RuntimeError::SessionBusy`] when another process runs the session;
    /// [`RuntimeError::Closed`]; store errors. Nothing is written on error.
    pub async fn submit(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
    ) -> Result<TurnId> {
        self.submit_with(tenant, session, input, None).await
    }

    /// As [`Runtime::submit`] with an explicit multitask strategy instead of the session's.
    ///
    /// # Errors
    /// See [`Runtime::submit`].
    pub async fn submit_with(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
        strategy: Option<MultitaskStrategy>,
    ) -> Result<TurnId> {
        if input.trim().is_empty() {
            return Err(RuntimeError::InvalidInput(
                "input is empty; a turn needs a message".into(),
            ));
        }
        if let Ok(held) = self.hold_now(tenant, session).await? {
            return self
                .submit_on(tenant, held, input, strategy, TurnId::new())
                .await;
        }
        // Another live worker runs the session: ask it through a durable intent.
        let state = self.fold(tenant, session).await?;
        let busy = |s: &SessionState| s.active_turn.or_else(|| s.queue.front().copied());
        if state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        let pinned = serde_json::from_value::<SessionConfig>(state.config.clone())
            .map(|c| c.multitask)
            .unwrap_or_default();
        if strategy.unwrap_or(pinned) == MultitaskStrategy::Reject
            && let Some(t) = busy(&state)
        {
            return Err(RuntimeError::TurnInProgress { session, turn: t });
        }
        let turn = TurnId::new();
        let payload = serde_json::to_value(InputIntent {
            turn_id: turn,
            input: input.to_owned(),
            strategy,
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("input: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::INPUT, &payload, |s| {
                s.turns.contains_key(&turn)
            })
            .await?
        {
            Posted::Handled => Ok(turn),
            Posted::Local(held) => self.submit_on(tenant, held, input, strategy, turn).await,
            Posted::Consumed(s) if s.status == SessionStatus::Closed => {
                Err(RuntimeError::Closed { session })
            }
            Posted::Consumed(s) => Err(match busy(&s) {
                Some(t) => RuntimeError::TurnInProgress { session, turn: t },
                None => RuntimeError::InvalidInput(format!(
                    "session {session}: the worker running it did not accept the input"
                )),
            }),
        }
    }

    async fn submit_on(
        &self,
        tenant: TenantId,
        mut held: Held,
        input: &str,
        strategy: Option<MultitaskStrategy>,
        turn: TurnId,
    ) -> Result<TurnId> {
        let r = self
            .submit_held(held.journal(), input, strategy, turn)
            .await;
        if r.is_ok()
            && strategy_of(held.journal(), strategy) == MultitaskStrategy::Interrupt
            && let Held::Local(j) = &held
            && let Some(a) = self.active(j.session)
            && let Some(t) = a
                .turn_cancel
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
        {
            t.cancel();
        }
        self.unhold(tenant, held).await;
        r
    }

    /// Journals `input` as turn `turn` by the multitask strategy (the caller holds `j`).
    pub(crate) async fn submit_held(
        &self,
        j: &mut Journal,
        input: &str,
        strategy: Option<MultitaskStrategy>,
        turn: TurnId,
    ) -> Result<TurnId> {
        if j.state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session: j.session });
        }
        let strategy = strategy_of(j, strategy);
        let busy = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied());
        let mut items = vec![(
            Correlation::turn(turn),
            EventBody::TurnQueued {
                input: input.to_owned(),
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
                        Correlation::turn(t),
                        EventBody::TurnCancelRequested {
                            reason: "interrupted by a newer input".into(),
                        },
                    ));
                }
            }
            _ => {}
        }
        j.append("turn.queued", items).await?;
        Ok(turn)
    }

    /// Runs the session until it has nothing to do (`idle`) or waits on a human
    /// (`requires_action`): takes the lease (at once from a dead worker of this host, else
    /// waiting at most a lease TTL), folds the journal, recovers whatever a crashed worker left
    /// (see the crate docs), then runs queued turns one at a time. Heartbeats renew the lease;
    /// the lease is released on return.
    ///
    /// # Errors
    /// [`RuntimeError::SessionBusy`], [`RuntimeError::LeaseLost`] (the session continues on
    /// another worker), store errors. A failing model or tool does not make `run` fail: the
    /// turn ends with its terminal reason.
    pub async fn run(&self, tenant: TenantId, session: SessionId) -> Result<RunOutcome> {
        let opts = &self.inner.options;
        let lease = lease::acquire(
            &self.inner.store,
            tenant,
            session,
            &self.inner.owner,
            opts.lease_ttl,
            opts.lease_wait,
        )
        .await?;
        let result = self.run_leased(tenant, session, &lease).await;
        if let Err(e) = self.inner.store.release_lease(tenant, &lease).await {
            tracing::debug!(%session, "lease release: {e}");
        }
        result
    }

    async fn run_leased(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: &Lease,
    ) -> Result<RunOutcome> {
        let mut journal = self.load(tenant, session, lease).await?;
        // Intents posted while nobody ran the session (or left by a crashed handler) first.
        self.handle_intents(&mut journal, None).await?;
        crate::effects::reconcile(self.inner.store.as_ref(), tenant, &journal.state).await?;
        let config = config_of(&journal)?;
        let release_id = journal
            .state
            .release_id
            .clone()
            .ok_or(RuntimeError::Config {
                session,
                reason: "the journal has no session.created".into(),
            })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let version = journal.state.version;
        let active = Arc::new(Active {
            journal: Arc::new(tokio::sync::Mutex::new(journal)),
            turn_cancel: Mutex::new(None),
            tool_cancel: Mutex::new(HashMap::new()),
            live_calls: Mutex::new(HashSet::new()),
            version: AtomicU64::new(version),
        });
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session, active.clone());
        let stop = CancellationToken::new();
        let lost = CancellationToken::new();
        let hb = lease::heartbeat(
            self.inner.store.clone(),
            tenant,
            lease.clone(),
            self.inner.options.lease_ttl,
            stop.clone(),
            lost.clone(),
        );
        let watcher =
            intent::spawn_watcher(self.clone(), tenant, session, active.clone(), stop.clone());
        let approvals = ApprovalService::new(self.inner.store.clone(), tenant).with_ttl(
            chrono::Duration::milliseconds(
                i64::try_from(config.approval_ttl_ms).unwrap_or(i64::MAX),
            ),
        );
        let result = match Runner::new(
            self.inner.clone(),
            tenant,
            session,
            release,
            config,
            active.clone(),
            approvals,
            lost,
        ) {
            Ok(runner) => Arc::new(runner).run().await,
            Err(e) => Err(e),
        };
        // Whatever happened, this worker is done with the session: later submits go through the
        // store. (The runner set `closed` itself when it went idle, under the journal lock.)
        active.journal.lock().await.closed = true;
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&session);
        stop.cancel();
        let _ = hb.await;
        let _ = watcher.await;
        let (turns, status, version) = result?;
        let mut j = active.journal.lock().await;
        let pending = if status == SessionStatus::RequiresAction {
            self.pending_of(&mut j).await?
        } else {
            Vec::new()
        };
        // The durable timer: the earliest pending approval's expiry, or none.
        let wake = pending
            .iter()
            .filter_map(|p| match p {
                PendingAction::Approval { expires_at, .. } => Some(*expires_at),
                PendingAction::Effect { .. } => None,
            })
            .min();
        if let Err(e) = self.inner.store.set_wake_at(tenant, session, wake).await {
            tracing::warn!(%session, "setting the wake-up time: {e}");
        }
        Ok(RunOutcome {
            session_id: session,
            status,
            version,
            turns,
            pending,
        })
    }

    async fn pending_of(&self, j: &mut Journal) -> Result<Vec<PendingAction>> {
        let mut out = Vec::new();
        for call in j.state.open_tool_calls() {
            if call.status == ToolCallStatus::AwaitingApproval
                && let Some(a) = call.approval_id
            {
                let rec = self.inner.store.get_approval(j.tenant, a).await?;
                out.push(PendingAction::Approval {
                    approval_id: a,
                    tool_call_id: call.id.clone(),
                    tool_name: rec.tool_name,
                    arguments: rec.arguments,
                    args_hash: rec.args_hash,
                    expires_at: rec.expires_at,
                });
            }
            if let Some(key) = &call.operation_key
                && let Some(e) = j.state.effects.get(key)
                && e.status == EffectStatus::OutcomeUnknown
                && e.decision.is_none()
            {
                out.push(PendingAction::Effect {
                    operation_key: key.clone(),
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Runs every session of `tenant` whose wake-up time is due at `now` (at most 100 per call,
    /// oldest first): the durable timer set for a pending approval's expiry. [`Runtime::run`]
    /// expires overdue approvals before anything else — the call gets a `rejected` result saying
    /// the approval expired, and the turn continues — and sets the next wake-up time (or clears
    /// it). Hosts call this periodically (a worker loop, `keel` on start). A session this
    /// process runs is skipped; one another worker runs is skipped after waiting `lease_wait`
    /// for its lease (that worker acts on it).
    ///
    /// # Errors
    /// Store errors listing the sessions. A session that fails to run is logged and skipped.
    pub async fn run_due(
        &self,
        tenant: TenantId,
        now: chrono::DateTime<Utc>,
    ) -> Result<Vec<RunOutcome>> {
        let due = self
            .inner
            .store
            .list_sessions(
                tenant,
                &keel_store::SessionQuery {
                    wake_before: Some(now),
                    ..keel_store::SessionQuery::default()
                },
            )
            .await?;
        let mut out = Vec::with_capacity(due.len());
        for rec in due {
            if self.active(rec.session_id).is_some() {
                continue;
            }
            match self.run(tenant, rec.session_id).await {
                Ok(o) => out.push(o),
                Err(e) => tracing::warn!(session = %rec.session_id, "due session not run: {e}"),
            }
        }
        Ok(out)
    }

    /// Cancels the session's active turn (or, with none active, its oldest queued turn): journals
    /// `turn.cancel_requested` — a durable intent — and stops the stream and every running tool.
    /// Works from any process: when another live worker runs the session, a `cancel_turn` intent
    /// is posted (see [`crate::intent`]) and this returns once that worker has journaled it (it
    /// then stops the turn). The turn ends `aborted`, every open call gets a result. A session
    /// nobody runs (e.g. waiting in `requires_action`) is aborted at once (this call runs it).
    /// Returns the cancelled turn; cancelling a turn already being cancelled is a no-op.
    ///
    /// # Errors
    /// [`RuntimeError::NoActiveTurn`]; [`RuntimeError::SessionBusy`] when the worker running the
    /// session neither handles the intent nor gives the lease up within `lease_wait`; store
    /// errors.
    pub async fn cancel_turn(&self, tenant: TenantId, session: SessionId) -> Result<TurnId> {
        if let Ok(held) = self.hold_now(tenant, session).await? {
            return self.cancel_on(tenant, session, held).await;
        }
        let state = self.fold(tenant, session).await?;
        let Some(turn) = state.active_turn.or_else(|| state.queue.front().copied()) else {
            return Err(RuntimeError::NoActiveTurn { session });
        };
        let requested = |s: &SessionState| {
            s.turns
                .get(&turn)
                .is_some_and(|t| t.cancel_requested.is_some() || t.status.is_terminal())
        };
        if requested(&state) {
            return Ok(turn);
        }
        let payload = serde_json::to_value(CancelTurnIntent {
            turn_id: turn,
            reason: "cancelled by user".into(),
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("cancel: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::CANCEL_TURN, &payload, requested)
            .await?
        {
            Posted::Handled | Posted::Consumed(_) => Ok(turn),
            Posted::Local(held) => self.cancel_on(tenant, session, held).await,
        }
    }

    async fn cancel_on(
        &self,
        tenant: TenantId,
        session: SessionId,
        mut held: Held,
    ) -> Result<TurnId> {
        let j = held.journal();
        let Some(turn) = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied())
        else {
            self.unhold(tenant, held).await;
            return Err(RuntimeError::NoActiveTurn { session });
        };
        let already = j
            .state
            .turns
            .get(&turn)
            .is_some_and(|t| t.cancel_requested.is_some());
        let r = if already {
            Ok(0)
        } else {
            j.append(
                "turn.cancel_requested",
                vec![(
                    Correlation::turn(turn),
                    EventBody::TurnCancelRequested {
                        reason: "cancelled by user".into(),
                    },
                )],
            )
            .await
        };
        let local = matches!(held, Held::Local(_));
        if local
            && let Some(a) = self.active(session)
            && let Some(t) = a
                .turn_cancel
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
        {
            t.cancel();
        }
        self.unhold(tenant, held).await;
        r?;
        if !local {
            // Nobody runs the session here: finish the cancellation now.
            self.run(tenant, session).await?;
        }
        Ok(turn)
    }

    /// Cancels one running tool call: it gets a `cancelled` result and the turn continues. Works
    /// from any process: when another worker runs the session, a `cancel_tool_call` intent is
    /// posted and this returns once that worker has taken it (the result follows).
    ///
    /// # Errors
    /// [`RuntimeError::NoSuchToolCall`] when the call is not open in the session (or, for a
    /// session nobody runs, not running anywhere); [`RuntimeError::SessionBusy`]; store errors.
    pub async fn cancel_tool_call(
        &self,
        tenant: TenantId,
        session: SessionId,
        call: &ToolCallId,
    ) -> Result<()> {
        let no_such = || RuntimeError::NoSuchToolCall {
            session,
            call: call.clone(),
        };
        if let Some(t) = self.active(session).and_then(|a| {
            a.tool_cancel
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(call.as_str())
                .cloned()
        }) {
            t.cancel();
            return Ok(());
        }
        if let Ok(held) = self.hold_now(tenant, session).await? {
            // Nobody runs the session, so nothing runs the call.
            self.unhold(tenant, held).await;
            return Err(no_such());
        }
        let finished = |s: &SessionState| {
            s.tool_calls
                .get(call)
                .is_none_or(|c| c.status.is_terminal())
        };
        if finished(&self.fold(tenant, session).await?) {
            return Err(no_such());
        }
        let payload = serde_json::to_value(CancelToolCallIntent {
            call_id: call.clone(),
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("cancel: {e}")))?;
        match self
            .post_and_wait(
                tenant,
                session,
                intent::CANCEL_TOOL_CALL,
                &payload,
                finished,
            )
            .await?
        {
            Posted::Handled | Posted::Consumed(_) => Ok(()),
            Posted::Local(held) => {
                self.unhold(tenant, held).await;
                Err(no_such())
            }
        }
    }

    /// Records a human's decision on an approval (durably, in the approvals table; idempotent for
    /// the same decision). The session continues on the next [`Runtime::run`], on any worker.
    ///
    /// # Errors
    /// [`RuntimeError::Tools`] when the hash does not match, the approval is decided otherwise
    /// or expired, or does not exist.
    pub async fn decide_approval(
        &self,
        tenant: TenantId,
        approval: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
    ) -> Result<ApprovalRecord> {
        let svc = ApprovalService::new(self.inner.store.clone(), tenant);
        Ok(svc
            .decide(approval, decision, args_hash, Utc::now())
            .await?)
    }

    /// Records a human's decision on an `outcome_unknown` effect (`effect.decided`): `committed`
    /// (it happened; the outcome is the call's result), `failed` (it did not; the model sees a
    /// failure) or `retry` (dispatch again as a new attempt). Applied by the next
    /// [`Runtime::run`].
    ///
    /// # Errors
    /// [`RuntimeError::EffectNotUnknown`]; [`RuntimeError::SessionBusy`]; store errors.
    pub async fn resolve_effect(
        &self,
        tenant: TenantId,
        session: SessionId,
        key: &OperationKey,
        decision: EffectDecision,
    ) -> Result<()> {
        let mut held = self.hold(tenant, session).await?;
        let j = held.journal();
        let ok = j
            .state
            .effects
            .get(key)
            .is_some_and(|e| e.status == EffectStatus::OutcomeUnknown && e.decision.is_none());
        let r = if ok {
            j.append(
                "effect.decided",
                vec![(
                    Correlation::default().with_operation(key.clone()),
                    EventBody::EffectDecided { decision },
                )],
            )
            .await
            .map(|_| ())
        } else {
            Err(RuntimeError::EffectNotUnknown {
                session,
                key: key.clone(),
            })
        };
        self.unhold(tenant, held).await;
        r
    }

    /// Subscribes to the session from journal sequence number `from_seq` (1 = everything):
    /// durable events replayed then tailed, plus live deltas. See [`crate::subscribe`].
    ///
    /// # Errors
    /// Store errors (`NotFound`).
    pub async fn subscribe(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
    ) -> Result<Subscription> {
        let rec = self.inner.store.get_session(tenant, session).await?;
        let _ = rec;
        let deltas = self.inner.hub.sender(session).subscribe();
        let first = self.inner.store.read(tenant, session, 1, Some(1)).await?;
        let redactor = match first.first().map(|e| &e.body) {
            Some(EventBody::SessionCreated { config, .. }) => {
                // A config this build cannot read must not silently drop its secret patterns.
                let c: SessionConfig =
                    serde_json::from_value(config.clone()).map_err(|e| RuntimeError::Config {
                        session,
                        reason: e.to_string(),
                    })?;
                Redactor::new(&c.secret_patterns, &c.secret_env)?
            }
            _ => Redactor::new(&[], &[])?,
        };
        Ok(Subscription::new(
            self.inner.store.clone(),
            tenant,
            session,
            from_seq,
            deltas,
            Arc::new(redactor),
        ))
    }

    /// The session folded from its journal (no lease needed).
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Rejected`] for a journal that does not fold.
    pub async fn view(&self, tenant: TenantId, session: SessionId) -> Result<SessionView> {
        let j = Journal::load(
            self.inner.store.clone(),
            tenant,
            session,
            keel_core::LeaseEpoch(0),
            Arc::new(Redactor::new(&[], &[])?),
        )
        .await?;
        let mut turns: Vec<TurnOutcome> = j
            .state
            .turn_order
            .iter()
            .filter_map(|t| j.proj.finished.get(t).cloned())
            .collect();
        turns.shrink_to_fit();
        Ok(SessionView {
            state: j.state,
            turns,
        })
    }

    /// What the model would see if the session sampled its next step now (for inspection and
    /// tests; the same projection the turn loop uses).
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Config`].
    pub async fn project_context(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<ContextSnapshot> {
        let j = Journal::load(
            self.inner.store.clone(),
            tenant,
            session,
            keel_core::LeaseEpoch(0),
            Arc::new(Redactor::new(&[], &[])?),
        )
        .await?;
        let config = config_of(&j)?;
        let release_id = j.state.release_id.clone().ok_or(RuntimeError::Config {
            session,
            reason: "no session.created".into(),
        })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let policy = crate::turn::session_policy(&config, &j, &self.inner.tools)?;
        Ok(crate::context::project(
            &release.definition.instructions,
            &config.workspace,
            &release.definition.tools,
            &self.inner.tools,
            policy,
            &j.proj,
        ))
    }

    pub(crate) fn active(&self, session: SessionId) -> Option<Arc<Active>> {
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .cloned()
    }

    async fn load(&self, tenant: TenantId, session: SessionId, lease: &Lease) -> Result<Journal> {
        let mut j = Journal::load(
            self.inner.store.clone(),
            tenant,
            session,
            lease.epoch,
            Arc::new(Redactor::new(&[], &[])?),
        )
        .await?;
        if j.state.session_id.is_some() {
            let config = config_of(&j)?;
            j.redactor = Arc::new(Redactor::new(&config.secret_patterns, &config.secret_env)?);
        }
        Ok(j)
    }

    /// Holds the session now if this process runs it or its lease is free (or a dead local
    /// worker's); otherwise returns the live holder's owner string.
    pub(crate) async fn hold_now(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<std::result::Result<Held, String>> {
        if let Some(a) = self.active(session) {
            let g = a.journal.clone().lock_owned().await;
            if !g.closed {
                return Ok(Ok(Held::Local(g)));
            }
        }
        let lease = match lease::acquire(
            &self.inner.store,
            tenant,
            session,
            &self.inner.owner,
            self.inner.options.lease_ttl,
            Duration::ZERO,
        )
        .await
        {
            Ok(l) => l,
            Err(RuntimeError::SessionBusy { owner, .. }) => return Ok(Err(owner)),
            Err(e) => return Err(e),
        };
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Ok(Held::Leased(Box::new(j), lease))),
            Err(e) => {
                let _ = self.inner.store.release_lease(tenant, &lease).await;
                Err(e)
            }
        }
    }

    async fn hold(&self, tenant: TenantId, session: SessionId) -> Result<Held> {
        if let Some(a) = self.active(session) {
            let g = a.journal.clone().lock_owned().await;
            if !g.closed {
                return Ok(Held::Local(g));
            }
        }
        let opts = &self.inner.options;
        let lease = lease::acquire(
            &self.inner.store,
            tenant,
            session,
            &self.inner.owner,
            opts.lease_ttl,
            opts.lease_wait,
        )
        .await?;
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Held::Leased(Box::new(j), lease)),
            Err(e) => {
                let _ = self.inner.store.release_lease(tenant, &lease).await;
                Err(e)
            }
        }
    }

    pub(crate) async fn unhold(&self, tenant: TenantId, held: Held) {
        if let Held::Leased(_, lease) = held
            && let Err(e) = self.inner.store.release_lease(tenant, &lease).await
        {
            tracing::debug!(session = %lease.session_id, "lease release: {e}");
        }
    }
}

pub(crate) fn strategy_of(j: &Journal, strategy: Option<MultitaskStrategy>) -> MultitaskStrategy {
    strategy.unwrap_or_else(|| config_of(j).map(|c| c.multitask).unwrap_or_default())
}

/// The session's effective config (created + changes, folded).
pub(crate) fn config_of(j: &Journal) -> Result<SessionConfig> {
    serde_json::from_value(j.state.config.clone()).map_err(|e| RuntimeError::Config {
        session: j.session,
        reason: e.to_string(),
    })
}
