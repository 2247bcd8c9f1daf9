//! The effects table beside the journal: rows follow the journal; a second dispatch of one
//! operation key is refused.

use chrono::Utc;
use keel_core::{
    ApprovalDecision, EffectStatus, OperationKey, SessionStatus, TerminalReason, ToolCallId,
};
use keel_runtime::PendingAction;
use keel_store::{EffectRecord, EffectUpdate};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    the_effects_table_follows_the_journal,
    a_second_dispatch_of_the_same_operation_key_is_refused,
    an_edit_dispatched_elsewhere_is_not_applied_again,
    a_command_that_ran_and_exited_non_zero_is_committed,
    an_edit_that_changed_nothing_is_failed,
    an_approved_effect_is_dispatched_only_once_the_session_is_running,
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
    let tool_call_id = f.allow_first_pending(&out).await;
    // Another worker dispatched this very operation meanwhile (its row says so).
    let key = dispatched_elsewhere(&f, &tool_call_id, "counter").await;
    let store = &f.db.store;
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

/// Writes the effects row of another worker that dispatched `call` (of `tool`, the session's
/// one proposed call): `prepared`, then `dispatched`. Returns the call's operation key.
async fn dispatched_elsewhere(f: &Fixture, call: &ToolCallId, tool: &str) -> OperationKey {
    let proposed = f
        .events()
        .await
        .into_iter()
        .find(|e| e.type_name() == "tool_call.proposed")
        .unwrap();
    let key = OperationKey::for_call(f.session, proposed.correlation.step_id.unwrap(), call);
    let now = Utc::now();
    let store = &f.db.store;
    store
        .insert_effect(
            f.tenant,
            &EffectRecord {
                operation_key: key.clone(),
                session_id: f.session,
                tool_call_id: call.clone(),
                tool_name: tool.into(),
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
    key
}

/// The same for an edit another worker dispatched and applied: the refused call journals no
/// probe (one taken now would see the other worker's edit as the file "before"), so the edit's
/// reconcile cannot decide "not done, retry" and apply it a second time; a human decides.
async fn an_edit_dispatched_elsewhere_is_not_applied_again(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("edit_file", json!({"path": "README.md", "old_string": "hello", "new_string": "hello!"}))]}),
            json!({"text": "settled"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "edit").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let tool_call_id = f.allow_first_pending(&out).await;
    let readme = f.ws.path().join("README.md");
    let original = std::fs::read_to_string(&readme).unwrap();
    let edited = original.replacen("hello", "hello!", 1);
    assert_ne!(original, edited);
    std::fs::write(&readme, &edited).unwrap();
    dispatched_elsewhere(&f, &tool_call_id, "edit_file").await;
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&readme).unwrap(),
        edited,
        "applied once"
    );
    let types = f.types().await;
    assert!(types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert_eq!(
        types.iter().filter(|t| **t == "effect.dispatched").count(),
        1,
        "{types:?}"
    );
    assert_eq!(out.status, SessionStatus::RequiresAction, "{types:?}");
}

fn effect_events(evs: &[keel_core::Event]) -> Vec<&'static str> {
    evs.iter()
        .map(|e| e.type_name())
        .filter(|t| t.starts_with("effect."))
        .collect()
}

/// An effect is `committed` when the action happened, whatever its exit status: the command
/// ran (it wrote the file), so its effect is not "failed" — the model still sees an error.
async fn a_command_that_ran_and_exited_non_zero_is_committed(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("shell", json!({"command": "echo ran >> out.txt; exit 3"}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "run it").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(
        std::fs::read_to_string(f.ws.path().join("out.txt")).unwrap(),
        "ran\n"
    );
    let evs = f.events().await;
    assert_eq!(
        effect_events(&evs),
        ["effect.prepared", "effect.dispatched", "effect.committed"]
    );
    let finished = evs
        .iter()
        .find(|e| e.type_name() == "tool_call.finished")
        .unwrap();
    assert!(
        matches!(
            &finished.body,
            keel_core::EventBody::ToolCallFinished { is_error: true, .. }
        ),
        "the model sees the failure: {finished:?}"
    );
    let rows =
        f.db.store
            .list_effects(f.tenant, f.session, None)
            .await
            .unwrap();
    assert_eq!(rows[0].status, EffectStatus::Committed);
}

/// `failed` only when the effect provably did not happen: an edit whose `old_string` is not in
/// the file changed nothing.
async fn an_edit_that_changed_nothing_is_failed(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("edit_file", json!({"path": "README.md", "old_string": "absent", "new_string": "x"}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "edit").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        effect_events(&f.events().await),
        ["effect.prepared", "effect.dispatched", "effect.failed"]
    );
}

/// After an approval the session is `running` again before the effect is dispatched: nothing
/// runs while the journal says the session waits on a human.
async fn an_approved_effect_is_dispatched_only_once_the_session_is_running(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
            json!({"text": "done"}),
        ],
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
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
    f.rt.run(f.tenant, f.session).await.unwrap();
    let evs = f.events().await;
    let pos = |pred: &dyn Fn(&keel_core::Event) -> bool| evs.iter().position(pred).unwrap();
    let running = pos(&|e| {
        matches!(
            &e.body,
            keel_core::EventBody::SessionStatusChanged {
                status: SessionStatus::Running,
                ..
            }
        ) && e.seq > 1
            && evs[..usize::try_from(e.seq).unwrap() - 1]
                .iter()
                .any(|p| p.type_name() == "approval.requested")
    });
    let dispatched = pos(&|e| e.type_name() == "effect.dispatched");
    assert!(
        running < dispatched,
        "running at {running}, dispatched at {dispatched}"
    );
    assert_eq!(f.counter_lines().len(), 1);
}
