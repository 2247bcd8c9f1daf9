//! Property tests of the planner ([`keel_core::plan::next`]) against a simulated driver.
//!
//! The simulated driver does with each [`Next`] what `keel-runtime`'s driver does: it journals
//! the events that record the action, in the same atomic batches (a call's start with its
//! effect's intent, an outcome with the call's result, a turn's end with every open call's
//! result), folds them with [`SessionState::apply`], and asks again. Everything outside the
//! journal comes from a deterministic world:
//!
//! - a **tape** of random bytes answers each question in turn — how many calls a step proposes
//!   and what validation and policy say of each (invalid, read-only / idempotent write /
//!   side-effecting, parallel-safe, reconcilable, allow / ask / deny), model failures (fatal,
//!   transient, `context_overflow`), compaction failures, tool outcomes, reconcile answers and
//!   human decisions (allow, deny, a decision for the wrong argument hash, expiry; `committed`,
//!   `failed` or `retry` for an `outcome_unknown` effect; a cancellation). An exhausted tape
//!   answers 0, the quiet answer (no calls, success), so every run ends;
//! - a **schedule** ([`Config`]) says after which commits the worker crashes (and during which
//!   tool runs: after a call's start and intent are committed, before its outcome is), at which
//!   planner call a cancellation or a new input arrives, and the limits (steps, tool calls, loops, the
//!   turn's wall clock, the context window).
//!
//! A crash loses everything process-local (calls running here, compaction failures, reconcile
//! answers); what was committed stays, so a call that was running stays `running` in the
//! journal (a side-effecting one with its effect `dispatched`). A new worker replays the
//! journal and goes on. Waiting on a human ends the worker's run; humans decide in the
//! approvals table or journal `effect.decided`, and a new worker replays and goes on.
//!
//! Each check is tagged with the property it belongs to; a run stops at its first violation.
//! Each property fails on its own violations and on any event the fold refuses (no planner
//! answer may lead the driver to an illegal event).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, TimeZone, Utc};
use keel_core::canonical::content_hash;
use keel_core::plan::{
    self, ApprovalFacts, ApprovalOutcome, CallFacts, EffectClass, Facts, Limits, Next, Settle,
    Verdict,
};
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalStatus, Budget, BudgetLimit, Correlation, EffectDecision,
    EffectStatus, Event, EventBody, HookDecision, HookEvent, OperationKey, ReleaseId, SessionId,
    SessionState, SessionStatus, StateMachine, StepId, StepStatus, TenantId, TerminalReason,
    ToolCallId, ToolCallStatus, TurnId, TurnStatus, Usage, args_hash,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use uuid::Uuid;

/// Clock of the first event, Unix ms.
const BASE_MS: i64 = 1_764_460_000_000;
/// Each commit takes a second of the world's clock.
const TICK_MS: i64 = 1_000;
/// How long an approval waits.
const APPROVAL_TTL_MS: i64 = 30 * 60 * 1_000;
/// Planner calls a session may take, all workers and waits included, before it must have
/// reached `Idle` (the simulations here need at most about a fifth of it).
const PLANNER_CALL_BOUND: usize = 500;
/// Steps (per session) in which the model proposes calls; later steps propose none (or the
/// stubborn model's call).
const STEPS_WITH_CALLS: u32 = 10;
/// The context estimate grows by this much per journaled event since the last compaction.
const TOKENS_PER_EVENT: u64 = 40;
/// The model the simulated provider names.
const MODEL: &str = "sim:model";

// --- the world ------------------------------------------------------------------------------

/// The schedule and limits of one simulated session.
#[derive(Clone, Debug)]
struct Config {
    /// Turn budget: most steps.
    max_steps: Option<u32>,
    /// Session budget: most tool calls run.
    max_tool_calls: Option<u32>,
    /// `loop_threshold` (0: off).
    loop_threshold: u32,
    /// The model's context window in tokens (0: never compact for size).
    window: u64,
    /// The turn's wall-clock limit.
    turn_timeout_ms: Option<u64>,
    /// Once the tape is exhausted the model proposes the same failing call forever (only with
    /// a step budget or loop detection, which must then end the turn).
    stubborn: bool,
    /// The worker dies right after these commits (counted over the session).
    crash_at: Vec<usize>,
    /// The worker dies while these tool runs (counted over the session) are under way: after
    /// the run's start (and intent) is committed, before its outcome is.
    crash_during: Vec<usize>,
    /// A cancellation arrives before this planner call.
    cancel_at: Option<usize>,
    /// New inputs arrive before these planner calls (or when the session would go idle).
    queue_at: Vec<usize>,
    /// Property 5 forks a recovered run at the first planner call from here on where the
    /// worker holds nothing process-local.
    fork_at: usize,
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop::option::weighted(0.3, 2u32..8),
        prop::option::weighted(0.3, 3u32..16),
        prop_oneof![Just(0u32), Just(2), Just(3)],
        prop_oneof![Just(0u64), Just(2_000u64)],
        prop::option::weighted(0.3, prop_oneof![Just(60_000u64), Just(300_000u64)]),
        any::<bool>(),
        prop::collection::vec(1usize..100, 0..4),
        prop::collection::vec(1usize..12, 0..3),
        prop::option::of(0usize..100),
        prop::collection::vec(0usize..100, 0..3),
        0usize..80,
    )
        .prop_map(
            |(
                max_steps,
                max_tool_calls,
                loop_threshold,
                window,
                turn_timeout_ms,
                stubborn,
                crash_at,
                crash_during,
                cancel_at,
                queue_at,
                fork_at,
            )| Config {
                max_steps,
                max_tool_calls,
                loop_threshold,
                window,
                turn_timeout_ms,
                stubborn,
                crash_at,
                crash_during,
                cancel_at,
                queue_at,
                fork_at,
            },
        )
}

fn scenario() -> impl Strategy<Value = (Config, Vec<u8>)> {
    (config(), prop::collection::vec(any::<u8>(), 0..400))
}

/// Which property a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// 1: an operation key dispatched twice, a side effect run without its intent.
    Dispatch,
    /// 2: a call run without an allowed approval for its exact arguments.
    Approval,
    /// 3: a turn finished while a call could not get its result.
    Finish,
    /// 4: no terminal reason or wait within the bound, a wait for nothing.
    Progress,
    /// 6: a turn ended `loop_detected` while one of its budgets was exhausted (the budget is
    /// what ended it: calls refused by a spent tool-call budget all look alike).
    Budget,
    /// Any other event the fold refuses, or an answer the driver cannot carry out: every
    /// property fails on these.
    Fold,
}

#[derive(Clone, Debug)]
struct Violation {
    kind: Kind,
    what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.what)
    }
}

fn violation(kind: Kind, what: impl Into<String>) -> Violation {
    Violation {
        kind,
        what: what.into(),
    }
}

/// Why the simulated worker stopped doing what it was doing.
enum Halt {
    /// It died (right after a commit).
    Crash,
    /// The run is invalid from here.
    Violation(Violation),
}

impl From<Violation> for Halt {
    fn from(v: Violation) -> Self {
        Halt::Violation(v)
    }
}

/// What the worker holds in memory only: lost by a crash, empty for a new worker.
#[derive(Clone, Debug, Default, PartialEq)]
struct Local {
    running: BTreeSet<ToolCallId>,
    compaction_failures: BTreeMap<TurnId, u32>,
    skip_compaction: bool,
    unreconciled: BTreeSet<OperationKey>,
}

/// A call the model will propose in a step.
#[derive(Clone, Debug)]
struct Planned {
    id: ToolCallId,
    name: String,
    args: Value,
}

/// One planner call of the live run, for property 5.
#[derive(Clone, Debug)]
struct Checkpoint {
    /// Journal length when it was asked.
    version: u64,
    facts: Facts,
    next: Next,
    /// With nothing running here: the facts a crash would leave and the live state's answer
    /// to them.
    after_crash: Option<(Facts, Next)>,
}

#[derive(Clone, Debug)]
struct World {
    cfg: Config,
    tape: Vec<u8>,
    pos: usize,
    session: SessionId,
    clock: i64,
    journal: Vec<Event>,
    /// The current worker's folded state.
    state: SessionState,
    local: Local,
    ids: u128,
    /// What the model proposes in each step (the same calls on every attempt).
    plans: BTreeMap<StepId, Vec<Planned>>,
    /// Validation and the step's frozen policy, per call.
    facts_of: BTreeMap<ToolCallId, CallFacts>,
    stubborn_calls: BTreeSet<ToolCallId>,
    /// The approvals table.
    table: BTreeMap<ApprovalId, ApprovalFacts>,
    /// Journal length at the last compaction.
    compacted_at_len: usize,
    /// Inputs still to arrive, by planner call.
    inputs: Vec<usize>,
    commits: usize,
    tool_runs: usize,
    crashes: usize,
    waits: usize,
    planner_calls: usize,
    steps_with_calls: u32,
    /// The side effects that happened in the world: per operation key, whether a human has
    /// since decided to retry it.
    side_effects: BTreeMap<OperationKey, bool>,
    trace: Vec<Next>,
    recording: bool,
    checkpoints: Vec<Checkpoint>,
    fork: Option<Box<World>>,
    /// How the run ended: `None` while running.
    end: Option<Result<(), Violation>>,
}

