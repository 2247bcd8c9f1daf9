//! `keel-sandbox`: the sandbox launcher for keel-tools' own tests (`keel-sandbox __sandbox …`,
//! see `keel_tools::sandbox`), and a small command that runs one command in a
//! [`keel_tools::sandbox::Sandbox`] the way `shell` does, for tests that need the host to be a
//! separate process (running it as another user, killing it):
//!
//! ```text
//! keel-sandbox [--mode off|read_only|workspace_write] [--network] [--workspace DIR]
//!              [--hide PATH]… [--workspace-root DIR]… [--withhold NAME]… [--pass NAME]…
//!              [--set NAME=VALUE]… [--without-clone3]
//!              -- PROGRAM [ARG]…
//! ```
//!
//! `--without-clone3` first installs a seccomp filter on this process (inherited by the
//! sandbox's holder and launchers) under which `clone3` fails with `ENOSYS`, as on kernels
//! before 5.3 or under some container runtimes' filters: the holder then serves calls the older
//! way (a stage 1 that forks stage 2), which the tests exercise through it.
//!
//! Output goes to standard output and error; the exit code is the command's (128+N when a signal
//! N killed it), 125 when the sandbox cannot be set up (the reason on standard error).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;

use keel_tools::sandbox::{self, Invocation, Launcher, Sandbox, SandboxMode};

/// Makes `clone3` fail with `ENOSYS` for this process and everything it starts (seccomp,
/// after `no_new_privs`); every other call is allowed.
fn refuse_clone3() -> Result<(), String> {
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
    rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let filter = SeccompFilter::new(
        std::iter::once((libc::SYS_clone3, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program = seccompiler::BpfProgram::try_from(filter).map_err(|e| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

fn usage(message: &str) -> ExitCode {
    eprintln!(
        "keel-sandbox: {message}\nusage: keel-sandbox [--mode off|read_only|workspace_write] [--network] [--workspace DIR] [--hide PATH]... [--workspace-root DIR]... [--withhold NAME]... [--pass NAME]... [--set NAME=VALUE]... [--without-clone3] -- PROGRAM [ARG]..."
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    sandbox::run_launcher_if_requested();
    sandbox::set_launcher(Launcher::this_program());

    let mut mode = SandboxMode::WorkspaceWrite;
    let mut network = false;
    let mut workspace: Option<PathBuf> = None;
    let (mut hide, mut roots, mut withhold, mut pass, mut set) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut args = std::env::args().skip(1);
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        let needs_value = matches!(
            arg.as_str(),
            "--mode"
                | "--workspace"
                | "--hide"
                | "--workspace-root"
                | "--withhold"
                | "--pass"
                | "--set"
        );
        let value = if needs_value {
            match args.next() {
                Some(v) => v,
                None => return usage(&format!("{arg} needs a value")),
            }
        } else {
            String::new()
        };
        match arg.as_str() {
            "--mode" => {
                mode = match value.as_str() {
                    "off" => SandboxMode::Off,
                    "read_only" => SandboxMode::ReadOnly,
                    "workspace_write" => SandboxMode::WorkspaceWrite,
                    other => return usage(&format!("unknown mode {other:?}")),
                }
            }
            "--network" => network = true,
            "--without-clone3" => {
                if let Err(e) = refuse_clone3() {
                    eprintln!("keel-sandbox: --without-clone3: {e}");
                    return ExitCode::from(125);
                }
            }
            "--workspace" => workspace = Some(value.into()),
            "--hide" => hide.push(PathBuf::from(value)),
            "--workspace-root" => roots.push(PathBuf::from(value)),
            "--withhold" => withhold.push(value),
            "--pass" => pass.push(value),
            "--set" => match value.split_once('=') {
                Some((k, v)) => set.push((k.to_owned(), v.to_owned())),
                None => return usage(&format!("--set {value:?}: expected NAME=VALUE")),
            },
            "--" => {
                command = args.by_ref().collect();
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let Some((program, rest)) = command.split_first() else {
        return usage("no command after --");
    };
    let workspace = match workspace.map_or_else(std::env::current_dir, Ok) {
        Ok(w) => w,
        Err(e) => return usage(&format!("no workspace: {e}")),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("keel-sandbox: cannot start a runtime: {e}");
            return ExitCode::from(125);
        }
    };
    runtime.block_on(async move {
        let sandbox = match Sandbox::new(mode) {
            Ok(s) => s
                .with_network(network)
                .hiding(&hide)
                .isolating(&roots)
                .withholding(&withhold)
                .passing(&pass)
                .setting(&set),
            Err(e) => {
                eprintln!("keel-sandbox: {e}");
                return ExitCode::from(125);
            }
        };
        let invocation = Invocation {
            program: program.clone(),
            args: rest.to_vec(),
            workdir: workspace.clone(),
            stdout: own(std::io::stdout().as_fd()),
            stderr: own(std::io::stderr().as_fd()),
        };
        let mut child = match sandbox.spawn(invocation, &workspace).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("keel-sandbox: {e}");
                return ExitCode::from(125);
            }
        };
        match child.wait().await {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                let code = status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(125);
                ExitCode::from(u8::try_from(code).unwrap_or(125))
            }
            Err(e) => {
                eprintln!("keel-sandbox: {e}");
                ExitCode::from(125)
            }
        }
    })
}

/// A descriptor of our own for `fd` (the command writes to our standard output and error).
fn own(fd: BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().unwrap_or_else(|e| {
        eprintln!("keel-sandbox: cannot duplicate standard output or error: {e}");
        std::process::exit(125);
    })
}
