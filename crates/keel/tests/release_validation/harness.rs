//! What the scenarios share: the two backends, a fresh store of either (a SQLite file in a
//! temporary directory, or a fresh PostgreSQL schema of `KEEL_TEST_DATABASE_URL` through
//! [`crate::postgres::Schema`], dropped afterwards), the macro that runs one scenario body per
//! backend, and the runtime fixtures (release, session settings, scripted model).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentDefinition, Budget, Release};
use keel_model::{ModelClient, Script, ScriptedModel};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_store::Store;
use keel_tools::ToolRegistry;
use keel_tools::policy::PermissionMode;
use serde_json::Value;

use crate::postgres::Schema;

/// The store a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file (the embedded default).
    Sqlite,
    /// A PostgreSQL schema (the shared store of many workers).
    Postgres,
}

/// A fresh, empty store location; the directory or schema goes with it.
pub struct FreshStore {
    /// What `keel --store` and [`keel_store::open`] take.
    pub location: String,
    /// Kept for its drop: the SQLite file's directory.
    _dir: Option<tempfile::TempDir>,
    /// Kept for its drop: the PostgreSQL schema.
    _schema: Option<Schema>,
}

impl FreshStore {
    /// A new location on `backend` (nothing is created until the first [`FreshStore::open`]).
    pub fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let location = format!("sqlite://{}", dir.path().join("keel.db").display());
                FreshStore {
                    location,
                    _dir: Some(dir),
                    _schema: None,
                }
            }
            Backend::Postgres => {
                let schema = Schema::new();
                FreshStore {
                    location: schema.url(),
                    _dir: None,
                    _schema: Some(schema),
                }
            }
        }
    }

    /// Opens a handle on the store (migrating it the first time). Each call is another handle,
    /// as another process would open it.
    pub async fn open(&self) -> Arc<dyn Store> {
        keel_store::open(&self.location)
            .await
            .unwrap_or_else(|e| panic!("opening {} (KEEL_TEST_DATABASE_URL?): {e}", self.location))
    }
}

/// Generates `pub mod sqlite` and `pub mod postgres`, each with one test per scenario body:
/// `tokio NAME` runs `async fn NAME(Backend)` on a multi-threaded runtime, `thread NAME` runs
/// `fn NAME(Backend)` (bodies that drive `keel` processes and block).
macro_rules! on_both {
    ($($kind:ident $name:ident),+ $(,)?) => {
        pub mod sqlite {
            $( $crate::release_validation::harness::one_test!($kind $name Sqlite); )+
        }
        pub mod postgres {
            $( $crate::release_validation::harness::one_test!($kind $name Postgres); )+
        }
    };
}
pub(crate) use on_both;

/// One test of [`on_both`].
macro_rules! one_test {
    (tokio $name:ident $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            super::$name($crate::release_validation::harness::Backend::$backend).await
        }
    };
    (thread $name:ident $backend:ident) => {
        #[test]
        fn $name() {
            super::$name($crate::release_validation::harness::Backend::$backend)
        }
    };
}
pub(crate) use one_test;

/// A release named `name` on the scripted model offering `tools`, with no policy and no budget.
pub fn release(name: &str, tools: &[&str]) -> Release {
    release_with(name, tools, Budget::default())
}

