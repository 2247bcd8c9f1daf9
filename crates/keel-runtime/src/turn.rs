//! The session actor's loop: turns, steps, tool execution, compaction, budgets, cancellation and
//! recovery. Everything here decides from the folded journal, so the same code continues a
//! session after a crash: it looks at where the active turn is and does the next thing.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use keel_core::{
    ApprovalDecision, ApprovalStatus, BudgetLimit, Consumed, Correlation, EffectDecision,
    EffectStatus, EventBody, OperationKey, Release, SessionId, SessionStatus, StateMachine, StepId,
    StepStatus, TenantId, TerminalReason, ToolCallId, ToolCallStatus, TurnId, TurnStatus, Usage,
    canonical::content_hash,
};
use keel_model::{ErrorKind, Message, ModelRequest, ProviderError, RequestPurpose, StreamEvent};
use keel_tools::approval::{ApprovalService, Resolution};
use keel_tools::artifact::{ArtifactSink, StoreArtifactSink};
use keel_tools::policy::{Policy, Verdict, session_rules_for};
use keel_tools::sandbox::Sandbox;
use keel_tools::tool::{
    EffectClass, ProgressSink, ReconcileOutcome, StepSnapshot, ToolLimits, ToolProgress,
};
use keel_tools::workspace::Workspace;
use keel_tools::{
    ToolCallRequest, ToolContext, ToolRegistry, ToolResult, ToolResultStatus, ValidatedCall,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{SessionConfig, merge_budget};
use crate::context::{ContextSnapshot, boundaries, project};
use crate::error::{Result, RuntimeError};
use crate::journal::{Journal, TurnOutcome};
use crate::redact::{Redactor, StreamRedactor};
use crate::runtime::{Active, Inner};
use crate::subscribe::{Delta, DeltaKind};

/// The memory namespace holding tenant usage: one entry per session and UTC day, key
/// `<YYYY-MM-DD>/<session id>`, value `{"tokens": n, "cost_usd": x}`.
pub const TENANT_USAGE_NAMESPACE: &str = "keel.tenant_usage";

/// Most per-session entries summed for one tenant day (sessions beyond it are not counted).
const TENANT_USAGE_MAX_SESSIONS: u32 = 100_000;

/// The tenant's tokens and cost (USD) on UTC day `day` (`YYYY-MM-DD`): the sum of its sessions'
/// entries (and of a whole-day entry written by older builds under the key `<day>`).
///
/// # Errors
/// Store errors.
pub async fn tenant_usage_on(
    store: &dyn keel_store::Store,
    tenant: TenantId,
    day: &str,
) -> Result<(u64, f64)> {
    let entries = store
        .memory_search(
            tenant,
            Some(TENANT_USAGE_NAMESPACE),
            day,
            TENANT_USAGE_MAX_SESSIONS,
        )
        .await?;
    let prefix = format!("{day}/");
    Ok(entries
        .iter()
        .filter(|e| e.key == day || e.key.starts_with(&prefix))
        .fold((0, 0.0), |(t, c), e| {
            (
                t + e.value["tokens"].as_u64().unwrap_or(0),
                c + e.value["cost_usd"].as_f64().unwrap_or(0.0),
            )
        }))
}

type Items = Vec<(Correlation, EventBody)>;

/// How the turn loop left a turn.
enum TurnEnd {
    Finished,
    Suspended,
}

/// What executing a step's tools came to.
enum ToolsEnd {
    Done,
    Blocked,
}

/// The configured policy plus the session rules granted by `allow_for_session` decisions.
pub(crate) fn session_policy(
    config: &SessionConfig,
    j: &Journal,
    tools: &ToolRegistry,
) -> Result<Policy> {
    let mut policy = config.policy()?;
    if let Ok(ws) = Workspace::new(&config.workspace) {
        for (name, args) in &j.proj.allowed_for_session {
            let call = ValidatedCall {
                call_id: String::new(),
                name: name.clone(),
                arguments: args.clone(),
                effect: EffectClass::SideEffecting,
                parallel_safe: false,
            };
            let subject = tools.subject(&call, &ws);
            policy.rules.extend(session_rules_for(name, &subject));
        }
    }
    Ok(policy)
}

/// Tool progress into the session's delta buffer, redacted per call as a stream (a secret
/// split across two output chunks is still caught).
struct HubProgress {
    sender: tokio::sync::broadcast::Sender<Delta>,
    session: SessionId,
    active: Arc<Active>,
    redactor: Arc<Redactor>,
    streams: Mutex<HashMap<String, StreamRedactor>>,
}

impl HubProgress {
    fn send(&self, call_id: &str, progress: ToolProgress) {
        let _ = self.sender.send(Delta {
            session_id: self.session,
            after_seq: self.active.version.load(Ordering::SeqCst),
            kind: DeltaKind::ToolProgress {
                call_id: call_id.to_owned(),
                progress,
            },
        });
    }

    /// Sends what the call's output stream still holds back (the call has finished).
    fn finish(&self, call_id: &str) {
        let rest = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call_id)
            .map(|mut s| s.finish());
        if let Some(text) = rest.filter(|t| !t.is_empty()) {
            self.send(call_id, ToolProgress::Output { text });
        }
    }
}

impl ProgressSink for HubProgress {
    fn report(&self, call_id: &str, progress: ToolProgress) {
        let progress = match progress {
            ToolProgress::Output { text } => {
                let text = self
                    .streams
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(call_id.to_owned())
                    .or_insert_with(|| StreamRedactor::new(self.redactor.clone()))
                    .push(&text);
                if text.is_empty() {
                    return;
                }
                ToolProgress::Output { text }
            }
            ToolProgress::Status { text } => ToolProgress::Status {
                text: self.redactor.redact_str(&text),
            },
        };
        self.send(call_id, progress);
    }
}

