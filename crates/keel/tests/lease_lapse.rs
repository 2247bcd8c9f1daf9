//! The lease fence through the CLI (`keel_runtime::lease::LeaseKeeper`, "The fence"): a
//! `keel run` whose store stops answering mid-command — another connection holds SQLite's
//! write lock — stops before its lease (default TTL 10 s) could be taken over, and kills its
//! command (sandboxed, the default) before the command's second write; its result says the turn
//! was not ended and how to continue it, and `keel resume` then puts the effect, whose outcome
//! nobody knows, to the human.

use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::common::{Env, Running, jsonl_lines};

#[test]
fn a_run_whose_store_stalls_past_its_lease_kills_its_command_and_resume_continues() {
    let env = Env::new();
    env.write(
        "script.jsonl",
        "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"echo start >> effect.txt; sleep 14; echo done >> effect.txt\"}}]}\n{\"text\":\"finished\"}\n",
    );
    let mut cmd = env.keel();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--permission-mode", "bypass", "--output", "jsonl", "go"]);
    let run = Running::start(cmd);
    let effect = env.ws().join("effect.txt");
    let started = Instant::now();
    while !std::fs::read_to_string(&effect).is_ok_and(|t| t.contains("start")) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the command did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut lock = rt.block_on(async {
        let mut c = sqlx::SqliteConnection::connect(&env.store()).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut c)
            .await
            .unwrap();
        c
    });
    // The lease lapses ~9 s after its last renewal; 10x margin.
    let (code, lines) = run.finish(100);
    let stopped = started.elapsed();
    // Past the moment the command would have written again (14 s after it started).
    std::thread::sleep(Duration::from_secs(16).saturating_sub(started.elapsed()));
    rt.block_on(async {
        sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    });
    let text = std::fs::read_to_string(&effect).unwrap();
    assert_eq!(
        text, "start\n",
        "the command outlived its run's lease (the run stopped after {stopped:?})"
    );
    let lines: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let result = lines.last().unwrap();
    assert_eq!(code, Some(1), "{result}");
    let session = result["session_id"].as_str().unwrap().to_owned();
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("lease lost") && error.contains(&format!("keel resume {session}")),
        "{result}"
    );
    let out = env
        .keel()
        .args(["resume", &session, "--output", "jsonl"])
        .output()
        .unwrap();
    let resumed = jsonl_lines(&out.stdout);
    let result = resumed.last().unwrap();
    assert_eq!(out.status.code(), Some(3), "{result}");
    assert_eq!(result["terminal_reason"], "requires_action", "{result}");
    assert_eq!(result["pending"][0]["kind"], "effect", "{result}");
    assert_eq!(std::fs::read_to_string(&effect).unwrap(), "start\n");
}
