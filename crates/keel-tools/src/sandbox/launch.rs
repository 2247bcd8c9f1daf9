//! The sandbox launcher: the process side of [`super::Sandbox::spawn`] (see the module docs of
//! [`super`] for what it builds).
//!
//! `PROGRAM __sandbox 1` is **stage 1**, started by the host (the sandbox's session holder,
//! `PROGRAM __sandbox session`, see [`super::holder`], instead clones one process a call
//! straight into the call's PID namespace, which does stage 1's part and stage 2's:
//! [`session_call`]) with a socket as its standard input
//! (the host's end is the *lifeline*) and the command's output pipes as standard output and
//! error. The host writes the [`LaunchSpec`] (what to hide, where the workspace is, the command
//! and its arguments) as one JSON line on that socket: it is never in the launcher's arguments
//! or environment, where the command could read it (`/proc/1/cmdline` is the launcher's). Stage
//! 1 enters a new user namespace (mapping its own uid and gid), unshares the mount, PID, IPC,
//! UTS, cgroup (and, unless the network is shared, network) namespaces and forks **stage 2**,
//! the first process of the new PID namespace, whose standard input is a socket to stage 1.
//! Stage 1 is single-threaded (the kernel refuses a user namespace to any other process), so
//! stage 2 goes on from the fork with the spec stage 1 read and every capability of the new
//! user namespace: no second `execve` of the launcher (one was ~3 ms of every sandboxed call).
//! Stage 2 builds the new root (`root.rs`; through the session's holder, stage 1 enters, checks
//! and copies the session's root instead — building it first when the spec says so — and stage
//! 2 mounts only what every call gets new), drops every privilege, installs Landlock and
//! seccomp, spawns the command, reaps every process of the namespace as its PID 1 and exits
//! with the command's status when the command ends, which ends everything else in the
//! namespace. Stage 1 marks every descriptor from 3 up close-on-exec first and stage 2 closes
//! every one but its socket to stage 1 (`fds.rs`): nothing the host holds reaches the command
//! or stays open in its PID 1.
//!
//! Messages, one line each, go from stage 2 to stage 1 and on to the host: `ready landlock=…`
//! once the command runs, or `error LAYER: DETAIL` when a required layer cannot be set up (then
//! nothing runs); then stage 2 tells stage 1 `exit N` or `signal N` when the command ends and
//! stage 1 ends the same way. Stage 1 kills stage 2 when the lifeline closes (keel exited or
//! dropped the call); stage 2 dies with stage 1 (`PR_SET_PDEATHSIG`), and ends everything when
//! its socket to stage 1 closes.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, Signal, WaitOptions};

use super::root::Layout;
use super::stage2::{release_output, stage2};
use super::{LAUNCHER_ARG, LaunchSpec, RootUse};

/// Exit code of a launcher that could not set the sandbox up (nothing ran).
pub(super) const SETUP_FAILED: i32 = 125;

/// Longest spec line read from the previous stage, bytes.
const MAX_SPEC_BYTES: usize = 16 * 1024 * 1024;

/// A layer that could not be set up: `layer` names it for the person reading the error.
#[derive(Debug)]
pub(super) struct LayerError {
    pub(super) layer: &'static str,
    pub(super) detail: String,
}

pub(super) fn fail<E: std::fmt::Display>(layer: &'static str) -> impl FnOnce(E) -> LayerError {
    move |e| LayerError {
        layer,
        detail: e.to_string(),
    }
}

pub(super) type Setup<T = ()> = Result<T, LayerError>;

/// Ends this launcher process at once with `code` (`_exit(2)`): stage 1 and stage 2, forked from
/// the session's holder or from each other, run none of the exit handlers (libc's `atexit`
/// list, the dynamic loader's destructors, stdio's flush), which only touched — and so copied
/// on write — pages the process shares with the one it was forked from (the profile of 100
/// calls put ~10 % of the launchers' page faults there). Nothing a launcher writes is
/// buffered: its answers go by `send` on sockets and its errors by `eprintln!`.
pub(super) fn exit_now(code: i32) -> ! {
    super::fds::exit_now(code)
}

