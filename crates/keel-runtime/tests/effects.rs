//! The effects table beside the journal: rows follow the journal; a second dispatch of one
//! operation key is refused.

use chrono::Utc;
use keel_core::{ApprovalDecision, EffectStatus, OperationKey, SessionStatus, TerminalReason};
use keel_runtime::PendingAction;
use keel_store::{EffectRecord, EffectUpdate};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    the_effects_table_follows_the_journal,
    a_second_dispatch_of_the_same_operation_key_is_refused,
);

async fn the_effects_table_follows_the_journal(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
            json!({"tool_calls": [call("slow_effect", json!({"ms": 60000}))]}),
        ],
        |c| c.turn_timeout_ms = Some(2_000),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let rows =
        f.db.store
            .list_effects(f.tenant, f.session, None)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].tool_name, "counter");
    assert_eq!(rows[0].status, EffectStatus::Committed);
    assert_eq!(rows[0].attempts, 1);
    assert!(rows[0].outcome.is_some());
    // The turn timeout stopped the slow effect mid-flight: unknown, queryable without a fold.
    let unknown =
        f.db.store
            .list_effects(f.tenant, f.session, Some(EffectStatus::OutcomeUnknown))
            .await
            .unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].tool_name, "slow_effect");
}

async fn a_second_dispatch_of_the_same_operation_key_is_refused(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "once"}))]}),
            json!({"text": "settled"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let PendingAction::Approval {
        approval_id,
        tool_call_id,
        args_hash,
        ..
    } = &out.pending[0]
    else {
        panic!("{:?}", out.pending)
    };
    // Another worker dispatched this very operation meanwhile (its row says so).
    let proposed = f
        .events()
        .await
        .into_iter()
        .find(|e| e.type_name() == "tool_call.proposed")
        .unwrap();
    let key = OperationKey::for_call(
        f.session,
        proposed.correlation.step_id.unwrap(),
        tool_call_id,
    );
    let now = Utc::now();
    let store = &f.db.store;
    store
        .insert_effect(
            f.tenant,
            &EffectRecord {
                operation_key: key.clone(),
                session_id: f.session,
                tool_call_id: tool_call_id.clone(),
                tool_name: "counter".into(),
                status: EffectStatus::Prepared,
                request_hash: "sha256:elsewhere".into(),
                attempts: 0,
                outcome: None,
                error: None,
                created_at: now,
                updated_at: now,
            },
        )
        .await
        .unwrap();
    store
        .update_effect(
            f.tenant,
            &key,
            EffectUpdate {
                from: EffectStatus::Prepared,
                to: EffectStatus::Dispatched,
                outcome: None,
                error: None,
            },
        )
        .await
        .unwrap();
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::AllowOnce,
        args_hash,
    )
    .await
    .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert!(f.counter_lines().is_empty(), "the tool did not run again");
    let types = f.types().await;
    assert!(types.contains(&"effect.outcome_unknown"), "{types:?}");
    // The counter tool reconciles: its entry is absent, so the effect failed; the turn goes on.
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "settled");
    let row = store.get_effect(f.tenant, &key).await.unwrap();
    assert_eq!(row.status, EffectStatus::Failed);
    assert_eq!(row.attempts, 1, "one dispatch counted, by the other worker");
}
