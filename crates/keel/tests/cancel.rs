//! `keel cancel` only cancels (issue 10, review item I): with a session's worker killed while a
//! follow-up waited in its queue, `keel cancel` ran the follow-up itself with a placeholder
//! model (`step.started` "scripted:(no model)", `step.failed` "… has 0 lines"): the follow-up
//! was consumed as a failed turn. Now it ends the cancelled turn and the follow-up stays queued
//! for the next `keel resume`. On SQLite and on PostgreSQL.

use crate::common::{Env, Running, jsonl_lines, stderr, stdout};
use crate::postgres::Schema;

fn cancel_leaves_the_queued_follow_up_for_the_next_resume(store: Option<&str>) {
    let env = Env::new();
    env.write(
        "script.jsonl",
        "{\"delay_ms\":60000,\"text\":\"slow\"}\n{\"text\":\"second\"}\n",
    );
    let with_store = |cmd: &mut std::process::Command| {
        if let Some(url) = store {
            cmd.args(["--store", url]);
        }
    };
    let mut cmd = env.keel();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"]);
    with_store(&mut cmd);
    cmd.args(["--output", "jsonl", "first"]);
    let mut run = Running::start(cmd);
    let line = run.wait_for("\"type\":\"step.started\"", 60);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let session = v["session_id"].as_str().unwrap().to_owned();

    let mut cmd = env.keel();
    cmd.args(["resume", &session, "follow-up"]);
    with_store(&mut cmd);
    cmd.args(["--output", "jsonl"]);
    let mut resume = Running::start(cmd);
    resume.wait_for("\"type\":\"turn.queued\"", 60);
    run.signal("KILL");
    resume.signal("KILL");
    let _ = run.finish(30);
    let _ = resume.finish(30);

    let mut cmd = env.keel();
    cmd.args(["cancel", &session]);
    with_store(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("cancelled turn"), "{}", stdout(&out));

    let mut cmd = env.keel();
    cmd.args(["sessions", "events", &session]);
    with_store(&mut cmd);
    let events = jsonl_lines(&cmd.output().unwrap().stdout);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(
        !events.iter().any(|e| e["payload"]["model"]
            .as_str()
            .is_some_and(|m| m.contains("(no model)"))),
        "no placeholder model sampled: {types:?}"
    );
    let queued = events
        .iter()
        .rposition(|e| e["type"] == "turn.queued")
        .unwrap();
    let follow_up = events[queued]["turn_id"].clone();
    assert!(
        events
            .iter()
            .all(|e| e["turn_id"] != follow_up || e["type"] == "turn.queued"),
        "the follow-up was only queued: {types:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "turn.finished", "{types:?}");
    assert_eq!(last["payload"]["terminal_reason"], "aborted");
    assert!(
        !types[queued..].contains(&"step.started"),
        "nothing sampled after the follow-up was queued: {types:?}"
    );
}

#[test]
fn keel_cancel_ends_the_turn_and_leaves_the_queued_follow_up() {
    cancel_leaves_the_queued_follow_up_for_the_next_resume(None);
}

#[test]
fn keel_cancel_ends_the_turn_and_leaves_the_queued_follow_up_on_postgres() {
    let schema = Schema::new();
    cancel_leaves_the_queued_follow_up_for_the_next_resume(Some(&schema.url()));
}
