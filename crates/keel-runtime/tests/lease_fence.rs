//! The lease fence (`LeaseKeeper`, "The fence"): a run whose lease the store cannot renew —
//! here another connection holds the session row's lock (PostgreSQL, `FOR UPDATE`) or the
//! database's write lock (SQLite, `BEGIN IMMEDIATE`), as an unreachable or stalled store would
//! — is stopped, and its tools killed, before the lease expires: no effect of it can land after
//! another worker could take the session over and find the effect `outcome_unknown`. And the
//! other side: a worker that took an expired lease over from a holder that may be alive waits
//! the TTL out before it declares that holder's dispatched effect `outcome_unknown`.

use std::time::{Duration, Instant};

use keel_core::{Budget, EffectStatus, SessionStatus};
use keel_runtime::{Runtime, RuntimeError, RuntimeOptions, lease};
use serde_json::json;
use sqlx::Connection;

use crate::common::*;
use crate::on_both;

on_both!(
    a_lease_the_store_cannot_renew_lapses_before_it_expires,
    a_command_running_when_its_lease_lapses_is_killed_before_its_effect,
    an_effect_a_live_holder_dispatched_is_declared_unknown_only_after_its_lease,
    a_call_proposed_while_the_store_is_stalled_never_runs,
    a_parked_lease_taken_by_a_run_late_is_not_taken_for_lapsed,
    an_expired_lease_its_holder_still_renews_is_not_taken,
    a_lease_released_while_watched_is_taken,
);

/// Lease TTL of these tests.
const TTL: Duration = Duration::from_millis(600);

/// The statuses of the fixture session's effects.
async fn effect_statuses(f: &Fixture) -> Vec<EffectStatus> {
    let effects = f.db.store.list_effects(f.tenant, f.session, None);
    effects
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.status)
        .collect()
}

/// A holder on another host: it may be alive.
const ELSEWHERE: &str = "worker@another-host:1/pidns:1";

