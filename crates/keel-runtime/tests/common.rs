//! Shared fixtures: stores, releases, scripted runtimes, test tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use keel_core::{AgentDefinition, Budget, Event, Release, SessionId, TenantId};
use keel_model::{ModelClient, Script, ScriptedModel};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_store::{SqlStore, Store};
use keel_tools::ToolRegistry;
use keel_tools::policy::PermissionMode;
use keel_tools::tool::{EffectClass, ReconcileOutcome, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};
use sqlx::{AnyConnection, Connection, Executor};

pub fn pg_url() -> String {
    std::env::var("KEEL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh store: SQLite in a temp dir or a fresh PostgreSQL schema (dropped on drop).
pub struct Db {
    pub store: Arc<dyn Store>,
    #[allow(dead_code)]
    pub location: String,
    pg: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    /// PostgreSQL: the server's URL and the store's schema; `None` on SQLite.
    #[allow(dead_code)]
    pub fn postgres(&self) -> Option<(&str, &str)> {
        self.pg.as_ref().map(|(u, s)| (u.as_str(), s.as_str()))
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub async fn db(backend: Backend) -> Db {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("keel.db");
            let store = SqlStore::open_sqlite(&path).await.unwrap();
            Db {
                store: Arc::new(store),
                location: format!("sqlite://{}", path.display()),
                pg: None,
                _dir: Some(dir),
            }
        }
        Backend::Postgres => {
            let schema = format!(
                "keel_rt_{}_{}_{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed),
                &uuid::Uuid::now_v7().simple().to_string()[20..]
            );
            let url = pg_url();
            let store = SqlStore::connect_postgres(&url, Some(&schema))
                .await
                .unwrap_or_else(|e| {
                    panic!("PostgreSQL at {url} (set KEEL_TEST_DATABASE_URL): {e}")
                });
            Db {
                store: Arc::new(store),
                location: format!("{url}?keel_schema={schema}"),
                pg: Some((url, schema)),
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

/// Generates `<name>::sqlite` and `<name>::postgres` tests from `async fn <name>(Backend)`.
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

pub fn release(tools: &[&str], budget: Budget) -> Release {
    Release::new(AgentDefinition {
        name: "tester".into(),
        model_route: vec!["scripted".into()],
        instructions: "You are a careful test agent.".into(),
        tools: tools.iter().map(|s| (*s).to_owned()).collect(),
        policy: Value::Null,
        budget,
        mcp_servers: Default::default(),
        agents: Default::default(),
    })
}

/// A workspace with a README.
pub fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "hello from the readme\n").unwrap();
    dir
}

pub fn config(ws: &Path) -> SessionConfig {
    SessionConfig {
        workspace: ws.to_path_buf(),
        permission_mode: PermissionMode::Bypass,
        sandbox: keel_tools::sandbox::SandboxMode::Off,
        ..SessionConfig::default()
    }
}

pub fn registry() -> ToolRegistry {
    let mut r = ToolRegistry::with_builtins().unwrap();
    r.register(Arc::new(CounterTool)).unwrap();
    r.register(Arc::new(SleepTool)).unwrap();
    r.register(Arc::new(SlowEffectTool)).unwrap();
    r.register(Arc::new(ChunksTool)).unwrap();
    r
}

pub fn scripted(lines: &[Value]) -> Arc<dyn ModelClient> {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    Arc::new(ScriptedModel::new(
        Script::parse("test.jsonl", &text.join("\n")).unwrap(),
    ))
}

/// The tests' deployment key: every runtime of a test (and its worker processes) shares it, as
/// the workers of one deployment share their seal key file.
pub fn deployment_key() -> keel_runtime::seal::SealKey {
    keel_runtime::seal::SealKey::from_bytes(&[7; keel_runtime::seal::KEY_BYTES])
}

pub fn runtime(db: &Db, model: Arc<dyn ModelClient>) -> Runtime {
    runtime_with(db, model, RuntimeOptions::default())
}

/// As [`runtime`], with the rest of the options from `base` (hooks, …).
pub fn runtime_with(db: &Db, model: Arc<dyn ModelClient>, base: RuntimeOptions) -> Runtime {
    Runtime::new(
        db.store.clone(),
        model,
        registry(),
        RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            seal_key: deployment_key(),
            ..base
        },
    )
}

/// A second store handle on the same database, as another process would open it.
pub async fn second_store(db: &Db) -> Arc<dyn Store> {
    match &db.pg {
        Some((url, schema)) => {
            Arc::new(SqlStore::connect_postgres(url, Some(schema)).await.unwrap())
        }
        None => {
            let path = db.location.trim_start_matches("sqlite://");
            Arc::new(SqlStore::open_sqlite(Path::new(path)).await.unwrap())
        }
    }
}

/// Another worker ("process") over a second store handle on the same database. It never
/// samples: its model has no lines.
pub async fn other_process(db: &Db) -> Runtime {
    Runtime::new(
        second_store(db).await,
        scripted(&[json!({"text": "unused"})]),
        registry(),
        RuntimeOptions {
            worker_name: "other".into(),
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    )
}

/// Runs `session` on `rt` in a task the way a scheduler does: takes the lease for `rt` (as its
/// claim would), runs the session under it (`Runtime::run_claimed`) until it stops or the
/// returned token drains it, then releases the lease.
pub async fn spawn_claimed(
    rt: &Runtime,
    tenant: TenantId,
    session: SessionId,
) -> (
    tokio::task::JoinHandle<keel_runtime::RunOutcome>,
    tokio_util::sync::CancellationToken,
) {
    let lease = rt
        .store()
        .acquire_lease(tenant, session, rt.owner(), Duration::from_secs(5))
        .await
        .unwrap();
    let drain = tokio_util::sync::CancellationToken::new();
    let (rt, token) = (rt.clone(), drain.clone());
    let run = tokio::spawn(async move {
        let out = rt
            .run_claimed(tenant, session, &lease, token)
            .await
            .unwrap();
        rt.store().release_lease(tenant, &lease).await.unwrap();
        out
    });
    (run, drain)
}

/// Everything a test needs for one session.
pub struct Fixture {
    pub db: Db,
    pub rt: Runtime,
    pub tenant: TenantId,
    pub session: SessionId,
    pub ws: tempfile::TempDir,
}

pub async fn fixture(
    backend: Backend,
    lines: &[Value],
    tune: impl FnOnce(&mut SessionConfig),
) -> Fixture {
    fixture_with(backend, scripted(lines), &[], Budget::default(), tune).await
}

pub async fn fixture_with(
    backend: Backend,
    model: Arc<dyn ModelClient>,
    tools: &[&str],
    budget: Budget,
    tune: impl FnOnce(&mut SessionConfig),
) -> Fixture {
    let db = db(backend).await;
    let rt = runtime(&db, model);
    let ws = workspace();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    tune(&mut cfg);
    let session = rt
        .create_session(tenant, &release(tools, budget), cfg)
        .await
        .unwrap();
    Fixture {
        db,
        rt,
        tenant,
        session,
        ws,
    }
}

impl Fixture {
    pub async fn events(&self) -> Vec<Event> {
        self.db
            .store
            .read(self.tenant, self.session, 1, None)
            .await
            .unwrap()
    }

    pub async fn types(&self) -> Vec<&'static str> {
        self.events().await.iter().map(|e| e.type_name()).collect()
    }

    pub fn counter_lines(&self) -> Vec<String> {
        counter_lines(self.ws.path())
    }

    /// Allows, once, the approval `out` waits on first; returns its tool call.
    pub async fn allow_first_pending(
        &self,
        out: &keel_runtime::RunOutcome,
    ) -> keel_core::ToolCallId {
        let Some(keel_runtime::PendingAction::Approval {
            approval_id,
            tool_call_id,
            args_hash,
            ..
        }) = out.pending.first()
        else {
            panic!("no approval pending: {:?}", out.pending)
        };
        self.rt
            .decide_approval(
                self.tenant,
                *approval_id,
                keel_core::ApprovalDecision::AllowOnce,
                args_hash,
            )
            .await
            .unwrap();
        tool_call_id.clone()
    }
}

pub fn counter_lines(ws: &Path) -> Vec<String> {
    std::fs::read_to_string(ws.join("counter.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A side-effecting tool: appends `<call_id> <label>` to `counter.txt`. It can reconcile: an
/// operation happened iff its call id is in the file.
pub struct CounterTool;

#[async_trait]
impl Tool for CounterTool {
    fn name(&self) -> &str {
        "counter"
    }
    fn description(&self) -> &str {
        "Adds one to the counter file."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    fn can_reconcile(&self) -> bool {
        true
    }
    async fn reconcile(&self, operation_key: &str, ctx: &ToolContext) -> ReconcileOutcome {
        let call = operation_key.rsplit('/').next().unwrap_or_default();
        let lines = counter_lines(ctx.workspace.root());
        if lines.iter().any(|l| l.split(' ').next() == Some(call)) {
            ReconcileOutcome::Committed {
                output: ToolOutput::success(format!("counted ({call})")),
            }
        } else {
            ReconcileOutcome::Failed {
                reason: "the counter has no entry for this call".into(),
            }
        }
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        use std::io::Write;
        let label = args["label"].as_str().unwrap_or_default();
        let path: PathBuf = ctx.workspace.root().join("counter.txt");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{} {label}", ctx.call_id).unwrap();
        f.sync_all().unwrap();
        ToolOutput::success(format!("counted ({})", ctx.call_id))
    }
}

/// A read-only, parallel-safe tool that sleeps `ms` (stopping early when cancelled) and
/// records when it started.
pub struct SleepTool;

#[async_trait]
impl Tool for SleepTool {
    fn name(&self) -> &str {
        "sleep"
    }
    fn description(&self) -> &str {
        "Waits."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let ms = args["ms"].as_u64().unwrap_or(0);
        ctx.progress.report(
            &ctx.call_id,
            keel_tools::tool::ToolProgress::Status {
                text: "sleeping".into(),
            },
        );
        tokio::select! {
            () = ctx.cancel.cancelled() => ToolOutput::cancelled("sleep was cancelled"),
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::success(format!("slept {ms} ms")),
        }
    }
}

/// A read-only tool that reports each of `pieces` as an output progress chunk (10 ms apart)
/// and returns them joined.
pub struct ChunksTool;

#[async_trait]
impl Tool for ChunksTool {
    fn name(&self) -> &str {
        "chunks"
    }
    fn description(&self) -> &str {
        "Prints pieces."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"pieces": {"type": "array", "items": {"type": "string"}}}, "required": ["pieces"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let pieces: Vec<String> =
            serde_json::from_value(args["pieces"].clone()).unwrap_or_default();
        for p in &pieces {
            ctx.progress.report(
                &ctx.call_id,
                keel_tools::tool::ToolProgress::Output { text: p.clone() },
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ToolOutput::success(pieces.concat())
    }
}

/// A side-effecting tool that sleeps `ms` (stopping when cancelled).
pub struct SlowEffectTool;

#[async_trait]
impl Tool for SlowEffectTool {
    fn name(&self) -> &str {
        "slow_effect"
    }
    fn description(&self) -> &str {
        "Does something slowly."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let ms = args["ms"].as_u64().unwrap_or(0);
        tokio::select! {
            () = ctx.cancel.cancelled() => ToolOutput::cancelled("slow_effect was stopped"),
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::success("done"),
        }
    }
}

/// Simulates a worker that vanished while a side-effecting call was dispatched: the fixture's
/// run is dropped mid-call (once `effect.dispatched` is journaled) and its lease taken over by
/// `owner` for `ttl`; returns that lease.
pub async fn vanish_mid_effect(f: &Fixture, owner: &str, ttl: Duration) -> keel_store::Lease {
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, "effect.dispatched").await;
    run.abort();
    let _ = run.await;
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    let holder = rec.lease.unwrap().owner;
    f.db.store
        .take_over_lease(f.tenant, f.session, &holder, rec.lease_epoch, owner, ttl)
        .await
        .unwrap()
}

/// Waits (≤ 20 s) until the session's journal has an event of type `ty`.
pub async fn wait_for_event(
    store: &Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
    ty: &str,
) -> Event {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let evs = store.read(tenant, session, 1, None).await.unwrap();
        if let Some(e) = evs.iter().find(|e| e.type_name() == ty) {
            return e.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {ty} event within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn call(name: &str, args: Value) -> Value {
    json!({"name": name, "arguments": args})
}

/// Cancels `call` through the fixture's runtime as soon as it is registered as running.
pub async fn cancel_call_when_running(f: &Fixture, call: &keel_core::ToolCallId) {
    while f
        .rt
        .cancel_tool_call(f.tenant, f.session, call)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A fake server answering every request with `text` at `pacing`, and an Anthropic-wire model
/// over it. Keep the server alive as long as the model is used.
pub async fn paced_model(
    text: String,
    pacing: keel_testkit::Pacing,
) -> (keel_testkit::FakeModelServer, Arc<dyn ModelClient>) {
    let server = keel_testkit::FakeModelServer::start_fixed(
        keel_testkit::Reply::Respond(keel_testkit::FakeResponse::text(text)),
        pacing,
    )
    .await
    .unwrap();
    let model = keel_model::HttpModel::new(
        keel_model::Wire::Anthropic,
        keel_model::ProviderConfig::new("claude-test")
            .with_base_url(server.anthropic_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    (server, Arc::new(model))
}
