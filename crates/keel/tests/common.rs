//! Helpers shared by the CLI tests: an isolated environment per test (own XDG config and data
//! directories, no provider keys), and running the `keel` binary in it.

use std::path::PathBuf;
use std::process::{Command, Output};

/// An isolated home for one test: `config/` and `data/` XDG directories and a workspace.
pub struct Env {
    /// Owns the directory.
    pub dir: tempfile::TempDir,
}

impl Env {
    /// A fresh environment with an empty workspace `ws/`.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::create_dir_all(dir.path().join("config/keel")).unwrap();
        Env { dir }
    }

    /// The workspace.
    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// A path inside the environment.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The store every command of this environment uses by default.
    pub fn store(&self) -> String {
        format!(
            "sqlite://{}",
            self.dir.path().join("data/keel/keel.db").display()
        )
    }

    /// A `keel` command in this environment (cwd = the environment's root).
    pub fn keel(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
        c.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("RUST_BACKTRACE")
            .stdin(std::process::Stdio::null());
        c
    }

    /// Runs `keel ARGS` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.keel().args(args).output().unwrap()
    }

    /// Writes a file relative to the environment root.
    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
