//! `Runtime::close_session`: a session reaches its terminal state `closed` through the core's
//! transition table, and a closed session takes no more input.
//!
//! Before `close_session` existed nothing ever journaled `session.status_changed(closed)`: the
//! planner's `Next::Stop` and the `Closed` errors of `submit` were unreachable.

use std::time::Duration;

use keel_core::{EventBody, SessionStatus};
use keel_runtime::RuntimeError;
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_closed_session_journals_closed_once_and_refuses_input,
    closing_is_refused_while_a_turn_is_open_or_a_worker_runs_the_session,
);

/// Closing an idle session journals one `session.status_changed(closed)` (the store's status
/// follows); closing again writes nothing and succeeds; `submit` then fails with
/// `RuntimeError::Closed` (from this process and from another) and `run` does nothing.
async fn a_closed_session_journals_closed_once_and_refuses_input(b: Backend) {
    let f = fixture(b, &[json!({"text": "done"})], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let before = f.events().await.len();
    f.rt.close_session(f.tenant, f.session).await.unwrap();
    let evs = f.events().await;
    assert_eq!(evs.len(), before + 1, "one event: {:?}", f.types().await);
    assert!(
        matches!(
            &evs[before].body,
            EventBody::SessionStatusChanged {
                status: SessionStatus::Closed,
                ..
            }
        ),
        "{:?}",
        evs[before].body
    );
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Closed);
    assert!(rec.lease.is_none(), "the short lease was released");
    // Twice: a quiet success, nothing written.
    f.rt.close_session(f.tenant, f.session).await.unwrap();
    other_process(&f.db)
        .await
        .close_session(f.tenant, f.session)
        .await
        .unwrap();
    assert_eq!(f.events().await.len(), before + 1);
    // Input is refused with a clear error, here and from another process.
    let err = f.rt.submit(f.tenant, f.session, "more").await.unwrap_err();
    assert!(matches!(err, RuntimeError::Closed { .. }), "{err}");
    assert!(err.to_string().contains("is closed"), "{err}");
    let err = other_process(&f.db)
        .await
        .submit(f.tenant, f.session, "more")
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Closed { .. }), "{err}");
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Closed);
    assert!(out.turns.is_empty());
    assert_eq!(f.events().await.len(), before + 1, "run wrote nothing");
    // An unknown session is a store NotFound.
    let err =
        f.rt.close_session(f.tenant, keel_core::SessionId::new())
            .await
            .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Store(keel_store::StoreError::NotFound { .. })
        ),
        "{err}"
    );
}

/// A turn waiting on a human, a queued turn, a worker of this process or of another one
/// running the session: each refuses the close with a typed error and writes nothing.
async fn closing_is_refused_while_a_turn_is_open_or_a_worker_runs_the_session(b: Backend) {
    // requires_action: the active turn waits on an approval.
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"tool_calls": [call("sleep", json!({"ms": 30_000}))]}),
            json!({"text": "done"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let before = f.events().await.len();
    let err = f.rt.close_session(f.tenant, f.session).await.unwrap_err();
    assert!(matches!(err, RuntimeError::TurnOpen { .. }), "{err}");
    assert!(err.to_string().contains("cancel"), "says what to do: {err}");
    assert_eq!(f.events().await.len(), before, "nothing written");
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    // A queued turn nobody has run yet.
    f.rt.submit(f.tenant, f.session, "sleep").await.unwrap();
    let before = f.events().await.len();
    let err = f.rt.close_session(f.tenant, f.session).await.unwrap_err();
    assert!(matches!(err, RuntimeError::TurnOpen { .. }), "{err}");
    assert_eq!(f.events().await.len(), before);
    // Running here, and from another process while it runs here.
    let runner = {
        let rt = f.rt.clone();
        let (tenant, session) = (f.tenant, f.session);
        tokio::spawn(async move { rt.run(tenant, session).await })
    };
    while !f.types().await.contains(&"tool_call.started") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = f.events().await.len();
    let here = f.rt.close_session(f.tenant, f.session).await.unwrap_err();
    assert!(matches!(here, RuntimeError::SessionBusy { .. }), "{here}");
    let there = other_process(&f.db)
        .await
        .close_session(f.tenant, f.session)
        .await
        .unwrap_err();
    assert!(matches!(there, RuntimeError::SessionBusy { .. }), "{there}");
    assert_eq!(f.events().await.len(), before, "nothing written");
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    runner.await.unwrap().unwrap();
    // Once idle it closes.
    f.rt.close_session(f.tenant, f.session).await.unwrap();
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Closed);
}
