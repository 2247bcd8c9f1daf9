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

/// Removes the directory tree at `path` (it does not follow symbolic links and copes with any
/// depth), whether it is gone afterwards: a walk without recursion first ([`remove_walking`]),
/// then `rm -rf --one-file-system` for what the walk could not remove (a tree deeper than the
/// walk goes). Not `std::fs::remove_dir_all`: it recurses once per level, and a command had
/// only to nest a few tens of thousands of directories in its `$TMPDIR` for the removing
/// thread to overflow its stack and abort keel — at the session's end, or in the sweep of
/// every later keel, since the dir stayed (found by attack passes).
pub(super) fn remove_tree(path: &Path) -> bool {
    match remove_walking(path) {
        Ok(()) => return true,
        // `rm --one-file-system` would enter a bind mount of the same device: what the walk
        // stopped at stays.
        Err(e) if e.to_string() == ANOTHER_MOUNT => return false,
        Err(_) => {}
    }
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

/// The error [`remove_walking`] stops with at a directory on another mount.
const ANOTHER_MOUNT: &str = "another mount";

/// How deep [`remove_walking`] goes (one open descriptor a level) before it leaves the tree
/// to `rm`.
const WALK_DEPTH: usize = 128;

/// Removes the tree at `root` depth first, by descriptor: each directory is opened from its
/// parent's descriptor with `O_NOFOLLOW` (a directory a command swapped for a symbolic link
/// after it was listed is not entered: the open fails), its entries are unlinked relative to it
/// (a symbolic link is removed, never followed), and a directory on another mount — another
/// file system, or a bind mount of the same one (`statx`'s mount id) — is not entered (more
/// than `rm --one-file-system`, which enters a bind mount of the same device). A directory of
/// this user's without the owner's read, write or search permission (a command's `chmod 500
/// $TMPDIR`) is given them first (through an `O_PATH` descriptor of it, never a link), else it
/// could be removed by nobody but root. No recursion: an explicit stack of at most [`WALK_DEPTH`]
/// descriptors. The first error stops it: at another mount `remove_tree` stops too; otherwise
/// (deeper than the walk goes, a directory refilled while it is removed, no `/proc`) it
/// leaves the rest to `rm`. An entry already gone counts as removed.
fn remove_walking(root: &Path) -> std::io::Result<()> {
    use rustix::fs::{
        AtFlags, CWD, Dir, FileType, Mode, OFlags, StatxFlags, chmod, fchmod, openat, statx,
        unlinkat,
    };
    use rustix::io::Errno;
    use std::os::fd::AsRawFd as _;
    let gone_ok = |r: rustix::io::Result<()>| match r {
        Err(Errno::NOENT) => Ok(()),
        r => r,
    };
    let owner_all = Mode::RWXU.bits();
    // The mount a directory open at `fd` is on, and its mode.
    let mount_of = |fd: &std::os::fd::OwnedFd| {
        statx(
            fd,
            c"",
            AtFlags::EMPTY_PATH,
            StatxFlags::MNT_ID | StatxFlags::MODE,
        )
        .map(|st| (st.stx_mnt_id, u32::from(st.stx_mode)))
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let top = openat(CWD, root, flags, Mode::empty())?;
    let (mount, mode) = mount_of(&top)?;
    if mode & owner_all != owner_all {
        fchmod(&top, Mode::from_raw_mode(mode | owner_all))?;
    }
    // Each open directory, with its name in the one below it on the stack.
    let mut stack = vec![(top, std::ffi::CString::default())];
    while let Some((dir, _)) = stack.last() {
        let mut deeper = None;
        for entry in Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let st = match entry.file_type() {
                FileType::Directory | FileType::Unknown => {
                    Some(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
                }
                _ => None,
            };
            match st {
                Some(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    if st.st_mode & owner_all != owner_all
                        && st.st_uid == rustix::process::geteuid().as_raw()
                    {
                        // By an `O_PATH` descriptor of the directory itself (opened without
                        // following a link) through `/proc/self/fd`: `fchmodat` with
                        // `AT_SYMLINK_NOFOLLOW` is not supported everywhere.
                        let at = openat(
                            dir,
                            name,
                            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )?;
                        chmod(
                            format!("/proc/self/fd/{}", at.as_raw_fd()),
                            Mode::from_raw_mode(st.st_mode | owner_all),
                        )?;
                    }
                    deeper = Some(name.to_owned());
                    break;
                }
                _ => gone_ok(unlinkat(dir, name, AtFlags::empty()))?,
            }
        }
        match deeper {
            Some(name) => {
                if stack.len() >= WALK_DEPTH {
                    return Err(std::io::Error::other("deeper than the walk goes"));
                }
                let sub = openat(dir, &name, flags, Mode::empty())?;
                if mount_of(&sub)?.0 != mount {
                    return Err(std::io::Error::other(ANOTHER_MOUNT));
                }
                stack.push((sub, name));
            }
            None => {
                let Some((_, name)) = stack.pop() else { break };
                match stack.last() {
                    Some((parent, _)) => gone_ok(unlinkat(parent, &name, AtFlags::REMOVEDIR))?,
                    None => match std::fs::remove_dir(root) {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        r => r?,
                    },
                }
            }
        }
    }
    Ok(())
}

/// A sandbox's private temp dir, removed by [`remove_tree`] when dropped (`tempfile`'s own
/// removal is `std::fs::remove_dir_all`, see there).
#[derive(Debug)]
pub(super) struct PrivateTemp(std::path::PathBuf);

impl PrivateTemp {
    /// Takes over `dir`'s removal.
    pub(super) fn new(dir: tempfile::TempDir) -> Self {
        Self(dir.keep())
    }
    /// Its path.
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateTemp {
    fn drop(&mut self) {
        if !remove_tree(&self.0) {
            tracing::debug!(dir = %self.0.display(), "the sandbox's temp dir could not be removed");
        }
    }
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

    /// Run as a child of the tests below (`KEEL_TEST_REMOVE_TREE` set): removes that tree, exits
    /// 0 if it is gone, 1 if not.
    #[test]
    fn remove_tree_in_a_child() {
        if let Some(path) = std::env::var_os("KEEL_TEST_REMOVE_TREE") {
            if let Err(e) = remove_walking(Path::new(&path)) {
                eprintln!("the walk stopped: {e}");
            }
            std::process::exit(if remove_tree(Path::new(&path)) { 0 } else { 1 });
        }
    }

    /// This test executable running only [`remove_tree_in_a_child`] on `path`, as `uid`/`gid`
    /// when given, under `wrap` (a program and its arguments, e.g. `unshare -m sh -c …`) when
    /// given (the executable and test name are then `$0 $1 $2…`).
    fn remove_in_child(path: &Path, uid: Option<u32>, wrap: &[&str]) -> std::process::Output {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe().unwrap();
        let test = [
            "sandbox::temps::tests::remove_tree_in_a_child",
            "--exact",
            "--nocapture",
        ];
        let mut cmd = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = std::process::Command::new(program);
                c.args(args).arg(&exe).args(test);
                c
            }
            None => {
                let mut c = std::process::Command::new(&exe);
                c.args(test);
                c
            }
        };
        cmd.env("KEEL_TEST_REMOVE_TREE", path);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        cmd.output().unwrap()
    }

    /// A non-root owner's temp dir a command stripped of permissions (`chmod 500 $TMPDIR`, a
    /// `000` and a `555` directory inside) is removed all the same: the walk gives its owner
    /// back read, write and search (found by an attack pass: such a dir stayed, and failed
    /// every later sweep). Root only (it runs the removal as uid 65534).
    #[test]
    fn a_temp_dir_a_command_stripped_of_permissions_is_removed() {
        use std::os::unix::fs::PermissionsExt as _;
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root to run the removal as another user");
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let top = parent.path().join("t");
        for dir in ["t/a/x", "t/b"] {
            std::fs::create_dir_all(parent.path().join(dir)).unwrap();
        }
        std::fs::write(top.join("a/x/f"), "x").unwrap();
        std::fs::write(top.join("f"), "x").unwrap();
        for p in [&top, &top.join("a"), &top.join("a/x"), &top.join("b")] {
            rustix::fs::chown(
                p,
                Some(rustix::process::Uid::from_raw(65534)),
                Some(rustix::process::Gid::from_raw(65534)),
            )
            .unwrap();
        }
        for (p, mode) in [("a/x", 0o000), ("a", 0o555), ("b", 0o000), ("", 0o500)] {
            std::fs::set_permissions(top.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let out = remove_in_child(&top, Some(65534), &[]);
        assert!(out.status.success(), "{out:?}");
        assert!(std::fs::symlink_metadata(&top).is_err(), "removed");
    }

    /// A bind mount inside the tree (of the same file system: the device is the same) is not
    /// entered, and `rm` is not run over it: the files under the mount stay (found by an attack
    /// pass with root in keel's mount namespace; a confined command cannot mount). Root only,
    /// in a mount namespace of its own (`unshare -m`).
    #[test]
    fn a_bind_mount_in_the_tree_is_not_entered() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root to bind-mount");
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let victim = parent.path().join("victim");
        std::fs::create_dir_all(victim.join("sub")).unwrap();
        std::fs::write(victim.join("sub/keep"), "x").unwrap();
        let top = parent.path().join("t");
        std::fs::create_dir_all(top.join("m")).unwrap();
        std::fs::write(top.join("f"), "x").unwrap();
        let script = format!(
            "mount --make-rprivate / && mount --bind '{}' '{}/m' && exec \"$0\" \"$@\"",
            victim.display(),
            top.display()
        );
        let out = remove_in_child(&top, None, &["unshare", "-m", "sh", "-c", &script]);
        assert_eq!(out.status.code(), Some(1), "not removed: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(ANOTHER_MOUNT), "stopped at the mount: {said}");
        assert!(
            victim.join("sub/keep").exists(),
            "the bind mount's files stay"
        );
    }

    /// Nests `levels` directories `a` under `top` (by descriptor: past `PATH_MAX`).
    fn nest(top: &Path, levels: usize) {
        use rustix::fs::{Mode, OFlags, mkdirat, openat};
        let open = |at: rustix::fd::BorrowedFd<'_>, name: &Path| {
            openat(at, name, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()
        };
        let mut dir = open(rustix::fs::CWD, top);
        for _ in 0..levels {
            mkdirat(&dir, "a", Mode::RWXU).unwrap();
            dir = open(rustix::fd::AsFd::as_fd(&dir), Path::new("a"));
        }
    }

    #[test]
    fn a_dead_processs_dir_nested_deeper_than_a_threads_stack_is_removed() {
        let (parent, ns, dead) = setup();
        let top = parent
            .path()
            .join(format!("keel-sandbox-{ns}-{dead}-deep00"));
        std::fs::create_dir(&top).unwrap();
        // 60,000 levels: std's recursive removal overflowed a 2 MiB stack at ~36,000.
        nest(&top, 60_000);
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

    /// A sandbox's own temp dir, dropped on a thread of 2 MiB: a tree of 60,000 levels a command
    /// left there is removed (tempfile's removal aborted the process), and a symbolic link in it
    /// is removed, not followed: the file and directory it names stay. A shallow tree is removed
    /// by the walk alone.
    #[test]
    fn a_sandboxs_temp_dir_is_removed_whatever_a_command_left_in_it() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let sandbox = crate::sandbox::Sandbox::new(crate::sandbox::SandboxMode::Off).unwrap();
        let temp = sandbox.temp_dir().to_owned();
        std::os::unix::fs::symlink(outside.path(), temp.join("dir-link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("keep"), temp.join("file-link")).unwrap();
        std::fs::create_dir_all(temp.join("x/y/z")).unwrap();
        std::fs::write(temp.join("x/y/z/f"), "x").unwrap();
        assert!(remove_walking(&temp.join("x")).is_ok());
        assert!(!temp.join("x").exists());
        std::fs::create_dir(temp.join("deep")).unwrap();
        nest(&temp.join("deep"), 60_000);
        std::thread::spawn(move || drop(sandbox)).join().unwrap();
        assert!(std::fs::symlink_metadata(&temp).is_err(), "removed");
        assert!(outside.path().join("keep").exists(), "not followed");
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
