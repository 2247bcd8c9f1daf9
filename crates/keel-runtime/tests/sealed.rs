//! Sealed arguments: a tool runs exactly the arguments the model proposed, while the journal,
//! the approvals table and every event show them redacted (issue: redaction corrupted what
//! tools did — `write_file {"path": "leak-$KEY.txt"}` created `leak-[REDACTED].txt`).

use keel_core::{ApprovalDecision, SessionStatus, StateMachine, TerminalReason, ToolCallStatus};
use keel_runtime::seal::SealKey;
use keel_runtime::{PendingAction, Runtime, RuntimeOptions};
use keel_store::SealedKind;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_tool_runs_the_exact_arguments_the_journal_shows_redacted,
    an_approved_call_holding_a_secret_runs_with_it_after_a_restart,
    a_sealed_call_never_runs_with_redacted_arguments,
);

const SECRET: &str = "tok-0123456789ab";

fn script() -> Vec<Value> {
    vec![
        json!({"tool_calls": [call("write_file", json!({
            "path": format!("leak-{SECRET}.txt"),
            "content": format!("key={SECRET}\n"),
        }))]}),
        json!({"text": "done"}),
    ]
}

fn secret_config(c: &mut keel_runtime::SessionConfig) {
    c.secret_patterns = vec!["tok-[0-9a-f]{12}".into()];
}

/// A runtime on the fixture's store with deployment key `key`, as another process would be.
fn restarted(f: &Fixture, key: SealKey) -> Runtime {
    Runtime::new(
        f.db.store.clone(),
        scripted(&script()),
        registry(),
        RuntimeOptions {
            lease_ttl: std::time::Duration::from_secs(5),
            lease_wait: std::time::Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            seal_key: key,
            ..RuntimeOptions::default()
        },
    )
}

/// Nothing the store holds for the session carries the secret.
async fn assert_store_has_no_secret(f: &Fixture) {
    let events = serde_json::to_string(&f.events().await).unwrap();
    assert!(!events.contains(SECRET), "the journal holds the secret");
    assert!(events.contains("[REDACTED]"));
    let approvals =
        f.db.store
            .list_approvals(f.tenant, f.session, None)
            .await
            .unwrap();
    assert!(!format!("{approvals:?}").contains(SECRET));
    let effects =
        f.db.store
            .list_effects(f.tenant, f.session, None)
            .await
            .unwrap();
    assert!(!format!("{effects:?}").contains(SECRET));
    let sealed =
        f.db.store
            .sealed_rows(f.tenant, f.session, SealedKind::Arguments)
            .await
            .unwrap();
    for (_, row) in &sealed {
        assert!(!row.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
    }
}

fn written(f: &Fixture) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(f.ws.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("leak-"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

async fn a_tool_runs_the_exact_arguments_the_journal_shows_redacted(b: Backend) {
    let f = fixture(b, &script(), secret_config).await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(
        written(&f),
        vec![(format!("leak-{SECRET}.txt"), format!("key={SECRET}\n"))]
    );
    assert_store_has_no_secret(&f).await;
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    let c = view.state.tool_calls.values().next().unwrap();
    assert!(c.sealed);
    assert_eq!(c.status, ToolCallStatus::Succeeded);
    // The call ended: its sealed row is gone.
    assert!(
        f.db.store
            .sealed_rows(f.tenant, f.session, SealedKind::Arguments)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Asks for approval (default mode), decides it, and lets a new runtime — same store, same
/// deployment key — run the call: the exact arguments come from the sealed row.
async fn an_approved_call_holding_a_secret_runs_with_it_after_a_restart(b: Backend) {
    let key = SealKey::ephemeral();
    let f = fixture(b, &script(), |c| {
        secret_config(c);
        c.permission_mode = PermissionMode::Default;
    })
    .await;
    let first = restarted(&f, key.clone());
    first.submit(f.tenant, f.session, "go").await.unwrap();
    let out = first.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let Some(PendingAction::Approval {
        approval_id,
        arguments,
        args_hash,
        ..
    }) = out.pending.first().cloned()
    else {
        panic!("no approval pending: {:?}", out.pending);
    };
    assert!(!arguments.to_string().contains(SECRET), "{arguments}");
    assert_eq!(
        f.db.store
            .sealed_rows(f.tenant, f.session, SealedKind::Arguments)
            .await
            .unwrap()
            .len(),
        1
    );
    first
        .decide_approval(
            f.tenant,
            approval_id,
            ApprovalDecision::AllowOnce,
            &args_hash,
        )
        .await
        .unwrap();
    drop(first);
    assert!(written(&f).is_empty());
    let second = restarted(&f, key);
    let out = second.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(
        written(&f),
        vec![(format!("leak-{SECRET}.txt"), format!("key={SECRET}\n"))]
    );
    assert_store_has_no_secret(&f).await;
    assert!(
        f.db.store
            .sealed_rows(f.tenant, f.session, SealedKind::Arguments)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The same, but the second runtime has another deployment key: the sealed row does not open,
/// and the call gets an error result — it never runs with `[REDACTED]` in its arguments.
async fn a_sealed_call_never_runs_with_redacted_arguments(b: Backend) {
    let f = fixture(b, &script(), |c| {
        secret_config(c);
        c.permission_mode = PermissionMode::Default;
    })
    .await;
    let first = restarted(&f, SealKey::ephemeral());
    first.submit(f.tenant, f.session, "go").await.unwrap();
    let out = first.run(f.tenant, f.session).await.unwrap();
    let Some(PendingAction::Approval {
        approval_id,
        args_hash,
        ..
    }) = out.pending.first().cloned()
    else {
        panic!("no approval pending: {:?}", out.pending);
    };
    first
        .decide_approval(
            f.tenant,
            approval_id,
            ApprovalDecision::AllowOnce,
            &args_hash,
        )
        .await
        .unwrap();
    drop(first);
    let other = restarted(&f, SealKey::ephemeral());
    let out = other.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns.len(), 1);
    assert!(written(&f).is_empty(), "{:?}", written(&f));
    let view = other.view(f.tenant, f.session).await.unwrap();
    let c = view.state.tool_calls.values().next().unwrap();
    assert!(c.status.is_terminal());
    assert_ne!(c.status, ToolCallStatus::Succeeded);
    let (text, is_error) = c.result.clone().unwrap();
    assert!(is_error && text.contains("could not be opened"), "{text}");
}
