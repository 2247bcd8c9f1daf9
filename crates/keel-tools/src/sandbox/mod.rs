//! The sandbox `shell` runs under.
//!
//! **What a sandboxed command gets** ([`SandboxMode::ReadOnly`], [`SandboxMode::WorkspaceWrite`];
//! Linux only). Each command runs in its own mount, PID, IPC, UTS and cgroup namespaces and
//! in a user and network namespace of its [`Sandbox`]'s (see **Network**), set up by the
//! *launcher* (see [`Launcher`]), a re-execution of the host program whose first stage forks
//! the second — or, through the sandbox's session holder (below), one process the holder
//! clones straight into the call's PID namespace (the layout is bubblewrap's; no `bwrap`
//! binary is needed):
//! - **Filesystem**: a new root made of the host's `/` bound read-only (every submount too,
//!   `nosuid`, `nodev`); the workspace bound read-write (`workspace_write`) or read-only
//!   (`read_only`); empty tmpfs over `/tmp`, `/run`, `/var/run` (when it is not a symlink) and
//!   `/dev/shm`, so other services' sockets (a local PostgreSQL's, keel's own) are unreachable;
//!   the sandbox's private temp dir (mode 0700) bound read-write at its own path (`$TMPDIR`, kept across the
//!   calls of one [`Sandbox`], while `/tmp` is empty at every call); the paths the host names
//!   with [`Sandbox::hiding`] (keel's data and config directories, its store and seal key)
//!   covered by an empty read-only tmpfs (directories) or `/dev/null` (files), with every
//!   directory between the workspace and a hidden path inside it pinned (bound onto itself, so
//!   renaming it fails with `EBUSY` and the next call still finds what it hides); the workspace
//!   roots named with [`Sandbox::isolating`] covered the same way, the workspace bound back;
//!   a minimal `/dev`
//!   (`null`, `zero`, `full`, `random`, `urandom`, `tty`, a private `devpts`, `shm`; no `kmsg`, no
//!   disks, no loop devices); a fresh `/proc` showing only the command's PID namespace, with
//!   `/proc/sys`, `/proc/sysrq-trigger`, `/proc/irq` and `/proc/bus` read-only. Through the
//!   session holder this root is built once per session and copied for each call, which gets
//!   its own `/tmp`, `/run`, `/var/run`, `/dev/shm`, `devpts` and `/proc`; a call checks the
//!   kept root is still what a fresh build would give first (`root.rs`, **Session roots**).
//! - **Processes**: the launcher's second stage (or the process the session holder cloned) is
//!   PID 1 of the namespace; when the command ends it exits and the kernel kills everything left
//!   in the namespace (background jobs, `setsid` daemons). The command sees no process outside
//!   (keel's `/proc/<pid>/environ`, `kill`). The launcher dies with keel: PID 1 waits for its
//!   children and for the end of its socket (the lifeline only keel holds, or the socket to
//!   the first stage, which watches the lifeline) in one `poll` and ends everything when it
//!   closes; it has `PR_SET_PDEATHSIG(SIGKILL)` against its parent. The command runs in a new
//!   session (no controlling terminal) and non-dumpable PID 1 cannot be traced.
//! - **Privileges**: every capability dropped (bounding, ambient, inheritable, effective,
//!   permitted); `no_new_privs`.
//! - **Landlock** on top where the kernel has it (defence in depth; absence is logged once, not
//!   fatal): read and execute everywhere, write only in the workspace (`workspace_write`), the
//!   private temp dir, `/tmp`, `/dev/shm` and the character devices above; abstract Unix sockets
//!   and signals scoped to the sandbox (ABI 6).
//! - **seccomp** (see `filter.rs`; one filter): `socket` only for `AF_UNIX` (plus `AF_INET`/`AF_INET6`, and
//!   `AF_NETLINK` with `NETLINK_ROUTE` only, when the network is shared); `socketpair` only
//!   `AF_UNIX`; `io_uring_*`, namespace creation, keyrings, `bpf`, `perf_event_open`,
//!   `userfaultfd`, mount calls, `open_by_handle_at`, `syslog`, `TIOCSTI` and device `mknod` fail
//!   with `EPERM`; `clone3` fails with `ENOSYS` (so libc falls back to `clone`, whose flags the
//!   filter can read); every non-native syscall ABI kills the process (32-bit x86 `int 0x80`,
//!   `socketcall` included, and x32 numbers on x86_64).
//!
//! - **Descriptors**: every process started for a tool (the launcher, or the command itself in
//!   `off` mode) has every descriptor from 3 up marked close-on-exec before it executes, and the
//!   launcher does it again: a command inherits only its standard input, output and error.
//! - **The spec** (what to hide, the command) reaches the launcher over its socket, never in its
//!   arguments or environment, which the command could read as `/proc/1/cmdline`.
//!
//! **Network.** By default the command has no IP sockets at all, in a network namespace of its
//! sandbox's: made at the sandbox's first confined command by the sandbox's **session holder**
//! (`__sandbox session`: a launcher that makes a new user namespace and, owned by it, a new
//! network namespace with only a loopback interface, down), which lives as long as the
//! [`Sandbox`] (keel makes one each time it drives a session: a turn, until it ends or waits
//! for an approval). For each command keel sends the holder the command's lifeline, output
//! and error (`SCM_RIGHTS`); the holder clones one process for it straight into a new PID
//! namespace (`clone3` with `CLONE_NEWPID`; where the kernel lacks `clone3`, a stage 1 as
//! below), which is the command's PID 1 and does both stages' work, already in those
//! namespaces: no launcher `execve` per command (~0.9 ms a call on a VM), no namespace made per
//! command (~0.5 ms, and as much again in the kernel's deferred teardown), one `fork` and one
//! process exit instead of two (~0.2 ms). A confined command cannot reach the holder (it sees
//! only its own PID namespace) and the holder runs nothing but those clones.
//! When the holder is gone, each command starts its own launcher, which enters the same
//! namespaces by descriptor (`setns`). Each command's processes end with it (PID namespace),
//! so nothing of one command is left listening there for the next; two commands of one
//! sandbox running at once could talk through it only as they can through the workspace they
//! share. Where the holder cannot be started, each command makes its own namespaces.
//! [`Sandbox::with_network`] (`sandbox_network = true`) keeps every other layer and shares the
//! host's network namespace for `AF_INET`/`AF_INET6`: the command can then reach the internet
//! *and every service listening on the host's loopback interface* (and abstract Unix sockets,
//! where the kernel lacks Landlock ABI 6).
//!
//! **Required layers.** Namespaces, the mount setup, the capability drop, `no_new_privs` and
//! seccomp are required: where the kernel cannot provide one, nothing runs and
//! [`ToolsError::SandboxUnavailable`] names the layer. A sandbox that is not there is never
//! claimed.
//!
//! **Environment** (every mode, `off` included): a tool process gets keel's environment minus
//! every variable whose name contains `KEY`, `SECRET`, `TOKEN` or `PASSWORD` (any case) and minus
//! the names given to [`Sandbox::withholding`] (provider keys), except the names given to
//! [`Sandbox::passing`]; then the values of [`Sandbox::setting`]; then `TMPDIR`.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::ToolsError;

