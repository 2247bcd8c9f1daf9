//! Multi-process benches on PostgreSQL (issue 16's table), each printing its figures with the
//! target beside them and exiting 0 whatever they are. An API-only `keel serve --workers 0` and
//! `keel worker` processes share a fresh schema of `KEEL_TEST_DATABASE_URL`; sessions are made
//! through the HTTP API with the scripted model; the store's rows are read with SQL.
//!
//! - `recovery`: `KEEL_BENCH_SESSIONS` (default 1,000) sessions, each running a side-effecting
//!   `shell` call (`echo x >> effects.txt`) and then a slow model step (`KEEL_BENCH_DELAY_MS`,
//!   default 600,000), all run by one worker (`--concurrency` = sessions). Once every effect is
//!   committed (every session is in its slow step), the worker is killed with SIGKILL (its
//!   leases are not released), the script is rewritten without the delay (the new worker's
//!   model reads it afresh, so resumed turns end at once) and a new worker is started. Resumed = the session's lease
//!   is held by the new worker (or its turn already ended again); the time is from the new
//!   worker's spawn and includes waiting for the dead worker's leases to expire
//!   (`KEEL_BENCH_LEASE_TTL_MS`, default 3,000). Duplicate effects = lines in `effects.txt`
//!   beyond one per session, and dispatch attempts beyond one per effect (`effects.attempts`).
//!   Targets: all resumed ≤ 5 s, duplicates 0.
//! - `multi`: for 1, 2 and 4 workers (`--concurrency 16` each, a fresh schema each), phase 1:
//!   `KEEL_BENCH_SESSIONS` (default 200) sessions of `KEEL_BENCH_STEPS` (default 10) read-only
//!   `read_file` steps; steps/s = all steps / (last `turn.finished` − first `turn.started`, from
//!   the events' timestamps). Phase 2: as many sessions again with a slow step (1 s model delay
//!   per step, 3 steps); when a quarter are done one worker is killed with SIGKILL (with 1
//!   worker a new one is started); `KEEL_BENCH_WORKERS` (default `1,2,4`) chooses the counts.
//!   Lease-takeover time = per session the dead worker held
//!   unfinished, its first event after the kill − the kill (median, max).
//!
//! `cargo bench -p keel --bench workers` (both), `… -- recovery`, `… -- multi`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod cluster;

use std::collections::BTreeSet;
use std::time::Instant;

use cluster::{Cluster, POLL_MS, Proc, env, now_ms, poll};
use serde_json::{Value, json};

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn median_max(mut v: Vec<i64>) -> Option<(i64, i64)> {
    v.sort_unstable();
    Some((*v.get(v.len() / 2)?, *v.last()?))
}

