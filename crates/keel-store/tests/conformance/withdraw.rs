//! Withdrawing an ended turn's approvals (`Store::withdraw_turn_approvals`).

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use serde_json::json;

use super::harness::{Harness, session};

/// A turn's end withdraws its pending approvals only: `pending` rows of that turn become
/// `expired` whatever their expiry; decided rows, other turns' and other tenants' stay.
pub async fn withdrawing_a_turns_approvals_expires_only_its_pending_rows(h: &Harness) {
    let t = TenantId::new();
    let other_tenant = TenantId::new();
    let f = session(&h.store, t).await;
    let g = session(&h.store, other_tenant).await;
    let (turn, other_turn) = (TurnId::new(), TurnId::new());
    let now = Utc::now();
    let mk = |s: SessionId, tr: TurnId, c: &str| {
        ApprovalRecord::request(
            s,
            tr,
            ToolCallId::from(c),
            "shell",
            json!({"command": c}),
            now,
            ChronoDuration::hours(1),
        )
    };
    let pending = mk(f.session, turn, "a");
    let decided = mk(f.session, turn, "b");
    let later_turn = mk(f.session, other_turn, "c");
    let foreign = mk(g.session, turn, "d");
    for a in [&pending, &decided, &later_turn] {
        h.store.create_approval(t, a).await.unwrap();
    }
    h.store
        .create_approval(other_tenant, &foreign)
        .await
        .unwrap();
    h.store
        .decide_approval(
            t,
            decided.approval_id,
            ApprovalDecision::AllowOnce,
            &decided.args_hash,
            now,
        )
        .await
        .unwrap();

    // Another tenant's call names this tenant's session and turn: nothing moves.
    let none = h
        .store
        .withdraw_turn_approvals(other_tenant, f.session, turn, now)
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");

    let withdrawn = h
        .store
        .withdraw_turn_approvals(t, f.session, turn, now)
        .await
        .unwrap();
    assert_eq!(withdrawn, vec![pending.approval_id]);
    let row = h.store.get_approval(t, pending.approval_id).await.unwrap();
    assert_eq!(
        row.status,
        ApprovalStatus::Expired,
        "not due, still withdrawn"
    );
    assert!(row.decided_at.is_some());
    // A late decision is refused as for any expired approval.
    assert!(
        h.store
            .decide_approval(
                t,
                pending.approval_id,
                ApprovalDecision::AllowOnce,
                &pending.args_hash,
                now,
            )
            .await
            .is_err()
    );
    let status = |id| async move { h.store.get_approval(t, id).await.unwrap().status };
    assert_eq!(status(decided.approval_id).await, ApprovalStatus::Allowed);
    assert_eq!(
        status(later_turn.approval_id).await,
        ApprovalStatus::Pending
    );
    assert_eq!(
        h.store
            .get_approval(other_tenant, foreign.approval_id)
            .await
            .unwrap()
            .status,
        ApprovalStatus::Pending
    );
    // Again: nothing left to withdraw.
    assert!(
        h.store
            .withdraw_turn_approvals(t, f.session, turn, now)
            .await
            .unwrap()
            .is_empty()
    );
    // An unknown session: empty, not an error.
    assert!(
        h.store
            .withdraw_turn_approvals(t, SessionId::new(), turn, now)
            .await
            .unwrap()
            .is_empty()
    );
}