/// The launcher's entry: `args` are those after `__sandbox` (the stage: `1`). Never returns.
pub(super) fn main(args: Vec<OsString>) -> ! {
    // Before anything else: nothing the host left open reaches stage 2 or the command.
    let cloexec = super::fds::close_others_on_exec();
    match args.as_slice() {
        [stage, build] if stage == super::holder::SESSION_STAGE => {
            super::holder::hold_session(build)
        }
        [stage] if stage == "1" => {}
        _ => {
            eprintln!(
                "keel: `{LAUNCHER_ARG}` is the sandbox launcher, started by keel itself; it is not a command"
            );
            exit_now(2);
        }
    }
    let mut host = host_channel();
    if let Err(e) = cloexec {
        report_and_exit(&mut host, &fail("closing inherited descriptors")(e));
    }
    run_call(host, Namespaces::New)
}

/// The channel to keel: standard input (a socket).
pub(super) fn host_channel() -> UnixStream {
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("keel sandbox: no channel to keel on standard input: {e}");
            exit_now(SETUP_FAILED);
        }
    }
}

/// Stage 1 of one call: reads the spec from `host` (the lifeline), takes the session's
/// namespaces when the spec says they follow, and goes on as [`stage1`].
pub(super) fn run_call(mut host: UnixStream, namespaces: Namespaces) -> ! {
    let spec = match read_spec(&mut host) {
        Ok(spec) => spec,
        Err(e) => report_and_exit(&mut host, &e),
    };
    let namespaces = match (spec.shared_network, namespaces) {
        (true, Namespaces::New) => match receive_namespaces(&host) {
            Ok(ns) => Namespaces::Shared(ns),
            Err(e) => report_and_exit(&mut host, &e),
        },
        (true, Namespaces::Session) => report_and_exit(
            &mut host,
            &fail("network namespace")("a session's call was sent namespaces to enter"),
        ),
        (false, namespaces) => namespaces,
        (true, shared @ Namespaces::Shared(_)) => shared,
    };
    let root = match (spec.root, &namespaces) {
        (RootUse::Fresh, _) => SessionRoot::None,
        (RootUse::Build, Namespaces::Session) => SessionRoot::Build,
        (RootUse::Enter, Namespaces::Session) => match receive_root(&host) {
            Ok(ns) => SessionRoot::Enter(ns),
            Err(e) => report_and_exit(&mut host, &e),
        },
        (RootUse::Build | RootUse::Enter, _) => report_and_exit(
            &mut host,
            &fail("mount namespace")("a session root outside the session's holder"),
        ),
    };
    stage1(host, &spec, namespaces, root)
}

/// A call of the session's holder in the one process the holder cloned for it straight into a
/// new PID namespace (its PID 1, see [`super::holder`]): stage 1's part — the spec, the
/// session's root entered (or built, or none), the call's mount, IPC, UTS and cgroup namespaces
/// — then [`stage2`], with the lifeline itself as the channel to the host (no stage 1 relays
/// its lines, none waits to kill it: stage 2 ends everything when the lifeline closes). One
/// `fork` and one process exit a call instead of two.
pub(super) fn session_call(mut host: UnixStream) -> ! {
    // Die with the holder from the start (stage 2 says so again).
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        report_and_exit(&mut host, &fail("parent-death signal")(e));
    }
    let spec = match read_spec(&mut host) {
        Ok(spec) => spec,
        Err(e) => report_and_exit(&mut host, &e),
    };
    if spec.shared_network {
        report_and_exit(
            &mut host,
            &fail("network namespace")("a session's call was sent namespaces to enter"),
        );
    }
    match spec.root {
        RootUse::Fresh => {}
        RootUse::Build => {
            if let Err(e) = build_session_root(&host, &spec) {
                report_and_exit(&mut host, &e);
            }
        }
        RootUse::Enter => match receive_root(&host) {
            Ok(ns) => enter_session_root(&mut host, &spec, &ns),
            Err(e) => report_and_exit(&mut host, &e),
        },
    }
    if let Err(e) = unshare_call_namespaces(false, false) {
        report_and_exit(&mut host, &e);
    }
    // The host may have given up on the call already: then nothing starts.
    if lifeline_closed(&host) {
        exit_now(137);
    }
    stage2(host, &spec)
}

