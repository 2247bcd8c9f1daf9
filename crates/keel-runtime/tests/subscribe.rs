//! Subscriptions: replay + tail, a stalled subscriber never slows the session, secrets are
//! redacted from every event.

use std::time::{Duration, Instant};

use keel_core::Budget;
use keel_runtime::{DeltaKind, REDACTED, RuntimeOptions, SubscriptionItem};
use keel_tools::tool::ToolProgress;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(a_secret_split_across_deltas_is_redacted_and_tool_progress_reaches_subscribers);
on_both!(
    a_stalled_subscriber_does_not_slow_the_session_and_loses_only_deltas,
    a_subscriber_from_a_sequence_number_replays_then_tails,
    a_secret_is_redacted_from_every_event_and_delta,
    a_live_subscriber_gets_the_events_a_replay_reads_from_the_journal
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_subscriber_not_polled_mid_read_holds_up_no_other_waiter() {
    a_subscriber_not_polled_mid_read_holds_up_no_other_waiter().await;
}

/// A subscriber whose client stops reading while its store wait is in the middle of a version
/// read holds nothing the session's other waiters need. The waiters of a session share one
/// version read (keel-store's `Watched::version`, under a lock); the subscription's wait, kept
/// as a future inside it, stopped where it was when the subscription stopped being polled, and
/// a wait stopped mid-read kept that lock and a pooled connection for good: every other wait
/// on the session then hung (at 1,000 SSE subscribers the SQLite pool starved). PostgreSQL
/// makes the moment deterministic: a lock on `sessions` holds the version read up while the
/// subscriber's `next_timeout` gives up.
async fn a_subscriber_not_polled_mid_read_holds_up_no_other_waiter() {
    use sqlx::Connection;
    let f = fixture(Backend::Postgres, &[json!({"text": "one"})], |_| {}).await;
    let (url, schema) = f.db.postgres().unwrap();
    let mut stalled = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    while stalled
        .next_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_some()
    {}
    let version = f.events().await.len() as u64;
    let mut locker = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE \"{schema}\".sessions IN ACCESS EXCLUSIVE MODE"
    ))
    .execute(&mut locker)
    .await
    .unwrap();
    // Longer than the shared read's freshness on PostgreSQL (2 s): the subscriber's wait makes
    // a real read, which the lock holds up, and is left there when this gives up.
    assert!(
        stalled
            .next_timeout(Duration::from_millis(3500))
            .await
            .unwrap()
            .is_none()
    );
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    // Nobody polls `stalled` from here on. Another waiter of the session still gets answers.
    f.rt.submit(f.tenant, f.session, "again").await.unwrap();
    let seen = tokio::time::timeout(
        Duration::from_secs(20),
        f.db.store
            .wait_for_version(f.tenant, f.session, version, Duration::from_secs(10)),
    )
    .await
    .expect("a wait on the session returns while the stalled subscriber is not polled")
    .unwrap();
    assert!(seen > version, "the new version {seen} after {version}");
    let mut other =
        f.rt.subscribe(f.tenant, f.session, version + 1)
            .await
            .unwrap();
    let item = tokio::time::timeout(Duration::from_secs(20), other.next())
        .await
        .expect("a second subscriber gets the new event")
        .unwrap();
    let SubscriptionItem::Event { event } = item else {
        panic!("{item:?}")
    };
    assert_eq!(event.type_name(), "turn.queued");
    drop(stalled);
}

fn chatty(n_words: usize) -> serde_json::Value {
    json!({"text": "word ".repeat(n_words)})
}

/// The deltas the runtime publishes for one scripted text response: the scripted model's
/// chunks (`text_chunks`) through the same stream redactor the sampling phase uses (it holds
/// back a tail, so counts are not simply one per word), without secret patterns.
fn published_text_deltas(text: &str) -> Vec<String> {
    let redactor = std::sync::Arc::new(keel_runtime::Redactor::new(&[], &[]).unwrap());
    let mut stream = keel_runtime::redact::StreamRedactor::new(redactor);
    let mut out: Vec<String> = keel_model::text_chunks(text)
        .into_iter()
        .map(|c| stream.push(c))
        .collect();
    out.push(stream.finish());
    out.retain(|d| !d.is_empty());
    out
}

