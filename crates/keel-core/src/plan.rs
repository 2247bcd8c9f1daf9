//! The planner: what the runtime does next, decided from the folded journal alone.
//!
//! [`next`] is a pure function of a [`SessionState`] and a few plain values the driver supplies
//! ([`Facts`]: the clock, the limits, what the step's frozen policy says of each call, what the
//! approvals table says of each pending approval, the context size). It returns one [`Next`]: the
//! single thing the driver (`keel-runtime`) must do now. The driver performs the I/O, journals
//! the events that record it, folds them, and asks again. Because the decision depends on the
//! folded state and nothing else, recovery is not a separate code path: a worker that starts
//! after a crash folds the journal and gets the same answer the crashed worker would have.
//!
//! The rules, in the order [`next`] applies them:
//!
//! 1. A closed session [`Next::Stop`]s. With no active turn, a queued turn that was cancelled
//!    before it started is finished `aborted`; otherwise the oldest queued turn starts
//!    ([`Next::StartTurn`]); with nothing queued the session goes [`Next::Idle`].
//! 2. An active turn whose cancellation was requested finishes `aborted`; one past its wall-clock
//!    limit finishes `failed`.
//! 3. A session in `requires_action` whose turn has something to do again returns to `running`
//!    first ([`Next::Resume`]): nothing is dispatched while the session says it waits on a human.
//! 4. By the turn's phase — `preparing` → sampling; `compacting` → [`Next::Compact`];
//!    `sampling` → the step rules; `executing_tools` → the call rules below.
//! 5. **Steps.** A step left `started`/`streaming` (a crash, or a retry after a context overflow)
//!    is re-sampled as its next attempt, after compacting when it overflowed. A completed step
//!    with open calls moves the turn to `executing_tools`; one without calls completes the turn;
//!    a failed step fails it. Before a new step: an exhausted budget finishes
//!    `budget_exhausted` (naming the limit; checked first, so calls refused by a spent tool-call
//!    budget never read as a loop), a repeated failing call `loop_detected`, a context over
//!    the compaction threshold is compacted (once per step), then [`Next::SampleStep`].
//! 6. **Calls** of the turn's last step, in proposal order. Recovery first: a call left
//!    `running` by a worker that is gone is re-run when read-only ([`Next::Rerun`]), or its
//!    effect is settled from the journal — `prepared` was never dispatched, `committed`/`failed`
//!    give the recorded result, `dispatched` becomes `outcome_unknown`, and `outcome_unknown` is
//!    decided by a human's decision, reconciled when the tool can (what it cannot tell goes to
//!    a human), re-dispatched when the tool is an idempotent write without a check, or put to a
//!    human. Then decided approvals are journaled
//!    (allowed only with the argument hash the approval was requested for), invalid and denied
//!    calls are rejected, calls the policy asks about get approvals, allowed read-only
//!    parallel-safe calls run together ([`Next::Execute`]), and the first allowed other call is
//!    dispatched alone ([`Next::Dispatch`]) — a sequential call never overtakes an earlier one
//!    that is still open. When only calls running in this process remain,
//!    [`Next::AwaitRunning`]; when only humans can unblock the rest — their own approvals and
//!    effects, or a child session's ([`Facts::waiting_in_child`]) — [`Next::WaitForHuman`];
//!    when every call has its result, the turn samples again.
//!
//! Invariants the property tests check (`tests/plan.rs`): no operation key is dispatched twice
//! (a re-dispatch only after `outcome_unknown` with a `retry` decision or for an idempotent
//! write); no call runs unless its approval, if it has one, is `allowed` for its exact argument
//! hash; a turn is finished only in ways the fold accepts; every session reaches a terminal
//! reason or a wait; and the same state gives the same answer live and after replay.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::approval::ApprovalDecision;
use crate::budget::{Budget, BudgetLimit, Consumed, TerminalReason};
use crate::canonical::content_hash;
use crate::event::{EffectDecision, HookDecision, HookEvent};
use crate::ids::{ApprovalId, OperationKey, StepId, ToolCallId, TurnId};
use crate::machine::{
    ApprovalStatus, EffectStatus, SessionStatus, StateMachine, StepStatus, ToolCallStatus,
    TurnStatus,
};
use crate::mechanisms::{Mechanism, is_off};
use crate::state::{SessionState, ToolCallState, TurnState};

/// How a tool affects the world; drives policy defaults and crash recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// Observes only; safe to re-run after a crash.
    ReadOnly,
    /// Writes, but running it twice with the same arguments gives the same result (write_file).
    IdempotentWrite,
    /// Arbitrary side effects; never blindly re-run (shell, most MCP tools).
    SideEffecting,
}

/// What validation and the step's frozen policy say of one call (computed by the driver from
/// the tool registry and the step snapshot; plain values here).
#[derive(Debug, Clone, PartialEq)]
pub enum CallFacts {
    /// The call failed validation (unknown tool, arguments not matching the schema): it gets
    /// this result (`status` is `failed` or `rejected`) without running.
    Invalid {
        /// The call's terminal status.
        status: ToolCallStatus,
        /// The result the model sees.
        output: String,
    },
    /// `pre_tool_use` hooks match the call and have not decided yet: nothing about it is
    /// decided (not even its validity) until their decision is journaled.
    AwaitingHook,
    /// A valid call and the policy's verdict on it.
    Valid {
        /// The tool's effect class.
        effect: EffectClass,
        /// Whether it may run concurrently with other parallel-safe calls.
        parallel_safe: bool,
        /// Whether the tool can tell after a crash whether an interrupted call took effect.
        can_reconcile: bool,
        /// The policy's verdict for this call.
        verdict: Verdict,
    },
}

