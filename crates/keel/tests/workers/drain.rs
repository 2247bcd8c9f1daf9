//! SIGTERM of a `keel worker` mid-turn: a graceful drain hands the turn to another worker
//! at a durable boundary; a second SIGTERM stops at once and the other worker recovers what
//! was cut.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::{
    Cluster, Worker, delayed, event_ms, processes_with, shell, unix_ms, wait, wait_for_process,
};

/// The drain timeout the drained workers get (`--drain-timeout`).
const DRAIN_TIMEOUT_S: u64 = 30;

/// Starts worker A, a session whose turn runs `lines` (its `shell` calls append to
/// `drain.txt`), waits until A holds it and the command with `marker` runs, then starts
/// worker B. Returns (A, B, session).
fn a_claims_then_b_starts(c: &Cluster, lines: &[Value], marker: &str) -> (Worker, Worker, String) {
    let drain_timeout = format!("{DRAIN_TIMEOUT_S}s");
    let worker_args = ["--concurrency", "2", "--drain-timeout", &drain_timeout];
    let a = c.worker(&worker_args);
    let session = c.start_turn("drained", lines);
    wait_for_process(marker);
    let owner = c.lease_owner(&session).expect("A holds the session");
    assert!(a.owns(&owner), "{owner}");
    let b = c.worker(&worker_args);
    (a, b, session)
}

