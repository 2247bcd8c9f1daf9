//! Approval expiry acted on by `Runtime::run_due`.

use std::time::Duration;

use chrono::Utc;
use keel_core::{EventBody, SessionStatus, TerminalReason, ToolCallStatus};
use keel_runtime::PendingAction;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(an_expired_approval_rejects_its_call_and_the_turn_continues_when_due);

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
