//! The sandbox's **session holder** (`PROGRAM __sandbox session FORMAT:BUILD`): the launcher
//! process that lives as long as a [`super::Sandbox`], holds the session's user and network
//! namespaces and clones, for each of the session's confined commands, one process straight into
//! a new PID namespace, which sets the call up and is its PID 1 (`launch.rs`, `session_call`).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, WaitOptions};

use super::launch::{
    Namespaces, SETUP_FAILED, enter_user_namespace, fail, host_channel, report_and_exit, run_call,
    session_call,
};

/// The argument (after `__sandbox`) that makes the launcher a session holder
/// ([`hold_session`]); the next one is [`session_build`].
pub(super) const SESSION_STAGE: &str = "session";

/// What a session holder must be started with after [`SESSION_STAGE`]: the spec format and the
/// build it serves (a holder of another build refuses to start, as stage 1 refuses a spec).
pub(super) fn session_build() -> String {
    format!("{}:{}", super::LAUNCH_SPEC_FORMAT, super::LAUNCHER_BUILD)
}

/// `__sandbox session FORMAT:BUILD`, the **session holder**: enters a new user namespace
/// (mapping its own uid and gid) and a new network namespace in it (only a loopback interface,
/// down), says `ready` on standard output and serves the session's calls. The host opens
/// `/proc/<pid>/ns/{user,net}` meanwhile (those descriptors keep both namespaces alive,
/// whatever becomes of this process, for launchers started the usual way to enter).
///
/// Standard input is a socket from the host. Each message on it is one byte carrying three
/// descriptors (`SCM_RIGHTS`): a call's lifeline and its output and error. For each, the holder
/// clones a process straight into a new PID namespace (`clone3`, Linux 5.3; before that it
/// forks a stage 1 that makes the namespace and forks a stage 2), which takes them as its
/// standard input, output and error, closes everything else, and does what a launcher started
/// for the call would, from the namespaces it is already in: no `execve` of the launcher (its
/// loader and runtime start, ~0.9 ms a call on a VM where `cpuid` traps to the hypervisor), no
/// `setns`, no second process. A message with other than three descriptors is dropped. The
/// holder reaps what it cloned as it ends (a pidfd of each), and exits when the socket closes
/// (the host dropped the sandbox, or died). It runs nothing else and holds nothing of the
/// host's: a confined command (in PID namespaces of its own) cannot see or signal it. Never
/// returns.
pub(super) fn hold_session(build: &OsString) -> ! {
    let mut out = std::io::stdout();
    if build.to_str() != Some(session_build().as_str()) {
        let _ = writeln!(
            out,
            "error launcher: this launcher serves {}, the host {}: install keel and its \
             launcher from the same build",
            session_build(),
            build.to_string_lossy()
        );
        std::process::exit(SETUP_FAILED);
    }
    let made = enter_user_namespace().and_then(|()| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(fail("network namespace"))
    });
    match made {
        Ok(()) => {
            let _ = out.write_all(b"ready\n").and_then(|()| out.flush());
        }
        Err(e) => {
            let _ = writeln!(out, "error {}: {}", e.layer, e.detail.replace('\n', " "));
            std::process::exit(SETUP_FAILED);
        }
    }
    // The calls' launchers inherit the seccomp filter compiled.
    super::filter::prepare(false);
    let control = host_channel();
    // The calls' processes not yet reaped, each with a pidfd that becomes readable when it
    // ends: the holder reaps them as they end, not only at the next call.
    let mut calls: Vec<(Pid, std::os::fd::OwnedFd)> = Vec::new();
    let mut clone3_works = true;
    loop {
        let call_arrived = {
            let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(&control, PollFlags::IN))
                .chain(calls.iter().map(|(_, fd)| PollFd::new(fd, PollFlags::IN)))
                .collect();
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => std::process::exit(SETUP_FAILED),
            }
            let ended: Vec<bool> = fds[1..].iter().map(|f| !f.revents().is_empty()).collect();
            let arrived = !fds[0].revents().is_empty();
            drop(fds);
            let mut ended = ended.into_iter();
            calls.retain(|_| !ended.next().unwrap_or(false));
            arrived
        };
        reap_finished_calls();
        if !call_arrived {
            continue;
        }
        let fds = match receive_fds::<3>(&control) {
            Ok(Some(fds)) => fds,
            Ok(None) => std::process::exit(0),
            Err(_) => continue,
        };
        let mut fds = fds.into_iter();
        let (Some(lifeline), Some(output), Some(error), None) =
            (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            continue;
        };
        match fork_call(&mut clone3_works) {
            Ok(None) => {
                // Nothing of the holder's stays in the call's launcher: its socket to keel and
                // the pidfds of the other calls' launchers go.
                drop(control);
                calls.clear();
                let taken = rustix::stdio::dup2_stdin(&lifeline)
                    .and_then(|()| rustix::stdio::dup2_stdout(&output))
                    .and_then(|()| rustix::stdio::dup2_stderr(&error));
                drop((lifeline, output, error));
                let mut host = host_channel();
                if let Err(e) = taken {
                    report_and_exit(&mut host, &fail("launcher (taking the call's channels)")(e));
                }
                if clone3_works {
                    // Cloned straight into the call's PID namespace. Anything else the holder
                    // had open (close-on-exec, but this process never executes) goes too: the
                    // lifeline is all it keeps.
                    if let Err(e) = super::fds::close_from_3_except(host.as_fd()) {
                        report_and_exit(&mut host, &fail("closing inherited descriptors")(e));
                    }
                    session_call(host)
                }
                run_call(host, Namespaces::Session)
            }
            Ok(Some((pid, fd))) => {
                drop((lifeline, output, error));
                let fd = fd.map_or_else(
                    || rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()),
                    Ok,
                );
                if let Ok(fd) = fd {
                    calls.push((pid, fd));
                }
            }
            // The call's lifeline closes with these: the host hears the launcher is gone.
            Err(_) => drop((lifeline, output, error)),
        }
    }
}

