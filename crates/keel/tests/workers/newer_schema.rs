//! Mixed versions during a rolling upgrade: a worker leaves alone what a newer build wrote.

use std::time::Duration;

use serde_json::json;

use super::{Cluster, POLL_MS, wait};

/// A session whose journal was written by a newer event schema (its `schema_version` column,
/// and the envelope of one of its events, raised to 99 in the store) is left alone by a
/// `keel worker` of this build — never claimed, never misread: it stays queued with its
/// version, lease epoch and events unchanged over many poll intervals, while a session of
/// this schema beside it completes; the worker logs the sessions it leaves for newer workers
/// and counts them in `/metrics` as `keel_sessions_left_for_newer_schema`.
#[test]
fn a_session_of_a_newer_schema_is_left_alone() {
    let c = Cluster::postgres();
    let newer = c.start_turn("newer", &[json!({"text": "read by a newer build"})]);
    let current = c.start_turn("current", &[json!({"text": "done"})]);
    // What a newer build's worker would have left: its envelope version on the row and on
    // the journal's last event.
    assert_eq!(
        c.execute(&format!(
            "UPDATE sessions SET schema_version = 99 WHERE session_id = '{newer}'"
        )),
        1
    );
    assert_eq!(
        c.execute(&format!(
            "UPDATE events SET body = jsonb_set(body::jsonb, '{{schema_version}}', '99')::text \
             WHERE session_id = '{newer}' \
             AND seq = (SELECT max(seq) FROM events WHERE session_id = '{newer}')"
        )),
        1
    );
    let snapshot = || {
        c.rows(&format!(
            "SELECT status, version::text, lease_epoch::text, lease_owner, schema_version::text, \
             queued_turns::text, (SELECT count(*) FROM events e WHERE e.session_id = s.session_id)::text \
             FROM sessions s WHERE session_id = '{newer}'"
        ))
    };
    let before = snapshot();

    let worker = c.worker(&["--concurrency", "4"]);
    let done = wait(60, "the session of this schema completes", || {
        c.finished_turns(&current).pop()
    });
    assert_eq!(done["payload"]["terminal_reason"], "completed", "{done}");
    // Several poll intervals more: the worker looked again and again, and left it.
    std::thread::sleep(Duration::from_millis(8 * POLL_MS));
    let after = snapshot();
    assert_eq!(before, after, "the newer session was touched");
    let row = &after[0];
    assert_eq!(row[4].as_deref(), Some("99"), "schema_version");
    assert_eq!(row[5].as_deref(), Some("1"), "still queued: {row:?}");
    // Its lease epoch is the API node's last append's (in `before`): no worker claimed it.
    assert_eq!(row[3], None, "nobody holds it: {row:?}");

    let line = worker.run.wait_for_stderr("left for newer workers", 10);
    assert!(line.contains("sessions=1"), "{line}");
    let metrics = worker.metrics_text();
    let l = metrics
        .lines()
        .find(|l| l.starts_with("keel_sessions_left_for_newer_schema"))
        .unwrap_or_else(|| {
            panic!("no keel_sessions_left_for_newer_schema in /metrics:\n{metrics}")
        });
    assert!(l.ends_with(" 1"), "{l}");
}
