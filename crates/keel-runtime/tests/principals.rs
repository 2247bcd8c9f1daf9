//! `Runtime::acting_as`: every change a caller makes through an acting handle names the caller
//! in the journal (the envelope's `principal_id`), on whichever path it is journaled — directly,
//! through another process's intent, through the approvals table — and what the runtime does on
//! its own names nobody.

use std::time::Duration;

use keel_core::{ApprovalDecision, EffectDecision, Event, PrincipalId, ToolCallId};
use keel_runtime::PendingAction;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    changes_made_through_an_acting_handle_name_the_principal,
    cancellations_through_another_process_name_the_principal,
);

fn by_type(evs: &[Event], ty: &str) -> Vec<Option<PrincipalId>> {
    evs.iter()
        .filter(|e| e.type_name() == ty)
        .map(|e| e.correlation.principal_id)
        .collect()
}

/// Create, change settings, submit, decide an approval, resolve nothing (none unknown), cancel
/// a waiting turn and close: each journaled change carries the acting principal; the runtime's
/// own events (turn.started, step.*, status changes it makes) carry none, and a plain handle's
/// changes carry none.
async fn changes_made_through_an_acting_handle_name_the_principal(b: Backend) {
    let db = db(b).await;
    let ws = workspace();
    let plain = runtime(
        &db,
        scripted(&[
            json!({"tool_calls": [call("counter", json!({"label": "one"}))]}),
            json!({"text": "done"}),
            json!({"tool_calls": [call("counter", json!({"label": "two"}))]}),
        ]),
    );
    let alice = PrincipalId::new();
    let rt = plain.acting_as(alice);
    assert_eq!(rt.actor(), Some(alice));
    assert_eq!(plain.actor(), None);
    let tenant = keel_core::TenantId::new();
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Default;
    let session = rt
        .create_session(tenant, &release(&["counter"], Default::default()), cfg)
        .await
        .unwrap();
    rt.update_config(tenant, session, |c| c.loop_threshold = 5)
        .await
        .unwrap();
    rt.submit(tenant, session, "count").await.unwrap();
    let out = plain.run(tenant, session).await.unwrap();
    let Some(PendingAction::Approval {
        approval_id,
        args_hash,
        ..
    }) = out.pending.first().cloned()
    else {
        panic!("expected an approval: {out:?}")
    };
    rt.decide_approval(tenant, approval_id, ApprovalDecision::AllowOnce, &args_hash)
        .await
        .unwrap();
    assert_eq!(
        db.store
            .get_approval(tenant, approval_id)
            .await
            .unwrap()
            .decided_by,
        Some(alice)
    );
    plain.run(tenant, session).await.unwrap();
    // A second turn by a plain handle waits on an approval; the acting handle cancels it.
    plain.submit(tenant, session, "again").await.unwrap();
    plain.run(tenant, session).await.unwrap();
    rt.cancel_turn(tenant, session).await.unwrap();
    rt.close_session(tenant, session).await.unwrap();
    let evs = db.store.read(tenant, session, 1, None).await.unwrap();
    let a = Some(alice);
    assert_eq!(by_type(&evs, "session.created"), vec![a]);
    assert_eq!(by_type(&evs, "session.config_changed"), vec![a]);
    assert_eq!(by_type(&evs, "turn.queued"), vec![a, None]);
    assert_eq!(by_type(&evs, "approval.decided"), vec![a]);
    assert_eq!(by_type(&evs, "turn.cancel_requested"), vec![a]);
    let closed: Vec<_> = evs
        .iter()
        .filter(|e| {
            matches!(
                &e.body,
                keel_core::EventBody::SessionStatusChanged {
                    status: keel_core::SessionStatus::Closed,
                    ..
                }
            )
        })
        .map(|e| e.correlation.principal_id)
        .collect();
    assert_eq!(closed, vec![a]);
    for ty in [
        "turn.started",
        "step.started",
        "step.completed",
        "turn.finished",
    ] {
        assert!(
            by_type(&evs, ty).iter().all(Option::is_none),
            "{ty} is the runtime's own"
        );
    }
    // An effect decision names its principal too (none is unknown here: refused, nothing
    // written).
    let before = evs.len();
    assert!(
        rt.resolve_effect(
            tenant,
            session,
            &keel_core::OperationKey("nope".into()),
            EffectDecision::Retry
        )
        .await
        .is_err()
    );
    assert_eq!(
        db.store.read(tenant, session, 1, None).await.unwrap().len(),
        before
    );
}

/// A cancellation asked through another process (an intent the worker running the session
/// handles) still names the principal: `turn.cancel_requested` for the turn, and the cancelled
/// call's `tool_call.finished`.
async fn cancellations_through_another_process_name_the_principal(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]}),
            json!({"tool_calls": [call("sleep", json!({"ms": 60000}))]}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "sleep").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let bob = PrincipalId::new();
    let other = other_process(&f.db).await.acting_as(bob);
    other
        .cancel_tool_call(f.tenant, f.session, &ToolCallId::from("call_1_0"))
        .await
        .unwrap();
    // The second step sleeps again; cancel the turn from the other process.
    loop {
        let started = f
            .events()
            .await
            .iter()
            .filter(|e| e.type_name() == "tool_call.started")
            .count();
        if started >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    other.cancel_turn(f.tenant, f.session).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the run ends once cancelled")
        .unwrap()
        .unwrap();
    let evs = f.events().await;
    let finished = by_type(&evs, "tool_call.finished");
    assert_eq!(finished[0], Some(bob), "the call bob cancelled");
    assert_eq!(by_type(&evs, "turn.cancel_requested"), vec![Some(bob)]);
}
