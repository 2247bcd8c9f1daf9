//! Recovery of a call journaled `running` whose worker is gone.

use super::*;

/// A call journaled `running` that no task of this process runs: its worker is gone.
pub(super) fn recover(
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
