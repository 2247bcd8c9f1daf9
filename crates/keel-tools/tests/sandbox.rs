//! `shell` under the sandbox, for real: the machine has user namespaces, seccomp and Landlock;
//! a missing sandbox fails the probe test loudly instead of skipping. (The attacks are in
//! `escapes.rs`.)

use keel_tools::policy::{PermissionMode, Policy};
use keel_tools::sandbox::{Invocation, Launcher, Sandbox, SandboxMode};
use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use serde_json::json;

use crate::common::{Fixture, register_launcher};

fn fixture(mode: SandboxMode) -> Fixture {
    Fixture::with(mode, Policy::new(PermissionMode::Bypass))
}

#[tokio::test]
async fn the_kernel_enforces_both_sandbox_modes() {
    register_launcher();
    Sandbox::probe(SandboxMode::WorkspaceWrite).await.unwrap();
    Sandbox::probe(SandboxMode::ReadOnly).await.unwrap();
}

#[tokio::test]
async fn write_outside_the_workspace_fails_in_the_sandbox_and_works_without() {
    // Under /var/tmp: visible (read-only) in the sandbox, unlike anything under /tmp.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let target = outside.path().join("escaped.txt");
    let command = format!("echo pwned > '{}'", target.display());

    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(r.content.contains("Read-only file system"), "{}", r.content);
    assert!(
        !target.exists(),
        "the sandbox let a write outside the workspace through (even as root)"
    );

    let f = fixture(SandboxMode::Off);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "pwned\n");
}

#[tokio::test]
async fn tcp_connect_to_localhost_fails_in_the_sandbox_and_works_without() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let command = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");

    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(!r.content.contains("connected"), "{}", r.content);
    assert!(
        r.content.contains("Operation not permitted"),
        "{}",
        r.content
    );

    let f = fixture(SandboxMode::Off);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(r.content.contains("connected"), "{}", r.content);
}

#[tokio::test]
async fn unix_sockets_stay_allowed_in_the_sandbox() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f
        .call(
            "shell",
            json!({"command": "perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die \"unix: $!\\n\"; print \"unix ok\\n\"; socket(my $t, AF_INET6, SOCK_STREAM, 0) or die \"inet6: $!\\n\"'"}),
        )
        .await;
    assert!(r.content.contains("unix ok"), "{}", r.content);
    assert!(
        r.content.contains("inet6: Operation not permitted"),
        "{}",
        r.content
    );
}

#[tokio::test]
async fn workspace_and_private_temp_are_writable_in_workspace_write() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f
        .call("shell", json!({"command": "echo a > inside.txt && echo b > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" >/dev/null && cat /etc/hostname >/dev/null && echo ok"}))
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert_eq!(
        std::fs::read_to_string(f.path("inside.txt")).unwrap(),
        "a\n"
    );
}

#[tokio::test]
async fn read_only_sandbox_refuses_workspace_writes_but_reads() {
    let f = fixture(SandboxMode::ReadOnly);
    f.write("r.txt", "readable\n");
    let r = f
        .call("shell", json!({"command": "cat r.txt && echo x > w.txt"}))
        .await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(r.content.contains("readable"), "{}", r.content);
    assert!(!f.path("w.txt").exists());
}

#[tokio::test]
async fn the_sandbox_binds_only_the_spawned_process_tree() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": "true"})).await;
    assert_eq!(r.status, Succeeded);
    // The test process itself is still free to write anywhere and open IP sockets.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("free"), "x").unwrap();
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
}

#[tokio::test]
async fn sandbox_network_lets_a_tcp_connect_through_and_keeps_the_filesystem_confined() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let target = outside.path().join("escaped.txt");
    let command = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; echo pwned > '{}' || echo write-refused; ls /var/run/postgresql 2>&1 | grep -c PGSQL",
        target.display()
    );
    let mut f = fixture(SandboxMode::WorkspaceWrite);
    f.ctx.sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .with_network(true);
    let r = f.call("shell", json!({"command": command})).await;
    assert!(r.content.contains("connected"), "{}", r.content);
    assert!(r.content.contains("write-refused"), "{}", r.content);
    // Local services' sockets stay out of reach.
    assert!(r.content.contains("\n0\n"), "{}", r.content);
    assert!(!target.exists());
    // Without it, the same connect fails.
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": command})).await;
    assert!(!r.content.contains("connected"), "{}", r.content);
}

