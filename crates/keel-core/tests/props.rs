//! Property tests: random event sequences against the fold.
//!
//! Sequences are drawn over small pools of ids (2 turns, 3 steps, 3 tool calls, 2 effects,
//! 2 approvals) so that random choices collide often and reach deep states. Every generated event is
//! applied; accepted ones are kept, refused ones must leave the state untouched.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use keel_core::*;
use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

#[derive(Clone, Debug)]
enum Op {
    Status(SessionStatus),
    Queue(u8),
    Start(u8),
    Phase(u8, TurnStatus),
    Finish(u8, TerminalReason),
    StepStart(u8, u8, u32),
    StepStreaming(u8),
    StepAttemptFailed(u8),
    StepComplete(u8),
    StepFail(u8),
    Propose(u8, u8, u8),
    Validating(u8),
    Awaiting(u8, u8),
    CallStart(u8),
    CallFinish(u8, ToolCallStatus),
    EffPrepare(u8, u8),
    EffDispatch(u8),
    EffUnknown(u8),
    EffCommit(u8),
    EffFail(u8),
    ApprRequest(u8, u8),
    ApprDecide(u8, bool),
    ApprExpire(u8),
    Compact(u8, u64),
    CancelRequest(u8),
    EffDecide(u8, bool),
    Config(u8),
    /// Re-pin between the releases `r` and `r2`: 0 from `r` to `r2`, 1 back.
    Repin(u8),
}

/// Every op over the id pools.
fn all_ops() -> Vec<Op> {
    let mut v = Vec::new();
    for st in SessionStatus::ALL {
        v.push(Op::Status(*st));
    }
    for t in 0..2u8 {
        v.push(Op::Queue(t));
        v.push(Op::Start(t));
        v.push(Op::CancelRequest(t));
        for p in TurnStatus::ALL {
            v.push(Op::Phase(t, *p));
        }
        for r in TerminalReason::ALL {
            v.push(Op::Finish(t, r));
        }
        for s in 0..3u8 {
            for n in 1..4u32 {
                v.push(Op::StepStart(t, s, n));
            }
            for c in 0..3u8 {
                v.push(Op::Propose(t, s, c));
            }
        }
        for n in [0u64, 3, 6] {
            v.push(Op::Compact(t, n));
        }
    }
    for s in 0..3u8 {
        v.extend([
            Op::StepStreaming(s),
            Op::StepAttemptFailed(s),
            Op::StepComplete(s),
            Op::StepFail(s),
        ]);
    }
    for c in 0..3u8 {
        v.push(Op::Validating(c));
        v.push(Op::CallStart(c));
        for st in ToolCallStatus::ALL {
            v.push(Op::CallFinish(c, *st));
        }
        for a in 0..2u8 {
            v.push(Op::Awaiting(c, a));
            v.push(Op::ApprRequest(c, a));
        }
        for e in 0..2u8 {
            v.push(Op::EffPrepare(c, e));
        }
    }
    for e in 0..2u8 {
        v.extend([
            Op::EffDispatch(e),
            Op::EffUnknown(e),
            Op::EffCommit(e),
            Op::EffFail(e),
            Op::EffDecide(e, true),
            Op::EffDecide(e, false),
        ]);
    }
    for a in 0..2u8 {
        v.extend([
            Op::ApprDecide(a, true),
            Op::ApprDecide(a, false),
            Op::ApprExpire(a),
        ]);
    }
    v.push(Op::Config(0));
    v.push(Op::Config(1));
    v.push(Op::Repin(0));
    v.push(Op::Repin(1));
    v
}

/// Ops the guided generator picks rarely: those that end things, and config changes (accepted
/// between turns, which would crowd out the deep ops).
fn ends_things(op: &Op) -> bool {
    match op {
        Op::Config(_) | Op::Repin(_) => true,
        Op::Finish(_, reason) => *reason != TerminalReason::Completed,
        other => matches!(
            other,
            Op::Status(SessionStatus::Closed)
                | Op::StepFail(_)
                | Op::CallFinish(
                    _,
                    ToolCallStatus::Cancelled
                        | ToolCallStatus::Interrupted
                        | ToolCallStatus::Failed
                )
        ),
    }
}

