#![allow(dead_code)]
//! A started server over real HTTP (127.0.0.1, a free port) on a fresh store — SQLite in a
//! temp dir, or a fresh schema of `KEEL_TEST_DATABASE_URL` — with a system key, two tenants
//! and keys of every role, scripted models only, and a client for requests and SSE.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel_core::TenantId;
use keel_model::{ModelClient, ModelRoute, RetryPolicy, ScriptedModel};
use keel_runtime::RuntimeOptions;
use keel_server::auth::{KeySpec, create_key};
use keel_server::{Deps, ModelFactory, Server, ServerConfig};
use keel_store::{Role, SqlStore, Store};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sqlx::{AnyConnection, Connection, Executor};

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates `<name>::sqlite` and `<name>::postgres` from `async fn <name>(Backend)`.
#[macro_export]
macro_rules! on_both {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            }
        )+
    };
}

pub fn pg_url() -> String {
    std::env::var("KEEL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh store, dropped (PostgreSQL schema) with the guard.
pub struct Db {
    pub store: Arc<dyn Store>,
    pg: Option<(String, String)>,
    sqlite: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    /// Runs raw SQL on the database behind the store's back (rows an older or newer build
    /// would have written).
    pub async fn raw(&self, sql: &str) {
        sqlx::any::install_default_drivers();
        let mut conn = match (&self.sqlite, &self.pg) {
            (Some(path), _) => AnyConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap(),
            (None, Some((url, schema))) => {
                let mut c = AnyConnection::connect(url).await.unwrap();
                c.execute(format!("SET search_path TO \"{schema}\"").as_str())
                    .await
                    .unwrap();
                c
            }
            (None, None) => unreachable!("a Db is SQLite or PostgreSQL"),
        };
        conn.execute(sql).await.unwrap();
        conn.close().await.unwrap();
    }
}

pub async fn db(b: Backend) -> Db {
    match b {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("keel.db");
            let store = SqlStore::open_sqlite(&path).await.unwrap();
            Db {
                store: Arc::new(store),
                pg: None,
                sqlite: Some(path),
                _dir: Some(dir),
            }
        }
        Backend::Postgres => {
            let schema = format!(
                "keel_srv_{}_{}_{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed),
                &uuid::Uuid::now_v7().simple().to_string()[20..]
            );
            let url = pg_url();
            let store = SqlStore::connect_postgres(&url, Some(&schema))
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {url} (KEEL_TEST_DATABASE_URL): {e}"));
            Db {
                store: Arc::new(store),
                pg: Some((url, schema)),
                sqlite: None,
                _dir: None,
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some((url, schema)) = self.pg.take() {
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    sqlx::any::install_default_drivers();
                    if let Ok(mut c) = AnyConnection::connect(&url).await {
                        let _ = c
                            .execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
                            .await;
                        let _ = c.close().await;
                    }
                });
            })
            .join();
        }
    }
}

/// Serves `script:PATH` routes only (tests never reach a provider).
pub struct Scripts;

