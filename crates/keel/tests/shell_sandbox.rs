//! The `keel` binary's sandbox for `shell` (issue 11): it is its own launcher (`keel __sandbox`),
//! `sandbox_network` comes from the user config or `--sandbox-network` (never a workspace file)
//! and is pinned with the session, `[env]` reaches tools, keel's own files and process stay out
//! of reach. Attacks first succeed with `--sandbox off`, then fail under the default sandbox.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::common::{Env, check_stream, jsonl_lines, stderr, stdout};

fn shell(cmd: &str) -> String {
    json!({"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}).to_string()
}

fn text(t: &str) -> String {
    json!({"text": t}).to_string()
}

/// `keel run` headless in bypass mode with `script` (lines) and extra flags.
fn run(
    env: &Env,
    script: &[String],
    flags: &[&str],
    vars: &[(&str, &str)],
) -> std::process::Output {
    run_with(env, env.keel(), script, flags, vars)
}

fn run_with(
    env: &Env,
    mut c: Command,
    script: &[String],
    flags: &[&str],
    vars: &[(&str, &str)],
) -> std::process::Output {
    env.write("script.jsonl", &script.join("\n"));
    for (k, v) in vars {
        c.env(k, v);
    }
    c.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass"])
        .args(flags)
        .arg("go")
        .output()
        .unwrap()
}

/// What the tool calls printed, in order.
fn outputs(out: &std::process::Output) -> String {
    jsonl_lines(&out.stdout)
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .map(|l| l["payload"]["output"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn show_json(env: &Env, session: &str) -> Value {
    serde_json::from_str(&stdout(&env.run(&["sessions", "show", session, "--json"]))).unwrap()
}

#[test]
fn a_workspace_keel_toml_may_not_set_sandbox_network() {
    let env = Env::new();
    for value in ["true", "false"] {
        env.write("ws/keel.toml", &format!("sandbox_network = {value}\n"));
        let out = run(&env, &[text("hi")], &[], &[]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("ws/keel.toml")
                && err.contains("`sandbox_network`")
                && err.contains("--sandbox-network")
                && err.contains("config/keel/keel.toml"),
            "{err}"
        );
    }
    let out = env.run(&["sessions", "list", "--json"]);
    assert_eq!(stdout(&out).trim(), "", "no session was created");
    // From the user config it is taken.
    std::fs::remove_file(env.path("ws/keel.toml")).unwrap();
    env.write("config/keel/keel.toml", "sandbox_network = true\n");
    let out = run(&env, &[text("hi")], &[], &[]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    let session = result["session_id"].as_str().unwrap();
    assert_eq!(show_json(&env, session)["config"]["sandbox_network"], true);
}

#[test]
fn sandbox_network_lets_tcp_through_is_pinned_and_resume_can_turn_it_off() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = shell(&format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; echo x > /etc/keel-escape || echo write-refused"
    ));
    let env = Env::new();
    let script = [connect.clone(), text("one"), connect, text("two")];
    // Without it (the default), no IP network.
    let out = run(&env, &script[..2], &[], &[]);
    let shown = outputs(&out);
    assert!(
        !shown.contains("connected") && shown.contains("write-refused"),
        "{shown}"
    );

    let env = Env::new();
    let out = run(&env, &script, &["--sandbox-network"], &[]);
    let shown = outputs(&out);
    assert!(
        shown.contains("connected") && shown.contains("write-refused"),
        "{shown}"
    );
    let result = check_stream(&jsonl_lines(&out.stdout));
    let session = result["session_id"].as_str().unwrap().to_owned();
    assert_eq!(show_json(&env, &session)["config"]["sandbox_network"], true);
    let shown = stdout(&env.run(&["sessions", "show", &session]));
    assert!(
        shown.contains("sandbox workspace_write, with network"),
        "{shown}"
    );

    let out = env
        .keel()
        .args([
            "resume",
            &session,
            "again",
            "--output",
            "jsonl",
            "--sandbox-network=false",
        ])
        .output()
        .unwrap();
    let shown = outputs(&out);
    assert!(!shown.contains("connected"), "{shown} {}", stderr(&out));
    assert_eq!(
        show_json(&env, &session)["config"]["sandbox_network"],
        false
    );
}

#[test]
fn env_values_reach_tools_secret_ones_redacted_and_secret_variables_stay_out() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "[env]\nPLAIN_SETTING = \"plain-value-42\"\nDB_URL = { value = \"postgres://u:dbpw-4242@h/db\", secret = true }\nGITHUB_TOKEN = {}\n",
    );
    let cmd = "echo \"plain=$PLAIN_SETTING db=$DB_URL gh=${#GITHUB_TOKEN} mine=${MY_SERVICE_TOKEN:-unset} openai=${OPENAI_API_KEY:-unset} aws=${AWS_SECRET_ACCESS_KEY:-unset}\"";
    let vars = [
        ("GITHUB_TOKEN", "ghp_passthroughvalue000000000000000000"),
        ("MY_SERVICE_TOKEN", "mytoken-0001"),
        ("OPENAI_API_KEY", "sk-proj-scrubbedvalue0000000000"),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-0002"),
    ];
    for flags in [&["--sandbox", "off"][..], &[][..]] {
        let out = run(&env, &[shell(cmd), text("done")], flags, &vars);
        let shown = outputs(&out);
        assert!(shown.contains("plain=plain-value-42"), "{flags:?}: {shown}");
        // Set, but redacted wherever keel shows or stores it.
        assert!(
            shown.contains("db=[REDACTED]") || shown.contains("db=postgres://u:[REDACTED]"),
            "{flags:?}: {shown}"
        );
        assert!(!shown.contains("dbpw-4242"), "{flags:?}: {shown}");
        // Passed through explicitly: keel's own value (its length shows it arrived).
        assert!(shown.contains("gh=38"), "{flags:?}: {shown}");
        for scrubbed in ["mine=unset", "openai=unset", "aws=unset"] {
            assert!(shown.contains(scrubbed), "{flags:?}: {shown}");
        }
    }
}

/// A command that knows keel's process id (the test writes it into the workspace once keel
/// started) cannot signal it: keel is outside the command's PID namespace. `kill $PPID` would
/// only reach the sandbox's own launcher, so the real pid is used.
#[test]
fn keel_cannot_be_killed_from_a_confined_command() {
    let script = [
        shell(
            "while [ ! -s keel.pid ]; do sleep 0.05; done; kill -9 \"$(cat keel.pid)\"; echo \"kill $?\"; sleep 1; echo survived",
        ),
        text("done"),
    ];
    let start = |env: &Env, flags: &[&str]| {
        env.write("script.jsonl", &script.join("\n"));
        let child = env
            .keel()
            .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
            .args(["--output", "jsonl", "--permission-mode", "bypass"])
            .args(flags)
            .arg("go")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        env.write("ws/keel.pid", &child.id().to_string());
        child.wait_with_output().unwrap()
    };
    let env = Env::new();
    let out = start(&env, &["--sandbox", "off"]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "unconfined, keel was not killed: {out:?}"
    );

    let env = Env::new();
    let out = start(&env, &[]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&out));
    let seen = outputs(&out);
    assert!(seen.contains("survived"), "{seen}");
    assert!(
        !seen.contains("kill 0"),
        "the kill reached something: {seen}"
    );
}

/// An environment whose XDG data and config directories are under /var/tmp, which the sandbox
/// shows read-only (everything under /tmp is hidden anyway): only keel's hiding keeps them out.
struct VisibleHome {
    env: Env,
    home: tempfile::TempDir,
}

impl VisibleHome {
    fn new() -> Self {
        let home = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::create_dir_all(home.path().join("config/keel")).unwrap();
        Self {
            env: Env::new(),
            home,
        }
    }

    fn keel(&self) -> Command {
        let mut c = self.env.keel();
        c.env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("XDG_DATA_HOME", self.home.path().join("data"));
        c
    }

    fn data(&self) -> PathBuf {
        self.home.path().join("data/keel")
    }
}

fn hex(path: &Path) -> String {
    std::fs::read(path)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn keels_data_and_config_directories_are_hidden_even_outside_tmp() {
    let script = [
        shell(
            "od -An -tx1 -v \"$XDG_DATA_HOME/keel/seal.key\" | tr -d ' \\n'; echo; ls \"$XDG_DATA_HOME/keel\" \"$XDG_CONFIG_HOME/keel\"; echo end",
        ),
        text("done"),
    ];
    let h = VisibleHome::new();
    std::fs::write(
        h.home.path().join("config/keel/keel.toml"),
        "# user-config-marker\n",
    )
    .unwrap();
    let out = run_with(&h.env, h.keel(), &script, &["--sandbox", "off"], &[]);
    let shown = outputs(&out);
    assert!(
        shown.contains(&hex(&h.data().join("seal.key"))),
        "unconfined: {shown}"
    );
    assert!(
        shown.contains("keel.db") && shown.contains("keel.toml"),
        "{shown}"
    );

    let h = VisibleHome::new();
    std::fs::write(
        h.home.path().join("config/keel/keel.toml"),
        "# user-config-marker\n",
    )
    .unwrap();
    let out = run_with(&h.env, h.keel(), &script, &[], &[]);
    let shown = outputs(&out);
    let key = hex(&h.data().join("seal.key"));
    assert!(!shown.contains(&key), "{shown}");
    assert!(
        !shown.contains("keel.db") && !shown.contains("keel.toml"),
        "{shown}"
    );
    assert!(shown.contains("end"), "{shown}");
}

/// The `keel` binary, where uid 65534 can run it.
fn keel_for_nobody() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let reachable = built
        .ancestors()
        .skip(1)
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if reachable {
        return built;
    }
    let dir = Path::new("/tmp/keel-cli-test-bin");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tmp = dir.join(format!("keel.{}", std::process::id()));
    std::fs::copy(&built, &tmp).unwrap();
    let to = dir.join("keel");
    std::fs::rename(&tmp, &to).unwrap();
    to
}

/// The same attacks by keel running as a normal user (uid 65534): the sandbox then stands on
/// unprivileged user namespaces alone.
#[test]
fn a_normal_users_keel_keeps_its_key_process_and_files_from_commands() {
    let secret = "plainvalueAAAA1111BBBB2222";
    let script = [
        shell(
            "{ tr '\\0' '\\n' < /proc/$PPID/environ; } 2>/dev/null | grep -c '^OPENAI_API_KEY=.'; od -An -tx1 -v \"$XDG_DATA_HOME/keel/seal.key\" | tr -d ' \\n'; echo; echo end",
        ),
        text("done"),
    ];
    for flags in [&["--sandbox", "off"][..], &[][..]] {
        let env = Env::new();
        let chown = Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(env.dir.path())
            .output()
            .unwrap();
        assert!(chown.status.success());
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(keel_for_nobody())
            .current_dir(env.dir.path())
            .stdin(std::process::Stdio::null())
            .env("HOME", env.dir.path())
            .env("XDG_CONFIG_HOME", env.path("config"))
            .env("XDG_DATA_HOME", env.path("data"))
            .env_remove("ANTHROPIC_API_KEY");
        env.write("script.jsonl", &script.join("\n"));
        let chown = Command::new("chown")
            .args(["65534:65534"])
            .arg(env.path("script.jsonl"))
            .output()
            .unwrap();
        assert!(chown.status.success());
        let out = c
            .env("OPENAI_API_KEY", secret)
            .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
            .args(["--output", "jsonl", "--permission-mode", "bypass"])
            .args(flags)
            .arg("go")
            .output()
            .unwrap();
        let shown = outputs(&out);
        let key = hex(&env.path("data/keel/seal.key"));
        assert!(shown.contains("end"), "{flags:?}: {shown} {}", stderr(&out));
        if flags.is_empty() {
            assert!(shown.starts_with("0\n"), "confined: {shown}");
            assert!(!shown.contains(&key), "confined: {shown}");
        } else {
            assert!(shown.starts_with("1\n"), "unconfined: {shown}");
            assert!(shown.contains(&key), "unconfined: {shown}");
        }
    }
}