mod env;
pub use env::is_secret_env_name;
use env::{CommandEnv, EnvPolicy};
#[cfg(target_os = "linux")]
mod fds;
#[cfg(target_os = "linux")]
mod filter;
#[cfg(target_os = "linux")]
mod holder;
#[cfg(target_os = "linux")]
mod launch;
#[cfg(target_os = "linux")]
mod root;
mod stage2;

mod launcher;
mod temps;
use launcher::DEFAULT_LAUNCHER;
pub use launcher::{Launcher, set_launcher};

/// The argument that makes a program the sandbox launcher (`keel __sandbox …`); see
/// [`run_launcher_if_requested`].
pub const LAUNCHER_ARG: &str = "__sandbox";

/// How long the launcher may take to set the sandbox up before the call fails (ms).
const SETUP_TIMEOUT_MS: u64 = 30_000;

/// How `shell` is confined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// No confinement (the operator chose it explicitly); the environment is still scrubbed.
    Off,
    /// Nothing but the private temp dir and `/tmp` is writable; no IP networking.
    ReadOnly,
    /// The workspace, the private temp dir and `/tmp` are writable; no IP networking.
    #[default]
    WorkspaceWrite,
}

impl SandboxMode {
    /// The snake_case name (`off`, `read_only`, `workspace_write`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::ReadOnly => "read_only",
            Self::WorkspaceWrite => "workspace_write",
        }
    }
}

