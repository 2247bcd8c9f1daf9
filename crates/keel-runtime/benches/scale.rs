//! Scale benchmarks of one worker process (issue 16's table), each printing its figures with the
//! target beside them and exiting 0 whatever they are:
//!
//! - `throughput`: 100 and 1,000 concurrent sessions on one `Runtime`, each running one turn of
//!   `KEEL_BENCH_STEPS` (default 10) read-only steps with the scripted model, on durable SQLite
//!   on disk (`KEEL_BENCH_DIR`, default the temp dir) and, when `KEEL_TEST_DATABASE_URL` answers,
//!   on PostgreSQL (a fresh schema). Steps/s = all steps / wall time from the first run started
//!   to the last finished (session creation and the submit not counted). Target ≥ 5,000 on SQLite.
//! - `waiting`: `KEEL_BENCH_SESSIONS` (default 10,000) sessions in one process, each sampling a
//!   real HTTP model (OpenAI Chat Completions) served by keel-testkit's fake model server in a
//!   child process (so its memory and CPU are not counted), which holds every response's first
//!   token for `KEEL_BENCH_TTFT_MS` (default 2,000). While the sessions wait it samples the
//!   process's RSS and CPU time: RSS per waiting session = (RSS at the plateau − RSS before the
//!   runs) / sessions waiting; CPU while waiting = CPU seconds per wall second over the window in
//!   which every started call is still waiting. Targets ≤ 50 KB/session, near-zero CPU.
//!
//! `cargo bench -p keel-runtime --bench scale` (both), `… --bench scale -- throughput`,
//! `… -- waiting`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use keel_core::{AgentDefinition, Budget, Release, SessionId, TenantId};
use keel_model::{EventStream, HttpModel, ModelClient, ModelRequest, ProviderConfig, Script};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_store::{SqlStore, Store};
use keel_tools::ToolRegistry;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn release() -> Release {
    Release::new(AgentDefinition {
        name: "bench".into(),
        model_route: vec!["bench".into()],
        instructions: "Read the readme.".into(),
        tools: Vec::new(),
        policy: Value::Null,
        budget: Budget::default(),
        mcp_servers: Default::default(),
        agents: Default::default(),
    })
}

fn session_config(ws: &std::path::Path) -> SessionConfig {
    SessionConfig {
        workspace: ws.to_path_buf(),
        permission_mode: PermissionMode::Bypass,
        sandbox: keel_tools::sandbox::SandboxMode::Off,
        context_window_tokens: Some(100_000_000),
        ..SessionConfig::default()
    }
}

/// Creates `n` sessions with one submitted input each (8 at a time per creator task).
async fn create(rt: &Runtime, ws: &std::path::Path, n: usize) -> Vec<(TenantId, SessionId)> {
    let release = release();
    let tenant = TenantId::new();
    let mut tasks = Vec::new();
    let per = n.div_ceil(64);
    for chunk in 0..64 {
        let (rt, release, ws) = (rt.clone(), release.clone(), ws.to_path_buf());
        let count = per.min(n.saturating_sub(chunk * per));
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..count {
                let s = rt
                    .create_session(tenant, &release, session_config(&ws))
                    .await
                    .unwrap();
                rt.submit(tenant, s, "read it").await.unwrap();
                out.push((tenant, s));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn scripted(steps: usize) -> Arc<dyn ModelClient> {
    let mut lines: Vec<String> = (0..steps)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file", "arguments": {"path": "README.md"}}],
                   "usage": {"input_tokens": 10, "output_tokens": 5}}).to_string()
        })
        .collect();
    lines.push(json!({"text": "done"}).to_string());
    Arc::new(keel_model::ScriptedModel::new(
        Script::parse("bench.jsonl", &lines.join("\n")).unwrap(),
    ))
}

/// Runs `sessions` concurrent sessions of `steps` read-only steps; returns steps/s.
async fn throughput(store: Arc<dyn Store>, sessions: usize, steps: usize) -> f64 {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "hello\n").unwrap();
    let rt = Runtime::new(
        store,
        scripted(steps),
        ToolRegistry::with_builtins().unwrap(),
        RuntimeOptions::default(),
    );
    let ids = create(&rt, ws.path(), sessions).await;
    let t = Instant::now();
    let runs: Vec<_> = ids
        .into_iter()
        .map(|(tenant, s)| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.run(tenant, s).await.unwrap() })
        })
        .collect();
    for r in runs {
        let out = r.await.unwrap();
        assert_eq!(out.turns[0].num_steps as usize, steps + 1);
    }
    (sessions * steps) as f64 / t.elapsed().as_secs_f64()
}

async fn postgres() -> Option<Arc<dyn Store>> {
    let url = std::env::var("KEEL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{}", std::process::id());
    match SqlStore::connect_postgres(&url, Some(&schema)).await {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            println!("  PostgreSQL: not measured ({url}: {e})");
            None
        }
    }
}