/// The policy's verdict on a valid call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Ask a human first.
    Ask,
    /// Refuse it; the model sees `reason`.
    Deny {
        /// Why, in words the model reads.
        reason: String,
    },
}

/// What the approvals table records for one approval (humans decide there, outside the journal).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalFacts {
    /// Its status in the table.
    pub status: ApprovalStatus,
    /// The decision, once decided.
    pub decision: Option<ApprovalDecision>,
    /// The argument hash the decision was made for.
    pub args_hash: String,
    /// When it expires.
    pub expires_at: DateTime<Utc>,
}

/// Limits the planner enforces (the session's effective settings).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Per-turn budget (release defaults merged with the session's).
    pub turn_budget: Budget,
    /// Budget over the whole session.
    pub session_budget: Budget,
    /// The tenant's daily tokens and cost; checked against [`Facts::tenant_usage`].
    pub tenant_daily_budget: Budget,
    /// The same failing call (tool, arguments, result) this many times ends the turn
    /// `loop_detected`; 0 disables the check.
    pub loop_threshold: u32,
    /// The turn's wall-clock limit, ms.
    pub turn_timeout_ms: Option<u64>,
    /// The model's context window, tokens.
    pub context_window_tokens: u64,
    /// Compact when the estimated context reaches this fraction of the window.
    pub compact_at_fraction: f64,
    /// Compaction failures and provider overflows tolerated in one turn before it ends
    /// `prompt_too_long`.
    pub max_compaction_failures: u32,
}

/// The plain values [`next`] needs beside the state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// Now (the driver's clock; the planner has no other).
    pub now: DateTime<Utc>,
    /// The limits.
    pub limits: Limits,
    /// Validation and policy per open call of the active turn's last step. A call without an
    /// entry is treated as not runnable yet (the driver supplies entries for every open call).
    pub calls: BTreeMap<ToolCallId, CallFacts>,
    /// The approvals table's record of each approval a call waits on.
    pub approvals: BTreeMap<ApprovalId, ApprovalFacts>,
    /// Calls running in this process right now (started by this driver and not finished).
    pub running_here: BTreeSet<ToolCallId>,
    /// Calls of `running_here` that wait on a human in a child session (a `spawn_agent` call
    /// whose child ended its run `requires_action`). Only a human can move them: when nothing
    /// else can, the answer is [`Next::WaitForHuman`] (with neither approvals nor effects of
    /// its own for them), and the driver detaches those calls — they stay `running` in the
    /// journal, and the next run re-runs them (a read-only call re-attaches its child).
    pub waiting_in_child: BTreeSet<ToolCallId>,
    /// Estimated tokens of the context the next step would send.
    pub context_tokens: u64,
    /// Compactions that failed in the active turn (in this process).
    pub compaction_failures: u32,
    /// A compaction before the next step (or attempt) was already tried and failed: sample
    /// without it.
    pub skip_compaction: bool,
    /// Effects whose tool's reconcile answered "unknown" in this process: put them to a human.
    pub unreconciled: BTreeSet<OperationKey>,
    /// The tenant's usage today (tokens, USD) when a tenant daily budget is set, as the
    /// store's reservation of the step's worst case read it: at a limit, the turn ends
    /// `budget_exhausted`.
    pub tenant_usage: Option<Consumed>,
    /// A sub-agent's share of its tree's budget: what the root session had left when it
    /// spawned the tree's first child in its step, and what every session of the tree (this
    /// one included) has spent since, its own steps only (see `keel_runtime`'s `spend`
    /// module). At a limit the turn ends `budget_exhausted`, so children running side by side
    /// overshoot the root's budget by at most one step each. `None` outside a sub-agent tree.
    pub shared: Option<SharedBudget>,
    /// Which hook events have hooks configured (the driver's host configuration).
    pub hooks: HookFacts,
}

/// A budget several sessions draw on at once (a sub-agent tree): [`Facts::shared`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SharedBudget {
    /// The limits.
    pub limit: Budget,
    /// What the sessions sharing it have spent.
    pub used: Consumed,
}

/// Which hook events have hooks (the `pre_tool_use` and `post_tool_use` ones are per call:
/// [`CallFacts::AwaitingHook`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookFacts {
    /// `session_start` hooks run before the session's first turn samples.
    pub session_start: bool,
    /// `user_prompt_submit` hooks run before each turn samples.
    pub user_prompt_submit: bool,
    /// Calls waiting on an approval whose tool `permission_request` hooks match: the hooks run
    /// on the pending approval before a human is waited for.
    pub permission_request: BTreeSet<ToolCallId>,
    /// `stop` hooks run when a turn would complete.
    pub stop: bool,
    /// How many times `stop` hooks may make a turn continue; one more ends it `loop_detected`.
    pub max_stop_continues: u32,
}

/// How a decided approval is journaled.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalOutcome {
    /// Allowed for exactly the arguments it was requested for.
    Allowed(ApprovalDecision),
    /// Denied; the call gets a rejected result naming the reason.
    Denied {
        /// The human's reason.
        reason: String,
    },
    /// Decided for other arguments than the call's: refused, never run.
    HashMismatch,
    /// Expired without a decision; the call gets a rejected result.
    Expired,
    /// Still undecided (or allowed in the table, not yet journaled) while the session's policy
    /// now denies the call — its permission mode was lowered (`read_only`) or a deny rule
    /// added after it was asked: refused without asking, never run.
    PolicyDenied {
        /// The policy's reason, in words the model reads.
        reason: String,
    },
}

/// How a call left `running` by a dead worker is settled from its effect's journaled status.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// `prepared` only: never dispatched. The effect fails, the call is `interrupted`.
    NeverDispatched,
    /// The outcome was journaled (`committed` or `failed`) before the crash.
    Recorded {
        /// Whether it committed.
        committed: bool,
    },
    /// A human decided the `outcome_unknown` effect `committed` or `failed`.
    Decided(EffectDecision),
}

