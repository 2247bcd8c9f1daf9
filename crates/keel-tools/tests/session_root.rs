//! A sandbox's session root (`sandbox/root.rs`, **Session roots**): the first confined call of a
//! sandbox builds the root in a mount namespace keel keeps, later calls copy it. What a fresh
//! root gives must hold for every call: what the host hides stays hidden when the host replaces
//! it or when it appears after the root was built, `/tmp` is empty at every call, and calls
//! running at once each get their own.

use std::path::Path;

use keel_tools::sandbox::{Invocation, Sandbox, SandboxMode};

use crate::common::register_launcher;

/// Held by every test here: one of them mounts and unmounts on the host, which makes every
/// sandbox's kept root be built again, and the others count builds.
static HOST_MOUNTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `command` with bash under `sandbox` in `ws`; its output and error.
pub(crate) async fn run(sandbox: &Sandbox, ws: &Path, command: &str) -> String {
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(
            Invocation {
                program: "bash".into(),
                args: vec!["-c".into(), command.into()],
                workdir: ws.to_path_buf(),
                stdout: writer.try_clone().unwrap().into(),
                stderr: writer.into(),
            },
            ws,
        )
        .await
        .unwrap();
    child.wait().await.unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut reader, &mut out).unwrap();
    out
}

/// How many mounts sit at `/tmp` in the call's mount namespace: 1 in a root built for the call,
/// 2 in a copy of the session's (its `/tmp` under the call's own empty one).
const TMP_MOUNTS: &str =
    "awk '$5 == \"/tmp\" { n++ } END { print \"tmp-mounts=\" n+0 }' /proc/self/mountinfo";

/// The host deletes and makes again a hidden file (a store's `-journal`), and replaces a hidden
/// directory, between two calls: the kernel detached the session root's covers with them, so
/// the next call must not copy that root — it builds a fresh one, and sees neither secret.
#[tokio::test]
async fn what_the_host_hides_stays_hidden_when_the_host_replaces_it_between_calls() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let data = ws.join(".keel");
    std::fs::create_dir_all(data.join("config")).unwrap();
    let journal = data.join("store.db-journal");
    std::fs::write(&journal, "SECRET-ONE").unwrap();
    std::fs::write(data.join("config/keel.toml"), "SECRET-TWO").unwrap();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let seal = outside.path().join("seal.key");
    std::fs::write(&seal, "SECRET-THREE").unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite).unwrap().hiding(&[
        journal.clone(),
        data.join("config"),
        seal.clone(),
    ]);
    let probe = format!(
        "cat .keel/store.db-journal .keel/config/keel.toml '{}' 2>&1; {TMP_MOUNTS}",
        seal.display()
    );
    let first = run(&sandbox, &ws, &probe).await;
    let second = run(&sandbox, &ws, &probe).await;
    for out in [&first, &second] {
        assert!(!out.contains("SECRET"), "{out}");
    }
    assert!(
        second.contains("tmp-mounts=2"),
        "the second call copies the session's root: {second}"
    );
    assert_eq!(
        sandbox.session_roots_built(),
        1,
        "the second call reused the first's root"
    );
    // The host replaces all three (as SQLite does its journal, an editor a config file).
    std::fs::remove_file(&journal).unwrap();
    std::fs::write(&journal, "SECRET-FOUR").unwrap();
    std::fs::remove_dir_all(data.join("config")).unwrap();
    std::fs::create_dir(data.join("config")).unwrap();
    std::fs::write(data.join("config/keel.toml"), "SECRET-FIVE").unwrap();
    std::fs::write(outside.path().join("seal.new"), "SECRET-SIX").unwrap();
    std::fs::rename(outside.path().join("seal.new"), &seal).unwrap();
    for call in 0..3 {
        let out = run(&sandbox, &ws, &probe).await;
        assert!(
            !out.contains("SECRET"),
            "call {call} after the change: {out}"
        );
    }
    assert_eq!(
        sandbox.session_roots_built(),
        2,
        "the stale root was built again once, then reused"
    );
}

/// keel's own layout: its data directory hidden, and in it the store's files hidden too (each
/// beneath the directory's cover, so not covered on its own), the config directory, a
/// workspace elsewhere. The session's root stays current call after call: one build.
#[tokio::test]
async fn hidden_paths_beneath_a_hidden_directory_keep_the_session_root_current() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let home = std::fs::canonicalize(home.path()).unwrap();
    let data = home.join(".local/share/keel");
    let config = home.join(".config/keel");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&config).unwrap();
    let mut hide = vec![data.clone(), config];
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let file = data.join(format!("keel.db{suffix}"));
        std::fs::write(&file, "SECRET-STORE").unwrap();
        hide.push(file);
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .hiding(&hide);
    let probe = format!("cat '{}/keel.db' 2>&1; echo end", data.display());
    for call in 0..4 {
        let out = run(&sandbox, &ws, &probe).await;
        assert!(!out.contains("SECRET"), "call {call}: {out}");
    }
    assert_eq!(sandbox.session_roots_built(), 1);
}