/// Runs the sandbox launcher and exits, when this process was started as one
/// (`argv[1] == "__sandbox"`); returns otherwise. Call it first thing in `main`, before any
/// thread is started (the launcher must be single-threaded to enter a user namespace).
pub fn run_launcher_if_requested() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(std::ffi::OsStr::new(LAUNCHER_ARG)) {
        return;
    }
    #[cfg(target_os = "linux")]
    launch::main(args.collect());
    #[cfg(not(target_os = "linux"))]
    {
        eprintln!("keel: the sandbox launcher needs Linux");
        std::process::exit(125);
    }
}

/// What to run: `program` (looked up in `PATH`) with `args`, in `workdir` (inside the
/// workspace), with its output going to `stdout` and `stderr`. Its standard input is
/// `/dev/null`.
#[derive(Debug)]
pub struct Invocation {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory (absolute, inside the workspace).
    pub workdir: PathBuf,
    /// Where standard output goes (a pipe's write end, a file, `/dev/null`, …).
    pub stdout: OwnedFd,
    /// Where standard error goes.
    pub stderr: OwnedFd,
}

/// A process [`Sandbox::spawn`] started: the command itself (`off`), the launcher running it,
/// or a launcher the session's holder forked for it (not keel's child: no [`SandboxedChild::id`]).
/// The first two lead their own process group, whose id is [`SandboxedChild::id`]; killing
/// that group (or the process) ends the command and, when confined, everything in its PID
/// namespace. [`SandboxedChild::start_kill`] ends it in every case (for a confined command by
/// closing the launcher's lifeline, which makes it kill everything in the command's PID
/// namespace). Dropping the handle kills it, unless a confined command has ended and been
/// reported (then the launcher is left to finish and is reaped in the background).
#[derive(Debug)]
pub struct SandboxedChild {
    child: Option<tokio::process::Child>,
    /// The launcher's end of this socket is its standard input: when this end closes (the handle
    /// is dropped, keel dies) the launcher kills the command. The launcher reports the
    /// command's end on it (`exit N` / `signal N`).
    lifeline: Option<tokio::net::UnixStream>,
    /// What has been read from the lifeline and not yet taken as a line.
    pending: Vec<u8>,
    /// The command's end as the launcher reported it.
    reported: Option<std::process::ExitStatus>,
}

impl SandboxedChild {
    fn new(child: tokio::process::Child, lifeline: Option<tokio::net::UnixStream>) -> Self {
        Self {
            child: Some(child),
            lifeline,
            pending: Vec::new(),
            reported: None,
        }
    }

    /// A command a launcher forked by the session's holder runs: all there is of it is the
    /// launcher's lifeline.
    #[cfg(target_os = "linux")]
    fn forked(lifeline: tokio::net::UnixStream) -> Self {
        Self {
            child: None,
            lifeline: Some(lifeline),
            pending: Vec::new(),
            reported: None,
        }
    }