/// The one thing the driver does next. Every variant names the entities it acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// The session is closed: nothing will ever run.
    Stop,
    /// Nothing is active or queued: the session goes idle.
    Idle,
    /// Start the oldest queued turn (the session becomes `running` first if it is not).
    StartTurn {
        /// The turn.
        turn: TurnId,
    },
    /// The session waits on a human but its turn can continue: back to `running`.
    Resume,
    /// Move the active turn to `phase` (`sampling` or `executing_tools`).
    EnterPhase {
        /// The turn.
        turn: TurnId,
        /// The phase.
        phase: TurnStatus,
    },
    /// Sample a new step.
    SampleStep {
        /// The turn.
        turn: TurnId,
    },
    /// Sample a step again as attempt `attempt` (it was left unfinished).
    ResampleStep {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The new attempt number.
        attempt: u32,
    },
    /// Summarize older context behind a boundary; `aggressive` keeps only the newest item group
    /// (after a provider overflow).
    Compact {
        /// The turn.
        turn: TurnId,
        /// Whether to keep only the newest item group.
        aggressive: bool,
    },
    /// Give these calls their one result without running them (invalid or denied).
    Reject {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// Each call with its terminal status and the result the model sees.
        calls: Vec<(ToolCallId, ToolCallStatus, String)>,
    },
    /// Request human approval for these calls.
    RequestApprovals {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The calls.
        calls: Vec<ToolCallId>,
    },
    /// Journal an approval decision recorded in the approvals table.
    ApplyApproval {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The call.
        call: ToolCallId,
        /// The approval.
        approval: ApprovalId,
        /// What to journal.
        outcome: ApprovalOutcome,
    },
    /// Run the hooks of `event` and journal what they decide (`hook.ran`), committed before it
    /// takes effect: for each of `calls` (`pre_tool_use`, `permission_request`: the calls'
    /// pending approvals), or for the turn (`session_start`, `user_prompt_submit`, `stop`).
    RunHooks {
        /// The turn.
        turn: TurnId,
        /// The hook event.
        event: HookEvent,
        /// The calls the hooks run for (empty for turn events).
        calls: Vec<ToolCallId>,
    },
    /// Run these read-only, parallel-safe, allowed calls concurrently.
    Execute {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The calls.
        calls: Vec<ToolCallId>,
    },
    /// Run this allowed call alone: for a side-effecting or idempotent write, journal its
    /// intent (`effect.prepared` on attempt 1, `effect.dispatched`) durably first.
    Dispatch {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The call.
        call: ToolCallId,
        /// Its effect class.
        effect: EffectClass,
        /// Dispatch attempt (1 for the first; more for a decided retry or an idempotent
        /// re-dispatch of an `outcome_unknown` effect).
        attempt: u32,
    },
    /// Run again a read-only call left `running` by a worker that is gone.
    Rerun {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The call.
        call: ToolCallId,
        /// Whether it runs alone (not parallel-safe).
        sequential: bool,
    },
    /// A dispatched effect whose worker is gone: its outcome is unknown.
    MarkOutcomeUnknown {
        /// The effect.
        key: OperationKey,
    },
    /// Ask the tool whether the `outcome_unknown` effect took place.
    Reconcile {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The call.
        call: ToolCallId,
        /// The effect.
        key: OperationKey,
    },
    /// Settle a call left `running` from what the journal knows of its effect.
    Settle {
        /// The turn.
        turn: TurnId,
        /// The step.
        step: StepId,
        /// The call.
        call: ToolCallId,
        /// The effect.
        key: OperationKey,
        /// How.
        how: Settle,
    },
    /// Calls are running in this process and nothing else can move: wait for one to finish.
    AwaitRunning {
        /// The calls.
        calls: Vec<ToolCallId>,
    },
    /// Only a human can unblock the turn: pending approvals and undecided `outcome_unknown`
    /// effects, or calls whose child session waits on one ([`Facts::waiting_in_child`]; both
    /// lists may then be empty). The session goes `requires_action`.
    WaitForHuman {
        /// The turn.
        turn: TurnId,
        /// Approvals awaiting a decision.
        approvals: Vec<ApprovalId>,
        /// Effects awaiting a decision.
        effects: Vec<OperationKey>,
    },
    /// Finish the turn: every open call gets a result, open steps fail, `turn.finished`.
    FinishTurn {
        /// The turn.
        turn: TurnId,
        /// Why.
        reason: TerminalReason,
        /// The exhausted limit, for `budget_exhausted`.
        limit: Option<BudgetLimit>,
        /// What went wrong, in words.
        error: Option<String>,
    },
}

impl Next {
    /// Whether this answer is a wait: the driver stops (or waits for its own running calls)
    /// until something outside changes the state.
    pub fn is_wait(&self) -> bool {
        matches!(
            self,
            Next::Stop | Next::Idle | Next::AwaitRunning { .. } | Next::WaitForHuman { .. }
        )
    }
}

