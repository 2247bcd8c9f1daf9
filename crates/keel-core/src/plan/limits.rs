//! What the budgets have left: wall time, tool calls, tokens and cost, from the folded state.

use super::*;

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
pub(super) fn tool_calls_left(
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
pub(super) fn consumed(
    state: &SessionState,
    turn: &TurnState,
    now: DateTime<Utc>,
) -> (Consumed, Consumed) {
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
pub(super) fn session_tool_calls(state: &SessionState) -> u32 {
    state
        .turns
        .values()
        .fold(0u32, |n, t| n.saturating_add(t.tool_calls_run))
}

pub(super) fn elapsed_ms(from: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    u64::try_from((now - from).num_milliseconds()).unwrap_or(0)
}

pub(super) fn compaction_exhausted(turn: &TurnState, facts: &Facts) -> Option<u32> {
    let max = facts.limits.max_compaction_failures.max(1);
    let n = facts.compaction_failures + turn.overflows.saturating_sub(1);
    if turn.overflows >= max {
        return Some(turn.overflows);
    }
    (n >= max).then_some(n)
}

pub(super) fn prompt_too_long(turn: TurnId, n: u32) -> Next {
    Next::FinishTurn {
        turn,
        reason: TerminalReason::PromptTooLong,
        limit: None,
        error: Some(format!(
            "the prompt stays too long after {n} compactions or context overflows"
        )),
    }
}