    /// The process id (also its process group id), while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// Waits for the command to end. A confined command's exit status is passed through: its
    /// exit code, or the signal that killed it. For a confined command that is the launcher's
    /// report, sent once the command and everything it left in its PID namespace are gone —
    /// before the launcher has torn the namespaces down (for its mount namespace the kernel
    /// waits for an RCU grace period, milliseconds when the machine is busy); without a
    /// report (the launcher died) it is the launcher's own status, or, for a launcher the
    /// session's holder forked (or one [`SandboxedChild::start_kill`] ended), death by
    /// `SIGKILL`. Cancel-safe.
    ///
    /// Errors: as [`tokio::process::Child::wait`].
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        if let Some(status) = self.reported {
            return Ok(status);
        }
        if let Some(status) = self.read_report().await {
            self.reported = Some(status);
            return Ok(status);
        }
        match self.child.as_mut() {
            Some(child) => child.wait().await,
            // Death by SIGKILL (9).
            None => Ok(std::process::ExitStatus::from_raw(9)),
        }
    }

    /// Reads the launcher's lifeline up to its `exit N` / `signal N` line: the status, or `None`
    /// at its end (or with no lifeline: the sandbox is off).
    async fn read_report(&mut self) -> Option<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        use tokio::io::AsyncReadExt;
        let lifeline = self.lifeline.as_mut()?;
        loop {
            while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                self.pending.drain(..=end);
                let number = |prefix: &str| {
                    line.strip_prefix(prefix)
                        .and_then(|n| n.trim().parse::<i32>().ok())
                };
                if let Some(code) = number("exit ") {
                    return Some(std::process::ExitStatus::from_raw((code & 0xff) << 8));
                }
                if let Some(signal) = number("signal ") {
                    return Some(std::process::ExitStatus::from_raw(signal & 0x7f));
                }
            }
            let mut buf = [0u8; 256];
            // `read` is cancel-safe: bytes it returned are in `pending` before any await.
            match lifeline.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            }
            if self.pending.len() > 64 * 1024 {
                return None;
            }
        }
    }

    /// Sends SIGKILL to the process (not waiting for it); for a launcher the session's holder
    /// forked, closes its lifeline (it kills everything in the command's PID namespace and
    /// exits). A confined command whose end was reported is left alone.
    ///
    /// Errors: as [`tokio::process::Child::start_kill`].
    pub fn start_kill(&mut self) -> std::io::Result<()> {
        if self.reported.is_some() {
            return Ok(());
        }
        match self.child.as_mut() {
            Some(child) => child.start_kill(),
            None => {
                self.lifeline = None;
                Ok(())
            }
        }
    }
}

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        // A reported end: the launcher is tearing the namespaces down and exits by itself; it
        // keeps its lifeline until then (closing it early would only make it kill what is
        // already dead) and is reaped in the background. Otherwise the child's own drop kills it.
        if self.reported.is_none() {
            return;
        }
        let (Some(mut child), lifeline) = (self.child.take(), self.lifeline.take()) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.wait().await;
                drop(lifeline);
            });
        }
    }
}

/// A sandbox configuration with its private temp dir (deleted when the last clone is dropped).
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: SandboxMode,
    network: bool,
    temp: Arc<temps::PrivateTemp>,
    env: Arc<EnvPolicy>,
    hidden: Arc<[PathBuf]>,
    roots: Arc<[PathBuf]>,
    launcher: Option<Launcher>,
    /// The session holder whose namespaces every command of this sandbox (and of its clones)
    /// uses and which forks their launchers, started at the first confined command without the
    /// network; `None` inside when it could not be (each command then makes its own namespaces,
    /// as good as the shared ones: an empty network, loopback down).
    #[cfg(target_os = "linux")]
    held_network: Arc<tokio::sync::OnceCell<Option<Arc<imp::SessionHolder>>>>,
    /// The session roots its holder's launchers built (`root.rs`, **Session roots**).
    #[cfg(target_os = "linux")]
    held_roots: Arc<imp::SessionRoots>,
}

impl Sandbox {
    /// A sandbox in `mode` with a fresh private temp dir under the system temp dir, no network,
    /// nothing hidden and the process's registered launcher ([`set_launcher`]).
    ///
    /// Errors: [`ToolsError::Io`] when the temp dir cannot be created.
    pub fn new(mode: SandboxMode) -> Result<Self, ToolsError> {
        let parent = std::env::temp_dir();
        let mut builder = tempfile::Builder::new();
        let prefix = temps::prefix();
        builder.prefix(&prefix);
        temps::sweep_dead(&parent);
        // Private: what a command writes there is no other local user's to read.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700));
        let temp = builder
            .tempdir_in(&parent)
            .map_err(|source| ToolsError::Io {
                context: format!(
                    "creating the sandbox's private temp dir in {} (the system temp dir: \
                     $TMPDIR, else /tmp)",
                    parent.display()
                ),
                source,
            })?;
        Ok(Self {
            mode,
            network: false,
            temp: Arc::new(temps::PrivateTemp::new(temp)),
            env: Arc::new(EnvPolicy::default()),
            hidden: Arc::from(Vec::new()),
            roots: Arc::from(Vec::new()),
            launcher: None,
            #[cfg(target_os = "linux")]
            held_network: Arc::default(),
            #[cfg(target_os = "linux")]
            held_roots: Arc::default(),
        })
    }

    /// How many session roots this sandbox and its clones have built (`root.rs`, **Session
    /// roots**): 1 for a session whose confined calls all used the first call's root, more when
    /// the host changed what a root is built from (a root found stale is built again), 0 in
    /// `off` mode, with the network, or where roots are not used. For tests and benchmarks.
    #[must_use]
    pub fn session_roots_built(&self) -> u64 {
        #[cfg(target_os = "linux")]
        {
            self.held_roots.built()
        }
        #[cfg(not(target_os = "linux"))]
        {
            0
        }
    }

