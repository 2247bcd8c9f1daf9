//! Whole-journal scenarios through `SessionState::apply`.

use chrono::{Duration, TimeZone, Utc};
use keel_core::*;
use serde_json::json;

/// Builds a journal event by event, numbering seqs.
pub struct Journal {
    pub session: SessionId,
    pub events: Vec<Event>,
}

impl Journal {
    pub fn new() -> Self {
        Journal {
            session: SessionId::new(),
            events: Vec::new(),
        }
    }

    pub fn next(&self, correlation: Correlation, body: EventBody) -> Event {
        let ts = Utc
            .timestamp_millis_opt(1_764_460_000_000 + self.events.len() as i64)
            .unwrap();
        Event::new(
            self.session,
            self.events.len() as u64 + 1,
            ts,
            correlation,
            body,
        )
    }

    pub fn push(&mut self, correlation: Correlation, body: EventBody) -> &mut Self {
        let ev = self.next(correlation, body);
        self.events.push(ev);
        self
    }

    pub fn created(&mut self) -> &mut Self {
        self.push(
            Correlation::default(),
            EventBody::SessionCreated {
                tenant_id: TenantId::new(),
                release_id: ReleaseId::from("sha256:r"),
                config: json!({}),
            },
        )
    }

    pub fn status(&mut self, status: SessionStatus) -> &mut Self {
        self.push(
            Correlation::default(),
            EventBody::SessionStatusChanged {
                status,
                reason: None,
            },
        )
    }
}

fn finished(reason: TerminalReason) -> EventBody {
    EventBody::TurnFinished {
        terminal_reason: reason,
        limit: None,
        usage: Usage::default(),
        cost_usd: 0.0,
        usage_by_model: Default::default(),
        num_steps: 1,
        duration_ms: 5,
        error: None,
    }
}

