//! stale_write — of writers appending to one journal from the same version, exactly one append
//! wins and the others write nothing (`StaleVersion`); a worker whose lease was taken over (a
//! zombie: alive, unaware, still holding its old epoch) can neither append nor dispatch a tool
//! call — the fencing epoch refuses the commit that must precede every dispatch, so the tool's
//! side effect never happens; the worker holding the new epoch runs the call, once.
//!
//! Guarded mechanisms: the store's compare-and-set on the session's journal version (CAS
//! version check: `two_writers_one_version_one_wins`) and the fencing epoch check of every
//! append (`zombie_after_takeover`: the zombie wakes before the new holder wrote anything, so
//! the version still matches and only the epoch stands between it and the dispatch). With
//! either off, the counts below (one event per version, one counter line) are off.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{Correlation, Event, EventBody, ReleaseId, SessionId, TenantId, TurnId};
use keel_runtime::RuntimeError;
use keel_store::{Store, StoreError};
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::harness::{Backend, FreshStore, config, on_both, poll, release, runtime, scripted};

on_both!(tokio two_writers_one_version_one_wins, tokio zombie_after_takeover);

/// Rounds of the two-writer race (each a fresh race at a new version).
const ROUNDS: u64 = 20;

/// A `turn.queued` at `seq` whose input names the writer and round.
fn queued(session: SessionId, seq: u64, label: &str) -> Event {
    Event::new(
        session,
        seq,
        Utc::now(),
        Correlation::turn(TurnId::new()),
        EventBody::TurnQueued {
            input: label.to_owned(),
            compiled: None,
        },
    )
}

/// Two store handles (two processes' views) on one session under one lease: each round both
/// append at the version they read, at the same time. Exactly one wins per round, the loser
/// gets `StaleVersion`, and the journal holds exactly one event per version — the winner's.
async fn two_writers_one_version_one_wins(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let (a, b) = (fresh.open().await, fresh.open().await);
    let tenant = TenantId::new();
    let session = SessionId::new();
    let lease = keel_testkit::db::leased_session(
        a.as_ref(),
        tenant,
        session,
        &ReleaseId::from("sha256:stale-write"),
        json!({}),
        "writer",
        Duration::from_secs(60),
    )
    .await;

    let mut winners = Vec::new();
    for round in 0..ROUNDS {
        let version = 1 + round;
        let gate = Arc::new(tokio::sync::Barrier::new(2));
        let race = |store: Arc<dyn Store>, who: &'static str| {
            let gate = gate.clone();
            let event = queued(session, version + 1, &format!("{who} {round}"));
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .append(tenant, session, version, lease.epoch, &[event])
                    .await
            })
        };
        let (ra, rb) = (race(a.clone(), "a"), race(b.clone(), "b"));
        let (ra, rb) = (ra.await.unwrap(), rb.await.unwrap());
        let lost = |r: &Result<u64, StoreError>| matches!(r, Err(StoreError::StaleVersion { .. }));
        match (&ra, &rb) {
            (Ok(v), r) if lost(r) => {
                assert_eq!(*v, version + 1);
                winners.push(format!("a {round}"));
            }
            (r, Ok(v)) if lost(r) => {
                assert_eq!(*v, version + 1);
                winners.push(format!("b {round}"));
            }
            other => panic!("round {round}: exactly one append wins, got {other:?}"),
        }
    }

    let events = b.read(tenant, session, 1, None).await.unwrap();
    assert_eq!(events.len() as u64, 1 + ROUNDS, "one event per version");
    let inputs: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            assert_eq!(e.seq, i as u64 + 1, "contiguous versions");
            match &e.body {
                EventBody::TurnQueued { input, .. } => input.clone(),
                EventBody::SessionCreated { .. } => "created".into(),
                other => panic!("{other:?}"),
            }
        })
        .skip(1)
        .collect();
    assert_eq!(inputs, winners, "the journal holds exactly the winners");
    assert_eq!(
        a.get_session(tenant, session).await.unwrap().version,
        1 + ROUNDS
    );
}