    /// The same sandbox sharing the host's network namespace (`true`): `AF_INET`/`AF_INET6`
    /// sockets are allowed and reach whatever the host reaches, its loopback services included.
    /// Every other layer stays. No effect in `off` mode.
    #[must_use]
    pub fn with_network(mut self, network: bool) -> Self {
        self.network = network;
        self
    }

    /// The same sandbox, removing the environment variables `names` from every process it
    /// spawns (secrets such as provider API keys that no tool needs), unless [`Self::passing`]
    /// names them too.
    #[must_use]
    pub fn withholding(mut self, names: &[String]) -> Self {
        self.env_mut().withheld = names.to_vec();
        self
    }

    /// The same sandbox, passing keel's own value of each of `names` to every process it spawns
    /// even when the name looks like a secret or is withheld (the user config's `[env]` entries
    /// without a value).
    #[must_use]
    pub fn passing(mut self, names: &[String]) -> Self {
        self.env_mut().passed = names.to_vec();
        self
    }

    /// The same sandbox, setting each `(name, value)` in the environment of every process it
    /// spawns (the user config's `[env]` values), whatever the name.
    #[must_use]
    pub fn setting(mut self, vars: &[(String, String)]) -> Self {
        self.env_mut().set = vars.to_vec();
        self
    }

    /// The same sandbox, hiding `paths` from confined commands: a directory is covered by an
    /// empty read-only tmpfs, anything else by `/dev/null`. Paths that do not exist when a
    /// command starts are skipped. (keel hides its data and config directories, its store and
    /// its seal key.) No effect in `off` mode.
    #[must_use]
    pub fn hiding(mut self, paths: &[PathBuf]) -> Self {
        self.hidden = Arc::from(paths.to_vec());
        self
    }

    /// The same sandbox, hiding the directories `roots` that hold the workspaces of other
    /// sessions (`keel serve`'s `[server] workspace_roots`) except the workspace a command runs
    /// in: each root is covered like a hidden directory and the workspace is bound back at its
    /// path (read-write in `workspace_write`), so a command sees none of the other workspaces
    /// under any root. A root that is the workspace itself is not hidden; a root nested in
    /// another, or inside the workspace, is hidden too. `/` cannot be hidden and is skipped;
    /// keep toolchains and other shared files outside the roots. No effect in `off` mode.
    #[must_use]
    pub fn isolating(mut self, roots: &[PathBuf]) -> Self {
        self.roots = Arc::from(roots.to_vec());
        self
    }

    /// The same sandbox using `launcher` instead of the process's registered one.
    #[must_use]
    pub fn with_launcher(mut self, launcher: Launcher) -> Self {
        self.launcher = Some(launcher);
        self
    }

    /// The mode.
    pub fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// Whether confined commands share the host's network.
    pub fn network(&self) -> bool {
        self.network
    }

    /// The private temp dir (`TMPDIR` of sandboxed processes).
    pub fn temp_dir(&self) -> &Path {
        self.temp.path()
    }

    /// The settings of [`Self::withholding`], [`Self::passing`] and [`Self::setting`], to
    /// change: what was computed from the old ones is dropped.
    fn env_mut(&mut self) -> &mut EnvPolicy {
        let env = Arc::make_mut(&mut self.env);
        env.computed = std::sync::OnceLock::new();
        env
    }

    /// [`Self::tool_env`] of keel's own environment, computed once per setting of this sandbox
    /// (and its clones) rather than at every command.
    fn command_env(&self) -> Arc<CommandEnv> {
        self.env
            .computed
            .get_or_init(|| {
                Arc::new(CommandEnv {
                    vars: self.tool_env(std::env::vars_os()),
                    found: std::sync::Mutex::default(),
                })
            })
            .clone()
    }

