//! The environment of a tool's process: which of keel's variables it gets (secret-looking
//! names are dropped unless passed, withheld names too, the config's `[env]` values set), and
//! where a program named without a path is found on that environment's `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether a variable name looks like a secret: it contains `KEY`, `SECRET`, `TOKEN` or
/// `PASSWORD` (any case). Such variables are dropped from every tool's environment unless passed
/// explicitly.
pub fn is_secret_env_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "SECRET", "TOKEN", "PASSWORD"]
        .iter()
        .any(|word| upper.contains(word))
}

/// Explicit environment settings of tool processes (see the module docs).
#[derive(Debug, Default, Clone)]
pub(super) struct EnvPolicy {
    pub(super) withheld: Vec<String>,
    pub(super) passed: Vec<String>,
    pub(super) set: Vec<(String, String)>,
    /// The environment these settings give a command ([`super::Sandbox::command_env`]), computed at
    /// the first command: keel never changes its own environment while it runs. Reset by every
    /// builder method that changes a setting.
    pub(super) computed: std::sync::OnceLock<Arc<CommandEnv>>,
}

/// A command's environment, and the programs found on its `PATH` so far.
#[derive(Debug)]
pub(super) struct CommandEnv {
    pub(super) vars: Vec<(OsString, OsString)>,
    /// Program name → where [`on_path`] found it. A hit is checked again (still a file, still
    /// executable) before each use and searched for anew when it is not; a program put earlier
    /// on `PATH` later is not seen while the found one stays (as bash's own command hash).
    pub(super) found: std::sync::Mutex<std::collections::HashMap<String, PathBuf>>,
}

impl CommandEnv {
    /// Where `program` is on this environment's `PATH` ([`on_path`]), from the found programs
    /// when the one found last is still an executable file.
    pub(super) fn program(&self, program: &str) -> PathBuf {
        let mut found = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(path) = found.get(program)
            && is_executable_file(path)
        {
            return path.clone();
        }
        let path = on_path(program, &self.vars);
        if path.is_absolute() {
            found.insert(program.to_owned(), path.clone());
        }
        path
    }
}

/// Whether `path` is a regular file (after links) this process may execute.
fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
        && rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok()
}

/// `program` found on the `PATH` of `env` (the child's environment) when it is a bare name:
/// the standard library starts a child with `posix_spawn` only for a program given as a path
/// when the child's environment sets `PATH` (it searches that `PATH` itself after a `fork`
/// otherwise). The first regular file this process may execute (`access(X_OK)`: a file whose
/// execute bits exclude the caller, as a sandboxed command without capabilities, is passed
/// over as `execvp` passes over `EACCES`) wins; a name found nowhere or after a relative
/// `PATH` entry, or an environment without `PATH`, is left as it is (the standard library then
/// searches, or reports it missing, as before).
pub(super) fn on_path(program: &str, env: &[(OsString, OsString)]) -> PathBuf {
    if program.contains('/') || program.is_empty() {
        return PathBuf::from(program);
    }
    let Some((_, path)) = env.iter().rev().find(|(name, _)| name == "PATH") else {
        return PathBuf::from(program);
    };
    for dir in std::env::split_paths(path) {
        if !dir.is_absolute() {
            // Relative to the child's working directory: left to the standard library's search.
            break;
        }
        let candidate = dir.join(program);
        if is_executable_file(&candidate) {
            return candidate;
        }
    }
    PathBuf::from(program)
}
