//! queue_overload — 10,000 turns submitted over HTTP faster than the workers run them: every
//! turn beyond the queue bound is refused with 429 and a `Retry-After` (1–60 s) naming the
//! limit; at every sampled instant the queued turns (the store's queue depth) stay within
//! `max_queued_turns`, the sessions running within the workers' slots, and the in-memory buffer
//! of admitted-but-unwritten turns (`keel_admitted_turns_unwritten`, and its high-water mark)
//! within `max_queued_turns` — all asserted as counts; nothing accepted is lost: each session's
//! journal holds exactly the turns accepted for it (by id), each finished `completed` once.
//!
//! One `keel serve` (one worker of 4 slots; the scripted model takes 1 s per turn, so the
//! workers run about 4 turns a second while 48 clients submit hundreds a second) on a bound of
//! 20 queued turns (tenant and service), the turns spread over 40 sessions so that the bound,
//! not a session's own state, is what refuses them.
//!
//! Guarded mechanism: the admission bound (`keel-server` `workers.rs` `admit_turn`: one
//! judgement at a time reads the admitted submissions still in flight, then the store's depth;
//! an admitted one stays in flight until its turn is written). With it off every
//! turn is accepted: the queue depth passes the bound (the sampler stops the submissions at
//! once) and no 429 is seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use keel_store::Store;
use serde_json::{Value, json};

use super::harness::{Api, Backend, FreshStore, api_session, on_both, poll, script_release};
use crate::common::Env;
use crate::remote::{Options, Served, serve_with};

on_both!(tokio ten_thousand_turns_past_the_bound_get_429_and_none_accepted_is_lost);

/// Turns submitted.
const TURNS: usize = 10_000;
/// `max_queued_turns` and `tenant_max_queued_turns`.
const BOUND: u64 = 20;
/// Sessions the turns are spread over (round robin).
const SESSIONS: usize = 40;
/// Clients submitting at once.
const CLIENTS: usize = 48;
/// The worker's slots (`--workers 1`, `concurrency`).
const SLOTS: u64 = 4;

/// What the submitting clients saw.
#[derive(Default)]
struct Seen {
    /// Accepted turn ids per session.
    accepted: BTreeMap<String, BTreeSet<String>>,
    /// 429s, and those carrying a `Retry-After` of 1–60 s and a `limit` naming the bound.
    refused: usize,
    refused_well: usize,
    /// Any other answer (status, body).
    other: Vec<(u16, Value)>,
}

/// The most seen by the sampler, and how many samples it took.
#[derive(Default, Debug)]
struct Peaks {
    samples: usize,
    scrapes: usize,
    depth: u64,
    running: u64,
    unwritten: u64,
}

/// A sample `name` (no labels) of the exposition `text`, or the sum of its labelled series.
fn metric(text: &str, name: &str) -> u64 {
    let sum: f64 = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let bare = series.split('{').next()?;
            (bare == name).then(|| value.parse::<f64>().ok())?
        })
        .sum();
    // Counts and gauges of whole turns and sessions.
    sum.round() as u64
}

