//! The sandbox's filesystem: the new root stage 2 of the launcher builds in its mount namespace
//! (see the module docs of [`super`]): the host's `/` read-only, the workspace and the private
//! temp dir bound at their paths, empty tmpfs over the places services keep sockets, the paths
//! the host hides covered (with every ancestor of a hidden path inside the workspace pinned, so
//! a command cannot rename it away from the path the next call hides), a minimal `/dev` and a
//! fresh `/proc`.
//!
//! **Session roots.** Built for every call ([`Layout::Call`]), the root costs ~40 mount calls,
//! two `pivot_root`s and the detach of the host's old root, whose RCU grace period waits for
//! the other CPUs (0.07 ms on a quiet machine, milliseconds on a busy one). A session's holder
//! instead has one stage 1 build it once ([`Layout::Session`]: everything but `/proc`) in a
//! mount namespace keel keeps by descriptor; each later call enters that namespace, checks it
//! is still what a fresh build would give ([`is_current`]), copies it (`unshare`) and makes only
//! what must be new for every call ([`per_call`]): empty tmpfs over `/tmp`, `/run`, `/var/run`
//! and `/dev/shm` (the workspace and private temp dir moved back over them where they lie
//! beneath), a private `devpts` and a `/proc` of the call's PID namespace.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::launch::{LayerError, Setup, fail};
use super::{LaunchSpec, SandboxMode};

const STAGING: &str = "/tmp";
const NEW: &str = "/newroot";
const OLD: &str = "/oldroot";

fn at(base: &str, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    Path::new(base).join(rel)
}

fn mount_tmpfs(target: &Path, flags: MountFlags, options: &str) -> rustix::io::Result<()> {
    let options = std::ffi::CString::new(options).unwrap_or_default();
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, options.as_c_str())
}

fn mount_err(what: &str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> LayerError {
    let detail = format!("{what} {}", path.display());
    move |e| LayerError {
        layer: "mount namespace",
        detail: format!("{detail}: {e}"),
    }
}

/// What [`build_root`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// A root for one call, `/proc` included (stage 2, PID 1 of the call's PID namespace).
    Call,
    /// A session's root (stage 1, before the call's PID namespace exists): everything but
    /// `/proc`, which [`per_call`] mounts for each call.
    Session,
}

/// Builds the new root described by `spec` in the calling process's (new, private) mount
/// namespace and makes it the process's root, the host's root detached.
pub(super) fn build_root(spec: &LaunchSpec, layout: Layout) -> Setup {
    let root = Path::new("/");
    // Nothing we mount propagates back to the host.
    rustix::mount::mount_change(
        root,
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(mount_err("making private", root))?;
    // A staging tmpfs becomes the root for a while, with the host's root at /oldroot.
    let staging = Path::new(STAGING);
    mount_tmpfs(staging, MountFlags::NOSUID | MountFlags::NODEV, "mode=0755")
        .map_err(mount_err("mounting the staging tmpfs on", staging))?;
    std::env::set_current_dir(staging).map_err(fail("mount namespace (staging)"))?;
    for dir in ["newroot", "oldroot"] {
        std::fs::create_dir(dir).map_err(fail("mount namespace (staging)"))?;
    }
    rustix::process::pivot_root(".", "oldroot").map_err(mount_err("pivot_root to", staging))?;
    std::env::set_current_dir("/").map_err(fail("mount namespace (staging)"))?;

    // The host's root, read-only, every submount too.
    let new = Path::new(NEW);
    rustix::mount::mount_bind_recursive(OLD, new).map_err(mount_err("binding / on", new))?;
    remount_tree(
        new,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
    )?;

    // Empty tmpfs over the places services keep their sockets, and a fresh /tmp.
    for (dir, mode) in [("/tmp", "1777"), ("/run", "0755"), ("/var/run", "0755")] {
        let target = at(NEW, Path::new(dir));
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                mount_tmpfs(
                    &target,
                    MountFlags::NOSUID | MountFlags::NODEV,
                    &format!("mode={mode}"),
                )
                .map_err(mount_err("mounting a tmpfs on", &target))?;
            }
            _ => {}
        }
    }

    // keel's own files: those outside the workspace now (so a workspace inside a hidden
    // directory stays visible), those inside after the workspace is bound.
    let (inside, outside): (Vec<&PathBuf>, Vec<&PathBuf>) = spec
        .hide
        .iter()
        .partition(|p| p.starts_with(&spec.workspace));
    let mut covers = Vec::new();
    for path in outside {
        covers.extend(hide(path)?);
    }
    let workspace_flags = if spec.mode == SandboxMode::ReadOnly {
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV
    } else {
        MountFlags::NOSUID | MountFlags::NODEV
    };
    bind_dir(&spec.workspace, true, workspace_flags)?;
    bind_dir(&spec.temp, false, MountFlags::NOSUID | MountFlags::NODEV)?;
    let pinned: Vec<&PathBuf> = inside.iter().copied().chain(&spec.protect).collect();
    pin_ancestors(&spec.workspace, &pinned, workspace_flags)?;
    for path in inside {
        covers.extend(hide(path)?);
    }
    for path in &spec.protect {
        protect(path)?;
    }
    // The covering tmpfs stayed writable for mount points (a workspace inside a hidden
    // directory); now they are read-only.
    for cover in covers {
        remount_one(
            &cover,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        )
        .map_err(mount_err("hiding", &cover))?;
    }
    build_dev()?;
    if layout == Layout::Call {
        mount_proc(&at(NEW, Path::new("/proc")))?;
    }

    // Into the new root; the staging root and the host's old root go away.
    std::env::set_current_dir(new).map_err(fail("mount namespace (entering the new root)"))?;
    rustix::process::pivot_root(".", ".").map_err(mount_err("pivot_root to", new))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(mount_err("detaching the old root at", root))?;
    std::env::set_current_dir("/").map_err(fail("mount namespace (entering the new root)"))?;
    Ok(())
}

