//! `keel --server URL cancel` of a turn whose shell command is still running: the cancel
//! lands at once and the run ends like a local one (exit 4, the same result line); a second
//! cancel finds nothing to cancel, as locally.

use std::time::{Duration, Instant};

use super::{Options, Pair, comparable, norm};
use crate::common::{Running, parse_lines, stderr, stdout};

/// A shell command that would run for two minutes, then an answer for the resume.
const SLOW: &str = r#"{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 120"}}]}
{"text": "finished after the cancel"}
"#;

/// The server lets sessions run shell unasked and unconfined, as the local runs here do.
const UNCONFINED: &str = "max_permission_mode = \"bypass\"\nallow_sandbox_off = true";

/// What cancelling the running shell command left on one side.
pub(super) struct Cancelled {
    pub(super) session: String,
    /// `keel cancel`'s answer.
    cancel: std::process::Output,
    /// The run's exit code and its comparable result line.
    exit: Option<i32>,
    result: serde_json::Value,
    /// The operation key of the shell call, now `outcome_unknown`.
    pub(super) key: String,
    /// From `keel cancel` to the run's exit.
    took: Duration,
}

/// Starts the slow run on one side, cancels it once the shell command runs, and waits for the
/// run to end: within 20 s (it ends in well under 2 s; the command alone would take 120 s).
pub(super) fn cancel_running(p: &Pair, remote: bool) -> Cancelled {
    let args = p.run_args(
        remote,
        &[
            "--permission-mode",
            "bypass",
            "--sandbox",
            "off",
            "--output",
            "jsonl",
        ],
        "sleep a while",
    );
    let mut cmd = p.cmd(remote);
    cmd.args(&args);
    let mut run = Running::start(cmd);
    let session = super::session_of(&run.wait_for("session.created", 60));
    run.wait_for("\"type\":\"tool_call.started\"", 60);
    let started = Instant::now();
    let cancel = p.cmd(remote).args(["cancel", &session]).output().unwrap();
    let (exit, lines) = run.finish(20);
    let took = started.elapsed();
    let events = parse_lines(&lines);
    let key = events
        .iter()
        .find(|e| e["type"] == "effect.outcome_unknown")
        .and_then(|e| e["operation_key"].as_str())
        .unwrap_or_else(|| panic!("no effect.outcome_unknown: {lines:#?}"))
        .to_owned();
    Cancelled {
        session,
        cancel,
        exit,
        result: comparable(events.last().unwrap().clone()),
        key,
        took,
    }
}

/// The two sides on [`SLOW`], the server allowing what the runs ask for.
pub(super) fn slow_pair() -> Pair {
    Pair::new(
        SLOW,
        &Options {
            server_toml: UNCONFINED,
            ..Options::default()
        },
    )
}

#[test]
fn cancelling_a_running_turn_over_the_server_ends_it_like_locally() {
    let p = slow_pair();
    let l = cancel_running(&p, false);
    let r = cancel_running(&p, true);
    for (side, c) in [("local", &l), ("remote", &r)] {
        assert_eq!(
            c.cancel.status.code(),
            Some(0),
            "{side}: {}",
            stderr(&c.cancel)
        );
        assert_eq!(c.exit, Some(4), "{side}: aborted");
        // The call was stopped mid-flight: whether its command ran is unknown, never "failed".
        assert!(c.key.starts_with(&c.session), "{side}: {}", c.key);
        assert_eq!(
            c.result["terminal_reason"], "aborted",
            "{side}: {}",
            c.result
        );
        assert!(c.took < Duration::from_secs(20), "{side}: {:?}", c.took);
        eprintln!("{side}: the run ended {:?} after keel cancel", c.took);
    }
    assert_eq!(
        norm(&p.local, &stdout(&l.cancel)),
        norm(&p.far, &stdout(&r.cancel)),
        "keel cancel's line"
    );
    assert_eq!(
        norm(&p.local, &l.result.to_string()),
        norm(&p.far, &r.result.to_string()),
        "result lines"
    );
    // Nothing is left to cancel: refused by both, exit 1.
    let o = p.both(&["cancel", &l.session], &["cancel", &r.session]);
    p.same(&o, 1);
}
