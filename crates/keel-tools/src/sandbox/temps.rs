//! The sandbox's private temp dirs (`$TMPDIR` of its commands, under the system temp dir):
//! their names, and the removal of those a killed keel process left behind.

use std::path::Path;

/// The name prefix of a sandbox's temp dir: `keel-sandbox-<pidns>-<pid>-` (the inode of this
/// process's PID namespace, `/proc/self/ns/pid`, and its id there), so that the dirs of a process
/// killed before it could remove them are known as such ([`sweep_dead`]);
/// `keel-sandbox-` where the namespace cannot be read.
pub(super) fn prefix() -> String {
    match pid_namespace() {
        Some(ns) => format!("keel-sandbox-{ns}-{}-", std::process::id()),
        None => "keel-sandbox-".to_owned(),
    }
}

/// The inode of this process's PID namespace, or `None` without procfs.
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Removes, once per process and on a thread of its own (off the start-up's path), the temp
/// dirs under `parent` that processes of this PID namespace left when they were killed (`kill
/// -9`, a crash: a worker killed so leaves one per running session): those named
/// `keel-sandbox-<this pidns>-<pid>-…` whose process is gone (`/proc/<pid>` absent) and that
/// belong to this user. A dir of another PID namespace (a container sharing `/tmp`, whose
/// process ids are not this namespace's) or of a live process is left alone; a pid reused by
/// a live process keeps its dir until that process is gone. Failures are ignored (best
/// effort: a dir a command made unremovable stays).
pub(super) fn sweep_dead(parent: &Path) {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let Some(ns) = pid_namespace() else { return };
    let parent = parent.to_owned();
    SWEPT.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("keel-sandbox-sweep".into())
            .spawn(move || {
                let n = sweep_dead_now(&parent, ns);
                if n > 0 {
                    tracing::info!(removed = n, dir = %parent.display(), "removed sandbox temp dirs of killed keel processes");
                }
            });
    });
}

/// Removes the directory tree at `path` with `rm -rf --one-file-system` (it does not follow
/// symbolic links and copes with any depth), whether it is gone afterwards. Not
/// `std::fs::remove_dir_all`: it recurses once per level, and a command had only to nest a few
/// tens of thousands of directories in its `$TMPDIR` for the sweep's thread to overflow its
/// stack and abort keel — every later keel, since the dir stayed (found by this session's
/// attack pass).
fn remove_tree(path: &Path) -> bool {
    let removed = std::process::Command::new("rm")
        .args(["-rf", "--one-file-system", "--"])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    removed && std::fs::symlink_metadata(path).is_err()
}

/// [`sweep_dead`]'s work, now: how many dirs it removed.
fn sweep_dead_now(parent: &Path, ns: u64) -> usize {
    use std::os::unix::fs::MetadataExt as _;
    let prefix = format!("keel-sandbox-{ns}-");
    let me = std::process::id();
    let uid = rustix::process::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if pid == me || !ours || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        if remove_tree(&path) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parent dir, this process's PID namespace and the pid of a process that has exited.
    fn setup() -> (tempfile::TempDir, u64, u32) {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        (tempfile::tempdir().unwrap(), pid_namespace().unwrap(), dead)
    }

    #[test]
    fn the_dirs_of_dead_processes_of_this_namespace_are_removed_and_no_other() {
        let (parent, ns, dead) = setup();
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let names = [
            format!("keel-sandbox-{ns}-{dead}-aaaaaa"),
            format!("keel-sandbox-{ns}-{me}-bbbbbb"),
            format!("keel-sandbox-{ns}-{}-cccccc", live.id()),
            format!("keel-sandbox-{}-{dead}-dddddd", ns + 1),
            "keel-sandbox-eeeeee".to_owned(),
            format!("keel-sandbox-{ns}-notapid-ffffff"),
        ];
        for name in &names {
            std::fs::create_dir(parent.path().join(name)).unwrap();
            std::fs::write(parent.path().join(name).join("file"), "x").unwrap();
        }
        // A file, not a dir, under a dead process's name: left alone.
        let file = format!("keel-sandbox-{ns}-{dead}-gggggg");
        std::fs::write(parent.path().join(&file), "x").unwrap();
        assert_eq!(sweep_dead_now(parent.path(), ns), 1);
        assert!(
            !parent.path().join(&names[0]).exists(),
            "the dead process's dir"
        );
        for kept in names[1..].iter().chain([&file]) {
            assert!(parent.path().join(kept).exists(), "{kept}");
        }
        live.kill().unwrap();
        live.wait().unwrap();
    }

    #[test]
    fn a_dead_processs_dir_nested_deeper_than_a_threads_stack_is_removed() {
        use rustix::fs::{Mode, OFlags, mkdirat, openat};
        let (parent, ns, dead) = setup();
        let top = parent
            .path()
            .join(format!("keel-sandbox-{ns}-{dead}-deep00"));
        std::fs::create_dir(&top).unwrap();
        // 60,000 levels: std's recursive removal overflowed a 2 MiB stack at ~36,000.
        let mut dir = openat(
            rustix::fs::CWD,
            &top,
            OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        for _ in 0..60_000 {
            mkdirat(&dir, "a", Mode::RWXU).unwrap();
            dir = openat(
                &dir,
                "a",
                OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
        }
        drop(dir);
        // On this thread (2 MiB stack, like the sweep's).
        let removed = std::thread::spawn({
            let parent = parent.path().to_owned();
            move || sweep_dead_now(&parent, ns)
        })
        .join()
        .unwrap();
        assert_eq!(removed, 1);
        assert!(!top.exists());
    }

    #[test]
    fn a_sandboxs_temp_dir_is_named_after_this_process() {
        let ns = pid_namespace().unwrap();
        assert_eq!(
            prefix(),
            format!("keel-sandbox-{ns}-{}-", std::process::id())
        );
        let sandbox = crate::sandbox::Sandbox::new(crate::sandbox::SandboxMode::Off).unwrap();
        let name = sandbox
            .temp_dir()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(name.starts_with(&prefix()), "{name}");
    }
}
