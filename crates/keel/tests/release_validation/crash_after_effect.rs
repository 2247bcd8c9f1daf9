//! crash_after_effect — a `keel` process killed with SIGKILL after a side effect was dispatched
//! (and done) but before its outcome was committed never dispatches it a second time: on resume
//! the effect is `outcome_unknown`; a tool that can reconcile (`edit_file`, from the file's
//! hashes) settles it itself — the journal shows `effect.committed` straight after
//! `effect.outcome_unknown`, no `effect.decided` — and a tool that cannot (`shell`) puts it to a
//! human: the turn waits (`requires_action`, the effect pending) until `keel resolve`, which the
//! journal records as `effect.decided` (`reconciled` absent). Either way the side effect
//! happened exactly once and the journal holds exactly one `effect.dispatched`.
//!
//! Guarded mechanisms: the effect claim (intent before effect: a call whose `effect.dispatched`
//! is journaled without an outcome is never dispatched blindly again) and the tool's reconcile
//! from the hashes recorded in `effect.prepared`. With the claim off, the resumed run dispatches
//! again: the effect file gets a second line / the edit applies twice, and the dispatch count is
//! 2.
//!
//! The kill is real: `keel run` is a child process killed with `kill -9` at a point observed
//! from outside — the shell command has written its line and sleeps (its pid file exists), or
//! the `post_tool_use` hook that holds the edit's result back from its commit is running.

use std::process::Command;

use serde_json::Value;

use super::harness::{Backend, FreshStore, on_both};
use crate::common::{Env, Running, check_stream, jsonl_lines, stderr};

on_both!(
    thread a_shell_command_cut_by_kill_9_goes_to_a_human,
    thread an_edit_cut_by_kill_9_is_reconciled_by_the_tool,
);

/// `keel ARGS --store LOCATION` in `env`.
fn keel(env: &Env, fresh: &FreshStore, args: &[&str]) -> Command {
    let mut c = env.keel();
    c.args(args).args(["--store", &fresh.location]);
    c
}

/// Starts `keel run` headless on the script `lines` (`bypass`, no sandbox: the test kills what
/// the tools start by pid).
fn start_run(env: &Env, fresh: &FreshStore, lines: &[Value]) -> Running {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    env.write("script.jsonl", &(text.join("\n") + "\n"));
    Running::start(keel(
        env,
        fresh,
        &[
            "run",
            "--workspace",
            "ws",
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "--permission-mode",
            "bypass",
            "--sandbox",
            "off",
            "do the task",
        ],
    ))
}

