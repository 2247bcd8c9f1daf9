//! A takeover as an operator sees it: after `kill -9` of a worker process, the survivor that
//! takes its session over counts it on its own `/metrics`.

use std::time::SystemTime;

use serde_json::json;

use super::{Cluster, LEASE_TTL_MS, Worker, event_ms, shell, unix_ms, wait, wait_for_process};

/// `keel_lease_takeovers_total` on `worker`'s `/metrics`.
fn takeovers(worker: &Worker) -> f64 {
    let text = worker.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix("keel_lease_takeovers_total "))
        .unwrap_or_else(|| panic!("no keel_lease_takeovers_total in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Worker A runs a session's `shell` call (a 25 s sleep); worker B starts idle, its
/// `keel_lease_takeovers_total` at 0. A is killed with SIGKILL; once A's lease has run out B
/// claims the session (recovery marks the cut call `outcome_unknown`, written after the kill:
/// by B), and B's `/metrics` counts the takeover (≥ 1). The test decides the effect `failed`
/// as the human and B completes the turn.
#[test]
fn a_survivors_metrics_count_the_takeover_after_a_kill_9() {
    let c = Cluster::postgres();
    let mut victim = c.worker(&["--concurrency", "2"]);
    let marker = "25.4321";
    let session = c.start_turn(
        "taken",
        &[
            shell(&format!("sleep {marker}; echo late >> takeover.txt")),
            json!({"text": "done"}),
        ],
    );
    wait_for_process(marker);
    let owner = c.lease_owner(&session).expect("A holds the session");
    assert!(victim.owns(&owner), "{owner}");
    let survivor = c.worker(&["--concurrency", "2"]);
    assert_eq!(takeovers(&survivor), 0.0, "nothing taken over yet");

    victim.kill_9();
    let killed = unix_ms(SystemTime::now());
    let unknown = wait(60, "the survivor takes the session over", || {
        c.events(&session)
            .into_iter()
            .find(|e| e["type"] == "effect.outcome_unknown")
    });
    let after = event_ms(&unknown) - killed;
    assert!(after >= 0, "written after the kill: {unknown}");
    let counted = wait(10, "the survivor's /metrics counts the takeover", || {
        let n = takeovers(&survivor);
        (n >= 1.0).then_some(n)
    });

    let key = unknown["operation_key"].as_str().unwrap();
    c.block_on(c.client.decide_effect(
        &session,
        key,
        keel_client::api::EffectDecisionParam::Failed,
        Some("killed with its worker"),
    ))
    .unwrap();
    c.completed_turn(&session);
    eprintln!(
        "kill -9: the survivor wrote the cut call's outcome_unknown {after} ms after the kill \
         (lease TTL {LEASE_TTL_MS} ms); keel_lease_takeovers_total on its /metrics: {counted}"
    );
}
