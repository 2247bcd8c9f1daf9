//! `keel --server URL sessions events SESSION --follow`: started while the run waits on an
//! approval, it prints the journal so far and then each event as it is journaled — through the
//! approval, the rest of the turn and the session going idle — until the session is closed,
//! then exits 0: exactly what the local `--follow` prints, and exactly the journal.

use super::{ASK, Options, Pair, types};
use crate::common::{Running, jsonl_lines, stderr};

/// On one side: the run waits on the approval; a follower starts; the approval is decided
/// (and, locally, the session resumed); the turn ends; the session is closed. Returns the
/// follower's exit code and lines, and the journal as `sessions events` prints it afterwards.
fn follow(p: &Pair, remote: bool) -> (Option<i32>, Vec<String>, std::process::Output) {
    let args = p.run_args(remote, &["--output", "jsonl"], "hello");
    let run = p.cmd(remote).args(&args).output().unwrap();
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let result = jsonl_lines(&run.stdout).pop().unwrap();
    let session = result["session_id"].as_str().unwrap().to_owned();
    let approval = result["pending"][0]["approval_id"].as_str().unwrap();

    let mut cmd = p.cmd(remote);
    cmd.args(["sessions", "events", &session, "--follow"]);
    let mut follower = Running::start(cmd);
    follower.wait_for("\"status\":\"requires_action\"", 60);

    let approve = p.cmd(remote).args(["approve", approval]).output().unwrap();
    assert!(approve.status.success(), "{}", stderr(&approve));
    // Locally the session waits for `keel resume`; the server goes on by itself (a remote
    // resume only shows what it did).
    let resume = p
        .cmd(remote)
        .args(["resume", &session, "--output", "jsonl"])
        .output()
        .unwrap();
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    follower.wait_for("\"type\":\"turn.finished\"", 60);
    follower.wait_for("\"status\":\"idle\"", 60);

    let close = p
        .cmd(remote)
        .args(["sessions", "close", &session])
        .output()
        .unwrap();
    assert!(close.status.success(), "{}", stderr(&close));
    let (code, lines) = follower.finish(30);
    let journal = p
        .cmd(remote)
        .args(["sessions", "events", &session])
        .output()
        .unwrap();
    (code, lines, journal)
}

#[test]
fn events_follow_over_the_server_prints_what_a_local_follow_prints() {
    let p = Pair::new(ASK, &Options::default());
    let (lc, ll, lj) = follow(&p, false);
    let (rc, rl, rj) = follow(&p, true);
    assert_eq!(
        lc,
        Some(0),
        "the local follower ends when the session closes"
    );
    assert_eq!(
        rc,
        Some(0),
        "the remote follower ends when the session closes"
    );
    // Each follower printed exactly the journal, line for line.
    let journal = |o: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(ll, journal(&lj), "local follower vs local journal");
    assert_eq!(rl, journal(&rj), "remote follower vs the server's journal");
    // And the two journals tell the same story.
    assert_eq!(types(&lj), types(&rj));
    assert_eq!(
        types(&rj).last().map(String::as_str),
        Some("session.status_changed")
    );
    assert!(
        rl.last().unwrap().contains("\"status\":\"closed\""),
        "{rl:#?}"
    );
}