/// A choice per event: `(guided, pick)`. A guided choice picks among the ops the current state
/// accepts (so sequences get deep); an unguided one picks among all ops (mostly refused ones, which
/// must change nothing).
fn choices(len: usize) -> impl Strategy<Value = Vec<(bool, u16)>> {
    proptest::collection::vec((proptest::bool::weighted(0.85), any::<u16>()), 0..len)
}

struct Ids {
    session: SessionId,
}

impl Ids {
    fn turn(&self, i: u8) -> TurnId {
        TurnId(Uuid::from_u128(0x100 + u128::from(i)))
    }
    fn step(&self, i: u8) -> StepId {
        StepId(Uuid::from_u128(0x200 + u128::from(i)))
    }
    fn call(&self, i: u8) -> ToolCallId {
        ToolCallId(format!("call_{i}"))
    }
    fn key(&self, i: u8) -> OperationKey {
        OperationKey(format!("op_{i}"))
    }
    fn approval(&self, i: u8) -> ApprovalId {
        ApprovalId(Uuid::from_u128(0x300 + u128::from(i)))
    }

    fn event(&self, seq: u64, op: &Op) -> Event {
        let (corr, body) = match op {
            Op::Status(status) => (
                Correlation::default(),
                EventBody::SessionStatusChanged {
                    status: *status,
                    reason: None,
                },
            ),
            Op::Config(n) => (
                Correlation::default(),
                EventBody::SessionConfigChanged {
                    changes: json!({"permission_mode": if *n == 0 { "bypass" } else { "default" },
                        "turn_budget": {"max_steps": n}}),
                },
            ),
            Op::Repin(n) => {
                let (from, to) = if *n == 0 { ("r", "r2") } else { ("r2", "r") };
                (
                    Correlation::default(),
                    EventBody::SessionReleasePinned {
                        from_release_id: ReleaseId::from(from),
                        to_release_id: ReleaseId::from(to),
                    },
                )
            }
            Op::Queue(t) => (
                Correlation::turn(self.turn(*t)),
                EventBody::TurnQueued {
                    input: "in".into(),
                    compiled: None,
                },
            ),
            Op::Start(t) => (Correlation::turn(self.turn(*t)), EventBody::TurnStarted {}),
            Op::Phase(t, p) => (
                Correlation::turn(self.turn(*t)),
                EventBody::TurnPhaseChanged { phase: *p },
            ),
            Op::Finish(t, r) => (
                Correlation::turn(self.turn(*t)),
                EventBody::TurnFinished {
                    terminal_reason: *r,
                    limit: None,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    usage_by_model: Default::default(),
                    num_steps: 0,
                    duration_ms: 0,
                    error: None,
                },
            ),
            Op::StepStart(t, s, n) => (
                Correlation::step(self.turn(*t), self.step(*s), *n),
                EventBody::StepStarted { model: "m".into() },
            ),
            Op::StepStreaming(s) => (self.step_corr(*s), EventBody::StepStreaming {}),
            Op::StepAttemptFailed(s) => (
                self.step_corr(*s),
                EventBody::StepAttemptFailed {
                    model: "m".into(),
                    error_kind: "overloaded".into(),
                    message: "".into(),
                    retry_in_ms: None,
                    responses_consumed: 1,
                    cost_usd: 0.0,
                    usage: Default::default(),
                    usage_estimated: false,
                },
            ),
            Op::StepComplete(s) => (
                self.step_corr(*s),
                EventBody::StepCompleted {
                    model: "m".into(),
                    stop_reason: "end_turn".into(),
                    usage: Usage {
                        input_tokens: 3,
                        output_tokens: 1,
                        ..Usage::default()
                    },
                    cost_usd: 0.5,
                    text: String::new(),
                    reasoning: Vec::new(),
                    reasoning_sealed: 0,
                    responses_consumed: 1,
                    abandoned_calls: Vec::new(),
                    usage_estimated: false,
                },
            ),
            Op::StepFail(s) => (
                self.step_corr(*s),
                EventBody::StepFailed {
                    error_kind: "x".into(),
                    message: "".into(),
                    responses_consumed: 1,
                    cost_usd: 0.0,
                    usage: Default::default(),
                    usage_estimated: false,
                },
            ),
            Op::Propose(t, s, c) => (
                Correlation::tool_call(self.turn(*t), self.step(*s), self.call(*c)),
                EventBody::ToolCallProposed {
                    name: "shell".into(),
                    arguments: json!({"command": "ls"}),
                    sealed: false,
                },
            ),
            Op::Validating(c) => (self.call_corr(*c), EventBody::ToolCallValidating {}),
            Op::Awaiting(c, a) => (
                self.call_corr(*c).with_approval(self.approval(*a)),
                EventBody::ToolCallAwaitingApproval {},
            ),
            Op::CallStart(c) => (self.call_corr(*c), EventBody::ToolCallStarted {}),
            Op::CallFinish(c, st) => (
                self.call_corr(*c),
                EventBody::ToolCallFinished {
                    status: *st,
                    output: "o".into(),
                    is_error: false,
                },
            ),
            Op::EffPrepare(c, e) => (
                self.call_corr(*c).with_operation(self.key(*e)),
                EventBody::EffectPrepared {
                    request_hash: "h".into(),
                    probe: None,
                },
            ),
            Op::EffDispatch(e) => (self.eff_corr(*e), EventBody::EffectDispatched {}),
            Op::EffUnknown(e) => (self.eff_corr(*e), EventBody::EffectOutcomeUnknown {}),
            Op::EffCommit(e) => (
                self.eff_corr(*e),
                EventBody::EffectCommitted { outcome: json!(1) },
            ),
            Op::EffFail(e) => (
                self.eff_corr(*e),
                EventBody::EffectFailed { error: "e".into() },
            ),
            Op::ApprRequest(c, a) => (
                self.call_corr(*c).with_approval(self.approval(*a)),
                EventBody::ApprovalRequested {
                    args_hash: "h".into(),
                    expires_at: Utc.timestamp_millis_opt(0).unwrap(),
                },
            ),
            Op::ApprDecide(a, ok) => (
                Correlation::default().with_approval(self.approval(*a)),
                EventBody::ApprovalDecided {
                    decision: if *ok {
                        ApprovalDecision::AllowOnce
                    } else {
                        ApprovalDecision::Deny {
                            reason: "no".into(),
                        }
                    },
                    hook: None,
                },
            ),
            Op::ApprExpire(a) => (
                Correlation::default().with_approval(self.approval(*a)),
                EventBody::ApprovalExpired {},
            ),
            Op::CancelRequest(t) => (
                Correlation::turn(self.turn(*t)),
                EventBody::TurnCancelRequested {
                    reason: "user".into(),
                },
            ),
            Op::EffDecide(e, retry) => (
                self.eff_corr(*e),
                EventBody::EffectDecided {
                    decision: if *retry {
                        EffectDecision::Retry
                    } else {
                        EffectDecision::Failed { error: "no".into() }
                    },
                    reconciled: false,
                },
            ),
            Op::Compact(t, n) => (
                Correlation::turn(self.turn(*t)),
                EventBody::ContextCompacted {
                    summary: "s".into(),
                    first_kept_item: *n,
                    tokens_before: 0,
                    tokens_after: 0,
                    requested: false,
                    focus: None,
                },
            ),
        };
        Event::new(
            self.session,
            seq,
            Utc.timestamp_millis_opt(seq as i64).unwrap(),
            corr,
            body,
        )
    }

