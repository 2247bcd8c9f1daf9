//! Approval expiry acted on by `Runtime::run_due`, and what a turn's end journals for an
//! approval still open in the journal.

use std::time::Duration;

use chrono::Utc;
use keel_core::{ApprovalDecision, EventBody, SessionStatus, TerminalReason, ToolCallStatus};
use keel_runtime::PendingAction;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(an_expired_approval_rejects_its_call_and_the_turn_continues_when_due);
on_both!(a_decision_made_while_nothing_ran_is_journaled_when_the_turn_is_cancelled);

async fn an_expired_approval_rejects_its_call_and_the_turn_continues_when_due(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "went on without it"}),
        ],
        |c| {
            c.permission_mode = PermissionMode::Default;
            c.approval_ttl_ms = 300;
        },
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let before = Utc::now();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let PendingAction::Approval { expires_at, .. } = &out.pending[0] else {
        panic!("{:?}", out.pending)
    };
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.wake_at, Some(*expires_at), "the durable timer is set");
    // Not due yet at a time before the expiry.
    assert!(f.rt.run_due(f.tenant, before).await.unwrap().is_empty());
    while Utc::now() <= *expires_at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let outs = f.rt.run_due(f.tenant, Utc::now()).await.unwrap();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].status, SessionStatus::Idle);
    assert_eq!(outs[0].turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(outs[0].turns[0].final_text, "went on without it");
    assert!(f.counter_lines().is_empty());
    let evs = f.events().await;
    assert!(evs.iter().any(|e| e.type_name() == "approval.expired"));
    let (status, output) = evs
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(status, ToolCallStatus::Rejected);
    assert!(output.contains("expired"), "{output}");
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.wake_at, None, "the timer is cleared");
}

/// `keel approve` while no process runs the session, then `keel cancel`: the journal records
/// the human's decision (`approval.decided`, by whom), not `approval.expired`, and the call
/// ends cancelled, unrun. A README-only user found the allow erased from the journal.
async fn a_decision_made_while_nothing_ran_is_journaled_when_the_turn_is_cancelled(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "never sampled"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let PendingAction::Approval {
        approval_id,
        args_hash,
        ..
    } = &out.pending[0]
    else {
        panic!("{:?}", out.pending)
    };
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::AllowOnce,
        args_hash,
    )
    .await
    .unwrap();
    // No process runs the session: the cancel ends the turn itself.
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert!(f.counter_lines().is_empty(), "the call was not run");
    let evs = f.events().await;
    let types: Vec<&str> = evs.iter().map(|e| e.type_name()).collect();
    assert!(
        evs.iter().any(|e| matches!(
            &e.body,
            EventBody::TurnFinished {
                terminal_reason: TerminalReason::Aborted,
                ..
            }
        )),
        "{types:?}"
    );
    assert!(!types.contains(&"approval.expired"), "{types:?}");
    let decided = evs
        .iter()
        .find(|e| e.type_name() == "approval.decided")
        .unwrap_or_else(|| panic!("no approval.decided: {types:?}"));
    assert!(
        matches!(
            &decided.body,
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::AllowOnce,
                hook: None
            }
        ),
        "{decided:?}"
    );
    let status = evs
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, .. } => Some(*status),
            _ => None,
        })
        .unwrap();
    assert_eq!(status, ToolCallStatus::Cancelled);
}