/// One worker's run of one session.
pub(crate) struct Runner {
    rt: Arc<Inner>,
    tenant: TenantId,
    session: SessionId,
    release: Release,
    config: SessionConfig,
    active: Arc<Active>,
    approvals: ApprovalService,
    /// Cancelled when the lease is lost.
    lost: CancellationToken,
    workspace: Workspace,
    sandbox: Sandbox,
    artifacts: Arc<dyn ArtifactSink>,
    progress: Arc<dyn ProgressSink>,
    hub_progress: Arc<HubProgress>,
    /// The session's secrets, for deltas (redacted as streams before they leave the runner).
    redactor: Arc<Redactor>,
    deltas: tokio::sync::broadcast::Sender<Delta>,
    /// Tool tasks running in this process.
    inflight: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The policy frozen with the last step's snapshot.
    step_policy: Mutex<Option<(StepId, Policy)>>,
    /// Compactions that failed in the current turn (besides provider overflows).
    compaction_failures: Mutex<HashMap<TurnId, u32>>,
    /// Turns finished by this run.
    finished: Mutex<Vec<TurnId>>,
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rt: Arc<Inner>,
        tenant: TenantId,
        session: SessionId,
        release: Release,
        config: SessionConfig,
        active: Arc<Active>,
        approvals: ApprovalService,
        lost: CancellationToken,
    ) -> Result<Self> {
        let workspace = Workspace::new(&config.workspace)?;
        let sandbox = Sandbox::new(config.sandbox)?;
        let artifacts: Arc<dyn ArtifactSink> =
            Arc::new(StoreArtifactSink::new(rt.store.clone(), tenant, session));
        let deltas = rt.hub.sender(session);
        let redactor = Arc::new(Redactor::new(&config.secret_patterns, &config.secret_env)?);
        let hub_progress = Arc::new(HubProgress {
            sender: deltas.clone(),
            session,
            active: active.clone(),
            redactor: redactor.clone(),
            streams: Mutex::new(HashMap::new()),
        });
        let progress: Arc<dyn ProgressSink> = hub_progress.clone();
        Ok(Self {
            rt,
            tenant,
            session,
            release,
            config,
            active,
            approvals,
            lost,
            workspace,
            sandbox,
            artifacts,
            progress,
            hub_progress,
            redactor,
            deltas,
            inflight: Mutex::new(Vec::new()),
            step_policy: Mutex::new(None),
            compaction_failures: Mutex::new(HashMap::new()),
            finished: Mutex::new(Vec::new()),
        })
    }

    // --- journal access ----------------------------------------------------------------------

    async fn append(&self, site: &'static str, items: Items) -> Result<u64> {
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        // Effects touched by this append, with what the table records for them.
        let touched: Vec<(OperationKey, Option<Value>, Option<String>)> = items
            .iter()
            .filter_map(|(c, body)| {
                let key = c.operation_key.clone()?;
                match body {
                    EventBody::EffectPrepared { .. }
                    | EventBody::EffectDispatched {}
                    | EventBody::EffectOutcomeUnknown {} => Some((key, None, None)),
                    EventBody::EffectCommitted { outcome } => {
                        Some((key, Some(outcome.clone()), None))
                    }
                    EventBody::EffectFailed { error } => Some((key, None, Some(error.clone()))),
                    _ => None,
                }
            })
            .collect();
        let mut j = self.active.journal.lock().await;
        let v = j.append(site, items).await?;
        self.active.version.store(v, Ordering::SeqCst);
        for (key, outcome, error) in touched {
            if let Some(effect) = j.state.effects.get(&key) {
                let row = self.rt.store.get_effect(self.tenant, &key).await.ok();
                crate::effects::sync(
                    self.rt.store.as_ref(),
                    self.tenant,
                    &j.state,
                    effect,
                    row,
                    outcome,
                    error,
                )
                .await;
            }
        }
        Ok(v)
    }

    async fn read<R>(&self, f: impl FnOnce(&Journal) -> R) -> R {
        let j = self.active.journal.lock().await;
        f(&j)
    }

    fn delta(&self, kind: DeltaKind) {
        let _ = self.deltas.send(Delta {
            session_id: self.session,
            after_seq: self.active.version.load(Ordering::SeqCst),
            kind,
        });
    }

    fn turn_token(&self) -> CancellationToken {
        let mut slot = self
            .active
            .turn_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
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
        *self
            .active
            .turn_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    // --- the session loop --------------------------------------------------------------------

    pub(crate) async fn run(self: Arc<Self>) -> Result<(Vec<TurnOutcome>, SessionStatus, u64)> {
        loop {
            if self.lost.is_cancelled() {
                return Err(RuntimeError::LeaseLost {
                    session: self.session,
                });
            }
            let (active, next, status) = self
                .read(|j| {
                    (
                        j.state.active_turn,
                        j.state.queue.front().copied(),
                        j.state.status,
                    )
                })
                .await;
            if status == SessionStatus::Closed {
                return self.done(SessionStatus::Closed).await;
            }
            if let Some(turn) = active {
                match self.clone().run_turn(turn).await? {
                    TurnEnd::Finished => {
                        self.finished
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(turn);
                        self.reset_turn_token();
                    }
                    TurnEnd::Suspended => return self.done(SessionStatus::RequiresAction).await,
                }
                continue;
            }
            if let Some(turn) = next {
                let cancelled = self
                    .read(|j| {
                        j.state
                            .turns
                            .get(&turn)
                            .is_some_and(|t| t.cancel_requested.is_some())
                    })
                    .await;
                if cancelled {
                    // A queued turn cancelled before it started: aborted without running.
                    let items = vec![(
                        Correlation::turn(turn),
                        self.finished_body(
                            TerminalReason::Aborted,
                            None,
                            None,
                            &Usage::default(),
                            0.0,
                            0,
                            0,
                        ),
                    )];
                    self.append("turn.finished", items).await?;
                    self.finished
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(turn);
                    continue;
                }
                let mut items = Vec::new();
                if status != SessionStatus::Running {
                    items.push(status_item(SessionStatus::Running, "turn started"));
                }
                items.push((Correlation::turn(turn), EventBody::TurnStarted {}));
                self.append("turn.started", items).await?;
                continue;
            }
            // Nothing to do: go idle and stop taking input through this run, atomically with
            // respect to `submit` (which holds the same lock).
            let mut j = self.active.journal.lock().await;
            if j.state.active_turn.is_some() || !j.state.queue.is_empty() {
                continue;
            }
            // An intent posted just now would otherwise wait for the next run.
            let rt = crate::runtime::Runtime {
                inner: self.rt.clone(),
            };
            match rt.handle_intents(&mut j, Some(&self.active)).await {
                Ok(0) => {}
                Ok(_) => continue,
                Err(e) => tracing::warn!(session = %self.session, "handling intents: {e}"),
            }
            if j.state.status == SessionStatus::Running
                || j.state.status == SessionStatus::RequiresAction
            {
                let v = j
                    .append(
                        "session.idle",
                        vec![status_item(SessionStatus::Idle, "no queued input")],
                    )
                    .await?;
                self.active.version.store(v, Ordering::SeqCst);
            }
            j.closed = true;
            let status = j.state.status;
            drop(j);
            return self.done(status).await;
        }
    }

    async fn done(&self, status: SessionStatus) -> Result<(Vec<TurnOutcome>, SessionStatus, u64)> {
        let ids: Vec<TurnId> = self
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut j = self.active.journal.lock().await;
        j.closed = true;
        let turns = ids
            .iter()
            .filter_map(|t| j.proj.finished.get(t).cloned())
            .collect();
        Ok((turns, status, j.state.version))
    }

    fn deadline_passed(&self, started: Option<chrono::DateTime<Utc>>) -> bool {
        match (self.config.turn_timeout_ms, started) {
            (Some(ms), Some(s)) => {
                (Utc::now() - s).num_milliseconds() >= i64::try_from(ms).unwrap_or(i64::MAX)
            }
            _ => false,
        }
    }

    fn turn_deadline(
        &self,
        started: Option<chrono::DateTime<Utc>>,
    ) -> Option<tokio::time::Instant> {
        let (ms, s) = (self.config.turn_timeout_ms?, started?);
        let elapsed = (Utc::now() - s).to_std().unwrap_or(Duration::ZERO);
        let left = Duration::from_millis(ms).saturating_sub(elapsed);
        Some(tokio::time::Instant::now() + left)
    }

    async fn run_turn(self: Arc<Self>, turn: TurnId) -> Result<TurnEnd> {
        let token = self.turn_token();
        // The turn's wall-clock limit cancels everything below the turn when it passes.
        let started = self
            .read(|j| j.state.turns.get(&turn).and_then(|t| t.started_at))
            .await;
        let timer = self.turn_deadline(started).map(|at| {
            let token = token.clone();
            AbortOnDrop(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                token.cancel();
            }))
        });
        let _timer = timer;
        let mut compacted_for_step = false;
        loop {
            if self.lost.is_cancelled() {
                return Err(RuntimeError::LeaseLost {
                    session: self.session,
                });
            }
            let (status, cancel, started, session_status) = self
                .read(|j| {
                    let t = j.state.turns.get(&turn);
                    (
                        t.map(|t| t.status),
                        t.and_then(|t| t.cancel_requested.clone()),
                        t.and_then(|t| t.started_at),
                        j.state.status,
                    )
                })
                .await;
            let Some(status) = status else {
                return Ok(TurnEnd::Finished);
            };
            if status.is_terminal() {
                return Ok(TurnEnd::Finished);
            }
            if cancel.is_some() {
                self.end_turn(turn, TerminalReason::Aborted, None, cancel)
                    .await?;
                return Ok(TurnEnd::Finished);
            }
            if self.deadline_passed(started) {
                let ms = self.config.turn_timeout_ms.unwrap_or(0);
                self.end_turn(
                    turn,
                    TerminalReason::Failed,
                    None,
                    Some(format!(
                        "the turn timed out after {ms} ms (turn wall-clock limit)"
                    )),
                )
                .await?;
                return Ok(TurnEnd::Finished);
            }
            if token.is_cancelled() {
                // Cancelled without a journaled intent yet (interrupt from this process races the
                // append): wait for the intent to be visible.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if self
                    .read(|j| {
                        j.state
                            .turns
                            .get(&turn)
                            .is_some_and(|t| t.cancel_requested.is_none())
                    })
                    .await
                {
                    self.append(
                        "turn.cancel_requested",
                        vec![(
                            Correlation::turn(turn),
                            EventBody::TurnCancelRequested {
                                reason: "cancelled".into(),
                            },
                        )],
                    )
                    .await?;
                }
                continue;
            }
            match status {
                TurnStatus::Queued => return Ok(TurnEnd::Finished),
                TurnStatus::Preparing => {
                    self.append(
                        "turn.sampling",
                        vec![phase_item(turn, TurnStatus::Sampling)],
                    )
                    .await?;
                }
                TurnStatus::Compacting => {
                    if let Some(reason) = self.compact(turn, false).await? {
                        self.end_turn(
                            turn,
                            reason,
                            None,
                            Some("the prompt stays too long after three compactions".into()),
                        )
                        .await?;
                        return Ok(TurnEnd::Finished);
                    }
                    compacted_for_step = true;
                }
                TurnStatus::ExecutingTools => match self.clone().execute_tools(turn).await? {
                    ToolsEnd::Done => {
                        let mut items = Vec::new();
                        if session_status == SessionStatus::RequiresAction {
                            items
                                .push(status_item(SessionStatus::Running, "human action received"));
                        }
                        items.push(phase_item(turn, TurnStatus::Sampling));
                        self.append("turn.sampling", items).await?;
                        compacted_for_step = false;
                    }
                    ToolsEnd::Blocked => {
                        if token.is_cancelled() || self.lost.is_cancelled() {
                            continue;
                        }
                        if session_status != SessionStatus::RequiresAction {
                            self.append(
                                "session.requires_action",
                                vec![status_item(
                                    SessionStatus::RequiresAction,
                                    "waiting on a human decision",
                                )],
                            )
                            .await?;
                        }
                        return Ok(TurnEnd::Suspended);
                    }
                },
                TurnStatus::Sampling => {
                    if self.clone().sampling(turn, &mut compacted_for_step).await? {
                        return Ok(TurnEnd::Finished);
                    }
                }
                TurnStatus::Completed | TurnStatus::Aborted | TurnStatus::Failed => {
                    return Ok(TurnEnd::Finished);
                }
            }
        }
    }

    /// One move in the `sampling` phase. Returns true when the turn finished.
    async fn sampling(
        self: Arc<Self>,
        turn: TurnId,
        compacted_for_step: &mut bool,
    ) -> Result<bool> {
        let last = self
            .read(|j| {
                let t = j.state.turns.get(&turn)?;
                let s = j.state.steps.get(t.steps.last()?)?;
                let calls: Vec<ToolCallStatus> = s
                    .tool_calls
                    .iter()
                    .filter_map(|c| j.state.tool_calls.get(c).map(|c| c.status))
                    .collect();
                Some((s.id, s.status, s.attempt, calls))
            })
            .await;
        match last {
            Some((step, StepStatus::Started | StepStatus::Streaming, attempt, _)) => {
                // A step that was streaming when the worker stopped: the same step, next attempt.
                self.run_step(turn, step, attempt + 1).await?;
            }
            Some((_, StepStatus::Completed, _, calls))
                if calls.iter().any(|s| !s.is_terminal()) =>
            {
                self.append(
                    "turn.executing_tools",
                    vec![phase_item(turn, TurnStatus::ExecutingTools)],
                )
                .await?;
            }
            Some((_, StepStatus::Completed, _, calls)) if calls.is_empty() => {
                self.end_turn(turn, TerminalReason::Completed, None, None)
                    .await?;
                return Ok(true);
            }
            Some((_, StepStatus::Failed, _, _)) => {
                self.end_turn(
                    turn,
                    TerminalReason::Failed,
                    None,
                    Some("the model step failed".into()),
                )
                .await?;
                return Ok(true);
            }
            _ => {
                // A new step: loop detection, budgets, compaction first.
                if let Some(n) = self.loop_detected(turn).await {
                    self.end_turn(
                        turn,
                        TerminalReason::LoopDetected,
                        None,
                        Some(format!("the same failing tool call was repeated {n} times")),
                    )
                    .await?;
                    return Ok(true);
                }
                if let Some(limit) = self.budget_exhausted(turn).await? {
                    self.end_turn(turn, TerminalReason::BudgetExhausted, Some(limit), None)
                        .await?;
                    return Ok(true);
                }
                if !*compacted_for_step {
                    let snapshot = self.snapshot().await?;
                    let window = self.config.context_window_tokens as f64;
                    if snapshot.estimated_tokens as f64 >= window * self.config.compact_at_fraction
                    {
                        *compacted_for_step = true;
                        if let Some(reason) = self.compact(turn, false).await? {
                            self.end_turn(
                                turn,
                                reason,
                                None,
                                Some("the prompt stays too long after three compactions".into()),
                            )
                            .await?;
                            return Ok(true);
                        }
                        return Ok(false);
                    }
                }
                *compacted_for_step = false;
                self.run_step(turn, StepId::new(), 1).await?;
            }
        }
        Ok(false)
    }

    async fn snapshot(&self) -> Result<ContextSnapshot> {
        let j = self.active.journal.lock().await;
        let policy = session_policy(&self.config, &j, &self.rt.tools)?;
        Ok(project(
            &self.release.definition.instructions,
            &self.config.workspace,
            &self.release.definition.tools,
            &self.rt.tools,
            policy,
            &j.proj,
        ))
    }

    // --- budgets and loops -------------------------------------------------------------------

    async fn loop_detected(&self, turn: TurnId) -> Option<u32> {
        let threshold = self.config.loop_threshold;
        self.read(|j| {
            let mut counts: HashMap<String, u32> = HashMap::new();
            for c in j.state.tool_calls.values().filter(|c| c.turn_id == turn) {
                if matches!(c.status, ToolCallStatus::Failed | ToolCallStatus::Rejected)
                    && let Some((out, _)) = &c.result
                {
                    let key = format!("{}\u{0}{}\u{0}{}", c.name, content_hash(&c.arguments), out);
                    let n = counts.entry(key).or_default();
                    *n += 1;
                    if *n >= threshold {
                        return Some(*n);
                    }
                }
            }
            None
        })
        .await
    }

    async fn budget_exhausted(&self, turn: TurnId) -> Result<Option<BudgetLimit>> {
        let (turn_used, session_used) = self
            .read(|j| {
                let now = Utc::now();
                let t = j.state.turns.get(&turn);
                let wall = t.and_then(|t| t.started_at).map_or(0, |s| {
                    u64::try_from((now - s).num_milliseconds()).unwrap_or(0)
                });
                let turn_used = Consumed {
                    steps: t.map_or(0, |t| u32::try_from(t.steps.len()).unwrap_or(u32::MAX)),
                    tokens: t.map_or(0, |t| t.usage.total_tokens()),
                    cost_usd: t.map_or(0.0, |t| t.cost_usd),
                    tool_calls: t.map_or(0, |t| t.tool_calls_run),
                    wall_time_ms: wall,
                };
                let session_used = Consumed {
                    steps: j.state.steps.len().try_into().unwrap_or(u32::MAX),
                    tokens: j.state.usage.total_tokens(),
                    cost_usd: j.state.cost_usd,
                    tool_calls: j.state.turns.values().map(|t| t.tool_calls_run).sum(),
                    wall_time_ms: j.proj.finished_turns_ms + wall,
                };
                (turn_used, session_used)
            })
            .await;
        let turn_budget = merge_budget(self.release.definition.budget, self.config.turn_budget);
        if let Err(l) = turn_budget.check(&turn_used) {
            return Ok(Some(l));
        }
        if let Err(l) = self.config.session_budget.check(&session_used) {
            return Ok(Some(l));
        }
        let daily = self.config.tenant_daily_budget;
        if daily.max_tokens.is_some() || daily.max_cost_usd.is_some() {
            let (tokens, cost) = self.tenant_usage().await?;
            let used = Consumed {
                tokens,
                cost_usd: cost,
                ..Consumed::default()
            };
            let only = keel_core::Budget {
                max_tokens: daily.max_tokens,
                max_cost_usd: daily.max_cost_usd,
                ..keel_core::Budget::default()
            };
            if let Err(l) = only.check(&used) {
                return Ok(Some(l));
            }
        }
        Ok(None)
    }

    fn today() -> String {
        Utc::now().format("%Y-%m-%d").to_string()
    }

    async fn tenant_usage(&self) -> Result<(u64, f64)> {
        tenant_usage_on(self.rt.store.as_ref(), self.tenant, &Self::today()).await
    }

    /// Records the session's usage of the day of its last completed step in the tenant's usage
    /// table, as an absolute figure folded from the journal under the key `<day>/<session>`.
    /// Only the session's lease holder writes that key, so concurrent workers of one tenant
    /// never overwrite each other's counts, and a write lost to a crash is repaired by the
    /// session's next step.
    async fn record_tenant_usage(&self) -> Result<()> {
        let Some((day, (tokens, cost))) = self
            .read(|j| {
                let day = j.proj.last_step_day.clone()?;
                let used = j.proj.usage_by_day.get(&day).copied()?;
                Some((day, used))
            })
            .await
        else {
            return Ok(());
        };
        self.rt
            .store
            .memory_put(
                self.tenant,
                TENANT_USAGE_NAMESPACE,
                &format!("{day}/{}", self.session),
                &json!({"tokens": tokens, "cost_usd": cost}),
            )
            .await?;
        Ok(())
    }

    // --- steps -------------------------------------------------------------------------------

    async fn run_step(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        first_attempt: u32,
    ) -> Result<()> {
        let snapshot = self.snapshot().await?;
        *self
            .step_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((step, snapshot.policy.clone()));
        let model = self.rt.model.model().to_owned();
        let mut attempt = first_attempt;
        self.append(
            "step.started",
            vec![(
                Correlation::step(turn, step, attempt),
                EventBody::StepStarted {
                    model: model.clone(),
                },
            )],
        )
        .await?;
        let turn_token = self.turn_token();
        let step_token = turn_token.child_token();
        let position = self.read(|j| j.proj.position).await;
        let mut request: ModelRequest = snapshot.request(RequestPurpose::Step, position);
        request.cancel = step_token.clone();
        let mut stream = self.rt.model.stream(request);
        let started = tokio::time::Instant::now();
        let first_token_deadline = self
            .config
            .model_first_token_timeout_ms
            .map(|ms| started + Duration::from_millis(ms));
        let total_deadline = self
            .config
            .model_total_timeout_ms
            .map(|ms| started + Duration::from_millis(ms));
        let turn_started = self
            .read(|j| j.state.turns.get(&turn).and_then(|t| t.started_at))
            .await;
        let turn_deadline = self.turn_deadline(turn_started);
        let mut streaming = false;
        // Calls the current attempt proposed (or re-proposed); others of the step were abandoned.
        let mut seen: std::collections::HashSet<ToolCallId> = std::collections::HashSet::new();
        // Whether the current attempt takes a scripted position (`responses_consumed`): only a
        // scripted model's responses do; a route says per attempt.
        let mut consumes = self.rt.model.consumes_responses();
        let mut text = String::new();
        let mut reasoning: Vec<Value> = Vec::new();
        let mut usage = Usage::default();
        let mut cost = 0.0;
        let mut timed_out: Option<&'static str> = None;
        // Deltas are redacted as streams: a secret split across two deltas is still caught.
        let mut text_out = StreamRedactor::new(self.redactor.clone());
        let mut reasoning_out = StreamRedactor::new(self.redactor.clone());
        let mut args_out: HashMap<String, StreamRedactor> = HashMap::new();
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let outcome: std::result::Result<String, ProviderError> = loop {
            let deadline = [
                if streaming {
                    None
                } else {
                    first_token_deadline
                },
                total_deadline,
                turn_deadline,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(far);
            let ev = tokio::select! {
                ev = stream.next() => ev,
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = Some(if turn_deadline == Some(deadline) { "turn" } else { "model" });
                    step_token.cancel();
                    continue;
                }
            };
            let Some(ev) = ev else {
                break Err(ProviderError::new(
                    ErrorKind::StreamTruncated,
                    "model stream ended without a terminal event",
                ));
            };
            let content = !matches!(
                ev,
                StreamEvent::Attempt { .. }
                    | StreamEvent::Retry { .. }
                    | StreamEvent::Fallback { .. }
            );
            if content && !streaming && !ev.is_terminal() {
                streaming = true;
                self.append(
                    "step.streaming",
                    vec![(
                        Correlation::step(turn, step, attempt),
                        EventBody::StepStreaming {},
                    )],
                )
                .await?;
            }
            match ev {
                StreamEvent::TextDelta { text: t } => {
                    let shown = text_out.push(&t);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::Text { text: shown });
                    }
                    text.push_str(&t);
                }
                StreamEvent::ReasoningDelta { text: t } => {
                    let shown = reasoning_out.push(&t);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::Reasoning { text: shown });
                    }
                }
                StreamEvent::Reasoning { item } => {
                    if let Ok(v) = serde_json::to_value(&item) {
                        reasoning.push(v);
                    }
                }
                StreamEvent::ToolCallStart { .. } => {}
                StreamEvent::ToolCallDelta { id, delta } => {
                    let shown = args_out
                        .entry(id.clone())
                        .or_insert_with(|| StreamRedactor::new(self.redactor.clone()))
                        .push(&delta);
                    if !shown.is_empty() {
                        self.delta(DeltaKind::ToolArguments {
                            call_id: id,
                            delta: shown,
                        });
                    }
                }
                StreamEvent::ToolCallEnd {
                    id,
                    name,
                    arguments,
                    invalid,
                    ..
                } => {
                    if let Some(rest) = args_out.remove(&id).map(|mut s| s.finish())
                        && !rest.is_empty()
                    {
                        self.delta(DeltaKind::ToolArguments {
                            call_id: id.clone(),
                            delta: rest,
                        });
                    }
                    let id = self
                        .clone()
                        .proposed(turn, step, attempt, id, name, arguments, invalid, &snapshot)
                        .await?;
                    seen.insert(id);
                }
                StreamEvent::Usage { usage: u } => {
                    let mu = to_core_usage(&u);
                    usage.add(&mu);
                    cost += self
                        .rt
                        .options
                        .prices
                        .cost_usd(self.rt.model.model(), &u)
                        .unwrap_or(0.0);
                }
                StreamEvent::Completed { stop_reason, .. } => {
                    let rest = reasoning_out.finish();
                    if !rest.is_empty() {
                        self.delta(DeltaKind::Reasoning { text: rest });
                    }
                    let rest = text_out.finish();
                    if !rest.is_empty() {
                        self.delta(DeltaKind::Text { text: rest });
                    }
                    break Ok(serde_json::to_value(stop_reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_else(|| "end_turn".into()));
                }
                StreamEvent::Error { error } => break Err(error),
                StreamEvent::Cancelled => {
                    break Err(ProviderError::new(ErrorKind::Timeout, "cancelled"));
                }
                StreamEvent::Attempt {
                    consumes_response, ..
                } => consumes = consumes_response,
                StreamEvent::Retry { error, delay_ms } => {
                    let failed = (&error, u64::from(consumes));
                    self.retry_attempt(turn, step, &mut attempt, &model, failed, Some(delay_ms))
                        .await?;
                    (text, reasoning, usage, cost, streaming) =
                        (String::new(), Vec::new(), Usage::default(), 0.0, false);
                    seen.clear();
                    text_out = StreamRedactor::new(self.redactor.clone());
                    reasoning_out = StreamRedactor::new(self.redactor.clone());
                    args_out.clear();
                }
                StreamEvent::Fallback { error, to, .. } => {
                    let _ = to;
                    let failed = (&error, u64::from(consumes));
                    self.retry_attempt(turn, step, &mut attempt, &model, failed, None)
                        .await?;
                    (text, reasoning, usage, cost, streaming) =
                        (String::new(), Vec::new(), Usage::default(), 0.0, false);
                    seen.clear();
                    text_out = StreamRedactor::new(self.redactor.clone());
                    reasoning_out = StreamRedactor::new(self.redactor.clone());
                    args_out.clear();
                }
            }
        };
        drop(stream);
        let corr = Correlation::step(turn, step, attempt);
        match outcome {
            Ok(stop_reason) => {
                let mut items = Vec::new();
                // Calls proposed by abandoned attempts of this step never ran: close them.
                let stale: Vec<ToolCallId> = self
                    .read(|j| {
                        j.state.steps.get(&step).map_or(Vec::new(), |s| {
                            s.tool_calls
                                .iter()
                                .filter(|c| !seen.contains(*c))
                                .filter(|c| {
                                    j.state
                                        .tool_calls
                                        .get(*c)
                                        .is_some_and(|c| c.status == ToolCallStatus::Proposed)
                                })
                                .cloned()
                                .collect()
                        })
                    })
                    .await;
                for c in stale {
                    items.push(finished_item(
                        turn,
                        step,
                        &c,
                        ToolCallStatus::Interrupted,
                        "The call was proposed by an abandoned model attempt and was not run."
                            .into(),
                        true,
                    ));
                }
                items.push((
                    corr,
                    EventBody::StepCompleted {
                        model: model.clone(),
                        stop_reason,
                        usage,
                        cost_usd: cost,
                        text,
                        reasoning,
                        responses_consumed: u64::from(consumes),
                    },
                ));
                let has_calls = self
                    .read(|j| {
                        j.state
                            .steps
                            .get(&step)
                            .is_some_and(|s| !s.tool_calls.is_empty())
                    })
                    .await;
                if has_calls {
                    items.push(phase_item(turn, TurnStatus::ExecutingTools));
                }
                self.append("step.completed", items).await?;
                self.record_tenant_usage().await?;
            }
            Err(error) => {
                if step_token.is_cancelled() && timed_out.is_none() {
                    // The turn was cancelled or the lease lost: the turn loop takes it from here
                    // (it closes the step with `step.failed`, consuming nothing).
                    self.join_inflight().await;
                    return Ok(());
                }
                let error = match timed_out {
                    Some("turn") => {
                        self.join_inflight().await;
                        return Ok(());
                    }
                    Some(_) => ProviderError::new(
                        ErrorKind::Timeout,
                        "the model did not answer within the configured time limit",
                    ),
                    None => error,
                };
                if error.kind == ErrorKind::ContextOverflow {
                    self.append(
                        "step.attempt_failed",
                        vec![(
                            corr,
                            EventBody::StepAttemptFailed {
                                model,
                                error_kind: error.kind.as_str().into(),
                                message: error.message.clone(),
                                retry_in_ms: None,
                                responses_consumed: u64::from(consumes),
                            },
                        )],
                    )
                    .await?;
                    self.join_inflight().await;
                    // Compact, then the turn loop re-samples the same step (next attempt).
                    if let Some(reason) = self.compact(turn, true).await? {
                        self.end_turn(
                            turn,
                            reason,
                            None,
                            Some(format!(
                                "the prompt stays too long after three compactions: {}",
                                error.message
                            )),
                        )
                        .await?;
                    }
                    return Ok(());
                }
                self.join_inflight().await;
                self.append(
                    "step.failed",
                    vec![(
                        corr,
                        EventBody::StepFailed {
                            error_kind: error.kind.as_str().into(),
                            message: error.message.clone(),
                            responses_consumed: u64::from(consumes),
                        },
                    )],
                )
                .await?;
                self.end_turn(
                    turn,
                    TerminalReason::Failed,
                    None,
                    Some(format!("model error ({}): {}", error.kind, error.message)),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn retry_attempt(
        &self,
        turn: TurnId,
        step: StepId,
        attempt: &mut u32,
        model: &str,
        (error, responses_consumed): (&ProviderError, u64),
        retry_in_ms: Option<u64>,
    ) -> Result<()> {
        let corr = Correlation::step(turn, step, *attempt);
        *attempt += 1;
        self.append(
            "step.retry",
            vec![
                (
                    corr,
                    EventBody::StepAttemptFailed {
                        model: model.to_owned(),
                        error_kind: error.kind.as_str().into(),
                        message: error.message.clone(),
                        retry_in_ms,
                        responses_consumed,
                    },
                ),
                (
                    Correlation::step(turn, step, *attempt),
                    EventBody::StepStarted {
                        model: model.to_owned(),
                    },
                ),
            ],
        )
        .await?;
        Ok(())
    }

    /// A call whose arguments are complete: journal it, and start it at once if it is read-only,
    /// parallel-safe and allowed by the step's snapshot.
    #[allow(clippy::too_many_arguments)]
    async fn proposed(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        attempt: u32,
        id: String,
        name: String,
        arguments: Value,
        invalid: Option<keel_model::InvalidArguments>,
        snapshot: &ContextSnapshot,
    ) -> Result<ToolCallId> {
        let call = ToolCallId::from(id.as_str());
        let existing = self
            .read(|j| {
                j.state
                    .tool_calls
                    .get(&call)
                    .map(|c| (c.step_id, c.name.clone(), c.arguments.clone(), c.status))
            })
            .await;
        let call = match existing {
            // The same call proposed again by a re-sampled attempt of the same step: reuse it.
            Some((s, n, a, _)) if s == step && n == name && a == arguments => {
                return Ok(call);
            }
            Some(_) => ToolCallId::from(format!("{id}_a{attempt}")),
            None => call,
        };
        let corr = Correlation::tool_call(turn, step, call.clone()).with_attempt(attempt);
        let mut items = vec![(
            corr.clone(),
            EventBody::ToolCallProposed {
                name: name.clone(),
                arguments: arguments.clone(),
            },
        )];
        if let Some(inv) = invalid {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
            items.push(finished_item(
                turn,
                step,
                &call,
                ToolCallStatus::Failed,
                inv.result_message(),
                true,
            ));
            self.append("tool.proposed", items).await?;
            return Ok(call);
        }
        self.append("tool.proposed", items).await?;
        let req = ToolCallRequest {
            call_id: call.to_string(),
            name,
            arguments,
        };
        if let Ok(v) = self.rt.tools.validate(&req)
            && v.effect == EffectClass::ReadOnly
            && v.parallel_safe
        {
            let (decision, _) = self
                .rt
                .tools
                .authorize(&v, &self.workspace, &snapshot.policy);
            if decision.verdict == Verdict::Allow {
                self.spawn_exec(
                    turn,
                    step,
                    call.clone(),
                    v,
                    snapshot.policy.clone(),
                    ExecMode::Fresh,
                );
            }
        }
        Ok(call)
    }

    // --- tools -------------------------------------------------------------------------------

    fn spawn_exec(
        self: &Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        v: ValidatedCall,
        policy: Policy,
        mode: ExecMode,
    ) {
        self.active
            .live_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(call.clone());
        let this = self.clone();
        let handle = tokio::spawn(async move {
            let id = call.clone();
            if let Err(e) = this.clone().exec(turn, step, call, v, policy, mode).await {
                tracing::warn!(session = %this.session, call = %id, "tool execution: {e}");
            }
            this.active
                .live_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        });
        self.inflight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handle);
    }

    async fn join_inflight(&self) {
        loop {
            let handles: Vec<_> =
                std::mem::take(&mut *self.inflight.lock().unwrap_or_else(PoisonError::into_inner));
            if handles.is_empty() {
                return;
            }
            for h in handles {
                let _ = h.await;
            }
        }
    }

    fn is_live(&self, call: &ToolCallId) -> bool {
        self.active
            .live_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(call)
    }

    /// Runs one call: journals its start (and effect intent), executes it under its own
    /// cancellation token and time limit, journals its one result.
    async fn exec(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        v: ValidatedCall,
        policy: Policy,
        mode: ExecMode,
    ) -> Result<()> {
        let corr = Correlation::tool_call(turn, step, call.clone());
        let status = self
            .read(|j| j.state.tool_calls.get(&call).map(|c| c.status))
            .await;
        let mut items = Vec::new();
        if status == Some(ToolCallStatus::Proposed) {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
        }
        let side_effecting = v.effect != EffectClass::ReadOnly;
        let key = OperationKey::for_call(self.session, step, &call);
        if side_effecting {
            let request_hash = content_hash(&json!({"tool": v.name, "arguments": v.arguments}));
            if matches!(mode, ExecMode::Fresh) {
                let rec = self
                    .read(|j| crate::effects::record(&j.state, &key, &call, &v.name, &request_hash))
                    .await;
                if let Some(rec) = rec
                    && let crate::effects::Claim::Duplicate(found) =
                        crate::effects::claim(self.rt.store.as_ref(), self.tenant, &rec).await?
                {
                    // Dispatched before by someone: never again. Journal it as dispatched with
                    // an unknown outcome; reconciliation or a human settles it.
                    tracing::warn!(session = %self.session, %key, status = %found.as_str(), "refused a second dispatch of an operation key");
                    let ecorr = corr.clone().with_operation(key.clone());
                    items.push((ecorr.clone(), EventBody::EffectPrepared { request_hash }));
                    items.push((
                        Correlation::default()
                            .with_operation(key.clone())
                            .with_attempt(1),
                        EventBody::EffectDispatched {},
                    ));
                    items.push((corr.clone(), EventBody::ToolCallStarted {}));
                    items.push((
                        Correlation::default().with_operation(key.clone()),
                        EventBody::EffectOutcomeUnknown {},
                    ));
                    self.append("effect.duplicate", items).await?;
                    return Ok(());
                }
            }
            let dispatch_attempt = match mode {
                ExecMode::Fresh => {
                    items.push((
                        corr.clone().with_operation(key.clone()),
                        EventBody::EffectPrepared { request_hash },
                    ));
                    1
                }
                ExecMode::Retry(n) | ExecMode::Rerun(n) => n,
            };
            if !matches!(mode, ExecMode::Rerun(_)) {
                items.push((
                    Correlation::default()
                        .with_operation(key.clone())
                        .with_attempt(dispatch_attempt),
                    EventBody::EffectDispatched {},
                ));
            }
        }
        items.push((corr.clone(), EventBody::ToolCallStarted {}));
        self.append(
            if side_effecting {
                "tool.dispatched"
            } else {
                "tool.started"
            },
            items,
        )
        .await?;

        let token = self.turn_token().child_token();
        self.active
            .tool_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(call.to_string(), token.clone());
        let ctx = ToolContext {
            call_id: call.to_string(),
            cancel: token.clone(),
            progress: self.progress.clone(),
            workspace: self.workspace.clone(),
            sandbox: self.sandbox.clone(),
            artifacts: self.artifacts.clone(),
            snapshot: Arc::new(StepSnapshot {
                step_id: step.to_string(),
                policy,
            }),
            limits: ToolLimits::default(),
        };
        let tools = self.rt.tools.clone();
        let fut = tools.execute(&v, &ctx);
        tokio::pin!(fut);
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let deadline = self.config.tool_timeout_ms.map_or(far, |ms| {
            tokio::time::Instant::now() + Duration::from_millis(ms)
        });
        let grace = Duration::from_millis(self.rt.options.cancel_grace_ms);
        let mut timed_out = false;
        let result: Option<ToolResult> = tokio::select! {
            r = &mut fut => Some(r),
            () = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                token.cancel();
                tokio::time::timeout(grace, &mut fut).await.ok()
            }
            () = token.cancelled() => tokio::time::timeout(grace, &mut fut).await.ok(),
        };
        self.active
            .tool_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call.as_str());
        self.hub_progress.finish(call.as_str());
        let interrupted = token.is_cancelled();
        let (status, output) = match (&result, timed_out) {
            (_, true) => (
                ToolCallStatus::Failed,
                format!(
                    "Error: `{}` timed out after {} ms and was stopped.{}",
                    v.name,
                    self.config.tool_timeout_ms.unwrap_or(0),
                    result
                        .as_ref()
                        .map(|r| format!(" Output so far:\n{}", r.content))
                        .unwrap_or_default()
                ),
            ),
            (Some(r), false) if interrupted => (
                ToolCallStatus::Cancelled,
                if r.content.is_empty() {
                    format!("`{}` was cancelled.", v.name)
                } else {
                    r.content.clone()
                },
            ),
            (None, false) => (
                ToolCallStatus::Cancelled,
                format!("`{}` was cancelled.", v.name),
            ),
            (Some(r), false) => (map_status(r.status), r.content.clone()),
        };
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        let mut items = Vec::new();
        let ecorr = Correlation::default().with_operation(key.clone());
        if side_effecting {
            if interrupted {
                // Stopped mid-flight: what happened is unknown — never recorded as failed.
                items.push((ecorr, EventBody::EffectOutcomeUnknown {}));
            } else if let Some(r) = &result {
                match r.status {
                    ToolResultStatus::Succeeded => items.push((
                        ecorr,
                        EventBody::EffectCommitted {
                            outcome: json!({"content": r.content, "details": r.details}),
                        },
                    )),
                    ToolResultStatus::Failed
                    | ToolResultStatus::Rejected
                    | ToolResultStatus::Cancelled => {
                        items.push((
                            ecorr,
                            EventBody::EffectFailed {
                                error: r.content.clone(),
                            },
                        ));
                    }
                }
            }
        }
        let is_error = status != ToolCallStatus::Succeeded;
        items.push(finished_item(turn, step, &call, status, output, is_error));
        let still_open = self
            .read(|j| {
                j.state
                    .tool_calls
                    .get(&call)
                    .is_some_and(|c| !c.status.is_terminal())
            })
            .await;
        if still_open {
            self.append("tool.finished", items).await?;
        }
        Ok(())
    }

    async fn policy_for(&self, step: StepId) -> Result<Policy> {
        if let Some((s, p)) = self
            .step_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            && *s == step
        {
            return Ok(p.clone());
        }
        Ok(self.snapshot().await?.policy)
    }

    async fn execute_tools(self: Arc<Self>, turn: TurnId) -> Result<ToolsEnd> {
        let Some((step, calls)) = self
            .read(|j| {
                let t = j.state.turns.get(&turn)?;
                let s = j.state.steps.get(t.steps.last()?)?;
                let calls: Vec<_> = s
                    .tool_calls
                    .iter()
                    .filter_map(|c| j.state.tool_calls.get(c).cloned())
                    .collect();
                Some((s.id, calls))
            })
            .await
        else {
            return Ok(ToolsEnd::Done);
        };
        let policy = self.policy_for(step).await?;
        let mut blocked = false;
        let mut seq_blocked = false;
        let mut sequential: Vec<(ToolCallId, ValidatedCall, ExecMode)> = Vec::new();
        for call in calls {
            if call.status.is_terminal() || self.is_live(&call.id) {
                continue;
            }
            let corr = Correlation::tool_call(turn, step, call.id.clone());
            let req = ToolCallRequest {
                call_id: call.id.to_string(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            };
            let validated = self.rt.tools.validate(&req);
            match call.status {
                ToolCallStatus::Proposed | ToolCallStatus::Validating => {
                    let mut items = Vec::new();
                    if call.status == ToolCallStatus::Proposed {
                        items.push((corr.clone(), EventBody::ToolCallValidating {}));
                    }
                    let v = match validated {
                        Ok(v) => v,
                        Err(result) => {
                            items.push(finished_item(
                                turn,
                                step,
                                &call.id,
                                map_status(result.status),
                                result.content.clone(),
                                true,
                            ));
                            self.append("tool.rejected", items).await?;
                            continue;
                        }
                    };
                    let (decision, _subject) =
                        self.rt.tools.authorize(&v, &self.workspace, &policy);
                    match decision.verdict {
                        Verdict::Deny => {
                            items.push(finished_item(turn, step, &call.id, ToolCallStatus::Rejected, format!(
                                "Permission denied for `{}`: {}. The call was not run; do not retry it unchanged — choose another way or ask the user.",
                                v.name, decision.reason
                            ), true));
                            self.append("tool.rejected", items).await?;
                        }
                        Verdict::Ask => {
                            let rec = self
                                .approvals
                                .request(self.session, turn, &v, Utc::now())
                                .await?;
                            let acorr = corr.clone().with_approval(rec.approval_id);
                            items.push((
                                acorr.clone(),
                                EventBody::ApprovalRequested {
                                    args_hash: rec.args_hash.clone(),
                                    expires_at: rec.expires_at,
                                },
                            ));
                            items.push((acorr, EventBody::ToolCallAwaitingApproval {}));
                            self.append("approval.requested", items).await?;
                            let _ = self
                                .rt
                                .store
                                .set_wake_at(self.tenant, self.session, Some(rec.expires_at))
                                .await;
                            blocked = true;
                            if v.effect != EffectClass::ReadOnly || !v.parallel_safe {
                                seq_blocked = true;
                            }
                        }
                        Verdict::Allow => {
                            if !items.is_empty() {
                                self.append("tool.validating", items).await?;
                            }
                            if v.effect == EffectClass::ReadOnly && v.parallel_safe {
                                self.spawn_exec(
                                    turn,
                                    step,
                                    call.id.clone(),
                                    v,
                                    policy.clone(),
                                    ExecMode::Fresh,
                                );
                            } else if !seq_blocked {
                                sequential.push((call.id.clone(), v, ExecMode::Fresh));
                            }
                        }
                    }
                }
                ToolCallStatus::AwaitingApproval => {
                    let (Some(approval), Ok(v)) = (call.approval_id, validated) else {
                        continue;
                    };
                    let subject = self.rt.tools.subject(&v, &self.workspace);
                    match self
                        .approvals
                        .resolve(approval, &v, &subject, Utc::now())
                        .await?
                    {
                        Resolution::Pending { .. } => {
                            blocked = true;
                            if v.effect != EffectClass::ReadOnly || !v.parallel_safe {
                                seq_blocked = true;
                            }
                        }
                        Resolution::Run { .. } => {
                            let rec = self.approvals.get(approval).await?;
                            let decision = rec.decision.unwrap_or(ApprovalDecision::AllowOnce);
                            self.append(
                                "approval.decided",
                                vec![(
                                    Correlation::default().with_approval(approval),
                                    EventBody::ApprovalDecided { decision },
                                )],
                            )
                            .await?;
                            let policy = self.snapshot().await?.policy;
                            if v.effect == EffectClass::ReadOnly && v.parallel_safe {
                                self.spawn_exec(
                                    turn,
                                    step,
                                    call.id.clone(),
                                    v,
                                    policy,
                                    ExecMode::Fresh,
                                );
                            } else if !seq_blocked {
                                sequential.push((call.id.clone(), v, ExecMode::Fresh));
                            }
                        }
                        Resolution::Rejected(result) => {
                            let rec = self.approvals.get(approval).await?;
                            let aevent = if rec.status == ApprovalStatus::Expired {
                                EventBody::ApprovalExpired {}
                            } else {
                                EventBody::ApprovalDecided {
                                    decision: rec.decision.unwrap_or(ApprovalDecision::Deny {
                                        reason: String::new(),
                                    }),
                                }
                            };
                            self.append(
                                "approval.decided",
                                vec![
                                    (Correlation::default().with_approval(approval), aevent),
                                    finished_item(
                                        turn,
                                        step,
                                        &call.id,
                                        ToolCallStatus::Rejected,
                                        result.content,
                                        true,
                                    ),
                                ],
                            )
                            .await?;
                        }
                    }
                }
                ToolCallStatus::Running => {
                    // Running but not in this process: the worker that ran it is gone.
                    let Ok(v) = validated else {
                        self.append(
                            "tool.recovered",
                            vec![finished_item(
                                turn,
                                step,
                                &call.id,
                                ToolCallStatus::Interrupted,
                                "The call was interrupted by a crash.".into(),
                                true,
                            )],
                        )
                        .await?;
                        continue;
                    };
                    match self
                        .clone()
                        .recover_call(turn, step, &call.id, call.operation_key.clone(), &v)
                        .await?
                    {
                        Recovery::Rerun(mode) => {
                            if v.effect == EffectClass::ReadOnly && v.parallel_safe {
                                self.spawn_exec(
                                    turn,
                                    step,
                                    call.id.clone(),
                                    v,
                                    policy.clone(),
                                    mode,
                                );
                            } else if !seq_blocked {
                                sequential.push((call.id.clone(), v, mode));
                            }
                        }
                        Recovery::Finished => {}
                        Recovery::NeedsHuman => {
                            blocked = true;
                            seq_blocked = true;
                        }
                    }
                }
                ToolCallStatus::Succeeded
                | ToolCallStatus::Failed
                | ToolCallStatus::Cancelled
                | ToolCallStatus::Rejected
                | ToolCallStatus::Interrupted => {}
            }
        }
        // Side-effecting and non-parallel calls: in proposal order, one at a time.
        for (id, v, mode) in sequential {
            if self.turn_token().is_cancelled() {
                break;
            }
            self.active
                .live_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id.clone());
            let r = self
                .clone()
                .exec(turn, step, id.clone(), v, policy.clone(), mode)
                .await;
            self.active
                .live_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
            r?;
        }
        self.join_inflight().await;
        if self.turn_token().is_cancelled() {
            return Ok(ToolsEnd::Blocked);
        }
        let open = self
            .read(|j| {
                j.state.steps.get(&step).is_some_and(|s| {
                    s.tool_calls.iter().any(|c| {
                        j.state
                            .tool_calls
                            .get(c)
                            .is_some_and(|c| !c.status.is_terminal())
                    })
                })
            })
            .await;
        if blocked || open {
            return Ok(if blocked {
                ToolsEnd::Blocked
            } else {
                ToolsEnd::Done
            });
        }
        Ok(ToolsEnd::Done)
    }

    /// A call left `running` by a worker that is gone.
    async fn recover_call(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: &ToolCallId,
        key: Option<OperationKey>,
        v: &ValidatedCall,
    ) -> Result<Recovery> {
        let Some(key) = key else {
            // Read-only: safe to run again.
            return Ok(Recovery::Rerun(ExecMode::Rerun(0)));
        };
        let effect = self.read(|j| j.state.effects.get(&key).cloned()).await;
        let Some(effect) = effect else {
            return Ok(Recovery::Rerun(ExecMode::Rerun(0)));
        };
        let ecorr = Correlation::default().with_operation(key.clone());
        match effect.status {
            EffectStatus::Prepared => {
                // Journaled with its dispatch in one batch, so never seen alone; treat as not run.
                self.append(
                    "effect.recovered",
                    vec![
                        (
                            ecorr,
                            EventBody::EffectFailed {
                                error: "never dispatched".into(),
                            },
                        ),
                        finished_item(
                            turn,
                            step,
                            call,
                            ToolCallStatus::Interrupted,
                            "The call was interrupted before it started.".into(),
                            true,
                        ),
                    ],
                )
                .await?;
                Ok(Recovery::Finished)
            }
            EffectStatus::Committed | EffectStatus::Failed => {
                let ok = effect.status == EffectStatus::Committed;
                self.append(
                    "effect.recovered",
                    vec![finished_item(
                        turn,
                        step,
                        call,
                        if ok {
                            ToolCallStatus::Succeeded
                        } else {
                            ToolCallStatus::Failed
                        },
                        "The call's outcome was recorded before a crash.".into(),
                        !ok,
                    )],
                )
                .await?;
                Ok(Recovery::Finished)
            }
            EffectStatus::Dispatched => {
                self.append(
                    "effect.outcome_unknown",
                    vec![(ecorr, EventBody::EffectOutcomeUnknown {})],
                )
                .await?;
                Box::pin(self.recover_call(turn, step, call, Some(key), v)).await
            }
            EffectStatus::OutcomeUnknown => match effect.decision {
                Some(EffectDecision::Committed { outcome }) => {
                    let text = match &outcome {
                        Value::String(s) => s.clone(),
                        Value::Null => "The operation was confirmed as done.".into(),
                        other => other
                            .get("content")
                            .and_then(Value::as_str)
                            .map_or_else(|| other.to_string(), str::to_owned),
                    };
                    self.append(
                        "effect.resolved",
                        vec![
                            (ecorr, EventBody::EffectCommitted { outcome }),
                            finished_item(turn, step, call, ToolCallStatus::Succeeded, text, false),
                        ],
                    )
                    .await?;
                    Ok(Recovery::Finished)
                }
                Some(EffectDecision::Failed { error }) => {
                    self.append(
                        "effect.resolved",
                        vec![
                            (
                                ecorr,
                                EventBody::EffectFailed {
                                    error: error.clone(),
                                },
                            ),
                            finished_item(
                                turn,
                                step,
                                call,
                                ToolCallStatus::Failed,
                                format!("Error: the operation did not happen: {error}"),
                                true,
                            ),
                        ],
                    )
                    .await?;
                    Ok(Recovery::Finished)
                }
                Some(EffectDecision::Retry) => {
                    Ok(Recovery::Rerun(ExecMode::Retry(effect.attempts + 1)))
                }
                None => {
                    if v.effect == EffectClass::IdempotentWrite {
                        return Ok(Recovery::Rerun(ExecMode::Retry(effect.attempts + 1)));
                    }
                    let Some(tool) = self.rt.tools.get(&v.name).cloned() else {
                        return Ok(Recovery::NeedsHuman);
                    };
                    if !tool.can_reconcile() {
                        return Ok(Recovery::NeedsHuman);
                    }
                    let ctx = ToolContext {
                        call_id: call.to_string(),
                        cancel: self.turn_token().child_token(),
                        progress: self.progress.clone(),
                        workspace: self.workspace.clone(),
                        sandbox: self.sandbox.clone(),
                        artifacts: self.artifacts.clone(),
                        snapshot: Arc::new(StepSnapshot::default()),
                        limits: ToolLimits::default(),
                    };
                    match tool.reconcile(key.as_str(), &ctx).await {
                        ReconcileOutcome::Committed { output } => {
                            self.append("effect.reconciled", vec![
                                    (ecorr, EventBody::EffectCommitted { outcome: json!({"content": output.content, "details": output.details, "reconciled": true}) }),
                                    finished_item(turn, step, call, ToolCallStatus::Succeeded, output.content, false),
                                ]).await?;
                            Ok(Recovery::Finished)
                        }
                        ReconcileOutcome::Failed { reason } => {
                            self.append("effect.reconciled", vec![
                                    (ecorr, EventBody::EffectFailed { error: reason.clone() }),
                                    finished_item(turn, step, call, ToolCallStatus::Failed, format!("Error: the operation did not happen (checked after a crash): {reason}"), true),
                                ]).await?;
                            Ok(Recovery::Finished)
                        }
                        ReconcileOutcome::Unknown => Ok(Recovery::NeedsHuman),
                    }
                }
            },
        }
    }

    // --- compaction --------------------------------------------------------------------------

    /// Summarizes older transcript behind a boundary. `aggressive` keeps only the latest item
    /// group (after a provider overflow). Returns `Some(PromptTooLong)` when the turn must end.
    async fn compact(&self, turn: TurnId, aggressive: bool) -> Result<Option<TerminalReason>> {
        let status = self
            .read(|j| j.state.turns.get(&turn).map(|t| t.status))
            .await;
        if status != Some(TurnStatus::Compacting) {
            self.append(
                "turn.compacting",
                vec![phase_item(turn, TurnStatus::Compacting)],
            )
            .await?;
        }
        let snapshot = self.snapshot().await?;
        let (from, cands, items, tokens, prev) = self
            .read(|j| {
                (
                    j.proj.first_kept,
                    boundaries(&j.proj, j.proj.first_kept),
                    j.proj.items.clone(),
                    j.proj.item_tokens.clone(),
                    j.proj.summary.clone(),
                )
            })
            .await;
        let target = (self.config.context_window_tokens as f64 * self.config.compact_at_fraction
            / 2.0) as u64;
        let keep_from = if aggressive {
            cands.last().copied()
        } else {
            cands
                .iter()
                .copied()
                .find(|c| {
                    tokens[usize::try_from(*c).unwrap_or(usize::MAX).min(tokens.len())..]
                        .iter()
                        .sum::<u64>()
                        <= target
                })
                .or_else(|| cands.last().copied())
        };
        let Some(keep_from) = keep_from else {
            return self.compaction_failed(turn).await;
        };
        let lo = usize::try_from(from).unwrap_or(0);
        let hi = usize::try_from(keep_from).unwrap_or(0).min(items.len());
        let mut input: Vec<Message> = items[lo..hi].to_vec();
        loop {
            let mut messages = vec![Message::User {
                content: match &prev {
                    Some(s) => format!("{}{s}", crate::context::SUMMARY_PREFIX),
                    None => "The conversation to summarize follows.".into(),
                },
            }];
            messages.extend(input.iter().cloned());
            messages.push(Message::User {
                content: "Summarize the conversation above for your own later use: the user's goals, decisions, facts learned, files touched and work still open. Be concise.".into(),
            });
            let position = self.read(|j| j.proj.position).await;
            let request = ModelRequest {
                instructions: Some(
                    "You write compact, faithful summaries of agent conversations.".into(),
                ),
                messages,
                purpose: RequestPurpose::Compaction,
                response_index: Some(position),
                cancel: self.turn_token().child_token(),
                ..ModelRequest::default()
            };
            let resp = keel_model::collect(
                self.rt.model.stream(request),
                self.rt.model.model(),
                &self.rt.options.prices,
            )
            .await;
            match resp.outcome {
                keel_model::Outcome::Completed { .. } => {
                    let summary = resp.text;
                    let after: u64 = tokens[hi..].iter().sum::<u64>()
                        + crate::context::estimate_tokens(&summary);
                    self.append(
                        "context.compacted",
                        vec![
                            (
                                Correlation::turn(turn),
                                EventBody::ContextCompacted {
                                    summary,
                                    first_kept_item: keep_from,
                                    tokens_before: snapshot.estimated_tokens,
                                    tokens_after: after,
                                },
                            ),
                            phase_item(turn, TurnStatus::Sampling),
                        ],
                    )
                    .await?;
                    return Ok(None);
                }
                keel_model::Outcome::Cancelled => return Ok(None),
                keel_model::Outcome::Failed { error } => {
                    if let Some(r) = self.compaction_failed_count(turn).await {
                        return Ok(Some(r));
                    }
                    if error.kind == ErrorKind::ContextOverflow && !input.is_empty() {
                        // Drop the oldest item group first.
                        let mut cut = 1;
                        while cut < input.len() && matches!(input[cut], Message::Tool { .. }) {
                            cut += 1;
                        }
                        input.drain(..cut);
                        continue;
                    }
                    self.append(
                        "turn.sampling",
                        vec![phase_item(turn, TurnStatus::Sampling)],
                    )
                    .await?;
                    return Ok(None);
                }
            }
        }
    }

    async fn compaction_failed_count(&self, turn: TurnId) -> Option<TerminalReason> {
        let local = {
            let mut f = self
                .compaction_failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let n = f.entry(turn).or_default();
            *n += 1;
            *n
        };
        let overflows = self
            .read(|j| j.proj.overflows.get(&turn).copied().unwrap_or(0))
            .await;
        (local + overflows.saturating_sub(1) >= 3).then_some(TerminalReason::PromptTooLong)
    }

    async fn compaction_failed(&self, turn: TurnId) -> Result<Option<TerminalReason>> {
        if let Some(r) = self.compaction_failed_count(turn).await {
            return Ok(Some(r));
        }
        let overflows = self
            .read(|j| j.proj.overflows.get(&turn).copied().unwrap_or(0))
            .await;
        if overflows >= 3 {
            return Ok(Some(TerminalReason::PromptTooLong));
        }
        self.append(
            "turn.sampling",
            vec![phase_item(turn, TurnStatus::Sampling)],
        )
        .await?;
        Ok(None)
    }

    // --- ending a turn -----------------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn finished_body(
        &self,
        reason: TerminalReason,
        limit: Option<BudgetLimit>,
        error: Option<String>,
        usage: &Usage,
        cost: f64,
        steps: u32,
        duration_ms: u64,
    ) -> EventBody {
        EventBody::TurnFinished {
            terminal_reason: reason,
            limit,
            usage: *usage,
            cost_usd: cost,
            num_steps: steps,
            duration_ms,
            error,
        }
    }

    /// Ends the turn with `reason`: stops everything below it, gives every open call a result
    /// (dispatched effects become `outcome_unknown`), closes open steps, and journals
    /// `turn.finished` (after `session.status_changed(running)` if the session required action).
    async fn end_turn(
        &self,
        turn: TurnId,
        reason: TerminalReason,
        limit: Option<BudgetLimit>,
        error: Option<String>,
    ) -> Result<()> {
        if reason != TerminalReason::Completed {
            self.turn_token().cancel();
        }
        self.join_inflight().await;
        let call_status = if reason == TerminalReason::Aborted {
            ToolCallStatus::Cancelled
        } else {
            ToolCallStatus::Interrupted
        };
        let items = self
            .read(|j| {
                let mut items: Items = Vec::new();
                let Some(t) = j.state.turns.get(&turn) else {
                    return items;
                };
                if j.state.status == SessionStatus::RequiresAction
                    && j.state.active_turn == Some(turn)
                {
                    items.push(status_item(SessionStatus::Running, "the turn ended"));
                }
                for s in t.steps.iter().filter_map(|s| j.state.steps.get(s)) {
                    for c in s
                        .tool_calls
                        .iter()
                        .filter_map(|c| j.state.tool_calls.get(c))
                    {
                        if c.status.is_terminal() {
                            continue;
                        }
                        if let Some(key) = &c.operation_key
                            && j.state
                                .effects
                                .get(key)
                                .is_some_and(|e| e.status == EffectStatus::Dispatched)
                        {
                            items.push((
                                Correlation::default().with_operation(key.clone()),
                                EventBody::EffectOutcomeUnknown {},
                            ));
                        }
                        let text = match reason {
                            TerminalReason::Aborted => {
                                format!("`{}` was cancelled: the turn was cancelled.", c.name)
                            }
                            _ => format!(
                                "`{}` was interrupted: the turn ended ({}).",
                                c.name,
                                reason.as_str()
                            ),
                        };
                        items.push(finished_item(turn, s.id, &c.id, call_status, text, true));
                    }
                    if !s.status.is_terminal() {
                        items.push((
                            Correlation::step(turn, s.id, s.attempt),
                            EventBody::StepFailed {
                                error_kind: if reason == TerminalReason::Aborted {
                                    "cancelled".into()
                                } else {
                                    reason.as_str().into()
                                },
                                message: error.clone().unwrap_or_else(|| "the turn ended".into()),
                                responses_consumed: 0,
                            },
                        ));
                    }
                }
                let duration = t.started_at.map_or(0, |s| {
                    u64::try_from((Utc::now() - s).num_milliseconds()).unwrap_or(0)
                });
                items.push((
                    Correlation::turn(turn),
                    self.finished_body(
                        reason,
                        limit,
                        error.clone(),
                        &t.usage,
                        t.cost_usd,
                        u32::try_from(t.steps.len()).unwrap_or(u32::MAX),
                        duration,
                    ),
                ));
                items
            })
            .await;
        self.append("turn.finished", items).await?;
        Ok(())
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Clone, Copy)]
enum ExecMode {
    /// First run: journal effect intent and dispatch.
    Fresh,
    /// A new dispatch attempt of an `outcome_unknown` effect.
    Retry(u32),
    /// A read-only call re-run after a crash.
    Rerun(u32),
}

enum Recovery {
    Rerun(ExecMode),
    Finished,
    NeedsHuman,
}

fn map_status(s: ToolResultStatus) -> ToolCallStatus {
    match s {
        ToolResultStatus::Succeeded => ToolCallStatus::Succeeded,
        ToolResultStatus::Failed => ToolCallStatus::Failed,
        ToolResultStatus::Cancelled => ToolCallStatus::Cancelled,
        ToolResultStatus::Rejected => ToolCallStatus::Rejected,
    }
}

fn to_core_usage(u: &keel_model::Usage) -> Usage {
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        reasoning_tokens: u.reasoning_tokens,
    }
}

fn status_item(status: SessionStatus, reason: &str) -> (Correlation, EventBody) {
    (
        Correlation::default(),
        EventBody::SessionStatusChanged {
            status,
            reason: Some(reason.to_owned()),
        },
    )
}

fn phase_item(turn: TurnId, phase: TurnStatus) -> (Correlation, EventBody) {
    (
        Correlation::turn(turn),
        EventBody::TurnPhaseChanged { phase },
    )
}

fn finished_item(
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
