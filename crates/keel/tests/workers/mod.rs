//! Workers as separate processes (issue 13, "Done when"): an API-only `keel serve --workers 0`
//! and `keel worker` processes sharing one PostgreSQL schema (a fresh one per test), driven
//! through the HTTP API with scripted models whose `shell` calls append to files in a shared
//! workspace. The store's rows (lease owners, effects, schema versions) are read and changed
//! with SQL where the API has no view of them.
//!
//! Deadlines are correctness bounds with wide margins; the measured figures (takeover time,
//! cancel latency, drain time) are printed with `eprintln!` (`--nocapture` shows them).

mod approval;
mod cancel;
mod drain;
mod kill;
mod newer_schema;
mod restart;
mod takeover;

use std::time::{Duration, Instant, SystemTime};

use keel_runtime::lease::LeaseOwner;
use serde_json::{Value, json};
use sqlx::Row;

use crate::common::{Env, Running};
use crate::postgres::Schema;
use crate::remote::{Options, Served, serve_with};

/// `[scheduler] lease_ttl_ms` of these tests: a dead worker's sessions move on after 3 s.
pub(super) const LEASE_TTL_MS: u64 = 3000;
/// `[scheduler] poll_ms` of these tests.
pub(super) const POLL_MS: u64 = 200;

/// An API node on a store, a client of it with the admin key of tenant `acme`, and (on
/// PostgreSQL) a connection pool in the store's schema. Workers are started with
/// [`Cluster::worker`].
pub(super) struct Cluster {
    pub(super) api: Served,
    pub(super) client: keel_client::Client,
    db: Option<sqlx::PgPool>,
    rt: tokio::runtime::Runtime,
    /// The environment: `ws/` is the workspace every session shares, `scripts/` the scripts.
    pub(super) env: Env,
    /// Kept for its drop (the schema is dropped after everything else).
    _schema: Option<Schema>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(db) = self.db.take() {
            self.rt.block_on(db.close());
        }
    }
}

/// The `[server]` and `[scheduler]` lines of every node (API and workers read the same
/// server.toml).
fn settings(lease_ttl_ms: u64) -> String {
    format!(
        "max_permission_mode = \"bypass\"\n\n[scheduler]\nlease_ttl_ms = {lease_ttl_ms}\npoll_ms = {POLL_MS}\n"
    )
}

impl Cluster {
    /// An API-only node (`keel serve --workers 0`) on a fresh PostgreSQL schema.
    pub(super) fn postgres() -> Self {
        Self::postgres_with_ttl(LEASE_TTL_MS)
    }

    /// As [`Cluster::postgres`] with leases of `lease_ttl_ms`.
    pub(super) fn postgres_with_ttl(lease_ttl_ms: u64) -> Self {
        Self::postgres_on(Schema::new(), lease_ttl_ms)
    }

    /// As [`Cluster::postgres_with_ttl`] in `schema` (e.g. on a server of the test's own).
    pub(super) fn postgres_on(schema: Schema, lease_ttl_ms: u64) -> Self {
        let env = Env::new();
        let url = schema.url();
        let api = serve_with(
            &env,
            &Options {
                store: Some(&url),
                server_toml: &settings(lease_ttl_ms),
                args: &["--workers", "0"],
                ..Options::default()
            },
        );
        let rt = runtime();
        let db = Some(rt.block_on(schema.pool()));
        Self::assemble(api, env, rt, db, Some(schema))
    }

    /// `keel serve` with its in-process workers (`[scheduler] workers`, default 2) on `env`'s
    /// SQLite store.
    pub(super) fn sqlite() -> Self {
        Self::sqlite_with_ttl(LEASE_TTL_MS)
    }

    /// As [`Cluster::sqlite`] with leases of `lease_ttl_ms`.
    pub(super) fn sqlite_with_ttl(lease_ttl_ms: u64) -> Self {
        let env = Env::new();
        let api = serve_with(
            &env,
            &Options {
                server_toml: &settings(lease_ttl_ms),
                ..Options::default()
            },
        );
        Self::assemble(api, env, runtime(), None, None)
    }

    fn assemble(
        api: Served,
        env: Env,
        rt: tokio::runtime::Runtime,
        db: Option<sqlx::PgPool>,
        schema: Option<Schema>,
    ) -> Self {
        let client = keel_client::Client::new(&api.url, Some(&api.key)).unwrap();
        Cluster {
            api,
            client,
            db,
            rt,
            env,
            _schema: schema,
        }
    }

    /// Runs `f` to completion on the test's runtime.
    pub(super) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Points the client at the API again (after [`Served::restart`] moved it).
    pub(super) fn reconnect(&mut self) {
        self.client = keel_client::Client::new(&self.api.url, Some(&self.api.key)).unwrap();
    }

    /// Starts `keel worker ARGS` on the cluster's store, with /metrics and /readyz on a free
    /// port and the scheduler's info lines (claims taken over, drains) on standard error.
    pub(super) fn worker(&self, args: &[&str]) -> Worker {
        self.worker_with_env(args, &[])
    }

