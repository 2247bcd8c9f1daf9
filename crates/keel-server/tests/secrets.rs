//! The server's provider keys are secrets of every session it runs (attack report on issue 10,
//! item E, for the API host): `keel serve` withholds the keys it reads from tools
//! (`RuntimeOptions::withheld_env`), but an API client's session names no `secret_env`, so a
//! provider error echoing the key went to the journal in clear. The runtime now redacts the
//! values of every withheld variable, and seals them with the session.

use keel_store::SealedKind;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(the_servers_provider_keys_are_secrets_of_every_session);

async fn the_servers_provider_keys_are_secrets_of_every_session(b: Backend) {
    // A variable the test process has anyway (tests do not set environment variables).
    let key = env!("CARGO_MANIFEST_DIR");
    let s = start_with_options(
        b,
        |_| {},
        |o| o.withheld_env.push("CARGO_MANIFEST_DIR".into()),
    )
    .await;
    let release = s
        .release(
            "echo",
            &[json!({"text": format!("upstream said: bad key {key}")})],
            &["read_file"],
        )
        .await;
    let created = s.session(&release, json!({})).await;
    let session = created.body["session_id"].as_str().unwrap().to_owned();
    let turn = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "go"}),
        )
        .await;
    assert_eq!(turn.status, reqwest::StatusCode::ACCEPTED, "{turn:?}");
    s.wait_session(&session, |b| {
        b["status"] == "idle" && b["active_turn_id"].is_null()
    })
    .await;
    let id: keel_core::SessionId = session.parse().unwrap();
    let events = s.store.read(s.tenant, id, 1, None).await.unwrap();
    let text = serde_json::to_string(&events).unwrap();
    assert!(text.contains("turn.finished"), "{text}");
    assert!(!text.contains(key), "the server's key is in the journal");
    assert!(text.contains("upstream said: bad key [REDACTED]"), "{text}");
    let sealed = s
        .store
        .sealed_rows(s.tenant, id, SealedKind::Secrets)
        .await
        .unwrap();
    assert_eq!(sealed.len(), 1, "sealed with the session");
    assert!(!sealed[0].1.windows(key.len()).any(|w| w == key.as_bytes()));
}