impl ModelFactory for Scripts {
    fn build(&self, route: &[String]) -> Result<Arc<dyn ModelClient>, String> {
        let models = route
            .iter()
            .map(|spec| {
                let path = spec.strip_prefix("script:").ok_or_else(|| {
                    format!("model {spec:?}: this server serves script:PATH only")
                })?;
                ScriptedModel::from_file(path)
                    .map(|m| Arc::new(m) as Arc<dyn ModelClient>)
                    .map_err(|e| format!("model {spec:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(
            ModelRoute::new(models, RetryPolicy::default()).map_err(|e| e.to_string())?,
        ))
    }
}

/// A started server with its fixtures.
pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Arc<dyn Store>,
    /// The workspace root (a temp dir) and a workspace under it.
    pub root: tempfile::TempDir,
    pub workspace: PathBuf,
    pub system: String,
    pub tenant: TenantId,
    pub admin: String,
    pub operator: String,
    pub viewer: String,
    /// An admin of another tenant.
    pub other: String,
    pub other_tenant: TenantId,
    /// `/metrics`'s address.
    pub metrics: Option<std::net::SocketAddr>,
    /// The settings the server was started with (for another node on the same store).
    pub config: ServerConfig,
    /// The runtimes' options the server was started with.
    pub runtime_options: RuntimeOptions,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub db: Db,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub async fn key(
    store: &Arc<dyn Store>,
    tenant: Option<TenantId>,
    name: &str,
    role: Role,
) -> String {
    create_key(
        store.as_ref(),
        &KeySpec {
            tenant,
            name: name.into(),
            role,
            expires_at: None,
        },
    )
    .await
    .unwrap()
    .0
}

/// What a node on `store` runs sessions with: scripted models, the built-in tools.
pub fn deps(store: Arc<dyn Store>, runtime_options: RuntimeOptions) -> Deps {
    Deps {
        store,
        models: Arc::new(Scripts),
        tools: Arc::new(keel_tools::ToolRegistry::with_builtins),
        runtime_options,
    }
}

pub async fn start(b: Backend) -> TestServer {
    start_with(b, |_| {}).await
}

pub async fn start_with(b: Backend, tune: impl FnOnce(&mut ServerConfig)) -> TestServer {
    start_with_options(b, tune, |_| {}).await
}

/// As [`start_with`], with the runtimes' options `tune_options`d too.
pub async fn start_with_options(
    b: Backend,
    tune: impl FnOnce(&mut ServerConfig),
    tune_options: impl FnOnce(&mut RuntimeOptions),
) -> TestServer {
    let db = db(b).await;
    let store = db.store.clone();
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("README.md"), "hello\n").unwrap();
    let mut config = ServerConfig {
        listen: "127.0.0.1:0".into(),
        metrics_listen: Some("127.0.0.1:0".into()),
        workspace_roots: vec![root.path().to_path_buf()],
        allow_script_models: true,
        ..ServerConfig::default()
    };
    // Also the runtimes' lease TTL (the server sets it from here).
    config.scheduler.lease_ttl_ms = 5_000;
    tune(&mut config);
    let mut runtime_options = RuntimeOptions {
        worker_name: "keel-server-test".into(),
        ..RuntimeOptions::default()
    };
    tune_options(&mut runtime_options);
    let server = Server::bind(config.clone(), deps(store.clone(), runtime_options.clone()))
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let metrics = server.metrics_addr();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .run(async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    let tenant = store.create_tenant("acme").await.unwrap().tenant_id;
    let other_tenant = store.create_tenant("globex").await.unwrap().tenant_id;
    let system = key(&store, None, "root", Role::System).await;
    let admin = key(&store, Some(tenant), "alice", Role::Admin).await;
    let operator = key(&store, Some(tenant), "olga", Role::Operator).await;
    let viewer = key(&store, Some(tenant), "victor", Role::Viewer).await;
    let other = key(&store, Some(other_tenant), "mallory", Role::Admin).await;
    TestServer {
        base: format!("http://{addr}"),
        http: reqwest::Client::builder().build().unwrap(),
        store,
        workspace,
        root,
        system,
        tenant,
        admin,
        operator,
        viewer,
        other,
        other_tenant,
        metrics,
        config,
        runtime_options,
        stop: Some(tx),
        task: Some(task),
        db,
    }
}

/// A response: status, headers, JSON body (`Null` when empty or not JSON).
#[derive(Debug)]
pub struct Res {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Res {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

impl TestServer {
    /// Sends a request with `key` (none: no Authorization) and `body` (JSON) plus headers.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Res {
        let mut rb = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        if let Some(b) = body {
            rb = rb
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let res = rb.send().await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Res {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str, key: &str) -> Res {
        self.call("GET", path, Some(key), None, &[]).await
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Res {
        self.call("POST", path, Some(key), Some(body), &[]).await
    }

    /// Writes a script and stores a release on it (as the admin); returns the release id.
    pub async fn release(&self, name: &str, lines: &[Value], tools: &[&str]) -> String {
        let path = self.root.path().join(format!("{name}.jsonl"));
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        std::fs::write(&path, text.join("\n")).unwrap();
        let r = self
            .post(
                "/v1/releases",
                &self.admin,
                &json!({
                    "name": name,
                    "model_route": [format!("script:{}", path.display())],
                    "instructions": "You are a test agent.",
                    "tools": tools,
                }),
            )
            .await;
        assert!(
            r.status == StatusCode::CREATED || r.status == StatusCode::OK,
            "{r:?}"
        );
        let id = r.body["release_id"].as_str().unwrap().to_owned();
        // Created and read, a release says when the tenant first stored it.
        let created = r.body["created_at"]
            .as_str()
            .expect("created_at")
            .to_owned();
        let read = self.get(&format!("/v1/releases/{id}"), &self.viewer).await;
        assert_eq!(read.body["created_at"], created.as_str(), "{read:?}");
        id
    }

    /// Creates a session on `release` in the test workspace (as the operator).
    pub async fn session(&self, release: &str, settings: Value) -> Res {
        self.post(
            "/v1/sessions",
            &self.operator,
            &json!({
                "release_id": release,
                "workspace": self.workspace.display().to_string(),
                "settings": settings,
            }),
        )
        .await
    }

    /// A new session of `release` that ran one turn on `input` until it went idle: its id.
    pub async fn run_to_idle(&self, release: &str, input: &str) -> String {
        let session = self.session(release, json!({})).await.body["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        self.post(
            &format!("/v1/sessions/{session}/turns"),
            &self.operator,
            &json!({"input": input}),
        )
        .await;
        self.wait_session(&session, |b| b["status"] == "idle").await;
        session
    }

    /// A new session whose first turn waits on the approval of a `write_file` call writing
    /// `file` (under the workspace); the model answers `wrote` after it. Returns the session id.
    pub async fn awaiting_approval(&self, file: &str) -> String {
        let write = call("write_file", json!({"path": file, "content": "late"}));
        let lines = [json!({"tool_calls": [write]}), json!({"text": "wrote"})];
        let release = self.release("awaiting", &lines, &["write_file"]).await;
        let session = self.session(&release, json!({})).await.body["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = self
            .post(
                &format!("/v1/sessions/{session}/turns"),
                &self.operator,
                &json!({"input": "write"}),
            )
            .await;
        assert!(r.status.is_success(), "{r:?}");
        self.wait_session(&session, |b| b["status"] == "requires_action")
            .await;
        session
    }

    /// Waits (≤ 20 s) until `cond` holds on the session's body.
    pub async fn wait_session(&self, session: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = self
                .get(&format!("/v1/sessions/{session}"), &self.viewer)
                .await;
            if cond(&r.body) {
                return r.body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session never reached the condition: {}",
                r.body
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Opens an SSE stream of `path` with `key`, resuming after `last_id`.
    pub async fn sse(&self, path: &str, key: &str, last_id: Option<u64>) -> Sse {
        let mut rb = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            rb = rb.header("last-event-id", id.to_string());
        }
        let res = rb.send().await.unwrap();
        Sse {
            status: res.status(),
            res: Some(res),
            buf: String::new(),
        }
    }
}

/// One SSE event as received.
#[derive(Debug, Clone, Default)]
pub struct SseFrame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// A client-side SSE stream.
pub struct Sse {
    pub status: StatusCode,
    res: Option<reqwest::Response>,
    buf: String,
}

impl Sse {
    /// The next event (comments and heartbeats skipped); `None` at the end or after 60 s (a
    /// correctness deadline, wide for loaded CI machines).
    pub async fn next(&mut self) -> Option<SseFrame> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let mut f = SseFrame::default();
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        f.id = Some(v.trim().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        f.event = Some(v.trim().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !f.data.is_empty() {
                            f.data.push('\n');
                        }
                        f.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    }
                }
                if any {
                    return Some(f);
                }
                continue;
            }
            let res = self.res.as_mut()?;
            let chunk = tokio::time::timeout_at(deadline, res.chunk()).await.ok()?;
            match chunk {
                Ok(Some(c)) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                _ => return None,
            }
        }
    }

    /// Reads raw bytes (comments included) until `pattern` appears (≤ 10 s).
    pub async fn raw_until(&mut self, pattern: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if self.buf.contains(pattern) {
                return true;
            }
            let Some(res) = self.res.as_mut() else {
                return false;
            };
            match tokio::time::timeout_at(deadline, res.chunk()).await {
                Ok(Ok(Some(c))) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                _ => return false,
            }
        }
    }

    /// A stream of a response opened elsewhere (with the inspector's cookie, say).
    pub fn of(res: reqwest::Response) -> Sse {
        Sse {
            status: res.status(),
            res: Some(res),
            buf: String::new(),
        }
    }

    /// Reads (and keeps) what comes until the server ends the stream: whether it did before
    /// `within` passed (a correctness deadline).
    pub async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let Some(res) = self.res.as_mut() else {
                return true;
            };
            match tokio::time::timeout_at(deadline, res.chunk()).await {
                Ok(Ok(Some(c))) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                Ok(_) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Drops the connection.
    pub fn close(&mut self) {
        self.res = None;
    }
}

/// A scripted call line.
pub fn call(name: &str, args: Value) -> Value {
    json!({"name": name, "arguments": args})
}

#[allow(dead_code)]
pub fn path_of(p: &Path) -> String {
    p.display().to_string()
}

/// The events of `session` of type `ty`, oldest first.
pub async fn events_of(s: &TestServer, session: &str, ty: &str) -> Vec<Value> {
    let r = s
        .get(
            &format!("/v1/sessions/{session}/events?limit=1000"),
            &s.viewer,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == ty)
        .cloned()
        .collect()
}
