//! Which program is the sandbox launcher ([`Launcher`]) and the process's default one
//! ([`set_launcher`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The program that sets the sandbox up: a binary that calls [`run_launcher_if_requested`] first
/// thing in `main`, started as `PROGRAM __sandbox …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    program: PathBuf,
    /// The launcher's own file (canonical) when it is held open ([`Launcher::beside_this_program`]):
    /// protected like the running program's file when it lies in a workspace.
    origin: Option<PathBuf>,
}

impl Launcher {
    /// The binary at `program`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            origin: None,
        }
    }

    /// The running program itself (`/proc/self/exe`, which stays right even when the file is
    /// replaced while it runs): for a binary whose `main` calls [`run_launcher_if_requested`].
    pub fn this_program() -> Self {
        Self::new("/proc/self/exe")
    }

    /// The launcher program `name` installed in the running program's directory (the small
    /// `keel-sandbox-launcher` beside `keel`: it starts in a fraction of the time the full
    /// binary takes, and every sandboxed command starts a launcher), held open from now on and
    /// run as `/proc/self/fd/N`, so that it stays the same file for the life of this process
    /// even if the file is replaced (as [`Launcher::this_program`] does). `None` when there is
    /// no such executable regular file; use [`Launcher::this_program`] then. A launcher from
    /// another build refuses the spec (its `format`, and unknown fields are errors), so a
    /// mismatched pair fails closed: nothing runs.
    ///
    /// The file must be a regular file (a symlink to one is followed), executable, owned by
    /// this process's user or by root, and writable by no one else (no group or other write
    /// bit): a launcher another user could rewrite would run their code outside the sandbox.
    /// It must have no other name (one hard link): through a second name elsewhere (cargo's
    /// `target/*/deps/` copy) a confined command could change the file where the sandbox does
    /// not cover it, and the next keel would run it unconfined.
    /// It is opened `O_PATH` (a FIFO of that name cannot block start-up).
    pub fn beside_this_program(name: &str) -> Option<Self> {
        let exe = std::fs::read_link("/proc/self/exe").ok()?;
        let path = exe.parent()?.join(name);
        if let Some(dir) = path.parent().and_then(|d| std::fs::canonicalize(d).ok()) {
            let _ = LOOKED_FOR.set(dir.join(name));
        }
        Self::held_open(&path)
    }

    /// [`Launcher::beside_this_program`]'s checks and hold on the file at `path`.
    #[cfg(target_os = "linux")]
    fn held_open(path: &Path) -> Option<Self> {
        use std::os::fd::{AsRawFd, OwnedFd};
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let skip = |why: String| {
            let _ = SKIPPED.set(format!("{}: {why}", path.display()));
            None
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(file) => file,
            Err(e) => return skip(e.to_string()),
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(e) => return skip(e.to_string()),
        };
        let euid = rustix::process::geteuid().as_raw();
        let refused = if !meta.is_file() {
            Some("not a regular file".to_owned())
        } else if meta.mode() & 0o111 == 0 {
            Some("not executable".to_owned())
        } else if meta.mode() & 0o022 != 0 {
            Some(format!(
                "writable by its group or others (mode {:o})",
                meta.mode() & 0o7777
            ))
        } else if meta.nlink() != 1 {
            Some(format!(
                "it has {} hard links (a build tree's `deps/` copy?): install it, e.g. with \
                 `cargo install`",
                meta.nlink()
            ))
        } else if meta.uid() != euid && meta.uid() != 0 {
            Some(format!(
                "owned by uid {}, neither this user nor root",
                meta.uid()
            ))
        } else {
            None
        };
        if let Some(why) = refused {
            return skip(why);
        }
        let origin = std::fs::canonicalize(path).ok();
        // Kept open (close-on-exec) for the life of the process: the path names it.
        let fd: &'static OwnedFd = Box::leak(Box::new(OwnedFd::from(file)));
        Some(Self {
            program: format!("/proc/self/fd/{}", fd.as_raw_fd()).into(),
            origin,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn held_open(_path: &Path) -> Option<Self> {
        None
    }

    /// The program.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The launcher's file as people know it, for messages: its own path when it is held open
    /// (the program is then `/proc/self/fd/N`), else the program.
    pub fn shown(&self) -> &Path {
        self.origin.as_deref().unwrap_or(&self.program)
    }

    /// The files a confined command must not replace when they lie in its workspace: the
    /// running program (`/proc/self/exe`), this launcher's own file, and the file
    /// [`Launcher::beside_this_program`] looked for, whether it found a launcher there or not.
    /// A command that could swap or plant one would run its code outside the sandbox the next
    /// time keel starts one (keel runs the launcher from the directory of its own executable).
    /// Canonical paths.
    pub(super) fn own_files(&self) -> Vec<PathBuf> {
        // Resolved once: every sandboxed call asks, and the running program's path does not
        // change while it runs.
        static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
        let exe = EXE.get_or_init(|| {
            std::fs::read_link("/proc/self/exe")
                .ok()
                .and_then(|exe| std::fs::canonicalize(exe).ok())
        });
        let mut files: Vec<PathBuf> = exe.iter().cloned().collect();
        if let Some(origin) = self.origin.as_ref().filter(|o| !files.contains(o)) {
            files.push(origin.clone());
        }
        if let Some(looked) = LOOKED_FOR.get().filter(|l| !files.contains(l)) {
            files.push(looked.clone());
        }
        files
    }
}

/// Where [`Launcher::beside_this_program`] looked for the launcher (canonical directory): a
/// file of keel's own even when it is missing or refused, since the next keel to start would
/// run what a confined command planted there ([`Launcher::own_files`]).
static LOOKED_FOR: OnceLock<PathBuf> = OnceLock::new();

pub(super) static DEFAULT_LAUNCHER: OnceLock<Launcher> = OnceLock::new();

/// Why [`Launcher::beside_this_program`] did not use the file it looked at (`PATH: why`), told
/// once in the log at the first confined command ([`log_skipped_launcher`]): at start-up the
/// log is not set up yet.
static SKIPPED: OnceLock<String> = OnceLock::new();

/// Logs (info) why the launcher beside the program was not used, once per process, if it was
/// not.
pub(super) fn log_skipped_launcher() {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    if let Some(why) = SKIPPED.get() {
        LOGGED.call_once(|| {
            tracing::info!(
                launcher = %why,
                "the sandbox launcher beside this program is not used; the program runs itself \
                 as the launcher instead (~1 ms more a launcher start)"
            );
        });
    }
}

/// Registers the launcher every [`Sandbox`] of this process uses unless it was given its own
/// ([`Sandbox::with_launcher`]). The first registration wins; returns whether this one did.
/// The `keel` binary registers itself ([`Launcher::this_program`]) at startup.
pub fn set_launcher(launcher: Launcher) -> bool {
    DEFAULT_LAUNCHER.set(launcher).is_ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::Launcher;

    /// Only an executable regular file writable by its owner alone (owned by this user or
    /// root) is taken as the launcher; a FIFO of that name does not block (attacker review:
    /// every `keel` command hung at start-up on one).
    #[test]
    fn only_a_trusted_executable_file_is_taken_as_the_launcher() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/true\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let good = file("good", 0o755);
        let held = Launcher::held_open(&good).expect("an executable file of this user");
        assert!(held.program().starts_with("/proc/self/fd/"), "{held:?}");
        assert_eq!(
            std::fs::read_link(held.program()).unwrap(),
            std::fs::canonicalize(&good).unwrap()
        );
        for bad in [
            file("plain", 0o644),
            file("group_writable", 0o775),
            file("world_writable", 0o757),
        ] {
            assert!(Launcher::held_open(&bad).is_none(), "{}", bad.display());
        }
        assert!(Launcher::held_open(dir.path()).is_none(), "a directory");
        assert!(Launcher::held_open(&dir.path().join("missing")).is_none());
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o755),
            0,
        )
        .unwrap();
        assert!(
            Launcher::held_open(&fifo).is_none(),
            "a FIFO, without blocking"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(
            Launcher::held_open(&link).is_some(),
            "a symlink to a good file"
        );
        // A second name (cargo's `deps/` copy is a hard link) could be changed where the
        // sandbox does not cover it: refused while it exists.
        let second = dir.path().join("second-name");
        std::fs::hard_link(&good, &second).unwrap();
        assert!(Launcher::held_open(&good).is_none(), "two hard links");
        std::fs::remove_file(&second).unwrap();
        assert!(Launcher::held_open(&good).is_some(), "one again");
    }
}