/// A subscriber that reads nothing while a 5000-delta turn streams: the turn takes at most ten
/// times as long as the same turn with no subscriber (a correctness deadline, not a
/// benchmark: a session that waited on its subscriber would hang), and afterwards the
/// subscriber gets every durable event in order, exactly one gap naming exactly the deltas it
/// lost (all published minus the 16 the buffer keeps), and the kept deltas' text, which is the
/// end of the answer. Before, the test printed the stalled run's time and asserted nothing
/// about it, and only checked that some gap was reported.
async fn a_stalled_subscriber_does_not_slow_the_session_and_loses_only_deltas(b: Backend) {
    const BUFFER: usize = 16;
    let answer = "word ".repeat(5000);
    let db = db(b).await;
    let rt = keel_runtime::Runtime::new(
        db.store.clone(),
        scripted(&[chatty(5000)]),
        registry(),
        RuntimeOptions {
            delta_buffer: BUFFER,
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let new_session = async || {
        rt.create_session(tenant, &release(&[], Budget::default()), config(ws.path()))
            .await
            .unwrap()
    };
    let timed_run = async |session| {
        let t0 = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(60), rt.run(tenant, session))
            .await
            .expect("the turn finishes")
            .unwrap();
        assert_eq!(out.turns.len(), 1);
        assert_eq!(out.turns[0].final_text, "word ".repeat(5000));
        t0.elapsed()
    };
    // Baseline: the same turn (its own session, same script line) with no subscriber.
    let baseline_session = new_session().await;
    rt.submit(tenant, baseline_session, "talk").await.unwrap();
    let baseline = timed_run(baseline_session).await;
    // With a subscriber that never reads while the turn runs.
    let session = new_session().await;
    rt.submit(tenant, session, "talk").await.unwrap();
    let mut stalled = rt.subscribe(tenant, session, 1).await.unwrap();
    let with_stalled = timed_run(session).await;
    let deadline = (baseline * 10).max(Duration::from_secs(1));
    eprintln!("a 5000-delta turn: {baseline:?} alone, {with_stalled:?} with a stalled subscriber");
    assert!(
        with_stalled <= deadline,
        "a stalled subscriber slowed the turn: {with_stalled:?} against {baseline:?} without one"
    );
    // Now read: every durable event arrives in order, the lost deltas are reported as a gap.
    let total = db.store.read(tenant, session, 1, None).await.unwrap().len() as u64;
    let published = published_text_deltas(&answer);
    assert!(published.len() > 4 * BUFFER, "{}", published.len());
    let mut seqs = Vec::new();
    let mut gaps = Vec::new();
    let mut text = String::new();
    while let Some(item) = stalled
        .next_timeout(Duration::from_millis(1500))
        .await
        .unwrap()
    {
        match item {
            SubscriptionItem::Event { event } => seqs.push(event.seq),
            SubscriptionItem::Gap { dropped } => gaps.push(dropped),
            SubscriptionItem::Delta { delta } => match delta.kind {
                DeltaKind::Text { text: t } => text.push_str(&t),
                other => panic!("only text deltas in this turn: {other:?}"),
            },
        }
    }
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "every durable event");
    assert_eq!(
        gaps,
        vec![(published.len() - BUFFER) as u64],
        "one gap naming exactly the deltas lost"
    );
    assert_eq!(
        text,
        published[published.len() - BUFFER..].concat(),
        "the deltas the buffer kept, coalesced"
    );
    assert!(answer.ends_with(&text));
}

async fn a_subscriber_from_a_sequence_number_replays_then_tails(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"}), json!({"text": "two"})], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let version = f.events().await.len() as u64;
    let mut sub = f.rt.subscribe(f.tenant, f.session, version).await.unwrap();
    let SubscriptionItem::Event { event } = sub.next().await.unwrap() else {
        panic!()
    };
    assert_eq!(event.seq, version);
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let SubscriptionItem::Event { event } = sub
        .next_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((event.seq, event.type_name()), (version + 1, "turn.queued"));
}

async fn a_secret_is_redacted_from_every_event_and_delta(b: Backend) {
    // A value of an environment variable marked secret (cargo sets this one for test processes).
    let var = "CARGO_MANIFEST_DIR".to_owned();
    let env_secret = std::env::var(&var).unwrap();
    let api_key = "sk-abcdefghijklmnopqrstuvwxyz123456";
    let lines = [
        json!({"text": format!("the key is {api_key} ok"), "tool_calls": [call("read_file", json!({"path": "secret.txt"}))]}),
        json!({"text": "done tok_9999"}),
    ];
    let f = fixture(b, &lines, |c| {
        c.secret_patterns = vec!["tok_[0-9]{4}".into()];
        c.secret_env = vec![var.clone()];
    })
    .await;
    std::fs::write(
        f.ws.path().join("secret.txt"),
        format!("password={env_secret}\nkey={api_key}\n"),
    )
    .unwrap();
    let mut sub = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    f.rt.submit(f.tenant, f.session, "read the secret")
        .await
        .unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let mut seen = Vec::new();
    while let Some(item) = sub.next_timeout(Duration::from_millis(700)).await.unwrap() {
        seen.push(serde_json::to_string(&item).unwrap());
    }
    let stored: Vec<String> = f
        .events()
        .await
        .iter()
        .map(keel_core::Event::encode)
        .collect();
    for text in seen.iter().chain(stored.iter()) {
        assert!(!text.contains(api_key), "{text}");
        assert!(!text.contains("tok_9999"), "{text}");
        assert!(!text.contains(&env_secret), "{text}");
    }
    assert!(stored.iter().any(|t| t.contains(REDACTED)));
    assert!(
        seen.iter().any(|t| t.contains("delta")),
        "deltas were seen too"
    );
}

