//! What a confined command must not reach besides the host's files (the final attack pass on
//! issue 11): other sessions' workspaces under a server's workspace roots, descriptors the host
//! holds, keel's own files inside the workspace after renaming their ancestors, and the sandbox
//! spec in the launcher's command line. Each attack first succeeds unconfined (or through a
//! naive spawn), then fails through the real sandbox (`keel-sandbox`, see `escapes.rs`), as root
//! and as uid 65534.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::escapes::{BOTH, CONFINED, NOBODY, OFF, RO, Run, Sbx, WW, Who, chown_tree};

/// A temp dir under /var/tmp (which the sandbox leaves visible, read-only) owned by `who`.
fn visible(who: Who) -> tempfile::TempDir {
    crate::escapes::visible_outside(who)
}

/// Writes `text` to `path`, creating its directories.
fn put(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

// --- other workspaces under `keel serve`'s workspace roots ------------------------------------

/// A workspace `ws/` directly under a workspace root (`dir`, under /var/tmp).
fn workspace_under_a_root(who: Who) -> Sbx {
    let dir = visible(who);
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    if who == Who::Nobody {
        chown_tree(dir.path(), NOBODY);
    }
    Sbx { dir, who }
}

#[test]
fn other_workspaces_under_the_workspace_roots_are_hidden() {
    for who in BOTH {
        let a = workspace_under_a_root(who);
        let root1 = a.dir.path().to_path_buf();
        let root2 = visible(who);
        // Session B's workspace under the same root, C's under the other root, and a root
        // inside A's own workspace.
        put(&root1.join("bob/secret.txt"), "BOB-WORKSPACE-SECRET");
        put(&root2.path().join("carol/secret.txt"), "CAROL-ROOT2-SECRET");
        put(&a.path("inner/dave/secret.txt"), "INNER-ROOT-SECRET");
        put(&a.path("mine.txt"), "A-OWN-FILE");
        if who == Who::Nobody {
            chown_tree(&root1, NOBODY);
            chown_tree(root2.path(), NOBODY);
        }
        let attack = format!(
            "ls -1 {r1} {r2} inner | sed 's/^/entry:/'; cat {r1}/bob/secret.txt {r2}/carol/secret.txt \
             inner/dave/secret.txt; echo x > {r1}/bob/planted; echo x > {r2}/planted; \
             echo x > {r1}/planted; cat mine.txt; echo written > new.txt; echo done",
            r1 = s(&root1),
            r2 = s(root2.path()),
        );
        let planted = [
            root1.join("bob/planted"),
            root2.path().join("planted"),
            root1.join("planted"),
        ];
        let secrets = [
            "BOB-WORKSPACE-SECRET",
            "CAROL-ROOT2-SECRET",
            "INNER-ROOT-SECRET",
            "entry:bob",
            "entry:carol",
            "entry:dave",
        ];
        let r = a.run(OFF, &attack);
        for secret in secrets {
            assert!(r.has(secret), "unconfined ({who:?}), {secret}: {r:?}");
        }
        for p in &planted {
            assert!(p.exists(), "unconfined ({who:?}): {p:?} was not written");
            std::fs::remove_file(p).unwrap();
        }
        std::fs::remove_file(a.path("new.txt")).unwrap();

        let (inner, ws, bob) = (a.path("inner"), a.ws(), root1.join("bob"));
        let layouts: [Vec<&Path>; 3] = [
            // Two roots, and one inside the workspace.
            vec![&root1, root2.path(), &inner],
            // The workspace is a root itself, inside another.
            vec![&ws, &root1, root2.path(), &inner],
            // Nested roots: a root inside a root.
            vec![&root1, &bob, root2.path(), &inner],
        ];
        for roots in &layouts {
            let flags: Vec<&str> = roots
                .iter()
                .flat_map(|r| ["--workspace-root", s(r)])
                .collect();
            for mode in CONFINED {
                let r = a.run_with(mode, &flags, &attack);
                let what = format!("{mode} ({who:?}) roots {roots:?}");
                for secret in secrets {
                    assert!(!r.has(secret), "{what} showed {secret}: {r:?}");
                }
                for p in &planted {
                    assert!(!p.exists(), "{what} wrote {p:?}: {r:?}");
                }
                // The session's own workspace works as before.
                assert!(
                    r.has("entry:ws") && r.has("A-OWN-FILE") && r.has("done"),
                    "{what}: {r:?}"
                );
                let written = std::fs::read_to_string(a.path("new.txt")).ok();
                assert_eq!(written.is_some(), mode == WW, "{what}: {r:?}");
                let _ = std::fs::remove_file(a.path("new.txt"));
            }
        }
    }
}

/// The launcher's stage 2 builds the new root on a staging tmpfs with the host's whole tree
/// under it, pivots into the new root and detaches the staging root (with the host's tree)
/// before the command starts (`root.rs`). The command must never run with the old root still
/// stacked on `/` (where `ls /` would not show it, but its mount table would, and a lookup
/// through a mount point could reach it): one mount at `/` and nothing of the staging root's
/// `newroot`/`oldroot`, every time.
#[test]
fn a_command_never_starts_with_the_hosts_old_root_attached() {
    let probe = "awk '$5 == \"/\" { n++ } /oldroot|newroot/ { bad++ } \
                 END { print \"roots=\" n \" staging=\" bad+0 }' /proc/self/mountinfo; \
                 ls -d /oldroot /newroot 2>/dev/null | sed 's/^/seen:/'; echo done";
    for who in BOTH {
        let a = Sbx::new(who);
        let host = a.run(OFF, probe);
        assert!(
            host.has("roots=") && host.has("done"),
            "unconfined ({who:?}): {host:?}"
        );
        for mode in CONFINED {
            for i in 0..15 {
                let r = a.run(mode, probe);
                let what = format!("{mode} ({who:?}), call {i}");
                assert!(r.has("roots=1 staging=0") && r.has("done"), "{what}: {r:?}");
                assert!(!r.has("seen:"), "{what}: {r:?}");
            }
        }
    }
}

// --- descriptors the host holds ---------------------------------------------------------------

/// `command` started by a host that holds fd 7 open on `secret` and fd 8 on a TCP socket to
/// `port`, neither close-on-exec (as a store file or a server socket a library opened).
fn holding_descriptors(command: &Command, secret: &Path, port: u16, cwd: &Path) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(r#"exec 7<"$1" 8<>"/dev/tcp/127.0.0.1/$2" && shift 2 && exec "$@""#)
        .arg("host")
        .arg(secret)
        .arg(port.to_string())
        .arg(command.get_program())
        .args(command.get_args())
        .current_dir(cwd)
        .stdin(Stdio::null());
    c
}

fn output(mut c: Command) -> Run {
    let out = c.output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Run {
        code: out.status.code(),
        text,
    }
}

#[test]
fn a_command_inherits_no_descriptor_of_its_host() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Readable by root only: what a descriptor leaks is not what the user could read anyway.
    let store = tempfile::tempdir().unwrap();
    let secret = store.path().join("keel.db");
    std::fs::write(&secret, "HOST-STORE-SECRET").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script =
        "ls -l /proc/self/fd; cat <&7; echo; echo \"fds: $(ls /proc/self/fd | tr '\\n' ' ')\"";
    for who in BOTH {
        let sbx = Sbx::new(who);
        // A naive host: the command gets both.
        let mut naive = match who {
            Who::Root => Command::new("bash"),
            Who::Nobody => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"]);
                c
            }
        };
        naive.args(["-c", script]);
        let r = output(holding_descriptors(&naive, &secret, port, &sbx.ws()));
        assert!(
            r.has("HOST-STORE-SECRET") && r.has("socket:"),
            "naive ({who:?}): {r:?}"
        );
        for mode in [OFF, WW, RO] {
            let c = sbx.command(mode, &[], script);
            let r = output(holding_descriptors(&c, &secret, port, &sbx.ws()));
            assert_eq!(r.code, Some(0), "{mode} ({who:?}): {r:?}");
            assert!(
                !r.has("HOST-STORE-SECRET") && !r.has("socket:") && !r.has("keel.db"),
                "{mode} ({who:?}): {r:?}"
            );
            // `ls` itself holds 3 (the directory it lists).
            assert!(r.has("fds: 0 1 2 3 \n"), "{mode} ({who:?}): {r:?}");
        }
    }
}

