//! Descriptors a tool process must not inherit.
//!
//! keel holds descriptors a command must never get: its store's database files, the server's
//! listening and client sockets, pipes of other calls. Rust opens its own descriptors
//! close-on-exec, but a host may hold others that are not (inherited from whoever started it, or
//! opened by a C library), and `exec` passes every one of those on. So right before keel starts a
//! process for a tool — the sandbox launcher, and the command itself with the sandbox `off` —
//! it marks every descriptor of its own from 3 up close-on-exec ([`inherit_only_stdio`]), and
//! the launcher does it again first thing, and its second stage closes every one (for hosts that
//! start it some other way): a command gets its standard input, output and error, and nothing
//! else. Marking in keel rather than in the child between `fork` and `exec` (a `pre_exec` hook)
//! lets the standard library start the child with `posix_spawn` (`clone(CLONE_VM |
//! CLONE_VFORK)`) instead of copying keel's address space with `fork`: ~0.3 ms a call
//! (`docs/BENCHMARKS.md`). What is left open to a race is a descriptor another thread creates
//! without close-on-exec between the marking and the child's `exec`; nothing in keel does (the
//! standard library, tokio, SQLite, sqlx and the HTTP stack all open theirs close-on-exec), and
//! for the sandbox's own processes the launcher's marking and stage 2's closing remain.
//!
//! This is the one module of keel-tools with `unsafe` code: marking a descriptor by number has
//! no safe API; nor has the launcher's [`fork_single_threaded`] and
//! [`fork_into_new_pid_namespace`], the launcher's [`die_of`] and
//! [`exit_now`], or [`mount_setattr_recursive`].
#![allow(unsafe_code)]

/// Marks every descriptor from 3 up close-on-exec: `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`,
/// or, on kernels before 5.11, `fcntl(F_SETFD)` on each descriptor below the `RLIMIT_NOFILE`
/// soft limit (at most 2^20). Makes only async-signal-safe system calls and allocates nothing,
/// so it may run between `fork` and `exec`.
///
/// # Errors
/// The `close_range` error when it fails for another reason than being unknown to the kernel.
pub(crate) fn close_others_on_exec() -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on open descriptors; it
    // closes nothing, so no descriptor owned elsewhere in this process is invalidated.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(err);
    }
    let max = descriptor_limit();
    for fd in 3..i32::try_from(max).unwrap_or(1 << 20) {
        // SAFETY: F_GETFD/F_SETFD read and set the close-on-exec flag of a descriptor number;
        // on a number that is not open they fail with EBADF and change nothing.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Marks every descriptor of this process from 3 up close-on-exec (see
/// [`close_others_on_exec`]), right before a tool's process is spawned, so that it inherits
/// only its standard input, output and error (see the module docs).
///
/// # Errors
/// The `close_range` error (then nothing may be spawned).
pub(crate) fn inherit_only_stdio() -> std::io::Result<()> {
    close_others_on_exec()
}

/// Closes every descriptor from 3 up except `keep`: `close_range` on each side of it, or, on
/// kernels before 5.9, `close` on each below the `RLIMIT_NOFILE` soft limit (at most 2^20). For
/// the sandbox's stage 2 right after its fork, which never executes (so close-on-exec marks do
/// not close anything a host leaked to the launcher) and owns no descriptor but `keep` and its
/// standard streams: the caller must have dropped every other descriptor it owns first.
///
/// # Errors
/// The `close_range` error when it fails for another reason than being unknown to the kernel.
pub(crate) fn close_from_3_except(keep: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let keep = u32::try_from(keep.as_raw_fd()).unwrap_or(0);
    let mut ranges = vec![(keep.saturating_add(1).max(3), u32::MAX)];
    if keep > 3 {
        ranges.push((3, keep - 1));
    }
    for (first, last) in ranges {
        // SAFETY: the caller owns no descriptor in these ranges (see above); closing them
        // invalidates nothing this process still uses.
        let done = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if done == 0 {
            continue;
        }
        let err = std::io::Error::last_os_error();
        if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
            return Err(err);
        }
        let max = u32::try_from(descriptor_limit()).unwrap_or(1 << 20);
        for fd in first..=last.min(max) {
            // SAFETY: as above; a number that is not open fails with EBADF.
            unsafe {
                libc::close(i32::try_from(fd).unwrap_or(i32::MAX));
            }
        }
    }
    Ok(())
}

/// The `RLIMIT_NOFILE` soft limit, at most 2^20.
fn descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0 {
        limit.rlim_cur.min(1 << 20)
    } else {
        1 << 20
    }
}

