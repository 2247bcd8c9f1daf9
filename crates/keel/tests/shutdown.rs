//! keel exits after its result line even when a blocking task is stuck, and SIGTERM stops it
//! then too (issue 10, review items A and B). The stuck task here is real: `write_file` on a
//! 1 TiB sparse file records the file's hash before writing (its probe), which reads for a very
//! long time on a blocking thread. The probe runs under the call's time limit and the turn's
//! cancellation (item A), so the turn goes on; the thread keeps hashing, and a tokio runtime
//! waits for such threads forever when it shuts down (item B: keel never exited and ignored
//! SIGTERM after printing its result).

use std::time::Duration;

use crate::common::{Env, Running, parse_lines};

/// Seconds a keel that works exits within: the runtime's shutdown grace is 2 s; the rest is a
/// margin (debug build, shared CI machine).
const EXITS_WITHIN: u64 = 30;

fn env_with_a_huge_file() -> Env {
    let env = Env::new();
    let big = std::fs::File::create(env.ws().join("big")).unwrap();
    big.set_len(1 << 40).unwrap();
    env.write(
        "script.jsonl",
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"big\",\"content\":\"x\"}}]}\n{\"text\":\"done\"}\n",
    );
    env
}

/// Whether process `pid` has `name` in the workspace open (the probe is reading it).
fn has_open(pid: u32, name: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|p| p.ends_with(format!("ws/{name}")))
            })
        })
        .unwrap_or(false)
}

fn keel_run(env: &Env, flags: &[&str]) -> Running {
    let mut cmd = env.keel();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--permission-mode", "bypass", "--output", "jsonl"])
        .args(flags)
        .arg("write it");
    Running::start(cmd)
}

/// `--tool-timeout 2s`: the call fails on its time limit while its probe still hashes, the turn
/// completes, the result line is printed — and keel exits, although the hashing thread is
/// still running (checked: the file is open when the result line arrives).
#[test]
fn keel_exits_after_its_result_line_while_a_blocking_task_is_stuck() {
    let env = env_with_a_huge_file();
    let mut run = keel_run(&env, &["--tool-timeout", "2s"]);
    let result = run.wait_for("\"type\":\"result\"", 120);
    assert!(
        has_open(run.child.id(), "big"),
        "the probe's thread is still reading the file after the result line"
    );
    assert!(
        result.contains("\"terminal_reason\":\"completed\""),
        "{result}"
    );
    let (code, lines) = run.finish(EXITS_WITHIN);
    assert_eq!(code, Some(0));
    let lines = parse_lines(&lines);
    assert!(
        lines.iter().any(|l| l["type"] == "tool_call.finished"
            && l["payload"]["output"]
                .as_str()
                .is_some_and(|o| o.contains("timed out"))),
        "the call failed on its time limit"
    );
}

/// No tool time limit: the probe hangs inside the turn. SIGTERM cancels the turn (the probe
/// with it), the result line says `aborted`, and keel exits — a second SIGTERM, if the first
/// were not enough, must end it too.
#[test]
fn sigterm_stops_keel_while_a_blocking_task_is_stuck() {
    let env = env_with_a_huge_file();
    let mut run = keel_run(&env, &[]);
    run.wait_for("\"type\":\"turn.started\"", 60);
    let pid = run.child.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !has_open(pid, "big") {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run.signal("TERM");
    let mut exited = false;
    for _ in 0..250 {
        if run.child.try_wait().unwrap().is_some() {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !exited {
        run.signal("TERM");
    }
    let (code, lines) = run.finish(EXITS_WITHIN);
    assert!(code.is_some(), "exited, not killed");
    let lines = parse_lines(&lines);
    let result = lines.last().unwrap();
    assert_eq!(result["type"], "result", "{lines:#?}");
    assert_eq!(result["terminal_reason"], "aborted", "{result}");
}
