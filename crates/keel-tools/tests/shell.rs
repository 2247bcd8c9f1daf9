use std::time::Duration;

use keel_tools::tool::ToolResultStatus::{Cancelled, Failed, Succeeded};
use serde_json::json;

use crate::common::Fixture;
use keel_tools::policy::{PermissionMode, Policy};
use keel_tools::sandbox::SandboxMode;

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs no code).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s == "Z" || s == "X"))
            .unwrap_or(false),
    }
}

async fn wait_dead(pid: i32) {
    // Correctness deadline with a wide margin: SIGKILL takes effect in milliseconds.
    for _ in 0..200 {
        if is_dead(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("process {pid} is still alive 10 s after its group was killed");
}

#[tokio::test]
async fn shell_reports_output_exit_code_and_duration() {
    let f = Fixture::new();
    let r = f
        .call(
            "shell",
            json!({"command": "echo out; echo err >&2; exit 3"}),
        )
        .await;
    assert_eq!(r.status, Failed);
    assert!(r.content.starts_with("out\nerr\n"), "{}", r.content);
    assert!(r.content.contains("[exit code 3;"), "{}", r.content);
    assert_eq!(r.details["exit_code"], 3);
    assert_eq!(r.details["timed_out"], false);
    assert!(r.details["duration_ms"].is_u64());
    let ok = f.call("shell", json!({"command": "true"})).await;
    assert_eq!(ok.status, Succeeded);
    assert!(ok.content.contains("(no output)"), "{}", ok.content);
}

#[tokio::test]
async fn shell_runs_in_workdir_with_stdin_closed() {
    let f = Fixture::new();
    std::fs::create_dir(f.path("sub")).unwrap();
    let r = f
        .call(
            "shell",
            json!({"command": "pwd; cat; echo done", "workdir": "sub"}),
        )
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(r.content.contains("/sub\ndone\n"), "{}", r.content);
}

#[tokio::test]
async fn shell_timeout_kills_the_whole_process_group() {
    let f = Fixture::new();
    let r = f
        .call(
            "shell",
            json!({"command": "sleep 300 & echo $! > bg.pid; sleep 300", "timeout_ms": 500}),
        )
        .await;
    assert_eq!(r.status, Failed);
    assert_eq!(r.details["timed_out"], true);
    assert!(
        r.content.contains("timed out after 500 ms"),
        "{}",
        r.content
    );
    let pid: i32 = std::fs::read_to_string(f.path("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_dead(pid).await;
}

#[tokio::test]
async fn shell_cancellation_kills_the_whole_process_group() {
    let f = Fixture::new();
    let cancel = f.ctx.cancel.clone();
    let pid_file = f.path("bg.pid");
    tokio::spawn(async move {
        for _ in 0..200 {
            if pid_file.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel.cancel();
    });
    let r = f
        .call("shell", json!({"command": "(sleep 300 &  echo $! > bg.pid.tmp; mv bg.pid.tmp bg.pid); sleep 300"}))
        .await;
    assert_eq!(r.status, Cancelled, "{}", r.content);
    assert_eq!(r.details["cancelled"], true);
    let pid: i32 = std::fs::read_to_string(f.path("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_dead(pid).await;
}

#[tokio::test]
async fn background_processes_do_not_outlive_the_command() {
    let f = Fixture::new();
    let r = f
        .call(
            "shell",
            json!({"command": "sleep 300 & echo $! > bg.pid; echo started"}),
        )
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    let pid: i32 = std::fs::read_to_string(f.path("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_dead(pid).await;
}

#[tokio::test]
async fn shell_output_is_capped_with_head_tail_and_a_readable_artifact() {
    let f = Fixture::new();
    let r = f.call("shell", json!({"command": "seq 1 100000"})).await;
    assert_eq!(r.status, Succeeded);
    assert!(r.content.starts_with("1\n2\n3\n"), "{}", &r.content[..50]);
    assert!(r.content.contains("100000\n[exit code 0"), "tail kept");
    assert!(
        r.content.contains("bytes of output cut out of 588895"),
        "marker says how much"
    );
    assert!(r.content.len() < 25_000, "capped: {}", r.content.len());
    let artifact = r.artifact.clone().expect("artifact stored");
    assert_eq!(artifact.size_bytes, 588_895);
    assert!(r.content.contains(&artifact.uri()));
    let back = f
        .call(
            "read_file",
            json!({"path": artifact.uri(), "offset": 99_999, "limit": 5}),
        )
        .await;
    assert_eq!(back.content, " 99999\t99999\n100000\t100000\n");
}

/// A `timeout_ms` above the configured maximum (the session's tool timeout) is lowered to it
/// and the command runs; the result says so. It used to be refused ("exceeds the maximum"),
/// and a model that asked for more than a session's smaller tool timeout ran unclamped.
#[tokio::test]
async fn a_timeout_ms_over_the_limit_is_lowered_to_it() {
    let mut f = Fixture::new();
    f.ctx.limits.shell_max_timeout_ms = 300;
    let t0 = std::time::Instant::now();
    let r = f
        .call(
            "shell",
            json!({"command": "echo started; sleep 30", "timeout_ms": 10_000_000}),
        )
        .await;
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, Failed);
    assert!(r.content.starts_with("started\n"), "{}", r.content);
    assert!(
        r.content.contains("[timed out after 300 ms;")
            && r.content
                .contains("[timeout_ms 10000000 was lowered to the 300 ms limit for tool calls]"),
        "{}",
        r.content
    );
    // Within the limit, the model's own timeout holds.
    let r = f
        .call("shell", json!({"command": "sleep 30", "timeout_ms": 100}))
        .await;
    assert!(
        r.content.contains("[timed out after 100 ms;"),
        "{}",
        r.content
    );
    assert!(!r.content.contains("lowered"), "{}", r.content);
}

#[tokio::test]
async fn shell_errors() {
    let f = Fixture::new();
    let r = f.call("shell", json!({"command": "  "})).await;
    assert_eq!(r.status, Failed);
    assert!(r.content.contains("command is empty"), "{}", r.content);
    let r = f
        .call("shell", json!({"command": "ls", "workdir": "nope"}))
        .await;
    assert!(
        r.content
            .contains("workdir `nope` is not an existing directory"),
        "{}",
        r.content
    );
    let r = f.call("shell", json!({"command": "kill -9 $$"})).await;
    assert!(r.content.contains("killed by signal 9"), "{}", r.content);
}

/// A confined command killed by a signal is reported as killed by that signal, the ones
/// Rust's runtime handles or ignores in the launcher included (it reported SIGSEGV as `exit
/// code 139` and SIGPIPE as `141`).
#[tokio::test]
async fn a_confined_command_killed_by_a_signal_is_reported_so() {
    let f = Fixture::with(
        SandboxMode::WorkspaceWrite,
        Policy::new(PermissionMode::Bypass),
    );
    for (name, number) in [
        ("SEGV", 11),
        ("PIPE", 13),
        ("BUS", 7),
        ("TERM", 15),
        ("KILL", 9),
    ] {
        let r = f
            .call("shell", json!({"command": format!("kill -{name} $$")}))
            .await;
        assert!(
            r.content.contains(&format!("killed by signal {number}")),
            "SIG{name}: {}",
            r.content
        );
    }
}

/// A confined command's end is reported by the launcher before it tears its namespaces down:
/// the status, every byte of its output, and nothing from a process it left behind (killed
/// with the namespace before the report).
#[tokio::test]
async fn a_confined_commands_status_and_whole_output_come_with_its_end() {
    let f = Fixture::with(
        SandboxMode::WorkspaceWrite,
        Policy::new(PermissionMode::Bypass),
    );
    let command = "(sleep 0.3; echo late; echo late > late.txt) & \
                   head -c 100000 /dev/zero | tr '\\0' x; echo; echo err >&2; exit 3";
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert_eq!(r.details["exit_code"], 3, "{}", r.content);
    assert_eq!(r.details["output_bytes"], 100_005, "{}", r.content);
    assert!(r.content.contains("err\n"), "{}", r.content);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert!(!r.content.contains("late"), "{}", r.content);
    assert!(!f.path("late.txt").exists(), "a left-behind process ran on");
}

#[tokio::test]
async fn cancelled_before_start_gives_a_cancelled_result() {
    let f = Fixture::new();
    f.ctx.cancel.cancel();
    let r = f.call("shell", json!({"command": "touch ran"})).await;
    assert_eq!(r.status, Cancelled);
    assert!(!f.path("ran").exists());
}
