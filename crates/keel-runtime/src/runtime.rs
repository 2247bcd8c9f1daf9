//! The public face of the runtime: [`Runtime`] and what its calls return; changing sessions'
//! settings, and running them ([`Runtime::run`] hands a session to the driver). Creating
//! sessions is in `creation`, input, cancellation and decisions in `control`, inspection in
//! `inspect`, holding a session's journal in `hold`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::Utc;
use keel_core::{
    ApprovalId, Budget, Correlation, EffectStatus, EventBody, OperationKey, PrincipalId, SessionId,
    SessionState, SessionStatus, TenantId, ToolCallId, ToolCallStatus,
};
use keel_model::ModelClient;
use keel_store::{Lease, Store};
use keel_tools::ToolRegistry;
use keel_tools::approval::ApprovalService;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::{RuntimeOptions, SessionConfig};
use crate::driver::Runner;
use crate::error::{Result, RuntimeError};
use crate::hold::Held;
use crate::intent;
use crate::journal::{Journal, TurnOutcome};
use crate::lease;
use crate::shared::{Active, Inner};
use crate::subscribe::Hub;

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
        /// Its arguments as shown to people: secrets redacted (the call runs with the exact ones).
        arguments: Value,
        /// Hash the decision must name.
        args_hash: String,
        /// When it expires (the call is then rejected).
        expires_at: chrono::DateTime<Utc>,
        /// The sub-agent session it belongs to, when it is not the run's own session's (a
        /// child's approval surfaced to its parent's host); decided by its id like any other.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subagent: Option<PendingSubagent>,
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
        /// The sub-agent session it belongs to, when it is not the run's own session's: the
        /// decision is then [`Runtime::resolve_effect`] on that session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subagent: Option<PendingSubagent>,
    },
}

/// The sub-agent session a [`PendingAction`] belongs to: a child (or a child's child) of the
/// session that was run, whose `spawn_agent` call waits on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingSubagent {
    /// The child session that waits.
    pub session_id: SessionId,
    /// Its agent's name (the release's).
    pub agent: String,
}

impl PendingAction {
    /// The sub-agent session it belongs to (`None`: the run's own session).
    pub fn subagent(&self) -> Option<&PendingSubagent> {
        match self {
            PendingAction::Approval { subagent, .. } | PendingAction::Effect { subagent, .. } => {
                subagent.as_ref()
            }
        }
    }

    /// The same action, labelled with the sub-agent session `session_id` (`agent`) unless it
    /// already names one (a grandchild's stays labelled with its own session).
    pub(crate) fn in_subagent(mut self, session_id: SessionId, agent: &str) -> Self {
        let (PendingAction::Approval { subagent, .. } | PendingAction::Effect { subagent, .. }) =
            &mut self;
        if subagent.is_none() {
            *subagent = Some(PendingSubagent {
                session_id,
                agent: agent.to_owned(),
            });
        }
        self
    }
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
    /// The run was drained ([`Runtime::run_claimed`]) and stopped with work left: `status` is
    /// still `running` (or what it was), the active turn is not ended, everything this run did
    /// is committed and nothing it started is still running; the worker that claims the session
    /// next continues the turn where it stopped. False when the run ended on its own (idle,
    /// `requires_action`, closed), drain or not.
    pub drained: bool,
    /// The per-turn budget the session's turns run under when the run ended: its settings'
    /// `turn_budget` over its release's budget, limit by limit (what the runner checks before
    /// each step). `None` when the outcome was not made by a run (a host following another
    /// process's run).
    pub turn_budget: Option<Budget>,
}

/// A session's state as folded from its journal.
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The fold.
    pub state: SessionState,
    /// Every finished turn's outcome.
    pub turns: Vec<TurnOutcome>,
}