/// Binds the host's `path` at the same place in the new root (creating the mount point in a
/// tmpfs where needed), then remounts it (and its submounts, when `recursive`) with `flags`.
fn bind_dir(path: &Path, recursive: bool, flags: MountFlags) -> Setup {
    let source = at(OLD, path);
    let target = at(NEW, path);
    std::fs::create_dir_all(&target).map_err(|e| LayerError {
        layer: "mount namespace",
        detail: format!("creating the mount point {}: {e}", target.display()),
    })?;
    if recursive {
        rustix::mount::mount_bind_recursive(&source, &target)
    } else {
        rustix::mount::mount_bind(&source, &target)
    }
    .map_err(mount_err("binding", path))?;
    remount_tree(&target, flags)
}

/// Pins every directory between the workspace and a path hidden inside it by binding it onto
/// itself (with the workspace's `flags`): `rename(2)`, `rmdir(2)` and `unlink(2)` of a mount
/// point fail with `EBUSY`, so a command cannot move a hidden path, or a directory above it,
/// away from the path the next call hides (`mv .local .l2` with keel's data in
/// `.local/share/keel`). The hidden paths themselves are mount points once covered. Everything
/// else in those directories stays as writable as the workspace; only a rename *across* a
/// pinned directory's edge becomes a copy (`EXDEV`, which `mv` handles).
fn pin_ancestors(workspace: &Path, hidden: &[&PathBuf], flags: MountFlags) -> Setup {
    // Outermost first: a path sorts before the paths beneath it.
    for dir in pinned_dirs(workspace, hidden) {
        let target = at(NEW, &dir);
        if !std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        rustix::mount::mount_bind_recursive(&target, &target)
            .map_err(mount_err("pinning", &dir))?;
        remount_tree(&target, flags)?;
    }
    Ok(())
}

/// The directories strictly between `workspace` and each of `hidden` (those inside it), sorted
/// (outermost first).
fn pinned_dirs(workspace: &Path, hidden: &[&PathBuf]) -> std::collections::BTreeSet<PathBuf> {
    let mut dirs = std::collections::BTreeSet::new();
    for path in hidden {
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != workspace && d.starts_with(workspace)) {
            dirs.insert(d.to_path_buf());
            dir = d.parent();
        }
    }
    dirs
}

/// Covers `path` (canonical) in the new root: a directory with an empty tmpfs (returned: the
/// caller makes it read-only once every mount point is made), anything else with a read-only
/// `/dev/null`. Skipped when it is not there (already hidden).
fn hide(path: &Path) -> Setup<Option<PathBuf>> {
    let target = at(NEW, path);
    let Ok(meta) = std::fs::symlink_metadata(&target) else {
        return Ok(None);
    };
    if meta.is_dir() {
        mount_tmpfs(
            &target,
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "mode=0555",
        )
        .map_err(mount_err("hiding", path))?;
        Ok(Some(target))
    } else {
        let null = at(OLD, Path::new("/dev/null"));
        rustix::mount::mount_bind(&null, &target).map_err(mount_err("hiding", path))?;
        remount_one(
            &target,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        )
        .map_err(mount_err("hiding", path))?;
        Ok(None)
    }
}

