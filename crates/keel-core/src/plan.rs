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
//!    dispatched alone ([`Next::Dispatch`]). The model's order holds: a call that is not
//!    parallel-safe starts only when every earlier call of the step has its result, and a
//!    parallel-safe one only while no earlier call that is not parallel-safe is open (a read
//!    proposed after a write sees it; a write never changes what an earlier read reads). When only calls running in this process remain,
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

mod calls;
mod limits;
mod recover;
mod steps;
pub use calls::is_parallel;
use calls::*;
pub use limits::*;
use recover::*;
pub use steps::*;

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