/// What the runtime does next for the session in `state`, given `facts`. Pure.
pub fn next(state: &SessionState, facts: &Facts) -> Next {
    if state.status == SessionStatus::Closed {
        return Next::Stop;
    }
    let Some(turn) = state.active_turn.and_then(|t| state.turns.get(&t)) else {
        return match state.queue.front().and_then(|t| state.turns.get(t)) {
            Some(t) if t.cancel_requested.is_some() => finish(t.id, TerminalReason::Aborted),
            Some(t) => Next::StartTurn { turn: t.id },
            None => Next::Idle,
        };
    };
    if let Some(reason) = &turn.cancel_requested
        && !is_off(Mechanism::CancelBeforeDispatch)
    {
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Aborted,
            limit: None,
            error: Some(reason.clone()),
        };
    }
    if let (Some(ms), Some(started)) = (facts.limits.turn_timeout_ms, turn.started_at)
        && elapsed_ms(started, facts.now) >= ms
    {
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Failed,
            limit: None,
            error: Some(format!(
                "the turn timed out after {ms} ms (turn wall-clock limit)"
            )),
        };
    }
    if let Some(ms) = wall_time_left_ms(state, turn, &facts.limits, facts.now)
        && ms == 0
    {
        // A wall-time budget ends the turn at once, wherever it is (the driver's timer cancels
        // what runs; the calls get their results as the turn ends).
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::BudgetExhausted,
            limit: Some(BudgetLimit::WallTime),
            error: None,
        };
    }
    let planned = match turn.status {
        TurnStatus::Queued | TurnStatus::Completed | TurnStatus::Aborted | TurnStatus::Failed => {
            // The fold keeps neither a queued nor a finished turn active.
            return Next::Idle;
        }
        TurnStatus::Preparing => preparing(state, turn, facts),
        TurnStatus::Compacting => {
            if let Some(n) = compaction_exhausted(turn, facts) {
                prompt_too_long(turn.id, n)
            } else {
                Next::Compact {
                    turn: turn.id,
                    aggressive: false,
                }
            }
        }
        TurnStatus::Sampling => sampling(state, turn, facts),
        TurnStatus::ExecutingTools => executing(state, turn, facts),
    };
    // Nothing is done while the session says it waits on a human.
    if state.status == SessionStatus::RequiresAction
        && !matches!(planned, Next::WaitForHuman { .. } | Next::FinishTurn { .. })
    {
        return Next::Resume;
    }
    planned
}

/// The `preparing` phase: the session's and the prompt's hooks, then sampling.
fn preparing(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
    if let Some((hook, reason)) = &turn.blocked {
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Aborted,
            limit: None,
            error: Some(format!(
                "the prompt was blocked by the user_prompt_submit hook `{hook}`: {reason}"
            )),
        };
    }
    let hooks = |event| Next::RunHooks {
        turn: turn.id,
        event,
        calls: Vec::new(),
    };
    if facts.hooks.session_start && !state.session_hooked {
        return hooks(HookEvent::SessionStart);
    }
    if facts.hooks.user_prompt_submit && !turn.prompt_hooked {
        return hooks(HookEvent::UserPromptSubmit);
    }
    Next::EnterPhase {
        turn: turn.id,
        phase: TurnStatus::Sampling,
    }
}

/// A response without calls would complete the turn: unless `stop` hooks ask it to continue
/// (at most [`HookFacts::max_stop_continues`] times; once more ends it `loop_detected`, naming
/// the hook).
fn stop_or_continue(state: &SessionState, turn: &TurnState, step: StepId, facts: &Facts) -> Next {
    if let Some((s, hook)) = &turn.stop_continue
        && *s == step
    {
        if turn.stop_continues > facts.hooks.max_stop_continues {
            return Next::FinishTurn {
                turn: turn.id,
                reason: TerminalReason::LoopDetected,
                limit: None,
                error: Some(format!(
                    "the stop hook `{hook}` asked the turn to continue more than {} times",
                    facts.hooks.max_stop_continues
                )),
            };
        }
        return new_step(state, turn, facts);
    }
    if facts.hooks.stop && turn.stop_hooked_step != Some(step) {
        return Next::RunHooks {
            turn: turn.id,
            event: HookEvent::Stop,
            calls: Vec::new(),
        };
    }
    finish(turn.id, TerminalReason::Completed)
}

fn finish(turn: TurnId, reason: TerminalReason) -> Next {
    Next::FinishTurn {
        turn,
        reason,
        limit: None,
        error: None,
    }
}

