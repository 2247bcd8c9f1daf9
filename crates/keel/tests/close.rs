//! `keel sessions close SESSION`: the session ends for good (`closed`), as `keel sessions
//! list/show` say; closing twice is fine; a closed session cannot be resumed.
//!
//! Before, there was no such command (clap refused `close`, exit 2) and no session ever reached
//! `closed`.

use serde_json::Value;

use crate::common::{Env, check_stream, run_script, stderr, stdout};

#[test]
fn a_closed_session_is_listed_as_closed_and_refuses_resume() {
    let env = Env::new();
    let (exit, lines) = run_script(&env, "{\"text\":\"first\"}\n{\"text\":\"second\"}\n", &[]);
    assert_eq!(exit, Some(0));
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&["sessions", "close", &session]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("closed session {session}")),
        "{}",
        stdout(&out)
    );
    // Listed and shown as closed.
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    let row: Value = serde_json::from_str(list.lines().next().unwrap()).unwrap();
    assert_eq!(row["status"], "closed", "{row}");
    let table = stdout(&env.run(&["sessions", "list"]));
    assert!(table.contains("closed"), "{table}");
    let closed_only = stdout(&env.run(&["sessions", "list", "--status", "closed", "--json"]));
    assert_eq!(closed_only.lines().count(), 1, "{closed_only}");
    let show: Value =
        serde_json::from_str(&stdout(&env.run(&["sessions", "show", &session, "--json"]))).unwrap();
    assert_eq!(show["status"], "closed");
    assert!(stdout(&env.run(&["sessions", "show", &session])).contains("closed"));
    // Twice: exit 0 again, and says so.
    let again = env.run(&["sessions", "close", &session]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).contains("already"), "{}", stdout(&again));
    // A closed session takes no more input.
    let resume = env.run(&["resume", &session, "more", "--output", "jsonl"]);
    assert_eq!(resume.status.code(), Some(1));
    assert!(stderr(&resume).contains("is closed"), "{}", stderr(&resume));
}

#[test]
fn closing_an_unknown_session_is_a_clear_error() {
    let env = Env::new();
    let unknown = "01a22a64-5c61-7467-9c9b-abbed5bec89d";
    let out = env.run(&["sessions", "close", unknown]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains(&format!("no session {unknown}")), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let out = env.run(&["sessions", "close", "not-an-id"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a session id"),
        "{}",
        stderr(&out)
    );
}