/// Where stage 1 takes the call's root from (see `root.rs`, **Session roots**).
#[derive(Debug)]
enum SessionRoot {
    /// Stage 2 builds one for the call.
    None,
    /// Stage 1 builds the session's, sends its mount namespace to the host, and copies it.
    Build,
    /// Stage 1 enters the session's (sent by the host), checks it and copies it.
    Enter(std::os::fd::OwnedFd),
}

/// The line stage 1 answers when the session root it was sent is stale ([`super::root::is_current`]):
/// nothing ran, and the host builds the call's root another way.
pub(super) const STALE_ROOT: &str = "stale";

/// Receives the session root's mount namespace, which the host sends after the spec line as
/// one byte with `SCM_RIGHTS`.
fn receive_root(stream: &UnixStream) -> Setup<std::os::fd::OwnedFd> {
    let layer = "mount namespace (receiving the session's root)";
    match super::holder::receive_fds::<1>(stream) {
        Err(e) => Err(fail(layer)(e)),
        Ok(None) => Err(fail(layer)("the channel closed before it was sent")),
        Ok(Some(fds)) => fds
            .into_iter()
            .next()
            .ok_or_else(|| fail(layer)("expected one descriptor")),
    }
}

/// Stage 1 with [`SessionRoot::Build`]: a new mount namespace holding the session's root
/// ([`Layout::Session`]), sent to the host (one byte `r` with `SCM_RIGHTS`) once it is built.
fn build_session_root(host: &UnixStream, spec: &LaunchSpec) -> Setup {
    let layer = "mount namespace (the session's root)";
    if !super::root::reports_mount_roots() {
        return Err(fail(layer)(
            "this kernel does not report mount points (statx, Linux 5.8)",
        ));
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(fail("mount namespace"))?;
    let ns = File::open("/proc/self/ns/mnt").map_err(fail(layer))?;
    super::root::build_root(spec, Layout::Session)?;
    super::holder::send_fds(host, b'r', &[ns.as_fd()]).map_err(fail(layer))
}

/// Stage 1 with [`SessionRoot::Enter`]: into the session's root, if it is still current.
fn enter_session_root(host: &mut UnixStream, spec: &LaunchSpec, ns: &std::os::fd::OwnedFd) {
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    let view = super::root::host_view(spec);
    if let Err(e) = move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Mount)) {
        report_and_exit(
            host,
            &fail("mount namespace (entering the session's root)")(e),
        );
    }
    if !super::root::is_current(&view) {
        send(host, STALE_ROOT);
        exit_now(SETUP_FAILED);
    }
}

/// The user and network namespaces stage 1 starts from.
#[derive(Debug)]
pub(super) enum Namespaces {
    /// A new user namespace, and a new network namespace unless the spec allows the network.
    New,
    /// The session's, entered with `setns` (sent by the host after the spec).
    Shared(SharedNetwork),
    /// The session's, where this stage 1 already is: forked by the session's holder.
    Session,
}

/// The session's network namespace, made once by the session holder ([`super::holder`]) and
/// entered by each command's stage 1: the user namespace that owns it and the namespace itself.
#[derive(Debug)]
pub(super) struct SharedNetwork {
    pub(super) user: std::os::fd::OwnedFd,
    pub(super) net: std::os::fd::OwnedFd,
}

