//! The sandbox launcher's **stage 2** (see `launch.rs`): PID 1 of a call's PID namespace. It
//! confines itself (`setsid`, the call's root — the whole root, or through the session's holder
//! only what is new for every call —, the working directory, no capabilities, `no_new_privs`,
//! Landlock, seccomp), starts the command, reports `ready landlock=…` and later `exit N` /
//! `signal N` on its socket (the lifeline, or the socket to stage 1), and reaps every process
//! of the namespace until the command ends, when it kills what is left. It ends everything
//! when that socket closes.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

use super::launch::{LayerError, SETUP_FAILED, Setup, exit_now, fail, report_and_exit, send};
use super::root::Layout;
use super::{LaunchSpec, RootUse, SandboxMode};

pub(super) fn stage2(mut up: UnixStream, spec: &LaunchSpec) -> ! {
    // Die with the process that started this one (stage 1, or the session's holder); if the
    // channel to the host is already closed, stop here.
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        report_and_exit(&mut up, &fail("parent-death signal")(e));
    }
    {
        let mut fds = [PollFd::new(&up, PollFlags::empty())];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if rustix::event::poll(&mut fds, Some(&zero)).is_ok()
            && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
        {
            exit_now(SETUP_FAILED);
        }
    }
    // SIGCHLD is taken through a descriptor from here on, so that stage 2 waits for its
    // children and for the end of its channel to the host in one `poll` (the command starts
    // with no signal blocked: the standard library resets the mask of what it spawns).
    let children = match children_signal() {
        Ok(fd) => fd,
        Err(e) => report_and_exit(&mut up, &e),
    };
    let landlock = match confine(spec) {
        Ok(l) => l,
        Err(e) => report_and_exit(&mut up, &e),
    };
    let Some((program, args)) = spec.command.split_first() else {
        report_and_exit(&mut up, &fail("command")("no command given"));
    };
    let env: Vec<(OsString, OsString)> = spec
        .env
        .iter()
        .map(|[name, value]| (name.to_os(), value.to_os()))
        .collect();
    // Found on the command's `PATH` here, so that the standard library starts it with
    // `posix_spawn` (a `vfork`: no copy of this process's memory, no `execve` tried in each
    // `PATH` directory); argv[0] stays as given.
    let found = super::env::on_path(program, &env);
    let devnull = File::open("/dev/null");
    let spawned = devnull.and_then(|null| {
        use std::os::unix::process::CommandExt;
        Command::new(&found)
            .arg0(program)
            .args(args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::from(null))
            .spawn()
    });
    send(&mut up, &format!("ready landlock={landlock}"));
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("keel sandbox: cannot run `{program}`: {e}");
            send(&mut up, "exit 127");
            exit_now(127);
        }
    };
    release_output();
    let line = reap_until_end_of(Pid::from_child(&child), &up, &children);
    // Everything the command left in the namespace is killed and reaped before its end is
    // reported: when the host hears `exit N`, nothing of the call runs.
    end_every_other_process();
    send(&mut up, &line);
    exit_now(0);
}

/// SIGCHLD blocked and delivered to a descriptor instead (`signalfd`, non-blocking).
fn children_signal() -> Setup<nix::sys::signalfd::SignalFd> {
    use nix::sys::signal::{SigSet, Signal as NixSignal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut mask = SigSet::empty();
    mask.add(NixSignal::SIGCHLD);
    mask.thread_block()
        .map_err(fail("launcher (blocking SIGCHLD)"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(fail("launcher (signalfd)"))
}

/// How many ended processes PID 1 reaps before it looks at its channel to the host again.
const REAP_ROUND: usize = 32;

/// Stage 2 as PID 1 of the call's namespace: reaps every process that ends until `target` (the
/// command) does, and returns how it ended (`exit N` / `signal N`). When `up` closes first —
/// the host closed the call's lifeline (it gave the call up, or died), or stage 1 is gone —
/// everything in the namespace is killed and stage 2 exits (137), which ends the namespace.
///
/// Reaping goes in rounds of at most [`REAP_ROUND`], each followed by a look at `up`: a command
/// whose processes end faster than PID 1 reaps them (a storm of orphans, each `wait` slowed by
/// thousands of live children) cannot keep it from seeing the host give the call up (found by
/// the attack pass on the one-process call: a timed-out command ran on until the turn ended).
fn reap_until_end_of(
    target: Pid,
    up: &UnixStream,
    children: &nix::sys::signalfd::SignalFd,
) -> String {
    loop {
        let mut more = true;
        for _ in 0..REAP_ROUND {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) if pid == target => return describe(status),
                Ok(Some(_)) | Err(rustix::io::Errno::INTR) => {}
                Ok(None) => {
                    more = false;
                    break;
                }
                Err(_) => return "exit 125".into(),
            }
        }
        let mut fds = [
            PollFd::new(up, PollFlags::empty()),
            PollFd::new(children, PollFlags::IN),
        ];
        // With more to reap, only a look; else a wait for the next child or the host.
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, more.then_some(&zero)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return "exit 125".into(),
        }
        if fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
            end_every_other_process();
            exit_now(137);
        }
        // Drained: the next `poll` waits for a child that ends after this.
        while let Ok(Some(_)) = children.read_signal() {}
    }
}