/// Binds the file or directory at `path` (canonical, in the workspace) read-only onto itself:
/// a command can run and read what is there but not write, create, replace, rename or remove
/// anything (`EROFS`, `EBUSY`). Skipped when it is not there.
fn protect(path: &Path) -> Setup {
    let target = at(NEW, path);
    let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() => {
            rustix::mount::mount_bind_recursive(&target, &target)
                .map_err(mount_err("protecting", path))?;
            remount_tree(&target, flags)
        }
        Ok(m) if m.is_file() => {
            rustix::mount::mount_bind(&target, &target).map_err(mount_err("protecting", path))?;
            remount_one(&target, flags).map_err(mount_err("protecting", path))
        }
        _ => Ok(()),
    }
}

/// A minimal /dev: a few character devices bound from the host, the usual links, a private
/// devpts and an empty /dev/shm.
fn build_dev() -> Setup {
    let dev = at(NEW, Path::new("/dev"));
    mount_tmpfs(&dev, MountFlags::NOSUID | MountFlags::NOEXEC, "mode=0755")
        .map_err(mount_err("mounting a tmpfs on", &dev))?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let source = at(OLD, &Path::new("/dev").join(name));
        if std::fs::metadata(&source).is_err() {
            continue;
        }
        let target = dev.join(name);
        File::create(&target).map_err(|e| LayerError {
            layer: "mount namespace",
            detail: format!("creating {}: {e}", target.display()),
        })?;
        rustix::mount::mount_bind(&source, &target).map_err(mount_err("binding", &source))?;
        remount_one(&target, MountFlags::NOSUID | MountFlags::NOEXEC)
            .map_err(mount_err("remounting", &target))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link)).map_err(fail("mount namespace (/dev)"))?;
    }
    let shm = dev.join("shm");
    std::fs::create_dir(&shm).map_err(fail("mount namespace (/dev/shm)"))?;
    mount_tmpfs(&shm, MountFlags::NOSUID | MountFlags::NODEV, "mode=1777")
        .map_err(mount_err("mounting a tmpfs on", &shm))?;
    let pts = dev.join("pts");
    std::fs::create_dir(&pts).map_err(fail("mount namespace (/dev/pts)"))?;
    mount_devpts(&pts);
    let _ = std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755));
    remount_one(
        &dev,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
    )
    .map_err(mount_err("remounting", &dev))
}

/// A private pseudo-terminal instance at `pts`; optional (some kernels refuse it in a user
/// namespace).
fn mount_devpts(pts: &Path) {
    let options = std::ffi::CString::new("newinstance,ptmxmode=0666,mode=620").unwrap_or_default();
    let _ = rustix::mount::mount(
        "devpts",
        pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        options.as_c_str(),
    );
}

/// A /proc of the new PID namespace at `proc`, with the parts that change the kernel read-only
/// (uid 0 of a user namespace that maps host root may write sysctls and the sysrq trigger
/// otherwise).
fn mount_proc(proc: &Path) -> Setup {
    rustix::mount::mount(
        "proc",
        proc,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(|e| LayerError {
        layer: "PID namespace (/proc)",
        detail: format!("mounting a /proc for the sandbox: {e}"),
    })?;
    for name in ["sys", "sysrq-trigger", "irq", "bus"] {
        let path = proc.join(name);
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        rustix::mount::mount_bind(&path, &path).map_err(mount_err("binding", &path))?;
        remount_one(
            &path,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        )
        .map_err(mount_err("remounting", &path))?;
    }
    Ok(())
}

// --- session roots ---------------------------------------------------------------------------

/// What a session root must still show for one path, as a fresh build would (read by stage 1
/// in the host's mount namespace, before it enters the session's: [`host_view`]).
#[derive(Debug)]
pub(super) enum Expect {
    /// A path the host hides: covered (a mount point), or not there at all (beneath another
    /// cover, in a scratch tmpfs, or gone from the host). Never the host's file itself, which
    /// is what shows when the kernel detached the cover (the host deleted or renamed over it).
    Hidden(PathBuf),
    /// A path the build binds from the host (the workspace, the private temp dir, a protected
    /// path, a pinned directory): with the host's file now (device, inode), the root must have
    /// that very file bound there, not deleted (a bind whose mount point lies in a tmpfs of the
    /// build stays attached when the host moves the directory away and makes another); with
    /// `None` (the host has nothing there to bind), the root must have no mount there.
    Bound(PathBuf, Option<(u64, u64)>),
}

/// What [`is_current`] checks for `spec`: every path a build mounts on.
pub(super) fn host_view(spec: &LaunchSpec) -> Vec<Expect> {
    let file = |path: &Path, dir_only: bool| {
        std::fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_dir() || (!dir_only && m.is_file()))
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
    };
    let inside: Vec<&PathBuf> = spec
        .hide
        .iter()
        .filter(|p| p.starts_with(&spec.workspace))
        .chain(&spec.protect)
        .collect();
    let mut view = vec![
        Expect::Bound(spec.workspace.clone(), file(&spec.workspace, true)),
        Expect::Bound(spec.temp.clone(), file(&spec.temp, true)),
    ];
    view.extend(spec.hide.iter().cloned().map(Expect::Hidden));
    for path in &spec.protect {
        view.push(Expect::Bound(path.clone(), file(path, false)));
    }
    for dir in pinned_dirs(&spec.workspace, &inside) {
        let here = file(&dir, true);
        view.push(Expect::Bound(dir, here));
    }
    view
}