/// Receives the shared network namespace's two descriptors, which the host sends after the
/// spec line as one byte with `SCM_RIGHTS` (user namespace first).
fn receive_namespaces(stream: &UnixStream) -> Setup<SharedNetwork> {
    let layer = "network namespace (receiving the session's)";
    match super::holder::receive_fds::<2>(stream) {
        Err(e) => Err(fail(layer)(e)),
        Ok(None) => Err(fail(layer)("the channel closed before they were sent")),
        Ok(Some(fds)) => {
            let mut fds = fds.into_iter();
            match (fds.next(), fds.next(), fds.next()) {
                (Some(user), Some(net), None) => Ok(SharedNetwork { user, net }),
                _ => Err(fail(layer)("expected two descriptors")),
            }
        }
    }
}

/// Reads the spec line keel writes first and parses it. Nothing
/// after the line's newline is consumed: each chunk is peeked (`MSG_PEEK`) and only the bytes up
/// to the newline are then read (two system calls per chunk; a byte at a time cost one per
/// byte, ~360 for a typical spec).
fn read_spec(stream: &mut UnixStream) -> Setup<LaunchSpec> {
    let layer = "launcher (reading the sandbox spec)";
    let mut line = Vec::new();
    // A spec is a few KiB (most of it the environment); longer ones take more rounds.
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let peeked = match rustix::net::recv(&*stream, &mut chunk[..], rustix::net::RecvFlags::PEEK)
        {
            Ok((0, _)) => return Err(fail(layer)("the channel closed before the spec was sent")),
            Ok((n, _)) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(fail(layer)(e)),
        };
        let end = chunk[..peeked].iter().position(|b| *b == b'\n');
        let take = end.map_or(peeked, |i| i + 1);
        let mut got = 0;
        while got < take {
            match stream.read(&mut chunk[got..take]) {
                Ok(0) => return Err(fail(layer)("the channel closed before the spec was sent")),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(fail(layer)(e)),
            }
        }
        line.extend_from_slice(&chunk[..end.unwrap_or(take)]);
        if line.len() > MAX_SPEC_BYTES {
            return Err(fail(layer)("the spec is too long"));
        }
        if end.is_some() {
            break;
        }
    }
    let spec = serde_json::from_slice::<LaunchSpec>(&line).map_err(fail(layer))?;
    if spec.format != super::LAUNCH_SPEC_FORMAT {
        return Err(fail(layer)(format!(
            "the spec's format is {}, this launcher reads {}: install keel and its launcher \
             from the same build",
            spec.format,
            super::LAUNCH_SPEC_FORMAT
        )));
    }
    if spec.build != super::LAUNCHER_BUILD {
        return Err(fail(layer)(format!(
            "the host is keel-tools build {}, this launcher is {}: install keel and its \
             launcher from the same build",
            spec.build,
            super::LAUNCHER_BUILD
        )));
    }
    if spec.command.is_empty() {
        return Err(fail(layer)("no command given"));
    }
    Ok(spec)
}

pub(super) fn send(stream: &mut UnixStream, line: &str) {
    // The reader may be gone (keel exited): nothing to do about it.
    let _ = stream.write_all(format!("{line}\n").as_bytes());
}

pub(super) fn report_and_exit(stream: &mut UnixStream, e: &LayerError) -> ! {
    send(
        stream,
        &format!("error {}: {}", e.layer, e.detail.replace('\n', " ")),
    );
    exit_now(SETUP_FAILED);
}

// ---------------------------------------------------------------------------------------------
// Stage 1

