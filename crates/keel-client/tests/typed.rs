//! Every typed method of the client against a started server, and every operation of
//! `/openapi.json` has one.

use std::collections::BTreeSet;

use keel_client::api::{
    CreateKeyRequest, MultitaskParam, RoleParam, SettingsBody, UpdateSessionRequest,
};
use keel_client::{Client, OPERATIONS, Reconnect, StreamItem};
use serde_json::json;

use crate::common::{Backend, start};

const MISSING: &str = "0190a0a0-0000-7000-8000-000000000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_openapi_operation_has_a_typed_method() {
    let s = start(Backend::Sqlite).await;
    let doc = Client::new(&s.base, None).unwrap().openapi().await.unwrap();
    let mut ids = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            if let Some(id) = op.get("operationId").and_then(|v| v.as_str()) {
                ids.insert(id.to_owned());
            }
        }
    }
    let typed: BTreeSet<String> = OPERATIONS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        ids, typed,
        "operations of /openapi.json vs keel_client::OPERATIONS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_typed_method_calls_its_operation() {
    let s = start(Backend::Sqlite).await;
    let anon = Client::new(&s.base, None).unwrap();
    assert_eq!(anon.healthz().await.unwrap().status, "ok");
    anon.readyz().await.unwrap();
    let op = Client::new(&s.base, Some(&s.operator)).unwrap();
    let admin = Client::new(&s.base, Some(&s.admin)).unwrap();
    let system = Client::new(&s.base, Some(&s.system)).unwrap();

    let release = s
        .release(
            "typed",
            &[json!({"text": "one"}), json!({"text": "two"})],
            &[],
        )
        .await;
    assert!(
        op.list_releases()
            .await
            .unwrap()
            .iter()
            .any(|r| r.release_id == release)
    );
    let mut statuses = op.tenant_events().await.unwrap();
    let session = s.run_to_idle(&release, "first").await;
    let frame = loop {
        let f = statuses
            .recv()
            .await
            .expect("the status stream ended")
            .unwrap();
        if f.session_id == session {
            break f;
        }
    };
    assert!(frame.version > 0, "{frame:?}");

    // Turns: per-request strategy and priority, listed in order.
    let t = op
        .submit_turn_with(&session, "second", Some(MultitaskParam::Enqueue), Some(5))
        .await
        .unwrap();
    // The session is idle before and after the queued turn runs: wait for the turn itself
    // (checking only for `idle` once let the test go on while "second" was still to run, and
    // the cancel below found it running).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while op
        .get_turn(&session, &t.turn_id)
        .await
        .unwrap()
        .terminal_reason
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the second turn did not finish"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    s.wait_session(&session, |b| b["status"] == "idle").await;
    let turns = op.list_turns(&session).await.unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].turn_id, t.turn_id);
    assert_eq!(
        op.get_turn(&session, &t.turn_id).await.unwrap().turn_id,
        t.turn_id
    );
    let bad = op
        .submit_turn_with(&session, "x", None, Some(1000))
        .await
        .unwrap_err();
    assert_eq!(bad.status(), Some(422), "{bad}");

    // State now and at an earlier seq.
    let now = op.session_state_at(&session, None).await.unwrap();
    let early = op.session_state_at(&session, Some(1)).await.unwrap();
    assert_eq!(early.version, 1);
    assert!(now.version > early.version);
    assert_eq!(
        op.session_state(&session).await.unwrap().version,
        now.version
    );

    // Events.
    let all = op.events(&session, 0).await.unwrap();
    assert_eq!(all.len() as u64, now.version);
    assert_eq!(op.events_page(&session, 0, 2).await.unwrap().items.len(), 2);
    let mut es = op
        .stream_events(&session, 0, Reconnect::default())
        .await
        .unwrap();
    match es.recv().await.unwrap().unwrap() {
        StreamItem::Event { seq, .. } => assert_eq!(seq, 1),
        other => panic!("{other:?}"),
    }

    // Nothing runs: cancels are 409.
    assert_eq!(
        op.cancel_turn(&session).await.unwrap_err().status(),
        Some(409)
    );
    assert_eq!(
        op.cancel_tool_call(&session, "call_1")
            .await
            .unwrap_err()
            .status(),
        Some(409)
    );

    // Decisions: none pending, unknown ids 404.
    assert!(op.list_approvals(Some("pending")).await.unwrap().is_empty());
    assert!(
        op.session_approvals(&session, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        op.get_approval(MISSING).await.unwrap_err().status(),
        Some(404)
    );
    let e = op
        .decide_approval(
            MISSING,
            keel_client::api::ApprovalDecisionParam::AllowOnce,
            "h",
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    assert!(op.list_effects(&session, None).await.unwrap().is_empty());
    let e = op
        .decide_effect(
            &session,
            "k",
            keel_client::api::EffectDecisionParam::Committed,
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(e.status(), Some(404 | 409)), "{e}");

    // Artifacts and usage.
    assert!(op.list_artifacts(&session).await.unwrap().is_empty());
    assert_eq!(
        op.get_artifact(MISSING, 0, None)
            .await
            .unwrap_err()
            .status(),
        Some(404)
    );
    assert!(op.get_usage(None, None).await.is_ok());
    let e = op
        .get_usage(Some("2026-02-02"), Some("2026-01-01"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");

    // Memory.
    op.put_memory("notes", "colour", json!({"fav": "Teal"}))
        .await
        .unwrap();
    assert_eq!(
        op.get_memory("notes", "colour").await.unwrap().value["fav"],
        "Teal"
    );
    assert_eq!(
        op.list_memory("notes", Some("teal")).await.unwrap().len(),
        1
    );
    assert!(
        op.list_memory("notes", Some("mauve"))
            .await
            .unwrap()
            .is_empty()
    );
    op.delete_memory("notes", "colour").await.unwrap();
    assert_eq!(
        op.get_memory("notes", "colour").await.unwrap_err().status(),
        Some(404)
    );
    // Deleting what is not there is no error.
    op.delete_memory("notes", "colour").await.unwrap();

    // Settings, close, delete.
    let body = op.get_session(&session).await.unwrap();
    let body = op
        .update_session(
            &session,
            body.version,
            &UpdateSessionRequest {
                settings: SettingsBody {
                    tool_timeout_ms: Some(5000),
                    ..SettingsBody::default()
                },
                release_id: None,
            },
        )
        .await
        .unwrap();
    let body = op.close_session(&session, body.version).await.unwrap();
    assert_eq!(body.status, "closed");
    op.delete_session(&session, body.version).await.unwrap();
    assert_eq!(
        op.get_session(&session).await.unwrap_err().status(),
        Some(404)
    );

    // Tenants (system) and keys (admin).
    let t = system.create_tenant("initech").await.unwrap();
    assert!(
        system
            .list_tenants()
            .await
            .unwrap()
            .iter()
            .any(|x| x.tenant_id == t.tenant_id)
    );
    assert_eq!(
        system.get_tenant(&t.tenant_id).await.unwrap().name,
        "initech"
    );
    let k = system
        .create_tenant_key(
            &t.tenant_id,
            &CreateKeyRequest {
                name: "boss".into(),
                role: RoleParam::Admin,
                expires_at: None,
            },
        )
        .await
        .unwrap();
    let boss = Client::new(&s.base, Some(&k.key)).unwrap();
    assert!(boss.list_sessions(None).await.unwrap().is_empty());
    let k = admin
        .create_key(&CreateKeyRequest {
            name: "temp".into(),
            role: RoleParam::Viewer,
            expires_at: None,
        })
        .await
        .unwrap();
    assert!(
        admin
            .list_keys()
            .await
            .unwrap()
            .iter()
            .any(|x| x.key_id == k.record.key_id)
    );
    let temp = Client::new(&s.base, Some(&k.key)).unwrap();
    assert!(temp.list_sessions(None).await.is_ok());
    assert!(
        admin
            .revoke_key(&k.record.key_id)
            .await
            .unwrap()
            .revoked_at
            .is_some()
    );
    assert_eq!(
        temp.list_sessions(None).await.unwrap_err().status(),
        Some(401)
    );
}
