//! The runtime's work mark (`keel_runtime::journal::work_mark`, written with every commit for
//! the scheduler) against the session's state machine, over a session's whole life: a turn that
//! waits on an approval and continues once it is decided, two queued turns of which the first is
//! cancelled before it starts, a turn cancelled while it waits on a human, a turn interrupted
//! by a newer input, and closing. A commit can end after any event (checkpoints commit what is
//! staged), so the mark is checked after every event of the journal; at each stop between the
//! calls, the store's scheduler view of the session row (claimable, queued turns) is checked too.

use std::time::Duration;

use chrono::Utc;
use keel_core::{
    ApprovalDecision, Event, EventBody, SCHEMA_VERSION, SessionState, SessionStatus, StateMachine,
};
use keel_runtime::journal::work_mark;
use keel_runtime::{MultitaskStrategy, PendingAction};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(the_work_mark_follows_the_session_through_its_life);

/// `(event type, runnable, queued turns)` after each event, folded from the start.
fn marks(events: &[Event]) -> Vec<(String, bool, u32)> {
    let mut state = SessionState::default();
    events
        .iter()
        .map(|e| {
            state.apply(e).unwrap();
            let m = work_mark(&state);
            let name = match &e.body {
                EventBody::SessionStatusChanged { status, .. } => {
                    format!("session.status_changed({})", status.as_str())
                }
                _ => e.type_name().to_owned(),
            };
            (name, m.runnable, m.queued_turns)
        })
        .collect()
}

/// What a scheduler sees of the fixture's session now: `(claimable, queued turns)` — its
/// tenant's claimable sessions (marked runnable, a due wake-up time or an intent; lease free)
/// and queued turns, from the session rows.
async fn scheduler_view(f: &Fixture) -> (u64, u64) {
    let store = &f.db.store;
    let claimable = store
        .runnable_tenants(Utc::now(), SCHEMA_VERSION, 100)
        .await
        .unwrap()
        .iter()
        .find(|t| t.tenant_id == f.tenant)
        .map_or(0, |t| t.claimable);
    let (queued, _) = store.queue_depth(f.tenant).await.unwrap();
    (claimable, queued)
}