fn ts(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn status_item(status: SessionStatus) -> (Correlation, EventBody) {
    (
        Correlation::default(),
        EventBody::SessionStatusChanged {
            status,
            reason: None,
        },
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

fn effect_corr(key: &OperationKey) -> Correlation {
    Correlation::default().with_operation(key.clone())
}

impl World {
    fn new(cfg: Config, tape: Vec<u8>) -> World {
        let mut inputs = cfg.queue_at.clone();
        inputs.sort_unstable();
        let mut w = World {
            cfg,
            tape,
            pos: 0,
            session: SessionId(Uuid::from_u128(0x5e55_1011)),
            clock: BASE_MS,
            journal: Vec::new(),
            state: SessionState::default(),
            local: Local::default(),
            ids: 0,
            plans: BTreeMap::new(),
            facts_of: BTreeMap::new(),
            stubborn_calls: BTreeSet::new(),
            table: BTreeMap::new(),
            compacted_at_len: 0,
            inputs,
            commits: 0,
            tool_runs: 0,
            crashes: 0,
            waits: 0,
            planner_calls: 0,
            steps_with_calls: 0,
            side_effects: BTreeMap::new(),
            trace: Vec::new(),
            recording: true,
            checkpoints: Vec::new(),
            fork: None,
            end: None,
        };
        let created = vec![(
            Correlation::default(),
            EventBody::SessionCreated {
                tenant_id: TenantId(Uuid::from_u128(7)),
                release_id: ReleaseId::from("sha256:sim"),
                config: json!({}),
            },
        )];
        let turn = w.fresh_turn();
        let queued = vec![(
            Correlation::turn(turn),
            EventBody::TurnQueued {
                input: "goal".into(),
                compiled: None,
            },
        )];
        if let Err(v) = w
            .append(created, Kind::Fold, "session.created")
            .and_then(|()| w.append(queued, Kind::Fold, "turn.queued"))
        {
            w.end = Some(Err(v));
        }
        w
    }

    // --- randomness -------------------------------------------------------------------------

    /// The tape's next answer in `0..n` (0 once the tape is exhausted).
    fn pick(&mut self, n: u8) -> u8 {
        let b = self.tape.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b % n
    }

    fn exhausted(&self) -> bool {
        self.pos >= self.tape.len()
    }

    fn fresh(&mut self) -> u128 {
        self.ids += 1;
        self.ids
    }

    fn fresh_turn(&mut self) -> TurnId {
        TurnId(Uuid::from_u128(0x1_0000 + self.fresh()))
    }

    fn fresh_step(&mut self) -> StepId {
        StepId(Uuid::from_u128(0x2_0000 + self.fresh()))
    }

    fn fresh_approval(&mut self) -> ApprovalId {
        ApprovalId(Uuid::from_u128(0x3_0000 + self.fresh()))
    }

    fn now(&self) -> DateTime<Utc> {
        ts(self.clock)
    }

    // --- the journal ------------------------------------------------------------------------

    /// Appends `items` atomically (folding each; a refusal is a violation of `kind`).
    fn append(
        &mut self,
        items: Vec<(Correlation, EventBody)>,
        kind: Kind,
        doing: &str,
    ) -> Result<(), Violation> {
        if items.is_empty() {
            return Ok(());
        }
        for (corr, body) in items {
            let ev = Event::new(self.session, self.state.version + 1, self.now(), corr, body);
            if let Err(e) = self.state.apply(&ev) {
                return Err(violation(
                    kind,
                    format!(
                        "the fold refused {} ({e}) while the driver carried out {doing}; the planner's last answers: {:?}",
                        ev.type_name(),
                        self.trace.iter().rev().take(4).collect::<Vec<_>>()
                    ),
                ));
            }
            if matches!(ev.body, EventBody::ContextCompacted { .. }) {
                self.compacted_at_len = self.journal.len() + 1;
            }
            self.journal.push(ev);
        }
        self.clock += TICK_MS;
        Ok(())
    }

    /// A commit of the worker: durable, and the worker may die right after it.
    fn commit(&mut self, items: Vec<(Correlation, EventBody)>, next: &Next) -> Result<(), Halt> {
        if items.is_empty() {
            return Ok(());
        }
        let kind = if matches!(next, Next::FinishTurn { .. }) {
            Kind::Finish
        } else {
            Kind::Fold
        };
        self.append(items, kind, "the planner's answer")?;
        self.commits += 1;
        if self.cfg.crash_at.contains(&self.commits) {
            return Err(Halt::Crash);
        }
        Ok(())
    }

    /// An append by someone else (a host journaling a user's or a human's intent).
    fn outside_append(&mut self, items: Vec<(Correlation, EventBody)>) -> Result<(), Violation> {
        self.append(items, Kind::Fold, "an outside intent")
    }

    // --- facts ------------------------------------------------------------------------------

    fn limits(&self) -> Limits {
        Limits {
            turn_budget: Budget {
                max_steps: self.cfg.max_steps,
                ..Budget::default()
            },
            session_budget: Budget {
                max_tool_calls: self.cfg.max_tool_calls,
                ..Budget::default()
            },
            tenant_daily_budget: Budget::default(),
            loop_threshold: self.cfg.loop_threshold,
            turn_timeout_ms: self.cfg.turn_timeout_ms,
            context_window_tokens: self.cfg.window,
            compact_at_fraction: 0.8,
            max_compaction_failures: 2,
        }
    }

    /// What the driver supplies: facts for every open call of the active turn's last step and
    /// the table's record of every approval they wait on.
    fn facts(&self) -> Facts {
        let s = &self.state;
        let mut calls = BTreeMap::new();
        let mut approvals = BTreeMap::new();
        let turn = s.active_turn.and_then(|t| s.turns.get(&t));
        if let Some(step) = turn
            .and_then(|t| t.steps.last())
            .and_then(|st| s.steps.get(st))
        {
            for call in step
                .tool_calls
                .iter()
                .filter_map(|c| s.tool_calls.get(c))
                .filter(|c| !c.status.is_terminal())
            {
                if let Some(f) = self.facts_of.get(&call.id) {
                    calls.insert(call.id.clone(), f.clone());
                }
                if call.status == ToolCallStatus::AwaitingApproval
                    && let Some(a) = call.approval_id
                    && s.approvals
                        .get(&a)
                        .is_some_and(|a| a.status == ApprovalStatus::Pending)
                    && let Some(row) = self.table.get(&a)
                {
                    approvals.insert(a, row.clone());
                }
            }
        }
        let since = self.journal.len().saturating_sub(self.compacted_at_len) as u64;
        Facts {
            now: self.now(),
            limits: self.limits(),
            calls,
            approvals,
            running_here: self.local.running.clone(),
            waiting_in_child: Default::default(),
            context_tokens: since * TOKENS_PER_EVENT,
            compaction_failures: turn
                .and_then(|t| self.local.compaction_failures.get(&t.id).copied())
                .unwrap_or(0),
            skip_compaction: self.local.skip_compaction,
            unreconciled: self.local.unreconciled.clone(),
            tenant_usage: None,
            shared: None,
            hooks: Default::default(),
        }
    }

    // --- the loop ---------------------------------------------------------------------------

    fn run(&mut self) {
        while self.end.is_none() {
            match self.step_once() {
                Ok(true) => self.end = Some(Ok(())),
                Ok(false) => {}
                Err(Halt::Crash) => {
                    self.crashes += 1;
                    if let Err(v) = self.new_worker() {
                        self.end = Some(Err(v));
                    }
                }
                Err(Halt::Violation(v)) => self.end = Some(Err(v)),
            }
        }
    }

    /// A new worker: nothing in memory, the state replayed from the journal.
    fn new_worker(&mut self) -> Result<(), Violation> {
        self.local = Local::default();
        self.state = SessionState::replay(&self.journal)
            .map_err(|e| violation(Kind::Fold, format!("the journal does not replay: {e}")))?;
        Ok(())
    }

    /// One planner call and what the driver does with the answer. `Ok(true)` when done.
    fn step_once(&mut self) -> Result<bool, Halt> {
        if self.planner_calls >= PLANNER_CALL_BOUND {
            return Err(violation(
                Kind::Progress,
                format!(
                    "no idle session after {} planner calls; the last answers: {:?}",
                    self.planner_calls,
                    self.trace.iter().rev().take(6).collect::<Vec<_>>()
                ),
            )
            .into());
        }
        if self.recording
            && self.fork.is_none()
            && self.planner_calls >= self.cfg.fork_at
            && self.local == Local::default()
        {
            let mut fork = self.clone();
            fork.recording = false;
            fork.checkpoints = Vec::new();
            self.fork = Some(Box::new(fork));
        }
        self.outside()?;
        if !self.local.running.is_empty() && self.pick(3) == 1 {
            let call = self.local.running.iter().next().cloned();
            if let Some(call) = call {
                self.finish_running(&call)?;
            }
        }
        let facts = self.facts();
        let next = plan::next(&self.state, &facts);
        self.planner_calls += 1;
        if self.recording {
            let after_crash = facts.running_here.is_empty().then(|| {
                let crash = Facts {
                    compaction_failures: 0,
                    skip_compaction: false,
                    unreconciled: BTreeSet::new(),
                    ..facts.clone()
                };
                let answer = plan::next(&self.state, &crash);
                (crash, answer)
            });
            self.checkpoints.push(Checkpoint {
                version: self.state.version,
                facts,
                next: next.clone(),
                after_crash,
            });
        }
        self.trace.push(next.clone());
        self.check(&next)?;
        self.apply(next)
    }

    /// Cancellations and new inputs that arrive now.
    fn outside(&mut self) -> Result<(), Violation> {
        let i = self.planner_calls;
        if self.cfg.cancel_at == Some(i) {
            let target = self
                .state
                .active_turn
                .or_else(|| self.state.queue.front().copied());
            if let Some(turn) = target {
                self.outside_append(vec![(
                    Correlation::turn(turn),
                    EventBody::TurnCancelRequested {
                        reason: "cancelled by the user".into(),
                    },
                )])?;
            }
        }
        while self.inputs.first().is_some_and(|at| *at <= i) {
            self.inputs.remove(0);
            self.queue_input()?;
        }
        Ok(())
    }

    fn queue_input(&mut self) -> Result<(), Violation> {
        let turn = self.fresh_turn();
        self.outside_append(vec![(
            Correlation::turn(turn),
            EventBody::TurnQueued {
                input: "another goal".into(),
                compiled: None,
            },
        )])
    }

    // --- checks made on each answer before the driver acts on it ----------------------------

    fn check(&self, next: &Next) -> Result<(), Violation> {
        let s = &self.state;
        if s.status == SessionStatus::RequiresAction
            && !matches!(
                next,
                Next::Resume | Next::WaitForHuman { .. } | Next::FinishTurn { .. }
            )
        {
            return Err(violation(
                Kind::Fold,
                format!("{next:?} while the session waits on a human"),
            ));
        }
        match next {
            Next::FinishTurn {
                turn,
                reason: TerminalReason::LoopDetected,
                ..
            } => {
                if let Some(t) = s.turns.get(turn)
                    && let Some(limit) = plan::budget_exhausted(s, t, &self.facts())
                {
                    return Err(violation(
                        Kind::Budget,
                        format!("{next:?} while the {limit:?} budget is exhausted"),
                    ));
                }
            }
            Next::Dispatch {
                step,
                call,
                effect,
                attempt,
                ..
            } => {
                self.check_runnable(call, next)?;
                self.check_order(*step, call, false, next)?;
                let facts_effect = match self.facts_of.get(call) {
                    Some(CallFacts::Valid { effect, .. }) => *effect,
                    _ => EffectClass::SideEffecting,
                };
                if *effect != facts_effect {
                    return Err(violation(
                        Kind::Dispatch,
                        format!("{next:?}: the tool is {facts_effect:?}"),
                    ));
                }
                let key = OperationKey::for_call(self.session, *step, call);
                match s.effects.get(&key) {
                    Some(e) => {
                        let decided_retry = e.status == EffectStatus::OutcomeUnknown
                            && e.decision == Some(EffectDecision::Retry);
                        let idempotent = e.status == EffectStatus::OutcomeUnknown
                            && e.decision.is_none()
                            && facts_effect == EffectClass::IdempotentWrite;
                        if !(decided_retry || idempotent) {
                            return Err(violation(
                                Kind::Dispatch,
                                format!(
                                    "{next:?} dispatches {key} again: its effect is {} with decision {:?} and the tool is {facts_effect:?}",
                                    e.status.as_str(),
                                    e.decision
                                ),
                            ));
                        }
                        if *attempt != e.attempts + 1 {
                            return Err(violation(
                                Kind::Dispatch,
                                format!("{next:?}: the effect had {} attempts", e.attempts),
                            ));
                        }
                    }
                    None if *attempt != 1 => {
                        return Err(violation(
                            Kind::Dispatch,
                            format!("{next:?}: first dispatch with attempt {attempt}"),
                        ));
                    }
                    None => {}
                }
            }
            Next::Execute { calls, step, .. } => {
                if calls.is_empty() {
                    return Err(violation(Kind::Progress, "Execute of no calls"));
                }
                for call in calls {
                    self.check_runnable(call, next)?;
                    self.check_order(*step, call, true, next)?;
                    if !matches!(
                        self.facts_of.get(call),
                        Some(CallFacts::Valid {
                            effect: EffectClass::ReadOnly,
                            parallel_safe: true,
                            ..
                        })
                    ) {
                        return Err(violation(
                            Kind::Dispatch,
                            format!(
                                "{next:?} runs {call} ({:?}) in a parallel batch, without journaling an intent",
                                self.facts_of.get(call)
                            ),
                        ));
                    }
                }
            }
            Next::Rerun { call, .. } => {
                self.check_runnable(call, next)?;
                let c = &s.tool_calls[call];
                let read_only = matches!(
                    self.facts_of.get(call),
                    Some(CallFacts::Valid {
                        effect: EffectClass::ReadOnly,
                        ..
                    })
                );
                if c.status != ToolCallStatus::Running || !read_only || c.operation_key.is_some() {
                    return Err(violation(
                        Kind::Dispatch,
                        format!(
                            "{next:?} re-runs a {} call that is not a read-only one left running ({:?})",
                            c.status.as_str(),
                            self.facts_of.get(call)
                        ),
                    ));
                }
            }
            Next::ApplyApproval {
                approval,
                outcome: ApprovalOutcome::Allowed(_),
                ..
            } => {
                let journaled = s.approvals.get(approval).map(|a| a.args_hash.clone());
                let row = self.table.get(approval);
                let ok = row.is_some_and(|r| {
                    r.status == ApprovalStatus::Allowed && Some(&r.args_hash) == journaled.as_ref()
                });
                if !ok {
                    return Err(violation(
                        Kind::Approval,
                        format!(
                            "{next:?} journals an allowance the table does not hold for the requested arguments (journal hash {journaled:?}, table {row:?})"
                        ),
                    ));
                }
            }
            Next::FinishTurn {
                turn,
                reason: TerminalReason::Completed,
                ..
            } => {
                let last = s
                    .turns
                    .get(turn)
                    .and_then(|t| t.steps.last())
                    .and_then(|st| s.steps.get(st));
                if !last.is_some_and(|st| {
                    st.status == StepStatus::Completed && st.tool_calls.is_empty()
                }) {
                    return Err(violation(
                        Kind::Finish,
                        format!("{next:?} but the last step is {last:?}"),
                    ));
                }
            }
            Next::AwaitRunning { calls }
                if calls.is_empty() || calls.iter().any(|c| !self.local.running.contains(c)) =>
            {
                return Err(violation(
                    Kind::Progress,
                    format!(
                        "{next:?} but the calls running here are {:?}",
                        self.local.running
                    ),
                ));
            }
            Next::WaitForHuman {
                approvals, effects, ..
            } => {
                if approvals.is_empty() && effects.is_empty() {
                    return Err(violation(
                        Kind::Progress,
                        format!("{next:?} waits on nothing"),
                    ));
                }
                for a in approvals {
                    if s.approvals.get(a).map(|a| a.status) != Some(ApprovalStatus::Pending) {
                        return Err(violation(
                            Kind::Progress,
                            format!("{next:?}: approval {a} is not pending"),
                        ));
                    }
                }
                for k in effects {
                    if !s.effects.get(k).is_some_and(|e| {
                        e.status == EffectStatus::OutcomeUnknown && e.decision.is_none()
                    }) {
                        return Err(violation(
                            Kind::Progress,
                            format!("{next:?}: effect {k} waits on no human"),
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A call about to run: open, not running here, and allowed for its exact arguments.
    /// A call's first start keeps the model's order: a call that is not parallel-safe only when
    /// every earlier call of its step has its result, a parallel-safe one only while no earlier
    /// call that is not parallel-safe is open.
    fn check_order(
        &self,
        step: StepId,
        call: &ToolCallId,
        parallel: bool,
        next: &Next,
    ) -> Result<(), Violation> {
        let s = &self.state;
        if s.tool_calls.get(call).is_none_or(|c| c.runs > 0) {
            return Ok(());
        }
        let Some(order) = s.steps.get(&step).map(|st| &st.tool_calls) else {
            return Ok(());
        };
        for earlier in order.iter().take_while(|c| *c != call) {
            let open = s
                .tool_calls
                .get(earlier)
                .is_some_and(|c| !c.status.is_terminal());
            let earlier_parallel = matches!(
                self.facts_of.get(earlier),
                Some(CallFacts::Valid {
                    effect: EffectClass::ReadOnly,
                    parallel_safe: true,
                    ..
                })
            );
            if open && (!parallel || !earlier_parallel) {
                return Err(violation(
                    Kind::Dispatch,
                    format!("{next:?} starts {call} while the earlier {earlier} is open"),
                ));
            }
        }
        Ok(())
    }

    fn check_runnable(&self, call: &ToolCallId, next: &Next) -> Result<(), Violation> {
        let s = &self.state;
        let Some(c) = s.tool_calls.get(call) else {
            return Err(violation(
                Kind::Fold,
                format!("{next:?} names unknown call {call}"),
            ));
        };
        if c.status.is_terminal() {
            return Err(violation(
                Kind::Dispatch,
                format!(
                    "{next:?} runs {call}, which already has its result ({})",
                    c.status.as_str()
                ),
            ));
        }
        if self.local.running.contains(call) {
            return Err(violation(
                Kind::Dispatch,
                format!("{next:?} runs {call}, which is running here"),
            ));
        }
        match self.facts_of.get(call) {
            Some(CallFacts::Valid {
                verdict: Verdict::Allow,
                ..
            }) => {}
            Some(CallFacts::Valid {
                verdict: Verdict::Ask,
                ..
            }) if c.approval_id.is_some() => {}
            other => {
                return Err(violation(
                    Kind::Approval,
                    format!("{next:?} runs {call} ({other:?}) without an approval"),
                ));
            }
        }
        if let Some(a) = c.approval_id {
            let journaled = s.approvals.get(&a);
            let row = self.table.get(&a);
            let ok = journaled.is_some_and(|j| {
                j.status == ApprovalStatus::Allowed
                    && j.args_hash == args_hash(&c.arguments)
                    && row.is_some_and(|r| {
                        r.status == ApprovalStatus::Allowed && r.args_hash == j.args_hash
                    })
            });
            if !ok {
                return Err(violation(
                    Kind::Approval,
                    format!(
                        "{next:?} runs {call} but its approval is {journaled:?} in the journal and {row:?} in the table"
                    ),
                ));
            }
        }
        Ok(())
    }

    // --- the driver -------------------------------------------------------------------------

    /// Carries out `next`. `Ok(true)` when the session is done.
    fn apply(&mut self, next: Next) -> Result<bool, Halt> {
        match &next {
            Next::Stop => return Ok(true),
            Next::Idle => {
                if matches!(
                    self.state.status,
                    SessionStatus::Running | SessionStatus::RequiresAction
                ) {
                    self.commit(vec![status_item(SessionStatus::Idle)], &next)?;
                }
                if self.inputs.is_empty() {
                    return Ok(true);
                }
                // The user comes back later with more input.
                self.inputs.remove(0);
                self.queue_input()?;
            }
            Next::StartTurn { turn } => {
                let mut items = Vec::new();
                if self.state.status != SessionStatus::Running {
                    items.push(status_item(SessionStatus::Running));
                }
                items.push((Correlation::turn(*turn), EventBody::TurnStarted {}));
                self.commit(items, &next)?;
            }
            Next::Resume => self.commit(vec![status_item(SessionStatus::Running)], &next)?,
            // The simulated host configures no hooks (`tests/plan.rs` hooks cases plan by hand).
            Next::RunHooks { .. } => unreachable!("no hooks are configured: {next:?}"),
            Next::EnterPhase { turn, phase } => {
                self.commit(
                    vec![(
                        Correlation::turn(*turn),
                        EventBody::TurnPhaseChanged { phase: *phase },
                    )],
                    &next,
                )?;
                if *phase == TurnStatus::Sampling {
                    self.local.skip_compaction = false;
                }
            }
            Next::SampleStep { turn } => {
                let step = self.fresh_step();
                let plan = self.plan_step();
                self.plans.insert(step, plan);
                self.sample(*turn, step, 1, &next)?;
            }
            Next::ResampleStep {
                turn,
                step,
                attempt,
            } => self.sample(*turn, *step, *attempt, &next)?,
            Next::Compact { turn, aggressive } => self.compact(*turn, *aggressive, &next)?,
            Next::Reject { turn, step, calls } => {
                let mut items = Vec::new();
                for (call, status, output) in calls {
                    if self.call_status(call) == Some(ToolCallStatus::Proposed) {
                        items.push((
                            Correlation::tool_call(*turn, *step, call.clone()),
                            EventBody::ToolCallValidating {},
                        ));
                    }
                    items.push(finished_item(
                        *turn,
                        *step,
                        call,
                        *status,
                        output.clone(),
                        true,
                    ));
                }
                self.commit(items, &next)?;
            }
            Next::RequestApprovals { turn, step, calls } => {
                let mut items = Vec::new();
                let mut asked = Vec::new();
                let expires_at = ts(self.clock + APPROVAL_TTL_MS);
                for call in calls {
                    let Some(c) = self.state.tool_calls.get(call) else {
                        return Err(
                            violation(Kind::Fold, format!("{next:?}: unknown {call}")).into()
                        );
                    };
                    let (status, hash) = (c.status, args_hash(&c.arguments));
                    let corr = Correlation::tool_call(*turn, *step, call.clone());
                    if status == ToolCallStatus::Proposed {
                        items.push((corr.clone(), EventBody::ToolCallValidating {}));
                    }
                    let a = self.fresh_approval();
                    items.push((
                        corr.clone().with_approval(a),
                        EventBody::ApprovalRequested {
                            args_hash: hash.clone(),
                            expires_at,
                        },
                    ));
                    items.push((
                        corr.with_approval(a),
                        EventBody::ToolCallAwaitingApproval {},
                    ));
                    asked.push((
                        a,
                        ApprovalFacts {
                            status: ApprovalStatus::Pending,
                            decision: None,
                            args_hash: hash,
                            expires_at,
                        },
                    ));
                }
                // The rows commit with the events.
                let ids: Vec<ApprovalId> = asked.iter().map(|(a, _)| *a).collect();
                self.table.extend(asked);
                self.commit(items, &next)?;
                // Someone watching may decide at once, before anyone waits.
                for a in ids {
                    if self.pick(4) == 3 {
                        self.human_decides(a);
                    }
                }
            }
            Next::ApplyApproval {
                turn,
                step,
                call,
                approval,
                outcome,
            } => {
                let acorr = Correlation::default().with_approval(*approval);
                let reject = |text: &str| {
                    finished_item(
                        *turn,
                        *step,
                        call,
                        ToolCallStatus::Rejected,
                        text.to_owned(),
                        true,
                    )
                };
                let items = match outcome {
                    ApprovalOutcome::Allowed(decision) => vec![(
                        acorr,
                        EventBody::ApprovalDecided {
                            decision: decision.clone(),
                            hook: None,
                        },
                    )],
                    ApprovalOutcome::Denied { reason } => vec![
                        (
                            acorr,
                            EventBody::ApprovalDecided {
                                decision: ApprovalDecision::Deny {
                                    reason: reason.clone(),
                                },
                                hook: None,
                            },
                        ),
                        reject("The user denied this call."),
                    ],
                    ApprovalOutcome::PolicyDenied { reason } => {
                        if let Some(row) = self.table.get_mut(approval)
                            && row.status == ApprovalStatus::Pending
                        {
                            row.status = ApprovalStatus::Denied;
                        }
                        vec![
                            (
                                acorr,
                                EventBody::ApprovalDecided {
                                    decision: ApprovalDecision::Deny {
                                        reason: reason.clone(),
                                    },
                                    hook: None,
                                },
                            ),
                            reject("The session's policy now denies this call."),
                        ]
                    }
                    ApprovalOutcome::HashMismatch => vec![
                        (
                            acorr,
                            EventBody::ApprovalDecided {
                                decision: ApprovalDecision::Deny {
                                    reason: "decided for other arguments".into(),
                                },
                                hook: None,
                            },
                        ),
                        reject("The approval was for other arguments."),
                    ],
                    ApprovalOutcome::Expired => {
                        if let Some(row) = self.table.get_mut(approval)
                            && row.status == ApprovalStatus::Pending
                        {
                            row.status = ApprovalStatus::Expired;
                        }
                        vec![
                            (acorr, EventBody::ApprovalExpired {}),
                            reject("The approval expired."),
                        ]
                    }
                };
                self.commit(items, &next)?;
            }
            Next::Execute { turn, step, calls } => {
                // Each call is its own task: its start is staged (and may be lost) alone.
                for call in calls {
                    let mut items = Vec::new();
                    let corr = Correlation::tool_call(*turn, *step, call.clone());
                    if self.call_status(call) == Some(ToolCallStatus::Proposed) {
                        items.push((corr.clone(), EventBody::ToolCallValidating {}));
                    }
                    items.push((corr, EventBody::ToolCallStarted {}));
                    self.commit(items, &next)?;
                    self.local.running.insert(call.clone());
                }
            }
            Next::Dispatch {
                turn,
                step,
                call,
                effect,
                attempt,
            } => self.dispatch(*turn, *step, call, *effect, *attempt, &next)?,
            Next::Rerun {
                turn,
                step,
                call,
                sequential,
            } => {
                self.commit(
                    vec![(
                        Correlation::tool_call(*turn, *step, call.clone()),
                        EventBody::ToolCallStarted {},
                    )],
                    &next,
                )?;
                self.local.running.insert(call.clone());
                if *sequential {
                    self.tool_run()?;
                    self.finish_running(call)?;
                }
            }
            Next::MarkOutcomeUnknown { key } => self.commit(
                vec![(effect_corr(key), EventBody::EffectOutcomeUnknown {})],
                &next,
            )?,
            Next::Reconcile {
                turn,
                step,
                call,
                key,
            } => {
                let items = match self.pick(3) {
                    0 => vec![
                        (
                            effect_corr(key),
                            EventBody::EffectCommitted {
                                outcome: json!({"reconciled": true}),
                            },
                        ),
                        finished_item(
                            *turn,
                            *step,
                            call,
                            ToolCallStatus::Succeeded,
                            "done (reconciled)".into(),
                            false,
                        ),
                    ],
                    1 => vec![
                        (
                            effect_corr(key),
                            EventBody::EffectFailed {
                                error: "not done (reconciled)".into(),
                            },
                        ),
                        finished_item(
                            *turn,
                            *step,
                            call,
                            ToolCallStatus::Failed,
                            "Error: it did not happen".into(),
                            true,
                        ),
                    ],
                    _ => {
                        self.local.unreconciled.insert(key.clone());
                        Vec::new()
                    }
                };
                self.commit(items, &next)?;
            }
            Next::Settle {
                turn,
                step,
                call,
                key,
                how,
            } => {
                let finished = |status, text: &str| {
                    finished_item(
                        *turn,
                        *step,
                        call,
                        status,
                        text.to_owned(),
                        status != ToolCallStatus::Succeeded,
                    )
                };
                let items = match how {
                    Settle::NeverDispatched => vec![
                        (
                            effect_corr(key),
                            EventBody::EffectFailed {
                                error: "never dispatched".into(),
                            },
                        ),
                        finished(ToolCallStatus::Interrupted, "interrupted before it started"),
                    ],
                    Settle::Recorded { committed: true } => {
                        vec![finished(
                            ToolCallStatus::Succeeded,
                            "recorded before a crash",
                        )]
                    }
                    Settle::Recorded { committed: false } => {
                        vec![finished(ToolCallStatus::Failed, "recorded before a crash")]
                    }
                    Settle::Decided(EffectDecision::Committed { outcome }) => vec![
                        (
                            effect_corr(key),
                            EventBody::EffectCommitted {
                                outcome: outcome.clone(),
                            },
                        ),
                        finished(ToolCallStatus::Succeeded, "confirmed done by a human"),
                    ],
                    Settle::Decided(EffectDecision::Failed { error }) => vec![
                        (
                            effect_corr(key),
                            EventBody::EffectFailed {
                                error: error.clone(),
                            },
                        ),
                        finished(ToolCallStatus::Failed, "Error: it did not happen"),
                    ],
                    Settle::Decided(EffectDecision::Retry) => {
                        return Err(violation(
                            Kind::Dispatch,
                            format!("{next:?}: a retry is a dispatch, not a settlement"),
                        )
                        .into());
                    }
                };
                self.commit(items, &next)?;
            }
            Next::AwaitRunning { calls } => {
                let i = usize::from(self.pick(3)) % calls.len().max(1);
                if let Some(call) = calls.get(i) {
                    self.finish_running(call)?;
                }
            }
            Next::WaitForHuman {
                approvals, effects, ..
            } => {
                if self.state.status != SessionStatus::RequiresAction {
                    self.commit(vec![status_item(SessionStatus::RequiresAction)], &next)?;
                }
                // The worker's run ends here; humans act; a new worker picks the session up.
                self.waits += 1;
                self.humans_act(approvals, effects)?;
                self.new_worker()?;
            }
            Next::FinishTurn {
                turn,
                reason,
                limit,
                error,
            } => self.finish_turn(*turn, *reason, *limit, error.clone(), &next)?,
        }
        Ok(false)
    }

    fn call_status(&self, call: &ToolCallId) -> Option<ToolCallStatus> {
        self.state.tool_calls.get(call).map(|c| c.status)
    }

    /// The calls the model proposes in a new step.
    fn plan_step(&mut self) -> Vec<Planned> {
        let stubborn =
            self.cfg.stubborn && (self.cfg.max_steps.is_some() || self.cfg.loop_threshold > 0);
        if self.exhausted() || self.steps_with_calls >= STEPS_WITH_CALLS {
            if !stubborn {
                return Vec::new();
            }
            let n = self.fresh();
            let id = ToolCallId::from(format!("call_{n}"));
            self.facts_of.insert(
                id.clone(),
                CallFacts::Valid {
                    effect: EffectClass::ReadOnly,
                    parallel_safe: true,
                    can_reconcile: false,
                    verdict: Verdict::Allow,
                },
            );
            self.stubborn_calls.insert(id.clone());
            return vec![Planned {
                id,
                name: "read_file".into(),
                args: json!({"path": "missing.txt"}),
            }];
        }
        // Mostly some calls: 0 (the exhausted tape's answer) ends the turn.
        let n = match self.pick(8) {
            0 => 0,
            1..=3 => 1,
            4 | 5 => 2,
            _ => 3,
        };
        if n > 0 {
            self.steps_with_calls += 1;
        }
        (0..n).map(|_| self.random_call()).collect()
    }

    fn random_call(&mut self) -> Planned {
        let n = self.fresh();
        let id = ToolCallId::from(format!("call_{n}"));
        let effect = match self.pick(3) {
            0 => EffectClass::ReadOnly,
            1 => EffectClass::IdempotentWrite,
            _ => EffectClass::SideEffecting,
        };
        let facts = if self.pick(8) == 7 {
            CallFacts::Invalid {
                status: if self.pick(2) == 0 {
                    ToolCallStatus::Failed
                } else {
                    ToolCallStatus::Rejected
                },
                output: format!("Error: call_{n} does not match the tool's schema"),
            }
        } else {
            let parallel_safe = effect == EffectClass::ReadOnly && self.pick(4) != 3;
            let can_reconcile = effect != EffectClass::ReadOnly && self.pick(2) == 1;
            let verdict = match self.pick(6) {
                3 | 4 => Verdict::Ask,
                5 => Verdict::Deny {
                    reason: "the policy forbids it".into(),
                },
                _ => Verdict::Allow,
            };
            CallFacts::Valid {
                effect,
                parallel_safe,
                can_reconcile,
                verdict,
            }
        };
        self.facts_of.insert(id.clone(), facts);
        let name = match effect {
            EffectClass::ReadOnly => "read_file",
            EffectClass::IdempotentWrite => "write_file",
            EffectClass::SideEffecting => "shell",
        };
        Planned {
            id,
            name: name.into(),
            args: json!({ "n": n as u64 }),
        }
    }

    /// One model attempt of `step`.
    fn sample(
        &mut self,
        turn: TurnId,
        step: StepId,
        attempt: u32,
        next: &Next,
    ) -> Result<(), Halt> {
        let corr = Correlation::step(turn, step, attempt);
        self.commit(
            vec![(
                corr.clone(),
                EventBody::StepStarted {
                    model: MODEL.into(),
                },
            )],
            next,
        )?;
        let attempt_failed = |kind: &str| {
            vec![(
                corr.clone(),
                EventBody::StepAttemptFailed {
                    model: MODEL.into(),
                    error_kind: kind.into(),
                    message: format!("{kind} from the provider"),
                    retry_in_ms: None,
                    responses_consumed: 1,
                    cost_usd: 0.0,
                    usage: Default::default(),
                    usage_estimated: false,
                },
            )]
        };
        match self.pick(24) {
            21 => self.commit(
                vec![(
                    corr.clone(),
                    EventBody::StepFailed {
                        error_kind: "authentication".into(),
                        message: "bad key".into(),
                        responses_consumed: 1,
                        cost_usd: 0.0,
                        usage: Default::default(),
                        usage_estimated: false,
                    },
                )],
                next,
            ),
            22 => self.commit(attempt_failed("context_overflow"), next),
            23 => self.commit(attempt_failed("overloaded"), next),
            _ => {
                self.commit(vec![(corr.clone(), EventBody::StepStreaming {})], next)?;
                let plan = self.plans.get(&step).cloned().unwrap_or_default();
                let proposals: Vec<(Correlation, EventBody)> = plan
                    .iter()
                    .filter(|c| !self.state.tool_calls.contains_key(&c.id))
                    .map(|c| {
                        (
                            Correlation::tool_call(turn, step, c.id.clone()).with_attempt(attempt),
                            EventBody::ToolCallProposed {
                                name: c.name.clone(),
                                arguments: c.args.clone(),
                                sealed: false,
                            },
                        )
                    })
                    .collect();
                let mut items = Vec::new();
                if !proposals.is_empty() && self.pick(2) == 1 {
                    // Proposed while the response still streams.
                    self.commit(proposals, next)?;
                } else {
                    items = proposals;
                }
                items.push((
                    corr,
                    EventBody::StepCompleted {
                        model: MODEL.into(),
                        stop_reason: if plan.is_empty() {
                            "end_turn".into()
                        } else {
                            "tool_use".into()
                        },
                        usage: Usage {
                            input_tokens: 100,
                            output_tokens: 10,
                            ..Usage::default()
                        },
                        cost_usd: 0.001,
                        text: String::new(),
                        reasoning: Vec::new(),
                        reasoning_sealed: 0,
                        responses_consumed: 1,
                        abandoned_calls: Vec::new(),
                        usage_estimated: false,
                    },
                ));
                if !plan.is_empty() && self.pick(2) == 1 {
                    items.push((
                        Correlation::turn(turn),
                        EventBody::TurnPhaseChanged {
                            phase: TurnStatus::ExecutingTools,
                        },
                    ));
                }
                self.commit(items, next)
            }
        }
    }

    fn compact(&mut self, turn: TurnId, aggressive: bool, next: &Next) -> Result<(), Halt> {
        let status = self.state.turns.get(&turn).map(|t| t.status);
        if status != Some(TurnStatus::Compacting) {
            self.commit(
                vec![(
                    Correlation::turn(turn),
                    EventBody::TurnPhaseChanged {
                        phase: TurnStatus::Compacting,
                    },
                )],
                next,
            )?;
        }
        let to_sampling = (
            Correlation::turn(turn),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        );
        if self.pick(4) != 3 {
            let first_kept_item = self.journal.len() as u64;
            return self.commit(
                vec![
                    (
                        Correlation::turn(turn),
                        EventBody::ContextCompacted {
                            summary: "summary".into(),
                            first_kept_item,
                            tokens_before: 2_000,
                            tokens_after: 100,
                            requested: false,
                            focus: None,
                        },
                    ),
                    to_sampling,
                ],
                next,
            );
        }
        *self.local.compaction_failures.entry(turn).or_default() += 1;
        if !aggressive {
            self.local.skip_compaction = true;
        }
        // A driver that counted too many failures leaves the turn compacting for the planner
        // to end; otherwise it samples on.
        if self.pick(2) == 0 {
            self.commit(vec![to_sampling], next)?;
        }
        Ok(())
    }

    fn dispatch(
        &mut self,
        turn: TurnId,
        step: StepId,
        call: &ToolCallId,
        effect: EffectClass,
        attempt: u32,
        next: &Next,
    ) -> Result<(), Halt> {
        let Some(c) = self.state.tool_calls.get(call) else {
            return Err(violation(Kind::Fold, format!("{next:?}: unknown call")).into());
        };
        let corr = Correlation::tool_call(turn, step, call.clone());
        let mut items = Vec::new();
        if c.status == ToolCallStatus::Proposed {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
        }
        if effect == EffectClass::ReadOnly {
            items.push((corr, EventBody::ToolCallStarted {}));
            self.commit(items, next)?;
            self.local.running.insert(call.clone());
            self.tool_run()?;
            return self.finish_running(call);
        }
        let key = OperationKey::for_call(self.session, step, call);
        if attempt == 1 {
            let request_hash = content_hash(&json!({"tool": c.name, "arguments": c.arguments}));
            items.push((
                corr.clone().with_operation(key.clone()).with_attempt(1),
                EventBody::EffectPrepared {
                    request_hash,
                    probe: None,
                },
            ));
        }
        items.push((
            effect_corr(&key).with_attempt(attempt),
            EventBody::EffectDispatched {},
        ));
        items.push((corr, EventBody::ToolCallStarted {}));
        // Once the intent is durable the side effect may happen (even if the worker dies
        // right after the commit).
        let durable = self.commit(items, next);
        if !matches!(durable, Err(Halt::Violation(_))) && effect == EffectClass::SideEffecting {
            if self.side_effects.get(&key) == Some(&false) {
                return Err(violation(
                    Kind::Dispatch,
                    format!(
                        "{next:?}: operation {key} is dispatched again (attempt {attempt}) without a retry decision since its last dispatch"
                    ),
                )
                .into());
            }
            self.side_effects.insert(key.clone(), false);
        }
        durable?;
        self.tool_run()?;
        let items = if self.pick(4) == 3 {
            vec![
                (
                    effect_corr(&key),
                    EventBody::EffectFailed {
                        error: "exit status 1".into(),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    call,
                    ToolCallStatus::Failed,
                    "Error: exit status 1".into(),
                    true,
                ),
            ]
        } else {
            vec![
                (
                    effect_corr(&key),
                    EventBody::EffectCommitted {
                        outcome: json!({"exit_code": 0}),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    call,
                    ToolCallStatus::Succeeded,
                    "done".into(),
                    false,
                ),
            ]
        };
        self.commit(items, next)
    }

    /// A tool run the driver waits for is under way: the worker may die now.
    fn tool_run(&mut self) -> Result<(), Halt> {
        self.tool_runs += 1;
        if self.cfg.crash_during.contains(&self.tool_runs) {
            return Err(Halt::Crash);
        }
        Ok(())
    }

    /// A read-only call running here finishes: its result is journaled.
    fn finish_running(&mut self, call: &ToolCallId) -> Result<(), Halt> {
        self.local.running.remove(call);
        let Some(c) = self.state.tool_calls.get(call) else {
            return Err(violation(Kind::Fold, format!("running call {call} is unknown")).into());
        };
        let (turn, step) = (c.turn_id, c.step_id);
        let (status, output) = if self.stubborn_calls.contains(call) {
            (
                ToolCallStatus::Failed,
                "Error: missing.txt: no such file".to_owned(),
            )
        } else if self.pick(4) == 3 {
            (ToolCallStatus::Failed, format!("Error: {call} failed"))
        } else {
            (ToolCallStatus::Succeeded, format!("output of {call}"))
        };
        let is_error = status != ToolCallStatus::Succeeded;
        let why = Next::AwaitRunning {
            calls: vec![call.clone()],
        };
        self.commit(
            vec![finished_item(turn, step, call, status, output, is_error)],
            &why,
        )
    }

    /// Humans act on what the session waits for: decide each approval in the table, decide
    /// each `outcome_unknown` effect — or cancel the turn.
    fn humans_act(
        &mut self,
        approvals: &[ApprovalId],
        effects: &[OperationKey],
    ) -> Result<(), Violation> {
        if self.pick(10) == 9 {
            if let Some(turn) = self.state.active_turn {
                self.outside_append(vec![(
                    Correlation::turn(turn),
                    EventBody::TurnCancelRequested {
                        reason: "cancelled while waiting".into(),
                    },
                )])?;
            }
            return Ok(());
        }
        let mut expire_at = None;
        for a in approvals {
            if self.human_decides(*a) {
                let at = self.table.get(a).map(|r| r.expires_at.timestamp_millis());
                expire_at = expire_at.max(at);
            }
        }
        if let Some(at) = expire_at {
            // Nobody decided in time.
            self.clock = self.clock.max(at + TICK_MS);
        }
        for key in effects {
            let decision = match self.pick(3) {
                0 => EffectDecision::Committed {
                    outcome: json!("done, checked by hand"),
                },
                1 => EffectDecision::Failed {
                    error: "it did not happen".into(),
                },
                _ => {
                    self.side_effects.insert(key.clone(), true);
                    EffectDecision::Retry
                }
            };
            self.outside_append(vec![(
                effect_corr(key),
                EventBody::EffectDecided {
                    decision,
                    reconciled: false,
                },
            )])?;
        }
        Ok(())
    }

    /// A human decides approval `a` in the table. True when they let it expire instead.
    fn human_decides(&mut self, a: ApprovalId) -> bool {
        let choice = self.pick(6);
        let Some(row) = self.table.get_mut(&a) else {
            return false;
        };
        if row.status != ApprovalStatus::Pending {
            return false;
        }
        match choice {
            0 => {
                row.status = ApprovalStatus::Allowed;
                row.decision = Some(ApprovalDecision::AllowOnce);
            }
            1 => {
                row.status = ApprovalStatus::Allowed;
                row.decision = Some(ApprovalDecision::AllowForSession);
            }
            2 => {
                row.status = ApprovalStatus::Denied;
                row.decision = Some(ApprovalDecision::Deny {
                    reason: "not now".into(),
                });
            }
            3 => {
                // A decision made for other arguments than the call's.
                row.status = ApprovalStatus::Allowed;
                row.decision = Some(ApprovalDecision::AllowOnce);
                row.args_hash = args_hash(&json!({"something": "else"}));
            }
            4 => return true,
            _ => row.status = ApprovalStatus::Expired,
        }
        false
    }

    fn finish_turn(
        &mut self,
        turn: TurnId,
        reason: TerminalReason,
        limit: Option<BudgetLimit>,
        error: Option<String>,
        next: &Next,
    ) -> Result<(), Halt> {
        let s = &self.state;
        let Some(t) = s.turns.get(&turn) else {
            return Err(violation(Kind::Fold, format!("{next:?}: unknown turn")).into());
        };
        let call_status = if reason == TerminalReason::Aborted {
            ToolCallStatus::Cancelled
        } else {
            ToolCallStatus::Interrupted
        };
        let mut items = Vec::new();
        if s.status == SessionStatus::RequiresAction && s.active_turn == Some(turn) {
            items.push(status_item(SessionStatus::Running));
        }
        for step in t.steps.iter().filter_map(|st| s.steps.get(st)) {
            for c in step
                .tool_calls
                .iter()
                .filter_map(|c| s.tool_calls.get(c))
                .filter(|c| !c.status.is_terminal())
            {
                if let Some(key) = &c.operation_key
                    && s.effects
                        .get(key)
                        .is_some_and(|e| e.status == EffectStatus::Dispatched)
                {
                    items.push((effect_corr(key), EventBody::EffectOutcomeUnknown {}));
                }
                items.push(finished_item(
                    turn,
                    step.id,
                    &c.id,
                    call_status,
                    format!("the turn ended ({})", reason.as_str()),
                    true,
                ));
            }
            if !step.status.is_terminal() {
                items.push((
                    Correlation::step(turn, step.id, step.attempt),
                    EventBody::StepFailed {
                        error_kind: "cancelled".into(),
                        message: "the turn ended".into(),
                        responses_consumed: 0,
                        cost_usd: 0.0,
                        usage: Default::default(),
                        usage_estimated: false,
                    },
                ));
            }
        }
        let duration_ms = t.started_at.map_or(0, |st| {
            u64::try_from((self.now() - st).num_milliseconds()).unwrap_or(0)
        });
        items.push((
            Correlation::turn(turn),
            EventBody::TurnFinished {
                terminal_reason: reason,
                limit,
                usage: t.usage,
                cost_usd: t.cost_usd,
                usage_by_model: t.usage_by_model.clone(),
                num_steps: u32::try_from(t.steps.len()).unwrap_or(u32::MAX),
                duration_ms,
                error,
            },
        ));
        let cancelled: Vec<ToolCallId> = self
            .local
            .running
            .iter()
            .filter(|c| s.tool_calls.get(*c).is_some_and(|c| c.turn_id == turn))
            .cloned()
            .collect();
        for c in cancelled {
            self.local.running.remove(&c);
        }
        self.local.compaction_failures.remove(&turn);
        let committed = self.commit(items, next);
        if !matches!(committed, Err(Halt::Violation(_))) {
            let s = &self.state;
            let open: Vec<&ToolCallId> = s
                .tool_calls
                .values()
                .filter(|c| c.turn_id == turn && !c.status.is_terminal())
                .map(|c| &c.id)
                .collect();
            let finished = s.turns.get(&turn).is_some_and(|t| t.status.is_terminal());
            if !open.is_empty() || !finished {
                return Err(violation(
                    Kind::Finish,
                    format!("after {next:?} the turn is finished: {finished}, open calls {open:?}"),
                )
                .into());
            }
        }
        committed
    }
}

/// Runs one simulated session to its end.
fn simulate(cfg: Config, tape: Vec<u8>) -> World {
    let mut w = World::new(cfg, tape);
    w.run();
    w
}

/// The run may have stopped on another property's violation; never on this one's or on a
/// refused event.
fn clean(w: &World, kind: Kind) -> Result<(), TestCaseError> {
    if let Some(Err(v)) = &w.end {
        prop_assert!(
            v.kind != kind && v.kind != Kind::Fold,
            "{v}\n(after {} planner calls, {} crashes, {} waits)",
            w.planner_calls,
            w.crashes,
            w.waits
        );
    }
    Ok(())
}

/// Property 5: every answer of the live run is the answer a fresh fold of the journal prefix
/// gives for the same facts (and for the facts a crash leaves), and a worker recovered at the
/// fork plans exactly what the live worker planned from there on.
fn check_replay(w: &World) -> Result<(), TestCaseError> {
    let mut replayed = SessionState::default();
    for (i, cp) in w.checkpoints.iter().enumerate() {
        while replayed.version < cp.version {
            let ev = &w.journal[usize::try_from(replayed.version).unwrap_or(usize::MAX)];
            replayed
                .apply(ev)
                .map_err(|e| TestCaseError::fail(format!("the journal does not replay: {e}")))?;
        }
        let again = plan::next(&replayed, &cp.facts);
        prop_assert_eq!(
            &again,
            &cp.next,
            "planner call {} (journal version {}): the replayed state plans differently",
            i,
            cp.version
        );
        if let Some((facts, live)) = &cp.after_crash {
            let again = plan::next(&replayed, facts);
            prop_assert_eq!(
                &again,
                live,
                "planner call {} (journal version {}): after a crash the replayed state plans differently",
                i,
                cp.version
            );
        }
    }
    if let Some(fork) = &w.fork {
        let mut recovered = (**fork).clone();
        recovered.state = SessionState::replay(&recovered.journal)
            .map_err(|e| TestCaseError::fail(format!("the journal does not replay: {e}")))?;
        recovered.local = Local::default();
        let from = recovered.trace.len();
        recovered.run();
        let n = recovered.trace.len().min(w.trace.len());
        let diverged = (from..n).find(|i| recovered.trace[*i] != w.trace[*i]);
        prop_assert!(
            diverged.is_none() && recovered.trace.len() == w.trace.len(),
            "a worker recovered at planner call {} diverges from the live run at call {:?}: live {:?}, recovered {:?}",
            from,
            diverged,
            diverged.map(|i| &w.trace[i]),
            diverged.map(|i| &recovered.trace[i])
        );
        prop_assert!(
            recovered.journal == w.journal,
            "the recovered run journals differently"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// A `Dispatch` of a call whose effect exists happens only after `outcome_unknown` with a
    /// `retry` decision or for an idempotent write with no decision, with the next attempt
    /// number; the world never sees a side-effecting operation key dispatched twice without a
    /// retry decision in between; nothing side-effecting runs without its intent journaled.
    #[test]
    fn the_planner_never_dispatches_an_operation_key_twice((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        clean(&w, Kind::Dispatch)?;
        // The journal agrees with the world: each dispatch of an effect is a new attempt.
        let mut attempts: BTreeMap<&OperationKey, u32> = BTreeMap::new();
        for ev in &w.journal {
            if let EventBody::EffectDispatched {} = ev.body
                && let Some(key) = &ev.correlation.operation_key
            {
                let n = attempts.entry(key).or_default();
                *n += 1;
                prop_assert_eq!(ev.correlation.attempt, Some(*n), "dispatch of {}", key);
            }
        }
    }

    /// Whenever `Execute`, `Dispatch` or `Rerun` names a call that needed an approval, the
    /// journal's approval is `allowed` and the table's decision was for the same argument hash
    /// (the call's); a decision for another hash is refused (`HashMismatch`), never run.
    #[test]
    fn no_call_runs_without_an_allowed_approval_for_its_exact_arguments((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        clean(&w, Kind::Approval)?;
        // No journaled allowance ever disagrees with the table.
        for a in w.state.approvals.values() {
            if a.status == ApprovalStatus::Allowed {
                let row = &w.table[&a.id];
                prop_assert_eq!(&row.args_hash, &a.args_hash);
                prop_assert_eq!(row.status, ApprovalStatus::Allowed);
            }
        }
    }

    /// Every `FinishTurn` is accepted by the fold and leaves no call of the turn open;
    /// `FinishTurn { Completed }` only after a step that proposed no calls.
    #[test]
    fn a_turn_finishes_only_when_every_call_can_get_its_result((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        clean(&w, Kind::Finish)?;
        for t in w.state.turns.values().filter(|t| t.status.is_terminal()) {
            prop_assert!(w.state.tool_calls.values().all(|c| c.turn_id != t.id || c.status.is_terminal()));
            prop_assert!(t.steps.iter().all(|s| w.state.steps[s].status.is_terminal()));
            if t.terminal_reason == Some(TerminalReason::Completed) {
                let last = t.steps.last().map(|s| &w.state.steps[s]);
                prop_assert!(last.is_some_and(|s| s.tool_calls.is_empty()), "completed after {:?}", last);
            }
        }
    }

    /// Within the bound every session reaches `Idle` (through terminal reasons and waits on
    /// humans, who then act), with nothing active or queued; no answer waits for nothing.
    #[test]
    fn every_session_reaches_a_terminal_reason_or_a_wait((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        clean(&w, Kind::Progress)?;
        if matches!(w.end, Some(Ok(()))) {
            prop_assert!(matches!(w.trace.last(), Some(Next::Idle | Next::Stop)));
            prop_assert!(w.state.active_turn.is_none() && w.state.queue.is_empty());
            prop_assert!(w.state.turns.values().all(|t| t.status.is_terminal()));
        }
    }

    /// A turn whose budget is exhausted ends `budget_exhausted`, never `loop_detected`: the
    /// calls a spent tool-call budget refuses all carry the same refusal, which is no loop.
    #[test]
    fn an_exhausted_budget_is_reported_before_a_loop((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        clean(&w, Kind::Budget)?;
    }

    /// The same state gives the same answer live and after replay (at every planner call,
    /// with the live facts and with the facts a crash leaves), and a worker that takes over
    /// where nothing runs in-process plans what the live worker planned from there on.
    #[test]
    fn a_replay_after_a_crash_plans_what_the_live_run_planned((cfg, tape) in scenario()) {
        let w = simulate(cfg, tape);
        if let Some(Err(v)) = &w.end {
            prop_assert!(v.kind != Kind::Fold, "{}", v);
        }
        check_replay(&w)?;
    }
}

/// The simulation is only useful if it reaches the planner's every rule; make sure it does.
#[test]
fn the_simulation_reaches_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = scenario();
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut most_calls = 0;
    for _ in 0..400 {
        let (cfg, tape) = strat.new_tree(&mut runner).unwrap().current();
        let w = simulate(cfg, tape);
        if let Some(Err(v)) = &w.end {
            panic!("{v}");
        }
        most_calls = most_calls.max(w.planner_calls);
        *seen.entry("crash".into()).or_default() += u32::from(w.crashes > 0);
        *seen.entry("wait".into()).or_default() += u32::from(w.waits > 0);
        *seen.entry("fork".into()).or_default() += u32::from(w.fork.is_some());
        for n in &w.trace {
            let name = match n {
                Next::Dispatch {
                    attempt, effect, ..
                } => {
                    format!("dispatch {effect:?} attempt {}", (*attempt).min(2))
                }
                Next::Compact { aggressive, .. } => format!("compact aggressive={aggressive}"),
                Next::ApplyApproval { outcome, .. } => format!(
                    "apply {}",
                    match outcome {
                        ApprovalOutcome::Allowed(_) => "allowed",
                        ApprovalOutcome::Denied { .. } => "denied",
                        ApprovalOutcome::HashMismatch => "hash_mismatch",
                        ApprovalOutcome::Expired => "expired",
                        ApprovalOutcome::PolicyDenied { .. } => "policy_denied",
                    }
                ),
                Next::Settle { how, .. } => format!("settle {how:?}")
                    .split(['(', ' ', '{'])
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" "),
                Next::FinishTurn { reason, .. } => format!("finish {}", reason.as_str()),
                Next::Rerun { sequential, .. } => format!("rerun sequential={sequential}"),
                Next::EnterPhase { phase, .. } => format!("enter {}", phase.as_str()),
                other => format!("{other:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            };
            *seen.entry(name).or_default() += 1;
        }
    }
    for needed in [
        "crash",
        "wait",
        "fork",
        "StartTurn",
        "Resume",
        "enter sampling",
        "enter executing_tools",
        "SampleStep",
        "ResampleStep",
        "compact aggressive=true",
        "compact aggressive=false",
        "Reject",
        "RequestApprovals",
        "apply allowed",
        "apply denied",
        "apply hash_mismatch",
        "apply expired",
        "Execute",
        "dispatch ReadOnly attempt 1",
        "dispatch IdempotentWrite attempt 1",
        "dispatch IdempotentWrite attempt 2",
        "dispatch SideEffecting attempt 1",
        "dispatch SideEffecting attempt 2",
        "rerun sequential=false",
        "rerun sequential=true",
        "MarkOutcomeUnknown",
        "Reconcile",
        "settle Decided",
        "AwaitRunning",
        "WaitForHuman",
        "finish completed",
        "finish aborted",
        "finish failed",
        "finish budget_exhausted",
        "finish loop_detected",
        "finish prompt_too_long",
        "Idle",
    ] {
        assert!(
            seen.get(needed).copied().unwrap_or(0) > 0,
            "never reached {needed}: {seen:?}"
        );
    }
    assert!(
        most_calls < PLANNER_CALL_BOUND / 2,
        "a run took {most_calls} planner calls: the bound is too tight to mean anything"
    );
}

// --- rules, one by one --------------------------------------------------------------------------

/// A journal built by hand, folded as it grows.
struct Hand {
    session: SessionId,
    state: SessionState,
    journal: Vec<Event>,
}

impl Hand {
    /// `session.created`, a queued turn.
    fn new(turn: TurnId) -> Self {
        let mut h = Hand {
            session: SessionId(Uuid::from_u128(0xabc)),
            state: SessionState::default(),
            journal: Vec::new(),
        };
        h.push(
            Correlation::default(),
            EventBody::SessionCreated {
                tenant_id: TenantId(Uuid::from_u128(1)),
                release_id: ReleaseId::from("sha256:r"),
                config: json!({}),
            },
        );
        h.push(
            Correlation::turn(turn),
            EventBody::TurnQueued {
                input: "go".into(),
                compiled: None,
            },
        );
        h
    }

    fn push(&mut self, corr: Correlation, body: EventBody) -> &mut Self {
        let ev = Event::new(
            self.session,
            self.state.version + 1,
            ts(BASE_MS + self.journal.len() as i64),
            corr,
            body,
        );
        self.state.apply(&ev).unwrap();
        self.journal.push(ev);
        self
    }

    fn status(&mut self, status: SessionStatus) -> &mut Self {
        let (corr, body) = status_item(status);
        self.push(corr, body)
    }

    /// The turn running, sampling step `step` (attempt 1, streaming).
    fn streaming(turn: TurnId, step: StepId) -> Self {
        let mut h = Hand::new(turn);
        h.status(SessionStatus::Running)
            .push(Correlation::turn(turn), EventBody::TurnStarted {})
            .push(
                Correlation::turn(turn),
                EventBody::TurnPhaseChanged {
                    phase: TurnStatus::Sampling,
                },
            )
            .push(
                Correlation::step(turn, step, 1),
                EventBody::StepStarted {
                    model: MODEL.into(),
                },
            )
            .push(
                Correlation::step(turn, step, 1),
                EventBody::StepStreaming {},
            );
        h
    }

    /// Step `step` completed with one call `call`, the turn executing tools.
    fn executing(turn: TurnId, step: StepId, call: &ToolCallId) -> Self {
        let mut h = Hand::streaming(turn, step);
        h.push(
            Correlation::tool_call(turn, step, call.clone()),
            EventBody::ToolCallProposed {
                name: "shell".into(),
                arguments: json!({"command": "make deploy"}),
                sealed: false,
            },
        )
        .push(
            Correlation::step(turn, step, 1),
            EventBody::StepCompleted {
                model: MODEL.into(),
                stop_reason: "tool_use".into(),
                usage: Usage::default(),
                cost_usd: 0.0,
                text: String::new(),
                reasoning: Vec::new(),
                reasoning_sealed: 0,
                responses_consumed: 1,
                abandoned_calls: Vec::new(),
                usage_estimated: false,
            },
        )
        .push(
            Correlation::turn(turn),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::ExecutingTools,
            },
        );
        h
    }

    /// …and the call dispatched (its worker gone or not).
    fn dispatched(turn: TurnId, step: StepId, call: &ToolCallId) -> (Self, OperationKey) {
        let mut h = Hand::executing(turn, step, call);
        let key = OperationKey::for_call(h.session, step, call);
        let corr = Correlation::tool_call(turn, step, call.clone());
        h.push(corr.clone(), EventBody::ToolCallValidating {})
            .push(
                corr.clone().with_operation(key.clone()),
                EventBody::EffectPrepared {
                    request_hash: "sha256:req".into(),
                    probe: None,
                },
            )
            .push(
                effect_corr(&key).with_attempt(1),
                EventBody::EffectDispatched {},
            )
            .push(corr, EventBody::ToolCallStarted {});
        (h, key)
    }
}

fn hand_facts(now: i64) -> Facts {
    Facts {
        now: ts(now),
        limits: Limits {
            context_window_tokens: 100_000,
            compact_at_fraction: 0.8,
            max_compaction_failures: 2,
            ..Limits::default()
        },
        ..Facts::default()
    }
}

fn valid(effect: EffectClass, can_reconcile: bool, verdict: Verdict) -> CallFacts {
    CallFacts::Valid {
        effect,
        parallel_safe: effect == EffectClass::ReadOnly,
        can_reconcile,
        verdict,
    }
}

fn ids() -> (TurnId, StepId, ToolCallId) {
    (
        TurnId(Uuid::from_u128(0x10)),
        StepId(Uuid::from_u128(0x20)),
        ToolCallId::from("call_1"),
    )
}

/// `max_tool_calls = 1` and one step proposing the same read-only call four times: one runs,
/// three are refused by the budget with the same text. The turn ends `budget_exhausted
/// (tool_calls)`, not `loop_detected` (the order was loops first before).
#[test]
fn a_spent_tool_call_budget_is_budget_exhausted_not_a_loop() {
    let (turn, step, _) = ids();
    let mut h = Hand::streaming(turn, step);
    let calls: Vec<ToolCallId> = (1..=4)
        .map(|i| ToolCallId::from(format!("call_{i}")))
        .collect();
    for c in &calls {
        h.push(
            Correlation::tool_call(turn, step, c.clone()),
            EventBody::ToolCallProposed {
                name: "list_dir".into(),
                arguments: json!({"path": "."}),
                sealed: false,
            },
        );
    }
    h.push(
        Correlation::step(turn, step, 1),
        EventBody::StepCompleted {
            model: MODEL.into(),
            stop_reason: "tool_use".into(),
            usage: Usage::default(),
            cost_usd: 0.0,
            text: String::new(),
            reasoning: Vec::new(),
            reasoning_sealed: 0,
            responses_consumed: 1,
            usage_estimated: false,
            abandoned_calls: Vec::new(),
        },
    )
    .push(
        Correlation::turn(turn),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::ExecutingTools,
        },
    );
    let first = Correlation::tool_call(turn, step, calls[0].clone());
    h.push(first.clone(), EventBody::ToolCallValidating {})
        .push(first.clone(), EventBody::ToolCallStarted {})
        .push(
            first,
            EventBody::ToolCallFinished {
                status: ToolCallStatus::Succeeded,
                output: "a.txt".into(),
                is_error: false,
            },
        );
    for c in &calls[1..] {
        let corr = Correlation::tool_call(turn, step, c.clone());
        h.push(corr.clone(), EventBody::ToolCallValidating {}).push(
            corr,
            EventBody::ToolCallFinished {
                status: ToolCallStatus::Rejected,
                output: "`list_dir` was not run: the tool-call budget of this turn is spent."
                    .into(),
                is_error: true,
            },
        );
    }
    h.push(
        Correlation::turn(turn),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    );
    let mut facts = hand_facts(BASE_MS + 100);
    facts.limits.loop_threshold = 3;
    facts.limits.turn_budget.max_tool_calls = Some(1);
    let t = &h.state.turns[&turn];
    assert_eq!(
        plan::loop_detected(&h.state, t, 3),
        Some(3),
        "the refusals look like a loop"
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::FinishTurn {
            turn,
            reason: TerminalReason::BudgetExhausted,
            limit: Some(BudgetLimit::ToolCalls),
            error: None,
        }
    );
}

#[test]
fn a_queued_turn_cancelled_before_it_starts_is_aborted() {
    let (turn, _, _) = ids();
    let mut h = Hand::new(turn);
    h.push(
        Correlation::turn(turn),
        EventBody::TurnCancelRequested {
            reason: "never mind".into(),
        },
    );
    let next = plan::next(&h.state, &hand_facts(BASE_MS));
    assert_eq!(
        next,
        Next::FinishTurn {
            turn,
            reason: TerminalReason::Aborted,
            limit: None,
            error: None,
        }
    );
    // The fold accepts it from `queued`, and then there is nothing left to do.
    h.push(
        Correlation::turn(turn),
        EventBody::TurnFinished {
            terminal_reason: TerminalReason::Aborted,
            limit: None,
            usage: Usage::default(),
            cost_usd: 0.0,
            usage_by_model: Default::default(),
            num_steps: 0,
            duration_ms: 0,
            error: None,
        },
    );
    assert_eq!(plan::next(&h.state, &hand_facts(BASE_MS)), Next::Idle);
}

#[test]
fn a_step_left_streaming_is_resampled_as_its_next_attempt() {
    let (turn, step, _) = ids();
    let h = Hand::streaming(turn, step);
    assert_eq!(
        plan::next(&h.state, &hand_facts(BASE_MS)),
        Next::ResampleStep {
            turn,
            step,
            attempt: 2,
        }
    );
    // The same after a crash: a new worker replays and gets the same answer.
    let replayed = SessionState::replay(&h.journal).unwrap();
    assert_eq!(
        plan::next(&replayed, &hand_facts(BASE_MS)),
        Next::ResampleStep {
            turn,
            step,
            attempt: 2,
        }
    );
}

#[test]
fn a_call_left_running_with_a_dispatched_effect_becomes_outcome_unknown() {
    let (turn, step, call) = ids();
    let (h, key) = Hand::dispatched(turn, step, &call);
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::SideEffecting, false, Verdict::Allow),
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::MarkOutcomeUnknown { key }
    );
    // While its worker is alive it is just running.
    facts.running_here.insert(call.clone());
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::AwaitRunning { calls: vec![call] }
    );
}

#[test]
fn an_idempotent_write_whose_outcome_is_unknown_is_dispatched_as_attempt_2() {
    let (turn, step, call) = ids();
    let (mut h, key) = Hand::dispatched(turn, step, &call);
    h.push(effect_corr(&key), EventBody::EffectOutcomeUnknown {});
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::IdempotentWrite, false, Verdict::Allow),
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::Dispatch {
            turn,
            step,
            call: call.clone(),
            effect: EffectClass::IdempotentWrite,
            attempt: 2,
        }
    );
    // A side-effecting tool that cannot reconcile waits on a human instead…
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::SideEffecting, false, Verdict::Allow),
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::WaitForHuman {
            turn,
            approvals: Vec::new(),
            effects: vec![key.clone()],
        }
    );
    // …and is dispatched again only after the human decides `retry` (resuming first).
    h.status(SessionStatus::RequiresAction).push(
        effect_corr(&key),
        EventBody::EffectDecided {
            decision: EffectDecision::Retry,
            reconciled: false,
        },
    );
    assert_eq!(plan::next(&h.state, &facts), Next::Resume);
    h.status(SessionStatus::Running);
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::Dispatch {
            turn,
            step,
            call,
            effect: EffectClass::SideEffecting,
            attempt: 2,
        }
    );
}

#[test]
fn recorded_outcomes_settle_a_call_left_running() {
    let (turn, step, call) = ids();
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::SideEffecting, false, Verdict::Allow),
    );
    // Prepared, never dispatched.
    let mut h = Hand::executing(turn, step, &call);
    let key = OperationKey::for_call(h.session, step, &call);
    let corr = Correlation::tool_call(turn, step, call.clone());
    h.push(corr.clone(), EventBody::ToolCallValidating {})
        .push(corr.clone(), EventBody::ToolCallStarted {})
        .push(
            corr.with_operation(key.clone()),
            EventBody::EffectPrepared {
                request_hash: "sha256:req".into(),
                probe: None,
            },
        );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::Settle {
            turn,
            step,
            call: call.clone(),
            key: key.clone(),
            how: Settle::NeverDispatched,
        }
    );
    // Committed before the crash, the call's result not yet journaled.
    let (mut h, key) = Hand::dispatched(turn, step, &call);
    h.push(
        effect_corr(&key),
        EventBody::EffectCommitted {
            outcome: json!({"exit_code": 0}),
        },
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::Settle {
            turn,
            step,
            call,
            key,
            how: Settle::Recorded { committed: true },
        }
    );
}

/// The call waiting on its approval `approval`.
fn awaiting(turn: TurnId, step: StepId, call: &ToolCallId, approval: ApprovalId) -> (Hand, String) {
    let mut h = Hand::executing(turn, step, call);
    let hash = args_hash(&json!({"command": "make deploy"}));
    let corr = Correlation::tool_call(turn, step, call.clone());
    h.push(corr.clone(), EventBody::ToolCallValidating {})
        .push(
            corr.clone().with_approval(approval),
            EventBody::ApprovalRequested {
                args_hash: hash.clone(),
                expires_at: ts(BASE_MS + APPROVAL_TTL_MS),
            },
        )
        .push(
            corr.with_approval(approval),
            EventBody::ToolCallAwaitingApproval {},
        );
    (h, hash)
}

#[test]
fn a_decision_for_other_arguments_is_a_hash_mismatch() {
    let (turn, step, call) = ids();
    let approval = ApprovalId(Uuid::from_u128(0x30));
    let (h, hash) = awaiting(turn, step, &call, approval);
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::SideEffecting, false, Verdict::Ask),
    );
    let row = ApprovalFacts {
        status: ApprovalStatus::Allowed,
        decision: Some(ApprovalDecision::AllowOnce),
        args_hash: args_hash(&json!({"command": "rm -rf /"})),
        expires_at: ts(BASE_MS + APPROVAL_TTL_MS),
    };
    facts.approvals.insert(approval, row.clone());
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::ApplyApproval {
            turn,
            step,
            call: call.clone(),
            approval,
            outcome: ApprovalOutcome::HashMismatch,
        }
    );
    // The same decision for the call's own arguments is applied as allowed.
    facts.approvals.insert(
        approval,
        ApprovalFacts {
            args_hash: hash,
            ..row
        },
    );
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::ApplyApproval {
            turn,
            step,
            call,
            approval,
            outcome: ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce),
        }
    );
}

#[test]
fn a_session_requiring_action_resumes_before_applying_a_decision() {
    let (turn, step, call) = ids();
    let approval = ApprovalId(Uuid::from_u128(0x30));
    let (mut h, hash) = awaiting(turn, step, &call, approval);
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(
        call.clone(),
        valid(EffectClass::SideEffecting, false, Verdict::Ask),
    );
    let pending = ApprovalFacts {
        status: ApprovalStatus::Pending,
        decision: None,
        args_hash: hash.clone(),
        expires_at: ts(BASE_MS + APPROVAL_TTL_MS),
    };
    facts.approvals.insert(approval, pending.clone());
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::WaitForHuman {
            turn,
            approvals: vec![approval],
            effects: Vec::new(),
        }
    );
    h.status(SessionStatus::RequiresAction);
    // Still undecided: still waiting (no second status change).
    assert!(matches!(
        plan::next(&h.state, &facts),
        Next::WaitForHuman { .. }
    ));
    facts.approvals.insert(
        approval,
        ApprovalFacts {
            status: ApprovalStatus::Allowed,
            decision: Some(ApprovalDecision::AllowOnce),
            ..pending
        },
    );
    assert_eq!(plan::next(&h.state, &facts), Next::Resume);
    h.status(SessionStatus::Running);
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::ApplyApproval {
            turn,
            step,
            call,
            approval,
            outcome: ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce),
        }
    );
}