/// The processes whose command line is the sandbox launcher's, with their parent's pid.
fn launchers() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains("__sandbox") {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        if let Some(ppid) = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse().ok())
        {
            out.push((pid, ppid));
        }
    }
    out
}

/// Waits (at most 30 s) until the file at `path` exists: a command in the sandbox has started.
fn wait_for_file(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `keel-sandbox EXTRA -- bash -c 'touch started; sleep 30'` in `sbx`, returned once the
/// command runs (kill it when done).
fn sleeping_in(sbx: &Sbx, extra: &[&str]) -> std::process::Child {
    let marker = sbx.path("started");
    let child = sbx
        .command(
            crate::escapes::CONFINED[0],
            extra,
            &format!("touch {}; sleep 30", marker.display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&marker);
    child
}

/// Process `pid`'s number in its own (innermost) PID namespace (`NSpid`'s last field).
fn ns_pid(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned()
}

/// The open descriptors of process `pid`: `(number, what /proc/PID/fd/N links to)`.
fn descriptors(pid: u32) -> Vec<(u32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .map(|e| {
            let fd = e.file_name().to_string_lossy().parse().unwrap();
            let to = std::fs::read_link(e.path()).unwrap_or_default();
            (fd, to.display().to_string())
        })
        .collect()
}

/// The sandbox's PID 1 (the launcher's second stage, forked from the first and never
/// executed) keeps open nothing a host leaked to the launcher. keel's own spawn passes none
/// (`a_command_inherits_no_descriptor_of_its_host`), so the launcher is started here directly,
/// as a careless host would, holding the store file and a TCP socket of
/// [`holding_descriptors`]; seen from the host while the command runs, stage 2 holds its
/// standard input (the socket to stage 1), output and error and that socket once more, and
/// nothing else. (Marked close-on-exec only, they stayed open in it.)
#[test]
fn the_sandboxs_first_process_keeps_no_descriptor_of_its_host() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let store = tempfile::tempdir().unwrap();
    let secret = store.path().join("keel.db");
    std::fs::write(&secret, "HOST-STORE-SECRET").unwrap();
    let sbx = Sbx::new(Who::Root);
    let ws = std::fs::canonicalize(sbx.ws()).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let marker = ws.join("started");
    let spec = serde_json::json!({
        // keel_tools::sandbox's LAUNCH_SPEC_FORMAT.
        "format": 5,
        "build": keel_tools::sandbox::LAUNCHER_BUILD,
        "command": ["bash", "-c", format!("touch {}; sleep 30", marker.display())],
        "mode": "workspace_write",
        "network": false,
        "workspace": ws,
        "temp": std::fs::canonicalize(temp.path()).unwrap(),
        "workdir": ws,
        "hide": [],
        "protect": [],
        "shared_network": false,
        "env": [["PATH", "/usr/bin:/bin"]],
        "root": "fresh",
    });
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut launcher = Command::new(crate::escapes::binary(Who::Root));
    launcher.args(["__sandbox", "1"]);
    let mut host = holding_descriptors(&launcher, &secret, port, &ws);
    host.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = host.spawn().unwrap();
    writeln!(ours, "{spec}").unwrap();
    wait_for_file(&marker);
    let all = launchers();
    // Stage 2: a launcher whose parent is a launcher (stage 1), here the one under `child`.
    let stage1 = child.id();
    let stage2: Vec<u32> = all
        .iter()
        .filter(|(_, ppid)| *ppid == stage1)
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(stage2.len(), 1, "one second stage under {stage1}: {all:?}");
    let fds = descriptors(stage2[0]);
    // The first stage got them: the check is not vacuous.
    let stage1_holds_it = std::fs::read_dir(format!("/proc/{stage1}/fd"))
        .unwrap()
        .flatten()
        .any(|e| {
            std::fs::read_link(e.path()).is_ok_and(|to| to.to_string_lossy().contains("keel.db"))
        });
    assert!(stage1_holds_it, "stage 1 did not get the store file");
    assert!(
        !fds.iter().any(|(_, to)| to.contains("keel.db")),
        "stage 2 holds the store file: {fds:?}"
    );
    assert_holds_its_socket_and_nothing_else(&fds);
    drop(ours);
    let _ = child.wait();
}

/// keel's environment may hold a variable that is not UTF-8 (a name or a value): a confined
/// command gets it as it is, byte for byte, as an unconfined one does (the spec carries it as
/// bytes).
#[test]
fn a_non_utf8_environment_variable_reaches_a_confined_command_intact() {
    use std::os::unix::ffi::OsStrExt;
    let sbx = Sbx::new(Who::Root);
    let value = std::ffi::OsStr::from_bytes(b"a\xff\xfeb");
    let name = std::ffi::OsStr::from_bytes(b"ODD_\xe9NAME");
    for mode in [OFF, WW, RO] {
        let out = sbx
            .command(
                mode,
                &[],
                "printf %s \"$BADVAL\" | od -An -tx1; env | grep -c '^ODD_' ",
            )
            .env("BADVAL", value)
            .env(name, "x")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("61 ff fe 62"), "{mode}: {text}");
        assert!(text.trim_end().ends_with('1'), "{mode}: {text}");
    }
}