async fn the_work_mark_follows_the_session_through_its_life(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "counted"}),
            json!({"tool_calls": [call("counter", json!({"label": "y"}))]}),
            json!({"text": "slow", "delay_ms": 2500}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    let (rt, tenant, session) = (&f.rt, f.tenant, f.session);
    assert_eq!(scheduler_view(&f).await, (0, 0), "created");

    // T1 waits on an approval, then runs to its end once it is allowed.
    rt.submit(tenant, session, "count").await.unwrap();
    assert_eq!(scheduler_view(&f).await, (1, 1), "queued");
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert_eq!(scheduler_view(&f).await, (0, 0), "waits on a human");
    let [
        PendingAction::Approval {
            approval_id,
            args_hash,
            ..
        },
    ] = out.pending.as_slice()
    else {
        panic!("{:?}", out.pending)
    };
    rt.decide_approval(tenant, *approval_id, ApprovalDecision::AllowOnce, args_hash)
        .await
        .unwrap();
    assert_eq!(scheduler_view(&f).await, (1, 0), "decided: due now");
    assert_eq!(
        rt.run(tenant, session).await.unwrap().status,
        SessionStatus::Idle
    );
    assert_eq!(scheduler_view(&f).await, (0, 0), "idle");

    // T2 and T3 queued; T2 is cancelled before it starts (nobody runs the session: the
    // cancelling call ends it and starts nothing).
    rt.submit(tenant, session, "second").await.unwrap();
    rt.submit(tenant, session, "third").await.unwrap();
    assert_eq!(scheduler_view(&f).await, (1, 2), "two queued");
    rt.cancel_turn(tenant, session).await.unwrap();
    assert_eq!(scheduler_view(&f).await, (1, 1), "one left queued");

    // T3 waits on an approval and is cancelled while it waits.
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert_eq!(scheduler_view(&f).await, (0, 0), "waits on a human");
    rt.cancel_turn(tenant, session).await.unwrap();
    assert_eq!(scheduler_view(&f).await, (0, 0), "cancelled: idle");

    // T4 is interrupted by T5 while its model answers slowly; T5 completes.
    rt.submit(tenant, session, "slow one").await.unwrap();
    let before = f.events().await.len();
    let run = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run(tenant, session).await })
    };
    // T4's step has started (committed by a checkpoint while the answer is delayed).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f.events().await[before..]
        .iter()
        .any(|e| e.type_name() == "step.started")
    {
        assert!(tokio::time::Instant::now() < deadline, "T4 never sampled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rt.submit_with(
        tenant,
        session,
        "never mind",
        Some(MultitaskStrategy::Interrupt),
    )
    .await
    .unwrap();
    let out = run.await.unwrap().unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(scheduler_view(&f).await, (0, 0), "idle");

    rt.close_session(tenant, session).await.unwrap();
    assert_eq!(scheduler_view(&f).await, (0, 0), "closed");

    let got = marks(&f.events().await);
    let expected: Vec<(&str, bool, u32)> = vec![
        ("session.created", false, 0),
        // T1: queued, started, sampled, waits on a human.
        ("turn.queued", true, 1),
        ("session.status_changed(running)", true, 1),
        ("turn.started", true, 0),
        ("turn.phase_changed", true, 0),
        ("step.started", true, 0),
        ("step.streaming", true, 0),
        ("tool_call.proposed", true, 0),
        ("step.completed", true, 0),
        ("turn.phase_changed", true, 0),
        ("tool_call.validating", true, 0),
        ("approval.requested", true, 0),
        ("tool_call.awaiting_approval", true, 0),
        ("session.status_changed(requires_action)", false, 0),
        // Decided: the run resumes it (a decision wakes the session through the store).
        ("session.status_changed(running)", true, 0),
        ("approval.decided", true, 0),
        ("effect.prepared", true, 0),
        ("effect.dispatched", true, 0),
        ("tool_call.started", true, 0),
        ("effect.committed", true, 0),
        ("tool_call.finished", true, 0),
        ("turn.phase_changed", true, 0),
        ("step.started", true, 0),
        ("step.streaming", true, 0),
        ("step.completed", true, 0),
        // The turn has ended and the session is still `running`: a worker owes it going idle.
        ("turn.finished", true, 0),
        ("session.status_changed(idle)", false, 0),
        // T2 and T3 queued; T2 cancelled while queued (still work: it must be finished).
        ("turn.queued", true, 1),
        ("turn.queued", true, 2),
        ("turn.cancel_requested", true, 2),
        ("turn.finished", true, 1),
        // T3 runs into an approval and is cancelled while waiting on a human: ending it needs
        // no human, so the session is runnable again.
        ("session.status_changed(running)", true, 1),
        ("turn.started", true, 0),
        ("turn.phase_changed", true, 0),
        ("step.started", true, 0),
        ("step.streaming", true, 0),
        ("tool_call.proposed", true, 0),
        ("step.completed", true, 0),
        ("turn.phase_changed", true, 0),
        ("tool_call.validating", true, 0),
        ("approval.requested", true, 0),
        ("tool_call.awaiting_approval", true, 0),
        ("session.status_changed(requires_action)", false, 0),
        ("turn.cancel_requested", true, 0),
        ("session.status_changed(running)", true, 0),
        // Its approval is withdrawn with the turn's end.
        ("approval.expired", true, 0),
        ("tool_call.finished", true, 0),
        ("turn.finished", true, 0),
        ("session.status_changed(idle)", false, 0),
        // T4 interrupted by T5.
        ("turn.queued", true, 1),
        ("session.status_changed(running)", true, 1),
        ("turn.started", true, 0),
        ("turn.phase_changed", true, 0),
        ("step.started", true, 0),
        ("turn.queued", true, 1),
        ("turn.cancel_requested", true, 1),
        ("step.failed", true, 1),
        ("turn.finished", true, 1),
        ("turn.started", true, 0),
        ("turn.phase_changed", true, 0),
        ("step.started", true, 0),
        ("step.streaming", true, 0),
        ("step.completed", true, 0),
        ("turn.finished", true, 0),
        ("session.status_changed(idle)", false, 0),
        ("session.status_changed(closed)", false, 0),
    ];
    let got: Vec<(&str, bool, u32)> = got.iter().map(|(t, r, q)| (t.as_str(), *r, *q)).collect();
    assert_eq!(got, expected);
}
