use super::*;
use serde_json::json;

fn sample_bodies() -> Vec<EventBody> {
    vec![
        EventBody::SessionCreated {
            tenant_id: TenantId::new(),
            release_id: ReleaseId::from("sha256:00"),
            config: json!({"workspace": "/w"}),
        },
        EventBody::SessionStatusChanged {
            status: SessionStatus::Running,
            reason: None,
        },
        EventBody::SessionConfigChanged {
            changes: json!({"permission_mode": "bypass", "turn_budget": {"max_steps": 1}}),
        },
        EventBody::SessionReleasePinned {
            from_release_id: ReleaseId::from("sha256:00"),
            to_release_id: ReleaseId::from("sha256:01"),
        },
        EventBody::TurnQueued {
            input: "fix the bug\n\n<attached>".into(),
            compiled: Some(CompiledInput {
                raw: "/fix @src/a.rs".into(),
                command: Some("fix".into()),
                command_file: Some(".keel/commands/fix.md".into()),
                attachments: vec![Attachment {
                    path: "src/a.rs".into(),
                    chars: 12,
                    truncated: false,
                }],
            }),
        },
        EventBody::TurnCancelRequested {
            reason: "cancelled by user".into(),
        },
        EventBody::TurnStarted {},
        EventBody::TurnPhaseChanged {
            phase: TurnStatus::Sampling,
        },
        EventBody::TurnFinished {
            terminal_reason: TerminalReason::BudgetExhausted,
            limit: Some(BudgetLimit::Steps),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            cost_usd: 0.25,
            usage_by_model: [(
                "openai:gpt-5".to_owned(),
                crate::ModelTotals {
                    usage: Usage {
                        input_tokens: 10,
                        output_tokens: 5,
                        ..Usage::default()
                    },
                    cost_usd: 0.25,
                    steps: 3,
                    estimated: false,
                },
            )]
            .into(),
            num_steps: 3,
            duration_ms: 1200,
            error: None,
        },
        EventBody::StepStarted {
            model: "openai:gpt-5".into(),
        },
        EventBody::StepStreaming {},
        EventBody::StepAttemptFailed {
            model: "openai:gpt-5".into(),
            error_kind: "rate_limited".into(),
            message: "slow down".into(),
            retry_in_ms: Some(100),
            responses_consumed: 1,
            usage: Usage {
                input_tokens: 7,
                ..Usage::default()
            },
            cost_usd: 0.01,
            usage_estimated: false,
        },
        EventBody::StepCompleted {
            model: "openai:gpt-5".into(),
            stop_reason: "tool_use".into(),
            usage: Usage::default(),
            cost_usd: 0.0,
            text: "calling a tool".into(),
            reasoning: vec![json!({"provider": "openai", "id": "rs_1"})],
            reasoning_sealed: 0,
            responses_consumed: 1,
            usage_estimated: false,
            abandoned_calls: Vec::new(),
        },
        EventBody::StepFailed {
            error_kind: "authentication".into(),
            message: "bad key".into(),
            responses_consumed: 1,
            usage: Usage::default(),
            cost_usd: 0.0,
            usage_estimated: false,
        },
        EventBody::ToolCallProposed {
            name: "shell".into(),
            arguments: json!({"command": "ls"}),
            sealed: false,
        },
        EventBody::ToolCallValidating {},
        EventBody::ToolCallAwaitingApproval {},
        EventBody::ToolCallStarted {},
        EventBody::ToolCallFinished {
            status: ToolCallStatus::Succeeded,
            output: "a\nb".into(),
            is_error: false,
        },
        EventBody::EffectPrepared {
            request_hash: "sha256:ab".into(),
            probe: Some(json!({"before": null, "after": "sha256:cd"})),
        },
        EventBody::EffectDispatched {},
        EventBody::EffectOutcomeUnknown {},
        EventBody::EffectCommitted {
            outcome: json!({"exit_code": 0}),
        },
        EventBody::EffectFailed {
            error: "not found".into(),
        },
        EventBody::EffectDecided {
            decision: EffectDecision::Retry,
            reconciled: false,
        },
        EventBody::ApprovalRequested {
            args_hash: "sha256:cd".into(),
            expires_at: Utc::now(),
        },
        EventBody::ApprovalDecided {
            decision: ApprovalDecision::Deny {
                reason: "no".into(),
            },
            hook: None,
        },
        EventBody::ApprovalExpired {},
        EventBody::ContextCompacted {
            summary: "s".into(),
            first_kept_item: 4,
            tokens_before: 1000,
            tokens_after: 100,
            requested: false,
            focus: None,
        },
        EventBody::HookRan {
            hook: "audit".into(),
            event: HookEvent::PreToolUse,
            duration_ms: 12,
            decision: HookDecision::Rewrite,
            reason: Some("use the dry run".into()),
            arguments: Some(json!({"command": "make -n"})),
            sealed: false,
            context: None,
            error: None,
        },
        EventBody::AgentSpawned {
            agent: "reviewer".into(),
            child_session_id: SessionId::new(),
            release_id: ReleaseId::from("sha256:01"),
        },
        EventBody::AgentFinished {
            child_session_id: SessionId::new(),
            reason: "completed".into(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            cost_usd: 0.01,
            usage_by_model: UsageByModel::new(),
            tool_calls: 3,
        },
    ]
}

/// A compaction asked for between turns (no turn) is written at 3: a schema-2 build could
/// not fold it.
#[test]
fn a_requested_compaction_is_written_at_schema_3() {
    let body = EventBody::ContextCompacted {
        summary: "s".into(),
        first_kept_item: 4,
        tokens_before: 1000,
        tokens_after: 100,
        requested: true,
        focus: Some("the API".into()),
    };
    let ev = Event::new(
        SessionId::new(),
        1,
        Utc::now(),
        Correlation::default(),
        body,
    );
    assert_eq!(ev.schema_version, 3);
    let back = Event::decode(&ev.encode()).unwrap();
    assert_eq!(back.body, ev.body);
}

/// A journal written before hooks existed reads as before: `approval.decided` without
/// `hook`.
/// Hook events are the only ones a schema-2 build cannot read: they alone are written at
/// 3 (and sub-agent events, which a schema-3 build cannot read, at 4), so a session
/// without them stays readable (and claimable) by older workers.
#[test]
fn only_hook_and_agent_events_are_written_above_schema_2() {
    for body in sample_bodies() {
        let ev = Event::new(
            SessionId::new(),
            1,
            Utc::now(),
            Correlation::default(),
            body,
        );
        let hook = matches!(
            ev.body,
            EventBody::HookRan { .. } | EventBody::ApprovalDecided { hook: Some(_), .. }
        );
        let agent = matches!(
            ev.body,
            EventBody::AgentSpawned { .. } | EventBody::AgentFinished { .. }
        );
        let expected = if agent {
            4
        } else if hook {
            3
        } else {
            2
        };
        assert_eq!(ev.schema_version, expected, "{:?}", ev.body);
        let v: Value = serde_json::from_str(&ev.encode()).unwrap();
        assert_eq!(v["schema_version"], ev.schema_version);
    }
    let human = EventBody::ApprovalDecided {
        decision: ApprovalDecision::AllowOnce,
        hook: None,
    };
    assert_eq!(human.schema_version(), 2);
}

#[test]
fn an_approval_decided_without_a_hook_reads_as_before() {
    let body: EventBody = serde_json::from_value(
        json!({"type": "approval.decided", "payload": {"decision": {"decision": "allow_once"}}}),
    )
    .unwrap();
    assert_eq!(
        body,
        EventBody::ApprovalDecided {
            decision: ApprovalDecision::AllowOnce,
            hook: None
        }
    );
}

#[test]
fn an_effect_prepared_without_a_probe_reads_as_before() {
    // As written before `probe` existed.
    let body: EventBody = serde_json::from_value(
        json!({"type": "effect.prepared", "payload": {"request_hash": "sha256:ab"}}),
    )
    .unwrap();
    assert_eq!(
        body,
        EventBody::EffectPrepared {
            request_hash: "sha256:ab".into(),
            probe: None
        }
    );
}

#[test]
fn every_event_type_round_trips_through_json() {
    let bodies = sample_bodies();
    assert_eq!(bodies.len(), EVENT_TYPES.len(), "one sample per event type");
    let session = SessionId::new();
    for (i, body) in bodies.into_iter().enumerate() {
        assert_eq!(body.type_name(), EVENT_TYPES[i]);
        let corr = Correlation::tool_call(TurnId::new(), StepId::new(), "call_1".into())
            .with_attempt(2)
            .with_operation(OperationKey::from("k"))
            .with_approval(ApprovalId::new());
        let ev = Event::new(session, i as u64 + 1, Utc::now(), corr, body);
        let text = ev.encode();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], EVENT_TYPES[i]);
        assert_eq!(v["schema_version"], ev.body.schema_version());
        assert_eq!(v["tool_call_id"], "call_1");
        assert_eq!(Event::decode(&text).unwrap(), ev);
    }
}