/// The descriptors of a sandbox's PID 1 (`(number, link)` from `/proc/PID/fd`): its standard
/// input (the socket to the host, or to stage 1), output and error, that socket once more, and
/// the `signalfd` it takes SIGCHLD from; nothing else.
fn assert_holds_its_socket_and_nothing_else(fds: &[(u32, String)]) {
    let above: Vec<&(u32, String)> = fds
        .iter()
        .filter(|(fd, to)| *fd > 2 && to != "anon_inode:[signalfd]")
        .collect();
    assert_eq!(above.len(), 1, "PID 1 holds more than its socket: {fds:?}");
    let socket_of_stdin = &fds.iter().find(|(fd, _)| *fd == 0).unwrap().1;
    assert!(socket_of_stdin.starts_with("socket:"), "{fds:?}");
    assert_eq!(&above[0].1, socket_of_stdin, "{fds:?}");
    let signalfds = fds
        .iter()
        .filter(|(_, to)| to == "anon_inode:[signalfd]")
        .count();
    assert_eq!(signalfds, 1, "{fds:?}");
}

/// The process a session's holder clones for a call (straight into the call's PID namespace,
/// its PID 1) keeps nothing of the holder's: not its socket to keel (which would let a call
/// read the next calls' descriptors), not the other calls' pidfds; only its lifeline and the
/// command's output, as above. Seen from the host while the command runs.
#[test]
fn a_holders_call_keeps_nothing_of_the_holder() {
    let sbx = Sbx::new(Who::Root);
    let mut child = sleeping_in(&sbx, &[]);
    let all = launchers();
    let holder: Vec<u32> = all
        .iter()
        .filter(|(_, ppid)| *ppid == child.id())
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(holder.len(), 1, "one holder under {}: {all:?}", child.id());
    let calls: Vec<u32> = all
        .iter()
        .filter(|(_, ppid)| *ppid == holder[0])
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(calls.len(), 1, "one call under the holder: {all:?}");
    // The call's process is PID 1 of its own PID namespace.
    assert_eq!(ns_pid(calls[0]), "1");
    let fds = descriptors(calls[0]);
    let holders: Vec<String> = descriptors(holder[0])
        .into_iter()
        .filter(|(_, to)| to.starts_with("socket:") || to.contains("pidfd"))
        .map(|(_, to)| to)
        .collect();
    assert!(
        !holders.is_empty(),
        "the holder holds its socket: the check is not vacuous"
    );
    for (_, to) in &fds {
        assert!(
            !holders.contains(to),
            "the call holds the holder's {to}: {fds:?}"
        );
    }
    assert_holds_its_socket_and_nothing_else(&fds);
    let _ = child.kill();
    let _ = child.wait();
}

