//! The driver: asks the planner ([`keel_core::plan::next`]) what to do, does it, journals it.
//!
//! [`Runner::run`] is the whole loop. Each pass gathers the plain facts the planner needs (the
//! step's frozen policy verdict for each open call, the approvals table's decisions, the
//! context estimate, the tenant's usage) and matches the answer exhaustively; each arm hands
//! off to the phase module that owns it: [`crate::sampling`], [`crate::tools`],
//! [`crate::approvals`], [`crate::recovery`], [`crate::compaction`], [`crate::turn_end`].
//!
//! **One store commit per phase.** Events are staged ([`Journal::stage`]) as work happens and
//! committed together ([`Journal::commit`]) only where durability is owed: when a turn starts;
//! before a side effect is dispatched (its intent: `effect.prepared` + `effect.dispatched` +
//! `tool_call.started`, with the step's proposal and validation when they are still staged);
//! after a side effect's outcome (merged into the next dispatch's commit or the step's end);
//! when a step's calls have all finished (`turn.sampling`: a read-only step is one commit; made
//! while the next step's model request goes out when that comes next, see [`Runner::run`]);
//! before waiting on a human; when the turn finishes; when the session goes idle. A crash
//! loses at most the staged part of the current step, which the planner then plans again
//! (a read-only call re-runs, a model step re-samples from the same scripted position).

use keel_core::mechanisms::Mechanism;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use keel_core::plan::{CallFacts, Next};
use keel_core::{
    Correlation, EventBody, OperationKey, Release, SessionId, SessionStatus, StateMachine, StepId,
    TenantId, ToolCallId, TurnId, TurnStatus,
};
use keel_tools::approval::ApprovalService;
use keel_tools::artifact::{ArtifactSink, StoreArtifactSink};
use keel_tools::policy::Policy;
use keel_tools::sandbox::Sandbox;
use keel_tools::tool::ProgressSink;
use keel_tools::workspace::Workspace;
use tokio_util::sync::CancellationToken;

use crate::background::{AbortOnDrop, lock, phase_item, status_item};
use crate::config::SessionConfig;
use crate::context::ContextSnapshot;
use crate::error::{Result, RuntimeError};
use crate::journal::{Journal, TurnOutcome};
use crate::progress::HubProgress;
use crate::redact::Redactor;
use crate::shared::{Active, Inner};
use crate::subscribe::{Delta, DeltaKind};

/// `(correlation, body)` pairs to stage.
pub(crate) type Items = Vec<(Correlation, EventBody)>;