/// The commands of one sandbox (one session's) enter the same network namespace, made once:
/// not the host's, holding nothing but a loopback interface; another sandbox has its own. With
/// `with_network(true)` the commands are in the host's.
#[tokio::test]
async fn one_sandboxs_commands_share_one_empty_network_namespace() {
    let show = "readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let host = host.to_string_lossy();
    let f = fixture(SandboxMode::WorkspaceWrite);
    let first = f.call("shell", json!({"command": show})).await;
    let second = f.call("shell", json!({"command": show})).await;
    assert_eq!(first.status, Succeeded, "{}", first.content);
    let lines = |c: &str| c.lines().take(2).map(str::to_owned).collect::<Vec<_>>();
    let (a, b) = (lines(&first.content), lines(&second.content));
    assert!(a[0].starts_with("net:["), "{}", first.content);
    assert_eq!(a[0], b[0], "one namespace for the sandbox's commands");
    assert_ne!(a[0], host, "not the host's");
    assert_eq!(a[1], "lo", "only a loopback interface: {}", first.content);
    let other = fixture(SandboxMode::WorkspaceWrite);
    let third = other.call("shell", json!({"command": show})).await;
    assert_ne!(
        lines(&third.content)[0],
        a[0],
        "another sandbox, another namespace"
    );
    let mut shared = fixture(SandboxMode::WorkspaceWrite);
    shared.ctx.sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .with_network(true);
    let r = shared.call("shell", json!({"command": show})).await;
    assert_eq!(lines(&r.content)[0], host, "{}", r.content);
}

#[tokio::test]
async fn a_missing_launcher_is_named_and_nothing_runs() {
    let ws = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .with_launcher(Launcher::new("/nonexistent/keel-launcher"));
    let err = sandbox
        .spawn(
            Invocation {
                program: "touch".into(),
                args: vec!["ran".into()],
                workdir: ws.path().to_path_buf(),
                stdout: keel_tools::sandbox::dev_null().unwrap(),
                stderr: keel_tools::sandbox::dev_null().unwrap(),
            },
            ws.path(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sandbox `workspace_write` is unavailable")
            && err.contains("/nonexistent/keel-launcher"),
        "{err}"
    );
    assert!(!ws.path().join("ran").exists());
}

#[tokio::test]
async fn tmp_is_empty_and_private_while_tmpdir_persists_across_calls() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f
        .call(
            "shell",
            json!({"command": "echo one > /tmp/scratch; echo kept > \"$TMPDIR/kept\"; ls -A /tmp | grep -v -e scratch -e keel-sandbox -e '^\\.tmp' | wc -l"}),
        )
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(r.content.starts_with("0\n"), "{}", r.content);
    let r = f
        .call(
            "shell",
            json!({"command": "cat \"$TMPDIR/kept\"; test -e /tmp/scratch && echo scratch-kept || echo scratch-gone"}),
        )
        .await;
    assert!(r.content.contains("kept\nscratch-gone"), "{}", r.content);
}

/// keel's config directory may hold a workspace (the user's own keel.toml project): hiding the
/// directory keeps the workspace visible and writable, and the rest of it hidden.
#[tokio::test]
async fn a_workspace_inside_a_hidden_directory_stays_usable() {
    register_launcher();
    let hidden = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(hidden.path().join("secret.txt"), "HIDDEN-SECRET").unwrap();
    let ws = hidden.path().join("project");
    std::fs::create_dir(&ws).unwrap();
    let (mut reader, writer) = std::io::pipe().unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .hiding(&[hidden.path().to_path_buf()]);
    let command = format!(
        "echo made > made.txt && cat made.txt; cat '{}' 2>&1; ls ..",
        hidden.path().join("secret.txt").display()
    );
    let mut child = sandbox
        .spawn(
            Invocation {
                program: "bash".into(),
                args: vec!["-c".into(), command],
                workdir: ws.clone(),
                stdout: writer.try_clone().unwrap().into(),
                stderr: writer.into(),
            },
            &ws,
        )
        .await
        .unwrap();
    child.wait().await.unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut reader, &mut out).unwrap();
    assert!(out.starts_with("made\n"), "{out}");
    assert!(!out.contains("HIDDEN-SECRET"), "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "made\n"
    );
}