/// Where `clone3` is refused (kernels before 5.3, some container runtimes' seccomp filters;
/// here `keel-sandbox --without-clone3`), the holder serves calls the older way: a stage 1 in
/// the holder's PID namespace forks stage 2, PID 1 of the call's, which holds nothing of the
/// holder's either; the command's output and exit code come through as before.
#[test]
fn without_clone3_the_holder_forks_a_stage_1_and_calls_still_run() {
    let sbx = Sbx::new(Who::Root);
    let r = sbx.run_with(
        crate::escapes::CONFINED[0],
        &["--without-clone3"],
        "echo from-the-command; exit 7",
    );
    assert_eq!(r.code, Some(7), "{r:?}");
    assert!(r.has("from-the-command"), "{r:?}");
    let mut child = sleeping_in(&sbx, &["--without-clone3"]);
    let all = launchers();
    let under = |parent: u32| -> Vec<u32> {
        all.iter()
            .filter(|(_, ppid)| *ppid == parent)
            .map(|(pid, _)| *pid)
            .collect()
    };
    let holder = under(child.id());
    assert_eq!(holder.len(), 1, "one holder: {all:?}");
    let stage1 = under(holder[0]);
    assert_eq!(stage1.len(), 1, "one stage 1 under the holder: {all:?}");
    let stage2 = under(stage1[0]);
    assert_eq!(stage2.len(), 1, "one stage 2 under stage 1: {all:?}");
    assert_ne!(
        ns_pid(stage1[0]),
        "1",
        "stage 1 is in the holder's PID namespace"
    );
    assert_eq!(ns_pid(stage2[0]), "1", "stage 2 is PID 1 of the call's");
    assert_holds_its_socket_and_nothing_else(&descriptors(stage2[0]));
    let _ = child.kill();
    let _ = child.wait();
}