/// What is left, ms, of the active turn's wall-time budgets (the turn's `max_wall_time_ms`, and
/// the session's minus the time earlier turns took), or `None` when neither is set. The driver
/// arms its timer with it; 0 ends the turn `budget_exhausted (wall_time)`.
pub fn wall_time_left_ms(
    state: &SessionState,
    turn: &TurnState,
    limits: &Limits,
    now: DateTime<Utc>,
) -> Option<u64> {
    if is_off(Mechanism::BudgetCheck) {
        return None;
    }
    let elapsed = turn.started_at.map_or(0, |s| elapsed_ms(s, now));
    let turn_left = limits
        .turn_budget
        .max_wall_time_ms
        .map(|m| m.saturating_sub(elapsed));
    let session_left = limits
        .session_budget
        .max_wall_time_ms
        .map(|m| m.saturating_sub(state.finished_turns_ms.saturating_add(elapsed)));
    match (turn_left, session_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Tool calls the active turn may still start under its turn's and session's `max_tool_calls`
/// (`None`: unlimited). Calls are counted when they start, in proposal order.
fn tool_calls_left(
    state: &SessionState,
    turn: &TurnState,
    limits: &Limits,
    shared: Option<&SharedBudget>,
) -> Option<u32> {
    if is_off(Mechanism::BudgetCheck) {
        return None;
    }
    let turn_left = limits.turn_budget.max_tool_calls.map(|m| {
        m.saturating_sub(turn.tool_calls_run)
            .saturating_sub(turn.subagents.tool_calls)
    });
    let session_run = session_tool_calls(state);
    let session_left = limits
        .session_budget
        .max_tool_calls
        .map(|m| m.saturating_sub(session_run));
    let shared_left = shared.and_then(|s| {
        s.limit
            .max_tool_calls
            .map(|m| m.saturating_sub(s.used.tool_calls))
    });
    [turn_left, session_left, shared_left]
        .into_iter()
        .flatten()
        .min()
}

/// What the active turn has left of its turn and session budgets, limit by limit (the
/// tighter of the two; `None` where neither sets one): steps, tokens, cost (USD), tool calls
/// and wall time (ms), its finished sub-agents' spend counted. A sub-agent spawned now may
/// spend at most this, shared with its siblings ([`SharedBudget`]).
pub fn budget_left(
    state: &SessionState,
    turn: &TurnState,
    limits: &Limits,
    now: DateTime<Utc>,
) -> Budget {
    let (turn_used, session_used) = consumed(state, turn, now);
    let left = |b: &Budget, used: &Consumed| Budget {
        max_steps: b.max_steps.map(|m| m.saturating_sub(used.steps)),
        max_tokens: b.max_tokens.map(|m| m.saturating_sub(used.tokens)),
        max_cost_usd: b.max_cost_usd.map(|m| (m - used.cost_usd).max(0.0)),
        max_tool_calls: b.max_tool_calls.map(|m| m.saturating_sub(used.tool_calls)),
        max_wall_time_ms: b
            .max_wall_time_ms
            .map(|m| m.saturating_sub(used.wall_time_ms)),
    };
    left(&limits.turn_budget, &turn_used).tighter(&left(&limits.session_budget, &session_used))
}

/// What the turn and the session have used (the turn's finished sub-agents included).
fn consumed(state: &SessionState, turn: &TurnState, now: DateTime<Utc>) -> (Consumed, Consumed) {
    let wall = turn.started_at.map_or(0, |s| elapsed_ms(s, now));
    let sub = &turn.subagents;
    let turn_used = Consumed {
        steps: u32::try_from(turn.steps.len())
            .unwrap_or(u32::MAX)
            .saturating_add(sub.steps),
        tokens: turn.usage.total_tokens(),
        cost_usd: turn.cost_usd,
        tool_calls: turn.tool_calls_run.saturating_add(sub.tool_calls),
        wall_time_ms: wall,
    };
    let session_used = Consumed {
        steps: u32::try_from(state.steps.len()).unwrap_or(u32::MAX),
        tokens: state.usage.total_tokens(),
        cost_usd: state.cost_usd,
        tool_calls: session_tool_calls(state),
        wall_time_ms: state.finished_turns_ms.saturating_add(wall),
    };
    (turn_used, session_used)
}

/// Tool calls the session's turns ran (saturating).
fn session_tool_calls(state: &SessionState) -> u32 {
    state
        .turns
        .values()
        .fold(0u32, |n, t| n.saturating_add(t.tool_calls_run))
}

fn elapsed_ms(from: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    u64::try_from((now - from).num_milliseconds()).unwrap_or(0)
}

fn compaction_exhausted(turn: &TurnState, facts: &Facts) -> Option<u32> {
    let max = facts.limits.max_compaction_failures.max(1);
    let n = facts.compaction_failures + turn.overflows.saturating_sub(1);
    if turn.overflows >= max {
        return Some(turn.overflows);
    }
    (n >= max).then_some(n)
}

fn prompt_too_long(turn: TurnId, n: u32) -> Next {
    Next::FinishTurn {
        turn,
        reason: TerminalReason::PromptTooLong,
        limit: None,
        error: Some(format!(
            "the prompt stays too long after {n} compactions or context overflows"
        )),
    }
}

/// The `sampling` phase: the turn's last step decides.
fn sampling(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
    let last = turn.steps.last().and_then(|s| state.steps.get(s));
    match last {
        Some(step) if !step.status.is_terminal() => {
            if step.overflowed {
                if let Some(n) = compaction_exhausted(turn, facts) {
                    return prompt_too_long(turn.id, n);
                }
                // After a failed compaction the step is sampled again as it is.
                if !facts.skip_compaction {
                    return Next::Compact {
                        turn: turn.id,
                        aggressive: true,
                    };
                }
            }
            Next::ResampleStep {
                turn: turn.id,
                step: step.id,
                attempt: step.attempt + 1,
            }
        }
        Some(step) if step.status == StepStatus::Failed => Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Failed,
            limit: None,
            error: Some(match &step.failure {
                Some((kind, message)) => format!("model error ({kind}): {message}"),
                None => "the model step failed".into(),
            }),
        },
        // A response without calls of its own ends the turn, once the calls of abandoned
        // attempts (if any) have their results.
        Some(step)
            if step.tool_calls.iter().all(|c| {
                step.abandoned.contains(c)
                    && state
                        .tool_calls
                        .get(c)
                        .is_none_or(|c| c.status.is_terminal())
            }) =>
        {
            stop_or_continue(state, turn, step.id, facts)
        }
        Some(step)
            if step.tool_calls.iter().any(|c| {
                state
                    .tool_calls
                    .get(c)
                    .is_some_and(|c| !c.status.is_terminal())
            }) =>
        {
            Next::EnterPhase {
                turn: turn.id,
                phase: TurnStatus::ExecutingTools,
            }
        }
        _ => new_step(state, turn, facts),
    }
}

/// Before a new step: budgets, loops, compaction.
///
/// Budgets come first: calls refused because the tool-call budget is spent all carry the same
/// refusal, so they would look like a repeated failing call; an exhausted budget is what ended
/// the turn, and it is reported as `budget_exhausted` naming the limit.
fn new_step(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
    if let Some(limit) = budget_exhausted(state, turn, facts) {
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::BudgetExhausted,
            limit: Some(limit),
            error: None,
        };
    }
    if let Some(n) = loop_detected(state, turn, facts.limits.loop_threshold) {
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::LoopDetected,
            limit: None,
            error: Some(format!("the same failing tool call was repeated {n} times")),
        };
    }
    let limits = &facts.limits;
    let threshold = limits.context_window_tokens as f64 * limits.compact_at_fraction;
    if limits.context_window_tokens > 0
        && !facts.skip_compaction
        && facts.context_tokens as f64 >= threshold
        && turn.compacted_at_step != Some(turn.steps.len())
    {
        if let Some(n) = compaction_exhausted(turn, facts) {
            return prompt_too_long(turn.id, n);
        }
        return Next::Compact {
            turn: turn.id,
            aggressive: false,
        };
    }
    Next::SampleStep { turn: turn.id }
}