    /// [`Cluster::worker`] with the environment variables `vars` set (e.g. `OTEL_*`).
    pub(super) fn worker_with_env(&self, args: &[&str], vars: &[(&str, String)]) -> Worker {
        let mut cmd = self.env.keel();
        cmd.args(["worker", "--metrics-listen", "127.0.0.1:0"])
            .args(args)
            .env("KEEL_LOG", "warn,keel_runtime::scheduler=info")
            .envs(vars.iter().map(|(k, v)| (k, v)));
        let run = Running::start(cmd);
        let line = run.wait_for_stderr("metrics on http://", 60);
        let metrics = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Worker { run, metrics }
    }

    /// A session on a release of its own running `lines` (the script `scripts/NAME.jsonl`,
    /// `shell` allowed unasked), in the shared workspace, with a turn queued; returns the
    /// session id.
    pub(super) fn start_turn(&self, name: &str, lines: &[Value]) -> String {
        self.start_turns(&[(name.to_owned(), lines.to_vec())])
            .pop()
            .unwrap()
    }

    /// [`Cluster::start_turn`] for each `(name, lines)`, 16 at a time; the session ids in
    /// order.
    pub(super) fn start_turns(&self, scripts: &[(String, Vec<Value>)]) -> Vec<String> {
        self.start_turns_with(scripts, &json!({"allow": ["shell"]}))
    }

    /// [`Cluster::start_turns`] with the releases' `policy` (`{}`: `shell` asks a human).
    pub(super) fn start_turns_with(
        &self,
        scripts: &[(String, Vec<Value>)],
        policy: &Value,
    ) -> Vec<String> {
        let ws = self.env.ws().display().to_string();
        let jobs: Vec<(String, String)> = scripts
            .iter()
            .map(|(name, lines)| {
                let text: Vec<String> = lines.iter().map(Value::to_string).collect();
                let rel = format!("scripts/{name}.jsonl");
                self.env.write(&rel, &(text.join("\n") + "\n"));
                (name.clone(), self.env.path(&rel).display().to_string())
            })
            .collect();
        self.block_on(async {
            let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
            let mut tasks = tokio::task::JoinSet::new();
            for (i, (name, path)) in jobs.into_iter().enumerate() {
                let (client, ws, slots) = (self.client.clone(), ws.clone(), slots.clone());
                let policy = policy.clone();
                tasks.spawn(async move {
                    let _slot = slots.acquire_owned().await.unwrap();
                    (i, start_turn(&client, &name, &path, &ws, &policy).await)
                });
            }
            let mut ids = vec![String::new(); scripts.len()];
            while let Some(r) = tasks.join_next().await {
                let (i, id) = r.unwrap();
                ids[i] = id;
            }
            ids
        })
    }

    /// `session`'s journal (through the API).
    pub(super) fn events(&self, session: &str) -> Vec<Value> {
        self.block_on(self.client.events(session, 0)).unwrap()
    }

    /// The `turn.finished` events of `session`.
    pub(super) fn finished_turns(&self, session: &str) -> Vec<Value> {
        self.events(session)
            .into_iter()
            .filter(|e| e["type"] == "turn.finished")
            .collect()
    }

    /// Waits (≤ 60 s) until `session`'s turn ends; asserts it ended once, `completed`, and
    /// returns its `turn.finished`.
    pub(super) fn completed_turn(&self, session: &str) -> Value {
        let finished = wait(60, "the turn ends", || self.finished_turns(session).pop());
        assert_eq!(
            finished["payload"]["terminal_reason"], "completed",
            "{finished}"
        );
        assert_eq!(
            self.finished_turns(session).len(),
            1,
            "one turn, ended once"
        );
        finished
    }

    /// The statuses of `session`'s effects, oldest first.
    pub(super) fn effect_statuses(&self, session: &str) -> Vec<String> {
        self.block_on(self.client.list_effects(session, None))
            .unwrap()
            .into_iter()
            .map(|e| e.status)
            .collect()
    }

    /// The store's pool (PostgreSQL clusters only).
    fn db(&self) -> &sqlx::PgPool {
        self.db.as_ref().expect("a PostgreSQL cluster")
    }

