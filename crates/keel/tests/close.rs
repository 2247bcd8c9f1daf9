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

/// A `kill -9` of `keel run` between its session's row and `session.created` (two commits)
/// leaves a row with no event. `resume` says what happened and how to remove it; `sessions
/// close` removes it (exit 0), after which the session is unknown. Before, `resume` said only
/// "has no session.created event" and `close` failed ("session.created must be the first
/// event"): nothing could get rid of it.
#[test]
fn a_session_whose_creation_never_completed_is_named_and_can_be_removed() {
    let env = Env::new();
    // A first run makes the store (and its release) as a user's would.
    let (exit, lines) = run_script(&env, "{\"text\":\"first\"}\n", &[]);
    assert_eq!(exit, Some(0));
    let done = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let half = keel_core::SessionId::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use keel_store::Store;
        let store = keel_store::SqlStore::open_sqlite(&env.path("data/keel/keel.db"))
            .await
            .unwrap();
        let tenant = keel_core::TenantId::local();
        let first = store
            .get_session(tenant, done.parse().unwrap())
            .await
            .unwrap();
        // The row alone, lease free: what the creating process's first commit left.
        store
            .create_session(
                tenant,
                keel_store::types::NewSession {
                    session_id: half,
                    release_id: first.release_id,
                    parent_session_id: None,
                    metadata: serde_json::json!({"workspace": env.ws()}),
                },
            )
            .await
            .unwrap();
    });
    let half = half.to_string();
    let resume = env.run(&["resume", &half, "more"]);
    assert_eq!(resume.status.code(), Some(1));
    let err = stderr(&resume);
    assert!(
        err.contains("never completed") && err.contains(&format!("keel sessions close {half}")),
        "{err}"
    );
    let close = env.run(&["sessions", "close", &half]);
    assert_eq!(close.status.code(), Some(0), "{}", stderr(&close));
    assert!(
        stdout(&close).contains(&format!("removed session {half}")),
        "{}",
        stdout(&close)
    );
    let show = env.run(&["sessions", "show", &half]);
    assert_eq!(show.status.code(), Some(1));
    assert!(
        stderr(&show).contains(&format!("no session {half}")),
        "{}",
        stderr(&show)
    );
    // The complete session is untouched.
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    assert_eq!(list.lines().count(), 1, "{list}");
    assert!(list.contains(&done), "{list}");
}
