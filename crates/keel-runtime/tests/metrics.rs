//! The metrics read from the store at scrape time (issue 13 item 6): sessions by status and
//! queue depth per tenant follow the store, and a read that fails keeps the last values.

use keel_runtime::metrics::Metrics;
use serde_json::json;
use sqlx::{AnyConnection, Connection, Executor};

use crate::common::*;
use crate::on_both;

on_both!(store_gauges_follow_the_store_and_keep_their_last_values_when_a_read_fails);

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