/// A secret that reaches subscribers in two deltas (the scripted model streams word by word, so
/// `Bearer ` and the token are separate text deltas; the tool prints a key in two output chunks)
/// is redacted in the delta stream, and tool progress reaches subscribers while the tool runs.
async fn a_secret_split_across_deltas_is_redacted_and_tool_progress_reaches_subscribers(
    b: Backend,
) {
    let token = "abcdefghijklmnopqrstuvwxyz0123";
    let lines = [
        json!({"text": format!("auth: Bearer {token} then tok_12 34"), "tool_calls": [call("chunks", json!({"pieces": ["key=sk-abcdefghij", "klmnopqrstuvwxyz99 ", "line two\n"]}))]}),
        json!({"text": "done"}),
    ];
    let f = fixture(b, &lines, |c| {
        c.secret_patterns = vec!["tok_[0-9]{2} [0-9]{2}".into()];
    })
    .await;
    let mut sub = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let mut text = String::new();
    let mut progress = String::new();
    let mut last_progress_after = 0;
    let mut result_seq = None;
    while let Some(item) = sub.next_timeout(Duration::from_millis(700)).await.unwrap() {
        match item {
            SubscriptionItem::Delta { delta } => match delta.kind {
                DeltaKind::Text { text: t } => text.push_str(&t),
                DeltaKind::ToolProgress {
                    progress: ToolProgress::Output { text: t },
                    call_id,
                } => {
                    assert_eq!(call_id, "call_1_0");
                    progress.push_str(&t);
                    last_progress_after = delta.after_seq;
                }
                _ => {}
            },
            SubscriptionItem::Event { event } => {
                if event.type_name() == "tool_call.finished" && result_seq.is_none() {
                    result_seq = Some(event.seq);
                }
            }
            SubscriptionItem::Gap { .. } => panic!("no gap expected"),
        }
    }
    assert_eq!(
        text,
        format!("auth: {REDACTED} then {REDACTED}done"),
        "the model text deltas"
    );
    assert_eq!(
        progress,
        format!("key={REDACTED} line two\n"),
        "the tool output deltas"
    );
    // Every progress delta was produced before the call's result was journaled.
    assert!(
        last_progress_after > 0 && last_progress_after < result_seq.unwrap(),
        "progress after seq {last_progress_after}, result at {result_seq:?}"
    );
}

/// A subscriber watching a run takes the events this process commits from the session's
/// committed tail; they are the events, redacted alike, that a replay from the start reads
/// back from the journal, in the same order with none missing.
async fn a_live_subscriber_gets_the_events_a_replay_reads_from_the_journal(b: Backend) {
    let api_key = "sk-abcdefghijklmnopqrstuvwxyz123456";
    let lines = [
        json!({"text": format!("key {api_key}"), "tool_calls": [call("read_file", json!({"path": "a.txt"}))]}),
        json!({"tool_calls": [call("read_file", json!({"path": "a.txt"}))]}),
        json!({"text": "done"}),
    ];
    let f = fixture(b, &lines, |_| {}).await;
    std::fs::write(f.ws.path().join("a.txt"), format!("key={api_key}\n")).unwrap();
    let mut live = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    f.rt.submit(f.tenant, f.session, "read it").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let events = |items: Vec<SubscriptionItem>| -> Vec<String> {
        items
            .into_iter()
            .filter_map(|i| match i {
                SubscriptionItem::Event { event } => Some(event.encode()),
                _ => None,
            })
            .collect()
    };
    let mut seen = Vec::new();
    while let Some(item) = live.next_timeout(Duration::from_millis(700)).await.unwrap() {
        seen.push(item);
    }
    let seen = events(seen);
    let mut replay = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let mut read = Vec::new();
    while let Some(item) = replay
        .next_timeout(Duration::from_millis(700))
        .await
        .unwrap()
    {
        read.push(item);
    }
    let read = events(read);
    assert!(read.len() > 10, "a whole run: {}", read.len());
    assert_eq!(seen, read);
    assert!(seen.iter().all(|e| !e.contains(api_key)));
}