#[test]
fn a_turn_with_an_approved_side_effecting_call_folds_to_completed() {
    let (t, s1, s2) = (TurnId::new(), StepId::new(), StepId::new());
    let call = ToolCallId::from("call_1_0");
    let approval = ApprovalId::new();
    let mut j = Journal::new();
    let key = OperationKey::for_call(j.session, s1, &call);
    j.created()
        .push(
            Correlation::turn(t),
            EventBody::TurnQueued {
                input: "write a file".into(),
                compiled: None,
            },
        )
        .status(SessionStatus::Running)
        .push(Correlation::turn(t), EventBody::TurnStarted {})
        .push(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        )
        .push(
            Correlation::step(t, s1, 1),
            EventBody::StepStarted {
                model: "script:x".into(),
            },
        )
        .push(Correlation::step(t, s1, 1), EventBody::StepStreaming {})
        .push(
            Correlation::tool_call(t, s1, call.clone()),
            EventBody::ToolCallProposed {
                name: "write_file".into(),
                arguments: json!({"path": "a", "content": "b"}),
                sealed: false,
            },
        )
        .push(
            Correlation::step(t, s1, 1),
            EventBody::StepCompleted {
                model: "script:x".into(),
                stop_reason: "tool_use".into(),
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                cost_usd: 0.01,
                text: String::new(),
                reasoning: Vec::new(),
                reasoning_sealed: 0,
                responses_consumed: 1,
                abandoned_calls: Vec::new(),
                usage_estimated: false,
            },
        )
        .push(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::ExecutingTools,
            },
        )
        .push(
            Correlation::tool_call(t, s1, call.clone()),
            EventBody::ToolCallValidating {},
        )
        .push(
            Correlation::tool_call(t, s1, call.clone()).with_approval(approval),
            EventBody::ApprovalRequested {
                args_hash: "sha256:x".into(),
                expires_at: Utc::now() + Duration::hours(1),
            },
        )
        .push(
            Correlation::tool_call(t, s1, call.clone()).with_approval(approval),
            EventBody::ToolCallAwaitingApproval {},
        )
        .status(SessionStatus::RequiresAction)
        .push(
            Correlation::default().with_approval(approval),
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::AllowOnce,
                hook: None,
            },
        )
        .status(SessionStatus::Running)
        .push(
            Correlation::tool_call(t, s1, call.clone()).with_operation(key.clone()),
            EventBody::EffectPrepared {
                request_hash: "sha256:q".into(),
                probe: None,
            },
        )
        .push(
            Correlation::default()
                .with_operation(key.clone())
                .with_attempt(1),
            EventBody::EffectDispatched {},
        )
        .push(
            Correlation::tool_call(t, s1, call.clone()),
            EventBody::ToolCallStarted {},
        )
        .push(
            Correlation::default().with_operation(key.clone()),
            EventBody::EffectCommitted {
                outcome: json!({"bytes": 1}),
            },
        )
        .push(
            Correlation::tool_call(t, s1, call.clone()),
            EventBody::ToolCallFinished {
                status: ToolCallStatus::Succeeded,
                output: "wrote 1 bytes".into(),
                is_error: false,
            },
        )
        .push(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        )
        .push(
            Correlation::step(t, s2, 1),
            EventBody::StepStarted {
                model: "script:x".into(),
            },
        )
        .push(Correlation::step(t, s2, 1), EventBody::StepStreaming {})
        .push(
            Correlation::step(t, s2, 1),
            EventBody::StepCompleted {
                model: "script:x".into(),
                stop_reason: "end_turn".into(),
                usage: Usage {
                    input_tokens: 20,
                    output_tokens: 2,
                    ..Usage::default()
                },
                cost_usd: 0.02,
                text: String::new(),
                reasoning: Vec::new(),
                reasoning_sealed: 0,
                responses_consumed: 1,
                abandoned_calls: Vec::new(),
                usage_estimated: false,
            },
        )
        .push(Correlation::turn(t), finished(TerminalReason::Completed))
        .status(SessionStatus::Idle);

    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.version, j.events.len() as u64);
    assert_eq!(state.status, SessionStatus::Idle);
    assert_eq!(state.active_turn, None);
    let turn = &state.turns[&t];
    assert_eq!(turn.status, TurnStatus::Completed);
    assert_eq!(turn.steps, vec![s1, s2]);
    assert_eq!(turn.tool_calls_run, 1);
    assert_eq!(turn.usage.total_tokens(), 37);
    assert!((state.cost_usd - 0.03).abs() < 1e-9);
    assert_eq!(state.num_steps, 2);
    assert_eq!(state.tool_calls[&call].status, ToolCallStatus::Succeeded);
    assert_eq!(
        state.tool_calls[&call].result,
        Some(("wrote 1 bytes".into(), false))
    );
    assert_eq!(state.effects[&key].status, EffectStatus::Committed);
    assert_eq!(state.effects[&key].attempts, 1);
    assert_eq!(state.approvals[&approval].status, ApprovalStatus::Allowed);
    assert_eq!(state.open_tool_calls().count(), 0);
}

/// Applies `ev` to a state built from `j`, expects an error, and checks the state did not move.
fn refused(j: &Journal, ev: Event) -> ApplyError {
    let mut state = SessionState::replay(&j.events).unwrap();
    let before = state.clone();
    let err = state.apply(&ev).unwrap_err();
    assert_eq!(
        state, before,
        "a refused event must leave the state unchanged"
    );
    err
}

fn running_turn() -> (Journal, TurnId) {
    let t = TurnId::new();
    let mut j = Journal::new();
    j.created()
        .push(
            Correlation::turn(t),
            EventBody::TurnQueued {
                input: "x".into(),
                compiled: None,
            },
        )
        .status(SessionStatus::Running)
        .push(Correlation::turn(t), EventBody::TurnStarted {});
    (j, t)
}

#[test]
fn events_must_come_in_order_and_belong_to_the_session() {
    let (j, t) = running_turn();
    let mut ev = j.next(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    );
    ev.seq += 1;
    assert!(matches!(
        refused(&j, ev),
        ApplyError::OutOfOrder { seq: 6, version: 4 }
    ));
    let mut ev = j.next(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    );
    ev.session_id = SessionId::new();
    assert!(matches!(refused(&j, ev), ApplyError::WrongSession { .. }));
}

