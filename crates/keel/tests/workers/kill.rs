//! A worker killed with SIGKILL mid-run among three (issue 13's "Done when"): its sessions
//! move on, nothing runs twice, and what cannot be known goes to a human.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Instant, SystemTime};

use serde_json::json;

use super::{
    Cluster, LEASE_TTL_MS, POLL_MS, Worker, delayed, log_field, median_max, shell, unix_ms, wait,
    wait_for_process,
};

/// Sessions of the test: 200, or `KEEL_TEST_WORKER_SESSIONS` for a larger trial.
fn session_count() -> usize {
    std::env::var("KEEL_TEST_WORKER_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// How long after the kill a dead worker's session may wait to be taken over (ms): its lease
/// runs out at most a TTL after the kill, a poll later an idle worker looks, and the margin
/// covers a worker whose slots are all busy until one frees (each session here holds one for
/// under a second) on a loaded machine.
const TAKEOVER_BOUND_MS: i64 = (LEASE_TTL_MS + POLL_MS) as i64 + 10_000;

/// The sessions whose lease `worker` holds with a call dispatched (its command running) at or
/// after `since_ms` (unix ms; 0: whenever).
fn dispatched_on(c: &Cluster, worker: &Worker, since_ms: i64) -> BTreeSet<String> {
    c.rows(&format!(
        "SELECT e.session_id, s.lease_owner FROM effects e JOIN sessions s ON s.session_id = e.session_id \
         WHERE e.status = 'dispatched' AND s.lease_owner IS NOT NULL AND e.updated_at >= {since_ms}",
    ))
    .into_iter()
    .filter(|r| r[1].as_deref().is_some_and(|o| worker.owns(o)))
    .filter_map(|r| r[0].clone())
    .collect()
}

/// An API-only node and three `keel worker` processes (8 sessions each) share one PostgreSQL
/// schema; 200 sessions, each on its own release, run a `shell` call that appends the
/// session's unique token to one effect file, then answer. One worker is killed with SIGKILL
/// once some sessions completed and some of its own have their command dispatched. Then:
/// every session completes, exactly one turn each; the effect file holds every token exactly
/// once; each dead-worker session whose command was dispatched and not committed is
/// `outcome_unknown` (never re-run blindly) and only those — the test decides them as the
/// human (`committed` when its token is in the file, else `retry`); and each of the dead
/// worker's unfinished sessions is taken over (its first event after the kill) within the
/// lease TTL + poll interval + a margin. Takeover times and decisions are printed.
#[test]
fn three_workers_two_hundred_sessions_one_killed() {
    let n = session_count();
    let c = Cluster::postgres();
    let started = Instant::now();
    let scripts: Vec<_> = (0..n)
        .map(|i| {
            let command = format!("sleep 0.3; echo tok-{i} >> effects.txt; sleep 0.3");
            (
                format!("s{i}"),
                vec![
                    delayed(100, shell(&command)),
                    json!({"text": format!("done {i}")}),
                ],
            )
        })
        .collect();
    let sessions = c.start_turns(&scripts);
    let queued = started.elapsed();
    let token_of: BTreeMap<&str, String> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), format!("tok-{i}")))
        .collect();

    let [first, mut victim, third]: [Worker; 3] =
        std::array::from_fn(|_| c.worker(&["--concurrency", "8"]));
    // Some sessions done, and some of the victim's with their command dispatched in the last
    // 200 ms: each command runs 600 ms, so they are still running when the kill lands a few ms
    // later. (Batch claims start a worker's sessions together, so its calls also end together:
    // calls dispatched earlier could all commit between the look and the kill.)
    wait(120, "a moment to kill the worker", || {
        let idle = c.rows("SELECT count(*)::text FROM sessions WHERE status = 'idle'");
        let idle: u64 = idle[0][0].as_deref().unwrap().parse().unwrap();
        let recent = unix_ms(SystemTime::now()) - 200;
        (idle >= 10 && dispatched_on(&c, &victim, recent).len() >= 2).then_some(())
    });
    victim.kill_9();
    let killed = unix_ms(SystemTime::now());
    // Nobody can change the victim's rows until its leases run out: what it left.
    let orphans: BTreeSet<String> = c.leased_by(&victim).into_iter().collect();
    let cut = dispatched_on(&c, &victim, 0);
    assert!(!cut.is_empty(), "a call of the dead worker was cut");

    // Act as the human on every outcome_unknown effect until every session is idle.
    let mut decided: HashSet<String> = HashSet::new();
    let mut needed: BTreeSet<String> = BTreeSet::new();
    let (mut committed, mut retried) = (0, 0);
    wait(240, "every session completes", || {
        let waiting = c.rows("SELECT session_id FROM sessions WHERE status = 'requires_action'");
        for session in waiting.into_iter().filter_map(|r| r[0].clone()) {
            let effects = c
                .block_on(c.client.list_effects(&session, Some("outcome_unknown")))
                .unwrap();
            for e in effects {
                if !decided.insert(e.operation_key.clone()) {
                    continue;
                }
                needed.insert(session.clone());
                let in_file = c
                    .lines_of("effects.txt")
                    .contains(&token_of[session.as_str()]);
                let decision = if in_file {
                    committed += 1;
                    keel_client::api::EffectDecisionParam::Committed
                } else {
                    retried += 1;
                    keel_client::api::EffectDecisionParam::Retry
                };
                c.block_on(c.client.decide_effect(
                    &session,
                    &e.operation_key,
                    decision,
                    Some("decided from the effect file"),
                ))
                .unwrap();
            }
        }
        let idle = c.rows("SELECT count(*)::text FROM sessions WHERE status = 'idle'");
        (idle[0][0].as_deref() == Some(&n.to_string())).then_some(())
    });
    let total = started.elapsed();

    // Exactly one turn each, completed.
    let finished = c.rows(
        "SELECT session_id, body::jsonb #>> '{payload,terminal_reason}', ts::text FROM events \
         WHERE type = 'turn.finished'",
    );
    assert_eq!(finished.len(), n, "one turn.finished per session");
    let mut finished_at = BTreeMap::new();
    for r in &finished {
        assert_eq!(r[1].as_deref(), Some("completed"), "{r:?}");
        let ms: i64 = r[2].as_deref().unwrap().parse().unwrap();
        finished_at.insert(r[0].clone().unwrap(), ms);
    }
    assert_eq!(finished_at.len(), n);

    // Every token exactly once.
    let lines = c.lines_of("effects.txt");
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &lines {
        *counts.entry(l.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, k)| **k > 1).collect();
    assert!(twice.is_empty(), "appended twice: {twice:?}");
    assert_eq!(lines.len(), n, "every token once");

    // First what would explain a surprise below: the survivors took leases over from the dead
    // worker only, never from each other (a live worker's lease ran out: an overloaded host),
    // and no run failed.
    for w in [&first, &third] {
        let log = w.run.stderr_lines();
        for l in &log {
            assert!(!l.contains("session run failed"), "{l}");
            if l.contains("took over an expired lease") {
                assert!(
                    log_field(l, "previous").is_some_and(|o| victim.owns(o)),
                    "a live worker's lease ran out (the dead one was pid {}): {l}",
                    victim.pid()
                );
            }
        }
    }
    // The human was needed for exactly the calls cut on the dead worker.
    assert_eq!(
        needed, cut,
        "outcome_unknown sessions vs calls dispatched on the dead worker"
    );
    assert!(cut.is_subset(&orphans));

    // Takeover: the first event after the kill of each of the dead worker's unfinished
    // sessions (written by another worker: the victim is gone).
    let mut takeovers = Vec::new();
    for s in &orphans {
        if finished_at[s] <= killed {
            continue; // its turn had ended; nothing to take over
        }
        let first = c.rows(&format!(
            "SELECT min(ts)::text FROM events WHERE session_id = '{s}' AND ts > {killed}"
        ));
        let ms: i64 = first[0][0].as_deref().unwrap().parse().unwrap();
        takeovers.push(ms - killed);
    }
    assert!(!takeovers.is_empty());
    let (median, max) = median_max(takeovers.clone());
    assert!(
        max <= TAKEOVER_BOUND_MS,
        "a dead worker's session waited {max} ms (bound {TAKEOVER_BOUND_MS} ms): {takeovers:?}"
    );
    eprintln!(
        "kill -9 of one of 3 workers, {n} sessions: queued in {} ms, all completed {} ms after the first was queued; \
         the dead worker held {} sessions ({} with a call dispatched); takeover after the kill: median {median} ms, max {max} ms \
         over {} sessions (lease TTL {LEASE_TTL_MS} ms, poll {POLL_MS} ms); human decisions: {} ({committed} committed, {retried} retry)",
        queued.as_millis(),
        total.as_millis(),
        orphans.len(),
        cut.len(),
        takeovers.len(),
        needed.len(),
    );
}