/// A side-effecting tool appending `<call id> <worker>` to `counter.txt`. Its `prepare` (which
/// the runtime runs after deciding to dispatch and before committing the dispatch) signals
/// `reached` and waits for a permit on `gate`: the zombie's is held there while its lease is
/// taken over.
struct GatedCounter {
    worker: &'static str,
    reached: Arc<tokio::sync::Notify>,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl Tool for GatedCounter {
    fn name(&self) -> &str {
        "gated_counter"
    }
    fn description(&self) -> &str {
        "Adds one line to counter.txt."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    async fn prepare(&self, _args: &Value, _ctx: &ToolContext) -> Option<Value> {
        self.reached.notify_one();
        self.gate.acquire().await.unwrap().forget();
        None
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> ToolOutput {
        use std::io::Write;
        let path = ctx.workspace.root().join("counter.txt");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{} {}", ctx.call_id, self.worker).unwrap();
        ToolOutput::success("counted")
    }
}

/// A worker's tools: the built-ins and a [`GatedCounter`] with `permits` (`None`: open).
fn tools(
    worker: &'static str,
    reached: Arc<tokio::sync::Notify>,
    permits: Option<usize>,
) -> (keel_tools::ToolRegistry, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(permits.unwrap_or(Semaphore::MAX_PERMITS)));
    let mut r = keel_tools::ToolRegistry::with_builtins().unwrap();
    r.register(Arc::new(GatedCounter {
        worker,
        reached,
        gate: gate.clone(),
    }))
    .unwrap();
    (r, gate)
}

fn counter_lines(ws: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(ws.join("counter.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The zombie (worker A, its own store handle) runs a turn whose model proposes
/// `gated_counter`; it stops inside the dispatch path (the tool's `prepare`, before the
/// dispatch commit). Worker B (another handle) takes the lease over at A's epoch — as a
/// scheduler does from a holder it believes dead — and writes nothing yet. A's checkpoint
/// commit (of the proposed call) is refused meanwhile. Then A wakes: its dispatch is refused
/// (`LeaseLost`, before anything else is judged), the tool never runs, its run ends with
/// `LeaseLost`, and a plain append at its old epoch is refused too. B then runs the session
/// under its lease: the call is dispatched once (by B), the turn completes, and the journal
/// holds exactly one `effect.dispatched`.
async fn zombie_after_takeover(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let ws = tempfile::tempdir().unwrap();
    let lines = [
        json!({"tool_calls": [{"name": "gated_counter", "arguments": {}}]}),
        json!({"text": "counted"}),
    ];
    let reached = Arc::new(tokio::sync::Notify::new());
    let (zombie_tools, zombie_gate) = tools("zombie", reached.clone(), Some(0));
    let zombie = runtime(fresh.open().await, "zombie", scripted(&lines), zombie_tools);
    let (successor_tools, _) = tools("successor", Arc::new(tokio::sync::Notify::new()), None);
    let successor = runtime(
        fresh.open().await,
        "successor",
        scripted(&lines),
        successor_tools,
    );

    let tenant = TenantId::new();
    let session = zombie
        .create_session(
            tenant,
            &release("stale-write", &["gated_counter"]),
            config(ws.path()),
        )
        .await
        .unwrap();
    zombie.submit(tenant, session, "count once").await.unwrap();
    let run = {
        let zombie = zombie.clone();
        tokio::spawn(async move { zombie.run(tenant, session).await })
    };
    tokio::time::timeout(Duration::from_secs(20), reached.notified())
        .await
        .expect("the zombie reaches the dispatch within 20 s");

    // B takes the lease over at the zombie's epoch; nothing is appended yet.
    let store = successor.store().clone();
    let before = store.get_session(tenant, session).await.unwrap();
    let held = before.lease.clone().expect("the zombie holds the lease");
    let lease = store
        .take_over_lease(
            tenant,
            session,
            &held.owner,
            before.lease_epoch,
            successor.owner(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        lease.epoch > before.lease_epoch,
        "a takeover bumps the epoch"
    );
    // The version the takeover fenced: until then the zombie held the lease and may have
    // committed (its checkpoint of the proposed call, when the test was slow to take over).
    let fenced_at = store.get_session(tenant, session).await.unwrap().version;

    // The zombie sleeps on past its journal's checkpoint period (`checkpoint_after`, 200 ms):
    // the order seen once under load, every run — its checkpoint commits the call it staged
    // and is refused for its epoch first. Whatever it does next is refused as `LeaseLost`
    // (fencing first), not judged against a journal that lacks the dropped call.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The zombie wakes: its dispatch is refused and its tool never runs.
    zombie_gate.add_permits(1);
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the zombie's run ends within 20 s")
        .unwrap();
    assert!(
        matches!(out, Err(RuntimeError::LeaseLost { .. })),
        "the zombie's dispatch commit is refused by the fencing epoch: {out:?}"
    );
    assert!(
        counter_lines(ws.path()).is_empty(),
        "the zombie's tool ran: {:?}",
        counter_lines(ws.path())
    );
    let after = store.get_session(tenant, session).await.unwrap();
    assert_eq!(
        after.version, fenced_at,
        "the zombie appended nothing after the takeover"
    );
    // Any other append at the zombie's epoch is refused as well.
    let stray = queued(session, after.version + 1, "zombie");
    let refused = zombie
        .store()
        .append(tenant, session, after.version, before.lease_epoch, &[stray])
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );

    // B runs the session under its lease: one dispatch, by B.
    let drain = tokio_util::sync::CancellationToken::new();
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        successor.run_claimed(tenant, session, &lease, drain),
    )
    .await
    .expect("the successor's run ends within 20 s")
    .unwrap();
    assert_eq!(
        outcome.turns.last().map(|t| t.terminal_reason),
        Some(keel_core::TerminalReason::Completed),
        "{outcome:?}"
    );
    let counted = counter_lines(ws.path());
    assert_eq!(counted.len(), 1, "one dispatch in all: {counted:?}");
    assert!(counted[0].ends_with(" successor"), "{counted:?}");
    let events = poll(20, "the journal shows the successor's turn end", || {
        let store = store.clone();
        async move {
            let evs = store.read(tenant, session, 1, None).await.unwrap();
            evs.iter()
                .any(|e| e.type_name() == "turn.finished")
                .then_some(evs)
        }
    })
    .await;
    let dispatched = events
        .iter()
        .filter(|e| e.type_name() == "effect.dispatched")
        .count();
    assert_eq!(dispatched, 1, "exactly one dispatch journaled");
}
