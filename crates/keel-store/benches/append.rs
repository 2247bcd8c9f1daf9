//! Journal append benchmark: latency (p50/p99) and throughput of durable appends on SQLite and
//! PostgreSQL, next to the raw fsync cost of the same disk, measured in the same run.
//!
//! Method (see docs/BENCHMARKS.md):
//! - `fsync`: write 4 KiB at the end of a file in the store's directory and `fdatasync` it;
//!   the physical floor of one durable commit.
//! - `sqlite commit`: one `INSERT` in its own transaction on a bare SQLite file with the store's
//!   settings (WAL, `synchronous=FULL`): the cost of one fsync-bound SQLite commit.
//! - `single session`: one writer appends one event at a time (CAS + fencing, durable on return).
//! - `100 sessions`: 100 concurrent writers, one session each, each appending one event at a
//!   time; throughput is events committed / wall time.
//!
//! Run: `cargo bench -p keel-store --bench append` (PostgreSQL from KEEL_TEST_DATABASE_URL,
//! default postgres://postgres@127.0.0.1:5432/test; skipped with a note if unreachable).
//! `KEEL_BENCH_QUICK=1` shortens every phase (for a smoke run).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use keel_core::*;
use keel_store::{NewSession, SqlStore, Store};
use serde_json::json;
use sqlx::{Connection, Executor};

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Latency {
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn summarize(mut v: Vec<Duration>) -> Latency {
    v.sort();
    Latency {
        p50: quantile(&v, 0.5),
        p99: quantile(&v, 0.99),
        n: v.len(),
    }
}

fn fsync_cost(dir: &std::path::Path, n: usize) -> Latency {
    let path = dir.join("fsync.probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let block = vec![7u8; 4096];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&block).unwrap();
        f.sync_data().unwrap();
        v.push(t.elapsed());
    }
    summarize(v)
}

async fn sqlite_bare_commit(dir: &std::path::Path, n: usize) -> Latency {
    sqlx::any::install_default_drivers();
    let url = format!("sqlite://{}?mode=rwc", dir.join("bare.db").display());
    let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
    c.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        .await
        .unwrap();
    let body = "x".repeat(300);
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let mut tx = c.begin().await.unwrap();
        sqlx::query("INSERT INTO t (k, v) VALUES (?, ?)")
            .bind(i as i64)
            .bind(body.clone())
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        v.push(t.elapsed());
    }
    summarize(v)
}

struct Session {
    tenant: TenantId,
    id: SessionId,
    epoch: LeaseEpoch,
}

async fn new_session(store: &Arc<dyn Store>, tenant: TenantId) -> Session {
    let id = SessionId::new();
    store
        .create_session(
            tenant,
            NewSession {
                session_id: id,
                release_id: ReleaseId::from("sha256:bench"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await
        .unwrap();
    let lease = store
        .acquire_lease(tenant, id, "bench", Duration::from_secs(600))
        .await
        .unwrap();
    let created = Event::new(
        id,
        1,
        Utc::now(),
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: tenant,
            release_id: ReleaseId::from("sha256:bench"),
            config: json!({}),
        },
    );
    store
        .append(tenant, id, 0, lease.epoch, &[created])
        .await
        .unwrap();
    Session {
        tenant,
        id,
        epoch: lease.epoch,
    }
}

/// A realistic event: a tool call finishing with a few hundred bytes of output.
fn event(session: SessionId, seq: u64) -> Event {
    Event::new(
        session,
        seq,
        Utc::now(),
        Correlation {
            tool_call_id: Some(ToolCallId::from(format!("call_{seq}"))),
            ..Correlation::default()
        },
        EventBody::ToolCallFinished {
            status: ToolCallStatus::Succeeded,
            output: "line of tool output\n".repeat(15),
            is_error: false,
        },
    )
}

async fn single_session(store: &Arc<dyn Store>, n: usize) -> Latency {
    let s = new_session(store, TenantId::new()).await;
    let mut version = 1;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let ev = [event(s.id, version + 1)];
        let t = Instant::now();
        version = store
            .append(s.tenant, s.id, version, s.epoch, &ev)
            .await
            .unwrap();
        v.push(t.elapsed());
    }
    summarize(v)
}

/// Returns (events/s, per-append latency) for `sessions` concurrent writers over `duration`.
async fn concurrent(store: &Arc<dyn Store>, sessions: usize, duration: Duration) -> (f64, Latency) {
    let tenant = TenantId::new();
    let mut all = Vec::new();
    for _ in 0..sessions {
        all.push(new_session(store, tenant).await);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for s in all {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut version = 1;
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let ev = [event(s.id, version + 1)];
                let t = Instant::now();
                version = store
                    .append(s.tenant, s.id, version, s.epoch, &ev)
                    .await
                    .unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    (lat.len() as f64 / elapsed.as_secs_f64(), summarize(lat))
}

fn row(name: &str, l: &Latency) {
    println!("| {name} | {} | {:.3} | {:.3} |", l.n, ms(l.p50), ms(l.p99));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let quick = std::env::var("KEEL_BENCH_QUICK").is_ok();
    let (n, secs) = if quick { (50, 1) } else { (1000, 10) };
    // The store's directory: KEEL_BENCH_DIR, else the system temp dir (state which disk it is on).
    let base = std::env::var("KEEL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir_in(base).unwrap();
    println!(
        "keel-store append benchmark ({} samples per latency row, {} s per throughput run)",
        n, secs
    );
    println!("directory: {}\n", dir.path().display());
    println!("| measurement | samples | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    let fsync = fsync_cost(dir.path(), n);
    row("raw fsync (4 KiB write + fdatasync)", &fsync);
    let bare = sqlite_bare_commit(dir.path(), n).await;
    row("bare SQLite commit (WAL, synchronous=FULL)", &bare);

    let sqlite: Arc<dyn Store> = Arc::new(
        SqlStore::open_sqlite(&dir.path().join("keel.db"))
            .await
            .unwrap(),
    );
    let single = single_session(&sqlite, n).await;
    row("SQLite append, 1 session", &single);
    let (tput, lat) = concurrent(&sqlite, 100, Duration::from_secs(secs)).await;
    row("SQLite append, 100 sessions", &lat);
    println!(
        "\nSQLite single-session p50 / bare commit p50: {:.2}x; / raw fsync p50: {:.2}x",
        ms(single.p50) / ms(bare.p50),
        ms(single.p50) / ms(fsync.p50)
    );
    println!("SQLite 100 sessions: {tput:.0} events/s (group commit)\n");

    let url = std::env::var("KEEL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("keel_bench_{}", std::process::id());
    match SqlStore::connect_postgres(&url, Some(&schema)).await {
        Ok(pg) => {
            let pg: Arc<dyn Store> = Arc::new(pg);
            println!("| measurement | samples | p50 ms | p99 ms |");
            println!("|---|---|---|---|");
            let single = single_session(&pg, n).await;
            row("PostgreSQL append, 1 session", &single);
            let (tput, lat) = concurrent(&pg, 100, Duration::from_secs(secs)).await;
            row("PostgreSQL append, 100 sessions", &lat);
            println!(
                "\nPostgreSQL single-session p50 / raw fsync p50: {:.2}x",
                ms(single.p50) / ms(fsync.p50)
            );
            println!("PostgreSQL 100 sessions: {tput:.0} events/s");
            drop(pg);
            if let Ok(mut c) = sqlx::AnyConnection::connect(&url).await {
                let _ = c
                    .execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
                    .await;
            }
        }
        Err(e) => println!("PostgreSQL skipped: {e}"),
    }
}