#[test]
fn a_closed_session_stops() {
    let (turn, _, _) = ids();
    let mut h = Hand::new(turn);
    h.push(
        Correlation::turn(turn),
        EventBody::TurnFinished {
            terminal_reason: TerminalReason::Aborted,
            limit: None,
            usage: Usage::default(),
            cost_usd: 0.0,
            usage_by_model: Default::default(),
            num_steps: 0,
            duration_ms: 0,
            error: None,
        },
    )
    .status(SessionStatus::Closed);
    assert_eq!(plan::next(&h.state, &hand_facts(BASE_MS)), Next::Stop);
}

fn hook_ran(hook: &str, event: HookEvent, decision: HookDecision) -> EventBody {
    EventBody::HookRan {
        hook: hook.into(),
        event,
        duration_ms: 5,
        decision,
        reason: Some("because".into()),
        arguments: None,
        sealed: false,
        context: None,
        error: None,
    }
}

/// A call its pre_tool_use hooks have not decided is neither run nor rejected: the hooks run
/// first, and their journaled decision then stands — after a crash too.
#[test]
fn a_call_waits_for_its_pre_tool_use_hooks_and_their_deny_stands() {
    let (turn, step, call) = ids();
    let mut h = Hand::executing(turn, step, &call);
    let mut facts = hand_facts(BASE_MS);
    facts.calls.insert(call.clone(), CallFacts::AwaitingHook);
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::RunHooks {
            turn,
            event: HookEvent::PreToolUse,
            calls: vec![call.clone()],
        }
    );
    h.push(
        Correlation::tool_call(turn, step, call.clone()),
        hook_ran("guard", HookEvent::PreToolUse, HookDecision::Deny),
    );
    let hook = h.state.tool_calls[&call].hook.clone().unwrap();
    assert_eq!(
        (hook.decision, hook.hook.as_str()),
        (HookDecision::Deny, "guard")
    );
    // The driver's facts now carry the hook's verdict: the call is rejected, never dispatched.
    facts.calls.insert(
        call.clone(),
        valid(
            EffectClass::SideEffecting,
            false,
            Verdict::Deny {
                reason: "the pre_tool_use hook `guard` denied it: because".into(),
            },
        ),
    );
    let replayed = SessionState::replay(&h.journal).unwrap();
    assert!(matches!(
        plan::next(&replayed, &facts),
        Next::Reject { ref calls, .. } if calls[0].0 == call
    ));
    // A rewrite replaces the arguments the call runs with (and carries them only then).
    let (turn2, step2, call2) = ids();
    let mut h = Hand::executing(turn2, step2, &call2);
    h.push(
        Correlation::tool_call(turn2, step2, call2.clone()),
        EventBody::HookRan {
            hook: "dry".into(),
            event: HookEvent::PreToolUse,
            duration_ms: 5,
            decision: HookDecision::Rewrite,
            reason: None,
            arguments: Some(json!({"command": "make -n deploy"})),
            sealed: false,
            context: None,
            error: None,
        },
    );
    assert_eq!(
        h.state.tool_calls[&call2].arguments,
        json!({"command": "make -n deploy"})
    );
    let bad = Event::new(
        h.session,
        h.state.version + 1,
        ts(BASE_MS),
        Correlation::tool_call(turn2, step2, call2.clone()),
        hook_ran("dry", HookEvent::PreToolUse, HookDecision::Rewrite),
    );
    assert!(
        h.state.clone().apply(&bad).is_err(),
        "a rewrite needs arguments"
    );
}

