//! The step rules: the `sampling` phase, a new step, and the loop and budget checks before it.

use super::*;

/// The `sampling` phase: the turn's last step decides.
pub(super) fn sampling(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
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
pub(super) fn new_step(state: &SessionState, turn: &TurnState, facts: &Facts) -> Next {
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

/// The number of times the turn repeated one failing call (same tool, arguments and result,
/// the result's durations aside: [`without_durations`]), once it reaches `threshold`.
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
                .entry((
                    c.name.clone(),
                    content_hash(&c.arguments),
                    without_durations(out).into_owned(),
                ))
                .or_default();
            *n += 1;
            if *n >= threshold {
                return Some(*n);
            }
        }
    }
    None
}

/// `out` with every duration in milliseconds (digits followed by ` ms` and no further letter
/// or digit) masked as `#`: a result that reports how long the call ran — the shell's `[exit
/// code 1; 21 ms]` — reads the same each time the same call fails the same way.
pub fn without_durations(out: &str) -> std::borrow::Cow<'_, str> {
    if !out.contains(" ms") {
        return std::borrow::Cow::Borrowed(out);
    }
    let mut masked = String::with_capacity(out.len());
    let mut rest = out;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() {
            let digits = rest.len() - rest.trim_start_matches(|d: char| d.is_ascii_digit()).len();
            let after = &rest[digits..];
            let ms = after
                .strip_prefix(" ms")
                .is_some_and(|tail| tail.chars().next().is_none_or(|n| !n.is_alphanumeric()));
            masked.push_str(if ms { "#" } else { &rest[..digits] });
            rest = after;
        } else {
            masked.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    std::borrow::Cow::Owned(masked)
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
