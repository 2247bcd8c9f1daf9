//! The embedded SQLite store runs the same scheduler in one process: `keel serve` with its
//! in-process workers drains on SIGTERM and the next `keel serve` continues the turn.

use std::time::{Instant, SystemTime};

use serde_json::json;

use super::{Cluster, event_ms, shell, unix_ms, wait_for_process};

/// `keel serve` (default in-process workers) on SQLite, SIGTERM while a turn runs its slow
/// `shell` step: the server lets the running call finish and commit, leaves the turn open
/// (not aborted) and exits 0; the restarted server continues the turn to `completed`. Each
/// command ran exactly once (each line once in the file, every effect committed).
#[test]
fn serve_on_sqlite_continues_a_turn_after_sigterm_and_restart() {
    let mut c = Cluster::sqlite();
    let marker = "1.5432";
    let session = c.start_turn(
        "restarted",
        &[
            shell("echo a >> restart.txt"),
            shell(&format!("sleep {marker}; echo b >> restart.txt")),
            shell("echo c >> restart.txt"),
            json!({"text": "done"}),
        ],
    );
    wait_for_process(marker);
    let sent = Instant::now();
    c.api.signal("TERM");
    assert_eq!(c.api.wait_exit(30), Some(0), "drained and exited 0");
    let drain = sent.elapsed();
    // Stopped at the call's end: its line is there, the next one not yet.
    assert_eq!(c.lines_of("restart.txt"), ["a", "b"]);

    let restarted = unix_ms(SystemTime::now());
    c.api.restart(&c.env, &[]);
    c.reconnect();
    let finished = c.completed_turn(&session);
    assert!(
        event_ms(&finished) >= restarted,
        "the drained turn was left open, for the next server: {finished}"
    );
    assert_eq!(c.lines_of("restart.txt"), ["a", "b", "c"]);
    assert_eq!(
        c.effect_statuses(&session),
        ["committed", "committed", "committed"]
    );
    eprintln!(
        "keel serve on SQLite: exited {} ms after SIGTERM mid-call; the restarted server completed the turn",
        drain.as_millis()
    );
}