/// One worker's run of one session.
pub(crate) struct Runner {
    pub(crate) rt: Arc<Inner>,
    pub(crate) tenant: TenantId,
    pub(crate) session: SessionId,
    pub(crate) release: Release,
    pub(crate) config: SessionConfig,
    /// The model this session samples: the runtime's, or a child session's own
    /// ([`Inner::model_for`]).
    pub(crate) model: Arc<dyn keel_model::ModelClient>,
    pub(crate) active: Arc<Active>,
    pub(crate) approvals: ApprovalService,
    /// Cancelled when the lease is lost.
    pub(crate) lost: CancellationToken,
    pub(crate) workspace: Workspace,
    pub(crate) sandbox: Sandbox,
    pub(crate) artifacts: Arc<dyn ArtifactSink>,
    pub(crate) progress: Arc<dyn ProgressSink>,
    pub(crate) hub_progress: Arc<HubProgress>,
    /// The root span of the turn this run works on (`crate::telemetry`).
    pub(crate) trace: crate::telemetry::TurnTrace,
    /// The session's secrets, for deltas (redacted as streams before they leave the runner).
    pub(crate) redactor: Arc<Redactor>,
    /// Who the session's tool calls run for ([`ToolContext::session`]).
    pub(crate) scope: Arc<keel_tools::SessionScope>,
    pub(crate) deltas: crate::subscribe::DeltaSender,
    /// Tool tasks running in this process.
    pub(crate) inflight: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The tools of the current step (see [`crate::tool_catalog`]): taken when the run starts
    /// and before each new step, kept for the whole step.
    pub(crate) step_tools: Mutex<Arc<keel_tools::ToolRegistry>>,
    /// The policy frozen with the last step's snapshot.
    pub(crate) step_policy: Mutex<Option<(StepId, Policy)>>,
    /// What validation and the step's frozen policy said of each call (stable per step).
    pub(crate) call_facts: Mutex<HashMap<ToolCallId, CallFacts>>,
    /// The snapshot the last planning pass projected, for the step it planned.
    pub(crate) snapshot: Mutex<Option<(u64, ContextSnapshot)>>,
    /// Compactions that failed per turn (besides provider overflows).
    pub(crate) compaction_failures: Mutex<HashMap<TurnId, u32>>,
    /// A compaction before the next step failed: sample without it.
    pub(crate) skip_compaction: AtomicBool,
    /// Effects whose reconcile answered "unknown" here.
    pub(crate) unreconciled: Mutex<BTreeSet<OperationKey>>,
    /// A side effect's outcome is staged and not yet committed.
    pub(crate) pending_outcome: AtomicBool,
    /// Turns finished by this run.
    pub(crate) finished: Mutex<Vec<TurnId>>,
    /// Only end turns whose end is due (a cancellation, a timeout): stop before anything else
    /// — no queued turn is started, no model sampled, no tool run. What `cancel_turn` does for a
    /// session nobody runs; the rest waits for the next run with the session's model.
    pub(crate) finish_only: bool,
    /// Cancelled to drain the run ([`crate::Runtime::run_claimed`]): the loop stops before it
    /// starts more work (see [`starts_work`]); what runs finishes and commits first.
    pub(crate) drain: CancellationToken,
    /// Not before this moment is an effect another run left `dispatched` declared
    /// `outcome_unknown` (and so put to a reconcile or a human): set when the run's lease was
    /// taken over from a holder that may still be alive (its lease expired: a worker cut off
    /// from the store, or one whose clock is behind this one's). By then that holder has
    /// renewed, found the lease lost and killed its tools, or fenced itself when its lease
    /// lapsed (see `lease::LeaseKeeper`, "The fence") — the effect can no longer land after
    /// someone looked and found it had not happened. `None`: the previous holder is gone (it
    /// released the lease, or its process is dead).
    pub(crate) settle_after: Option<tokio::time::Instant>,
    /// What a step's attempt used when the turn stopped it (cancelled, timed out): counted in
    /// the `step.failed` the turn's end journals for the step.
    pub(crate) unsettled_usage: Mutex<Option<UnsettledUsage>>,
}