/// Points standard output and error at `/dev/null`: the command's output pipes stay open only
/// in the command's own processes.
pub(super) fn release_output() {
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

/// Stage 2 (PID 1 of the namespace): SIGKILL to every other process of the namespace, then
/// reaps them all.
fn end_every_other_process() {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(-1),
        nix::sys::signal::Signal::SIGKILL,
    );
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some(_)) | Err(rustix::io::Errno::INTR) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

fn describe(status: WaitStatus) -> String {
    if let Some(code) = status.exit_status() {
        format!("exit {code}")
    } else if let Some(signal) = status.terminating_signal() {
        format!("signal {signal}")
    } else {
        "exit 125".into()
    }
}

/// Everything between entering the namespaces and running the command. Returns how Landlock
/// applied (`full`, `partial`, `none`).
fn confine(spec: &LaunchSpec) -> Setup<&'static str> {
    rustix::process::setsid().map_err(fail("new session (setsid)"))?;
    if spec.root == RootUse::Fresh {
        super::root::build_root(spec, Layout::Call)?;
    } else {
        super::root::per_call(spec)?;
    }
    std::env::set_current_dir(&spec.workdir).map_err(|e| LayerError {
        layer: "working directory",
        detail: format!("{}: {e}", spec.workdir.display()),
    })?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(fail("non-dumpable launcher"))?;
    drop_capabilities()?;
    rustix::thread::set_no_new_privs(true).map_err(fail("no_new_privs"))?;
    let landlock = landlock(spec);
    super::filter::install(spec.network).map_err(fail("seccomp"))?;
    Ok(landlock)
}

// --- privileges ------------------------------------------------------------------------------

fn drop_capabilities() -> Setup {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(63)
        .min(63);
    for cap in 0..=last {
        let set = CapabilitySet::from_bits_retain(1u64 << cap);
        match rustix::thread::remove_capability_from_bounding_set(set) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => {
                return Err(LayerError {
                    layer: "capability drop",
                    detail: format!("bounding set, capability {cap}: {e}"),
                });
            }
        }
    }
    rustix::thread::clear_ambient_capability_set().map_err(fail("capability drop (ambient)"))?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(fail("capability drop"))?;
    let now = rustix::thread::capabilities(None).map_err(fail("capability drop (check)"))?;
    if !(now.effective.is_empty() && now.permitted.is_empty() && now.inheritable.is_empty()) {
        return Err(fail("capability drop")(
            "capabilities remain after dropping them",
        ));
    }
    Ok(())
}

/// Landlock, best effort: `full`, `partial` or `none`.
fn landlock(spec: &LaunchSpec) -> &'static str {
    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };
    let abi = ABI::V6;
    let build = || -> Result<RulesetStatus, landlock::RulesetError> {
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))?
            .scope(Scope::AbstractUnixSocket | Scope::Signal)?
            .create()?;
        if let Ok(fd) = PathFd::new("/") {
            created = created.add_rule(PathBeneath::new(fd, AccessFs::from_read(abi)))?;
        }
        let mut writable = vec![
            spec.temp.clone(),
            PathBuf::from("/tmp"),
            PathBuf::from("/dev/shm"),
        ];
        if spec.mode == SandboxMode::WorkspaceWrite {
            writable.push(spec.workspace.clone());
        }
        for dir in writable {
            if let Ok(fd) = PathFd::new(&dir) {
                created = created.add_rule(PathBeneath::new(fd, AccessFs::from_all(abi)))?;
            }
        }
        for device in ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"] {
            if let Ok(fd) = PathFd::new(device) {
                created = created.add_rule(PathBeneath::new(
                    fd,
                    AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
                ))?;
            }
        }
        Ok(created.restrict_self()?.ruleset)
    };
    match build() {
        Ok(RulesetStatus::FullyEnforced) => "full",
        Ok(RulesetStatus::PartiallyEnforced) => "partial",
        Ok(RulesetStatus::NotEnforced) | Err(_) => "none",
    }
}