fn stage1(mut host: UnixStream, spec: &LaunchSpec, namespaces: Namespaces, root: SessionRoot) -> ! {
    match root {
        SessionRoot::None => {}
        SessionRoot::Build => {
            if let Err(e) = build_session_root(&host, spec) {
                report_and_exit(&mut host, &e);
            }
        }
        SessionRoot::Enter(ns) => enter_session_root(&mut host, spec, &ns),
    }
    if let Err(e) = enter_namespaces(spec, namespaces) {
        report_and_exit(&mut host, &e);
    }
    // The host may have given up on the call already (a launcher forked late by a holder that
    // was stopped): then nothing starts.
    if lifeline_closed(&host) {
        exit_now(137);
    }
    let (mut from_stage2, to_stage1) = match UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => report_and_exit(&mut host, &fail("launcher (socket)")(e)),
    };
    let stage2 = match super::fds::fork_single_threaded() {
        Ok(Some(pid)) => pid,
        Ok(None) => {
            // Stage 2 keeps nothing of stage 1's but its output and the socket to it: its
            // standard input becomes that socket (it was keel's lifeline, which only stage 1
            // holds from here on), and every other descriptor (anything a host leaked to the
            // launcher) is closed, not only marked close-on-exec: stage 2 never executes.
            drop(host);
            drop(from_stage2);
            let mut up = to_stage1;
            let kept = rustix::stdio::dup2_stdin(&up)
                .map_err(std::io::Error::from)
                .and_then(|()| super::fds::close_from_3_except(up.as_fd()));
            if let Err(e) = kept {
                report_and_exit(&mut up, &fail("closing inherited descriptors")(e));
            }
            stage2(up, spec)
        }
        Err(e) => report_and_exit(
            &mut host,
            &fail("PID namespace (starting its first process)")(e),
        ),
    };
    drop(to_stage1);
    // Stage 1 writes nothing more to the command's output: its copies go, so the output's end
    // comes when the command's processes are gone, not when the launcher exits.
    release_output();
    let kill_stage2 = || {
        let _ = rustix::process::kill_process(stage2, Signal::KILL);
        let _ = wait_for(stage2);
    };
    let mut pending = Vec::new();
    let mut last: Option<String> = None;
    let mut stage2_gone = false;
    let mut buf = [0u8; 4096];
    while !stage2_gone {
        let mut fds = [
            PollFd::new(&host, PollFlags::IN),
            PollFd::new(&from_stage2, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        let host_events = fds[0].revents();
        let stage2_events = fds[1].revents();
        if !host_events.is_empty() {
            // keel never writes: anything readable is the end of the lifeline.
            let n = (&host).read(&mut buf).unwrap_or(0);
            if n == 0 || host_events.intersects(PollFlags::HUP | PollFlags::ERR) {
                kill_stage2();
                exit_now(137);
            }
        }
        if !stage2_events.is_empty() {
            let n = from_stage2.read(&mut buf).unwrap_or(0);
            if n == 0 {
                stage2_gone = true;
            }
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&pending[..end]).into_owned();
                pending.drain(..=end);
                // `exit N` / `signal N` go on at once: the host takes the command's end from
                // here, without waiting for stage 2's namespaces to be torn down (an RCU grace
                // period for the mount namespace), which stage 1 still waits for below.
                if ["ready", "error ", "exit ", "signal "]
                    .iter()
                    .any(|p| line.starts_with(p))
                {
                    send(&mut host, &line);
                }
                last = Some(line);
            }
        }
    }
    end_like(last.as_deref(), wait_for(stage2))
}

