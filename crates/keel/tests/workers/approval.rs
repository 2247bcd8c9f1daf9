//! An approval across processes (issue 13 item 4): the worker process that ran the turn gives
//! the session back while it waits on a human, the decision is posted to the API-only node, and
//! a worker claims the session again and finishes the turn.

use std::time::Duration;

use serde_json::json;

use super::{Cluster, POLL_MS, shell, wait};

/// The session row's `(status, lease_owner, lease_epoch)`.
fn row(c: &Cluster, session: &str) -> (Option<String>, Option<String>, Option<String>) {
    let mut rows = c.rows(&format!(
        "SELECT status, lease_owner, lease_epoch::text FROM sessions WHERE session_id = '{session}'"
    ));
    let mut r = rows.pop().unwrap_or_else(|| panic!("no session {session}"));
    let epoch = r.pop().unwrap();
    let owner = r.pop().unwrap();
    (r.pop().unwrap(), owner, epoch)
}

/// A `keel worker` process runs a turn until its `shell` call needs approval (the release
/// does not allow `shell`), then gives the session back: the session is `requires_action`
/// with no lease holder (`lease_owner` NULL), nothing ran, and nobody claims it again while it
/// waits (its lease epoch stays put over five poll intervals). The approval is decided
/// `allow_once` on the API-only node (`--workers 0`, which runs no session); the worker claims
/// the session again, runs the call once and completes the turn.
#[test]
fn an_approval_decided_on_the_api_node_resumes_the_session_on_a_worker_process() {
    let c = Cluster::postgres();
    let worker = c.worker(&["--concurrency", "2"]);
    let lines = [
        shell("echo approved >> approval.txt"),
        json!({"text": "done"}),
    ];
    let session = c
        .start_turns_with(&[("asks".to_owned(), lines.to_vec())], &json!({}))
        .pop()
        .unwrap();

    let approval = wait(60, "the call waits on approval", || {
        c.block_on(c.client.session_approvals(&session, Some("pending")))
            .unwrap()
            .pop()
    });
    assert_eq!(approval.tool_name, "shell");
    // The worker that asked gives the session back.
    let (status, _, epoch) = wait(30, "the worker gives the session back", || {
        let (status, owner, epoch) = row(&c, &session);
        owner.is_none().then_some((status, owner, epoch))
    });
    assert_eq!(status.as_deref(), Some("requires_action"));
    assert!(c.lines_of("approval.txt").is_empty(), "nothing ran yet");
    // It stays free while it waits: no worker claims it to find nothing to do.
    std::thread::sleep(Duration::from_millis(5 * POLL_MS));
    assert_eq!(
        row(&c, &session),
        (status.clone(), None, epoch.clone()),
        "claimed again while it waits on a human"
    );

    c.block_on(c.client.decide_approval(
        &approval.approval_id,
        keel_client::api::ApprovalDecisionParam::AllowOnce,
        &approval.args_hash,
        None,
    ))
    .unwrap();
    c.completed_turn(&session);
    assert_eq!(c.lines_of("approval.txt"), ["approved"]);
    assert_eq!(c.effect_statuses(&session), ["committed"]);
    // Claimed again after the decision (the epoch rose), and given back at the end.
    let (status, owner, end_epoch) = row(&c, &session);
    assert_eq!((status.as_deref(), owner), (Some("idle"), None));
    let number = |e: Option<String>| e.unwrap().parse::<u64>().unwrap();
    assert!(number(end_epoch) > number(epoch), "not claimed again");
    let log = worker.run.stderr_lines();
    assert!(
        log.iter().all(|l| !l.contains("session run failed")),
        "{log:#?}"
    );
}