/// Whether the session root this process is in (after `setns`) is what a fresh build would
/// give for `view` ([`host_view`]). The kernel detaches a mount whose mount point the host
/// deletes or renames over (a store's `-journal` deleted and made again, a config file
/// replaced), a bind whose mount point lies in a tmpfs of the build survives the host moving
/// its directory away, and a path that appeared since the build was never covered or bound:
/// any of these and the session's root is stale, and the call is built fresh. Uses `statx`'s
/// `STATX_ATTR_MOUNT_ROOT` (Linux 5.8); where the kernel does not report it, no root is current.
pub(super) fn is_current(view: &[Expect]) -> bool {
    view.iter().all(|expect| match expect {
        Expect::Hidden(path) => match in_root(path) {
            Some(seen) => seen.is_none_or(|s| s.mount_root),
            None => false,
        },
        Expect::Bound(path, None) => match in_root(path) {
            Some(seen) => seen.is_none_or(|s| !s.mount_root),
            None => false,
        },
        Expect::Bound(path, Some(host)) => matches!(
            in_root(path),
            Some(Some(s)) if s.mount_root && s.links > 0 && s.id == *host
        ),
    })
}

/// A path in this process's root, as [`in_root`] reads it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Whether it is the root of a mount.
    mount_root: bool,
    /// Its link count (0: deleted).
    links: u32,
    /// (device, inode).
    id: (u64, u64),
}

/// `path` (not followed) in this process's root; `Some(None)` when it is missing, `None` when
/// the kernel does not report mount roots (or another error).
fn in_root(path: &Path) -> Option<Option<Seen>> {
    use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
    match rustix::fs::statx(
        rustix::fs::CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    ) {
        Ok(st) if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
            let dev = rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor);
            Some(Some(Seen {
                mount_root: st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
                links: st.stx_nlink,
                id: (dev, st.stx_ino),
            }))
        }
        Ok(_) => None,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Some(None),
        Err(_) => None,
    }
}

/// Whether this kernel says which paths are mount points ([`is_current`] needs it).
pub(super) fn reports_mount_roots() -> bool {
    in_root(Path::new("/")).is_some()
}