#[test]
fn the_typed_fast_path_reads_every_version_it_takes_as_the_upgrading_path_does() {
    let session = SessionId::new();
    for (i, body) in sample_bodies().into_iter().enumerate() {
        let ev = Event::new(
            session,
            i as u64 + 1,
            Utc::now(),
            Correlation::default(),
            body,
        );
        for version in UNCHANGED_SINCE..=SCHEMA_VERSION {
            let mut value = serde_json::to_value(&ev).unwrap();
            value["schema_version"] = json!(version);
            // `upgrade` leaves an event of these versions as it is...
            let mut upgraded = value.clone();
            upgrade(&mut upgraded, version).unwrap();
            assert_eq!(upgraded, value, "{} at version {version}", ev.type_name());
            // ...so the fast path (typed) and the path through a `Value` read the same event.
            let fast = Event::decode(&value.to_string()).unwrap();
            assert_eq!(fast, Event::decode_value(value).unwrap());
        }
    }
    // Versions outside the range still take the upgrading path: 1 is upgraded even when it
    // also carries a `ts` the typed parse would accept, and a newer one is refused.
    let both = json!({"schema_version": 1, "session_id": session.to_string(), "seq": 1,
        "ts_ms": 1_000, "ts": "2026-01-01T00:00:00Z", "type": "turn.started", "payload": {}});
    assert_eq!(
        Event::decode(&both.to_string())
            .unwrap()
            .ts
            .timestamp_millis(),
        1_000
    );
    let newer = json!({"schema_version": SCHEMA_VERSION + 1, "session_id": session.to_string(),
        "seq": 1, "ts": "2026-01-01T00:00:00Z", "type": "turn.started"});
    assert!(matches!(
        Event::decode(&newer.to_string()).unwrap_err().kind,
        DecodeErrorKind::NewerSchema { .. }
    ));
}

