//! A session's redactor never loses a secret value it once knew, and holds every value the
//! process running it knows (attack report on issue 10, items D and E): before, the session
//! pinned only secret *names* and every process re-read their values, so a resume without the
//! variable (or a provider key read through a variable the session did not name) journaled the
//! secret in clear. The values are now sealed with the session (kind `secrets`).
//!
//! Also: what `effect.prepared` keeps of exact content is a keyed hash (a plain SHA-256 of a
//! file holding a weak secret could be reversed by guessing).

use keel_core::EventBody;
use keel_runtime::seal::SealKey;
use keel_runtime::{Runtime, RuntimeOptions};
use keel_store::SealedKind;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_secret_value_the_session_knew_stays_redacted_in_a_process_that_lacks_it,
    a_provider_key_the_host_reads_is_redacted_and_remembered_by_the_session,
    the_sealed_secret_values_go_with_the_session,
    a_secrets_row_another_key_cannot_open_is_kept_for_the_key_that_can,
    effect_prepared_keeps_only_keyed_hashes_of_exact_content,
);

const SECRET: &str = "remembered-value-0042";

/// The whole conversation: a text turn, then a turn that writes the secret to a file and says it.
fn script() -> Vec<Value> {
    vec![
        json!({"text": "first turn"}),
        json!({"tool_calls": [call("write_file", json!({"path": "k.txt", "content": SECRET}))]}),
        json!({"text": format!("the key {SECRET} is written")}),
    ]
}

/// Another process on the fixture's store and deployment key, with `tune`d options.
fn process(f: &Fixture, tune: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    let mut options = RuntimeOptions {
        lease_ttl: std::time::Duration::from_secs(5),
        lease_wait: std::time::Duration::from_secs(6),
        cancel_grace_ms: 2_000,
        seal_key: deployment_key(),
        ..RuntimeOptions::default()
    };
    tune(&mut options);
    Runtime::new(f.db.store.clone(), scripted(&script()), registry(), options)
}

/// Nothing the store keeps for the session holds `secret` in clear (events, transcript,
/// effects, sealed rows).
async fn assert_nowhere_in_clear(f: &Fixture, secret: &str) {
    let events = serde_json::to_string(&f.events().await).unwrap();
    assert!(!events.contains(secret), "the journal holds {secret}");
    let transcript =
        f.db.store
            .read_transcript(f.tenant, f.session, 0)
            .await
            .unwrap();
    assert!(!format!("{transcript:?}").contains(secret), "transcript");
    let effects =
        f.db.store
            .list_effects(f.tenant, f.session, None)
            .await
            .unwrap();
    assert!(!format!("{effects:?}").contains(secret), "effects");
    for kind in [
        SealedKind::Arguments,
        SealedKind::Reasoning,
        SealedKind::Secrets,
    ] {
        for (_, row) in
            f.db.store
                .sealed_rows(f.tenant, f.session, kind)
                .await
                .unwrap()
        {
            assert!(!row.windows(secret.len()).any(|w| w == secret.as_bytes()));
        }
    }
}

async fn secrets_row(f: &Fixture) -> Vec<(String, Vec<u8>)> {
    f.db.store
        .sealed_rows(f.tenant, f.session, SealedKind::Secrets)
        .await
        .unwrap()
}

/// Process A knows the secret (a host's secret value) and runs a turn; process B does not
/// (resumed without the variable or config entry) and runs the next, in which the model writes
/// the secret and says it: B's journal and transcript show it redacted, and the write ran with
/// the exact value. Before, B's redactor knew only what B read itself.
async fn a_secret_value_the_session_knew_stays_redacted_in_a_process_that_lacks_it(b: Backend) {
    let f = fixture(b, &script(), |_| {}).await;
    let a = process(&f, |o| o.secret_values = vec![SECRET.into()]);
    a.submit(f.tenant, f.session, "one").await.unwrap();
    a.run(f.tenant, f.session).await.unwrap();
    drop(a);
    assert_eq!(
        secrets_row(&f).await.len(),
        1,
        "sealed with A's first commit"
    );
    let b2 = process(&f, |_| {});
    b2.submit(f.tenant, f.session, "two").await.unwrap();
    let out = b2.run(f.tenant, f.session).await.unwrap();
    let last = out.turns.last().unwrap();
    assert_eq!(last.terminal_reason, keel_core::TerminalReason::Completed);
    assert_eq!(last.final_text, "the key [REDACTED] is written");
    assert_eq!(
        std::fs::read_to_string(f.ws.path().join("k.txt")).unwrap(),
        SECRET,
        "the tool ran with the exact arguments"
    );
    assert_nowhere_in_clear(&f, SECRET).await;
    // Readers without a lease (a subscription replaying the journal) use the same secrets.
    assert!(
        !b2.redactor(f.tenant, f.session)
            .await
            .unwrap()
            .redact_str(SECRET)
            .contains(SECRET)
    );
}