/// A run that lasts several lease TTLs keeps its lease (`[scheduler] lease_ttl_ms` = 2 s
/// here): its heartbeats renew the lease the worker claimed in time, so a second, idle worker
/// never takes the session over from the live one; the 6 s `shell` call runs once, commits
/// (no `outcome_unknown`) and the turn completes on the worker that claimed it. (The runtimes
/// used to renew on their own 10 s TTL, every 3.3 s: a shorter scheduler TTL ran out under
/// every longer run.)
#[test]
fn a_run_longer_than_the_lease_ttl_keeps_its_lease() {
    let c = Cluster::postgres_with_ttl(2000);
    let a = c.worker(&["--concurrency", "2"]);
    let marker = "6.0456";
    let session = c.start_turn(
        "long",
        &[
            shell(&format!("sleep {marker}; echo once >> long.txt")),
            json!({"text": "done"}),
        ],
    );
    wait_for_process(marker);
    let b = c.worker(&["--concurrency", "2"]);
    let end = wait(60, "the turn ends or its call is cut", || {
        c.events(&session)
            .into_iter()
            .find(|e| e["type"] == "turn.finished" || e["type"] == "effect.outcome_unknown")
    });
    assert_eq!(
        end["type"], "turn.finished",
        "the run lost its lease: {end}"
    );
    assert_eq!(end["payload"]["terminal_reason"], "completed", "{end}");
    assert_eq!(c.effect_statuses(&session), ["committed"]);
    assert_eq!(c.lines_of("long.txt"), ["once"]);
    for l in b.run.stderr_lines() {
        assert!(!l.contains("took over"), "B took the live run over: {l}");
    }
    assert!(
        a.run
            .stderr_lines()
            .iter()
            .all(|l| !l.contains("lease lost")),
        "{:#?}",
        a.run.stderr_lines()
    );
}