/// Sends SIGTERM to `w` and polls its `/readyz` until it exits (≤ `secs`); returns its exit
/// code, the time from the signal to the exit, and whether /readyz answered 503 meanwhile.
fn terminate(w: &mut Worker, secs: u64) -> (Option<i32>, Duration, bool) {
    assert_eq!(w.probe("/readyz"), Some(200), "ready before the drain");
    w.run.signal("TERM");
    let sent = Instant::now();
    let mut unready = false;
    loop {
        if let Some(s) = w.run.child.try_wait().unwrap() {
            return (s.code(), sent.elapsed(), unready);
        }
        assert!(
            sent.elapsed() < Duration::from_secs(secs),
            "the worker did not exit within {secs} s of SIGTERM"
        );
        unready |= w.probe("/readyz") == Some(503);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM to worker A while it runs a turn's slow `shell` step (B started after A claimed
/// the session): /readyz of A answers 503 during the drain, A lets the running call finish
/// and commit, gives the session back and exits 0 well before its drain timeout; B, the only
/// worker left, runs the rest of the turn to `completed` (its third call and the turn's end
/// are journaled after A exited: by B). Every command ran exactly once (each token once in
/// the effect file, every effect committed, none `outcome_unknown`), and no turn ended
/// `aborted` or `failed`.
#[test]
fn sigterm_drains_mid_turn_and_another_worker_finishes() {
    let c = Cluster::postgres();
    let marker = "2.0123";
    let (mut a, mut b, session) = a_claims_then_b_starts(
        &c,
        &[
            shell("echo step-1 >> drain.txt"),
            shell(&format!("sleep {marker}; echo step-2 >> drain.txt")),
            // B's step: slow enough (0.5 s) that it ends after A's exit is seen.
            delayed(500, shell("echo step-3 >> drain.txt")),
            json!({"text": "done"}),
        ],
        marker,
    );
    let (code, drain, unready) = terminate(&mut a, 2 * DRAIN_TIMEOUT_S);
    let exited = unix_ms(SystemTime::now());
    assert_eq!(code, Some(0), "{:#?}", a.run.stderr_lines());
    assert!(
        drain < Duration::from_secs(DRAIN_TIMEOUT_S / 2),
        "the drain took {drain:?}: it waited for more than the running call"
    );
    assert!(unready, "/readyz never answered 503 during the drain");

    let finished = c.completed_turn(&session);
    let events = c.events(&session);
    // A finished the call it was running (its result is journaled before A exited) ...
    let of_type = |ty: &str, n: usize| {
        events
            .iter()
            .filter(|e| e["type"] == ty)
            .nth(n)
            .unwrap_or_else(|| panic!("no {ty} #{n}: {events:#?}"))
    };
    let step2_done = of_type("tool_call.finished", 1);
    assert!(event_ms(step2_done) <= exited, "{step2_done}");
    // ... and the third call and the turn's end were journaled after A was gone: by B.
    for e in [of_type("tool_call.started", 2), &finished] {
        assert!(event_ms(e) > exited, "written after A exited: {e}");
    }
    let next_step = events
        .iter()
        .find(|e| e["type"] == "step.started" && e["seq"].as_u64() > step2_done["seq"].as_u64())
        .expect("the next step");
    let handoff = event_ms(next_step) - event_ms(step2_done);
    assert_eq!(c.lines_of("drain.txt"), ["step-1", "step-2", "step-3"]);
    assert_eq!(
        c.effect_statuses(&session),
        ["committed", "committed", "committed"]
    );
    assert!(b.run.child.try_wait().unwrap().is_none(), "B still runs");
    eprintln!(
        "drain: A exited {} ms after SIGTERM (running call included; drain timeout {DRAIN_TIMEOUT_S} s), /readyz 503 during it; the next step started {handoff} ms after A's call finished",
        drain.as_millis()
    );
}

/// A second SIGTERM during a drain that would last long (A runs `sleep 20`): A exits at
/// once (within 5 s) and the command's processes end with it; B takes the session over
/// (its lease was released at once) and, as the recovery rules say for a side-effecting call
/// that was dispatched and never finished, marks it `outcome_unknown` instead of re-running
/// it. The test, as the human, decides `failed` (the effect file proves the command never
/// appended), and B completes the turn — not `aborted`, not `failed`.
#[test]
fn a_second_sigterm_stops_at_once_and_another_worker_recovers_the_cut_call() {
    let c = Cluster::postgres();
    let marker = "20.0123";
    let (mut a, _b, session) = a_claims_then_b_starts(
        &c,
        &[
            shell(&format!("sleep {marker}; echo long >> drain.txt")),
            json!({"text": "done"}),
        ],
        marker,
    );
    a.run.signal("TERM");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        a.run.child.try_wait().unwrap().is_none(),
        "A still drains: its running call takes 20 s"
    );
    assert_eq!(a.probe("/readyz"), Some(503), "unready while draining");
    a.run.signal("TERM");
    let sent = Instant::now();
    let second = unix_ms(SystemTime::now());
    let code = wait(5, "A exits at the second SIGTERM", || {
        a.run.child.try_wait().unwrap().map(|s| s.code())
    });
    let stop = sent.elapsed();
    assert_eq!(code, Some(0), "{:#?}", a.run.stderr_lines());
    wait(10, "the cut command's processes end with A", || {
        processes_with(marker).is_empty().then_some(())
    });

    let unknown = wait(30, "B marks the cut call outcome_unknown", || {
        c.events(&session)
            .into_iter()
            .find(|e| e["type"] == "effect.outcome_unknown")
    });
    // Recovery is the next claimer's: B, once A gave the session back.
    let takeover = event_ms(&unknown) - second;
    assert!(takeover >= 0, "written after the second SIGTERM: {unknown}");
    assert!(
        c.lines_of("drain.txt").is_empty(),
        "the command never appended"
    );
    let key = unknown["operation_key"].as_str().unwrap();
    c.block_on(c.client.decide_effect(
        &session,
        key,
        keel_client::api::EffectDecisionParam::Failed,
        Some("the effect file shows it never appended"),
    ))
    .unwrap();
    c.completed_turn(&session);
    assert!(c.lines_of("drain.txt").is_empty(), "nothing re-ran it");
    assert_eq!(c.effect_statuses(&session), ["failed"]);
    eprintln!(
        "second SIGTERM: A exited {} ms after it; B marked the cut call outcome_unknown {takeover} ms after that SIGTERM",
        stop.as_millis()
    );
}