/// The shell tool kills the launcher's process group on a timeout: the namespace, and so the
/// command and everything it started (`setsid` included), goes with it.
#[tokio::test]
async fn a_timed_out_confined_command_ends_with_everything_it_started() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let mark = format!(
        "keel-timeout-{}",
        f.dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "")
    );
    let command = format!("setsid sh -c 'sleep 30; : {mark}' & sleep 30; : {mark}");
    times_out_at_one_second(&f, &command).await;
    assert_all_gone(&mark, "the timed-out command");
}

/// A command that keeps PID 1 reaping — thousands of live children each `wait` walks, and
/// exited ones made faster than they are reaped (`tests/data/reap_storm.c`, built here with the
/// machine's C compiler) — still ends at its timeout: PID 1 looks at the lifeline between
/// rounds of reaping. Before, through the session holder, it ran on (writing to the workspace)
/// until the turn ended.
#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn a_command_that_keeps_pid_1_reaping_still_ends_at_its_timeout() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let storm = f.dir.path().join("reap_storm");
    let built = std::process::Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&storm)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/reap_storm.c"
        ))
        .status()
        .expect("a C compiler (`cc`) to build the test's command");
    assert!(built.success(), "cc failed");
    let alive = f.dir.path().join("alive");
    let command = "(while :; do echo . >> alive; sleep 0.05; done) & \
                   exec ./reap_storm 3000 200 12000 3";
    times_out_at_one_second(&f, command).await;
    // Killed by now (a correctness deadline with a wide margin): the writer stopped.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let lines = || std::fs::read_to_string(&alive).unwrap_or_default().len();
    let before = lines();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        lines(),
        before,
        "the timed-out command is still writing to the workspace"
    );
    assert_all_gone(&storm.display().to_string(), "the reaping storm");
}

/// Runs `command` in `shell` with `timeout_ms` 1000 and checks the call failed as timed out.
async fn times_out_at_one_second(f: &crate::common::Fixture, command: &str) {
    let r = f
        .call("shell", json!({"command": command, "timeout_ms": 1000}))
        .await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(
        r.content.contains("timed out after 1000 ms"),
        "{}",
        r.content
    );
}

/// Waits up to 10 s for every process whose command line holds `mark` to be gone; fails if one
/// is left (of `what`).
fn assert_all_gone(mark: &str, what: &str) {
    let running = || {
        std::process::Command::new("pgrep")
            .args(["-f", mark])
            .output()
            .unwrap()
            .status
            .success()
    };
    let start = std::time::Instant::now();
    while running() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!running(), "a process of {what} is still running");
}

/// The session holders (`__sandbox session`) this test process started: (pid, state letter).
fn holders() -> Vec<(u32, char)> {
    children_where(std::process::id(), |cmdline| {
        cmdline.contains("__sandbox\0session\0")
    })
}

/// The session holders this test process started in the network namespace `net` (as
/// `readlink /proc/self/ns/net` names it): other tests of this process have holders of their
/// own.
fn holders_in(net: &str) -> Vec<(u32, char)> {
    holders()
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|link| link.to_string_lossy() == net)
        })
        .collect()
}

/// The children of `parent` whose command line (NUL-separated) passes `keep`: (pid, state).
fn children_where(parent: u32, keep: impl Fn(&str) -> bool) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let ppid = field("PPid:").and_then(|p| p.parse::<u32>().ok());
        let state = field("State:").and_then(|s| s.chars().next());
        if ppid == Some(parent) && keep(&String::from_utf8_lossy(&cmdline)) {
            out.push((pid, state.unwrap_or('?')));
        }
    }
    out
}