/// The runtime kernel of one worker process. Cheap to clone; share one per process.
///
/// Sessions are durable: every call below works from the journal, so any worker (this process
/// after a restart, or another one sharing the store) can continue a session.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
    /// The principal the calls of this handle act for ([`Runtime::acting_as`]).
    pub(crate) actor: Option<PrincipalId>,
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
        let inner = Arc::new_cyclic(|weak| {
            // `spawn_agent` runs child sessions on this runtime; only releases that define
            // agents are offered it (see `crate::pinned::tool_enabled`).
            let mut tools = tools;
            if tools.get(crate::subagents::SPAWN_AGENT).is_none()
                && let Err(e) = tools
                    .register_constant(Arc::new(crate::subagents::SpawnAgent::new(weak.clone())))
            {
                tracing::warn!("spawn_agent not registered: {e}");
            }
            Inner {
                leases: lease::LeaseKeeper::new(store.clone(), options.lease_ttl),
                store,
                model,
                tools: crate::tool_catalog::ToolCatalog::new(tools),
                options,
                owner,
                hub,
                active: Mutex::new(HashMap::new()),
                gates: crate::hold::Gates::default(),
                parked: crate::hold::Parked::default(),
                takeovers: Mutex::new(HashMap::new()),
                child_models: Mutex::new(HashMap::new()),
                child_slots: Mutex::new(HashMap::new()),
                spend: crate::spend::Pools::default(),
                descendant_slots: Mutex::new(HashMap::new()),
            }
        });
        Self { inner, actor: None }
    }
    /// Makes `provider` the source of the tools a release adds to the built-in ones (its MCP
    /// servers, `AgentDefinition::mcp_servers`): asked once per release and workspace when a
    /// session of it first runs here; their lists are read again before a step when they
    /// changed. Without one, releases' servers are not started (and their tools not offered).
    pub fn set_tool_provider(&self, provider: Arc<dyn keel_tools::ToolProvider>) {
        self.inner.tools.set_provider(provider);
    }

    /// A handle on the same runtime whose calls act for `principal`: the changes they journal
    /// (`session.created`, `session.config_changed`, `session.release_pinned`, closing,
    /// `turn.queued`, `turn.cancel_requested`, `effect.decided`, a cancelled call's
    /// `tool_call.finished`) carry its id as the envelope's `principal_id`, and an approval it
    /// decides records it (`decided_by`, then `approval.decided`'s `principal_id`). Hosts that
    /// authenticate callers (the HTTP API) use one per request; the local CLI acts for nobody.
    #[must_use]
    pub fn acting_as(&self, principal: PrincipalId) -> Self {
        Self {
            inner: self.inner.clone(),
            actor: Some(principal),
        }
    }
    /// The principal this handle acts for, if any.
    pub fn actor(&self) -> Option<PrincipalId> {
        self.actor
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }
    /// This worker's lease owner string (`<name>@<host>:<pid>/pidns:<inode>`).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }
    /// Changes the session's settings: `change` edits a copy of the effective config (the one
    /// pinned in `session.created` with every earlier change merged in); the result is validated
    /// as [`Runtime::create_session`] validates a config, and the difference is journaled as
    /// `session.config_changed` (a JSON merge patch). Every later step, tool call and turn — on
    /// any worker, after a restart too — uses the new settings: permission mode, `ask`/`deny`
    /// rules (added to the release's), sandbox, budgets, timeouts, compaction, multitask
    /// strategy, `host`. The model route, tools and policy rules are the release's: change them
    /// with [`Runtime::repin`]. A change equal to the
    /// current config writes nothing. Allowed between turns and while the active turn waits on a
    /// human (`requires_action`); an approval already requested keeps waiting for its decision.
    /// Returns the effective config afterwards.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a bad value (rule, fraction, workspace, negative cost),
    /// a change of `secret_patterns`/`secret_env` (fixed at creation) or of `allow` rules (a
    /// release's, see [`crate::pinned`]);
    /// [`RuntimeError::SessionBusy`] when a worker (this process or another) is running the
    /// session — change it once that run returns. A turn nobody runs (waiting on a human,
    /// queued, or left by a crashed worker) does not stop the change: the next step takes it;
    /// [`RuntimeError::Closed`]; [`RuntimeError::Config`]; store errors. Nothing is written on
    /// error.
    pub async fn update_config(
        &self,
        tenant: TenantId,
        session: SessionId,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<SessionConfig> {
        let held = match self.inner.hold_now(tenant, session).await? {
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
        let r = Self::update_held(held.journal(), change, self.actor).await;
        self.inner.unhold(tenant, held).await;
        r
    }
    async fn update_held(
        j: &mut Journal,
        change: impl FnOnce(&mut SessionConfig),
        by: Option<PrincipalId>,
    ) -> Result<SessionConfig> {
        let (new, changes) = Self::planned_config(j, change)?;
        let Some(changes) = changes else {
            return Ok(new);
        };
        j.append(
            "session.config_changed",
            vec![(
                Correlation::default().by(by),
                EventBody::SessionConfigChanged { changes },
            )],
        )
        .await?;
        j.config()
    }

    /// The config `change` makes of the session's current one, validated as
    /// [`Runtime::update_config`] validates it, and its difference (a JSON merge patch; `None`
    /// when nothing changes). Writes nothing.
    pub(crate) fn planned_config(
        j: &Journal,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<(SessionConfig, Option<serde_json::Value>)> {
        let session = j.session;
        if j.state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        let old = j.config()?;
        let mut new = old.clone();
        change(&mut new);
        if new.secret_patterns != old.secret_patterns || new.secret_env != old.secret_env {
            return Err(RuntimeError::InvalidInput(format!(
                "session {session}: secret_patterns and secret_env are fixed when the session is created"
            )));
        }
        new.validate()?;
        crate::pinned::check_settings_rules(&new, Some(&old.allow))?;
        let value = |c: &SessionConfig| {
            serde_json::to_value(c).map_err(|e| RuntimeError::InvalidInput(format!("config: {e}")))
        };
        let changes = keel_core::merge_diff(&value(&old)?, &value(&new)?);
        if changes.as_object().is_some_and(serde_json::Map::is_empty) {
            return Ok((new, None));
        }
        Ok((new, Some(changes)))
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
    ///
    /// The run is a task of its own on the runtime's worker threads (dropping the returned
    /// future aborts it, as dropping the run itself would): the tasks a step spawns (its group
    /// commit, its tool calls) then start on the same worker thread instead of waking another
    /// one, which on the step benchmark cut context switches from ~43 to ~30 per read-only step
    /// (docs/BENCHMARKS.md, "A step on a quiet machine").
    pub async fn run(&self, tenant: TenantId, session: SessionId) -> Result<RunOutcome> {
        let rt = self.clone();
        crate::background::on_worker(session, async move { rt.run_here(tenant, session).await })
            .await
    }

    /// [`Runtime::run`] on the caller's task.
    async fn run_here(&self, tenant: TenantId, session: SessionId) -> Result<RunOutcome> {
        let opts = &self.inner.options;
        let lease = match self.inner.unpark(session).await? {
            Some(lease) => lease,
            None => {
                lease::acquire_as(
                    &self.inner.store,
                    tenant,
                    session,
                    &self.inner.owner,
                    opts.lease_ttl,
                    opts.lease_wait,
                    lease::Takeover::Observed,
                )
                .await?
            }
        };
        let result = self
            .run_leased(tenant, session, &lease, false, CancellationToken::new())
            .await;
        if let Err(e) = self.inner.store.release_lease(tenant, &lease).await {
            tracing::debug!(%session, "lease release: {e}");
        }
        result
    }
    /// Runs a session a scheduler claimed ([`keel_store::Store::claim_session`]) under the
    /// claim's `lease`, as [`Runtime::run`] does under the lease it takes: recovery first, then
    /// the turn loop until the session is idle, waits on a human or is closed. The lease must
    /// be this worker's (taken for [`Runtime::owner`]); heartbeats renew it while the run lasts,
    /// and it is **not** released: the caller gives the session back
    /// ([`keel_store::Store::release_claim`]) after this returns, whatever it returned.
    ///
    /// **Drain.** Once `drain` is cancelled the loop stops at the next durable boundary: it
    /// starts nothing new (no turn, model call, compaction, tool call or reconcile check), lets
    /// what runs finish — a model step streaming completes (retries included; a wait for the
    /// tenant's token rate ends at once), tool calls running complete — commits their results,
    /// and returns [`RunOutcome::drained`] with the turn still active: not aborted, no terminal
    /// event, nothing left `running` in the journal, so the next worker that claims the session
    /// plans the same next step from the journal (no call becomes `outcome_unknown`). Pure
    /// bookkeeping still happens (a turn whose last step completed finishes; a session with
    /// nothing left goes idle). The session stays runnable ([`keel_store::WorkMark`]).
    ///
    /// **Hard stop.** Dropping the returned future (the drain deadline) is a crash of this run:
    /// the heartbeat and intent watcher stop, tools still running here are cancelled, the
    /// session is no longer this process's, and whatever was staged and not committed is lost;
    /// the next worker recovers it as after a crash (a dispatched side effect becomes
    /// `outcome_unknown` and is reconciled). The caller still releases the claim.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] when `lease` is another session's;
    /// [`RuntimeError::LeaseLost`] (another worker took the session over; releasing the claim
    /// then fails too), store errors. A failing model or tool does not make it fail.
    pub async fn run_claimed(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: &Lease,
        drain: CancellationToken,
    ) -> Result<RunOutcome> {
        if lease.session_id != session {
            return Err(RuntimeError::InvalidInput(format!(
                "the lease is session {}'s, not {session}'s",
                lease.session_id
            )));
        }
        self.run_leased(tenant, session, lease, false, drain).await
    }

    /// [`Runtime::run_claimed`] for a scheduler's `claim`, knowing whom it took the session
    /// from: when it took over an expired lease of a holder that may still be alive
    /// (`Claim::took_over`, not a dead process of this host), an effect that holder left
    /// `dispatched` is declared `outcome_unknown` only once the lease TTL and a tenth have
    /// passed since the claim — by then the holder has found the lease lost and killed its
    /// tools, or fenced itself (see [`lease::LeaseKeeper`], "The fence"), even when its clock
    /// and this worker's disagree. Nothing else waits. ([`Runtime::run`] and the short
    /// operations watch such a lease before they take it instead: see [`lease::Takeover`].)
    ///
    /// # Errors
    /// As [`Runtime::run_claimed`].
    pub async fn run_claim(
        &self,
        claim: &keel_store::Claim,
        drain: CancellationToken,
    ) -> Result<RunOutcome> {
        let (tenant, lease) = (claim.tenant_id, &claim.lease);
        let live = claim
            .took_over
            .as_deref()
            .filter(|prev| !lease::owner_is_dead_local_process(prev));
        self.inner.note_takeover(lease.session_id, live);
        self.run_claimed(tenant, lease.session_id, lease, drain)
            .await
    }
    /// Runs the session under `lease` (held by this process). With `finish_only`, only ends
    /// the turns whose end is due (a cancellation) and stops before anything else: see
    /// `Runner::finish_only`. A takeover noted for the session (`Inner::note_takeover`) sets
    /// `Runner::settle_after`. Cancelling `drain` stops the loop at the next durable boundary
    /// (see [`Runtime::run_claimed`]).
    pub(crate) async fn run_leased(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: &Lease,
        finish_only: bool,
        drain: CancellationToken,
    ) -> Result<RunOutcome> {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        // The lease is renewed from the start (by the runtime's keeper, with every other lease
        // it holds): loading the journal and setting the run up can outlast a short TTL on a
        // busy worker (a batch of claimed runs starting at once), and a lease that expired
        // meanwhile would be taken over under the run. Kept until the run ends, or its future
        // is dropped; the watcher stops on every way out, an early error included.
        let _stop_watcher = stop.clone().drop_guard();
        let kept = self.inner.leases.keep(tenant, lease.clone(), lost.clone());
        // The large futures of the run's set-up and turn loop are boxed: a run waiting on its
        // model holds the loop's live state, not room for the largest step of every kind.
        let mut journal = Box::pin(self.inner.load(tenant, session, lease)).await?;
        // Intents posted while nobody ran the session (or left by a crashed handler) first.
        Box::pin(crate::intent::handle_intents(
            &self.inner,
            &mut journal,
            None,
        ))
        .await?;
        Box::pin(crate::effects::reconcile(
            self.inner.store.as_ref(),
            tenant,
            &journal.state,
        ))
        .await?;
        Box::pin(crate::transcript::reconcile(&journal)).await?;
        let config = journal.config()?;
        let release_id = journal
            .state
            .release_id
            .clone()
            .ok_or(RuntimeError::Config {
                session,
                reason: "the journal has no session.created".into(),
            })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let release_budget = release.definition.budget;
        let redactor = journal.redactor.clone();
        // Who created the session (its tool calls' `SessionScope::creator`, whose per-user
        // memory they use): the principal of `session.created`, the journal's first event.
        let creator = self
            .inner
            .store
            .read(tenant, session, 0, Some(1))
            .await?
            .first()
            .and_then(|e| e.correlation.principal_id);
        let active = Arc::new(Active::new(journal, lost.clone()));
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session, active.clone());
        // Until the end below, dropping this future stops everything the run started.
        let guard = RunGuard {
            inner: self.inner.clone(),
            session,
            active: active.clone(),
            stop: stop.clone(),
            lost: lost.clone(),
            finished: false,
        };
        let watcher = intent::spawn_watcher(
            self.inner.clone(),
            tenant,
            session,
            active.clone(),
            stop.clone(),
        );
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
            redactor,
            active.clone(),
            approvals,
            lost,
            creator,
        ) {
            Ok(mut runner) => {
                runner.finish_only = finish_only;
                runner.settle_after = self.inner.settle_after(session);
                runner.drain = drain;
                Box::pin(Arc::new(runner).run()).await
            }
            Err(e) => Err(e),
        };
        // Whatever happened, this worker is done with the session: later submits go through the
        // store. (The runner set `closed` itself when it went idle, under the journal lock.)
        active.journal.lock().await.closed = true;
        guard.finish();
        drop(kept);
        let _ = watcher.await;
        let ended = result?;
        let mut j = active.journal.lock().await;
        let pending = if ended.status == SessionStatus::RequiresAction {
            let mut own = self.pending_of(&mut j).await?;
            // What the children of calls detached for a human wait for (crate::subagents).
            own.append(&mut crate::background::lock(&active.child_pending));
            own
        } else {
            Vec::new()
        };
        let config = j.config().ok();
        drop(j);
        let turn_budget = config
            .as_ref()
            .map(|c| crate::config::merge_budget(release_budget, c.turn_budget));
        let link = config.and_then(|c| c.subagent);
        if let Some(link) = link
            && ended.status != SessionStatus::RequiresAction
        {
            crate::subagents::wake_parent(&self.inner, tenant, link.parent_session_id).await;
        }
        // The durable timer (the earliest pending approval's expiry, or none) was committed
        // with the run's last phase.
        Ok(RunOutcome {
            session_id: session,
            status: ended.status,
            version: ended.version,
            turns: ended.turns,
            pending,
            drained: ended.drained,
            turn_budget,
        })
    }
    async fn pending_of(&self, j: &mut Journal) -> Result<Vec<PendingAction>> {
        let mut out = Vec::new();
        for call in j.state.open_tool_calls() {
            if call.status == ToolCallStatus::AwaitingApproval
                && let Some(a) = call.approval_id
            {
                let rec = self.inner.store.get_approval(j.tenant, a).await?;
                // Decided in the table but not yet applied (the call waits behind an earlier
                // one): nothing for a human to do.
                if rec.status != keel_core::ApprovalStatus::Pending {
                    continue;
                }
                out.push(PendingAction::Approval {
                    approval_id: a,
                    tool_call_id: call.id.clone(),
                    tool_name: rec.tool_name,
                    arguments: rec.arguments,
                    args_hash: rec.args_hash,
                    expires_at: rec.expires_at,
                    subagent: None,
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
                    subagent: None,
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
            if self.inner.active(rec.session_id).is_some() {
                continue;
            }
            match self.run(tenant, rec.session_id).await {
                Ok(o) => out.push(o),
                Err(e) => tracing::warn!(session = %rec.session_id, "due session not run: {e}"),
            }
        }
        Ok(out)
    }
}

/// What a run of a session started besides its loop, stopped when the run ends — or when its
/// future is dropped mid-way (a hard stop: see [`Runtime::run_claimed`]).
struct RunGuard {
    inner: Arc<Inner>,
    session: SessionId,
    active: Arc<Active>,
    /// Stops the heartbeat and the intent watcher.
    stop: CancellationToken,
    /// Cancels everything below the run (the turn's token, so running tools stop).
    lost: CancellationToken,
    /// The run ended normally ([`RunGuard::finish`]).
    finished: bool,
}

impl RunGuard {
    /// The run ended normally: the session is no longer this process's; the heartbeat and the
    /// watcher stop.
    fn finish(mut self) {
        self.finished = true;
        self.release_session();
        self.stop.cancel();
    }

    fn release_session(&self) {
        let mut active = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Only this run's handle (a later run of the session may have registered its own).
        if active
            .get(&self.session)
            .is_some_and(|a| Arc::ptr_eq(a, &self.active))
        {
            active.remove(&self.session);
        }
    }
}

impl Drop for RunGuard {
    /// The run's future was dropped before it ended: as if this worker crashed. Nothing more is
    /// committed (the journal is closed when it can be locked, and the lease's holder releases
    /// the lease), tools running here are cancelled, and the session is no longer this
    /// process's.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.lost.cancel();
        self.stop.cancel();
        if let Ok(mut j) = self.active.journal.try_lock() {
            j.closed = true;
        }
        self.release_session();
        tracing::warn!(session = %self.session, "the run was stopped before it ended");
    }
}
