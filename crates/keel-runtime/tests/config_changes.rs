//! `Runtime::update_config`: settings changed between turns, journaled as
//! `session.config_changed`, used by every later step on any worker.

use std::time::Duration;

use keel_core::{BudgetLimit, EventBody, SessionStatus, TerminalReason};
use keel_runtime::{Runtime, RuntimeError};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_new_permission_mode_lets_a_call_that_needed_approval_run,
    a_stricter_permission_mode_denies_a_waiting_call_even_once_allowed,
    a_lower_max_steps_ends_the_next_turn_with_budget_exhausted,
    an_invalid_change_is_refused_and_writes_nothing,
    a_change_survives_a_restart,
    a_change_is_refused_while_a_worker_runs_the_session,
);

async fn a_new_permission_mode_lets_a_call_that_needed_approval_run(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "first"}))]}),
            json!({"tool_calls": [call("counter", json!({"label": "second"}))]}),
            json!({"text": "counted"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    // Allowed while the turn waits on a human; the approval already asked keeps waiting.
    let effective =
        f.rt.update_config(f.tenant, f.session, |c| {
            c.permission_mode = PermissionMode::Bypass
        })
        .await
        .unwrap();
    assert_eq!(effective.permission_mode, PermissionMode::Bypass);
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    assert!(f.counter_lines().is_empty());
    f.rt.submit(f.tenant, f.session, "count again")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(
        out.turns.last().unwrap().terminal_reason,
        TerminalReason::Completed
    );
    let lines = f.counter_lines();
    assert!(
        lines.len() == 1 && lines[0].ends_with(" second"),
        "only the second call ran: {lines:?}"
    );
    let types = f.types().await;
    assert_eq!(
        types.iter().filter(|t| **t == "approval.requested").count(),
        1,
        "the second call needed no approval: {types:?}"
    );
    let change = f
        .events()
        .await
        .into_iter()
        .find(|e| e.type_name() == "session.config_changed")
        .unwrap();
    assert_eq!(
        change.body,
        EventBody::SessionConfigChanged {
            changes: json!({"permission_mode": "bypass"})
        }
    );
}

/// A call waiting on a human when the session's mode is lowered to `read_only` is denied by the
/// next run without asking — even when a human allowed it meanwhile (`keel approve`, an editor
/// asked again): it never runs, and its approvals row leaves `pending`.
async fn a_stricter_permission_mode_denies_a_waiting_call_even_once_allowed(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "first"}))]}),
            json!({"text": "understood"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let Some(keel_runtime::PendingAction::Approval {
        approval_id,
        args_hash,
        ..
    }) = out.pending.first().cloned()
    else {
        panic!("an approval is pending: {:?}", out.pending)
    };
    f.rt.update_config(f.tenant, f.session, |c| {
        c.permission_mode = PermissionMode::ReadOnly
    })
    .await
    .unwrap();
    // The human allows it after the mode went down (the row still takes the decision).
    f.rt.decide_approval(
        f.tenant,
        approval_id,
        keel_core::ApprovalDecision::AllowOnce,
        &args_hash,
    )
    .await
    .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{:?}", out.pending);
    assert!(f.counter_lines().is_empty(), "the call did not run");
    let events = f.events().await;
    let decided = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ApprovalDecided { decision, .. } => Some(decision.clone()),
            _ => None,
        })
        .expect("the approval is decided in the journal");
    assert!(
        matches!(&decided, keel_core::ApprovalDecision::Deny { .. }),
        "denied by the policy: {decided:?}"
    );
    let finished = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, .. } => Some(*status),
            _ => None,
        })
        .expect("the call has a result");
    assert_eq!(finished, keel_core::ToolCallStatus::Rejected);
}

fn sleepy_lines(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| json!({"tool_calls": [call("sleep", json!({"ms": i}))]}))
        .collect()
}

async fn a_lower_max_steps_ends_the_next_turn_with_budget_exhausted(b: Backend) {
    let f = fixture(b, &sleepy_lines(5), |c| c.turn_budget.max_steps = Some(4)).await;
    f.rt.update_config(f.tenant, f.session, |c| c.turn_budget.max_steps = Some(1))
        .await
        .unwrap();
    f.rt.submit(f.tenant, f.session, "loop").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Steps), 1)
    );
}

async fn an_invalid_change_is_refused_and_writes_nothing(b: Backend) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let before = f.events().await.len();
    let missing = f.ws.path().join("no-such-dir");
    type Change = Box<dyn FnOnce(&mut keel_runtime::SessionConfig)>;
    let cases: Vec<Change> = vec![
        Box::new(|c| c.compact_at_fraction = 2.0),
        Box::new(|c| c.allow = vec!["shell(".into()]),
        Box::new(|c| c.turn_budget.max_cost_usd = Some(-1.0)),
        Box::new(move |c| c.workspace = missing),
        Box::new(|c| c.secret_patterns = vec!["sk-[a-z]+".into()]),
    ];
    for change in cases {
        let err =
            f.rt.update_config(f.tenant, f.session, change)
                .await
                .unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
    }
    // A change to the same values writes nothing either.
    f.rt.update_config(f.tenant, f.session, |c| c.loop_threshold = 3)
        .await
        .unwrap();
    assert_eq!(f.events().await.len(), before, "nothing written");
}

async fn a_change_survives_a_restart(b: Backend) {
    let f = fixture(b, &[], |c| c.turn_budget.max_steps = Some(4)).await;
    f.rt.update_config(f.tenant, f.session, |c| {
        c.turn_budget.max_steps = Some(1);
        c.sandbox = keel_tools::sandbox::SandboxMode::ReadOnly;
        c.host
            .insert("base_url".into(), json!("http://127.0.0.1:9/v1"));
    })
    .await
    .unwrap();
    drop(f.rt);
    // A new process over the same database.
    let rt = Runtime::new(
        second_store(&f.db).await,
        scripted(&sleepy_lines(5)),
        registry(),
        keel_runtime::RuntimeOptions::default(),
    );
    let view = rt.view(f.tenant, f.session).await.unwrap();
    assert_eq!(view.state.config["turn_budget"]["max_steps"], 1);
    assert_eq!(view.state.config["sandbox"], "read_only");
    assert_eq!(
        view.state.config["host"]["base_url"],
        "http://127.0.0.1:9/v1"
    );
    rt.submit(f.tenant, f.session, "loop").await.unwrap();
    let out = rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        (out.turns[0].terminal_reason, out.turns[0].num_steps),
        (TerminalReason::BudgetExhausted, 1)
    );
}

async fn a_change_is_refused_while_a_worker_runs_the_session(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 30_000}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "sleep").await.unwrap();
    let runner = {
        let rt = f.rt.clone();
        let (tenant, session) = (f.tenant, f.session);
        tokio::spawn(async move { rt.run(tenant, session).await })
    };
    while !f.types().await.contains(&"tool_call.started") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = f.events().await.len();
    let here =
        f.rt.update_config(f.tenant, f.session, |c| c.loop_threshold = 9)
            .await
            .unwrap_err();
    assert!(matches!(here, RuntimeError::SessionBusy { .. }), "{here}");
    let other = other_process(&f.db).await;
    let there = other
        .update_config(f.tenant, f.session, |c| c.loop_threshold = 9)
        .await
        .unwrap_err();
    assert!(matches!(there, RuntimeError::SessionBusy { .. }), "{there}");
    assert!(there.to_string().contains("is being run by"), "{there}");
    assert_eq!(f.events().await.len(), before, "nothing written");
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    runner.await.unwrap().unwrap();
}
