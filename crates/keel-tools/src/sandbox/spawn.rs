//! The Linux side of [`super::Sandbox::spawn`]: the launch spec sent to the launcher, the
//! session's network namespace (made by a holder launcher and handed to each call), and reading
//! the launcher's answers.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    EnvText, Invocation, LAUNCHER_ARG, LaunchSpec, Launcher, RootUse, SETUP_TIMEOUT_MS, Sandbox,
    SandboxMode, SandboxedChild, holder, launch, unavailable,
};
use crate::error::ToolsError;

static LANDLOCK_WARNED: AtomicBool = AtomicBool::new(false);

fn canonical(mode: SandboxMode, what: &str, path: &Path) -> Result<std::path::PathBuf, ToolsError> {
    std::fs::canonicalize(path)
        .map_err(|e| unavailable(mode, format!("{what} {}: {e}", path.display())))
}

pub(super) async fn spawn(
    sandbox: &Sandbox,
    launcher: &Launcher,
    invocation: Invocation,
    workspace: &Path,
    env: Vec<(OsString, OsString)>,
) -> Result<SandboxedChild, ToolsError> {
    let mode = sandbox.mode;
    let spec = LaunchSpec {
        format: super::LAUNCH_SPEC_FORMAT,
        build: super::LAUNCHER_BUILD.to_owned(),
        command: std::iter::once(invocation.program.clone())
            .chain(invocation.args.iter().cloned())
            .collect(),
        mode,
        network: sandbox.network,
        workspace: canonical(mode, "the workspace", workspace)?,
        temp: canonical(mode, "the private temp dir", sandbox.temp.path())?,
        workdir: canonical(mode, "the working directory", &invocation.workdir)?,
        hide: Vec::new(),
        protect: Vec::new(),
        shared_network: false,
        root: RootUse::Fresh,
        env: env
            .into_iter()
            .map(|(name, value)| [EnvText::new(name), EnvText::new(value)])
            .collect(),
    };
    let spec = LaunchSpec {
        hide: hidden_paths(sandbox, &spec.workspace),
        protect: protected(launcher, &spec.workspace)
            .into_iter()
            .chain(links_to_hidden(sandbox, &spec.workspace))
            .collect(),
        ..spec
    };
    let session = if sandbox.network {
        None
    } else {
        session_holder(sandbox, launcher).await
    };
    // Through the session's holder, which forks a launcher for the call; when it is gone, by
    // starting one, which enters the session's namespaces.
    if let Some(holder) = session.as_ref().filter(|h| !h.gone.load(Ordering::Relaxed)) {
        let key = RootKey::of(&spec);
        let mut held = key.as_ref().and_then(|k| sandbox.held_roots.find(k));
        // Opened before a root is built: it reports any change of this process's mount table
        // from then on (a root copies the host's mounts as they were when it was built).
        let mut mounts = None;
        let mut root = match (&key, &held) {
            (None, _) => RootUse::Fresh,
            (Some(_), Some(_)) => RootUse::Enter,
            (Some(_), None) => RootUse::Build,
        };
        // Set when the call fell back from the session's root to one of its own.
        let mut fell_back = false;
        loop {
            let (mut host_end, launcher_end) = lifeline()?;
            let fds = [
                launcher_end.as_fd(),
                invocation.stdout.as_fd(),
                invocation.stderr.as_fd(),
            ];
            if send_fds(&holder.control, &fds).await.is_err() {
                break;
            }
            drop(launcher_end);
            let waiting = SlowHolder {
                holder,
                since: std::time::Instant::now(),
            };
            if root == RootUse::Build {
                mounts = MountTable::watch();
            }
            let spec = LaunchSpec {
                root,
                ..spec.clone()
            };
            let ns = held.as_ref().filter(|_| root == RootUse::Enter);
            let after: Vec<_> = ns.iter().map(|fd| fd.as_fd()).collect();
            let answer = start(&mut host_end, &spec, &after).await;
            std::mem::forget(waiting);
            match answer {
                // Only the forked launcher holds the command's output from here.
                Answer::Ready(built) => {
                    if let (Some(key), Some(ns), Some(mounts)) = (key, built, mounts) {
                        sandbox.held_roots.keep(key, ns, mounts);
                    }
                    if fell_back {
                        // The session's root failed where a root of the call's own works.
                        tracing::debug!("no session root: each call builds its own");
                        sandbox.held_roots.give_up();
                    }
                    return Ok(SandboxedChild::forked(host_end));
                }
                // Nothing ran: the session's root is stale (rebuilt), or the call could not
                // start on it (started again on a root of its own: a failure of the call's,
                // such as a missing working directory, shows again there and is reported).
                Answer::Refused(line) if root != RootUse::Fresh => {
                    if let Some(key) = &key {
                        sandbox.held_roots.forget(key);
                    }
                    held = None;
                    root = if root == RootUse::Enter && line == launch::STALE_ROOT {
                        RootUse::Build
                    } else {
                        tracing::debug!(answer = %line, "the call did not start on the session's root");
                        fell_back = true;
                        RootUse::Fresh
                    };
                }
                // Reset: the launcher's end closed with the spec unread in it (the holder died
                // with the call queued): nothing ran, and a launcher of the call's own may
                // start it. An end after the spec was read is not retried.
                Answer::Failed(ToolsError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::ConnectionReset =>
                {
                    break;
                }
                Answer::Failed(e) => {
                    // No answer in time (a stuck holder): later calls do not wait on it.
                    holder.gone.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                Answer::Refused(line) => {
                    return Err(unavailable(
                        mode,
                        refusal(&line, || {
                            "the sandbox launcher the session's holder forked ended before \
                             starting the command"
                                .to_owned()
                        }),
                    ));
                }
            }
        }
        holder.gone.store(true, Ordering::Relaxed);
        tracing::debug!("the sandbox's session holder is gone: each call starts its own launcher");
    }
    let (mut host_end, launcher_end) = lifeline()?;
    let shared = session.as_ref().map(|holder| &holder.namespaces);
    let spec = LaunchSpec {
        shared_network: shared.is_some(),
        ..spec
    };
    let mut command = tokio::process::Command::new(launcher.program());
    command
        .arg(LAUNCHER_ARG)
        .arg("1")
        .current_dir("/")
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(launcher_end)))
        .stdout(Stdio::from(invocation.stdout))
        .stderr(Stdio::from(invocation.stderr))
        .process_group(0)
        .kill_on_drop(true);
    super::fds::inherit_only_stdio()
        .map_err(|e| unavailable(mode, format!("cannot mark descriptors close-on-exec: {e}")))?;
    let mut child = command.spawn().map_err(|e| {
        unavailable(
            mode,
            format!(
                "cannot start the sandbox launcher {}: {e}",
                launcher.shown().display()
            ),
        )
    })?;
    drop(command);
    let after: Vec<_> = shared
        .iter()
        .flat_map(|ns| [ns.user.as_fd(), ns.net.as_fd()])
        .collect();
    match start(&mut host_end, &spec, &after).await {
        Answer::Ready(_) => Ok(SandboxedChild::new(child, Some(host_end))),
        Answer::Failed(e) => {
            let _ = child.start_kill();
            Err(e)
        }
        Answer::Refused(line) => {
            let status = child.wait().await.ok();
            Err(unavailable(
                mode,
                refusal(&line, || {
                    format!(
                        "the sandbox launcher {} exited ({}) before starting the command",
                        launcher.shown().display(),
                        status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string())
                    )
                }),
            ))
        }
    }
}