#[test]
fn session_created_is_first_and_only_first() {
    let empty = Journal::new();
    let ev = empty.next(Correlation::default(), EventBody::TurnStarted {});
    assert!(matches!(
        refused(&empty, ev),
        ApplyError::Creation { seq: 1, .. }
    ));
    let (j, _) = running_turn();
    let again = j.next(
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: TenantId::new(),
            release_id: ReleaseId::from("r"),
            config: json!(null),
        },
    );
    assert!(matches!(refused(&j, again), ApplyError::Creation { .. }));
}

#[test]
fn one_active_turn_per_session() {
    let (mut j, _) = running_turn();
    let t2 = TurnId::new();
    j.push(
        Correlation::turn(t2),
        EventBody::TurnQueued {
            input: "y".into(),
            compiled: None,
        },
    );
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.queue.iter().copied().collect::<Vec<_>>(), vec![t2]);
    let err = refused(&j, j.next(Correlation::turn(t2), EventBody::TurnStarted {}));
    assert!(err.to_string().contains("one active turn"), "{err}");
}

#[test]
fn a_finished_turn_is_never_moved_again() {
    let (mut j, t) = running_turn();
    j.push(Correlation::turn(t), finished(TerminalReason::Aborted));
    let err = refused(
        &j,
        j.next(Correlation::turn(t), finished(TerminalReason::Completed)),
    );
    match err {
        ApplyError::Transition { source, .. } => {
            assert!(source.from_terminal);
            assert_eq!((source.from, source.to), ("aborted", "completed"));
        }
        other => panic!("{other}"),
    }
    let err = refused(
        &j,
        j.next(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        ),
    );
    assert!(matches!(err, ApplyError::Transition { .. }));
}

#[test]
fn requires_action_does_not_finish_a_turn() {
    let (j, t) = running_turn();
    let err = refused(
        &j,
        j.next(
            Correlation::turn(t),
            finished(TerminalReason::RequiresAction),
        ),
    );
    assert!(matches!(err, ApplyError::Rule { .. }));
}

#[test]
fn a_turn_cannot_finish_while_a_call_has_no_result() {
    let (mut j, t) = running_turn();
    let s = StepId::new();
    j.push(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    )
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepStarted { model: "m".into() },
    )
    .push(Correlation::step(t, s, 1), EventBody::StepStreaming {})
    .push(
        Correlation::tool_call(t, s, "c1".into()),
        EventBody::ToolCallProposed {
            name: "shell".into(),
            arguments: json!({"command": "ls"}),
            sealed: false,
        },
    );
    let err = refused(
        &j,
        j.next(Correlation::turn(t), finished(TerminalReason::Aborted)),
    );
    assert!(err.to_string().contains("needs its result"), "{err}");
    j.push(
        Correlation::tool_call(t, s, "c1".into()),
        EventBody::ToolCallFinished {
            status: ToolCallStatus::Cancelled,
            output: "cancelled".into(),
            is_error: true,
        },
    );
    let err = refused(
        &j,
        j.next(Correlation::turn(t), finished(TerminalReason::Aborted)),
    );
    assert!(
        err.to_string().contains("every step of the turn ends"),
        "{err}"
    );
    j.push(
        Correlation::step(t, s, 1),
        EventBody::StepFailed {
            error_kind: "aborted".into(),
            message: "cancelled".into(),
            responses_consumed: 0,
            cost_usd: 0.0,
            usage: Default::default(),
            usage_estimated: false,
        },
    );
    let mut state = SessionState::replay(&j.events).unwrap();
    state
        .apply(&j.next(Correlation::turn(t), finished(TerminalReason::Aborted)))
        .unwrap();
}

