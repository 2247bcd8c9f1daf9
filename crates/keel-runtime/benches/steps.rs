//! Step overhead: one scripted turn of N steps, each proposing one read-only call
//! (`read_file README.md`), on durable SQLite on disk (the system temp dir, or `KEEL_BENCH_DIR`).
//! Prints the median milliseconds per step over several runs (the run's wall time / N), the
//! per-step p50 and p90 (the time between one model call and the next, which is one step:
//! sample, call, commits), the durable commits per step as
//! the store counts them, and the raw fsync cost of the same disk measured in the same run, so
//! the step cost reads as a multiple of the commits it must make. Exits 0 whatever the figures.
//!
//! `cargo bench -p keel-runtime --bench steps` (`KEEL_BENCH_STEPS`, default 1,000;
//! `KEEL_BENCH_RUNS`, default 3). Then one turn of a tenth as many side-effecting steps
//! (`write_file`) for their commits per step.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use keel_core::{AgentDefinition, Budget, Release, TenantId};
use keel_model::{EventStream, ModelClient, ModelRequest, Script, ScriptedModel};
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

fn fsync_ms(dir: &std::path::Path) -> f64 {
    let path = dir.join("fsync.probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![7u8; 4096];
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        f.write_all(&block).unwrap();
        f.sync_data().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    median(&mut times)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The scripted model, noting when each call starts: the gaps between consecutive calls are
/// the turn's step durations.
struct Timed {
    inner: ScriptedModel,
    starts: Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl ModelClient for Timed {
    fn model(&self) -> &str {
        self.inner.model()
    }
    fn members(&self) -> Vec<&str> {
        self.inner.members()
    }
    fn stream(&self, request: ModelRequest) -> EventStream {
        self.starts.lock().unwrap().push(Instant::now());
        self.inner.stream(request)
    }
    fn consumes_responses(&self) -> bool {
        self.inner.consumes_responses()
    }
    fn context_window_tokens(&self) -> Option<u64> {
        self.inner.context_window_tokens()
    }
}

/// One turn's figures.
struct Turn {
    /// Wall time / steps, ms.
    per_step_ms: f64,
    /// Step durations (between consecutive model calls), ms.
    step_ms: Vec<f64>,
    /// Durable commits of the turn.
    commits: u64,
}

/// One turn of `steps` steps, each one call of `call(i)`.
async fn run(dir: &std::path::Path, steps: usize, call: fn(usize) -> Value) -> Turn {
    let db = tempfile::tempdir_in(dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqlStore::open_sqlite(&db.path().join("keel.db"))
            .await
            .unwrap(),
    );
    let mut lines: Vec<Value> = (0..steps)
        .map(
            |i| json!({"tool_calls": [call(i)], "usage": {"input_tokens": 10, "output_tokens": 5}}),
        )
        .collect();
    lines.push(json!({"text": "done"}));
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    let starts = Arc::new(std::sync::Mutex::new(Vec::with_capacity(steps + 1)));
    let model = Arc::new(Timed {
        inner: ScriptedModel::new(Script::parse("bench.jsonl", &text.join("\n")).unwrap()),
        starts: starts.clone(),
    });
    let rt = Runtime::new(
        store.clone(),
        model,
        ToolRegistry::with_builtins().unwrap(),
        RuntimeOptions::default(),
    );
    let ws = tempfile::tempdir_in(dir).unwrap();
    std::fs::write(ws.path().join("README.md"), "hello\n").unwrap();
    let release = Release::new(AgentDefinition {
        name: "bench".into(),
        model_route: vec!["scripted".into()],
        instructions: "Read the readme.".into(),
        tools: Vec::new(),
        policy: Value::Null,
        budget: Budget::default(),
        mcp_servers: Default::default(),
        agents: Default::default(),
    });
    let tenant = TenantId::new();
    let session = rt
        .create_session(
            tenant,
            &release,
            SessionConfig {
                workspace: ws.path().to_path_buf(),
                permission_mode: PermissionMode::Bypass,
                sandbox: keel_tools::sandbox::SandboxMode::Off,
                context_window_tokens: Some(100_000_000),
                ..SessionConfig::default()
            },
        )
        .await
        .unwrap();
    rt.submit(tenant, session, "read it").await.unwrap();
    let c0 = store.commits();
    let t = Instant::now();
    let out = rt.run(tenant, session).await.unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let c1 = store.commits();
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].num_steps as usize, steps + 1);
    let starts = starts.lock().unwrap();
    Turn {
        per_step_ms: ms / steps as f64,
        step_ms: starts
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .collect(),
        commits: (c1.journal + c1.tables) - (c0.journal + c0.tables),
    }
}

/// The `q` quantile (0..=1) of `v`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn read_only(i: usize) -> Value {
    json!({"id": format!("c{i}"), "name": "read_file", "arguments": {"path": "README.md"}})
}

fn side_effecting(i: usize) -> Value {
    json!({"id": format!("c{i}"), "name": "write_file", "arguments": {"path": "out.txt", "content": format!("{i}")}})
}

fn main() {
    let steps = env("KEEL_BENCH_STEPS", 1000);
    let runs = env("KEEL_BENCH_RUNS", 3);
    let dir = std::env::var("KEEL_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fsync = fsync_ms(&dir);
    let mut per_step = Vec::new();
    let mut step_ms = Vec::new();
    let mut commits = 0;
    for _ in 0..runs {
        let turn = rt.block_on(run(&dir, steps, read_only));
        per_step.push(turn.per_step_ms);
        step_ms.extend(turn.step_ms);
        commits = turn.commits;
    }
    let mean = median(&mut per_step);
    let p50 = quantile(&mut step_ms, 0.5);
    let p90 = quantile(&mut step_ms, 0.9);
    let commits_per_step = commits as f64 / steps as f64;
    // Side-effecting steps (write_file, which also fsyncs the file it writes): fewer of them.
    let fx_steps = (steps / 10).max(10);
    let mut fx = rt.block_on(run(&dir, fx_steps, side_effecting));
    let fx_p50 = quantile(&mut fx.step_ms, 0.5);
    println!(
        "step overhead, scripted model, durable SQLite in {}",
        dir.display()
    );
    println!("  steps per turn: {steps}, runs: {runs}");
    println!("  raw fsync (4 KiB + fdatasync), p50: {fsync:.3} ms");
    println!(
        "  step p50: {p50:.3} ms, p90: {p90:.3} ms (all steps of all runs)   (target: p50 <= 1 ms)"
    );
    println!("  wall time per step, median of runs: {mean:.3} ms (turn start and end included)");
    println!(
        "  durable commits per read-only step: {commits_per_step:.2}   (target: <= 1; the turn's start, end and idle add 3)"
    );
    println!(
        "  step p50 / (commits x fsync): {:.2}",
        p50 / (commits_per_step.max(1e-9) * fsync)
    );
    println!(
        "  side-effecting step (write_file), {fx_steps} steps: p50 {fx_p50:.3} ms, wall {:.3} ms/step, durable commits per step: {:.2}   (target: <= 2, intent before, outcome after)",
        fx.per_step_ms,
        fx.commits as f64 / fx_steps as f64
    );
}