/// While a call waits for the launcher its session's holder forks: if the wait is given up
/// (the call timed out or was cancelled) after [`SLOW_HOLDER`], the holder is taken as stuck
/// and later calls start their own launchers.
struct SlowHolder<'a> {
    holder: &'a SessionHolder,
    since: std::time::Instant,
}

/// How long a call may wait for a launcher forked by its session's holder before, given up,
/// it marks the holder as stuck (a fork and the launcher's setup take ~1 ms).
const SLOW_HOLDER: Duration = Duration::from_secs(1);

impl Drop for SlowHolder<'_> {
    fn drop(&mut self) {
        if self.since.elapsed() >= SLOW_HOLDER {
            self.holder.gone.store(true, Ordering::Relaxed);
        }
    }
}

/// A launcher's lifeline: keel's end (non-blocking, on the runtime) and the launcher's.
fn lifeline() -> Result<(tokio::net::UnixStream, std::os::unix::net::UnixStream), ToolsError> {
    let io = |source| ToolsError::Io {
        context: "creating the sandbox launcher's socket".into(),
        source,
    };
    let (host_end, launcher_end) = std::os::unix::net::UnixStream::pair().map_err(io)?;
    host_end.set_nonblocking(true).map_err(io)?;
    let host_end = tokio::net::UnixStream::from_std(host_end).map_err(io)?;
    Ok((host_end, launcher_end))
}

