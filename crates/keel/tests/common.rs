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

    /// A `keel` command in this environment (cwd = the environment's root), standard input
    /// closed.
    pub fn keel(&self) -> Command {
        let mut c = self.keel_tty();
        c.stdin(std::process::Stdio::null());
        c
    }

    /// As [`Env::keel`] with standard streams inherited, for a pseudo-terminal.
    pub fn keel_tty(&self) -> Command {
        self.keel_at(std::path::Path::new(env!("CARGO_BIN_EXE_keel")))
    }

    /// As [`Env::keel_tty`] with the `keel` binary at `program` (a copy somewhere else).
    pub fn keel_at(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("RUST_BACKTRACE")
            // No span export unless a test asks for it.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_SERVICE_NAME")
            .env("TERM", "xterm");
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

/// Parses JSON lines; panics on a line that is not JSON (the stream must be pure JSONL).
pub fn jsonl_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// Checks the JSONL contract: every line has `type` and `session_id`, and exactly one
/// `result` line, the last. Returns the result line.
pub fn check_stream(lines: &[serde_json::Value]) -> serde_json::Value {
    let results = lines.iter().filter(|l| l["type"] == "result").count();
    assert_eq!(results, 1, "exactly one result line: {lines:#?}");
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "result", "the result line is last");
    for l in lines {
        assert!(
            l.get("type").is_some() && l.get("session_id").is_some(),
            "{l}"
        );
    }
    for key in [
        "terminal_reason",
        "usage",
        "cost_usd",
        "num_steps",
        "duration_ms",
    ] {
        assert!(last.get(key).is_some(), "result lacks {key}: {last}");
    }
    last.clone()
}

/// A `keel` process running in the background, its standard output read line by line.
pub struct Running {
    /// The process.
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    /// Every line of standard error so far, read by a thread (so a process that logs a lot
    /// never blocks on a full pipe).
    errors: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    /// Starts `cmd` with piped standard output and standard error.
    pub fn start(mut cmd: Command) -> Self {
        use std::io::BufRead;
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let errors = std::sync::Arc::<std::sync::Mutex<Vec<String>>>::default();
        let stderr = child.stderr.take().unwrap();
        let sink = errors.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
            errors,
        }
    }

    /// Every line of standard error so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Waits until a line of standard error contains `needle` (panics after `secs` seconds);
    /// returns it.
    pub fn wait_for_stderr(&self, needle: &str, secs: u64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(l) = self.stderr_lines().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no line with {needle:?} on standard error within {secs}s; saw:\n{}",
                self.stderr_lines().join("\n")
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Reads lines until one contains `needle` (panics after `secs` seconds); returns it.
    pub fn wait_for(&mut self, needle: &str, secs: u64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} within {secs}s; saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Sends a signal (`INT`, `KILL`, …) to the process.
    pub fn signal(&self, name: &str) {
        signal(&self.child, name);
    }

    /// Waits for the process to exit (panics after `secs`), reads the rest of its output and
    /// returns the exit code (`None` when killed by a signal) with every line.
    pub fn finish(mut self, secs: u64) -> (Option<i32>, Vec<String>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "keel did not exit within {secs}s; saw:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(std::time::Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (status.code(), std::mem::take(&mut self.seen))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends the signal `name` (`INT`, `TERM`, `KILL`, …) to `child`.
pub fn signal(child: &std::process::Child, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name}");
}

/// Parses collected lines as JSON.
pub fn parse_lines(lines: &[String]) -> Vec<serde_json::Value> {
    jsonl_lines(lines.join("\n").as_bytes())
}

/// Runs `keel run` headless in `env` with `script` (the scripted model's lines) and extra flags;
/// returns the exit code and the JSONL lines.
pub fn run_script(
    env: &Env,
    script: &str,
    flags: &[&str],
) -> (Option<i32>, Vec<serde_json::Value>) {
    env.write("script.jsonl", script);
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl"])
        .args(flags)
        .arg("do the task")
        .output()
        .unwrap();
    (out.status.code(), jsonl_lines(&out.stdout))
}

/// The user-config line trusting `env`'s workspace with its `keel.toml` (and agent and command
/// files) as they are now (what
/// `keel trust ws` writes): call it after writing the workspace file.
pub fn trusted_line(env: &Env) -> String {
    let ws = std::fs::canonicalize(env.ws()).unwrap();
    let bytes = std::fs::read(ws.join("keel.toml")).ok();
    let covered = keel_cli::trust::read_covered(&ws);
    let pin = keel_cli::trust::pin_of_workspace(bytes.as_deref(), &covered);
    format!(
        "trusted_workspaces = [{{ path = {:?}, keel_toml = {pin:?} }}]\n",
        ws.to_str().unwrap()
    )
}

/// Starts `keel serve` on free loopback ports of `env`'s store; returns the child and the API's
/// `HOST:PORT` (from its line on standard error that says so, after which standard error is
/// drained in a thread).
pub fn spawn_serve(env: &Env) -> (std::process::Child, String) {
    spawn_serve_with(env, &[])
}

/// As [`spawn_serve`], with more `keel serve` arguments (`--tls-cert FILE --tls-key FILE`).
pub fn spawn_serve_with(env: &Env, args: &[&str]) -> (std::process::Child, String) {
    let (child, addr, _) = spawn_serve_metrics(env, args);
    (child, addr)
}

/// As [`spawn_serve_with`]; also the `HOST:PORT` of its `/metrics` (the line after).
pub fn spawn_serve_metrics(env: &Env, args: &[&str]) -> (std::process::Child, String, String) {
    use std::io::BufRead;
    let mut child = env
        .keel()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // The first line holding `marker` (log lines, e.g. a slow-statement warning of a loaded
    // database, may come before it), and what follows `marker` in it.
    let mut after = |marker: &str| {
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(rest) = line.split(marker).nth(1) {
                return rest.to_owned();
            }
            seen.push(line);
        }
        panic!("keel serve ended without {marker:?}: {seen:#?}");
    };
    // "keel serve: listening on http(s)://HOST:PORT (store …)"
    let first = after("listening on ");
    let addr = first
        .split("://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    // "keel serve: metrics on http://HOST:PORT/metrics"
    let second = after("metrics on http://");
    let metrics = second
        .split('/')
        .next()
        .unwrap_or_else(|| panic!("no metrics address in {second:?}"))
        .to_owned();
    std::thread::spawn(move || for _ in lines {});
    (child, addr, metrics)
}
