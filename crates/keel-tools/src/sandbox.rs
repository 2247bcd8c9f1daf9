//! The sandbox `shell` runs under.
//!
//! On Linux, [`SandboxMode::ReadOnly`] and [`SandboxMode::WorkspaceWrite`] apply, to the spawned
//! process tree only:
//! - **Landlock** (ABI ≥ 3 required): read and execute everywhere; write only to the workspace
//!   (`workspace_write`) and the sandbox's private temp dir (both modes), plus `/dev/null`,
//!   `/dev/zero`, `/dev/full`, `/dev/tty`. Landlock binds root too.
//! - **seccomp**: `socket(AF_INET | AF_INET6, …)` and `io_uring_setup` fail with `EPERM`;
//!   `AF_UNIX` stays allowed so name lookups through local daemons and local tools work.
//!
//! Both are installed on a short-lived dedicated thread (Landlock and seccomp filters without
//! TSYNC bind the calling thread only), which then spawns the child; the child and everything it
//! starts inherit them, the rest of the process is unaffected and no `unsafe` `pre_exec` hook is
//! needed. If the kernel cannot enforce the requested sandbox, spawning fails with
//! [`ToolsError::SandboxUnavailable`] and an error is logged: a sandbox that is not there is never
//! claimed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::ToolsError;

/// How `shell` is confined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// No confinement (the operator chose it explicitly).
    Off,
    /// Nothing but the private temp dir is writable; no IP networking.
    ReadOnly,
    /// The workspace and the private temp dir are writable; no IP networking.
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

/// A sandbox configuration with its private temp dir (deleted when the last clone is dropped).
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: SandboxMode,
    temp: Arc<tempfile::TempDir>,
    withheld: Arc<[String]>,
}

impl Sandbox {
    /// A sandbox in `mode` with a fresh private temp dir under the system temp dir.
    ///
    /// Errors: [`ToolsError::Io`] when the temp dir cannot be created.
    pub fn new(mode: SandboxMode) -> Result<Self, ToolsError> {
        let temp = tempfile::Builder::new()
            .prefix("keel-sandbox-")
            .tempdir()
            .map_err(|source| ToolsError::Io {
                context: "creating the sandbox's private temp dir".into(),
                source,
            })?;
        Ok(Self {
            mode,
            temp: Arc::new(temp),
            withheld: Arc::from(Vec::new()),
        })
    }

    /// The same sandbox, removing the environment variables `names` from every process it
    /// spawns (secrets such as provider API keys that no tool needs).
    #[must_use]
    pub fn withholding(mut self, names: &[String]) -> Self {
        self.withheld = Arc::from(names.to_vec());
        self
    }

    /// The mode.
    pub fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// The private temp dir (`TMPDIR` of sandboxed processes).
    pub fn temp_dir(&self) -> &Path {
        self.temp.path()
    }

    /// Spawns `command` confined according to the mode, with write access to `workspace` in
    /// `workspace_write` mode. Must be called inside a tokio runtime.
    ///
    /// Errors: [`ToolsError::SandboxUnavailable`] when the kernel cannot enforce the mode (nothing
    /// is spawned); [`ToolsError::Io`] when spawning fails.
    pub async fn spawn(
        &self,
        mut command: tokio::process::Command,
        workspace: &Path,
    ) -> Result<tokio::process::Child, ToolsError> {
        command.env("TMPDIR", self.temp.path());
        for name in self.withheld.iter() {
            command.env_remove(name);
        }
        if self.mode == SandboxMode::Off {
            return command.spawn().map_err(|source| ToolsError::Io {
                context: "spawning the command".into(),
                source,
            });
        }
        let mut writable: Vec<PathBuf> = vec![self.temp.path().to_path_buf()];
        if self.mode == SandboxMode::WorkspaceWrite {
            writable.push(workspace.to_path_buf());
        }
        imp::spawn_confined(command, self.mode, writable).await
    }

    /// Checks whether this kernel can enforce `mode` by confining a throwaway thread.
    ///
    /// Errors: [`ToolsError::SandboxUnavailable`] naming what is missing.
    pub async fn probe(mode: SandboxMode) -> Result<(), ToolsError> {
        if mode == SandboxMode::Off {
            return Ok(());
        }
        imp::probe(mode).await
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::path::PathBuf;

    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus,
    };
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    use super::SandboxMode;
    use crate::error::ToolsError;