/// How a launcher answered the spec.
enum Answer {
    /// `ready`: the command runs; with the session root's mount namespace when the spec asked
    /// the launcher to build it ([`RootUse::Build`]).
    Ready(Option<OwnedFd>),
    /// Another line (`error LAYER: DETAIL`), or none (empty: the launcher ended).
    Refused(String),
    /// No answer within [`SETUP_TIMEOUT_MS`], or the channel failed.
    Failed(ToolsError),
}

/// Sends `spec` and then `after` (the session's namespaces, or its root's mount namespace:
/// one byte with `SCM_RIGHTS`, when not empty) on the launcher's lifeline and reads its first
/// answer: for [`RootUse::Build`], the session root's namespace first (or the start of a
/// refusal), then the answer line.
async fn start(
    host_end: &mut tokio::net::UnixStream,
    spec: &LaunchSpec,
    after: &[std::os::fd::BorrowedFd<'_>],
) -> Answer {
    let mode = spec.mode;
    let mut line = match serde_json::to_string(spec) {
        Ok(line) => line,
        Err(e) => {
            return Answer::Failed(unavailable(mode, format!("a path is not UTF-8: {e}")));
        }
    };
    line.push('\n');
    // A launcher that died already shows as an early end of its answer below.
    let _ = host_end.write_all(line.as_bytes()).await;
    if !after.is_empty() {
        let _ = send_fds(host_end, after).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SETUP_TIMEOUT_MS);
    let answer = tokio::time::timeout_at(deadline, async {
        let mut built = None;
        let mut first = None;
        if spec.root == RootUse::Build {
            match receive_message(host_end).await? {
                Some((b'r', mut fds)) if fds.len() == 1 => built = fds.pop(),
                Some((byte, _)) => first = Some(byte),
                None => return Ok((None, String::new())),
            }
        }
        read_line(host_end, first).await.map(|line| (built, line))
    })
    .await;
    let (built, line) = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(source)) => {
            return Answer::Failed(ToolsError::Io {
                context: "talking to the sandbox launcher".into(),
                source,
            });
        }
        Err(_) => {
            return Answer::Failed(unavailable(
                mode,
                format!(
                    "the sandbox launcher did not finish setting up within {SETUP_TIMEOUT_MS} ms"
                ),
            ));
        }
    };
    let Some(rest) = line.strip_prefix("ready") else {
        return Answer::Refused(line);
    };
    let landlock = rest.trim().strip_prefix("landlock=").unwrap_or("unknown");
    if landlock != "full" && !LANDLOCK_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            landlock,
            "Landlock is not (fully) available on this kernel: the sandbox runs without this extra layer (namespaces, read-only mounts, dropped capabilities and seccomp still apply)"
        );
    }
    Answer::Ready(built)
}

/// Why a launcher did not start the command, from its answer `line`; `ended` says it when
/// there was none.
fn refusal(line: &str, ended: impl FnOnce() -> String) -> String {
    match line.strip_prefix("error ") {
        Some(reason) if reason.starts_with("user namespace") => format!(
            "{reason}; the sandbox needs unprivileged user namespaces (see the sysctls \
             user.max_user_namespaces and kernel.unprivileged_userns_clone, and AppArmor's \
             userns restriction on Ubuntu 23.10 and later), or choose the sandbox off"
        ),
        Some(reason) => reason.to_owned(),
        None => ended(),
    }
}

