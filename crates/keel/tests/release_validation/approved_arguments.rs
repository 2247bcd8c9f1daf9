//! approved_arguments — an approved call runs only with the arguments that were approved: when
//! the call's arguments differ at execution from the ones its approval hashed (changed in the
//! store between the decision and the dispatch), the call is refused right before its dispatch
//! — the tool never runs, no effect is prepared or dispatched — and the refusal is journaled as
//! the call's one result (`tool_call.finished`, `rejected`, saying the arguments differ from
//! the approved ones); the turn goes on and ends once.
//!
//! Guarded mechanism: the execution-time hash check (`keel-runtime` `tools.rs` `run_call`:
//! the arguments' `args_hash` against the approval's, right before the dispatch), switched off
//! by `dispatch_hash`. The decision-time check (`approval_hash`, `ApprovalRecord::decide`) does
//! not see this change: the decision carries the hash the approval was asked with. With the
//! switch off the tool runs with the changed arguments (one dispatch is recorded).

use keel_core::{Budget, EventBody, TenantId, ToolCallStatus};
use keel_runtime::RuntimeOptions;
use keel_testkit::db::{Backend, TestDb};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use super::rig::{
    Dispatches, allow_the_approval, call, config, journal, not_ended_exactly_once, registry,
    release, runtime, scripted,
};

per_backend!(arguments_changed_after_approval_are_refused_at_dispatch);

/// A session asks to run `effect {"ms": 1}` (side-effecting: the default mode asks) and waits
/// on a human; the approval is decided `allow_once` with its own hash. Then the proposed call's
/// arguments are changed in the store (`{"ms": 2}`), behind the runtime's back, and another
/// worker runs the session: the call is refused at dispatch and the refusal journaled.
async fn arguments_changed_after_approval_are_refused_at_dispatch(b: Backend) {
    let db = TestDb::new(b).await;
    let log = Dispatches::default();
    let lines = [
        json!({"tool_calls": [call("effect", json!({"ms": 1}))]}),
        json!({"text": "done"}),
    ];
    let rt = runtime(
        db.store.clone(),
        scripted(&lines),
        registry(&log),
        RuntimeOptions::default(),
    );
    let ws = tempfile::tempdir().unwrap();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Default;
    let session = rt
        .create_session(tenant, &release(&["effect"], Budget::default()), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "act").await.unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.pending.len(), 1, "the effect asks: {out:?}");
    let approval = allow_the_approval(&rt, tenant, session).await;
    assert_eq!(approval.args_hash, keel_core::args_hash(&json!({"ms": 1})));

    // Between the decision and the dispatch, the call's arguments change in the store.
    db.raw(
        r#"UPDATE events SET body = REPLACE(body, '"arguments":{"ms":1}', '"arguments":{"ms":2}') WHERE type = 'tool_call.proposed'"#,
    )
    .await;
    let changed = db
        .scalar(r#"SELECT COUNT(*) FROM events WHERE type = 'tool_call.proposed' AND body LIKE '%"arguments":{"ms":2}%'"#)
        .await;
    assert_eq!(changed, 1, "the proposed call's arguments were changed");

    // Another worker (a fresh load of the journal) runs the session on.
    let other = runtime(
        db.reopen().await,
        scripted(&lines),
        registry(&log),
        RuntimeOptions::default(),
    );
    let out = other.run(tenant, session).await.unwrap();
    assert!(out.pending.is_empty(), "{out:?}");
    assert_eq!(
        out.turns.last().map(|t| t.terminal_reason),
        Some(keel_core::TerminalReason::Completed),
        "{out:?}"
    );

    assert!(
        log.of(session).is_empty(),
        "the tool ran with arguments nobody approved: {:?}",
        log.of(session)
    );
    let events = journal(&db, tenant, session).await;
    let results: Vec<(ToolCallStatus, String)> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "the call's one result: {results:?}");
    assert_eq!(results[0].0, ToolCallStatus::Rejected, "{results:?}");
    assert!(
        results[0]
            .1
            .contains("differ from the ones that were approved"),
        "the journal says why: {results:?}"
    );
    let effects = events
        .iter()
        .filter(|e| {
            matches!(
                e.body,
                EventBody::EffectPrepared { .. } | EventBody::EffectDispatched {}
            )
        })
        .count();
    assert_eq!(effects, 0, "no effect prepared or dispatched");
    assert_eq!(
        not_ended_exactly_once(&events),
        Vec::<String>::new(),
        "every turn, step and call ended once"
    );
}