#[test]
fn absent_correlation_ids_are_omitted() {
    let ev = Event::new(
        SessionId::new(),
        1,
        Utc::now(),
        Correlation::turn(TurnId::new()),
        EventBody::TurnStarted {},
    );
    let v: Value = serde_json::from_str(&ev.encode()).unwrap();
    assert!(v.get("step_id").is_none());
    assert!(v.get("turn_id").is_some());
}

#[test]
fn a_newer_schema_is_refused_with_session_and_seq() {
    let s = SessionId::new();
    let text = json!({"schema_version": 99, "session_id": s.to_string(), "seq": 5, "type": "turn.started"})
        .to_string();
    let err = Event::decode(&text).unwrap_err();
    assert_eq!(err.session_id, Some(s));
    assert_eq!(err.seq, Some(5));
    assert_eq!(
        err.kind,
        DecodeErrorKind::NewerSchema {
            found: 99,
            supported: SCHEMA_VERSION
        }
    );
    assert!(err.to_string().contains("upgrade keel"), "{err}");
}

#[test]
fn an_unknown_type_is_refused_with_session_and_seq() {
    let s = SessionId::new();
    let text = json!({"schema_version": 2, "session_id": s.to_string(), "seq": 3,
        "ts": "2026-01-01T00:00:00Z", "type": "turn.teleported"})
    .to_string();
    let err = Event::decode(&text).unwrap_err();
    assert_eq!(
        err.kind,
        DecodeErrorKind::UnknownType("turn.teleported".into())
    );
    assert_eq!((err.session_id, err.seq), (Some(s), Some(3)));
}

#[test]
fn a_schema_1_event_is_upgraded() {
    let s = SessionId::new();
    let t = TurnId::new();
    let text = json!({"schema_version": 1, "session_id": s.to_string(), "seq": 2,
        "ts_ms": 1_764_468_928_123_i64, "type": "turn.queued", "turn_id": t.to_string(),
        "payload": {"input": "hi"}})
    .to_string();
    let ev = Event::decode(&text).unwrap();
    assert_eq!(ev.schema_version, 2);
    assert_eq!(ev.ts.timestamp_millis(), 1_764_468_928_123);
    assert_eq!(ev.correlation.turn_id, Some(t));
    assert_eq!(
        ev.body,
        EventBody::TurnQueued {
            input: "hi".into(),
            compiled: None
        }
    );
}

#[test]
fn schema_version_zero_is_refused() {
    let text = json!({"schema_version": 0, "session_id": SessionId::new().to_string(), "seq": 1,
        "ts_ms": 0, "type": "turn.started"})
    .to_string();
    assert!(matches!(
        Event::decode(&text).unwrap_err().kind,
        DecodeErrorKind::Malformed(_)
    ));
}

#[test]
fn malformed_events_are_typed_errors() {
    assert!(matches!(
        Event::decode("{").unwrap_err().kind,
        DecodeErrorKind::Malformed(_)
    ));
    let s = SessionId::new();
    let bad_payload = json!({"schema_version": 2, "session_id": s.to_string(), "seq": 1,
        "ts": "2026-01-01T00:00:00Z", "type": "turn.queued", "payload": {"input": 5}})
    .to_string();
    let err = Event::decode(&bad_payload).unwrap_err();
    assert!(matches!(err.kind, DecodeErrorKind::Malformed(_)));
    assert_eq!(err.seq, Some(1));
    let v1_without_ts =
        json!({"schema_version": 1, "session_id": s.to_string(), "seq": 1, "type": "turn.started"});
    assert!(matches!(
        Event::decode(&v1_without_ts.to_string()).unwrap_err().kind,
        DecodeErrorKind::Malformed(_)
    ));
}
