//! Files keel loads by path — a workspace's `keel.toml` and `AGENTS.md`, the user config,
//! `server.toml`, scripted-model files — are read only when they are regular files, at most
//! 1 MiB for configuration (`keel_tools::files`): a repository that makes its `keel.toml` a FIFO,
//! a symlink to `/dev/zero` or a huge file gets a clear error naming the file, not a hung or
//! exhausted keel. A plain read of the same FIFO first shows it blocks.

use std::process::{Command, Output};

use serde_json::json;

use crate::common::{Env, stderr};

fn mkfifo(path: &std::path::Path) {
    let out = Command::new("mkfifo").arg(path).output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `command` under `timeout 60` (a correctness deadline: each of these answers in well under a
/// second; 124 means keel hung).
fn within_deadline(command: &Command) -> Output {
    let mut c = Command::new("timeout");
    c.arg("60")
        .arg(command.get_program())
        .args(command.get_args());
    for (k, v) in command.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        c.current_dir(dir);
    }
    let out = c.stdin(std::process::Stdio::null()).output().unwrap();
    assert_ne!(out.status.code(), Some(124), "keel hung: {}", stderr(&out));
    out
}

fn run(env: &Env, model: &str) -> Output {
    let mut c = env.keel();
    c.args([
        "run",
        "--workspace",
        "ws",
        "--model",
        model,
        "--output",
        "jsonl",
        "go",
    ]);
    within_deadline(&c)
}

fn script(env: &Env) -> String {
    env.write("script.jsonl", &json!({"text": "hi"}).to_string());
    format!("script:{}", env.path("script.jsonl").display())
}

#[test]
fn a_plain_read_of_a_fifo_config_blocks() {
    let env = Env::new();
    mkfifo(&env.path("ws/keel.toml"));
    let out = Command::new("timeout")
        .args(["2", "cat"])
        .arg(env.path("ws/keel.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124), "{out:?}");
}

#[test]
fn config_files_that_are_not_small_regular_files_are_refused_naming_them() {
    for (file, shown) in [
        ("ws/keel.toml", "ws/keel.toml"),
        ("config/keel/keel.toml", "config/keel/keel.toml"),
    ] {
        // A FIFO.
        let env = Env::new();
        mkfifo(&env.path(file));
        let out = run(&env, &script(&env));
        assert_eq!(out.status.code(), Some(1), "{file}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(shown) && err.contains("it is a FIFO, not a regular file"),
            "{file}: {err}"
        );
        // A symlink to a device.
        let env = Env::new();
        std::os::unix::fs::symlink("/dev/zero", env.path(file)).unwrap();
        let out = run(&env, &script(&env));
        assert_eq!(out.status.code(), Some(1), "{file}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(shown) && err.contains("a character device"),
            "{file}: {err}"
        );
        // More than 1 MiB.
        let env = Env::new();
        env.write(file, &format!("# {}\n", "x".repeat(1024 * 1024)));
        let out = run(&env, &script(&env));
        assert_eq!(out.status.code(), Some(1), "{file}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(shown) && err.contains("larger than 1 MiB"),
            "{file}: {err}"
        );
    }
}

#[test]
fn a_fifo_script_or_server_config_is_refused_and_a_fifo_agents_md_left_out() {
    let env = Env::new();
    mkfifo(&env.path("script.jsonl"));
    let out = run(
        &env,
        &format!("script:{}", env.path("script.jsonl").display()),
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("script.jsonl") && err.contains("it is a FIFO"),
        "{err}"
    );

    // AGENTS.md is optional context: a FIFO there is left out, the run goes on.
    let env = Env::new();
    mkfifo(&env.path("ws/AGENTS.md"));
    let out = run(&env, &script(&env));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let env = Env::new();
    mkfifo(&env.path("server.toml"));
    let mut c = env.keel();
    c.args(["serve", "--config"]).arg(env.path("server.toml"));
    let out = within_deadline(&c);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("server.toml") && err.contains("it is a FIFO"),
        "{err}"
    );
}
