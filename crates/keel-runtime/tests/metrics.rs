//! The metrics read from the store at scrape time (issue 13 item 6): sessions by status and
//! queue depth per tenant follow the store, and a read that fails keeps the last values; lease
//! takeovers and model cost count what the store's claims and the model attempts report.

use keel_runtime::metrics::Metrics;
use serde_json::json;
use sqlx::{AnyConnection, Connection, Executor};

use crate::common::*;
use crate::on_both;

on_both!(
    store_gauges_follow_the_store_and_keep_their_last_values_when_a_read_fails,
    takeovers_and_model_costs_are_counted_by_what_happened,
);

/// The value of the sample `series` (`name{labels}`) in `text`, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Runs `sql` on the test's database, `{schema}` replaced by the PostgreSQL schema prefix.
async fn exec(db: &Db, sql: &str) {
    sqlx::any::install_default_drivers();
    let (url, prefix) = match db.location.split_once("?keel_schema=") {
        Some((url, schema)) => (url.to_owned(), format!("\"{schema}\".")),
        None => (db.location.clone(), String::new()),
    };
    let mut c = AnyConnection::connect(&url).await.unwrap();
    c.execute(sql.replace("{schema}", &prefix).as_str())
        .await
        .unwrap();
    c.close().await.unwrap();
}

async fn store_gauges_follow_the_store_and_keep_their_last_values_when_a_read_fails(
    backend: Backend,
) {
    let f = fixture(backend, &[json!({"text": "hi"})], |_| {}).await;
    let m = Metrics::new();
    let store = f.db.store.as_ref();
    let depth = format!("keel_queue_depth{{tenant=\"{}\"}}", f.tenant);

    m.observe_store(store).await;
    let text = m.render();
    assert_eq!(
        sample(&text, "keel_sessions{status=\"created\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "keel_sessions{status=\"idle\"}"), Some(0.0));
    assert_eq!(sample(&text, &depth), None, "{text}");

    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    m.observe_store(store).await;
    assert_eq!(sample(&m.render(), &depth), Some(1.0));

    f.rt.run(f.tenant, f.session).await.unwrap();
    m.observe_store(store).await;
    let text = m.render();
    assert_eq!(sample(&text, "keel_sessions{status=\"idle\"}"), Some(1.0));
    assert_eq!(
        sample(&text, "keel_sessions{status=\"created\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&text, &depth), None, "{text}");
    assert_eq!(
        sample(&text, "keel_sessions_left_for_newer_schema"),
        Some(0.0)
    );

    // A new session the gauges have not seen yet; then the store cannot answer: the scrape
    // still works, with the last values (the new session does not show).
    f.rt.create_session(
        f.tenant,
        &release(&[], keel_core::Budget::default()),
        config(f.ws.path()),
    )
    .await
    .unwrap();
    exec(
        &f.db,
        "ALTER TABLE {schema}sessions RENAME TO sessions_away",
    )
    .await;
    m.observe_store(store).await;
    let text = m.render();
    assert_eq!(sample(&text, "keel_sessions{status=\"idle\"}"), Some(1.0));
    assert_eq!(
        sample(&text, "keel_sessions{status=\"created\"}"),
        Some(0.0)
    );
    exec(
        &f.db,
        "ALTER TABLE {schema}sessions_away RENAME TO sessions",
    )
    .await;

    // Reads work again: the new session shows.
    m.observe_store(store).await;
    let text = m.render();
    assert_eq!(
        sample(&text, "keel_sessions{status=\"created\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "keel_sessions{status=\"idle\"}"), Some(1.0));
}

/// A claim that took an expired lease over (the store's own claim, another owner's lease run
/// out) counts one takeover and a fresh claim none; a priced model attempt adds its cost
/// under its model, and an unpriced one adds no cost series.
async fn takeovers_and_model_costs_are_counted_by_what_happened(backend: Backend) {
    use keel_runtime::scheduler::SchedulerObserver;
    let f = fixture(backend, &[json!({"text": "hi"})], |_| {}).await;
    let m = Metrics::new();
    let store = f.db.store.as_ref();
    f.rt.submit(f.tenant, f.session, "hello").await.unwrap();
    let ttl = std::time::Duration::from_secs(5);
    let now = chrono::Utc::now();
    let max = keel_core::SCHEMA_VERSION;
    let first = store
        .claim_session(f.tenant, "w-1", ttl, now, max, u64::MAX)
        .await
        .unwrap();
    let first = first.expect("the queued turn is claimable");
    assert_eq!(first.took_over, None);
    m.claimed(&first, None);
    let later = now + chrono::Duration::seconds(10);
    let second = store
        .claim_session(f.tenant, "w-2", ttl, later, max, u64::MAX)
        .await
        .unwrap();
    let second = second.expect("w-1's lease ran out");
    assert_eq!(second.took_over.as_deref(), Some("w-1"));
    m.claimed(&second, None);
    let usage = keel_core::Usage {
        input_tokens: 1000,
        output_tokens: 100,
        ..keel_core::Usage::default()
    };
    m.model_usage("openai:gpt-5", &usage, 0.25);
    m.model_usage("openai:gpt-5", &usage, 0.5);
    m.model_usage("scripted:free", &usage, 0.0);
    let text = m.render();
    assert_eq!(sample(&text, "keel_worker_claims_total"), Some(2.0));
    assert_eq!(sample(&text, "keel_lease_takeovers_total"), Some(1.0));
    let cost = |model: &str| {
        sample(
            &text,
            &format!("keel_model_cost_usd_total{{model=\"{model}\"}}"),
        )
    };
    assert_eq!(cost("openai:gpt-5"), Some(0.75), "{text}");
    assert_eq!(cost("scripted:free"), None, "{text}");
}