    fn step_corr(&self, s: u8) -> Correlation {
        Correlation {
            step_id: Some(self.step(s)),
            ..Correlation::default()
        }
    }
    fn call_corr(&self, c: u8) -> Correlation {
        Correlation {
            tool_call_id: Some(self.call(c)),
            ..Correlation::default()
        }
    }
    fn eff_corr(&self, e: u8) -> Correlation {
        Correlation {
            operation_key: Some(self.key(e)),
            ..Correlation::default()
        }
    }
}

/// Every entity's (machine, status name, terminal) keyed by a string id.
fn statuses(state: &SessionState) -> BTreeMap<String, (Machine, &'static str, bool)> {
    let mut m = BTreeMap::new();
    m.insert(
        "session".to_string(),
        (
            Machine::Session,
            state.status.as_str(),
            state.status.is_terminal(),
        ),
    );
    for (id, t) in &state.turns {
        m.insert(
            format!("turn:{id}"),
            (Machine::Turn, t.status.as_str(), t.status.is_terminal()),
        );
    }
    for (id, s) in &state.steps {
        m.insert(
            format!("step:{id}"),
            (Machine::Step, s.status.as_str(), s.status.is_terminal()),
        );
    }
    for (id, c) in &state.tool_calls {
        m.insert(
            format!("call:{id}"),
            (Machine::ToolCall, c.status.as_str(), c.status.is_terminal()),
        );
    }
    for (id, e) in &state.effects {
        m.insert(
            format!("effect:{id}"),
            (Machine::Effect, e.status.as_str(), e.status.is_terminal()),
        );
    }
    for (id, a) in &state.approvals {
        m.insert(
            format!("approval:{id}"),
            (Machine::Approval, a.status.as_str(), a.status.is_terminal()),
        );
    }
    m
}