/// A release named `name` on the scripted model offering `tools` (empty: every registered
/// tool), with no policy and `budget`.
pub fn release_with(name: &str, tools: &[&str], budget: Budget) -> Release {
    Release::new(AgentDefinition {
        name: name.into(),
        model_route: vec!["scripted".into()],
        instructions: "You are a test agent.".into(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        policy: Value::Null,
        budget,
        mcp_servers: Default::default(),
        agents: Default::default(),
    })
}

/// Session settings in workspace `ws`: `bypass` (nothing asks) and no sandbox.
pub fn config(ws: &Path) -> SessionConfig {
    SessionConfig {
        workspace: ws.to_path_buf(),
        permission_mode: PermissionMode::Bypass,
        sandbox: keel_tools::sandbox::SandboxMode::Off,
        ..SessionConfig::default()
    }
}

/// A scripted model answering with `lines` (the scripted format of docs/ARCHITECTURE.md).
pub fn scripted(lines: &[Value]) -> Arc<dyn ModelClient> {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    Arc::new(ScriptedModel::new(
        Script::parse("scenario.jsonl", &text.join("\n")).unwrap(),
    ))
}

/// A runtime ("worker") named `name` on `store` with `model` and `tools`, sharing the
/// deployment key every runtime of a scenario shares; leases of 30 s (their heartbeats never
/// fall inside a scenario's windows).
pub fn runtime(
    store: Arc<dyn Store>,
    name: &str,
    model: Arc<dyn ModelClient>,
    tools: ToolRegistry,
) -> Runtime {
    let base = RuntimeOptions {
        worker_name: name.into(),
        ..RuntimeOptions::default()
    };
    Runtime::new(
        store,
        model,
        tools,
        options(Duration::from_secs(30), Duration::from_secs(10), base),
    )
}

/// What every runtime of a scenario shares: the deployment's seal key, and leases of
/// `lease_ttl` waited for up to `lease_wait`; the rest from `base`.
pub fn options(lease_ttl: Duration, lease_wait: Duration, base: RuntimeOptions) -> RuntimeOptions {
    RuntimeOptions {
        lease_ttl,
        lease_wait,
        seal_key: keel_runtime::seal::SealKey::from_bytes(&[7; keel_runtime::seal::KEY_BYTES]),
        ..base
    }
}

/// Polls `probe` every 10 ms until it gives a value; panics naming `what` after `secs`
/// seconds (a correctness deadline, ~10x what the scenario needs).
pub async fn poll<T, F, Fut>(secs: u64, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `f` on a handle of `fresh` with local session `session` (the tenant the `keel` CLI
/// writes), on a runtime of its own (for blocking scenario bodies).
fn with_local<T>(
    fresh: &FreshStore,
    session: &str,
    f: impl AsyncFnOnce(Arc<dyn Store>, keel_core::TenantId, keel_core::SessionId) -> T,
) -> T {
    let session: keel_core::SessionId = session.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = fresh.open().await;
        f(store, keel_core::TenantId::local(), session).await
    })
}

/// The journal of local session `session` in `fresh`, as JSON envelopes.
pub fn local_journal(fresh: &FreshStore, session: &str) -> Vec<Value> {
    with_local(fresh, session, async |store, tenant, session| {
        let events = store.read(tenant, session, 1, None).await.unwrap();
        events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    })
}

/// The transcript of local session `session` in `fresh`: `(role, content)` per item.
pub fn local_transcript(fresh: &FreshStore, session: &str) -> Vec<(String, Value)> {
    with_local(fresh, session, async |store, tenant, session| {
        let items = store.read_transcript(tenant, session, 0).await.unwrap();
        items.into_iter().map(|i| (i.role, i.content)).collect()
    })
}

/// Raw HTTP calls on a `keel serve` API (any method, path, body and headers), for what the
/// typed client does not send (`Idempotency-Key`, another tenant's key, no key).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// `http://HOST:PORT`.
    pub base: String,
    key: Option<String>,
}

impl Api {
    /// Calls on `base` with bearer `key` (`None`: no `Authorization` header).
    pub fn new(base: &str, key: Option<&str>) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Api {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: base.trim_end_matches('/').to_owned(),
            key: key.map(str::to_owned),
        }
    }

    /// `METHOD PATH` with a JSON `body` and extra `headers`; the status and the body as JSON
    /// (`Null` for an empty or non-JSON body; an event stream is not read).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let (status, _, answer) = self.call_headers(method, path, body, headers).await;
        (status, answer)
    }

    /// As [`Api::call`], with the response's headers.
    pub async fn call_headers(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut rb = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        if let Some(k) = &self.key {
            rb = rb.bearer_auth(k);
        }
        for (name, value) in headers {
            rb = rb.header(*name, *value);
        }
        if let Some(b) = body {
            rb = rb
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let res = rb
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = res.status().as_u16();
        let head = res.headers().clone();
        let sse = head
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
        if sse {
            return (status, head, Value::Null);
        }
        let bytes = res.bytes().await.unwrap();
        (
            status,
            head,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The text of `GET PATH` (any content type: `/metrics`); panics unless 200.
    pub async fn text(&self, path: &str) -> String {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(res.status().as_u16(), 200, "GET {path}");
        res.text().await.unwrap()
    }

    /// `call` expecting a 2xx; the body.
    pub async fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.call(method, path, body, &[]).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {answer}"
        );
        answer
    }
}

/// Writes `lines` as the script `NAME.jsonl` of `env` and creates a release `name` on it with
/// `tools` and `policy` through `api`; the release id.
pub async fn script_release(
    api: &Api,
    env: &crate::common::Env,
    name: &str,
    lines: &[Value],
    tools: &[&str],
    policy: Value,
) -> String {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    let rel = format!("{name}.jsonl");
    env.write(&rel, &(text.join("\n") + "\n"));
    let script = env.path(&rel).display().to_string();
    let release = api
        .ok(
            "POST",
            "/v1/releases",
            Some(&serde_json::json!({
                "name": name,
                "model_route": [format!("script:{script}")],
                "instructions": "You are a test agent.",
                "tools": tools,
                "policy": policy,
            })),
        )
        .await;
    release["release_id"].as_str().unwrap().to_owned()
}

/// A new session of `release` in `env`'s workspace, through `api`; its id.
pub async fn api_session(api: &Api, env: &crate::common::Env, release: &str) -> String {
    let session = api
        .ok(
            "POST",
            "/v1/sessions",
            Some(&serde_json::json!({
                "release_id": release,
                "workspace": env.ws().display().to_string(),
            })),
        )
        .await;
    session["session_id"].as_str().unwrap().to_owned()
}

/// Waits (≤ 60 s) until `session` has a pending approval (listed through `api`); the approval.
pub async fn pending_approval(api: &Api, session: &str) -> Value {
    poll(60, "the call waits on a human", || async {
        let page = api
            .ok("GET", &format!("/v1/sessions/{session}/approvals"), None)
            .await;
        page["items"]
            .as_array()
            .and_then(|items| items.iter().find(|a| a["status"] == "pending").cloned())
    })
    .await
}
