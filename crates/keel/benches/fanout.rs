//! SSE fan-out (issue 16's table): one session streaming ~50 tokens/s to many SSE subscribers
//! of the real HTTP server, one subscriber stalled (it never reads), against a same-run
//! baseline without subscribers. Prints its figures with the target beside them and exits 0
//! whatever they are.
//!
//! `keel serve` (2 in-process workers, SQLite) calls an OpenAI Chat Completions model served by
//! keel-testkit's fake model server in this process, which streams a 50-word answer at
//! `KEEL_BENCH_TPS` (default 50) tokens/s. The session runs `KEEL_BENCH_TURNS` (default 10)
//! one-step turns without subscribers (baseline), then with `KEEL_BENCH_SUBSCRIBERS` (default
//! 1,000) connections on `GET /v1/sessions/{id}/events` (`Accept: text/event-stream`), all but
//! one reading everything, then again without (second baseline). Step latency = the turn's
//! `turn.finished` − `turn.started` (the journal's timestamps, ms), median per phase; target:
//! with subscribers within 10 % of the baseline. The server's RSS is read from /proc before
//! and with the subscribers.
//!
//! If a phase cannot be measured (the server refuses a request, a turn never ends), it says so
//! on the figure's line and exits 0.
//!
//! `cargo bench -p keel --bench fanout`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod cluster;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use cluster::{Cluster, env, poll};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn ts_ms(e: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(e["ts"].as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// Runs `turns` turns one after the other; the median turn latency (ms) from the journal, or
/// what failed (a request the server refused, a turn that never ended).
fn turns(c: &Cluster, session: &str, turns: usize) -> Result<f64, String> {
    let mut ms = Vec::new();
    for _ in 0..turns {
        let after =
            c.rt.block_on(c.client.events(session, 0))
                .map_err(|e| format!("reading the journal: {e}"))?
                .last()
                .and_then(|e| e["seq"].as_u64())
                .unwrap_or(0);
        c.rt.block_on(c.client.submit_turn(session, "stream"))
            .map_err(|e| format!("submitting a turn: {e}"))?;
        let events = poll(120, || {
            let ev = c.rt.block_on(c.client.events(session, after)).ok()?;
            ev.iter()
                .any(|e| e["type"] == "turn.finished")
                .then_some(ev)
        })
        .ok_or("a turn did not end within 120 s")?;
        let start = events.iter().find(|e| e["type"] == "turn.started").unwrap();
        let end = events
            .iter()
            .find(|e| e["type"] == "turn.finished")
            .unwrap();
        ms.push((ts_ms(end) - ts_ms(start)) as f64);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// Prints that the run could not be measured (the figure's line, with its target) and why.
fn not_measured(phase: &str, why: &str) {
    println!("  turn latency: NOT MEASURED ({phase}: {why})   (target: with / baseline <= 1.10)");
    println!("  load average at the end: {}", load());
}

fn main() {
    let subscribers = env("KEEL_BENCH_SUBSCRIBERS", 1000);
    let n_turns = env("KEEL_BENCH_TURNS", 10);
    let tps = env("KEEL_BENCH_TPS", 50) as f64;
    let model_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let words: Vec<String> = (0..50).map(|i| format!("w{i} ")).collect();
    let server = model_rt
        .block_on(keel_testkit::FakeModelServer::start_fixed(
            keel_testkit::Reply::Respond(keel_testkit::FakeResponse::text(words.concat())),
            keel_testkit::Pacing {
                time_to_first_token_ms: 0,
                tokens_per_second: Some(tps),
            },
        ))
        .unwrap();
    let c = Cluster::serve(
        None,
        10_000,
        &format!("max_streams_per_key = {}\n", subscribers + 10),
        &format!(
            "[providers.openai]\nbase_url = \"http://{}/v1\"\napi_key = \"dummy\"\n",
            server.addr()
        ),
        &[],
    );
    println!(
        "SSE fan-out: one session, 50-token answers at {tps} tokens/s, {subscribers} SSE subscribers ({} reading, 1 stalled), \
         {n_turns} turns per phase; keel serve on SQLite; load average {}",
        subscribers.saturating_sub(1),
        load()
    );
    let session = c
        .sessions_of("fanout", "openai:fake", &[], 1, false)
        .pop()
        .unwrap();
    let base = match turns(&c, &session, n_turns) {
        Ok(ms) => ms,
        Err(why) => {
            not_measured("the baseline", &why);
            return;
        }
    };
    let rss0 = rss_kb(c.api.pid());

    // The subscribers: raw connections, so one can stall without a client library's buffers.
    let addr = c.url.trim_start_matches("http://").to_owned();
    let request = format!(
        "GET /v1/sessions/{session}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        c.key
    );
    let connected = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..subscribers {
        let (addr, request, connected, bytes) = (
            addr.clone(),
            request.clone(),
            connected.clone(),
            bytes.clone(),
        );
        tasks.push(c.rt.spawn(async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            if i == 0 {
                // Stalled: never reads; holds the connection open.
                connected.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            let mut buf = vec![0u8; 16 * 1024];
            let mut first = true;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => {
                        if std::mem::take(&mut first) {
                            connected.fetch_add(1, Ordering::SeqCst);
                        }
                        bytes.fetch_add(k as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let all = poll(300, || {
        (connected.load(Ordering::SeqCst) >= subscribers).then_some(())
    });
    let rss1 = rss_kb(c.api.pid());
    let b0 = bytes.load(Ordering::Relaxed);
    let with = match turns(&c, &session, n_turns) {
        Ok(ms) => ms,
        Err(why) => {
            not_measured("with the subscribers", &why);
            return;
        }
    };
    let streamed = bytes.load(Ordering::Relaxed) - b0;
    for t in &tasks {
        t.abort();
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = match turns(&c, &session, n_turns) {
        Ok(ms) => ms,
        Err(why) => {
            not_measured("the second baseline", &why);
            return;
        }
    };
    println!(
        "  subscribers connected: {} of {subscribers}{}",
        connected.load(Ordering::SeqCst),
        if all.is_some() {
            ""
        } else {
            " (not all within 300 s)"
        }
    );
    println!(
        "  turn latency p50: baseline {base:.0} ms, with subscribers {with:.0} ms, baseline again {after:.0} ms; \
         with / baseline = {:.2}   (target: <= 1.10)",
        with / base.max(1.0)
    );
    println!(
        "  bytes delivered to the readers during the measured turns: {streamed} ({} per reader)",
        streamed / subscribers.saturating_sub(1).max(1) as u64
    );
    println!(
        "  server RSS: {} MB before the subscribers, {} MB with them: {:.1} KB per subscriber   (no target)",
        rss0 / 1024,
        rss1 / 1024,
        rss1.saturating_sub(rss0) as f64 / subscribers.max(1) as f64
    );
    println!("  load average at the end: {}", load());
    drop(server);
}