fn legal(machine: Machine, from: &str, to: &str) -> bool {
    fn edge<S: StateMachine + std::str::FromStr>(from: &str, to: &str) -> bool {
        match (from.parse::<S>(), to.parse::<S>()) {
            (Ok(f), Ok(t)) => check_transition(f, t).is_ok(),
            _ => false,
        }
    }
    match machine {
        Machine::Session => edge::<SessionStatus>(from, to),
        Machine::Turn => edge::<TurnStatus>(from, to),
        Machine::Step => edge::<StepStatus>(from, to),
        Machine::ToolCall => edge::<ToolCallStatus>(from, to),
        Machine::Effect => edge::<EffectStatus>(from, to),
        Machine::Approval => edge::<ApprovalStatus>(from, to),
    }
}

/// Structural invariants every reachable state keeps.
fn check_invariants(state: &SessionState) {
    let pinned = state.release_id.as_ref().map(|r| r.0.as_str());
    assert!(
        matches!(pinned, Some("r" | "r2")),
        "the pinned release is one of the journaled ones: {pinned:?}"
    );
    if let Some(active) = state.active_turn {
        let t = &state.turns[&active];
        assert!(
            !t.status.is_terminal() && t.status != TurnStatus::Queued,
            "active turn {t:?}"
        );
        assert_ne!(state.status, SessionStatus::Idle);
    }
    let active_turns = state
        .turns
        .values()
        .filter(|t| !t.status.is_terminal() && t.status != TurnStatus::Queued)
        .count();
    assert!(active_turns <= 1, "at most one active turn");
    if state.status == SessionStatus::RequiresAction {
        assert!(state.active_turn.is_some());
    }
    if state.status == SessionStatus::Closed {
        assert!(state.active_turn.is_none(), "closed with an active turn");
        assert!(
            state.tool_calls.values().all(|c| c.status.is_terminal()),
            "closed with a call that never got its result"
        );
    }
    for e in state.effects.values() {
        assert!(state.tool_calls.contains_key(&e.tool_call_id));
    }
    for step in state.steps.values() {
        assert!(state.turns.contains_key(&step.turn_id));
        assert!(step.attempt >= 1);
    }
    for call in state.tool_calls.values() {
        assert!(state.steps.contains_key(&call.step_id));
        assert_eq!(call.result.is_some(), call.status.is_terminal(), "{call:?}");
    }
    for t in state.turns.values() {
        assert_eq!(t.terminal_reason.is_some(), t.status.is_terminal());
        if t.status.is_terminal() {
            assert!(
                state
                    .tool_calls
                    .values()
                    .filter(|c| c.turn_id == t.id)
                    .all(|c| c.status.is_terminal())
            );
            assert!(t.steps.iter().all(|s| state.steps[s].status.is_terminal()));
        }
    }
}

