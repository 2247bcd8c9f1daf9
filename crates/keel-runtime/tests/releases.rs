//! What runs is the pinned release: its policy rules and tools are enforced whatever the
//! settings say, and changing them is an explicit re-pin (`Runtime::repin`, journaled as
//! `session.release_pinned`), refused while a turn is active.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{
    AgentDefinition, Budget, Correlation, Event, EventBody, Release, SessionStatus, TenantId,
    TerminalReason, ToolCallStatus,
};
use keel_model::ModelClient;
use keel_runtime::{Repin, RuntimeError, SessionConfig};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_release_deny_rule_is_enforced_without_the_settings_repeating_it,
    a_release_ask_rule_asks_even_in_bypass_mode,
    a_tool_the_release_does_not_enable_is_rejected,
    a_repin_is_journaled_and_later_turns_run_the_new_release,
    a_repin_is_refused_while_a_turn_is_active_or_the_release_is_bad,
    allow_rules_are_refused_in_the_settings,
    an_older_journal_keeps_its_settings_allow_rules_until_re_pinned,
);

/// A release of the test agent with `tools` and `policy`.
fn release_with(tools: &[&str], policy: Value) -> Release {
    Release::new(AgentDefinition {
        policy,
        ..release(tools, Budget::default()).definition
    })
}

/// A fixture whose session pins `release` (settings: bypass, no rules, then `tune`).
async fn pinned_fixture(
    b: Backend,
    model: Arc<dyn ModelClient>,
    release: &Release,
    tune: impl FnOnce(&mut SessionConfig),
) -> Fixture {
    let db = db(b).await;
    let rt = runtime(&db, model);
    let ws = workspace();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    tune(&mut cfg);
    let session = rt.create_session(tenant, release, cfg).await.unwrap();
    Fixture {
        db,
        rt,
        tenant,
        session,
        ws,
    }
}

/// The results (status, output) of every call of the session, in journal order.
async fn results(f: &Fixture) -> Vec<(ToolCallStatus, String)> {
    f.events()
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((status, output)),
            _ => None,
        })
        .collect()
}

/// A deny rule in the pinned release holds though the settings (bypass, no rules) do not repeat
/// it. Before: `release.definition.policy` was never read — only the settings' rules were
/// enforced — and the call ran.
async fn a_release_deny_rule_is_enforced_without_the_settings_repeating_it(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
        json!({"text": "done"}),
    ];
    let rel = release_with(&[], json!({"deny": ["counter"]}));
    let f = pinned_fixture(b, scripted(&lines), &rel, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert!(f.counter_lines().is_empty(), "the denied call never ran");
    let results = results(&f).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, ToolCallStatus::Rejected, "{results:?}");
    // The model does not see a tool the release denies outright.
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(ctx.tools.iter().all(|t| t.name != "counter"));
}

/// An `ask` rule of the release asks even when the settings say `bypass`. Before: the release's
/// rules were ignored and bypass ran the call.
async fn a_release_ask_rule_asks_even_in_bypass_mode(b: Backend) {
    let lines = [json!({"tool_calls": [call("counter", json!({"label": "x"}))]})];
    let rel = release_with(&[], json!({"ask": ["counter"]}));
    let f = pinned_fixture(b, scripted(&lines), &rel, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert!(f.counter_lines().is_empty());
}

/// A call to a tool outside the release's `tools` is rejected even though the model names it
/// without having seen it. Before: the list only hid the tool; a call to it validated against
/// the whole registry and ran.
async fn a_tool_the_release_does_not_enable_is_rejected(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
        json!({"text": "done"}),
    ];
    let rel = release_with(&["read_file"], Value::Null);
    let f = pinned_fixture(b, scripted(&lines), &rel, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert!(f.counter_lines().is_empty(), "counter is not this agent's");
    let results = results(&f).await;
    assert_eq!(results[0].0, ToolCallStatus::Rejected);
    assert!(results[0].1.contains("does not enable"), "{results:?}");
}

/// `repin` journals `session.release_pinned` naming the old and the new release, the store's
/// session row follows, any process reads the new release, and the next turn runs it (here: its
/// deny rule). Re-pinning to the release already pinned writes nothing.
async fn a_repin_is_journaled_and_later_turns_run_the_new_release(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "first"}))]}),
        json!({"text": "one"}),
        json!({"tool_calls": [call("counter", json!({"label": "second"}))]}),
        json!({"text": "two"}),
    ];
    let old = release_with(&[], Value::Null);
    let new = release_with(&[], json!({"deny": ["counter"]}));
    let f = pinned_fixture(b, scripted(&lines), &old, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "1").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(f.counter_lines().len(), 1);

    let r = f.rt.repin(f.tenant, f.session, &new).await.unwrap();
    let version = f.events().await.len() as u64;
    assert_eq!(
        r,
        Some(Repin {
            from_release_id: old.id.clone(),
            to_release_id: new.id.clone(),
            version,
        })
    );
    let last = f.events().await.pop().unwrap();
    assert_eq!(last.correlation, Correlation::default());
    assert_eq!(
        last.body,
        EventBody::SessionReleasePinned {
            from_release_id: old.id.clone(),
            to_release_id: new.id.clone(),
        }
    );
    let row = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(row.release_id, new.id, "the session row follows");
    let other = other_process(&f.db).await;
    assert_eq!(
        other.pinned_release(f.tenant, f.session).await.unwrap(),
        new
    );
    assert_eq!(
        f.rt.repin(f.tenant, f.session, &new).await.unwrap(),
        None,
        "already pinned"
    );
    assert_eq!(f.events().await.len() as u64, version, "nothing written");

    f.rt.submit(f.tenant, f.session, "2").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(f.counter_lines().len(), 1, "the second call was denied");
    assert_eq!(results(&f).await[1].0, ToolCallStatus::Rejected);
}