    /// The environment a tool process gets (see the module docs), from `base` (keel's own).
    pub fn tool_env(
        &self,
        base: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Vec<(OsString, OsString)> {
        let env = &self.env;
        let mut out: Vec<(OsString, OsString)> = base
            .into_iter()
            .filter(|(name, _)| {
                let name = name.to_string_lossy();
                env.passed.iter().any(|p| *p == name)
                    || !(is_secret_env_name(&name) || env.withheld.iter().any(|w| *w == name))
            })
            .collect();
        for (name, value) in &env.set {
            out.retain(|(n, _)| n.to_str() != Some(name.as_str()));
            out.push((name.into(), value.into()));
        }
        out.retain(|(n, _)| n != "TMPDIR");
        out.push(("TMPDIR".into(), self.temp.path().into()));
        out
    }

    /// Spawns `invocation` confined according to the mode, with write access to `workspace` in
    /// `workspace_write` mode, and returns once it runs. Must be called inside a tokio runtime.
    ///
    /// Errors: [`ToolsError::SandboxUnavailable`] naming the layer the kernel cannot provide, or
    /// the missing launcher (nothing is run); [`ToolsError::Io`] when spawning fails.
    pub async fn spawn(
        &self,
        invocation: Invocation,
        workspace: &Path,
    ) -> Result<SandboxedChild, ToolsError> {
        let env = self.command_env();
        if self.mode == SandboxMode::Off {
            let mut command = tokio::process::Command::new(env.program(&invocation.program));
            command
                .arg0(&invocation.program)
                .args(&invocation.args)
                .current_dir(&invocation.workdir)
                .env_clear()
                .envs(env.vars.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::from(invocation.stdout))
                .stderr(Stdio::from(invocation.stderr))
                .process_group(0)
                .kill_on_drop(true);
            let spawn_error = |source| ToolsError::Io {
                context: format!("spawning `{}`", invocation.program),
                source,
            };
            #[cfg(target_os = "linux")]
            fds::inherit_only_stdio().map_err(spawn_error)?;
            let child = command.spawn().map_err(spawn_error)?;
            return Ok(SandboxedChild::new(child, None));
        }
        let launcher = self
            .launcher
            .as_ref()
            .or_else(|| DEFAULT_LAUNCHER.get())
            .ok_or_else(|| {
                unavailable(
                    self.mode,
                    "no sandbox launcher is registered in this process: the program embedding \
                     keel-tools must call keel_tools::sandbox::set_launcher at startup (the keel \
                     binary does: `keel __sandbox`), or the sandbox must be set to off"
                        .into(),
                )
            })?;
        launcher::log_skipped_launcher();
        imp::spawn(self, launcher, invocation, workspace, env.vars.clone()).await
    }

    /// Checks that this system can run a command under `mode` with the registered launcher, by
    /// running `true` in a throwaway workspace.
    ///
    /// Errors: [`ToolsError::SandboxUnavailable`] naming what is missing.
    pub async fn probe(mode: SandboxMode) -> Result<(), ToolsError> {
        if mode == SandboxMode::Off {
            return Ok(());
        }
        let sandbox = Self::new(mode)?;
        let workspace = sandbox.temp_dir().to_path_buf();
        let mut child = sandbox
            .spawn(
                Invocation {
                    program: "true".into(),
                    args: Vec::new(),
                    workdir: workspace.clone(),
                    stdout: dev_null()?,
                    stderr: dev_null()?,
                },
                &workspace,
            )
            .await?;
        let status = child.wait().await.map_err(|source| ToolsError::Io {
            context: "waiting for the sandbox probe".into(),
            source,
        })?;
        if status.success() {
            Ok(())
        } else {
            Err(unavailable(
                mode,
                format!("`true` failed in the sandbox ({status})"),
            ))
        }
    }
}

/// `/dev/null`, opened for writing: an [`Invocation`]'s output that goes nowhere.
///
/// Errors: [`ToolsError::Io`] when it cannot be opened.
pub fn dev_null() -> Result<OwnedFd, ToolsError> {
    std::fs::File::options()
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|source| ToolsError::Io {
            context: "opening /dev/null".into(),
            source,
        })
}

fn unavailable(mode: SandboxMode, reason: String) -> ToolsError {
    tracing::error!(
        sandbox = mode.as_str(),
        %reason,
        "SANDBOX UNAVAILABLE: refusing to run a command under a sandbox that cannot be set up"
    );
    ToolsError::SandboxUnavailable {
        mode: mode.as_str().to_owned(),
        reason,
    }
}

/// The format of [`LaunchSpec`]: a launcher from another build (a `keel-sandbox-launcher` not
/// installed with this `keel`) refuses a spec of another format, and any field it does not know.
const LAUNCH_SPEC_FORMAT: u32 = 5;

