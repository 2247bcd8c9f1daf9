//! The Linux side of [`super::Sandbox::spawn`]: the launch spec sent to the launcher, the
//! session's network namespace (made by a holder launcher and handed to each call), and reading
//! the launcher's answers.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    Invocation, LAUNCHER_ARG, LaunchSpec, Launcher, SETUP_TIMEOUT_MS, Sandbox, SandboxMode,
    SandboxedChild, launch, unavailable,
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
    };
    let spec = LaunchSpec {
        hide: hidden_paths(sandbox, &spec.workspace),
        protect: protected(launcher, &spec.workspace),
        ..spec
    };
    let shared = if sandbox.network {
        None
    } else {
        session_network(sandbox, launcher).await
    };
    let spec = LaunchSpec {
        shared_network: shared.is_some(),
        ..spec
    };
    let mut spec = serde_json::to_string(&spec)
        .map_err(|e| unavailable(mode, format!("a path is not UTF-8: {e}")))?;
    spec.push('\n');
    let (host_end, launcher_end) =
        std::os::unix::net::UnixStream::pair().map_err(|source| ToolsError::Io {
            context: "creating the sandbox launcher's socket".into(),
            source,
        })?;
    let mut command = tokio::process::Command::new(launcher.program());
    command
        .arg(LAUNCHER_ARG)
        .arg("1")
        .current_dir("/")
        .env_clear()
        .envs(env)
        .stdin(Stdio::from(OwnedFd::from(launcher_end)))
        .stdout(invocation.stdout)
        .stderr(invocation.stderr)
        .process_group(0)
        .kill_on_drop(true);
    super::fds::inherit_only_stdio()
        .map_err(|e| unavailable(mode, format!("cannot mark descriptors close-on-exec: {e}")))?;
    let mut child = command.spawn().map_err(|e| {
        unavailable(
            mode,
            format!(
                "cannot start the sandbox launcher {}: {e}",
                launcher.program().display()
            ),
        )
    })?;
    drop(command);
    let io = |source| ToolsError::Io {
        context: "talking to the sandbox launcher".into(),
        source,
    };
    host_end.set_nonblocking(true).map_err(io)?;
    let mut host_end = tokio::net::UnixStream::from_std(host_end).map_err(io)?;
    // A launcher that died already shows as an early end of its answer below.
    let _ = host_end.write_all(spec.as_bytes()).await;
    if let Some(ns) = &shared {
        let _ = send_namespaces(&host_end, ns).await;
    }
    let line = tokio::time::timeout(
        Duration::from_millis(SETUP_TIMEOUT_MS),
        read_line(&mut host_end),
    )
    .await;
    let line = match line {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => return Err(io(e)),
        Err(_) => {
            let _ = child.start_kill();
            return Err(unavailable(
                mode,
                format!(
                    "the sandbox launcher did not finish setting up within {SETUP_TIMEOUT_MS} ms"
                ),
            ));
        }
    };
    if let Some(rest) = line.strip_prefix("ready") {
        let landlock = rest.trim().strip_prefix("landlock=").unwrap_or("unknown");
        if landlock != "full" && !LANDLOCK_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                landlock,
                "Landlock is not (fully) available on this kernel: the sandbox runs without this extra layer (namespaces, read-only mounts, dropped capabilities and seccomp still apply)"
            );
        }
        return Ok(SandboxedChild::new(child, Some(host_end)));
    }
    let status = child.wait().await.ok();
    let reason = match line.strip_prefix("error ") {
        Some(reason) if reason.starts_with("user namespace") => format!(
            "{reason}; the sandbox needs unprivileged user namespaces (see the sysctls \
             user.max_user_namespaces and kernel.unprivileged_userns_clone, and AppArmor's \
             userns restriction on Ubuntu 23.10 and later), or choose the sandbox off"
        ),
        Some(reason) => reason.to_owned(),
        None => format!(
            "the sandbox launcher {} exited ({}) before starting the command",
            launcher.program().display(),
            status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string())
        ),
    };
    Err(unavailable(mode, reason))
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
            _ if file.starts_with(workspace) => file,
            _ => continue,
        };
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// The sandbox's network namespace: made by a holder launcher (`__sandbox net`) at the
/// first call and kept by descriptor; `None` when that fails (logged; each command then
/// makes its own).
async fn session_network(
    sandbox: &Sandbox,
    launcher: &Launcher,
) -> Option<Arc<launch::SharedNetwork>> {
    sandbox
        .held_network
        .get_or_init(|| async {
            match hold_network(launcher).await {
                Ok(ns) => Some(Arc::new(ns)),
                Err(e) => {
                    tracing::debug!(
                        error = %e,
                        "no network namespace shared by the sandbox's commands: each makes its own"
                    );
                    None
                }
            }
        })
        .await
        .clone()
}

/// Starts `launcher __sandbox net`, waits for its `ready`, opens its user and network
/// namespaces and lets it end (closing its lifeline).
async fn hold_network(launcher: &Launcher) -> std::io::Result<launch::SharedNetwork> {
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::AsyncBufReadExt;
    let (lifeline, holder_end) = std::os::unix::net::UnixStream::pair()?;
    let mut command = tokio::process::Command::new(launcher.program());
    command
        .arg(LAUNCHER_ARG)
        .arg(launch::NETWORK_HOLDER_STAGE)
        .current_dir("/")
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(holder_end)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    let held = launch::SharedNetwork {
        user: open("user")?,
        net: open("net")?,
    };
    drop(lifeline);
    let _ = child.wait().await;
    Ok(held)
}

/// Sends the shared namespaces' descriptors (user, then network) as one byte with
/// `SCM_RIGHTS`, after the spec line.
async fn send_namespaces(
    stream: &tokio::net::UnixStream,
    ns: &launch::SharedNetwork,
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    stream
        .async_io(tokio::io::Interest::WRITABLE, || {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let fds = [ns.user.as_fd(), ns.net.as_fd()];
            control.push(SendAncillaryMessage::ScmRights(&fds));
            rustix::net::sendmsg(
                stream,
                &[std::io::IoSlice::new(b"n")],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map(drop)
            .map_err(std::io::Error::from)
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

/// One line (without its newline; empty at end of stream), at most 64 KiB.
async fn read_line(stream: &mut tokio::net::UnixStream) -> std::io::Result<String> {
    let mut buf = Vec::new();
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
