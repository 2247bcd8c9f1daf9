//! The scheduler's worker loop over a real store (`keel_runtime::scheduler`, issue 13): how it
//! treats a run that panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel_core::{Budget, EventBody, TerminalReason};
use keel_runtime::metrics::Metrics;
use keel_runtime::scheduler::{ClaimRunner, RunFuture, RunReport, SchedulerConfig, spawn_worker};
use keel_runtime::{Runtime, RuntimeError, RuntimeOptions};
use keel_store::Claim;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::on_both;

on_both!(
    a_run_that_panics_is_a_failed_run_given_back,
    a_worker_never_claims_a_skipped_tenants_sessions,
);

/// Runs claimed sessions as a host does ([`Runtime::run_claimed`]).
struct Runs(Runtime);

impl ClaimRunner for Runs {
    fn run(&self, claim: Claim, drain: CancellationToken) -> RunFuture {
        let rt = self.0.clone();
        Box::pin(async move { run_claim(&rt, &claim, drain).await })
    }
}

/// Runs `claim` with `rt` and reports how the run ended, as a host's runner does.
async fn run_claim(rt: &Runtime, claim: &Claim, drain: CancellationToken) -> RunReport {
    let (tenant, session) = (claim.tenant_id, claim.lease.session_id);
    match rt.run_claimed(tenant, session, &claim.lease, drain).await {
        Ok(out) if out.drained => RunReport::Drained,
        Ok(_) => RunReport::Done,
        Err(RuntimeError::LeaseLost { .. }) => RunReport::LeaseLost,
        Err(e) => RunReport::Failed(e.to_string()),
    }
}

/// A server node's worker (`skip_tenants: [TenantId::local()]`) on a store the local CLI also
/// uses runs the server tenant's queued turn and never claims the CLI's: the CLI's session
/// keeps its queued turn, unleased, for the CLI that owns it (a `keel serve` on the default
/// store once continued a user's `keel run` session outside its workspace roots and above its
/// permission ceiling — new-user review of issue 15).
async fn a_worker_never_claims_a_skipped_tenants_sessions(backend: Backend) {
    let db = db(backend).await;
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&[json!({"text": "done"})]),
        registry(),
        RuntimeOptions {
            worker_name: "w".into(),
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let local = keel_core::TenantId::local();
    let server = keel_core::TenantId::new();
    let mut sessions = Vec::new();
    for tenant in [local, server] {
        let session = rt
            .create_session(tenant, &release(&[], Budget::default()), config(ws.path()))
            .await
            .unwrap();
        rt.submit(tenant, session, "go").await.unwrap();
        sessions.push((tenant, session));
    }
    let worker = spawn_worker(
        db.store.clone(),
        SchedulerConfig {
            owner: rt.owner().to_owned(),
            poll: Duration::from_millis(50),
            skip_tenants: vec![local],
            ..SchedulerConfig::default()
        },
        Arc::new(Runs(rt.clone())),
        Arc::new(Metrics::new()),
    );
    let finished = |events: &[keel_core::Event]| {
        events
            .iter()
            .any(|e| matches!(e.body, EventBody::TurnFinished { .. }))
    };
    let (tenant, session) = sessions[1];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !finished(&db.store.read(tenant, session, 1, None).await.unwrap()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server tenant's turn did not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Twenty more polls: the worker is idle, and the CLI's session was never touched.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (tenant, session) = sessions[0];
    let events = db.store.read(tenant, session, 1, None).await.unwrap();
    assert!(!finished(&events), "a server worker ran the CLI's turn");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.body, EventBody::TurnStarted {})),
        "a server worker started the CLI's turn"
    );
    let record = db.store.get_session(tenant, session).await.unwrap();
    assert!(record.lease.is_none(), "{record:?}");
    worker.stop_now();
    worker.join().await;
}

/// Runs claimed sessions with a runtime as a host does ([`Runtime::run_claimed`]), except that
/// its first run panics in the middle (a bug in the host or the runtime) while it holds the
/// session's lease.
struct PanicsFirst {
    rt: Runtime,
    runs: Arc<AtomicU32>,
}

impl ClaimRunner for PanicsFirst {
    fn run(&self, claim: Claim, drain: CancellationToken) -> RunFuture {
        let (rt, runs) = (self.rt.clone(), self.runs.clone());
        Box::pin(async move {
            let (tenant, session) = (claim.tenant_id, claim.lease.session_id);
            // The run is under way (the store is read with the lease held), then it panics.
            let held = rt.store().get_session(tenant, session).await.unwrap();
            assert!(held.lease.is_some(), "the claim holds the lease");
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("a bug in the run of {session}");
            }
            run_claim(&rt, &claim, drain).await
        })
    }
}

/// The first run of a session panics while holding its lease (TTL 10 minutes). The worker
/// counts it as a failed run and gives the session back at once: after the error backoff the
/// same worker (its loop still running) claims it again and the turn completes, long before
/// the lease could have expired. The metrics show two runs, one failed, none running.
async fn a_run_that_panics_is_a_failed_run_given_back(backend: Backend) {
    let db = db(backend).await;
    let ttl = Duration::from_secs(600);
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&[json!({"text": "done"})]),
        registry(),
        RuntimeOptions {
            worker_name: "w".into(),
            lease_ttl: ttl,
            lease_wait: Duration::from_secs(1),
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), config(ws.path()))
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();

    let runs = Arc::new(AtomicU32::new(0));
    let metrics = Metrics::new();
    let worker = spawn_worker(
        db.store.clone(),
        SchedulerConfig {
            owner: rt.owner().to_owned(),
            concurrency: 2,
            lease_ttl: ttl,
            poll: Duration::from_millis(50),
            error_backoff: Duration::from_millis(100),
            ..SchedulerConfig::default()
        },
        Arc::new(PanicsFirst {
            rt: rt.clone(),
            runs: runs.clone(),
        }),
        Arc::new(metrics.clone()),
    );

    // A correctness bound: 30 s, a twentieth of the lease the panicked run held.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let finished = loop {
        let events = db.store.read(tenant, session, 1, None).await.unwrap();
        let record = db.store.get_session(tenant, session).await.unwrap();
        let end = events.iter().find_map(|e| match &e.body {
            EventBody::TurnFinished {
                terminal_reason, ..
            } => Some(*terminal_reason),
            _ => None,
        });
        if let Some(end) = end
            && record.lease.is_none()
        {
            break end;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session was not given back after the panic ({} runs): {record:?}",
            runs.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(finished, TerminalReason::Completed);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the panicked run, then one that finished"
    );
    let text = metrics.render();
    for line in [
        "keel_session_runs_total 2",
        "keel_session_run_errors_total 1",
        "keel_sessions_running 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    worker.stop_now();
    worker.join().await;
}