#[test]
fn a_retried_step_is_the_same_step_with_a_growing_attempt() {
    let (mut j, t) = running_turn();
    let s = StepId::new();
    j.push(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    )
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepStarted { model: "a".into() },
    )
    .push(Correlation::step(t, s, 1), EventBody::StepStreaming {})
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepAttemptFailed {
            model: "a".into(),
            error_kind: "overloaded".into(),
            message: "".into(),
            retry_in_ms: Some(10),
            responses_consumed: 1,
            cost_usd: 0.0,
            usage: Default::default(),
            usage_estimated: false,
        },
    )
    .push(
        Correlation::step(t, s, 2),
        EventBody::StepStarted { model: "b".into() },
    );
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.steps[&s].attempt, 2);
    assert_eq!(state.steps[&s].status, StepStatus::Started);
    assert_eq!(state.steps[&s].model, "b");
    assert_eq!(state.turns[&t].steps, vec![s]);
    let err = refused(
        &j,
        j.next(
            Correlation::step(t, s, 2),
            EventBody::StepStarted { model: "b".into() },
        ),
    );
    assert!(
        err.to_string().contains("attempt number must grow"),
        "{err}"
    );
}

/// Tokens a failed attempt used (a retry, a fallback, a step that failed for good) count in the
/// turn's and the session's totals under the model that served the attempt, without counting a
/// step; an estimated report marks the model's totals estimated.
#[test]
fn usage_of_failed_attempts_counts_per_model_that_served_them() {
    let (mut j, t) = running_turn();
    let s = StepId::new();
    let u = |input_tokens| Usage {
        input_tokens,
        output_tokens: 1,
        ..Usage::default()
    };
    j.push(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    )
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepStarted { model: "a".into() },
    )
    .push(Correlation::step(t, s, 1), EventBody::StepStreaming {})
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepAttemptFailed {
            model: "a".into(),
            error_kind: "overloaded".into(),
            message: "".into(),
            retry_in_ms: None,
            responses_consumed: 0,
            usage: u(100_000),
            cost_usd: 0.3,
            usage_estimated: false,
        },
    )
    .push(
        Correlation::step(t, s, 2),
        EventBody::StepStarted { model: "b".into() },
    )
    .push(
        Correlation::step(t, s, 2),
        EventBody::StepFailed {
            error_kind: "server_error".into(),
            message: "".into(),
            responses_consumed: 0,
            usage: u(50),
            cost_usd: 0.001,
            usage_estimated: true,
        },
    );
    let state = SessionState::replay(&j.events).unwrap();
    let turn = &state.turns[&t];
    assert_eq!(
        turn.usage,
        Usage {
            input_tokens: 100_050,
            output_tokens: 2,
            ..Usage::default()
        }
    );
    assert!((turn.cost_usd - 0.301).abs() < 1e-9);
    assert_eq!(turn.usage_by_model["a"].usage, u(100_000));
    assert_eq!(turn.usage_by_model["a"].steps, 0, "no step completed");
    assert!(!turn.usage_by_model["a"].estimated);
    assert_eq!(turn.usage_by_model["b"].usage, u(50));
    assert!(turn.usage_by_model["b"].estimated);
    assert_eq!(state.usage, turn.usage);
    assert_eq!(state.usage_by_model, turn.usage_by_model);
    assert_eq!(state.num_steps, 0);
}

