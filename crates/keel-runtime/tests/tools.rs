//! Tool calls in the loop: approvals as durable waits, policy denials, invalid calls.

use keel_core::{ApprovalDecision, EventBody, SessionStatus, TerminalReason, ToolCallStatus};
use keel_runtime::PendingAction;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_denied_call_gets_a_rejected_result_the_model_reads,
    unknown_tools_invalid_arguments_and_policy_denials_each_get_one_result,
    an_approved_call_runs_on_the_next_run_and_the_turn_completes
);

async fn an_approved_call_runs_on_the_next_run_and_the_turn_completes(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "counted"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let [
        PendingAction::Approval {
            approval_id,
            args_hash,
            tool_name,
            ..
        },
    ] = out.pending.as_slice()
    else {
        panic!("{:?}", out.pending)
    };
    assert_eq!(tool_name, "counter");
    assert!(
        f.counter_lines().is_empty(),
        "nothing ran before the decision"
    );
    // A decision for other arguments is refused and changes nothing.
    assert!(
        f.rt.decide_approval(
            f.tenant,
            *approval_id,
            ApprovalDecision::AllowOnce,
            "sha256:other"
        )
        .await
        .is_err()
    );
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::AllowOnce,
        args_hash,
    )
    .await
    .unwrap();
    // Any worker resumes it: a second runtime over the same store.
    let other = runtime(
        &f.db,
        scripted(&[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "counted"}),
        ]),
    );
    let out = other.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::Completed,
        "{out:?}"
    );
    assert_eq!(f.counter_lines().len(), 1);
    let types = f.types().await;
    for t in [
        "approval.requested",
        "tool_call.awaiting_approval",
        "approval.decided",
        "effect.committed",
    ] {
        assert!(types.contains(&t), "{t}");
    }
}

async fn a_denied_call_gets_a_rejected_result_the_model_reads(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "ok, not counting"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let [
        PendingAction::Approval {
            approval_id,
            args_hash,
            ..
        },
    ] = out.pending.as_slice()
    else {
        panic!()
    };
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::Deny {
            reason: "not today".into(),
        },
        args_hash,
    )
    .await
    .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let evs = f.events().await;
    let (status, output) = evs
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(status, ToolCallStatus::Rejected);
    assert!(output.contains("not today"), "{output}");
    assert!(f.counter_lines().is_empty());
}

async fn unknown_tools_invalid_arguments_and_policy_denials_each_get_one_result(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("teleport", json!({})), call("read_file", json!({"nope": 1})), call("counter", json!({"label": "x"}))]}),
            json!({"text": "understood"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
            c.deny = vec!["counter".into()];
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "try things")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let finished: Vec<ToolCallStatus> = f
        .events()
        .await
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(
        finished,
        [
            ToolCallStatus::Rejected,
            ToolCallStatus::Rejected,
            ToolCallStatus::Rejected
        ]
    );
}