/// A response without calls completes the turn only after the stop hooks let it; a hook
/// that keeps asking ends it `loop_detected` past the cap, naming the hook.
#[test]
fn stop_hooks_continue_a_turn_at_most_the_cap() {
    let (turn, _, _) = ids();
    let mut h = Hand::new(turn);
    h.status(SessionStatus::Running)
        .push(Correlation::turn(turn), EventBody::TurnStarted {})
        .push(
            Correlation::turn(turn),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        );
    let mut facts = hand_facts(BASE_MS);
    facts.hooks.stop = true;
    facts.hooks.max_stop_continues = 1;
    for round in 0..3 {
        let step = StepId(Uuid::from_u128(0x500 + round));
        h.push(
            Correlation::step(turn, step, 1),
            EventBody::StepStarted {
                model: MODEL.into(),
            },
        )
        .push(
            Correlation::step(turn, step, 1),
            EventBody::StepStreaming {},
        )
        .push(
            Correlation::step(turn, step, 1),
            EventBody::StepCompleted {
                model: MODEL.into(),
                stop_reason: "end_turn".into(),
                usage: Usage::default(),
                cost_usd: 0.0,
                text: "done".into(),
                reasoning: Vec::new(),
                reasoning_sealed: 0,
                responses_consumed: 1,
                abandoned_calls: Vec::new(),
                usage_estimated: false,
            },
        );
        assert_eq!(
            plan::next(&h.state, &facts),
            Next::RunHooks {
                turn,
                event: HookEvent::Stop,
                calls: Vec::new(),
            }
        );
        h.push(
            Correlation::turn(turn),
            hook_ran("nag", HookEvent::Stop, HookDecision::Continue),
        );
        let next = plan::next(&h.state, &facts);
        if round == 0 {
            assert_eq!(
                next,
                Next::SampleStep { turn },
                "the first continue is allowed"
            );
        } else {
            let Next::FinishTurn {
                reason: TerminalReason::LoopDetected,
                error: Some(error),
                ..
            } = next
            else {
                panic!("{next:?}")
            };
            assert!(
                error.contains("`nag`") && error.contains("more than 1 times"),
                "{error}"
            );
            return;
        }
    }
}