#[test]
fn missing_correlation_and_unknown_entities_are_named() {
    let (j, t) = running_turn();
    let err = refused(
        &j,
        j.next(Correlation::default(), EventBody::TurnStarted {}),
    );
    assert!(
        matches!(
            err,
            ApplyError::MissingCorrelation {
                field: "turn_id",
                seq: 5,
                ..
            }
        ),
        "{err}"
    );
    let err = refused(
        &j,
        j.next(
            Correlation::tool_call(t, StepId::new(), "nope".into()),
            EventBody::ToolCallValidating {},
        ),
    );
    assert!(
        matches!(
            err,
            ApplyError::UnknownEntity {
                entity: "tool_call",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("nope"));
}

#[test]
fn a_closed_session_takes_no_more_events() {
    let mut j = Journal::new();
    j.created().status(SessionStatus::Closed);
    let err = refused(
        &j,
        j.next(
            Correlation::turn(TurnId::new()),
            EventBody::TurnQueued {
                input: "x".into(),
                compiled: None,
            },
        ),
    );
    assert!(err.to_string().contains("closed"), "{err}");
}

#[test]
fn an_outcome_unknown_effect_can_be_dispatched_again_or_decided() {
    let (mut j, t) = running_turn();
    let s = StepId::new();
    let call = ToolCallId::from("c");
    let key = OperationKey::for_call(j.session, s, &call);
    j.push(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    )
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepStarted { model: "m".into() },
    )
    .push(Correlation::step(t, s, 1), EventBody::StepStreaming {})
    .push(
        Correlation::tool_call(t, s, call.clone()),
        EventBody::ToolCallProposed {
            name: "shell".into(),
            arguments: json!({}),
            sealed: false,
        },
    )
    .push(
        Correlation::tool_call(t, s, call.clone()).with_operation(key.clone()),
        EventBody::EffectPrepared {
            request_hash: "h".into(),
            probe: None,
        },
    )
    .push(
        Correlation::default().with_operation(key.clone()),
        EventBody::EffectDispatched {},
    )
    .push(
        Correlation::default().with_operation(key.clone()),
        EventBody::EffectOutcomeUnknown {},
    )
    .push(
        Correlation::default().with_operation(key.clone()),
        EventBody::EffectDispatched {},
    );
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.effects[&key].attempts, 2);
    assert_eq!(state.effects[&key].status, EffectStatus::Dispatched);
    j.push(
        Correlation::default().with_operation(key.clone()),
        EventBody::EffectFailed {
            error: "did not happen".into(),
        },
    );
    let err = refused(
        &j,
        j.next(
            Correlation::default().with_operation(key),
            EventBody::EffectCommitted {
                outcome: json!(null),
            },
        ),
    );
    assert!(matches!(err, ApplyError::Transition { .. }));
}

#[test]
fn a_session_with_an_active_turn_cannot_close() {
    let (j, _) = running_turn();
    let err = refused(
        &j,
        j.next(
            Correlation::default(),
            EventBody::SessionStatusChanged {
                status: SessionStatus::Closed,
                reason: None,
            },
        ),
    );
    assert!(err.to_string().contains("cannot close"), "{err}");
}

#[test]
fn effects_and_approvals_open_only_for_live_calls_of_the_active_turn() {
    let (mut j, t) = running_turn();
    let s = StepId::new();
    let call = ToolCallId::from("c");
    let key = OperationKey::for_call(j.session, s, &call);
    j.push(
        Correlation::turn(t),
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
    )
    .push(
        Correlation::step(t, s, 1),
        EventBody::StepStarted { model: "m".into() },
    )
    .push(Correlation::step(t, s, 1), EventBody::StepStreaming {})
    .push(
        Correlation::tool_call(t, s, call.clone()),
        EventBody::ToolCallProposed {
            name: "shell".into(),
            arguments: json!({}),
            sealed: false,
        },
    )
    .push(
        Correlation::tool_call(t, s, call.clone()),
        EventBody::ToolCallFinished {
            status: ToolCallStatus::Cancelled,
            output: "cancelled".into(),
            is_error: true,
        },
    );
    let err = refused(
        &j,
        j.next(
            Correlation::tool_call(t, s, call.clone()).with_operation(key),
            EventBody::EffectPrepared {
                request_hash: "h".into(),
                probe: None,
            },
        ),
    );
    assert!(err.to_string().contains("unfinished call"), "{err}");
    let err = refused(
        &j,
        j.next(
            Correlation::tool_call(t, s, call).with_approval(ApprovalId::new()),
            EventBody::ApprovalRequested {
                args_hash: "h".into(),
                expires_at: Utc::now(),
            },
        ),
    );
    assert!(err.to_string().contains("unfinished call"), "{err}");
}