    /// Runs `sql` (a statement of the test's own making) in the store's schema; returns the
    /// rows it changed.
    pub(super) fn execute(&self, sql: &str) -> u64 {
        self.block_on(sqlx::query(sql).execute(self.db()))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    /// The rows of `sql` in the store's schema, every column read as text (cast in the query).
    pub(super) fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let rows = self
            .block_on(sqlx::query(sql).fetch_all(self.db()))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| (0..r.len()).map(|i| r.try_get(i).unwrap()).collect())
            .collect()
    }

    /// As [`Cluster::rows`], but an error (the server down, a broken connection) is no rows.
    pub(super) fn try_rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.block_on(sqlx::query(sql).fetch_all(self.db()))
            .map(|rows| {
                rows.iter()
                    .map(|r| (0..r.len()).map(|i| r.try_get(i).unwrap()).collect())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The sessions whose lease `worker` holds now.
    pub(super) fn leased_by(&self, worker: &Worker) -> Vec<String> {
        self.rows("SELECT session_id, lease_owner FROM sessions WHERE lease_owner IS NOT NULL")
            .into_iter()
            .filter(|r| r[1].as_deref().is_some_and(|o| worker.owns(o)))
            .filter_map(|r| r[0].clone())
            .collect()
    }

    /// `session`'s lease owner now, if any.
    pub(super) fn lease_owner(&self, session: &str) -> Option<String> {
        self.rows(&format!(
            "SELECT lease_owner FROM sessions WHERE session_id = '{session}'"
        ))
        .pop()
        .and_then(|r| r[0].clone())
    }

    /// The lines of the workspace file `name` (none when it does not exist).
    pub(super) fn lines_of(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.env.ws().join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Stores a release named `name` on the script at `path` with `policy`, a session of it in the
/// workspace `ws` and a turn; returns the session id.
async fn start_turn(
    client: &keel_client::Client,
    name: &str,
    path: &str,
    ws: &str,
    policy: &Value,
) -> String {
    let release: Value = client
        .post_json(
            "/v1/releases",
            &json!({
                "name": name,
                "model_route": [format!("script:{path}")],
                "instructions": "You are a test agent.",
                "tools": ["shell"],
                "policy": policy,
            }),
        )
        .await
        .unwrap();
    let session: Value = client
        .post_json(
            "/v1/sessions",
            &json!({"release_id": release["release_id"], "workspace": ws}),
        )
        .await
        .unwrap();
    let id = session["session_id"].as_str().unwrap().to_owned();
    client.submit_turn(&id, "do the task").await.unwrap();
    id
}

/// A current-thread runtime for the client and the pool.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A `keel worker` process: standard error collected, /metrics and /readyz at `metrics`.
pub(super) struct Worker {
    pub(super) run: Running,
    /// `HOST:PORT` of its /metrics, /healthz and /readyz.
    pub(super) metrics: String,
}

impl Worker {
    /// The process id.
    pub(super) fn pid(&self) -> u32 {
        self.run.child.id()
    }

    /// Whether `owner` (a lease owner string, `<name>@<host>:<pid>/pidns:<inode>`, parsed by
    /// [`LeaseOwner::parse`]) is one of this process's workers: its pid on this host, in the
    /// test's PID namespace (which the workers it starts share).
    pub(super) fn owns(&self, owner: &str) -> bool {
        LeaseOwner::parse(owner).is_some_and(|o| o.is_local_process(self.pid()))
    }

    /// The HTTP status of `GET PATH` on its metrics listener (`None`: not answering).
    pub(super) fn probe(&self, path: &str) -> Option<u16> {
        http_status(&self.metrics, path)
    }

    /// `GET /metrics`.
    pub(super) fn metrics_text(&self) -> String {
        crate::serve::http_get(&self.metrics, "/metrics", None)
    }

    /// Kills it with SIGKILL and waits until it is gone.
    pub(super) fn kill_9(&mut self) {
        self.run.child.kill().unwrap();
        self.run.child.wait().unwrap();
    }
}

/// The status of `GET PATH` at `addr` (`None` when nothing answers).
fn http_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `f` every 50 ms until it gives a value; panics naming `what` after `secs` seconds.
pub(super) fn wait<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of field `name` in a log line of a worker (`… name=value …`, quotes removed).
pub(super) fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim_matches('"'))
}

/// A `shell` call of a scripted response.
pub(super) fn shell(command: &str) -> Value {
    json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]})
}

/// A scripted response that arrives after `ms` milliseconds.
pub(super) fn delayed(ms: u64, mut response: Value) -> Value {
    response["delay_ms"] = ms.into();
    response
}

/// Milliseconds since the Unix epoch of a time.
pub(super) fn unix_ms(t: SystemTime) -> i64 {
    i64::try_from(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Milliseconds since the Unix epoch of an event's `ts`.
pub(super) fn event_ms(event: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(event["ts"].as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// The processes whose command line holds `marker` (a test's unique `sleep` duration), e.g.
/// a shell command a worker runs.
pub(super) fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

/// Waits (≤ 60 s) until a process whose command line holds `marker` runs.
pub(super) fn wait_for_process(marker: &str) {
    wait(60, &format!("a process with {marker:?} runs"), || {
        (!processes_with(marker).is_empty()).then_some(())
    });
}

/// The median and maximum of measured durations (ms).
pub(super) fn median_max(mut ms: Vec<i64>) -> (i64, i64) {
    ms.sort_unstable();
    (ms[ms.len() / 2], ms[ms.len() - 1])
}