/// The number of times the turn repeated one failing call (same tool, arguments and result),
/// once it reaches `threshold`.
pub fn loop_detected(state: &SessionState, turn: &TurnState, threshold: u32) -> Option<u32> {
    if threshold == 0 {
        return None;
    }
    let mut counts: BTreeMap<(String, String, String), u32> = BTreeMap::new();
    for c in state.tool_calls.values().filter(|c| c.turn_id == turn.id) {
        if matches!(c.status, ToolCallStatus::Failed | ToolCallStatus::Rejected)
            && let Some((out, _)) = &c.result
        {
            let n = counts
                .entry((c.name.clone(), content_hash(&c.arguments), out.clone()))
                .or_default();
            *n += 1;
            if *n >= threshold {
                return Some(*n);
            }
        }
    }
    None
}

/// The first exhausted limit of the turn, the session or the tenant's day.
pub fn budget_exhausted(
    state: &SessionState,
    turn: &TurnState,
    facts: &Facts,
) -> Option<BudgetLimit> {
    if is_off(Mechanism::BudgetCheck) {
        return None;
    }
    let (turn_used, session_used) = consumed(state, turn, facts.now);
    let limits = &facts.limits;
    if let Err(l) = limits.turn_budget.check(&turn_used) {
        return Some(l);
    }
    if let Err(l) = limits.session_budget.check(&session_used) {
        return Some(l);
    }
    let daily = Budget {
        max_tokens: limits.tenant_daily_budget.max_tokens,
        max_cost_usd: limits.tenant_daily_budget.max_cost_usd,
        ..Budget::default()
    };
    if let Some(used) = &facts.tenant_usage
        && let Err(l) = daily.check(used)
    {
        return Some(l);
    }
    if let Some(shared) = &facts.shared
        && let Err(l) = shared.limit.check(&shared.used)
    {
        return Some(l);
    }
    None
}

/// What one open call of the executing step needs.
enum CallNeed {
    /// Something to do now.
    Act(Next),
    /// Running here: wait for it.
    Running,
    /// Only a human can move it (pending approval, undecided effect, or — `child` — what its
    /// child session waits for).
    Human {
        approval: Option<ApprovalId>,
        effect: Option<OperationKey>,
        child: bool,
    },
    /// Allowed and ready: run it (read-only parallel batch, or alone).
    Ready { parallel: bool },
    /// Waiting for facts the driver has not supplied.
    Unknown,
}