/// What a command in `workspace` must not change of keel's own (see
/// [`Launcher::own_files`]): the directory of each file, when it lies inside the workspace
/// (so nothing can be planted, renamed or replaced there: a launcher missing beside keel
/// included), else the file itself when it lies in the workspace's top directory.
fn protected(launcher: &Launcher, workspace: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for file in launcher.own_files() {
        let path = match file.parent() {
            Some(dir) if dir != workspace && dir.starts_with(workspace) => dir.to_path_buf(),
            _ if file.starts_with(workspace) => {
                hold_place(&file);
                file
            }
            _ => continue,
        };
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// What a session root is built from: a call whose spec has the same may use it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RootKey {
    mode: SandboxMode,
    workspace: std::path::PathBuf,
    temp: std::path::PathBuf,
    hide: Vec<std::path::PathBuf>,
    protect: Vec<std::path::PathBuf>,
}

impl RootKey {
    /// `spec`'s key; `None` where a session root cannot serve it: a workspace or private temp
    /// dir that is `/` or lies in `/dev` or `/proc` (which every call makes anew).
    fn of(spec: &LaunchSpec) -> Option<Self> {
        let odd = |p: &Path| p == Path::new("/") || p.starts_with("/dev") || p.starts_with("/proc");
        if odd(&spec.workspace) || odd(&spec.temp) {
            return None;
        }
        Some(Self {
            mode: spec.mode,
            workspace: spec.workspace.clone(),
            temp: spec.temp.clone(),
            hide: spec.hide.clone(),
            protect: spec.protect.clone(),
        })
    }
}

/// The host's mount table as a session root saw it: `/proc/self/mountinfo` kept open, which
/// `poll(2)` reports readable-with-priority once the mount namespace changed since it was
/// opened (a mount or unmount anywhere: a root still holding an unmounted disk must not serve
/// another call, and one missing a new mount would not match a fresh build).
#[derive(Debug)]
pub(super) struct MountTable(std::fs::File);

impl MountTable {
    /// Opens the table; `None` when it cannot be read (no session root is kept then).
    fn watch() -> Option<Self> {
        std::fs::File::open("/proc/self/mountinfo").ok().map(Self)
    }

    /// Whether the mount table changed since [`Self::watch`] (or this cannot tell).
    fn changed(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.0, PollFlags::PRI)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::PRI | PollFlags::ERR | PollFlags::NVAL),
            Err(_) => true,
        }
    }
}

/// Most session roots a sandbox keeps (a server's sandbox may serve several workspaces); the
/// oldest goes first.
const MAX_ROOTS: usize = 8;

/// The session roots of a sandbox and its clones (`root.rs`, **Session roots**): mount
/// namespaces built by a stage 1 of the session's holder, kept by descriptor (which keeps each
/// namespace alive; they go with the last clone of the sandbox).
#[derive(Debug, Default)]
pub(super) struct SessionRoots {
    held: std::sync::Mutex<Vec<HeldRoot>>,
    /// Set once a call failed on a session root and started on one of its own: every later
    /// call builds its own.
    off: AtomicBool,
    /// How many roots were built and kept.
    built: std::sync::atomic::AtomicU64,
}

/// One kept root: what it was built from, its mount namespace, the host's mount table since.
#[derive(Debug)]
struct HeldRoot {
    key: RootKey,
    ns: Arc<OwnedFd>,
    mounts: MountTable,
}

impl SessionRoots {
    fn held(&self) -> std::sync::MutexGuard<'_, Vec<HeldRoot>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The root built for `key`, if any, if roots are still used and if the host's mount table
    /// has not changed since it was built (roots built before a change are dropped).
    fn find(&self, key: &RootKey) -> Option<Arc<OwnedFd>> {
        if self.off.load(Ordering::Relaxed) {
            return None;
        }
        let mut held = self.held();
        held.retain(|root| !root.mounts.changed());
        held.iter()
            .find(|root| root.key == *key)
            .map(|root| Arc::clone(&root.ns))
    }