/// The build of this crate a launcher and its host must share (crate version and a hash of its
/// sources, set by `build.rs`): a launcher refuses a spec of another build, so a stale
/// `keel-sandbox-launcher` beside a newer `keel` — one without a later fix to the launcher —
/// runs nothing rather than confining commands the old way.
pub const LAUNCHER_BUILD: &str = env!("KEEL_LAUNCHER_BUILD");

/// What the host tells the launcher: one JSON line on the launcher's standard input (a socket),
/// never in its arguments or environment, which the command could read as `/proc/1/cmdline`.
/// The command's environment travels in it too: a launcher runs with an empty environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LaunchSpec {
    /// [`LAUNCH_SPEC_FORMAT`] of the host; a launcher reading another format refuses the spec.
    format: u32,
    /// [`LAUNCHER_BUILD`] of the host; a launcher of another build refuses the spec.
    build: String,
    /// The program (looked up in `PATH`) and its arguments.
    command: Vec<String>,
    mode: SandboxMode,
    network: bool,
    /// Canonical paths: the workspace, the private temp dir, the working directory.
    workspace: PathBuf,
    temp: PathBuf,
    workdir: PathBuf,
    /// Canonical paths to hide.
    hide: Vec<PathBuf>,
    /// Whether the host sends, right after this line, the descriptors of the sandbox's own
    /// network namespace and of the user namespace owning it (one byte with `SCM_RIGHTS`), for
    /// stage 1 to enter instead of making a network namespace of its own (a new one cost ~0.5
    /// ms of every call, and as much again in the kernel's deferred teardown). Never with
    /// `network`.
    shared_network: bool,
    /// Canonical paths in the workspace a command must not change: the directories of the
    /// host's own program and of its launcher (or, in the workspace's top directory, the files:
    /// [`Launcher`]'s `own_files`): each is bound read-only onto itself, its directories up to
    /// the workspace pinned.
    protect: Vec<PathBuf>,
    /// The command's environment (name, value): the launcher itself runs with none.
    env: Vec<[EnvText; 2]>,
    /// Where the call's root comes from (format 5).
    root: RootUse,
}

/// How a launcher gets a call's root (`root.rs`, **Session roots**). `Build` and `Enter` only
/// for a stage 1 its session's holder forked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RootUse {
    /// Stage 2 builds a root for this call alone.
    Fresh,
    /// Stage 1 builds the session's root in a new mount namespace, sends that namespace to the
    /// host (one byte `r` with `SCM_RIGHTS`) before any other answer, then goes on as `Enter`.
    Build,
    /// The host sends the session root's mount namespace after the spec line (one byte with
    /// `SCM_RIGHTS`); stage 1 enters it, answers `stale` (nothing runs) unless it is still
    /// what a fresh build would give, and copies it for the call.
    Enter,
}

/// An environment variable's name or value in a [`LaunchSpec`]: a JSON string when it is
/// UTF-8, else its bytes (a JSON array of numbers), so that nothing of the host's environment is
/// lost or refused on the way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum EnvText {
    Text(String),
    Bytes(Vec<u8>),
}

impl EnvText {
    fn new(s: OsString) -> Self {
        use std::os::unix::ffi::OsStringExt;
        match s.into_string() {
            Ok(text) => Self::Text(text),
            Err(other) => Self::Bytes(other.into_vec()),
        }
    }

    fn to_os(&self) -> OsString {
        use std::os::unix::ffi::OsStringExt;
        match self {
            Self::Text(text) => OsString::from(text),
            Self::Bytes(bytes) => OsString::from_vec(bytes.clone()),
        }
    }
}

#[cfg(target_os = "linux")]
#[path = "spawn.rs"]
mod imp;

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::ffi::OsString;
    use std::path::Path;

    use super::{Invocation, Launcher, Sandbox, SandboxedChild, unavailable};
    use crate::error::ToolsError;

    pub(super) async fn spawn(
        sandbox: &Sandbox,
        _launcher: &Launcher,
        _invocation: Invocation,
        _workspace: &Path,
        _env: Vec<(OsString, OsString)>,
    ) -> Result<SandboxedChild, ToolsError> {
        Err(unavailable(
            sandbox.mode,
            "the sandbox needs Linux (namespaces, seccomp); set the sandbox to off explicitly"
                .into(),
        ))
    }
}