async fn ten_thousand_turns_past_the_bound_get_429_and_none_accepted_is_lost(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let env = Env::new();
    let settings = format!(
        "max_permission_mode = \"bypass\"\n\n[scheduler]\npoll_ms = 100\nconcurrency = {SLOTS}\n\
         max_queued_turns = {BOUND}\ntenant_max_queued_turns = {BOUND}\n"
    );
    let served: Served = serve_with(
        &env,
        &Options {
            store: Some(&fresh.location),
            server_toml: &settings,
            args: &["--workers", "1"],
            ..Options::default()
        },
    );
    let api = Api::new(&served.url, Some(&served.key));
    let metrics = Api::new(&format!("http://{}", served.metrics), None);

    // One model line per turn a session may run (1 s each).
    let line = json!({"text": "done", "delay_ms": 1000});
    let release = script_release(&api, &env, "overload", &vec![line; TURNS], &[], json!({})).await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(api_session(&api, &env, &release).await);
    }
    let sessions = Arc::new(sessions);

    // The sampler: the store's queue depth every 20 ms, the node's metrics every 200 ms; a
    // depth past the bound stops the submissions (the scenario has failed).
    let store: Arc<dyn Store> = fresh.open().await;
    let done = Arc::new(AtomicBool::new(false));
    let broken = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (store, done, broken, metrics) =
            (store.clone(), done.clone(), broken.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut peaks = Peaks::default();
            let mut tick = 0u64;
            while !done.load(Ordering::SeqCst) {
                let (_, all) = store
                    .queue_depth(keel_core::TenantId::local())
                    .await
                    .unwrap();
                peaks.samples += 1;
                peaks.depth = peaks.depth.max(all);
                if tick.is_multiple_of(10) {
                    let text = metrics.text("/metrics").await;
                    peaks.scrapes += 1;
                    peaks.running = peaks.running.max(metric(&text, "keel_sessions_running"));
                    peaks.unwritten = peaks
                        .unwritten
                        .max(metric(&text, "keel_admitted_turns_unwritten"));
                }
                if peaks.depth > BOUND || peaks.unwritten > BOUND {
                    broken.store(true, Ordering::SeqCst);
                }
                tick += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peaks
        })
    };

    // The clients: each takes the next turn number and submits it to its session.
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (api, next, broken, sessions) =
            (api.clone(), next.clone(), broken.clone(), sessions.clone());
        clients.spawn(async move {
            let mut seen = Seen::default();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= TURNS || broken.load(Ordering::SeqCst) {
                    return seen;
                }
                let session = &sessions[i % SESSIONS];
                let (status, headers, body) = api
                    .call_headers(
                        "POST",
                        &format!("/v1/sessions/{session}/turns"),
                        Some(&json!({"input": format!("turn {i}")})),
                        &[],
                    )
                    .await;
                match status {
                    202 => {
                        let turn = body["turn_id"].as_str().unwrap().to_owned();
                        seen.accepted
                            .entry(session.clone())
                            .or_default()
                            .insert(turn);
                    }
                    429 => {
                        seen.refused += 1;
                        let retry = headers
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok());
                        let limit = body["limit"].as_str().unwrap_or("");
                        if retry.is_some_and(|s| (1..=60).contains(&s))
                            && ["tenant_max_queued_turns", "max_queued_turns"].contains(&limit)
                        {
                            seen.refused_well += 1;
                        } else {
                            seen.other
                                .push((status, json!({"retry": retry, "body": body})));
                        }
                    }
                    _ => seen.other.push((status, body)),
                }
            }
        });
    }
    let mut seen = Seen::default();
    while let Some(c) = clients.join_next().await {
        let c = c.unwrap();
        for (session, turns) in c.accepted {
            seen.accepted.entry(session).or_default().extend(turns);
        }
        seen.refused += c.refused;
        seen.refused_well += c.refused_well;
        seen.other.extend(c.other);
    }
    let submitted = next.load(Ordering::SeqCst).min(TURNS);
    let accepted: usize = seen.accepted.values().map(BTreeSet::len).sum();

    // Every accepted turn completes: each session's journal holds exactly its accepted turns,
    // each finished `completed` once.
    let tenant = store
        .list_tenants(None, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == "acme")
        .unwrap()
        .tenant_id;
    let journals = if broken.load(Ordering::SeqCst) {
        BTreeMap::new()
    } else {
        poll(120, "every accepted turn finishes", || async {
            let mut journals = BTreeMap::new();
            for session in sessions.iter() {
                let id: keel_core::SessionId = session.parse().unwrap();
                let events = store.read(tenant, id, 1, None).await.unwrap();
                let events: Vec<Value> = events
                    .iter()
                    .map(|e| serde_json::to_value(e).unwrap())
                    .collect();
                let expected = seen.accepted.get(session).map_or(0, BTreeSet::len);
                let finished = events
                    .iter()
                    .filter(|e| e["type"] == "turn.finished")
                    .count();
                if finished < expected {
                    return None;
                }
                journals.insert(session.clone(), events);
            }
            Some(journals)
        })
        .await
    };
    done.store(true, Ordering::SeqCst);
    let peaks = sampler.await.unwrap();
    let text = metrics.text("/metrics").await;

    eprintln!(
        "queue_overload: {submitted} submitted, {accepted} accepted, {} refused; peaks {peaks:?}",
        seen.refused
    );
    assert!(
        seen.other.is_empty(),
        "unexpected answers: {:?}",
        &seen.other[..seen.other.len().min(5)]
    );
    assert_eq!(
        submitted, TURNS,
        "submissions stopped early: a bound was passed ({peaks:?})"
    );
    assert_eq!(accepted + seen.refused, TURNS);
    // Submitted faster than they run: the bound refused most of them, each with Retry-After.
    assert!(
        seen.refused > 0 && accepted >= BOUND as usize,
        "{accepted} accepted"
    );
    assert_eq!(
        seen.refused_well, seen.refused,
        "every 429 has Retry-After and the limit"
    );
    assert_eq!(
        metric(&text, "keel_admission_rejections_total"),
        seen.refused as u64,
        "the node counted each 429"
    );
    // The bounds, as counts, at every sampled instant.
    assert!(peaks.samples >= 10 && peaks.scrapes >= 2, "{peaks:?}");
    assert!(
        peaks.depth <= BOUND,
        "queue depth past the bound: {peaks:?}"
    );
    assert!(
        peaks.running <= SLOTS,
        "sessions running past the slots: {peaks:?}"
    );
    assert!(
        peaks.unwritten <= BOUND,
        "admitted-unwritten past the bound: {peaks:?}"
    );
    let most = metric(&text, "keel_admitted_turns_unwritten_max");
    assert!(
        (1..=BOUND).contains(&most),
        "admitted-unwritten high-water {most}"
    );
    assert_eq!(metric(&text, "keel_admitted_turns_unwritten"), 0);

    // Nothing accepted is lost, nothing refused was written.
    for session in sessions.iter() {
        let events = &journals[session];
        let queued: BTreeSet<String> = events
            .iter()
            .filter(|e| e["type"] == "turn.queued")
            .map(|e| e["turn_id"].as_str().unwrap().to_owned())
            .collect();
        let empty = BTreeSet::new();
        let accepted = seen.accepted.get(session).unwrap_or(&empty);
        assert_eq!(&queued, accepted, "session {session}: the journal's turns");
        let finished: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "turn.finished")
            .collect();
        assert_eq!(finished.len(), accepted.len(), "session {session}");
        let ended: BTreeSet<String> = finished
            .iter()
            .map(|e| {
                assert_eq!(e["payload"]["terminal_reason"], "completed", "{e}");
                e["turn_id"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(&ended, accepted, "session {session}: each turn ended once");
    }
    let (_, all) = store.queue_depth(tenant).await.unwrap();
    assert_eq!(all, 0, "nothing left queued");
}
