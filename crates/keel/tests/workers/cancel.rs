//! Cancellation across processes: the API node records the intent, the worker process holding
//! the session hears of it through the store (LISTEN/NOTIFY) and stops the turn.

use std::time::{Instant, SystemTime};

use serde_json::json;

use super::{Cluster, event_ms, processes_with, shell, unix_ms, wait, wait_for_process};

/// `POST /v1/sessions/{id}/cancel` on an API-only node ends a turn that a `keel worker`
/// process runs (a `shell` command that would sleep 30 s): the turn ends `aborted` within 10 s
/// of the POST (the target is 1 s; the latency to the `turn.finished` event is
/// printed), the call's effect is `outcome_unknown` (stopped mid-flight, never "failed"), and
/// the command's process is gone.
#[test]
fn cancel_reaches_the_owning_worker_on_another_node() {
    let c = Cluster::postgres();
    let worker = c.worker(&["--concurrency", "2"]);
    // A duration no other process uses: it finds the command's processes.
    let marker = "29.8765";
    let session = c.start_turn(
        "slow",
        &[
            shell(&format!("sleep {marker}")),
            json!({"text": "finished after the cancel"}),
        ],
    );
    wait_for_process(marker);
    let owner = c
        .lease_owner(&session)
        .expect("the worker holds the session");
    assert!(worker.owns(&owner), "{owner}");

    let posted = unix_ms(SystemTime::now());
    let clock = Instant::now();
    c.block_on(c.client.cancel_turn(&session)).unwrap();
    let finished = wait(10, "the turn ends after the cancel", || {
        c.finished_turns(&session).pop()
    });
    let seen_ms = clock.elapsed().as_millis();
    assert_eq!(
        finished["payload"]["terminal_reason"], "aborted",
        "{finished}"
    );
    let latency_ms = event_ms(&finished) - posted;
    assert!(latency_ms < 10_000, "{latency_ms} ms");
    eprintln!(
        "cross-process cancel: turn.finished {latency_ms} ms after the POST (seen through the API after {seen_ms} ms)"
    );
    assert_eq!(c.effect_statuses(&session), ["outcome_unknown"]);
    wait(10, "the shell command's processes end", || {
        processes_with(marker).is_empty().then_some(())
    });
}