/// A re-pin is refused while a turn waits on a human (`TurnActive`) or a worker runs the session
/// (`SessionBusy`), and for a release whose id does not match its definition or whose policy is
/// not rules; nothing is written.
async fn a_repin_is_refused_while_a_turn_is_active_or_the_release_is_bad(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
        json!({"tool_calls": [call("sleep", json!({"ms": 3000}))]}),
        json!({"text": "slept"}),
    ];
    let old = release_with(&[], Value::Null);
    let new = release_with(&[], json!({"deny": ["shell"]}));
    let f = pinned_fixture(b, scripted(&lines), &old, |c| {
        c.permission_mode = PermissionMode::Default;
    })
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let before = f.events().await.len();
    let err = f.rt.repin(f.tenant, f.session, &new).await.unwrap_err();
    assert!(matches!(err, RuntimeError::TurnActive { .. }), "{err}");
    assert!(err.to_string().contains("between turns"), "{err}");

    // A running turn: another worker holds the session.
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "sleep").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    let other = other_process(&f.db).await;
    let err = other.repin(f.tenant, f.session, &new).await.unwrap_err();
    assert!(matches!(err, RuntimeError::SessionBusy { .. }), "{err}");
    let err = f.rt.repin(f.tenant, f.session, &new).await.unwrap_err();
    assert!(matches!(err, RuntimeError::SessionBusy { .. }), "{err}");
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    run.await.unwrap().unwrap();

    let mut tampered = new.clone();
    tampered.definition.policy = json!({});
    let with_mode = release_with(&[], json!({"mode": "bypass"}));
    let bad_rule = release_with(&[], json!({"deny": ["shell("]}));
    for bad in [&tampered, &with_mode, &bad_rule] {
        let err = f.rt.repin(f.tenant, f.session, bad).await.unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
        assert!(
            err.to_string().contains(&bad.id.0),
            "names the release: {err}"
        );
    }
    let after: Vec<Event> = f.events().await;
    assert!(
        after[before..]
            .iter()
            .all(|e| e.type_name() != "session.release_pinned"),
        "nothing re-pinned"
    );
    assert_eq!(
        f.db.store
            .get_session(f.tenant, f.session)
            .await
            .unwrap()
            .release_id,
        old.id
    );
}

/// `allow` rules loosen the policy, so they are a release's: settings with one are refused at
/// creation and as a change, and nothing is written.
async fn allow_rules_are_refused_in_the_settings(b: Backend) {
    let f = fixture(b, &[], |_| {}).await;
    let before = f.events().await.len();
    let err =
        f.rt.update_config(f.tenant, f.session, |c| c.allow = vec!["counter".into()])
            .await
            .unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
    assert!(err.to_string().contains("release"), "{err}");
    assert_eq!(f.events().await.len(), before);
    let mut cfg = config(f.ws.path());
    cfg.allow = vec!["counter".into()];
    let err =
        f.rt.create_session(f.tenant, &release(&[], Budget::default()), cfg)
            .await
            .unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidInput(_)), "{err}");
    // Tightening rules stay settings.
    f.rt.update_config(f.tenant, f.session, |c| c.deny = vec!["shell".into()])
        .await
        .unwrap();
}

/// A session an older build created with `allow` rules in its settings (and a release without
/// policy) keeps them — the call runs without asking, as it did — until it is re-pinned to a
/// release with a policy, whose rules then decide (the call asks).
async fn an_older_journal_keeps_its_settings_allow_rules_until_re_pinned(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "first"}))]}),
        json!({"text": "one"}),
        json!({"tool_calls": [call("counter", json!({"label": "second"}))]}),
    ];
    let db = db(b).await;
    let rt = runtime(&db, scripted(&lines));
    let ws = workspace();
    let (tenant, session) = (TenantId::new(), keel_core::SessionId::new());
    let old = release_with(&[], Value::Null);
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Default;
    cfg.allow = vec!["counter".into()];
    // The journal as an older build wrote it.
    let store = db.store.clone();
    store.put_release(tenant, &old).await.unwrap();
    let lease = keel_testkit::db::leased_session(
        store.as_ref(),
        tenant,
        session,
        &old.id,
        serde_json::to_value(&cfg).unwrap(),
        "older-build",
        Duration::from_secs(5),
    )
    .await;
    store.release_lease(tenant, &lease).await.unwrap();

    rt.submit(tenant, session, "1").await.unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(
        out.status,
        SessionStatus::Idle,
        "allowed by the old settings"
    );
    assert_eq!(counter_lines(ws.path()).len(), 1);

    let new = release_with(&[], json!({}));
    assert_ne!(new.id, old.id);
    rt.repin(tenant, session, &new).await.unwrap().unwrap();
    rt.submit(tenant, session, "2").await.unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(
        out.status,
        SessionStatus::RequiresAction,
        "the new release allows nothing"
    );
    assert_eq!(counter_lines(ws.path()).len(), 1);
}