/// A provider key the host reads (a variable in `withheld_env`, such as an `api_key_env` added
/// to the configuration after the session was created) is a secret of every session the host
/// runs, whatever the session's `secret_env` names; and it stays one for a later process that
/// does not read it. (The variable is one the test process has anyway: tests do not set
/// environment variables.)
async fn a_provider_key_the_host_reads_is_redacted_and_remembered_by_the_session(b: Backend) {
    let key = env!("CARGO_MANIFEST_DIR");
    let lines = vec![json!({"text": format!("upstream said: bad key {key}")})];
    let f = fixture(b, &lines, |_| {}).await;
    let reader = Runtime::new(
        f.db.store.clone(),
        scripted(&lines),
        registry(),
        RuntimeOptions {
            seal_key: deployment_key(),
            withheld_env: vec!["CARGO_MANIFEST_DIR".into()],
            ..RuntimeOptions::default()
        },
    );
    reader.submit(f.tenant, f.session, "go").await.unwrap();
    let out = reader.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "upstream said: bad key [REDACTED]");
    assert_nowhere_in_clear(&f, key).await;
    // A process that does not read that variable still redacts it.
    let later = process(&f, |o| o.withheld_env.clear());
    assert_eq!(
        later
            .redactor(f.tenant, f.session)
            .await
            .unwrap()
            .redact_str(&format!("again {key}")),
        "again [REDACTED]"
    );
}

/// The sealed values live as long as the session: deleting it deletes them.
async fn the_sealed_secret_values_go_with_the_session(b: Backend) {
    let f = fixture(b, &script(), |_| {}).await;
    let a = process(&f, |o| o.secret_values = vec![SECRET.into()]);
    a.submit(f.tenant, f.session, "one").await.unwrap();
    a.run(f.tenant, f.session).await.unwrap();
    assert_eq!(secrets_row(&f).await.len(), 1);
    f.db.store
        .delete_session(f.tenant, f.session)
        .await
        .unwrap();
    assert!(
        f.db.store
            .sealed_rows(f.tenant, f.session, SealedKind::Secrets)
            .await
            .map(|r| r.is_empty())
            .unwrap_or(true)
    );
}

/// A process with another deployment key cannot open the row: it redacts what it knows itself
/// and leaves the row alone, so the deployment whose key opens it keeps every value.
async fn a_secrets_row_another_key_cannot_open_is_kept_for_the_key_that_can(b: Backend) {
    let f = fixture(b, &script(), |_| {}).await;
    let a = process(&f, |o| o.secret_values = vec![SECRET.into()]);
    a.submit(f.tenant, f.session, "one").await.unwrap();
    a.run(f.tenant, f.session).await.unwrap();
    let row = secrets_row(&f).await;
    let stranger = process(&f, |o| {
        o.seal_key = SealKey::ephemeral();
        o.secret_values = vec!["stranger-value-77".into()];
    });
    stranger.submit(f.tenant, f.session, "two").await.unwrap();
    assert_eq!(secrets_row(&f).await, row, "not overwritten");
    let again = process(&f, |_| {});
    assert_eq!(
        again
            .redactor(f.tenant, f.session)
            .await
            .unwrap()
            .redact_str(SECRET),
        "[REDACTED]"
    );
}

/// `write_file` of a short secret: the intent's probe and request hash are keyed
/// (`hmac-sha256:`), not the plain SHA-256 of the content anyone reading the journal could test
/// guesses against; the effects table keeps the same. (The crash tests in `recovery` show
/// reconcile still compares them.)
async fn effect_prepared_keeps_only_keyed_hashes_of_exact_content(b: Backend) {
    let weak = "pw1234";
    let args = json!({"path": "weak.txt", "content": weak});
    let lines = vec![
        json!({"tool_calls": [call("write_file", args.clone())]}),
        json!({"text": "done"}),
    ];
    let f = fixture(b, &lines, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let (request_hash, probe) = f
        .events()
        .await
        .into_iter()
        .find_map(|e| match e.body {
            EventBody::EffectPrepared {
                request_hash,
                probe,
            } => Some((request_hash, probe.unwrap())),
            _ => None,
        })
        .unwrap();
    let plain_content = keel_core::canonical::bytes_hash(weak.as_bytes());
    let plain_request =
        keel_core::canonical::content_hash(&json!({"tool": "write_file", "arguments": args}));
    assert_ne!(probe["after"], Value::String(plain_content.clone()));
    assert_ne!(request_hash, plain_request);
    assert!(
        probe["after"].as_str().unwrap().starts_with("hmac-sha256:"),
        "{probe}"
    );
    assert!(request_hash.starts_with("hmac-sha256:"), "{request_hash}");
    let journal = serde_json::to_string(&f.events().await).unwrap();
    let effects = format!(
        "{:?}",
        f.db.store
            .list_effects(f.tenant, f.session, None)
            .await
            .unwrap()
    );
    for plain in [&plain_content, &plain_request] {
        let hex = plain.trim_start_matches("sha256:");
        assert!(!journal.contains(hex) && !effects.contains(hex));
    }
}