fn recovery() {
    let n = env("KEEL_BENCH_SESSIONS", 1000);
    let ttl = env("KEEL_BENCH_LEASE_TTL_MS", 3000) as u64;
    let delay = env("KEEL_BENCH_DELAY_MS", 600_000);
    println!(
        "recovery on PostgreSQL: {n} sessions mid-turn, worker killed (SIGKILL), new worker started; \
         lease TTL {ttl} ms, poll {POLL_MS} ms, slow step {delay} ms; load average {}",
        load()
    );
    let c = Cluster::postgres(ttl);
    let lines = [
        json!({"tool_calls": [{"name": "shell", "arguments": {"command": "echo x >> effects.txt"}}]}),
        json!({"text": "done", "delay_ms": delay}),
    ];
    let t = Instant::now();
    let sessions = c.sessions("recovery", &lines, &["shell"], n);
    println!(
        "  {} sessions created and queued in {:.1} s",
        sessions.len(),
        t.elapsed().as_secs_f64()
    );
    let mut old = c.worker(n);
    let t = Instant::now();
    let ready = poll(900, || {
        let committed = c.count("SELECT count(*)::text FROM effects WHERE status = 'committed'");
        (committed as usize >= n).then_some(())
    });
    let committed = c.count("SELECT count(*)::text FROM effects WHERE status = 'committed'");
    let held: BTreeSet<String> = c.leased_by(old.pid()).into_iter().collect();
    println!(
        "  old worker: {committed} effects committed, {} sessions held in their slow step after {:.1} s{}",
        held.len(),
        t.elapsed().as_secs_f64(),
        if ready.is_some() {
            ""
        } else {
            " (not all: killed anyway after 900 s)"
        }
    );
    if held.len() as u64 + c.idle() < n as u64 {
        println!("  warning: some sessions were neither held nor finished at the kill");
    }
    old.kill_9();
    // The new worker's model reads the script afresh: the slow step answers at once after the
    // resume, so the turns' completion measures the recovery, not the delay.
    c.script("recovery", &[lines[0].clone(), json!({"text": "done"})]);
    let t0 = Instant::now();
    let t0_ms = now_ms();
    let new: Proc = c.worker(n);
    let up = t0.elapsed();
    // When the dead worker's leases expire, from the new worker's spawn (Unix ms in the rows):
    // the part of the take-over that is waiting out the TTL.
    let expiry = |f: &str| {
        c.count(&format!(
            "SELECT {f}(lease_expires_at)::text FROM sessions WHERE lease_owner IS NOT NULL"
        )) as i64
            - t0_ms
    };
    let (first_expiry, last_expiry) = (expiry("min"), expiry("max"));
    let mut first = None;
    let mut half = None;
    let mut resumed_at = None;
    let deadline_s = (ttl / 1000) + 600;
    poll(deadline_s, || {
        let mine: BTreeSet<String> = c.leased_by(new.pid()).into_iter().collect();
        let idle = c.count(&format!(
            "SELECT count(*)::text FROM sessions WHERE status = 'idle' AND session_id IN \
             (SELECT session_id FROM events WHERE type = 'turn.finished' AND ts >= {t0_ms})"
        ));
        let resumed = held.iter().filter(|s| mine.contains(*s)).count() as u64 + idle;
        if first.is_none() && resumed > 0 {
            first = Some(t0.elapsed());
        }
        if half.is_none() && resumed * 2 >= held.len() as u64 {
            half = Some(t0.elapsed());
        }
        (resumed >= held.len() as u64).then(|| resumed_at = Some(t0.elapsed()))
    });
    let completed = poll(delay as u64 / 1000 + 600, || {
        (c.idle() >= n as u64).then_some(())
    });
    let all_done = t0.elapsed();
    let lines_written = std::fs::read_to_string(c.ws().join("effects.txt"))
        .unwrap_or_default()
        .lines()
        .count();
    let effects = c.count("SELECT count(*)::text FROM effects");
    let attempts = c.count("SELECT coalesce(sum(attempts), 0)::text FROM effects");
    let unknown = c.count("SELECT count(*)::text FROM effects WHERE status = 'outcome_unknown'");
    let secs = |d: Option<std::time::Duration>| {
        d.map_or_else(
            || "not within the deadline".to_owned(),
            |d| format!("{:.2} s", d.as_secs_f64()),
        )
    };
    println!(
        "  new worker: up (serving /metrics) {:.2} s after its spawn; the dead worker's leases expired {:.2}-{:.2} s after it; \
         first resumed {}; half {}; all {} resumed {}   (target: <= 5 s, lease TTL {ttl} ms included)",
        up.as_secs_f64(),
        first_expiry as f64 / 1e3,
        last_expiry as f64 / 1e3,
        secs(first),
        secs(half),
        held.len(),
        secs(resumed_at)
    );
    println!(
        "  all {n} turns completed {} after the new worker's spawn (the slow step sampled again on resume answers at once: script rewritten before the spawn)",
        if completed.is_some() {
            format!("{:.1} s", all_done.as_secs_f64())
        } else {
            "not".to_owned()
        }
    );
    println!(
        "  duplicate effects: {} extra lines in effects.txt ({lines_written} for {n} sessions), {} extra dispatches ({attempts} attempts for {effects} effects), {unknown} outcome_unknown   (target: 0)",
        lines_written.saturating_sub(n),
        attempts.saturating_sub(effects)
    );
    println!("  load average at the end: {}", load());
}

