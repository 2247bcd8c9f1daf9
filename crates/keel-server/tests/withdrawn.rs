//! A turn that ends while a call waits on its approval takes the approval with it: the approval
//! is no longer listed as pending (`expired` in the table, `approval.expired` in the journal),
//! and a late decision is refused with 409 saying the turn ended — nothing runs; a row the
//! turn's end left pending (a crash in between) is withdrawn by that refusal.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(a_cancelled_turn_withdraws_its_pending_approval_and_refuses_a_late_decision);

async fn a_cancelled_turn_withdraws_its_pending_approval_and_refuses_a_late_decision(b: Backend) {
    let s = start(b).await;
    let session = s.awaiting_approval("late.txt").await;
    let listed = format!("/v1/sessions/{session}/approvals?status=pending");
    let pending = s.get(&listed, &s.viewer).await.body;
    let a = pending["items"][0].clone();
    assert_eq!(a["status"], "pending", "{pending}");
    let path = format!("/v1/approvals/{}", a["approval_id"].as_str().unwrap());

    let r = s
        .post(
            &format!("/v1/sessions/{session}/cancel"),
            &s.operator,
            &json!({}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    s.wait_session(&session, |b| {
        b["status"] == "idle" && b["active_turn_id"].is_null()
    })
    .await;

    // Not listed as pending any more; the row says expired.
    let pending = s.get(&listed, &s.viewer).await.body;
    assert_eq!(pending["items"], json!([]), "{pending}");
    assert_eq!(s.get(&path, &s.viewer).await.body["status"], "expired");
    let tenant_pending = s.get("/v1/approvals?status=pending", &s.viewer).await;
    if tenant_pending.status == StatusCode::OK {
        assert_eq!(
            tenant_pending.body["items"],
            json!([]),
            "{tenant_pending:?}"
        );
    }

    // A late allow: 409 naming why, and nothing runs.
    late_allow_is_refused(&s, &path, &a).await;

    // The journal says so: `approval.expired` before the call's cancelled result.
    let expired = events_of(&s, &session, "approval.expired").await;
    let finished = events_of(&s, &session, "tool_call.finished").await;
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert!(
        expired[0]["seq"].as_u64() < finished[0]["seq"].as_u64(),
        "approval.expired before tool_call.finished: {expired:?} {finished:?}"
    );
    assert_eq!(
        finished[0]["payload"]["status"], "cancelled",
        "{finished:?}"
    );

    // A worker that died between the turn's end and the withdrawal left the row pending (as
    // if): it is listed until a decision is refused, which withdraws it (attack review).
    let id = a["approval_id"].as_str().unwrap();
    s.db.raw(&format!(
        "UPDATE approvals SET status = 'pending', decided_at = NULL WHERE approval_id = '{id}'"
    ))
    .await;
    assert_eq!(
        s.get(&listed, &s.viewer).await.body["items"][0]["status"],
        "pending"
    );
    late_allow_is_refused(&s, &path, &a).await;
    assert_eq!(s.get(&listed, &s.viewer).await.body["items"], json!([]));
}

/// Allows approval `a` (at `path`) after its turn ended: 409 saying the turn ended, the row
/// `expired`, and the call never ran.
async fn late_allow_is_refused(s: &TestServer, path: &str, a: &serde_json::Value) {
    let r = s
        .post(
            &format!("{path}/decision"),
            &s.operator,
            &json!({"decision": "allow_once", "args_hash": a["args_hash"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("turn ended (aborted)"), "{r:?}");
    assert_eq!(s.get(path, &s.viewer).await.body["status"], "expired");
    assert!(!s.workspace.join("late.txt").exists(), "the call ran");
}