/// A session holder (`__sandbox session FORMAT:BUILD`) of another build than its host's
/// refuses to start: an error line naming both, exit 125 (keel then starts a launcher per
/// call, which refuses the spec the same way).
#[test]
fn a_session_holder_of_another_build_refuses_to_start() {
    let out = Command::new(crate::escapes::binary(Who::Root))
        .args(["__sandbox", "session", "4:0.0.0-0000000000000000"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(125), "{said}");
    assert!(
        said.starts_with("error launcher: this launcher serves 5:")
            && said.contains("the host 4:0.0.0-0000000000000000"),
        "{said}"
    );
}

/// A launcher refuses a spec from another build — another format, a field it does not know,
/// another build id (what a `keel-sandbox-launcher` not installed with its `keel` would get) — with an
/// error line naming why, exit 125, and runs nothing.
#[test]
fn a_launcher_refuses_a_spec_of_another_build_and_runs_nothing() {
    use std::io::{BufRead, Write};
    let sbx = Sbx::new(Who::Root);
    let ws = std::fs::canonicalize(sbx.ws()).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let marker = ws.join("ran");
    let spec = |format: u32, extra: Option<(&str, bool)>| {
        let mut v = serde_json::json!({
            "format": format,
            "build": keel_tools::sandbox::LAUNCHER_BUILD,
            "command": ["touch", s(&marker)],
            "mode": "workspace_write",
            "network": false,
            "workspace": ws,
            "temp": std::fs::canonicalize(temp.path()).unwrap(),
            "workdir": ws,
            "hide": [],
            "protect": [],
            "shared_network": false,
            "env": [["PATH", "/usr/bin:/bin"]],
            "root": "fresh",
        });
        if let Some((name, value)) = extra {
            v[name] = serde_json::Value::Bool(value);
        }
        v
    };
    for (spec, why) in [
        (
            spec(4, None),
            "the spec's format is 4, this launcher reads 5",
        ),
        (
            spec(6, None),
            "the spec's format is 6, this launcher reads 5",
        ),
        (
            spec(5, Some(("share_pid", true))),
            "unknown field `share_pid`",
        ),
        (
            {
                let mut v = spec(5, None);
                v["build"] = serde_json::Value::from("0.0.0-0000000000000000");
                v
            },
            "the host is keel-tools build 0.0.0-0000000000000000, this launcher is",
        ),
    ] {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut launcher = Command::new(crate::escapes::binary(Who::Root));
        launcher
            .args(["__sandbox", "1"])
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = launcher.spawn().unwrap();
        writeln!(&ours, "{spec}").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&ours).read_line(&mut line).unwrap();
        assert!(
            line.starts_with("error launcher (reading the sandbox spec): ") && line.contains(why),
            "{line}"
        );
        assert_eq!(child.wait().unwrap().code(), Some(125));
        assert!(!marker.exists(), "nothing ran");
    }
}