/// A sandbox's confined commands go through one session holder, which forks their launchers
/// (and reaps them: no zombie piles up); they share its network namespace; when the holder is
/// gone (killed here), the next command starts a launcher of its own that enters the same
/// namespaces, still confined.
#[tokio::test]
async fn a_sandboxs_commands_go_through_one_holder_and_outlive_it() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    // PID 1 of a command is its launcher's stage 2: forked by the holder, it has the holder's
    // command line (`__sandbox session …`); started for the call, `__sandbox 1`.
    let probe = json!({"command": "readlink /proc/self/ns/net; echo \"pid1=$(tr '\\0' ' ' < /proc/1/cmdline)\"; touch /var/tmp/keel-holder-escape-$$ 2>/dev/null && echo escaped || echo confined"});
    let forked =
        |content: &str| content.contains("pid1=") && content.contains("__sandbox session ");
    let first = f.call("shell", probe.clone()).await;
    assert_eq!(first.status, Succeeded, "{}", first.content);
    assert!(first.content.contains("confined"), "{}", first.content);
    assert!(forked(&first.content), "{}", first.content);
    let net = first.content.lines().next().unwrap().to_owned();
    assert!(net.starts_with("net:["), "{}", first.content);
    for _ in 0..20 {
        let r = f.call("shell", probe.clone()).await;
        assert_eq!(
            r.content.lines().next(),
            Some(net.as_str()),
            "{}",
            r.content
        );
        assert!(forked(&r.content), "{}", r.content);
    }
    let held = holders_in(&net);
    assert_eq!(held.len(), 1, "one holder for the sandbox: {held:?}");
    let holder = held[0].0;
    // What the holder forked is reaped as it ends: at most the last one may be ending now.
    let zombies: Vec<_> = children_where(holder, |_| true)
        .into_iter()
        .filter(|(_, state)| *state == 'Z')
        .collect();
    assert!(zombies.len() <= 1, "{zombies:?}");

    let pid = rustix::process::Pid::from_raw(i32::try_from(holder).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let after = f.call("shell", probe.clone()).await;
    assert_eq!(after.status, Succeeded, "{}", after.content);
    assert_eq!(
        after.content.lines().next(),
        Some(net.as_str()),
        "{}",
        after.content
    );
    assert!(after.content.contains("confined"), "{}", after.content);
    assert!(
        !forked(&after.content) && after.content.contains("__sandbox 1"),
        "{}",
        after.content
    );
}

/// A confined command cancelled mid-run (its launcher forked by the session's holder, so not a
/// process keel can signal) ends at once, with everything it started.
#[tokio::test]
async fn a_cancelled_confined_command_ends_with_everything_it_started() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    // The holder exists before the cancelled call: its launcher is forked by it.
    let warm = f.call("shell", json!({"command": "true"})).await;
    assert_eq!(warm.status, Succeeded, "{}", warm.content);
    let mark = format!("keel-cancel-{}", std::process::id());
    let cancel = f.ctx.cancel.clone();
    let started = f.path("started");
    tokio::spawn(async move {
        for _ in 0..400 {
            if started.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        cancel.cancel();
    });
    let command = format!("setsid sh -c 'sleep 30; : {mark}' & touch started; sleep 30; : {mark}");
    let begun = std::time::Instant::now();
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.details["cancelled"], true, "{}", r.content);
    assert!(
        begun.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );
    assert_all_gone(&mark, "the cancelled command");
}