    const LANDLOCK_ABI: ABI = ABI::V3;
    const DEVICE_FILES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];

    fn unavailable(mode: SandboxMode, reason: String) -> ToolsError {
        tracing::error!(
            sandbox = mode.as_str(),
            %reason,
            "SANDBOX UNAVAILABLE: refusing to run a command under a sandbox this kernel cannot enforce"
        );
        ToolsError::SandboxUnavailable {
            mode: mode.as_str().to_owned(),
            reason,
        }
    }

    /// Confines the calling thread (and its future children).
    fn confine_current_thread(mode: SandboxMode, writable: &[PathBuf]) -> Result<(), ToolsError> {
        let landlock_err = |e: String| unavailable(mode, format!("Landlock: {e}"));
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(LANDLOCK_ABI))
            .map_err(|e| landlock_err(e.to_string()))?
            .create()
            .map_err(|e| landlock_err(e.to_string()))?;
        let root = PathFd::new("/").map_err(|e| landlock_err(e.to_string()))?;
        created = created
            .add_rule(PathBeneath::new(root, AccessFs::from_read(LANDLOCK_ABI)))
            .map_err(|e| landlock_err(e.to_string()))?;
        for dir in writable {
            let fd =
                PathFd::new(dir).map_err(|e| landlock_err(format!("{}: {e}", dir.display())))?;
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::from_all(LANDLOCK_ABI)))
                .map_err(|e| landlock_err(e.to_string()))?;
        }
        for device in DEVICE_FILES {
            if let Ok(fd) = PathFd::new(device) {
                created = created
                    .add_rule(PathBeneath::new(
                        fd,
                        AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
                    ))
                    .map_err(|e| landlock_err(e.to_string()))?;
            }
        }
        let status = created
            .restrict_self()
            .map_err(|e| landlock_err(e.to_string()))?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(landlock_err(format!(
                "the ruleset is {:?}, not fully enforced (Landlock ABI 3 or newer is required)",
                status.ruleset
            )));
        }
        let filter = network_filter().map_err(|e| unavailable(mode, format!("seccomp: {e}")))?;
        seccompiler::apply_filter(&filter)
            .map_err(|e| unavailable(mode, format!("seccomp: {e}")))?;
        Ok(())
    }

    /// `socket(AF_INET|AF_INET6, …)` and `io_uring_setup` → EPERM; everything else allowed.
    fn network_filter() -> Result<BpfProgram, String> {
        let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
        let domain = |family: i32| -> Result<SeccompRule, String> {
            let cond =
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, family as u64)
                    .map_err(|e| e.to_string())?;
            SeccompRule::new(vec![cond]).map_err(|e| e.to_string())
        };
        let rules = vec![
            (
                libc::SYS_socket,
                vec![domain(libc::AF_INET)?, domain(libc::AF_INET6)?],
            ),
            (libc::SYS_io_uring_setup, vec![]),
        ];
        let filter = SeccompFilter::new(
            rules.into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .map_err(|e| e.to_string())?;
        BpfProgram::try_from(filter).map_err(|e| e.to_string())
    }

    pub(super) async fn spawn_confined(
        mut command: tokio::process::Command,
        mode: SandboxMode,
        writable: Vec<PathBuf>,
    ) -> Result<tokio::process::Child, ToolsError> {
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("keel-sandbox-spawn".into())
            .spawn(move || {
                let result = confine_current_thread(mode, &writable).and_then(|()| {
                    let _guard = handle.enter();
                    command.spawn().map_err(|source| ToolsError::Io {
                        context: "spawning the command in the sandbox".into(),
                        source,
                    })
                });
                let _ = tx.send(result);
            });
        if let Err(source) = spawned {
            return Err(ToolsError::Io {
                context: "starting the sandbox spawn thread".into(),
                source,
            });
        }
        rx.await
            .map_err(|_| unavailable(mode, "the sandbox spawn thread died".into()))?
    }

    pub(super) async fn probe(mode: SandboxMode) -> Result<(), ToolsError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let temp = std::env::temp_dir();
        std::thread::Builder::new()
            .name("keel-sandbox-probe".into())
            .spawn(move || {
                let _ = tx.send(confine_current_thread(mode, &[temp]));
            })
            .map_err(|source| ToolsError::Io {
                context: "starting the sandbox probe thread".into(),
                source,
            })?;
        rx.await
            .map_err(|_| unavailable(mode, "the sandbox probe thread died".into()))?
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::path::PathBuf;

    use super::SandboxMode;
    use crate::error::ToolsError;

    fn unavailable(mode: SandboxMode) -> ToolsError {
        tracing::error!(
            sandbox = mode.as_str(),
            "SANDBOX UNAVAILABLE: only Linux is supported"
        );
        ToolsError::SandboxUnavailable {
            mode: mode.as_str().to_owned(),
            reason:
                "the sandbox needs Linux (Landlock and seccomp); set the sandbox to off explicitly"
                    .into(),
        }
    }

    pub(super) async fn spawn_confined(
        _command: tokio::process::Command,
        mode: SandboxMode,
        _writable: Vec<PathBuf>,
    ) -> Result<tokio::process::Child, ToolsError> {
        Err(unavailable(mode))
    }

    pub(super) async fn probe(mode: SandboxMode) -> Result<(), ToolsError> {
        Err(unavailable(mode))
    }
}