// --- keel's files inside the workspace (workspace = $HOME) ------------------------------------

#[test]
fn keels_files_inside_the_workspace_stay_hidden_after_renaming_their_ancestors() {
    let secrets = [
        "HOME-STORE-SECRET",
        "HOME-SEAL-SECRET",
        "HOME-CONFIG-SECRET",
    ];
    let setup = |who: Who| {
        let home = Sbx::new(who);
        put(&home.path(".local/share/keel/keel.db"), secrets[0]);
        put(&home.path(".local/share/keel/seal.key"), secrets[1]);
        put(&home.path(".config/keel/keel.toml"), secrets[2]);
        put(&home.path(".local/bin/tool"), "a tool");
        if who == Who::Nobody {
            chown_tree(&home.ws(), NOBODY);
        }
        home
    };
    // Move each hidden path or a directory above it, then read it where it went.
    let attack = "mv .local .l2; mv .local/share .local/s2; mv .local/share/keel .local/share/k2; \
                  mv .config c2; mv .config/keel .config/k2; rm -rf .local/share/keel .config/keel; \
                  mv .local/bin .local/bin2 && echo sibling-moved; echo step1";
    let reveal = "cat .local/share/keel/keel.db .local/share/keel/seal.key .config/keel/keel.toml \
                  .l2/share/keel/keel.db .l2/share/keel/seal.key .local/s2/keel/keel.db \
                  .local/share/k2/keel.db .local/share/k2/seal.key \
                  c2/keel/keel.toml .config/k2/keel.toml; echo step2";
    for who in BOTH {
        let home = setup(who);
        let hidden = [home.path(".local/share/keel"), home.path(".config/keel")];
        let flags = ["--hide", s(&hidden[0]), "--hide", s(&hidden[1])];
        let r = home.run_with(OFF, &flags, &format!("{attack}; {reveal}"));
        for secret in secrets {
            assert!(r.has(secret), "unconfined ({who:?}), {secret}: {r:?}");
        }
        for mode in CONFINED {
            let home = setup(who);
            let hidden = [home.path(".local/share/keel"), home.path(".config/keel")];
            let flags = ["--hide", s(&hidden[0]), "--hide", s(&hidden[1])];
            let first = home.run_with(mode, &flags, attack);
            let second = home.run_with(mode, &flags, reveal);
            for secret in secrets {
                assert!(
                    !first.has(secret) && !second.has(secret),
                    "{mode} ({who:?}) showed {secret}: {first:?} {second:?}"
                );
            }
            assert!(
                first.has("step1") && second.has("step2"),
                "{first:?} {second:?}"
            );
            if mode == WW {
                assert!(
                    first.has("sibling-moved"),
                    "the rest of the workspace stays writable: {first:?}"
                );
            }
            // Nothing moved or removed on the host either.
            for (rel, secret) in [
                (".local/share/keel/keel.db", secrets[0]),
                (".local/share/keel/seal.key", secrets[1]),
                (".config/keel/keel.toml", secrets[2]),
            ] {
                assert_eq!(
                    std::fs::read_to_string(home.path(rel)).unwrap(),
                    secret,
                    "{mode} ({who:?})"
                );
            }
        }
    }
}