/// Forks the process for a call: straight into a new PID namespace (its PID 1) while `clone3`
/// works, else a stage 1 that makes the namespace and forks a stage 2. The first refusal
/// (no `clone3`, or a seccomp filter of the host's refusing it) sets `clone3_works` to false
/// for this call and every later one; the child reads it to know which kind it is. `Ok(None)`
/// in the child; in the holder the child's pid and, when cloned, its pidfd.
fn fork_call(
    clone3_works: &mut bool,
) -> std::io::Result<Option<(Pid, Option<std::os::fd::OwnedFd>)>> {
    if *clone3_works {
        match super::fds::fork_into_new_pid_namespace() {
            Ok(forked) => return Ok(forked.map(|(pid, fd)| (pid, Some(fd)))),
            Err(_) => *clone3_works = false,
        }
    }
    super::fds::fork_single_threaded().map(|f| f.map(|pid| (pid, None)))
}

/// Reaps the stage 1s of a session holder that have ended, without waiting.
fn reap_finished_calls() {
    while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
}

/// Sends `fds` on `stream` as one message: the byte `tag` with `SCM_RIGHTS` (at most three).
pub(super) fn send_fds(
    stream: impl std::os::fd::AsFd,
    tag: u8,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    loop {
        match rustix::net::sendmsg(
            &stream,
            &[std::io::IoSlice::new(&[tag])],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map(drop).map_err(std::io::Error::from),
        }
    }
}

/// One message from `stream`: its descriptors (close-on-exec; at most `N` kept, the rest
/// closed). `None` at the stream's end.
pub(super) fn receive_fds<const N: usize>(
    stream: &UnixStream,
) -> std::io::Result<Option<Vec<std::os::fd::OwnedFd>>> {
    Ok(receive_message::<N>(stream)?.map(|(_, fds)| fds))
}

/// One message from `stream`: its first byte and its descriptors (close-on-exec; at most `N`
/// kept, the rest closed: a message with more has none). `None` at the stream's end. An
/// interrupted call is retried; any other error (`WouldBlock` on a non-blocking socket
/// included) is returned.
pub(super) fn receive_message<const N: usize>(
    stream: impl std::os::fd::AsFd,
) -> std::io::Result<Option<(u8, Vec<std::os::fd::OwnedFd>)>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    // Room for more than `N`, so that a message with too many is still read whole (and refused).
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut byte = [0u8; 1];
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &stream,
            &mut [std::io::IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        match got {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(m) if m.bytes == 0 => return Ok(None),
            Ok(_) => {}
        }
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if fds.len() > N {
            fds.clear();
        }
        return Ok(Some((byte[0], fds)));
    }
}