async fn bench_throughput() {
    let steps = env("KEEL_BENCH_STEPS", 10);
    let dir = std::env::var("KEEL_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    println!("throughput, one worker, {steps} read-only steps per session, scripted model");
    for sessions in [100, 1000] {
        let db = tempfile::tempdir_in(&dir).unwrap();
        let store: Arc<dyn Store> = Arc::new(
            SqlStore::open_sqlite(&db.path().join("keel.db"))
                .await
                .unwrap(),
        );
        let c0 = store.commits();
        let sps = throughput(store.clone(), sessions, steps).await;
        let c1 = store.commits();
        println!(
            "  SQLite, {sessions:>5} sessions: {sps:>8.0} steps/s   (target: >= 5,000)   [{} commits incl. creation]",
            (c1.journal + c1.tables) - (c0.journal + c0.tables)
        );
    }
    if let Some(store) = postgres().await {
        for sessions in [100, 1000] {
            let sps = throughput(store.clone(), sessions, steps).await;
            println!("  PostgreSQL, {sessions:>5} sessions: {sps:>8.0} steps/s   (no target)");
        }
    }
}

/// Counts calls started and calls whose first event arrived (the rest are waiting).
struct Counting {
    inner: HttpModel,
    started: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl ModelClient for Counting {
    fn model(&self) -> &str {
        self.inner.model()
    }
    fn stream(&self, request: ModelRequest) -> EventStream {
        self.started.fetch_add(1, Ordering::SeqCst);
        let answered = self.answered.clone();
        let mut first = true;
        self.inner
            .stream(request)
            .map(move |ev| {
                if std::mem::take(&mut first) {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
                ev
            })
            .boxed()
    }
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of this process.
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The child process: a fake model server answering "done" after the TTFT; prints its port.
async fn serve_fake(ttft_ms: u64) {
    use keel_testkit::{FakeModelServer, FakeResponse, Pacing, Reply};
    let server = FakeModelServer::start_fixed(
        Reply::Respond(FakeResponse::text("done")),
        Pacing {
            time_to_first_token_ms: ttft_ms,
            tokens_per_second: None,
        },
    )
    .await
    .unwrap();
    println!("{}", server.addr().port());
    // Until the parent closes our stdin.
    let mut buf = String::new();
    let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut buf)).await;
}

async fn bench_waiting() {
    let n = env("KEEL_BENCH_SESSIONS", 10_000);
    let ttft = env("KEEL_BENCH_TTFT_MS", 2_000) as u64;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("fake-server")
        .env("KEEL_BENCH_TTFT_MS", ttft.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let http = HttpModel::openai_chat(
        ProviderConfig::new("fake")
            .with_base_url(format!("http://127.0.0.1:{port}/v1"))
            .with_api_key("dummy"),
    )
    .unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(Counting {
        inner: http,
        started: started.clone(),
        answered: answered.clone(),
    });
    let dir = std::env::var("KEEL_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let db = tempfile::tempdir_in(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqlStore::open_sqlite(&db.path().join("keel.db"))
            .await
            .unwrap(),
    );
    let ws = tempfile::tempdir().unwrap();
    let rt = Runtime::new(
        store,
        model,
        ToolRegistry::with_builtins().unwrap(),
        RuntimeOptions::default(),
    );
    let ids = create(&rt, ws.path(), n).await;
    let rss0 = rss_kb();
    let t0 = Instant::now();
    let runs: Vec<_> = ids
        .into_iter()
        .map(|(tenant, s)| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.run(tenant, s).await })
        })
        .collect();
    // Sample every 20 ms until every run has finished.
    let (mut peak_waiting, mut rss_at_peak, mut all_started_at) = (0usize, 0u64, None);
    let mut window: Option<(Instant, f64)> = None;
    let mut window_cpu = None;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (s, a) = (
            started.load(Ordering::SeqCst),
            answered.load(Ordering::SeqCst),
        );
        let waiting = s - a;
        if waiting > peak_waiting {
            peak_waiting = waiting;
            rss_at_peak = rss_kb();
        }
        if s == n && all_started_at.is_none() {
            all_started_at = Some(t0.elapsed());
            // The window counts only if no call was answered yet: then all n are waiting.
            if a == 0 {
                window = Some((Instant::now(), cpu_s()));
            }
        }
        if a > 0
            && window_cpu.is_none()
            && let Some((w, c)) = window
        {
            let wall = w.elapsed().as_secs_f64();
            window_cpu = Some(((cpu_s() - c) / wall.max(1e-9), wall));
        }
        if a == n {
            break;
        }
    }
    let mut failed = 0;
    for r in runs {
        if r.await.unwrap().is_err() {
            failed += 1;
        }
    }
    drop(child.stdin.take());
    let _ = child.wait();
    println!("{n} sessions waiting on a model with {ttft} ms time-to-first-token, one process");
    println!(
        "  all calls started after {:.2} s; most waiting at once: {peak_waiting}; runs failed: {failed}",
        all_started_at.map_or(f64::NAN, |d| d.as_secs_f64())
    );
    println!(
        "  RSS per waiting session: {:.1} KB   (target: <= 50 KB)   [RSS {} MB before the runs, {} MB at the peak]",
        (rss_at_peak.saturating_sub(rss0)) as f64 / peak_waiting.max(1) as f64,
        rss0 / 1024,
        rss_at_peak / 1024
    );
    match window_cpu {
        Some((cpu, wall)) => println!(
            "  CPU while all {n} wait: {:.1} % of one core over {wall:.2} s   (target: near zero)",
            cpu * 100.0
        ),
        None => println!(
            "  CPU while all wait: not measured (the first answer came before every call had started; raise KEEL_BENCH_TTFT_MS)"
        ),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let which = args.first().map_or("all", String::as_str);
    match which {
        "fake-server" => rt.block_on(serve_fake(env("KEEL_BENCH_TTFT_MS", 2000) as u64)),
        "throughput" => rt.block_on(bench_throughput()),
        "waiting" => rt.block_on(bench_waiting()),
        _ => {
            rt.block_on(bench_throughput());
            rt.block_on(bench_waiting());
        }
    }
}