// --- the sandbox spec -------------------------------------------------------------------------

#[test]
fn the_launchers_command_line_and_environment_show_nothing_of_the_spec() {
    for who in BOTH {
        let sbx = Sbx::new(who);
        let data = visible(who);
        let hidden: PathBuf = data.path().join("keel-data-dir-marker");
        std::fs::create_dir(&hidden).unwrap();
        let root = visible(who);
        if who == Who::Nobody {
            chown_tree(data.path(), NOBODY);
        }
        let script = "echo \"cmdline=[$(tr '\\0' ' ' < /proc/1/cmdline)]\"; \
                      echo \"environ=[$(tr '\\0' ' ' < /proc/1/environ)]\"";
        let flags = [
            "--hide",
            s(&hidden),
            "--workspace-root",
            s(root.path()),
            "--set",
            "DEPLOY_TOKEN=spec-env-value-0042",
        ];
        for mode in CONFINED {
            let r = sbx.run_with(mode, &flags, script);
            let what = format!("{mode} ({who:?})");
            // PID 1 is the launcher (forked by the session's holder: its command line is the
            // holder's): the check is not vacuous.
            assert!(r.has("cmdline=[") && r.has("__sandbox "), "{what}: {r:?}");
            let cmdline = r.text.lines().find(|l| l.starts_with("cmdline=")).unwrap();
            for leak in [
                s(&hidden),
                s(root.path()),
                "\"mode\"",
                "bash",
                "/proc/1/environ",
            ] {
                assert!(!cmdline.contains(leak), "{what}: {leak} in {cmdline}");
            }
            let environ = r.text.lines().find(|l| l.starts_with("environ=")).unwrap();
            assert_eq!(environ, "environ=[]", "{what}: {r:?}");
        }
    }
}

/// The workspace is `$HOME` and keel's config directory is a dotfiles link inside it
/// (`.config/keel -> ../dotfiles/keel`): the sandbox covers what the link points to, and a
/// command must not replace the link with a directory of its own either — a `keel.toml` with
/// hooks there would run outside the sandbox at the next keel start (found by the attack pass).
#[tokio::test]
async fn a_link_on_the_way_to_a_hidden_path_cannot_be_replaced() {
    crate::common::register_launcher();
    let dir = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(home.join("dotfiles/keel")).unwrap();
    std::fs::write(home.join("dotfiles/keel/keel.toml"), "SECRET-CONFIG").unwrap();
    std::fs::create_dir(home.join(".config")).unwrap();
    std::os::unix::fs::symlink("../dotfiles/keel", home.join(".config/keel")).unwrap();
    let sandbox =
        keel_tools::sandbox::Sandbox::new(keel_tools::sandbox::SandboxMode::WorkspaceWrite)
            .unwrap()
            .hiding(&[home.join(".config/keel")]);
    let swap = "cat .config/keel/keel.toml; rm .config/keel; echo rm=$?; \
                mv .config/keel .config/old; echo mv=$?; \
                mkdir -p .config/keel 2>/dev/null; echo hooks > .config/keel/keel.toml; echo write=$?; \
                mv .config .config2; echo mvdir=$?; echo made > elsewhere; echo other=$?";
    let out = crate::session_root::run(&sandbox, &home, swap).await;
    assert!(!out.contains("SECRET-CONFIG"), "{out}");
    for refused in ["rm=0", "mv=0", "write=0", "mvdir=0"] {
        assert!(!out.contains(refused), "{refused}: {out}");
    }
    assert!(
        out.contains("other=0"),
        "the rest of the workspace stays writable: {out}"
    );
    assert!(
        std::fs::symlink_metadata(home.join(".config/keel"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}