/// Forks the calling process, which must be single-threaded (the sandbox launcher's first
/// stage, which has entered a user namespace: the kernel refuses that to a process with more
/// than one thread): `Ok(None)` in the child, `Ok(Some(pid))` in the parent.
///
/// # Errors
/// `fork`'s (`EAGAIN`, `ENOMEM`).
pub(crate) fn fork_single_threaded() -> std::io::Result<Option<rustix::process::Pid>> {
    // SAFETY: with one thread there is no lock another thread could hold at the fork, so the
    // child may go on as the parent would (allocate, run Rust code) without `exec`ing.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(rustix::process::Pid::from_raw(pid)),
    }
}

/// Forks the calling process, which must be single-threaded (the sandbox's session holder),
/// into a new PID namespace whose first process (PID 1) the child is: `clone3(2)` (Linux 5.3)
/// with `CLONE_NEWPID | CLONE_PIDFD`, `SIGCHLD` as the exit signal and no new stack, so the
/// child goes on from this call like a child of `fork`. `Ok(None)` in the child; in the parent
/// `Ok(Some((pid, pidfd)))`, the pidfd readable once the child has ended.
///
/// Unlike `fork`, libc runs no `atfork` handlers and does not update its copy of the thread's
/// id in the child; with one thread there is no lock to reset, and nothing the child runs
/// (allocation, system calls, `posix_spawn`, `_exit`) reads that id (glibc's `raise` asks the
/// kernel for it since 2.34).
///
/// # Errors
/// `clone3`'s: `ENOSYS` before Linux 5.3 (or under a seccomp filter that refuses it; the
/// caller then forks the old way), `EPERM`/`EINVAL` when no PID namespace may be made,
/// `EAGAIN`, `ENOMEM`.
pub(crate) fn fork_into_new_pid_namespace()
-> std::io::Result<Option<(rustix::process::Pid, std::os::fd::OwnedFd)>> {
    use std::os::fd::FromRawFd;
    /// `struct clone_args` of `linux/sched.h`, its first version (64 bytes).
    #[repr(C)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
    }
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: (libc::CLONE_NEWPID | libc::CLONE_PIDFD) as u64,
        pidfd: (&raw mut pidfd) as u64,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
    };
    // SAFETY: the arguments are a `clone_args` on this stack frame and its size; with no new
    // stack and no shared memory the child is a copy of this single-threaded process, as after
    // `fork` (see above), and the kernel writes the pidfd into `pidfd` in the parent only.
    let done = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &raw const args,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match done {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(None),
        pid => {
            let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
                .ok_or_else(|| std::io::Error::other("clone3 returned no process id"))?;
            // SAFETY: the kernel opened this descriptor for the parent (`CLONE_PIDFD`); nothing
            // else owns it.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
            Ok(Some((pid, fd)))
        }
    }
}

/// Ends the process by `signal` with its default action (a launcher passing on how the
/// command ended): the disposition is reset to the default first, since Rust's runtime handles
/// `SIGSEGV` and `SIGBUS` itself and ignores `SIGPIPE`, and a raise of those ended the launcher
/// another way (`exit 139`) or not at all. Returns when the default action does not end the
/// process (`SIGCHLD`, `SIGCONT`, …).
pub(crate) fn die_of(signal: nix::sys::signal::Signal) {
    use nix::sys::signal::{SigHandler, raise};
    // SAFETY: installs the default disposition, no handler code; the process is the
    // single-threaded launcher about to end.
    let _ = unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) };
    let _ = raise(signal);
}

/// `mount_setattr(2)` (Linux 5.12) with `AT_RECURSIVE`: sets the mount attributes `set`
/// (`MOUNT_ATTR_RDONLY` 0x1, `MOUNT_ATTR_NOSUID` 0x2, `MOUNT_ATTR_NODEV` 0x4, `MOUNT_ATTR_NOEXEC`
/// 0x8) on the mount at `path` and every mount beneath it, in one call: all or none.
///
/// # Errors
/// `ENOSYS` on older kernels; the call's other errors (`EPERM`, `EINVAL`, …).
pub(crate) fn mount_setattr_recursive(path: &std::path::Path, set: u64) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is a NUL-terminated string and the struct, of the size passed, lives on
    // this stack frame; the kernel only reads both.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_RECURSIVE,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `_exit(2)`: ends the process with `code` without running its exit handlers (see
/// `launch::exit_now`).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` never returns and reads no memory of the process; skipping the exit
    // handlers and destructors is its purpose, and nothing the launcher wrote is buffered.
    unsafe { libc::_exit(code) }
}