/// Whether the host's end of the lifeline is closed (nothing read: keel never writes after
/// the spec and the namespaces).
fn lifeline_closed(host: &UnixStream) -> bool {
    let mut fds = [PollFd::new(host, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok()
        && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
}

/// Waits for `pid` (a child) to end: its status, `None` when it cannot be waited for.
fn wait_for(pid: Pid) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    loop {
        match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                return Some(std::process::ExitStatus::from_raw(status.as_raw()));
            }
            Err(rustix::io::Errno::INTR) => {}
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Ends stage 1 the way the command ended (`exit N` / `signal N` from stage 2), else the way
/// stage 2 did.
fn end_like(last: Option<&str>, status: Option<std::process::ExitStatus>) -> ! {
    use std::os::unix::process::ExitStatusExt;
    let parse = |prefix: &str| {
        last.and_then(|l| l.strip_prefix(prefix))
            .and_then(|n| n.trim().parse::<i32>().ok())
    };
    if let Some(code) = parse("exit ") {
        exit_now(code);
    }
    let signal = parse("signal ").or_else(|| status.and_then(|s| s.signal()));
    if let Some(signal) = signal {
        // No core file of the launcher; then die of the same signal where its default action
        // kills (Rust ignores SIGPIPE, some signals are ignored by default: exit 128+N then).
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        if let Ok(sig) = nix::sys::signal::Signal::try_from(signal) {
            super::fds::die_of(sig);
        }
        exit_now(128 + signal);
    }
    match status.and_then(|s| s.code()) {
        Some(code) => exit_now(code),
        None => exit_now(SETUP_FAILED),
    }
}

/// A new user namespace mapping this process's uid and gid to themselves (no other groups).
pub(super) fn enter_user_namespace() -> Setup {
    use nix::sched::{CloneFlags, unshare};
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    unshare(CloneFlags::CLONE_NEWUSER).map_err(fail("user namespace"))?;
    let write = |path: &str, text: String| std::fs::write(path, text);
    match write("/proc/self/setgroups", "deny".into()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("user namespace (setgroups)")(e)),
    }
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))
        .map_err(fail("user namespace (uid map)"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
        .map_err(fail("user namespace (gid map)"))?;
    Ok(())
}

/// Stage 1's namespaces: a new user namespace, the session's entered ([`Namespaces::Shared`]:
/// its user namespace, which owns its network namespace, then that network namespace), or the
/// session's already ([`Namespaces::Session`]); then new mount, PID, IPC, UTS and cgroup
/// namespaces, and a new network namespace unless the network is shared with the host or the
/// session's is used.
fn enter_namespaces(spec: &LaunchSpec, namespaces: Namespaces) -> Setup {
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    let own_network = match namespaces {
        Namespaces::Shared(ns) => {
            move_into_link_name_space(ns.user.as_fd(), Some(LinkNameSpaceType::User))
                .map_err(fail("user namespace (entering the session's)"))?;
            move_into_link_name_space(ns.net.as_fd(), Some(LinkNameSpaceType::Network))
                .map_err(fail("network namespace (entering the session's)"))?;
            false
        }
        Namespaces::Session => false,
        Namespaces::New => {
            enter_user_namespace()?;
            !spec.network
        }
    };
    unshare_call_namespaces(true, own_network)
}

/// New mount, IPC, UTS and cgroup namespaces for the calling process, a new PID namespace for
/// its children when `pid` (a process cloned into one already passes `false`), and a new
/// network namespace when `network`.
fn unshare_call_namespaces(pid: bool, network: bool) -> Setup {
    use nix::sched::{CloneFlags, unshare};
    let mut each = vec![(CloneFlags::CLONE_NEWNS, "mount namespace")];
    if pid {
        each.push((CloneFlags::CLONE_NEWPID, "PID namespace"));
    }
    each.extend([
        (CloneFlags::CLONE_NEWIPC, "IPC namespace"),
        (CloneFlags::CLONE_NEWUTS, "UTS namespace"),
        (CloneFlags::CLONE_NEWCGROUP, "cgroup namespace"),
    ]);
    if network {
        each.push((CloneFlags::CLONE_NEWNET, "network namespace"));
    }
    // All at once (one copy of the process's namespaces instead of one per flag); when that
    // fails, one by one, so that the error names the namespace the kernel refused.
    let all = each
        .iter()
        .fold(CloneFlags::empty(), |all, (flag, _)| all | *flag);
    if unshare(all).is_ok() {
        return Ok(());
    }
    for (flag, layer) in each {
        unshare(flag).map_err(fail(layer))?;
    }
    Ok(())
}