/// Usage of an attempt the turn's end settles (see [`Runner::unsettled_usage`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnsettledUsage {
    /// The step.
    pub(crate) step: StepId,
    /// Tokens used (reported, or estimated).
    pub(crate) usage: keel_core::Usage,
    /// Their cost, USD.
    pub(crate) cost_usd: f64,
    /// `usage` is an estimate.
    pub(crate) estimated: bool,
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rt: Arc<Inner>,
        tenant: TenantId,
        session: SessionId,
        release: Release,
        config: SessionConfig,
        redactor: Arc<Redactor>,
        active: Arc<Active>,
        approvals: ApprovalService,
        lost: CancellationToken,
        creator: Option<keel_core::PrincipalId>,
    ) -> Result<Self> {
        let workspace = Workspace::new(&config.workspace)?.protecting(&rt.options.hidden_paths);
        // A host with workspace roots (`keel serve`) stored the workspace canonical, checked
        // against the roots and the tenant's claim, when the session was created. A directory
        // on that path since replaced by a symlink (or moved) would take the session somewhere
        // that was never checked — another tenant's workspace: refused.
        if !rt.options.workspace_roots.is_empty() && workspace.root() != config.workspace {
            return Err(RuntimeError::Config {
                session,
                reason: format!(
                    "the workspace {} now resolves to {}: a directory on its path was replaced or moved after the session was created, and keel does not follow it",
                    config.workspace.display(),
                    workspace.root().display()
                ),
            });
        }
        let sandbox = Sandbox::new(config.sandbox)?
            .with_network(config.sandbox_network)
            .withholding(&rt.options.withheld_env)
            .passing(&rt.options.passed_env)
            .setting(&rt.options.tool_env)
            .hiding(&rt.options.hidden_paths)
            .isolating(&rt.options.workspace_roots);
        let deltas = rt.hub.sender(session);
        // The journal's redactor (see `crate::secrets`): what is journaled and what is shown
        // live are redacted alike.
        let artifacts: Arc<dyn ArtifactSink> = Arc::new(crate::redact::RedactingSink {
            inner: Arc::new(StoreArtifactSink::new(rt.store.clone(), tenant, session)),
            redactor: redactor.clone(),
        });
        let hub_progress = Arc::new(HubProgress {
            sender: deltas.clone(),
            session,
            active: active.clone(),
            redactor: redactor.clone(),
            streams: Mutex::new(HashMap::new()),
        });
        let progress: Arc<dyn ProgressSink> = hub_progress.clone();
        let step_tools = Mutex::new(rt.tools.base().clone());
        let model = rt.model_for(session, &release, &config)?;
        let scope = Arc::new(keel_tools::SessionScope {
            tenant_id: tenant,
            session_id: session,
            agent: release.definition.name.clone(),
            creator,
            secrets: redactor.clone(),
        });
        Ok(Self {
            rt,
            tenant,
            session,
            release,
            config,
            model,
            active,
            approvals,
            lost,
            workspace,
            sandbox,
            artifacts,
            progress,
            hub_progress,
            trace: crate::telemetry::TurnTrace::default(),
            redactor,
            scope,
            deltas,
            inflight: Mutex::new(Vec::new()),
            step_tools,
            step_policy: Mutex::new(None),
            call_facts: Mutex::new(HashMap::new()),
            snapshot: Mutex::new(None),
            compaction_failures: Mutex::new(HashMap::new()),
            skip_compaction: AtomicBool::new(false),
            unreconciled: Mutex::new(BTreeSet::new()),
            pending_outcome: AtomicBool::new(false),
            finished: Mutex::new(Vec::new()),
            unsettled_usage: Mutex::new(None),
            finish_only: false,
            settle_after: None,
            drain: CancellationToken::new(),
        })
    }

    // --- journal access ----------------------------------------------------------------------

    /// Stages `items` (see [`Journal::stage`]).
    pub(crate) async fn stage(&self, items: Items) -> Result<u64> {
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        let mut j = self.active.journal.lock().await;
        j.stage(items).await
    }

    /// Commits what is staged (see [`Journal::commit`]).
    pub(crate) async fn commit(&self, site: &'static str) -> Result<u64> {
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        let mut j = self.active.journal.lock().await;
        self.commit_locked(&mut j, site).await
    }

    /// Commits what is staged in `j`, whose lock the caller holds.
    pub(crate) async fn commit_locked(&self, j: &mut Journal, site: &'static str) -> Result<u64> {
        let v = j.commit(site).await?;
        self.active.version.store(v, Ordering::SeqCst);
        self.pending_outcome.store(false, Ordering::SeqCst);
        Ok(v)
    }

    /// Appends what `build` makes of the journal, holding its lock from the read to the commit:
    /// nothing another task journals (a cancellation acknowledged meanwhile) lands between
    /// what `build` saw and the commit.
    pub(crate) async fn append_built(
        &self,
        site: &'static str,
        build: impl FnOnce(&Journal) -> Items,
    ) -> Result<u64> {
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        let mut j = self.active.journal.lock().await;
        let items = build(&j);
        j.stage(items).await?;
        self.commit_locked(&mut j, site).await
    }

    /// Stages `items` and commits them with everything staged before.
    pub(crate) async fn append(&self, site: &'static str, items: Items) -> Result<u64> {
        self.stage(items).await?;
        self.commit(site).await
    }

    pub(crate) async fn read<R>(&self, f: impl FnOnce(&Journal) -> R) -> R {
        let j = self.active.journal.lock().await;
        f(&j)
    }

    pub(crate) fn delta(&self, kind: DeltaKind) {
        if !self.deltas.watched() {
            return;
        }
        self.deltas.send(Delta {
            session_id: self.session,
            after_seq: self.active.version.load(Ordering::SeqCst),
            kind,
        });
    }

    pub(crate) fn turn_token(&self) -> CancellationToken {
        let mut slot = lock(&self.active.turn_cancel);
        match slot.as_ref() {
            Some(t) => t.clone(),
            None => {
                let t = self.lost.child_token();
                *slot = Some(t.clone());
                t
            }
        }
    }

    fn reset_turn_token(&self) {
        *lock(&self.active.turn_cancel) = None;
    }

    /// Waits until [`Runner::settle_after`] (if set and ahead) when the journal holds an effect
    /// left `dispatched`: the holder this run took the session from may still be running it,
    /// until it finds its lease lost or fences itself. Returns at once otherwise.
    ///
    /// # Errors
    /// [`RuntimeError::LeaseLost`] when this run's lease is lost meanwhile.
    pub(crate) async fn wait_out_previous_holder(&self) -> Result<()> {
        let Some(at) = self.settle_after else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= at {
            return Ok(());
        }
        let dispatched = self
            .read(|j| {
                j.state
                    .effects
                    .values()
                    .any(|e| e.status == keel_core::EffectStatus::Dispatched)
            })
            .await;
        if !dispatched {
            return Ok(());
        }
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        tracing::warn!(
            session = %self.session,
            wait_ms = left.as_millis() as u64,
            "the session was taken over from a holder that may still be running a tool: waiting out its lease before declaring what it dispatched outcome_unknown"
        );
        tokio::select! {
            () = tokio::time::sleep_until(at) => Ok(()),
            () = self.lost.cancelled() => Err(self.lease_lost()),
        }
    }

    pub(crate) fn lease_lost(&self) -> RuntimeError {
        RuntimeError::LeaseLost {
            session: self.session,
        }
    }

    /// When the turn started `started` reaches its wall-clock limit, as a tokio instant.
    pub(crate) fn turn_deadline(
        &self,
        started: Option<chrono::DateTime<Utc>>,
    ) -> Option<tokio::time::Instant> {
        let (ms, s) = (self.config.turn_timeout_ms?, started?);
        let elapsed = (Utc::now() - s).to_std().unwrap_or(Duration::ZERO);
        let left = Duration::from_millis(ms).saturating_sub(elapsed);
        Some(tokio::time::Instant::now() + left)
    }

    // --- the loop ----------------------------------------------------------------------------

    /// Runs the session until it is idle, waits on a human, or is closed — or, once drained,
    /// until the next thing to do would start work ([`starts_work`]): calls running here finish
    /// and everything staged commits first, and the turn stays active for the next worker.
    /// The tools of the current step.
    pub(crate) fn tools(&self) -> Arc<keel_tools::ToolRegistry> {
        lock(&self.step_tools).clone()
    }

    /// Takes the tools for the next step: the host's plus the release's sources' as they are
    /// now (a tool-list change since the last step shows here, never within a step).
    pub(crate) async fn refresh_tools(&self) {
        let tools = self
            .rt
            .tools
            .registry(&self.release, self.workspace.root())
            .await;
        *lock(&self.step_tools) = tools;
    }

    /// Whether anything between a step's end and the next step's model request can wait for
    /// long or needs the step's end durable: the tenant's daily budget reserves the next step
    /// against usage the step's end writes ([`Self::reserve_step`]), the release's MCP servers
    /// are asked for their tools ([`Self::refresh_tools`]), the tenant has a token rate to
    /// wait for ([`Self::admit`]). Then the step's end commits at once, not overlapped with
    /// the next request.
    fn waits_before_sampling(&self) -> bool {
        let daily = self.config.tenant_daily_budget;
        daily.max_tokens.is_some()
            || daily.max_cost_usd.is_some()
            || !self.release.definition.mcp_servers.is_empty()
            || self
                .rt
                .options
                .token_rate
                .as_ref()
                .is_some_and(|r| r.limit(self.tenant).is_some())
    }

    pub(crate) async fn run(self: Arc<Self>) -> Result<Ended> {
        self.refresh_tools().await;
        // The active turn's wall-clock timer: cancels everything below the turn when it passes.
        let mut timer: Option<(TurnId, AbortOnDrop)> = None;
        let _checkpoints = self.start_checkpoints();
        // The finished step's `turn.sampling` commit is owed (see `Next::EnterPhase` below).
        let mut sampling_owed = false;
        loop {
            if self.lost.is_cancelled() {
                return Err(self.lease_lost());
            }
            let next = Box::pin(self.plan()).await?;
            // The owed commit overlaps the next step's model request, and only that: anything
            // else the planner asks first (a hook, compaction, the turn's end) finds it made.
            let owed = std::mem::take(&mut sampling_owed);
            let overlap = owed && matches!(next, Next::SampleStep { .. });
            if owed && !overlap {
                Box::pin(self.commit("turn.sampling")).await?;
            }
            if !overlap
                && self.pending_outcome.load(Ordering::SeqCst)
                && !matches!(
                    next,
                    Next::Dispatch { .. }
                        | Next::EnterPhase {
                            phase: TurnStatus::Sampling,
                            ..
                        }
                )
            {
                // A side effect's outcome is durable before anything else happens.
                Box::pin(self.commit("tool.outcome")).await?;
            }
            let active_turn = self.read(|j| j.state.active_turn).await;
            if let Some(turn) = active_turn {
                self.turn_span(turn);
                if timer.as_ref().is_none_or(|(t, _)| *t != turn) {
                    timer = self.start_timer(turn).await;
                }
                if self.turn_token().is_cancelled()
                    && !matches!(next, Next::FinishTurn { .. } | Next::Stop)
                    && !keel_core::mechanisms::is_off(Mechanism::CancelBeforeDispatch)
                {
                    self.record_local_cancel(turn).await?;
                    continue;
                }
            }
            if self.finish_only
                && !matches!(next, Next::FinishTurn { .. } | Next::Stop | Next::Idle)
            {
                // The cancelled turn has ended; whatever comes next (a queued turn) waits for a
                // run with the session's model.
                let status = self.read(|j| j.state.status).await;
                return self.done(status, false).await;
            }
            if self.drain.is_cancelled() && starts_work(&next) {
                // Drained: nothing new starts here. Calls running here finish and their results
                // commit with everything staged (a durable boundary, nothing left running); the
                // next worker that claims the session plans the same step from the journal.
                self.join_inflight().await;
                let status = self.read(|j| j.state.status).await;
                tracing::info!(session = %self.session, next = ?next, "drained: the session is left for another worker");
                return self.done(status, true).await;
            }
            match next {
                Next::Stop => return Box::pin(self.done(SessionStatus::Closed, false)).await,
                Next::Idle => {
                    if let Some(status) = Box::pin(self.go_idle()).await? {
                        return Box::pin(self.done(status, false)).await;
                    }
                }
                Next::StartTurn { turn } => {
                    let status = self.read(|j| j.state.status).await;
                    let mut items = Vec::new();
                    if status != SessionStatus::Running {
                        items.push(status_item(SessionStatus::Running, "turn started"));
                    }
                    items.push((Correlation::turn(turn), EventBody::TurnStarted {}));
                    Box::pin(self.append("turn.started", items)).await?;
                    tracing::info!(session = %self.session, %turn, "turn started");
                }
                Next::Resume => {
                    Box::pin(self.stage(vec![status_item(
                        SessionStatus::Running,
                        "human action received",
                    )]))
                    .await?;
                }
                Next::EnterPhase { turn, phase } => {
                    let had_staged = self.read(Journal::has_staged).await;
                    Box::pin(self.stage(vec![phase_item(turn, phase)])).await?;
                    if phase == TurnStatus::Sampling
                        && (had_staged || self.pending_outcome.load(Ordering::SeqCst))
                    {
                        // The step's calls all have results: the step is one commit, made
                        // while the next step's request goes out (`Runner::sample`) when that
                        // comes next and nothing waits before it, else at once or before
                        // whatever comes next (above). A crash before it loses what a crash
                        // before the commit always lost: the staged results (a side effect's
                        // outcome is then reconciled as `outcome_unknown`) and a model
                        // request, sampled again.
                        if self.waits_before_sampling() {
                            Box::pin(self.commit("turn.sampling")).await?;
                        } else {
                            sampling_owed = true;
                        }
                    }
                    if phase == TurnStatus::Sampling {
                        self.skip_compaction.store(false, Ordering::SeqCst);
                    }
                }
                Next::SampleStep { turn } => {
                    Box::pin(self.refresh_tools()).await;
                    Box::pin(self.clone().sample(turn, StepId::new(), 1, overlap)).await?;
                }
                Next::ResampleStep {
                    turn,
                    step,
                    attempt,
                } => Box::pin(self.clone().sample(turn, step, attempt, false)).await?,
                Next::Compact { turn, aggressive } => {
                    Box::pin(self.compact(turn, aggressive)).await?
                }
                Next::Reject { turn, step, calls } => {
                    Box::pin(self.reject(turn, step, calls)).await?
                }
                Next::RequestApprovals { turn, step, calls } => {
                    Box::pin(self.request_approvals(turn, step, calls)).await?;
                }
                Next::ApplyApproval {
                    turn,
                    step,
                    call,
                    approval,
                    outcome,
                } => {
                    Box::pin(self.apply_approval(turn, step, call, approval, outcome)).await?;
                }
                Next::RunHooks { turn, event, calls } => {
                    Box::pin(self.run_hooks(turn, event, calls)).await?;
                }
                Next::Execute { turn, step, calls } => {
                    Box::pin(self.execute(turn, step, calls)).await?
                }
                Next::Dispatch {
                    turn, step, call, ..
                } => Box::pin(self.clone().dispatch(turn, step, call)).await?,
                Next::Rerun {
                    turn,
                    step,
                    call,
                    sequential,
                } => Box::pin(self.clone().rerun(turn, step, call, sequential)).await?,
                Next::MarkOutcomeUnknown { key } => {
                    self.wait_out_previous_holder().await?;
                    self.stage(vec![(
                        Correlation::default().with_operation(key),
                        EventBody::EffectOutcomeUnknown {},
                    )])
                    .await?;
                }
                Next::Reconcile {
                    turn,
                    step,
                    call,
                    key,
                } => Box::pin(self.reconcile(turn, step, call, key)).await?,
                Next::Settle {
                    turn,
                    step,
                    call,
                    key,
                    how,
                } => Box::pin(self.settle(turn, step, call, key, how)).await?,
                Next::AwaitRunning { .. } => Box::pin(self.await_running()).await,
                Next::WaitForHuman { turn, .. } => {
                    if !Box::pin(self.detach_children()).await {
                        // A call whose child waited was decided meanwhile and runs again.
                        continue;
                    }
                    Box::pin(self.wait_for_human(turn)).await?;
                    return Box::pin(self.done(SessionStatus::RequiresAction, false)).await;
                }
                Next::FinishTurn {
                    turn,
                    reason,
                    limit,
                    error,
                } => {
                    Box::pin(self.finish_turn(turn, reason, limit, error)).await?;
                    Box::pin(self.end_turn_span(turn)).await;
                    lock(&self.finished).push(turn);
                    self.reset_turn_token();
                    timer = None;
                }
            }
        }
    }

    /// The turn's token was cancelled in this process (an interrupting input, `cancel_turn`)
    /// before its intent reached the journal: wait a moment for it, else journal it.
    async fn record_local_cancel(&self, turn: TurnId) -> Result<()> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let limits = self.limits();
        let (requested, deadline, budget_spent) = self
            .read(|j| {
                let t = j.state.turns.get(&turn);
                (
                    t.is_none_or(|t| t.cancel_requested.is_some() || t.status.is_terminal()),
                    t.and_then(|t| t.started_at),
                    t.and_then(|t| {
                        keel_core::plan::wall_time_left_ms(&j.state, t, &limits, Utc::now())
                    })
                    .is_some_and(|ms| ms == 0),
                )
            })
            .await;
        // The turn's own timer fired: the planner ends it (timed out, or wall-time budget).
        let timed_out = budget_spent
            || self
                .turn_deadline(deadline)
                .is_some_and(|at| at <= tokio::time::Instant::now());
        if !requested && !timed_out {
            self.stage(vec![(
                Correlation::turn(turn),
                EventBody::TurnCancelRequested {
                    reason: "cancelled".into(),
                },
            )])
            .await?;
        }
        Ok(())
    }

    /// Before the run stops for a human: detaches the calls whose child waits on one (see
    /// [`keel_core::plan::Facts::waiting_in_child`]) and waits for their tasks to end. Returns
    /// false when a call still runs here after that (its child was decided meanwhile): the
    /// run plans again instead of stopping.
    async fn detach_children(&self) -> bool {
        let detached = self.active.detach_waiting();
        if detached.is_empty() {
            return self.active.live().is_empty();
        }
        loop {
            let done = self.active.call_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let live = self.active.live();
            if !detached.iter().any(|c| live.contains(c)) {
                return live.is_empty();
            }
            tokio::select! {
                () = &mut done => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Waits until a call running here finishes (or the turn is cancelled).
    async fn await_running(&self) {
        let token = self.turn_token();
        let done = self.active.call_done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if self.active.live().is_empty() {
            return;
        }
        tokio::select! {
            () = &mut done => {}
            () = token.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }

    /// Nothing to do: goes idle and stops taking input through this run, atomically with
    /// respect to `submit` (which holds the same lock). Returns the final status, or `None` when
    /// input arrived meanwhile.
    async fn go_idle(&self) -> Result<Option<SessionStatus>> {
        let mut j = self.active.journal.lock().await;
        if j.state.active_turn.is_some() || !j.state.queue.is_empty() {
            return Ok(None);
        }
        // An intent posted just now would otherwise wait for the next run.
        match crate::intent::handle_intents(&self.rt, &mut j, Some(&self.active)).await {
            Ok(0) => {}
            Ok(_) => return Ok(None),
            Err(e) => tracing::warn!(session = %self.session, "handling intents: {e}"),
        }
        let mut items = Vec::new();
        if matches!(
            j.state.status,
            SessionStatus::Running | SessionStatus::RequiresAction
        ) {
            items.push(status_item(SessionStatus::Idle, "no queued input"));
        }
        j.stage(items).await?;
        // Nothing waits on a timer any more.
        j.extras.wake_at = Some(None);
        let v = j.commit("session.idle").await?;
        self.active.version.store(v, Ordering::SeqCst);
        j.closed = true;
        Ok(Some(j.state.status))
    }

    async fn done(&self, status: SessionStatus, drained: bool) -> Result<Ended> {
        let ids: Vec<TurnId> = lock(&self.finished).clone();
        let mut j = self.active.journal.lock().await;
        let v = j.commit("run.end").await?;
        self.active.version.store(v, Ordering::SeqCst);
        j.closed = true;
        let turns = ids
            .iter()
            .filter_map(|t| j.proj.finished.get(t).cloned())
            .collect();
        Ok(Ended {
            turns,
            status,
            version: j.state.version,
            drained,
        })
    }
}

/// How [`Runner::run`] ended.
pub(crate) struct Ended {
    /// The turns this run finished, in order.
    pub(crate) turns: Vec<TurnOutcome>,
    /// The session status.
    pub(crate) status: SessionStatus,
    /// The journal version (everything committed).
    pub(crate) version: u64,
    /// The drain stopped the run with work left (see [`starts_work`]).
    pub(crate) drained: bool,
}

/// Whether doing `next` starts work a drained run leaves to the next worker: a turn, a model
/// call (a step, an attempt, a compaction), a tool call (a batch, a dispatch, a re-run) or a
/// reconcile check. Everything else only records what is already known — ends a turn, rejects
/// or settles calls, journals decisions, asks a human, goes idle — or waits for calls already
/// running here, and a drained run still does it (so a turn whose last step has completed
/// finishes where it is, and a session with nothing left goes idle).
pub(crate) fn starts_work(next: &Next) -> bool {
    matches!(
        next,
        Next::StartTurn { .. }
            | Next::SampleStep { .. }
            | Next::ResampleStep { .. }
            | Next::Compact { .. }
            | Next::RunHooks { .. }
            | Next::Execute { .. }
            | Next::Dispatch { .. }
            | Next::Rerun { .. }
            | Next::Reconcile { .. }
    )
}