    /// How many roots were built and kept.
    pub(super) fn built(&self) -> u64 {
        self.built.load(Ordering::Relaxed)
    }

    fn keep(&self, key: RootKey, ns: OwnedFd, mounts: MountTable) {
        self.built.fetch_add(1, Ordering::Relaxed);
        let mut held = self.held();
        held.retain(|root| root.key != key);
        if held.len() >= MAX_ROOTS {
            held.remove(0);
        }
        held.push(HeldRoot {
            key,
            ns: Arc::new(ns),
            mounts,
        });
    }

    fn forget(&self, key: &RootKey) {
        self.held().retain(|root| root.key != *key);
    }

    fn give_up(&self) {
        self.off.store(true, Ordering::Relaxed);
        self.held().clear();
    }
}

/// Makes `file` (one of keel's own, in the workspace's top directory, where only the file
/// itself can be protected) exist when it does not: empty, mode 000, so that the sandbox binds
/// it read-only and no confined command can plant a launcher at that name, which the next keel
/// would run outside the sandbox ([`Launcher::beside_this_program`] refuses a file without an
/// execute bit, and keel then starts itself as the launcher). Logged once.
fn hold_place(file: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    static TOLD: AtomicBool = AtomicBool::new(false);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(file)
    {
        Ok(_) if !TOLD.swap(true, Ordering::Relaxed) => tracing::info!(
            file = %file.display(),
            "made an empty, non-executable file where keel looks for its sandbox launcher, \
             inside the workspace: a confined command cannot plant a launcher there"
        ),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => tracing::warn!(
            file = %file.display(),
            "could not hold the sandbox launcher's place in the workspace: {e}"
        ),
    }
}

/// A sandbox's session holder (`__sandbox session`, see `launch.rs`): a launcher, keel's child,
/// in the user and network namespaces every command of the sandbox uses, which forks a stage 1
/// for each call sent on its socket. It exits when the socket closes (the sandbox and all its
/// clones are gone; a task reaps it); the launchers it forked run on until their calls end.
#[derive(Debug)]
pub(super) struct SessionHolder {
    /// The holder's user and network namespaces, for a launcher started the usual way (the
    /// holder is gone) to enter.
    namespaces: Arc<launch::SharedNetwork>,
    /// Keel's end of the holder's standard input.
    control: tokio::net::UnixStream,
    /// Set once a call could not go through the holder (it died, or did not answer in time):
    /// later calls start their own launchers.
    gone: AtomicBool,
}

/// The sandbox's session holder, started at the first call; `None` when it could not be
/// (logged; each command then makes its own namespaces).
async fn session_holder(sandbox: &Sandbox, launcher: &Launcher) -> Option<Arc<SessionHolder>> {
    sandbox
        .held_network
        .get_or_init(|| async {
            match hold_session(launcher).await {
                Ok(holder) => Some(Arc::new(holder)),
                Err(e) => {
                    tracing::debug!(
                        error = %e,
                        "no session holder for the sandbox: each command makes its own namespaces"
                    );
                    None
                }
            }
        })
        .await
        .clone()
}

/// Starts `launcher __sandbox session FORMAT:BUILD`, waits for its `ready` and opens its user
/// and network namespaces.
async fn hold_session(launcher: &Launcher) -> std::io::Result<SessionHolder> {
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::AsyncBufReadExt;
    let (control, holder_end) = std::os::unix::net::UnixStream::pair()?;
    let mut command = tokio::process::Command::new(launcher.program());
    command
        .arg(LAUNCHER_ARG)
        .arg(holder::SESSION_STAGE)
        .arg(holder::session_build())
        .current_dir("/")
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(holder_end)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    super::fds::inherit_only_stdio()?;
    let mut child = command.spawn()?;
    drop(command);
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no output pipe"))?;
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(stdout.take(4096));
    let read = reader.read_line(&mut line);
    match tokio::time::timeout(Duration::from_millis(SETUP_TIMEOUT_MS), read).await {
        Ok(Ok(_)) if line == "ready\n" => {}
        Ok(Ok(_)) => {
            return Err(std::io::Error::other(format!(
                "the holder said {:?}",
                line.trim_end()
            )));
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(std::io::Error::other("the holder did not answer in time")),
    }
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the holder is gone"))?;
    let open = |kind: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/{pid}/ns/{kind}"))
            .map(OwnedFd::from)
    };
    let namespaces = Arc::new(launch::SharedNetwork {
        user: open("user")?,
        net: open("net")?,
    });
    control.set_nonblocking(true)?;
    // Reaped as soon as it ends (it exits when `control` closes; killed with the runtime).
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(SessionHolder {
        namespaces,
        control: tokio::net::UnixStream::from_std(control)?,
        gone: AtomicBool::new(false),
    })
}