/// A prompt a user_prompt_submit hook blocked ends its turn `aborted` before any step.
#[test]
fn a_blocked_prompt_aborts_its_turn_before_sampling() {
    let (turn, _, _) = ids();
    let mut h = Hand::new(turn);
    h.status(SessionStatus::Running)
        .push(Correlation::turn(turn), EventBody::TurnStarted {});
    let mut facts = hand_facts(BASE_MS);
    facts.hooks.user_prompt_submit = true;
    facts.hooks.session_start = true;
    assert_eq!(
        plan::next(&h.state, &facts),
        Next::RunHooks {
            turn,
            event: HookEvent::SessionStart,
            calls: Vec::new(),
        }
    );
    h.push(
        Correlation::turn(turn),
        hook_ran("hello", HookEvent::SessionStart, HookDecision::None),
    );
    assert!(matches!(
        plan::next(&h.state, &facts),
        Next::RunHooks {
            event: HookEvent::UserPromptSubmit,
            ..
        }
    ));
    h.push(
        Correlation::turn(turn),
        hook_ran("dlp", HookEvent::UserPromptSubmit, HookDecision::Deny),
    );
    let Next::FinishTurn {
        reason: TerminalReason::Aborted,
        error: Some(error),
        ..
    } = plan::next(&h.state, &facts)
    else {
        panic!()
    };
    assert!(error.contains("`dlp`: because"), "{error}");
}