/// A session holder that stops answering (stopped here with SIGSTOP) holds a call only for the
/// call's own time limit, not the launcher's 30 s setup limit; the next call does not wait on
/// it (it starts a launcher of its own, confined as ever); and the call given up on never runs
/// when the holder resumes.
#[tokio::test]
async fn a_stuck_holder_costs_one_call_its_time_limit_and_nothing_more() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let first = f
        .call("shell", json!({"command": "readlink /proc/self/ns/net"}))
        .await;
    assert_eq!(first.status, Succeeded, "{}", first.content);
    let net = first.content.lines().next().unwrap().to_owned();
    let held = holders_in(&net);
    assert_eq!(held.len(), 1, "{held:?}");
    let holder = rustix::process::Pid::from_raw(i32::try_from(held[0].0).unwrap()).unwrap();
    rustix::process::kill_process(holder, rustix::process::Signal::STOP).unwrap();

    let begun = std::time::Instant::now();
    let stuck = f
        .call(
            "shell",
            json!({"command": "touch given-up", "timeout_ms": 1500}),
        )
        .await;
    assert_eq!(stuck.status, Failed, "{}", stuck.content);
    assert!(
        stuck
            .content
            .contains("timed out after 1500 ms while the sandbox was starting"),
        "{}",
        stuck.content
    );
    assert!(
        begun.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );

    let next = f
        .call("shell", json!({"command": "readlink /proc/self/ns/net; touch /var/tmp/keel-stuck-$$ 2>/dev/null && echo escaped || echo confined", "timeout_ms": 10000}))
        .await;
    assert_eq!(next.status, Succeeded, "{}", next.content);
    assert_eq!(
        next.content.lines().next(),
        Some(net.as_str()),
        "{}",
        next.content
    );
    assert!(next.content.contains("confined"), "{}", next.content);

    rustix::process::kill_process(holder, rustix::process::Signal::CONT).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!f.path("given-up").exists(), "the call given up on ran");
}

/// Runs `program args` under `sandbox` in `dir` and returns its standard output.
async fn output_of(
    sandbox: &Sandbox,
    program: &str,
    args: &[&str],
    dir: &std::path::Path,
) -> String {
    use std::io::Read as _;
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(
            Invocation {
                program: program.into(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                workdir: dir.to_path_buf(),
                stdout: writer.try_clone().unwrap().into(),
                stderr: writer.into(),
            },
            dir,
        )
        .await
        .unwrap();
    child.wait().await.unwrap();
    let mut out = String::new();
    reader.read_to_string(&mut out).unwrap();
    out
}

/// A command's environment and the programs found on its `PATH` are computed once per
/// sandbox (issue 16: they were rebuilt at every call): a setting changed on a clone still
/// reaches its next command, and a program found once and then removed is looked for again.
#[tokio::test]
async fn a_command_s_kept_environment_follows_settings_and_a_removed_program() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    for (d, says) in [(&first, "first"), (&second, "second")] {
        std::fs::create_dir(d).unwrap();
        let prog = d.join("which-one");
        std::fs::write(&prog, format!("#!/bin/sh\necho {says} $KEPT_TEST_VAR\n")).unwrap();
        std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let path = format!("{}:{}:/usr/bin:/bin", first.display(), second.display());
    let sandbox = Sandbox::new(SandboxMode::Off).unwrap().setting(&[
        ("PATH".into(), path.clone()),
        ("KEPT_TEST_VAR".into(), "a".into()),
    ]);
    assert_eq!(
        output_of(&sandbox, "which-one", &[], dir.path()).await,
        "first a\n"
    );
    assert_eq!(
        output_of(&sandbox, "which-one", &[], dir.path()).await,
        "first a\n"
    );
    // The program found is gone: the next one on PATH runs.
    std::fs::remove_file(first.join("which-one")).unwrap();
    assert_eq!(
        output_of(&sandbox, "which-one", &[], dir.path()).await,
        "second a\n"
    );
    // A clone with another setting: its commands see it, the original's do not.
    let changed = sandbox
        .clone()
        .setting(&[("PATH".into(), path), ("KEPT_TEST_VAR".into(), "b".into())]);
    assert_eq!(
        output_of(&changed, "which-one", &[], dir.path()).await,
        "second b\n"
    );
    assert_eq!(
        output_of(&sandbox, "which-one", &[], dir.path()).await,
        "second a\n"
    );
}