#[test]
fn config_changes_merge_in_order_between_and_during_turns() {
    let mut j = Journal::new();
    j.push(
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: TenantId::new(),
            release_id: ReleaseId::from("r"),
            config: json!({"permission_mode": "default", "turn_budget": {"max_steps": 5}}),
        },
    )
    .push(
        Correlation::default(),
        EventBody::SessionConfigChanged {
            changes: json!({"permission_mode": "bypass", "turn_budget": {"max_cost_usd": 1.5}}),
        },
    )
    .push(
        Correlation::default(),
        EventBody::SessionConfigChanged {
            changes: json!({"turn_budget": {"max_steps": null}, "host": {"base_url": "http://h"}}),
        },
    );
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(
        state.config,
        json!({"permission_mode": "bypass", "turn_budget": {"max_cost_usd": 1.5},
            "host": {"base_url": "http://h"}})
    );

    let not_object = j.next(
        Correlation::default(),
        EventBody::SessionConfigChanged { changes: json!(3) },
    );
    assert!(matches!(refused(&j, not_object), ApplyError::Rule { .. }));

    // During a turn too: one left running by a crashed worker (the lease and CAS make the
    // writer the only one; `keel resume S --max-steps 5` after kill -9) …
    let (mut running, t) = running_turn();
    running.push(
        Correlation::default(),
        EventBody::SessionConfigChanged {
            changes: json!({"permission_mode": "accept_edits"}),
        },
    );
    let state = SessionState::replay(&running.events).unwrap();
    assert_eq!(state.config["permission_mode"], "accept_edits");
    // … and one suspended on a human.
    running
        .push(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        )
        .status(SessionStatus::RequiresAction)
        .push(
            Correlation::default(),
            EventBody::SessionConfigChanged {
                changes: json!({"permission_mode": "bypass"}),
            },
        );
    let state = SessionState::replay(&running.events).unwrap();
    assert_eq!(state.config["permission_mode"], "bypass");
}

/// `session.release_pinned` moves the session to another release between turns, only from the
/// release it has pinned; a re-pin during a turn (even one waiting on a human) is refused.
#[test]
fn a_release_is_re_pinned_between_turns_from_the_pinned_one_only() {
    let repin = |from: &str, to: &str| EventBody::SessionReleasePinned {
        from_release_id: ReleaseId::from(from),
        to_release_id: ReleaseId::from(to),
    };
    let mut j = Journal::new();
    j.created();
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.release_id, Some(ReleaseId::from("sha256:r")));

    // Not from the pinned release, or to the same one: refused.
    let err = refused(
        &j,
        j.next(Correlation::default(), repin("sha256:x", "sha256:b")),
    );
    assert!(err.to_string().contains("from_release_id"), "{err}");
    let err = refused(
        &j,
        j.next(Correlation::default(), repin("sha256:r", "sha256:r")),
    );
    assert!(matches!(err, ApplyError::Rule { .. }), "{err}");

    j.push(Correlation::default(), repin("sha256:r", "sha256:b"));
    let state = SessionState::replay(&j.events).unwrap();
    assert_eq!(state.release_id, Some(ReleaseId::from("sha256:b")));
    // The next one starts from the new release.
    let err = refused(
        &j,
        j.next(Correlation::default(), repin("sha256:r", "sha256:c")),
    );
    assert!(err.to_string().contains("from_release_id"), "{err}");
    j.push(Correlation::default(), repin("sha256:b", "sha256:c"));
    assert_eq!(
        SessionState::replay(&j.events).unwrap().release_id,
        Some(ReleaseId::from("sha256:c"))
    );

    // During a turn — running or waiting on a human — refused.
    let (mut running, t) = running_turn();
    let err = refused(
        &running,
        running.next(Correlation::default(), repin("sha256:r", "sha256:b")),
    );
    assert!(err.to_string().contains("between turns"), "{err}");
    running
        .push(
            Correlation::turn(t),
            EventBody::TurnPhaseChanged {
                phase: TurnStatus::Sampling,
            },
        )
        .status(SessionStatus::RequiresAction);
    let err = refused(
        &running,
        running.next(Correlation::default(), repin("sha256:r", "sha256:b")),
    );
    assert!(err.to_string().contains("between turns"), "{err}");
}
