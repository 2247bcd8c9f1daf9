//! The processes of the multi-process benches (`workers`): an API-only `keel serve --workers 0`
//! and `keel worker` processes on one PostgreSQL schema (`KEEL_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; a fresh schema per run, dropped at the end),
//! sessions created through the HTTP API, the store's rows read with SQL; and (`fanout`) a
//! `keel serve` with its own workers on SQLite.

// Each bench binary uses part of these helpers.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use keel_runtime::lease::LeaseOwner;
use serde_json::{Value, json};
use sqlx::Row;

/// `[scheduler] poll_ms` of the nodes.
pub const POLL_MS: u64 = 200;

/// A fresh PostgreSQL schema, dropped on drop.
pub struct Schema {
    base: String,
    name: String,
}

impl Schema {
    fn new() -> Self {
        let base = std::env::var("KEEL_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let name = format!("keel_bench_{}", uuid::Uuid::now_v7().simple());
        Schema { base, name }
    }

    fn url(&self) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}keel_schema={}", self.base, self.name)
    }

    async fn pool(&self) -> sqlx::PgPool {
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(&self.base)
            .unwrap()
            .options([("search_path", self.name.as_str())]);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            use sqlx::{Connection, Executor};
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut c) = sqlx::PgConnection::connect(&base).await {
                    let _ = c
                        .execute(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE").as_str())
                        .await;
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}

/// A child process, killed on drop; its standard error drained by a thread.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    /// Starts `cmd` with standard error piped; returns it and the first stderr line holding
    /// `marker` (waits ≤ 120 s).
    fn start(mut cmd: Command, marker: &'static str) -> (Self, String) {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = seen.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains(marker)
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(line);
                } else if tx.is_some() {
                    lines.lock().unwrap().push(line);
                } else if line.contains("ERROR") || line.contains("WARN") {
                    // What the process logs as a fault later is shown (a 500 says "it is logged").
                    eprintln!("[{marker}] {line}");
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| {
                panic!(
                    "no {marker:?} line on the process's standard error; it said: {:?}; exit: {:?}",
                    seen.lock().unwrap(),
                    child.try_wait()
                )
            });
        (Proc { child }, line)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then waits until it is gone.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// An API node on a fresh schema, its client, a pool in the schema, and the directory the
/// processes share (`HOME`, configuration, `ws/` the workspace, `scripts/`).
pub struct Cluster {
    pub client: keel_client::Client,
    pub rt: tokio::runtime::Runtime,
    db: Option<sqlx::PgPool>,
    /// The API node.
    pub api: Proc,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// An admin key of tenant `acme`.
    pub key: String,
    dir: tempfile::TempDir,
    _schema: Option<Schema>,
}

impl Cluster {
    /// `keel serve --workers 0` with leases of `lease_ttl_ms` on a fresh schema.
    pub fn postgres(lease_ttl_ms: u64) -> Self {
        let schema = Schema::new();
        let url = schema.url();
        Self::serve(
            Some((schema, url)),
            lease_ttl_ms,
            "",
            "",
            &["--workers", "0"],
        )
    }

    /// `keel serve ARGS` on `store` (a fresh PostgreSQL schema and its URL; `None`: a SQLite
    /// file in the directory) with `server` lines added to `[server]` and `keel_toml` to the
    /// user's keel.toml; no tenant limit on sessions running at once.
    pub fn serve(
        store: Option<(Schema, String)>,
        lease_ttl_ms: u64,
        server: &str,
        keel_toml: &str,
        args: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
        write(
            &dir.path().join("config/keel/server.toml"),
            &format!(
                "[server]\nworkspace_roots = [\"{}\"]\nallow_script_models = true\nmax_permission_mode = \"bypass\"\n{server}\n\
                 [scheduler]\nlease_ttl_ms = {lease_ttl_ms}\npoll_ms = {POLL_MS}\ntenant_max_sessions = 100000\ntenant_max_queued_turns = 100000\n",
                dir.path().display()
            ),
        );
        let store_line = store
            .as_ref()
            .map_or_else(String::new, |(_, url)| format!("store = {url:?}\n"));
        write(
            &dir.path().join("config/keel/keel.toml"),
            &format!("{store_line}{keel_toml}"),
        );
        let ok = |args: &[&str]| {
            let out = keel(dir.path()).args(args).output().unwrap();
            assert!(
                out.status.success(),
                "keel {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        ok(&["tenants", "create", "acme"]);
        let key = ok(&[
            "keys", "create", "--tenant", "acme", "--name", "bench", "--role", "admin",
        ]);
        let mut cmd = keel(dir.path());
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(args);
        let (api, line) = Proc::start(cmd, "listening on ");
        let url = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .to_owned();
        let client = keel_client::Client::new(&url, Some(&key)).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (db, schema) = match store {
            Some((schema, _)) => (Some(rt.block_on(schema.pool())), Some(schema)),
            None => (None, None),
        };
        Cluster {
            client,
            rt,
            db,
            api,
            url,
            key,
            dir,
            _schema: schema,
        }
    }

    /// The shared workspace.
    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// Starts `keel worker --concurrency C` on the store; returns once it serves /metrics.
    pub fn worker(&self, concurrency: usize) -> Proc {
        let mut cmd = keel(self.dir.path());
        cmd.args(["worker", "--metrics-listen", "127.0.0.1:0", "--concurrency"])
            .arg(concurrency.to_string())
            .env("KEEL_LOG", "warn");
        Proc::start(cmd, "metrics on http://").0
    }

    /// One release running `lines` (a script) with `tools` allowed unasked; then `n`
    /// sessions of it in the shared workspace, each with a turn queued, 16 requests at a
    /// time. Returns the session ids.
    pub fn sessions(&self, name: &str, lines: &[Value], tools: &[&str], n: usize) -> Vec<String> {
        let script = self.script(name, lines);
        self.sessions_of(
            name,
            &format!("script:{}", script.display()),
            tools,
            n,
            true,
        )
    }

    /// Writes the script `scripts/NAME.jsonl` (over an earlier one: a process that loads it
    /// after this reads the new lines); returns its path.
    pub fn script(&self, name: &str, lines: &[Value]) -> PathBuf {
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        let script = self.dir.path().join(format!("scripts/{name}.jsonl"));
        write(&script, &(text.join("\n") + "\n"));
        script
    }

    /// `n` sessions of a new release named `name` on the model `route`, with a turn queued
    /// when `submit`.
    pub fn sessions_of(
        &self,
        name: &str,
        route: &str,
        tools: &[&str],
        n: usize,
        submit: bool,
    ) -> Vec<String> {
        let ws = self.ws().display().to_string();
        self.rt.block_on(async {
            let release: Value = self
                .client
                .post_json(
                    "/v1/releases",
                    &json!({
                        "name": name,
                        "model_route": [route],
                        "instructions": "You are a bench agent.",
                        "tools": tools,
                        "policy": {"allow": tools},
                    }),
                )
                .await
                .unwrap();
            let release = release["release_id"].clone();
            let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..n {
                let (client, ws, slots, release) = (
                    self.client.clone(),
                    ws.clone(),
                    slots.clone(),
                    release.clone(),
                );
                tasks.spawn(async move {
                    let _slot = slots.acquire_owned().await.unwrap();
                    let session: Value = client
                        .post_json(
                            "/v1/sessions",
                            &json!({"release_id": release, "workspace": ws}),
                        )
                        .await
                        .unwrap();
                    let id = session["session_id"].as_str().unwrap().to_owned();
                    if submit {
                        client.submit_turn(&id, "do the task").await.unwrap();
                    }
                    id
                });
            }
            let mut ids = Vec::new();
            while let Some(r) = tasks.join_next().await {
                ids.push(r.unwrap());
            }
            ids
        })
    }

    /// The rows of `sql`, every column read as text (cast in the query).
    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let rows = self
            .rt
            .block_on(sqlx::query(sql).fetch_all(self.db.as_ref().expect("PostgreSQL")))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| (0..r.len()).map(|i| r.try_get(i).unwrap()).collect())
            .collect()
    }

    /// The single number `sql` selects (as text).
    pub fn count(&self, sql: &str) -> u64 {
        self.rows(sql)[0][0]
            .as_deref()
            .unwrap_or("0")
            .parse()
            .unwrap()
    }

    /// The sessions whose lease process `pid` holds now.
    pub fn leased_by(&self, pid: u32) -> Vec<String> {
        self.rows("SELECT session_id, lease_owner FROM sessions WHERE lease_owner IS NOT NULL")
            .into_iter()
            .filter(|r| {
                r[1].as_deref()
                    .and_then(LeaseOwner::parse)
                    .is_some_and(|o| o.is_local_process(pid))
            })
            .filter_map(|r| r[0].clone())
            .collect()
    }

    /// Sessions in status `idle` (their turn ended).
    pub fn idle(&self) -> u64 {
        self.count("SELECT count(*)::text FROM sessions WHERE status = 'idle'")
    }
}

/// `keel` with `dir` as its home and configuration: this build's binary, or `KEEL_BENCH_BIN`
/// when set (a copy of another build's, to compare builds side by side with one bench).
fn keel(dir: &Path) -> Command {
    let bin =
        std::env::var_os("KEEL_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_keel").into());
    let mut c = Command::new(bin);
    c.current_dir(dir)
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    c
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Polls `f` every 25 ms until it gives a value or `secs` pass (`None`).
pub fn poll<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A sized environment variable, or `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