/// Waits (≤ 30 s) until the workspace file `name` holds a process id; returns it.
fn pid_in(env: &Env, name: &str) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(pid) = std::fs::read_to_string(env.ws().join(name))
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pid in {name} within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Kills `run` with SIGKILL, then the orphan `pid` it left (a command or hook in its own
/// process group), by id.
fn kill_9(run: Running, orphan: u32) {
    run.signal("KILL");
    let (code, _) = run.finish(30);
    assert_eq!(code, None, "keel was killed by the signal");
    let _ = Command::new("kill")
        .args(["-KILL", &orphan.to_string()])
        .status();
}

/// `keel resume SESSION` (JSONL): its exit code and result line.
fn resume(env: &Env, fresh: &FreshStore, session: &str) -> (Option<i32>, Value) {
    let out = keel(env, fresh, &["resume", session, "--output", "jsonl"])
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    assert!(!lines.is_empty(), "{}", stderr(&out));
    (out.status.code(), check_stream(&lines))
}

/// The effect events of `session`'s journal, in order (read from the store directly).
fn effect_events(fresh: &FreshStore, session: &str) -> Vec<Value> {
    super::harness::local_journal(fresh, session)
        .into_iter()
        .filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("effect.")))
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// `shell` (no reconcile) writes one line to `effect.txt` and sleeps; `keel run` is killed with
/// SIGKILL while it sleeps. Resume: the effect is `outcome_unknown` and goes to a human (exit
/// 3, the effect pending); nothing is dispatched again. `keel resolve --as committed`, then
/// resume: the turn completes; the journal reads dispatched → outcome_unknown → decided (by a
/// human: not `reconciled`) → committed, and the file still has one line.
fn a_shell_command_cut_by_kill_9_goes_to_a_human(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let env = Env::new();
    let command = "echo once >> effect.txt; echo $$ > shell.pid; exec sleep 30";
    let mut run = start_run(
        &env,
        &fresh,
        &[
            serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}),
            serde_json::json!({"text": "done"}),
        ],
    );
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("effect.dispatched", 30);
    let orphan = pid_in(&env, "shell.pid");
    kill_9(run, orphan);
    let effect_lines = || {
        std::fs::read_to_string(env.ws().join("effect.txt"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(effect_lines(), ["once"]);
    assert_eq!(
        types(&effect_events(&fresh, &session)),
        ["effect.prepared", "effect.dispatched"],
        "killed between the dispatch and its commit"
    );

    let (code, result) = resume(&env, &fresh, &session);
    assert_eq!(code, Some(3), "{result}");
    assert_eq!(result["terminal_reason"], "requires_action", "{result}");
    let pending = result["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{result}");
    assert_eq!(pending[0]["kind"], "effect");
    assert_eq!(pending[0]["tool_name"], "shell");
    assert_eq!(effect_lines(), ["once"], "never re-run blindly");
    assert_eq!(
        types(&effect_events(&fresh, &session)),
        [
            "effect.prepared",
            "effect.dispatched",
            "effect.outcome_unknown"
        ]
    );

    let key = pending[0]["operation_key"].as_str().unwrap();
    let out = keel(&env, &fresh, &["resolve", key, "--as", "committed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, result) = resume(&env, &fresh, &session);
    assert_eq!(code, Some(0), "{result}");
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(effect_lines(), ["once"], "one side effect in all");
    let effects = effect_events(&fresh, &session);
    assert_eq!(
        types(&effects),
        [
            "effect.prepared",
            "effect.dispatched",
            "effect.outcome_unknown",
            "effect.decided",
            "effect.committed"
        ]
    );
    assert_eq!(
        effects[3]["payload"]["decision"]["decision"], "committed",
        "{}",
        effects[3]
    );
    assert!(
        effects[3]["payload"].get("reconciled").is_none(),
        "a human decided: {}",
        effects[3]
    );
}

/// `edit_file` (reconciles from the hashes in its intent) changes `notes.txt` from `start` to
/// `start+once`; a `post_tool_use` hook then holds the result back from its commit, and
/// `keel run` is killed with SIGKILL while the hook runs. Resume (the hook removed from the
/// config): the file has the intended hash, so the tool settles the effect — `committed`
/// without a re-run and without a human — and the turn completes. A second dispatch would
/// have made it `start+once+once`.
fn an_edit_cut_by_kill_9_is_reconciled_by_the_tool(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let env = Env::new();
    env.write("ws/notes.txt", "start");
    let hook = "[[hooks.post_tool_use]]\nname = \"hold\"\nmatcher = \"edit_file\"\ncommand = \"echo $$ > hook.pid; exec sleep 30\"\n";
    env.write("config/keel/keel.toml", hook);
    let edit =
        serde_json::json!({"path": "notes.txt", "old_string": "start", "new_string": "start+once"});
    let mut run = start_run(
        &env,
        &fresh,
        &[
            serde_json::json!({"tool_calls": [{"name": "edit_file", "arguments": edit}]}),
            serde_json::json!({"text": "done"}),
        ],
    );
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("effect.dispatched", 30);
    let orphan = pid_in(&env, "hook.pid");
    kill_9(run, orphan);
    let notes = || std::fs::read_to_string(env.ws().join("notes.txt")).unwrap();
    assert_eq!(notes(), "start+once", "the edit happened before the kill");
    assert_eq!(
        types(&effect_events(&fresh, &session)),
        ["effect.prepared", "effect.dispatched"],
        "killed between the dispatch and its commit"
    );

    env.write("config/keel/keel.toml", "");
    let (code, result) = resume(&env, &fresh, &session);
    assert_eq!(code, Some(0), "{result}");
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(notes(), "start+once", "applied once");
    let effects = effect_events(&fresh, &session);
    assert_eq!(
        types(&effects),
        [
            "effect.prepared",
            "effect.dispatched",
            "effect.outcome_unknown",
            "effect.committed"
        ],
        "reconciled by the tool, no human decision: {effects:#?}"
    );
}

/// The session id of a JSONL line.
fn session_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}