/// The `executing_tools` phase: the calls of the turn's last step.
fn executing(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
    let Some(step) = turn.steps.last().and_then(|s| state.steps.get(s)) else {
        return Next::EnterPhase {
            turn: turn.id,
            phase: TurnStatus::Sampling,
        };
    };
    let mut rejects = Vec::new();
    let mut asks = Vec::new();
    let mut pre_hooks = Vec::new();
    let mut permission_hooks = Vec::new();
    let mut batch = Vec::new();
    let mut sequential: Option<Next> = None;
    // An earlier sequential call is still open: later sequential calls wait behind it.
    let mut seq_blocked = false;
    let mut running = Vec::new();
    let mut human_approvals = Vec::new();
    let mut human_effects = Vec::new();
    let mut human_children = false;
    let mut unknown = false;
    // The tool-call budget: a call that would start past it is refused (with its result).
    let mut calls_left = tool_calls_left(state, turn, &facts.limits, facts.shared.as_ref());
    for call in step
        .tool_calls
        .iter()
        .filter_map(|c| state.tool_calls.get(c))
        .filter(|c| !c.status.is_terminal())
    {
        let parallel_call = is_parallel(facts.calls.get(&call.id));
        let mut need = call_need(state, turn, step.id, call, facts);
        let starts = call.runs == 0
            && matches!(
                need,
                CallNeed::Ready { .. } | CallNeed::Act(Next::RequestApprovals { .. })
            );
        if starts && let Some(left) = calls_left.as_mut() {
            if *left == 0 {
                need = CallNeed::Act(Next::Reject {
                    turn: turn.id,
                    step: step.id,
                    calls: vec![(
                        call.id.clone(),
                        ToolCallStatus::Rejected,
                        format!(
                            "`{}` was not run: the tool-call budget of this turn is spent.",
                            call.name
                        ),
                    )],
                });
            } else {
                *left -= 1;
            }
        }
        match need {
            CallNeed::Act(next) => {
                match next {
                    Next::Reject { mut calls, .. } => rejects.append(&mut calls),
                    Next::RequestApprovals { mut calls, .. } => asks.append(&mut calls),
                    Next::RunHooks {
                        event: HookEvent::PreToolUse,
                        mut calls,
                        ..
                    } => pre_hooks.append(&mut calls),
                    Next::RunHooks {
                        event: HookEvent::PermissionRequest,
                        mut calls,
                        ..
                    } => permission_hooks.append(&mut calls),
                    // Recovery and decisions come first, one at a time, in proposal order.
                    other => return other,
                }
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Running => {
                running.push(call.id.clone());
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Human {
                approval,
                effect,
                child,
            } => {
                human_approvals.extend(approval);
                human_effects.extend(effect);
                human_children |= child;
                if !parallel_call {
                    seq_blocked = true;
                }
            }
            CallNeed::Ready { parallel: true } => batch.push(call.id.clone()),
            CallNeed::Ready { parallel: false } => {
                if !seq_blocked && sequential.is_none() {
                    sequential = Some(ready_alone(state, turn.id, step.id, call, facts));
                }
                seq_blocked = true;
            }
            CallNeed::Unknown => {
                unknown = true;
                if !parallel_call {
                    seq_blocked = true;
                }
            }
        }
    }
    // Hooks decide before anything of their calls happens (a hook that blocks stops the side
    // effect: the call cannot be dispatched before the decision is journaled).
    for (event, calls) in [
        (HookEvent::PreToolUse, pre_hooks),
        (HookEvent::PermissionRequest, permission_hooks),
    ] {
        if !calls.is_empty() {
            return Next::RunHooks {
                turn: turn.id,
                event,
                calls,
            };
        }
    }
    if !rejects.is_empty() {
        return Next::Reject {
            turn: turn.id,
            step: step.id,
            calls: rejects,
        };
    }
    if !asks.is_empty() {
        return Next::RequestApprovals {
            turn: turn.id,
            step: step.id,
            calls: asks,
        };
    }
    if !batch.is_empty() {
        return Next::Execute {
            turn: turn.id,
            step: step.id,
            calls: batch,
        };
    }
    if let Some(next) = sequential {
        return next;
    }
    if !running.is_empty() {
        return Next::AwaitRunning { calls: running };
    }
    if !human_approvals.is_empty() || !human_effects.is_empty() || human_children {
        return Next::WaitForHuman {
            turn: turn.id,
            approvals: human_approvals,
            effects: human_effects,
        };
    }
    if unknown {
        // Open calls the driver gave no facts for: nothing can be decided about them, so the
        // turn cannot go on; a human (or a retry with facts) must look.
        return Next::FinishTurn {
            turn: turn.id,
            reason: TerminalReason::Failed,
            limit: None,
            error: Some("tool calls could not be assessed".into()),
        };
    }
    Next::EnterPhase {
        turn: turn.id,
        phase: TurnStatus::Sampling,
    }
}

fn is_parallel(facts: Option<&CallFacts>) -> bool {
    matches!(
        facts,
        Some(CallFacts::Valid {
            effect: EffectClass::ReadOnly,
            parallel_safe: true,
            ..
        })
    )
}

/// A ready call that runs alone: a dispatch (or the re-run of a read-only call left running).
fn ready_alone(
    state: &SessionState,
    turn: TurnId,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> Next {
    let effect = match facts.calls.get(&call.id) {
        Some(CallFacts::Valid { effect, .. }) => *effect,
        _ => EffectClass::SideEffecting,
    };
    let attempt = call
        .operation_key
        .as_ref()
        .and_then(|k| state.effects.get(k))
        .map_or(1, |e| e.attempts + 1);
    Next::Dispatch {
        turn,
        step,
        call: call.id.clone(),
        effect,
        attempt,
    }
}

fn call_need(
    state: &SessionState,
    turn: &TurnState,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> CallNeed {
    let cf = facts.calls.get(&call.id);
    if facts.running_here.contains(&call.id) {
        if facts.waiting_in_child.contains(&call.id) {
            return CallNeed::Human {
                approval: None,
                effect: None,
                child: true,
            };
        }
        return CallNeed::Running;
    }
    match call.status {
        ToolCallStatus::Proposed | ToolCallStatus::Validating => match cf {
            None => CallNeed::Unknown,
            Some(CallFacts::AwaitingHook) => CallNeed::Act(Next::RunHooks {
                turn: turn.id,
                event: HookEvent::PreToolUse,
                calls: vec![call.id.clone()],
            }),
            Some(CallFacts::Invalid { status, output }) => CallNeed::Act(Next::Reject {
                turn: turn.id,
                step,
                calls: vec![(call.id.clone(), *status, output.clone())],
            }),
            Some(CallFacts::Valid {
                verdict,
                effect,
                parallel_safe,
                ..
            }) => match verdict {
                Verdict::Deny { reason } => CallNeed::Act(Next::Reject {
                    turn: turn.id,
                    step,
                    calls: vec![(
                        call.id.clone(),
                        ToolCallStatus::Rejected,
                        format!(
                            "Permission denied for `{}`: {reason}. The call was not run; do not retry it unchanged — choose another way or ask the user.",
                            call.name
                        ),
                    )],
                }),
                Verdict::Ask => CallNeed::Act(Next::RequestApprovals {
                    turn: turn.id,
                    step,
                    calls: vec![call.id.clone()],
                }),
                Verdict::Allow => CallNeed::Ready {
                    parallel: *effect == EffectClass::ReadOnly && *parallel_safe,
                },
            },
        },
        ToolCallStatus::AwaitingApproval => awaiting(state, turn.id, step, call, facts),
        ToolCallStatus::Running => recover(state, turn.id, step, call, facts),
        ToolCallStatus::Succeeded
        | ToolCallStatus::Failed
        | ToolCallStatus::Cancelled
        | ToolCallStatus::Rejected
        | ToolCallStatus::Interrupted => CallNeed::Running,
    }
}

/// A call waiting on its approval.
fn awaiting(
    state: &SessionState,
    turn: TurnId,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> CallNeed {
    let Some(approval) = call.approval_id.and_then(|a| state.approvals.get(&a)) else {
        return CallNeed::Unknown;
    };
    let apply = |outcome| {
        CallNeed::Act(Next::ApplyApproval {
            turn,
            step,
            call: call.id.clone(),
            approval: approval.id,
            outcome,
        })
    };
    match approval.status {
        ApprovalStatus::Allowed => match facts.calls.get(&call.id) {
            Some(CallFacts::Valid {
                effect,
                parallel_safe,
                ..
            }) => CallNeed::Ready {
                parallel: *effect == EffectClass::ReadOnly && *parallel_safe,
            },
            Some(CallFacts::Invalid { status, output }) => CallNeed::Act(Next::Reject {
                turn,
                step,
                calls: vec![(call.id.clone(), *status, output.clone())],
            }),
            Some(CallFacts::AwaitingHook) | None => CallNeed::Unknown,
        },
        // Journaled with the call's result in one batch; seen open only in a broken journal.
        ApprovalStatus::Denied | ApprovalStatus::Expired => apply(ApprovalOutcome::Expired),
        ApprovalStatus::Pending => {
            // The policy of now comes first: a call asked about under a looser mode is not run
            // once the session's mode (or rules) deny it, whoever allowed it meanwhile.
            if let Some(CallFacts::Valid {
                verdict: Verdict::Deny { reason },
                ..
            }) = facts.calls.get(&call.id)
            {
                return apply(ApprovalOutcome::PolicyDenied {
                    reason: reason.clone(),
                });
            }
            // A `permission_request` hook's journaled decision is the decision (the approvals
            // row follows it); with hooks and none run yet, they run before a human is asked.
            match &approval.hook {
                Some((HookDecision::Allow, _, _)) => {
                    return apply(ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce));
                }
                Some((HookDecision::Deny, hook, reason)) => {
                    return apply(ApprovalOutcome::Denied {
                        reason: match reason {
                            Some(r) if !r.trim().is_empty() => r.clone(),
                            _ => format!("denied by the permission_request hook `{hook}`"),
                        },
                    });
                }
                Some(_) => {}
                None if facts.hooks.permission_request.contains(&call.id)
                    && facts
                        .approvals
                        .get(&approval.id)
                        .is_none_or(|t| t.status == ApprovalStatus::Pending) =>
                {
                    return CallNeed::Act(Next::RunHooks {
                        turn,
                        event: HookEvent::PermissionRequest,
                        calls: vec![call.id.clone()],
                    });
                }
                None => {}
            }
            let Some(table) = facts.approvals.get(&approval.id) else {
                return CallNeed::Human {
                    approval: Some(approval.id),
                    effect: None,
                    child: false,
                };
            };
            match table.status {
                ApprovalStatus::Pending if table.expires_at <= facts.now => {
                    apply(ApprovalOutcome::Expired)
                }
                ApprovalStatus::Pending => CallNeed::Human {
                    approval: Some(approval.id),
                    effect: None,
                    child: false,
                },
                ApprovalStatus::Allowed => {
                    if table.args_hash != approval.args_hash {
                        return apply(ApprovalOutcome::HashMismatch);
                    }
                    match &table.decision {
                        Some(
                            d @ (ApprovalDecision::AllowOnce | ApprovalDecision::AllowForSession),
                        ) => apply(ApprovalOutcome::Allowed(d.clone())),
                        Some(ApprovalDecision::Deny { .. }) | None => {
                            apply(ApprovalOutcome::Allowed(ApprovalDecision::AllowOnce))
                        }
                    }
                }
                ApprovalStatus::Denied => apply(ApprovalOutcome::Denied {
                    reason: match &table.decision {
                        Some(ApprovalDecision::Deny { reason }) if !reason.trim().is_empty() => {
                            reason.clone()
                        }
                        _ => "no reason given".into(),
                    },
                }),
                ApprovalStatus::Expired => apply(ApprovalOutcome::Expired),
            }
        }
    }
}

/// A call journaled `running` that no task of this process runs: its worker is gone.
fn recover(
    state: &SessionState,
    turn: TurnId,
    step: StepId,
    call: &ToolCallState,
    facts: &Facts,
) -> CallNeed {
    let cf = facts.calls.get(&call.id);
    let rerun = || {
        // No effect journaled: a read-only call; safe to run again.
        CallNeed::Act(Next::Rerun {
            turn,
            step,
            call: call.id.clone(),
            sequential: !is_parallel(cf),
        })
    };
    let Some(key) = &call.operation_key else {
        return rerun();
    };
    let Some(effect) = state.effects.get(key) else {
        return rerun();
    };
    let settle = |how| {
        CallNeed::Act(Next::Settle {
            turn,
            step,
            call: call.id.clone(),
            key: key.clone(),
            how,
        })
    };
    match effect.status {
        EffectStatus::Prepared => settle(Settle::NeverDispatched),
        EffectStatus::Committed => settle(Settle::Recorded { committed: true }),
        EffectStatus::Failed => settle(Settle::Recorded { committed: false }),
        EffectStatus::Dispatched => CallNeed::Act(Next::MarkOutcomeUnknown { key: key.clone() }),
        EffectStatus::OutcomeUnknown => match &effect.decision {
            Some(EffectDecision::Retry) => CallNeed::Ready { parallel: false },
            Some(d) => settle(Settle::Decided(d.clone())),
            // A tool that can check asks first, and what it cannot tell goes to a human (the
            // world changed in a way nobody can explain); an idempotent write without a check
            // is dispatched again.
            // Test builds with `effect_claim` off: dispatched again, blindly.
            None if is_off(Mechanism::EffectClaim) => CallNeed::Ready { parallel: false },
            None => match cf {
                Some(CallFacts::Valid {
                    can_reconcile: true,
                    ..
                }) if !facts.unreconciled.contains(key) => CallNeed::Act(Next::Reconcile {
                    turn,
                    step,
                    call: call.id.clone(),
                    key: key.clone(),
                }),
                Some(CallFacts::Valid {
                    effect: EffectClass::IdempotentWrite,
                    can_reconcile: false,
                    ..
                }) => CallNeed::Ready { parallel: false },
                Some(_) | None => CallNeed::Human {
                    approval: None,
                    effect: Some(key.clone()),
                    child: false,
                },
            },
        },
    }
}