/// Sends `fds` as one byte with `SCM_RIGHTS` (at most three).
async fn send_fds(
    stream: &tokio::net::UnixStream,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    stream
        .async_io(tokio::io::Interest::WRITABLE, || {
            holder::send_fds(stream, b'n', fds)
        })
        .await
}

/// What the launcher covers, canonical: the paths the host hides, and every workspace root
/// but the workspace itself (and `/`, which cannot be covered).
fn hidden_paths(sandbox: &Sandbox, workspace: &Path) -> Vec<std::path::PathBuf> {
    let canonical = |p: &std::path::PathBuf| std::fs::canonicalize(p).ok();
    let mut hide: Vec<std::path::PathBuf> = sandbox.hidden.iter().filter_map(canonical).collect();
    hide.extend(
        sandbox
            .roots
            .iter()
            .filter_map(canonical)
            .filter(|root| root != workspace && root != Path::new("/")),
    );
    hide
}

/// One message (a byte and at most one descriptor) from a launcher's lifeline: see
/// [`holder::receive_message`].
async fn receive_message(
    stream: &tokio::net::UnixStream,
) -> std::io::Result<Option<(u8, Vec<OwnedFd>)>> {
    stream
        .async_io(tokio::io::Interest::READABLE, || {
            holder::receive_message::<1>(stream)
        })
        .await
}

/// The directories in the workspace (not the workspace itself) that hold a symbolic link on
/// the way to a path the host hides as it named it (a dotfiles setup's `~/.config/keel ->
/// ../dotfiles/keel` with the workspace at `$HOME`), canonical. The sandbox covers what the
/// link points to, but a command could replace the link itself with a directory of its own —
/// a `keel.toml` with hooks that the next keel, reading its config through that name, would
/// run outside the sandbox — so each such directory is protected (read-only to commands, like
/// keel's own directories). A link directly in the workspace's top directory cannot be
/// protected so (the workspace would be read-only); SECURITY.md says so.
fn links_to_hidden(sandbox: &Sandbox, workspace: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for path in sandbox.hidden.iter().filter(|p| p.is_absolute()) {
        let mut at = std::path::PathBuf::from("/");
        for part in path.components().skip(1) {
            let next = at.join(part);
            let Ok(meta) = std::fs::symlink_metadata(&next) else {
                break;
            };
            if meta.file_type().is_symlink() {
                if let Ok(dir) = std::fs::canonicalize(&at)
                    && dir != workspace
                    && dir.starts_with(workspace)
                    && !out.contains(&dir)
                {
                    out.push(dir);
                }
                match std::fs::canonicalize(&next) {
                    Ok(real) => at = real,
                    Err(_) => break,
                }
            } else {
                at = next;
            }
        }
    }
    out
}

/// One line (without its newline; empty at end of stream), at most 64 KiB, that begins with
/// `first` when given (a byte read already).
async fn read_line(
    stream: &mut tokio::net::UnixStream,
    first: Option<u8>,
) -> std::io::Result<String> {
    let mut buf = Vec::new();
    match first {
        Some(b'\n') => return Ok(String::new()),
        Some(byte) => buf.push(byte),
        None => {}
    }
    let mut byte = [0u8; 1];
    while buf.len() < 64 * 1024 {
        match stream.read(&mut byte).await? {
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ => buf.push(byte[0]),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