fn run(choices: &[(bool, u16)]) -> (SessionState, Vec<Event>, BTreeMap<String, u32>) {
    let ops = all_ops();
    let ids = Ids {
        session: SessionId(Uuid::from_u128(1)),
    };
    let mut state = SessionState::default();
    let mut accepted = Vec::new();
    let create = Event::new(
        ids.session,
        1,
        Utc.timestamp_millis_opt(0).unwrap(),
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: TenantId(Uuid::from_u128(9)),
            release_id: ReleaseId::from("r"),
            config: json!({}),
        },
    );
    state.apply(&create).unwrap();
    accepted.push(create);
    let mut terminal_entries: BTreeMap<String, u32> = BTreeMap::new();
    for &(guided, pick) in choices {
        let op = if guided {
            let accepted: Vec<&Op> = ops
                .iter()
                .filter(|op| {
                    state
                        .clone()
                        .apply(&ids.event(state.version + 1, op))
                        .is_ok()
                })
                .collect();
            // Mostly avoid the ops that end things, so sequences reach deep states.
            let progressing: Vec<&Op> = accepted
                .iter()
                .copied()
                .filter(|op| !ends_things(op))
                .collect();
            let pool = if pick % 16 != 0 && !progressing.is_empty() {
                progressing
            } else {
                accepted
            };
            match pool.len() {
                0 => &ops[usize::from(pick) % ops.len()],
                n => pool[usize::from(pick / 16) % n],
            }
        } else {
            &ops[usize::from(pick) % ops.len()]
        };
        let ev = ids.event(state.version + 1, op);
        let before = state.clone();
        let before_statuses = statuses(&state);
        match state.apply(&ev) {
            Ok(()) => {
                let after = statuses(&state);
                for (id, (machine, to, terminal)) in &after {
                    match before_statuses.get(id) {
                        Some((_, from, _)) if from != to => {
                            assert!(
                                legal(*machine, from, to),
                                "{id}: {from} -> {to} applied but illegal"
                            );
                            if *terminal {
                                *terminal_entries.entry(id.clone()).or_default() += 1;
                            }
                        }
                        Some(_) => {}
                        None if *terminal => {
                            *terminal_entries.entry(id.clone()).or_default() += 1;
                        }
                        None => {}
                    }
                }
                check_invariants(&state);
                accepted.push(ev);
            }
            Err(_) => assert_eq!(state, before, "refused {op:?} changed the state"),
        }
    }
    (state, accepted, terminal_entries)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random event sequences never produce an illegal state: every applied change is an edge of
    /// its table, structural invariants hold after every event, refused events change nothing.
    #[test]
    fn random_sequences_never_produce_an_illegal_state(c in choices(80)) {
        run(&c);
    }

    /// Replaying the accepted events always yields the same state.
    #[test]
    fn replay_is_deterministic(c in choices(80)) {
        let (state, accepted, _) = run(&c);
        let replayed = SessionState::replay(&accepted).unwrap();
        prop_assert_eq!(&replayed, &state);
        let again = SessionState::replay(&accepted).unwrap();
        prop_assert_eq!(&again, &state);
        // And through the wire encoding.
        let decoded: Vec<Event> = accepted.iter().map(|e| Event::decode(&e.encode()).unwrap()).collect();
        prop_assert_eq!(&SessionState::replay(&decoded).unwrap(), &state);
    }

    /// Every terminal state is reached at most once per entity.
    #[test]
    fn terminal_states_are_reached_at_most_once(c in choices(80)) {
        let (_, _, entries) = run(&c);
        for (id, n) in entries {
            prop_assert!(n <= 1, "{} entered a terminal state {} times", id, n);
        }
    }
}

/// The generator is only useful if it reaches deep states; make sure it does.
#[test]
fn the_generator_reaches_deep_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = choices(80);
    let mut seen: BTreeMap<&'static str, u32> = BTreeMap::new();
    for _ in 0..200 {
        let c = strat.new_tree(&mut runner).unwrap().current();
        let (state, _, _) = run(&c);
        for t in state.turns.values() {
            *seen.entry(t.status.as_str()).or_default() += 1;
        }
        for c in state.tool_calls.values() {
            *seen.entry(c.status.as_str()).or_default() += 1;
        }
        for e in state.effects.values() {
            *seen.entry(e.status.as_str()).or_default() += 1;
        }
    }
    for needed in [
        "executing_tools",
        "completed",
        "succeeded",
        "committed",
        "outcome_unknown",
        "rejected",
    ] {
        assert!(
            seen.get(needed).copied().unwrap_or(0) > 0,
            "never reached {needed}: {seen:?}"
        );
    }
}