/// In a copy of a session root (stage 2, PID 1 of the call's PID namespace): the mounts every
/// call gets new. Empty tmpfs over `/tmp`, `/run` and `/var/run` (where they are directories,
/// as [`build_root`] decides) with the workspace and the private temp dir, where they lie
/// beneath, cloned (`open_tree`, with everything mounted in them) and moved back over the
/// empty tmpfs at their paths; an empty `/dev/shm`; a private `devpts` (optional, as in a fresh
/// build); a `/proc` of the call's PID namespace.
pub(super) fn per_call(spec: &LaunchSpec) -> Setup {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let grafts: Vec<&PathBuf> = [&spec.workspace, &spec.temp]
        .into_iter()
        .filter(|p| {
            let other = if *p == &spec.workspace {
                &spec.temp
            } else {
                &spec.workspace
            };
            // The outermost of the two: one nested in the other moves with it.
            !(p.starts_with(other) && *p != other)
        })
        .collect();
    for (dir, mode) in [("/tmp", "1777"), ("/run", "0755"), ("/var/run", "0755")] {
        let dir = Path::new(dir);
        if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let mut moved = Vec::new();
        for graft in grafts.iter().filter(|g| g.starts_with(dir)) {
            let tree = rustix::mount::open_tree(
                rustix::fs::CWD,
                graft.as_path(),
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::AT_RECURSIVE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(mount_err("cloning", graft))?;
            moved.push((graft, tree));
        }
        mount_tmpfs(
            dir,
            MountFlags::NOSUID | MountFlags::NODEV,
            &format!("mode={mode}"),
        )
        .map_err(mount_err("mounting a tmpfs on", dir))?;
        for (graft, tree) in moved {
            std::fs::create_dir_all(graft).map_err(|e| LayerError {
                layer: "mount namespace",
                detail: format!("creating the mount point {}: {e}", graft.display()),
            })?;
            rustix::mount::move_mount(
                &tree,
                "",
                rustix::fs::CWD,
                graft.as_path(),
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .map_err(mount_err("moving back", graft))?;
        }
    }
    let shm = Path::new("/dev/shm");
    mount_tmpfs(shm, MountFlags::NOSUID | MountFlags::NODEV, "mode=1777")
        .map_err(mount_err("mounting a tmpfs on", shm))?;
    mount_devpts(Path::new("/dev/pts"));
    mount_proc(Path::new("/proc"))
}

/// Remounts the bind mount at `target` with `flags` added to the flags it has (which the
/// kernel may have locked: a remount must keep them).
fn remount_one(target: &Path, flags: MountFlags) -> rustix::io::Result<()> {
    use rustix::fs::StatVfsMountFlags as St;
    let st = rustix::fs::statvfs(target)?;
    let have = st.f_flag;
    let mut keep = MountFlags::empty();
    for (s, m) in [
        (St::RDONLY, MountFlags::RDONLY),
        (St::NOSUID, MountFlags::NOSUID),
        (St::NODEV, MountFlags::NODEV),
        (St::NOEXEC, MountFlags::NOEXEC),
        (St::SYNCHRONOUS, MountFlags::SYNCHRONOUS),
        (St::MANDLOCK, MountFlags::PERMIT_MANDATORY_FILE_LOCKING),
        (St::NOATIME, MountFlags::NOATIME),
        (St::NODIRATIME, MountFlags::NODIRATIME),
        (St::RELATIME, MountFlags::RELATIME),
    ] {
        if have.contains(s) {
            keep |= m;
        }
    }
    if !have.intersects(St::NOATIME | St::RELATIME) {
        keep |= MountFlags::STRICTATIME;
    }
    rustix::mount::mount_remount(target, MountFlags::BIND | keep | flags, "")
}

/// Remounts every mount at or under `prefix` with `flags` added: in one `mount_setattr(2)`
/// call where the kernel has it (5.12) and the flags are attributes it sets, else one remount
/// per mount listed in /proc/self/mountinfo (each read costs the whole mount table, and this
/// runs for every bind of every sandboxed call). In the second way a mount this process cannot
/// reach (EACCES: the command cannot either) or that is gone or covered (ENOENT) is skipped;
/// any other failure fails the layer. The first way is all or nothing: any failure falls back
/// to the second.
fn remount_tree(prefix: &Path, flags: MountFlags) -> Setup {
    let mut attrs = 0u64;
    let mut rest = flags;
    for (flag, attr) in [
        (MountFlags::RDONLY, 0x1),
        (MountFlags::NOSUID, 0x2),
        (MountFlags::NODEV, 0x4),
        (MountFlags::NOEXEC, 0x8),
    ] {
        if flags.contains(flag) {
            attrs |= attr;
            rest.remove(flag);
        }
    }
    if rest.is_empty() && super::fds::mount_setattr_recursive(prefix, attrs).is_ok() {
        return Ok(());
    }
    let info = std::fs::read_to_string(at(OLD, Path::new("/proc/self/mountinfo")))
        .map_err(fail("mount namespace (reading mountinfo)"))?;
    for line in info.lines() {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !point.starts_with(prefix) {
            continue;
        }
        match remount_one(&point, flags) {
            Ok(()) => {}
            // The mount asked for must be remounted; a submount out of reach need not be.
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::NOENT) if point != prefix => {}
            Err(e) => {
                return Err(LayerError {
                    layer: "read-only mounts",
                    detail: format!("remounting {}: {e}", point.display()),
                });
            }
        }
    }
    Ok(())
}

/// Decodes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}