/// The host moves the workspace (under `/tmp`, where the session root's bind of it sits in the
/// build's own tmpfs and so stays attached) away and makes another at its path: the next call
/// works in the new one, as with a root built for it.
#[tokio::test]
async fn a_workspace_the_host_replaces_is_not_reused() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let ws = base.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("marker"), "OLD\n").unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite).unwrap();
    let probe = "cat marker; echo made > out";
    assert_eq!(run(&sandbox, &ws, probe).await, "OLD\n");
    std::fs::rename(&ws, base.join("ws.old")).unwrap();
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("marker"), "NEW\n").unwrap();
    assert_eq!(run(&sandbox, &ws, probe).await, "NEW\n");
    assert_eq!(std::fs::read_to_string(ws.join("out")).unwrap(), "made\n");
    assert_eq!(sandbox.session_roots_built(), 2);
}

/// A path the host hides that did not exist when the session's root was built (keel's store
/// made after the first command) is hidden from the next call.
#[tokio::test]
async fn a_hidden_path_made_after_the_first_call_is_hidden_from_the_next() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let store = ws.join("later.db");
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .hiding(std::slice::from_ref(&store));
    let probe = "cat later.db 2>&1; echo end";
    let first = run(&sandbox, &ws, probe).await;
    assert!(first.contains("No such file"), "{first}");
    std::fs::write(&store, "SECRET-LATER").unwrap();
    let out = run(&sandbox, &ws, probe).await;
    assert!(!out.contains("SECRET"), "{out}");
    assert!(out.ends_with("end\n"), "{out}");
}

/// Every call of a session root starts with an empty `/tmp`, `/run` and `/dev/shm`, and sees
/// the workspace (under `/tmp` here) and the private temp dir with what earlier calls left in
/// them; eight calls at once each get their own `/tmp`.
#[tokio::test]
async fn every_call_gets_empty_scratch_places_and_the_same_workspace() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    assert!(ws.starts_with("/tmp"), "{}", ws.display());
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite).unwrap();
    let probe = "ls -A /tmp /run /dev/shm | grep -v -e '^/' -e '^$' -e keel-sandbox -e '^\\.tmp' | wc -l; \
                 echo x > /tmp/mine; echo x > /dev/shm/mine; mkdir -p /run/mine; \
                 mktemp -p . count.XXXXXX > /dev/null; \
                 cat \"$TMPDIR/seen\" 2>/dev/null; echo seen >> \"$TMPDIR/seen\"";
    let first = run(&sandbox, &ws, probe).await;
    assert!(first.starts_with("0\n"), "{first}");
    let calls = (0..8).map(|_| run(&sandbox, &ws, probe));
    for out in futures_util::future::join_all(calls).await {
        assert!(out.starts_with("0\n"), "{out}");
        assert!(out.contains("seen"), "the private temp dir is kept: {out}");
    }
    let made = std::fs::read_dir(&ws)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("count.")
        })
        .count();
    assert_eq!(made, 9, "every call wrote to the workspace");
}

/// Unmounts a mount the test made on the host, whatever the test's outcome.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The host unmounts a disk (here a tmpfs) between two calls: the second call must not find it
/// still there through the session's root, which copied the host's mounts when it was built;
/// the changed mount table makes the root be built again.
#[tokio::test]
async fn a_disk_the_host_unmounts_between_calls_is_gone_from_the_next() {
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let point = std::fs::canonicalize(base.path()).unwrap().join("disk");
    std::fs::create_dir(&point).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&point)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "mounting a tmpfs (the tests run as root)"
    );
    let guard = Mounted(point.clone());
    std::fs::write(point.join("file"), "ON-THE-DISK").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite).unwrap();
    let probe = format!("cat '{}' 2>&1; echo end", point.join("file").display());
    assert!(run(&sandbox, &ws, &probe).await.contains("ON-THE-DISK"));
    assert!(run(&sandbox, &ws, &probe).await.contains("ON-THE-DISK"));
    assert_eq!(sandbox.session_roots_built(), 1);
    drop(guard);
    let out = run(&sandbox, &ws, &probe).await;
    assert!(!out.contains("ON-THE-DISK"), "{out}");
    assert_eq!(sandbox.session_roots_built(), 2);
}

/// A `bash` earlier on the command's `PATH` that the confined command may not execute (no
/// execute bit for its user) is passed over, as `execvp` passes over it: the next one runs.
#[tokio::test]
async fn a_program_on_path_the_command_cannot_execute_is_passed_over() {
    use std::os::unix::fs::PermissionsExt;
    let _mounts = HOST_MOUNTS.lock().await;
    register_launcher();
    let bin = tempfile::tempdir_in("/var/tmp").unwrap();
    let fake = bin.path().join("bash");
    std::fs::write(&fake, "#!/bin/sh\necho FAKE\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o001)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let sandbox = Sandbox::new(SandboxMode::WorkspaceWrite)
        .unwrap()
        .setting(&[("PATH".to_owned(), path)]);
    let out = run(&sandbox, &ws, "echo real").await;
    assert_eq!(out, "real\n");
}