/// A session whose run vanished while its side-effecting `slow_effect` call ran (the effect
/// left `dispatched`), its lease then taken by `holder` for `ttl`: the fixture, the script and
/// that lease.
async fn left_to(
    b: Backend,
    holder: &str,
    ttl: Duration,
) -> (Fixture, [serde_json::Value; 2], keel_store::Lease) {
    let lines = [
        json!({"tool_calls": [call("slow_effect", json!({"ms": 60_000}))]}),
        json!({"text": "done"}),
    ];
    let f = fixture_with(
        b,
        scripted(&lines),
        &["slow_effect"],
        Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let lease = vanish_mid_effect(&f, holder, ttl).await;
    (f, lines, lease)
}

/// A runtime (worker `name`, lease TTL [`TTL`]) on `f`'s store with `lines` scripted.
fn short_lease_runtime(f: &Fixture, name: &str, lines: &[serde_json::Value]) -> Runtime {
    Runtime::new(
        f.db.store.clone(),
        scripted(lines),
        registry(),
        RuntimeOptions {
            worker_name: name.into(),
            lease_ttl: TTL,
            lease_wait: Duration::from_secs(6),
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    )
}

/// Gives back the lease the session's creation may have left with the fixture's runtime.
async fn free_lease(f: &Fixture) {
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    if let Some(l) = rec.lease {
        let held = keel_store::Lease {
            session_id: f.session,
            owner: l.owner,
            epoch: rec.lease_epoch,
            expires_at: l.expires_at,
        };
        f.db.store.release_lease(f.tenant, &held).await.unwrap();
    }
}

/// Another connection holding the lock a renewal of `session`'s lease needs.
enum Blocker {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Blocker {
    /// Takes the lock and reads the lease's expiry as committed (Unix ms): no renewal can
    /// commit after this until [`Blocker::release`].
    async fn take(db: &Db, session: keel_core::SessionId) -> (Self, i64) {
        let sql = "SELECT lease_expires_at FROM sessions WHERE session_id = ";
        match db.postgres() {
            Some((url, schema)) => {
                let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query(&format!("SET search_path TO \"{schema}\""))
                    .execute(&mut c)
                    .await
                    .unwrap();
                sqlx::query("BEGIN").execute(&mut c).await.unwrap();
                let at: i64 = sqlx::query_scalar(&format!("{sql}$1 FOR UPDATE"))
                    .bind(session.to_string())
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
                (Blocker::Postgres(c), at)
            }
            None => {
                let mut c = sqlx::SqliteConnection::connect(&db.location).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                let at: i64 = sqlx::query_scalar(&format!("{sql}?"))
                    .bind(session.to_string())
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
                (Blocker::Sqlite(c), at)
            }
        }
    }

    async fn release(self) {
        match self {
            Blocker::Sqlite(mut c) => {
                sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
            }
            Blocker::Postgres(mut c) => {
                sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
            }
        }
    }
}

/// A kept lease is renewed while the store answers; once it does not (the row locked for 3 s,
/// five TTLs), its run's `lost` token is cancelled — within the lease's life: before the
/// expiry the store last committed for it — and the keeper keeps it no more.
async fn a_lease_the_store_cannot_renew_lapses_before_it_expires(b: Backend) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let store = f.db.store.clone();
    free_lease(&f).await;
    let me = lease::owner_string("me");
    let taken = store
        .acquire_lease(f.tenant, f.session, &me, TTL)
        .await
        .unwrap();
    let keeper = lease::LeaseKeeper::new(store.clone(), TTL);
    let lost = tokio_util::sync::CancellationToken::new();
    let _kept = keeper.keep(f.tenant, taken.clone(), lost.clone());
    // Renewed while the store answers: two TTLs later it still holds.
    tokio::time::sleep(TTL * 2).await;
    assert!(!lost.is_cancelled(), "fenced while the store answered");
    let rec = store.get_session(f.tenant, f.session).await.unwrap();
    assert!(rec.lease.unwrap().expires_at > taken.expires_at, "renewed");

    let (blocker, expires_ms) = Blocker::take(&f.db, f.session).await;
    let t = Instant::now();
    tokio::time::timeout(TTL * 10, lost.cancelled())
        .await
        .expect("the lapsed lease was not fenced within 10 TTLs");
    let fenced_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        fenced_ms < expires_ms,
        "fenced at {fenced_ms}, after the lease expired at {expires_ms} ({} ms after the block)",
        t.elapsed().as_millis()
    );
    assert!(keeper.is_empty(), "a lapsed lease is kept no more");
    blocker.release().await;
}

/// A run's side-effecting `shell` call sleeps 1.5 s and then writes a file; while it sleeps,
/// the store stops answering (the lock held 3.5 s). The fence stops the run before its lease
/// expires and kills the command: the file is never written, the run ends `LeaseLost`, and the
/// effect stays `dispatched` — what the next worker recovers as `outcome_unknown` and settles
/// from what really happened (nothing).
async fn a_command_running_when_its_lease_lapses_is_killed_before_its_effect(b: Backend) {
    let call = json!({"tool_calls": [call("shell", json!({"command": "sleep 1.5; echo late >> late.txt"}))]});
    let (f, out) = stalled_run(b, call, "tool_call.started").await;
    let late = f.ws.path().join("late.txt");
    assert!(
        !late.exists(),
        "the command wrote its effect after its lease lapsed: {:?}",
        std::fs::read_to_string(&late)
    );
    assert!(
        matches!(out, Err(RuntimeError::LeaseLost { .. })),
        "{out:?}"
    );
    assert_eq!(effect_statuses(&f).await, [EffectStatus::Dispatched]);
}

/// Runs a session whose model answers `first` (then a text) on a runtime with leases of
/// [`TTL`]; once its journal has an event of type `at`, the store stops answering for 3.5 s
/// (its lock held). Returns the fixture and what the run returned, once the store answers again
/// (≤ 30 s).
async fn stalled_run(
    b: Backend,
    first: serde_json::Value,
    at: &str,
) -> (Fixture, keel_runtime::Result<keel_runtime::RunOutcome>) {
    let lines = [first, json!({"text": "done"})];
    let f = fixture_with(b, scripted(&lines), &["shell"], Budget::default(), |_| {}).await;
    let rt = short_lease_runtime(&f, "stalled", &lines);
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    free_lease(&f).await;
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    wait_for_event(&f.db.store, f.tenant, f.session, at).await;
    let (blocker, _) = Blocker::take(&f.db, f.session).await;
    // Past a command's 1.5 s, with room.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    blocker.release().await;
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the fenced run did not end within 30 s")
        .unwrap();
    (f, out)
}

/// A session's run vanished mid-effect (dropped while `slow_effect` ran) and its lease is
/// left to a holder on another host (so it may be alive), expired. A worker's claim
/// (`Runtime::run_claim`, `Claim::took_over` naming that holder) declares the effect
/// `outcome_unknown` only once the TTL and a tenth have passed since it took the lease; a
/// `Runtime::run` (`keel resume`) and a cancel (`cancel_turn`, a short hold that ends the turn
/// itself) take the lease only after watching it unchanged that long. (A takeover from a dead process of this host waits for nothing: no lower
/// bound asserted for it, that would be a speed.)
async fn an_effect_a_live_holder_dispatched_is_declared_unknown_only_after_its_lease(b: Backend) {
    for way in ["claim", "run", "cancel"] {
        // The holder on another host, its lease expired.
        let (f, lines, _) = left_to(b, ELSEWHERE, Duration::from_millis(20)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let rt = short_lease_runtime(&f, "next", &lines);
        let t = Instant::now();
        match way {
            "claim" => {
                let lease =
                    f.db.store
                        .acquire_lease(f.tenant, f.session, rt.owner(), TTL)
                        .await
                        .unwrap();
                let claim = keel_store::Claim {
                    tenant_id: f.tenant,
                    lease,
                    took_over: Some(ELSEWHERE.to_owned()),
                    runnable_since: None,
                };
                let out = rt
                    .run_claim(&claim, tokio_util::sync::CancellationToken::new())
                    .await
                    .unwrap();
                assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
            }
            "run" => {
                let out = rt.run(f.tenant, f.session).await.unwrap();
                assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
            }
            _ => {
                rt.cancel_turn(f.tenant, f.session).await.unwrap();
            }
        }
        let took = t.elapsed();
        assert_eq!(
            effect_statuses(&f).await,
            [EffectStatus::OutcomeUnknown],
            "{way}"
        );
        assert!(
            took >= TTL + TTL / 10,
            "{way}: declared outcome_unknown {} ms after taking the lease from a holder that may be alive",
            took.as_millis()
        );
    }
}

/// A lease kept for a session created held (`create_session_held`: a `keel run`) is renewed
/// while parked; a run that takes it over well past its first expiry reckons its validity from
/// the last renewal, not from the expiry it was parked with: it runs to the end (before, it
/// lapsed at once and the run ended `LeaseLost` on a healthy store).
async fn a_parked_lease_taken_by_a_run_late_is_not_taken_for_lapsed(b: Backend) {
    let db = db(b).await;
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let lines = [json!({"text": "done"})];
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&lines),
        registry(),
        RuntimeOptions {
            worker_name: "held".into(),
            lease_ttl: TTL,
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    );
    let session = rt
        .create_session_held(tenant, &release(&[], Budget::default()), config(ws.path()))
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    tokio::time::sleep(TTL * 3).await;
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
}

/// The model takes 300 ms to propose a side-effecting `shell` call; meanwhile the store stops
/// answering (the lock held 3.5 s), so the run's next commit (the proposal's or the dispatch's)
/// waits, and the lease lapses while it does. The commit comes back once the store answers —
/// the epoch still current, nobody took the session — but the run does not go on to run the
/// command: it ends `LeaseLost`, the command never ran.
async fn a_call_proposed_while_the_store_is_stalled_never_runs(b: Backend) {
    let call = json!({"delay_ms": 300, "tool_calls": [call("shell", json!({"command": "echo ran >> ran.txt"}))]});
    let (f, out) = stalled_run(b, call, "step.started").await;
    assert!(
        matches!(out, Err(RuntimeError::LeaseLost { .. })),
        "{out:?}"
    );
    assert!(
        !f.ws.path().join("ran.txt").exists(),
        "the command ran after the lease lapsed"
    );
}

/// A holder on another host whose clock is behind this one's: its lease looks expired here,
/// yet it keeps renewing it (the expiry moves). A short hold (closing the session) and a run
/// (`keel resume`) watching it see it renewed and report the session busy rather than take it:
/// the row untouched, the holder's effect stays `dispatched`, nobody declares it.
async fn an_expired_lease_its_holder_still_renews_is_not_taken(b: Backend) {
    let (f, lines, held) = left_to(b, ELSEWHERE, Duration::from_millis(1)).await;
    let elsewhere = ELSEWHERE;
    // The holder renews every 100 ms, each time to an expiry already past here.
    let store = f.db.store.clone();
    let tenant = f.tenant;
    let renewer = tokio::spawn(async move {
        loop {
            let _ = store
                .renew_leases(
                    tenant,
                    std::slice::from_ref(&held),
                    Duration::from_millis(1),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let rt = short_lease_runtime(&f, "next", &lines);
    let epoch =
        f.db.store
            .get_session(f.tenant, f.session)
            .await
            .unwrap()
            .lease_epoch;
    let closed = rt.close_session(f.tenant, f.session).await;
    assert!(
        matches!(&closed, Err(RuntimeError::SessionBusy { owner, .. }) if owner == elsewhere),
        "{closed:?}"
    );
    let run = rt.run(f.tenant, f.session).await;
    assert!(
        matches!(&run, Err(RuntimeError::SessionBusy { owner, .. }) if owner == elsewhere),
        "{run:?}"
    );
    renewer.abort();
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.lease_epoch, epoch, "the lease was never taken");
    assert_eq!(effect_statuses(&f).await, [EffectStatus::Dispatched]);
}

/// The holder on another host gives its expired lease back while a close watches it (300 ms
/// in): the close takes the lease then and answers for the session itself — refused because its
/// turn is open, not `SessionBusy` naming a holder that has finished (attack pass 3: the close,
/// a hold that does not wait, said busy once its watch saw the lease change).
async fn a_lease_released_while_watched_is_taken(b: Backend) {
    let (f, lines, held) = left_to(b, ELSEWHERE, Duration::from_millis(1)).await;
    let store = f.db.store.clone();
    let tenant = f.tenant;
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        store.release_lease(tenant, &held).await.unwrap();
    });
    let rt = short_lease_runtime(&f, "next", &lines);
    let closed = rt.close_session(f.tenant, f.session).await;
    release.await.unwrap();
    assert!(
        matches!(closed, Err(RuntimeError::TurnOpen { .. })),
        "{closed:?}"
    );
}