/// Phase 1 of `multi`: steps/s of `k` workers over `n` sessions of `steps` read-only steps.
fn throughput(c: &Cluster, k: usize, n: usize, steps: usize) -> Option<f64> {
    let mut lines: Vec<Value> = (0..steps)
        .map(|_| json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]}))
        .collect();
    lines.push(json!({"text": "done"}));
    c.sessions("fast", &lines, &["read_file"], n);
    let workers: Vec<Proc> = (0..k).map(|_| c.worker(16)).collect();
    poll(900, || (c.idle() >= n as u64).then_some(()))?;
    let span = c.rows(
        "SELECT (SELECT min(ts) FROM events WHERE type = 'turn.started')::text, \
                (SELECT max(ts) FROM events WHERE type = 'turn.finished')::text",
    );
    drop(workers);
    let first: i64 = span[0][0].as_deref()?.parse().ok()?;
    let last: i64 = span[0][1].as_deref()?.parse().ok()?;
    Some((n * steps) as f64 / ((last - first).max(1) as f64 / 1000.0))
}

/// Phase 2 of `multi`: one of `k` workers killed mid-run; the takeover times (ms) of its
/// unfinished sessions.
fn takeover(c: &Cluster, k: usize, n: usize) -> Vec<i64> {
    let lines = [
        json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}], "delay_ms": 1000}),
        json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}], "delay_ms": 1000}),
        json!({"text": "done", "delay_ms": 1000}),
    ];
    let before = c.idle();
    c.sessions("slow", &lines, &["read_file"], n);
    let mut workers: Vec<Proc> = (0..k).map(|_| c.worker(16)).collect();
    poll(900, || {
        let done = c.idle() - before;
        (done * 4 >= n as u64 && !c.leased_by(workers[0].pid()).is_empty()).then_some(())
    });
    let victim = workers[0].pid();
    let orphans = c.leased_by(victim);
    workers[0].kill_9();
    let killed = now_ms();
    if k == 1 {
        workers.push(c.worker(16));
    }
    poll(900, || (c.idle() >= before + n as u64).then_some(()));
    orphans
        .iter()
        .filter_map(|s| {
            let r = c.rows(&format!(
                "SELECT min(ts)::text FROM events WHERE session_id = '{s}' AND ts > {killed}"
            ));
            let ms: i64 = r[0][0].as_deref()?.parse().ok()?;
            Some(ms - killed)
        })
        .collect()
}

fn multi() {
    let n = env("KEEL_BENCH_SESSIONS", 200);
    let steps = env("KEEL_BENCH_STEPS", 10);
    let ttl = env("KEEL_BENCH_LEASE_TTL_MS", 3000) as u64;
    println!(
        "multi-worker on PostgreSQL: {n} sessions x {steps} read-only steps, keel worker --concurrency 16 each; \
         lease TTL {ttl} ms, poll {POLL_MS} ms; load average {}",
        load()
    );
    let counts: Vec<usize> = std::env::var("KEEL_BENCH_WORKERS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    for k in counts {
        let c = Cluster::postgres(ttl);
        std::fs::write(c.ws().join("README.md"), "hello\n").unwrap();
        let sps = throughput(&c, k, n, steps);
        let times = takeover(&c, k, n);
        let count = times.len();
        let sps = sps.map_or_else(|| "not measured".to_owned(), |s| format!("{s:.0}"));
        let take = median_max(times).map_or_else(
            || "no session to take over".to_owned(),
            |(m, x)| format!("median {m} ms, max {x} ms over {count} sessions"),
        );
        println!(
            "  {k} worker(s): {sps} steps/s   (report);   lease takeover after a kill -9{}: {take}   (report; floor = TTL {ttl} ms + poll)   [load {}]",
            if k == 1 { " and a new worker" } else { "" },
            load()
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    match args.first().map_or("all", String::as_str) {
        "recovery" => recovery(),
        "multi" => multi(),
        _ => {
            recovery();
            multi();
        }
    }
}