/// Attack (issue 14): a `pre_tool_use` hook's `allow` answers the input it was shown. A later
/// hook that rewrites the input must not inherit that `allow`: the rewritten call is decided by
/// the policy again (an `ask` rule asks), instead of running arguments no approving hook saw.
#[test]
fn an_allow_does_not_carry_over_to_a_later_hooks_rewrite() {
    let (turn, step, call) = ids();
    let mut h = Hand::executing(turn, step, &call);
    let corr = Correlation::tool_call(turn, step, call.clone());
    h.push(
        corr.clone(),
        hook_ran("vetted", HookEvent::PreToolUse, HookDecision::Allow),
    );
    h.push(
        corr,
        EventBody::HookRan {
            hook: "expand".into(),
            event: HookEvent::PreToolUse,
            duration_ms: 5,
            decision: HookDecision::Rewrite,
            reason: None,
            arguments: Some(json!({"command": "rm -rf build"})),
            sealed: false,
            context: None,
            error: None,
        },
    );
    let hook = h.state.tool_calls[&call].hook.clone().unwrap();
    assert_eq!(
        (
            hook.decision,
            hook.hook.as_str(),
            hook.rewritten_by.as_deref()
        ),
        (HookDecision::Rewrite, "expand", Some("expand")),
        "the allow was for the input `vetted` saw, not the rewrite"
    );
    let replayed = SessionState::replay(&h.journal).unwrap();
    assert_eq!(replayed.tool_calls[&call].hook, Some(hook));
}

/// The shell reports how long a command ran (`[exit code 1; 21 ms]`): the same failing
/// command is the same failure each time, so the loop check masks durations — and only
/// them (a number before ` ms` followed by a letter, or without ` ms`, stays).
#[test]
fn a_result_s_durations_do_not_make_a_repeated_failure_look_new() {
    use keel_core::plan::without_durations;
    assert_eq!(
        without_durations("(no output)\n[exit code 1; 21 ms]"),
        without_durations("(no output)\n[exit code 1; 13 ms]")
    );
    assert_eq!(
        without_durations("[timed out after 2000 ms; the process group was killed; ran 2004 ms]"),
        "[timed out after # ms; the process group was killed; ran # ms]"
    );
    assert_eq!(without_durations("took 12 ms."), "took # ms.");
    assert_eq!(
        without_durations("12 msgs, exit 1 ms"),
        "12 msgs, exit # ms"
    );
    assert_eq!(without_durations("exit code 1; 7"), "exit code 1; 7");
    assert_eq!(without_durations("é 5 ms é"), "é # ms é");
    assert_eq!(without_durations(""), "");
}
