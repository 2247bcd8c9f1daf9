//! Taking a session's lease (`keel_runtime::lease::acquire`, issue 13): a holder that is a dead
//! process of this host and PID namespace is taken over at once; a holder in another PID
//! namespace on a host of the same name (another container) is waited out, whatever its
//! process id looks like here. A session created held (`Runtime::create_session_held`) keeps
//! one lease from its creation to the end of its first run.

use std::time::{Duration, Instant};

use keel_core::{Budget, SessionStatus, TenantId, TurnStatus};
use keel_runtime::lease::{self, LeaseOwner};
use keel_runtime::{Runtime, RuntimeError, RuntimeOptions};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_worker_in_another_pid_namespace_keeps_its_lease_while_a_dead_local_one_loses_it,
    the_keeper_renews_every_lease_in_one_round_and_stops_a_run_whose_lease_was_taken,
    a_session_created_held_is_queued_cancelled_and_run_under_one_lease,
    a_held_lease_nothing_runs_is_given_back,
);

/// A process id that no process of this PID namespace has: beyond the kernel's `pid_max`.
const NO_SUCH_PID: u32 = 4_194_303;

/// The session's lease is held (TTL 60 s) by a worker of this host whose process id does not
/// exist here. In another PID namespace (its owner string says so), it may be alive: `acquire`
/// waits and reports the session busy, and the lease stays the holder's at the same epoch. In
/// this PID namespace it is dead: `acquire` takes the lease over at once.
async fn a_worker_in_another_pid_namespace_keeps_its_lease_while_a_dead_local_one_loses_it(
    b: Backend,
) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let store = f.db.store.clone();
    let here = lease::pid_namespace().expect("Linux has /proc/self/ns/pid");
    let ttl = Duration::from_secs(60);
    // `holder` takes the lease, then this process (worker "me") asks for it, waiting 300 ms.
    let take_from = |holder: LeaseOwner| {
        let store = store.clone();
        async move {
            let held = store
                .acquire_lease(f.tenant, f.session, &holder.to_string(), ttl)
                .await
                .unwrap();
            let me = lease::owner_string("me");
            let got = lease::acquire(
                &store,
                f.tenant,
                f.session,
                &me,
                ttl,
                Duration::from_millis(300),
            )
            .await;
            (held, got)
        }
    };

    let elsewhere = LeaseOwner {
        pid: NO_SUCH_PID,
        pid_ns: Some(here + 1),
        ..LeaseOwner::this_process("worker")
    };
    let (held, got) = take_from(elsewhere.clone()).await;
    let e = got.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::SessionBusy { owner, .. } if *owner == elsewhere.to_string()),
        "{e}"
    );
    let rec = store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.lease.map(|l| l.owner), Some(elsewhere.to_string()));
    assert_eq!(rec.lease_epoch, held.epoch, "nobody took it");
    store.release_lease(f.tenant, &held).await.unwrap();

    let dead_here = LeaseOwner {
        pid: NO_SUCH_PID,
        ..LeaseOwner::this_process("worker")
    };
    let (_, got) = take_from(dead_here).await;
    assert_eq!(got.unwrap().owner, lease::owner_string("me"));
}

/// `LeaseKeeper` (one heartbeat for every lease of a runtime): four leases taken a few
/// milliseconds apart, kept when most of their TTL has gone (a run's slow set-up), are renewed
/// together, by one statement (one lease commit, the same expiry for all four); a lease another
/// worker took over is reported lost (its run's token cancelled) and is renewed no more; a
/// lease whose `Kept` was dropped is renewed no more; a lease kept after it expired (another
/// worker may have it) lapses at once: its run is stopped, never renewed.
async fn the_keeper_renews_every_lease_in_one_round_and_stops_a_run_whose_lease_was_taken(
    b: Backend,
) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let store = f.db.store.clone();
    let mut sessions = vec![f.session];
    for _ in 0..3 {
        sessions.push(
            f.rt.create_session(
                f.tenant,
                &release(&[], Default::default()),
                config(f.ws.path()),
            )
            .await
            .unwrap(),
        );
    }
    let ttl = Duration::from_millis(600);
    let me = lease::owner_string("me");
    let mut leases = Vec::new();
    for s in &sessions {
        // Free the lease creation left, then take it for `ttl`, a little apart.
        let rec = store.get_session(f.tenant, *s).await.unwrap();
        if let Some(l) = rec.lease {
            let held = keel_store::Lease {
                session_id: *s,
                owner: l.owner,
                epoch: rec.lease_epoch,
                expires_at: l.expires_at,
            };
            store.release_lease(f.tenant, &held).await.unwrap();
        }
        leases.push(store.acquire_lease(f.tenant, *s, &me, ttl).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Kept with about a third of their TTL left (more than the fence's tenth): all due.
    tokio::time::sleep(ttl * 6 / 10).await;
    let keeper = lease::LeaseKeeper::new(store.clone(), ttl);
    let lost: Vec<_> = leases
        .iter()
        .map(|_| tokio_util::sync::CancellationToken::new())
        .collect();
    let before = store.commits().leases;
    let kept: Vec<_> = leases
        .iter()
        .zip(&lost)
        .map(|(l, t)| keeper.keep(f.tenant, l.clone(), t.clone()))
        .collect();
    assert_eq!(keeper.len(), 4);
    // Renewed: every expiry moved past where it was (a deadline 10x the TTL).
    let deadline = Instant::now() + ttl * 10;
    let expiries = loop {
        let mut now = Vec::new();
        for l in &leases {
            let rec = store.get_session(f.tenant, l.session_id).await.unwrap();
            assert_eq!(rec.lease_epoch, l.epoch, "renewal keeps the epoch");
            now.push(rec.lease.unwrap().expires_at);
        }
        if now.iter().zip(&leases).all(|(e, l)| *e > l.expires_at) {
            break now;
        }
        assert!(Instant::now() < deadline, "not renewed: {now:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        expiries.iter().all(|e| *e == expiries[0]),
        "renewed together, by one statement: {expiries:?}"
    );
    assert!(store.commits().leases > before);
    assert!(lost.iter().all(|t| !t.is_cancelled()));

    // Only the first and third are kept now; another worker takes the first over (as from a
    // dead holder): its run learns it lost its lease, the third's does not.
    drop(kept);
    let kept = vec![
        keeper.keep(f.tenant, leases[0].clone(), lost[0].clone()),
        keeper.keep(f.tenant, leases[2].clone(), lost[2].clone()),
    ];
    let rec = store
        .get_session(f.tenant, leases[0].session_id)
        .await
        .unwrap();
    let taken = store
        .take_over_lease(
            f.tenant,
            leases[0].session_id,
            &me,
            rec.lease_epoch,
            "other",
            ttl,
        )
        .await
        .unwrap();
    let deadline = Instant::now() + ttl * 10;
    while !lost[0].is_cancelled() {
        assert!(
            Instant::now() < deadline,
            "the taken lease was not found lost"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!lost[2].is_cancelled());
    assert_eq!(keeper.len(), 1, "the lost lease is kept no more");
    let rec = store.get_session(f.tenant, taken.session_id).await.unwrap();
    assert_eq!(rec.lease_epoch, taken.epoch);
    assert_eq!(rec.lease.unwrap().owner, "other");
    drop(kept);
    assert!(keeper.is_empty());

    // Kept after it expired: fenced at once, not renewed.
    let mine = leases[1].clone();
    let rec = store.get_session(f.tenant, mine.session_id).await.unwrap();
    let expired = keel_store::Lease {
        expires_at: rec.lease.unwrap().expires_at,
        ..mine
    };
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let lapsed = tokio_util::sync::CancellationToken::new();
    let _kept = keeper.keep(f.tenant, expired.clone(), lapsed.clone());
    tokio::time::timeout(ttl * 10, lapsed.cancelled())
        .await
        .expect("an expired lease kept was not fenced");
    assert!(keeper.is_empty());
    let rec = store
        .get_session(f.tenant, expired.session_id)
        .await
        .unwrap();
    assert_eq!(
        rec.lease.unwrap().expires_at,
        expired.expires_at,
        "not renewed"
    );
}

/// A runtime (worker `name`, lease TTL 60 s: no renewal within a test) on `f`'s store with
/// `lines` scripted.
fn runtime_named(db: &Db, name: &str, lines: &[serde_json::Value]) -> Runtime {
    Runtime::new(
        db.store.clone(),
        scripted(lines),
        registry(),
        RuntimeOptions {
            worker_name: name.into(),
            lease_ttl: Duration::from_secs(60),
            lease_wait: Duration::from_millis(200),
            ..RuntimeOptions::default()
        },
    )
}

/// `create_session_held`, two submits, a cancel of the first turn and the run: the session's
/// lease comes with its row (in the row's commit) and is released once, at the run's end — one
/// lease commit, where `create_session` and the same calls make nine (the release after the
/// creation; a take and a release for each submit, the cancel and the run) — and no other
/// worker can take the session meanwhile. Both turns end as they would without the held lease
/// (the first aborted, the second completed), and the lease is free afterwards.
async fn a_session_created_held_is_queued_cancelled_and_run_under_one_lease(b: Backend) {
    let db = db(b).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let lines = [json!({"text": "done"})];
    let leases = |db: &Db| db.store.commits().leases;
    let mut counts = Vec::new();
    for held in [true, false] {
        let rt = runtime_named(&db, "held", &lines);
        let before = leases(&db);
        let rel = release(&[], Budget::default());
        let session = if held {
            rt.create_session_held(tenant, &rel, config(ws.path()))
                .await
        } else {
            rt.create_session(tenant, &rel, config(ws.path())).await
        }
        .unwrap();
        let first = rt.submit(tenant, session, "first").await.unwrap();
        let second = rt.submit(tenant, session, "second").await.unwrap();
        if held {
            let other = runtime_named(&db, "other", &lines);
            let e = other.run(tenant, session).await.unwrap_err();
            assert!(matches!(e, RuntimeError::SessionBusy { .. }), "{e}");
        }
        assert_eq!(rt.cancel_turn(tenant, session).await.unwrap(), first);
        let out = rt.run(tenant, session).await.unwrap();
        assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
        let state = rt.view(tenant, session).await.unwrap().state;
        assert_eq!(state.turns[&first].status, TurnStatus::Aborted);
        assert_eq!(state.turns[&second].status, TurnStatus::Completed);
        let rec = db.store.get_session(tenant, session).await.unwrap();
        assert!(
            rec.lease.is_none(),
            "released at the run's end: {:?}",
            rec.lease
        );
        rt.release_held(tenant, session).await;
        counts.push(leases(&db) - before);
    }
    assert_eq!(counts, [1, 9], "lease commits held / not held");
}

/// A held lease no run takes (the host ran a command instead of a turn) is given back by
/// `release_held` (a turn it queued under the lease kept), after which another worker runs the
/// session at once; a second
/// `release_held` does nothing.
async fn a_held_lease_nothing_runs_is_given_back(b: Backend) {
    let db = db(b).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let lines = [json!({"text": "done"})];
    let rt = runtime_named(&db, "held", &lines);
    let session = rt
        .create_session_held(tenant, &release(&[], Budget::default()), config(ws.path()))
        .await
        .unwrap();
    let rec = db.store.get_session(tenant, session).await.unwrap();
    assert_eq!(rec.lease.map(|l| l.owner), Some(rt.owner().to_owned()));
    let other = runtime_named(&db, "other", &lines);
    rt.submit(tenant, session, "go").await.unwrap();
    assert!(matches!(
        other.run(tenant, session).await.unwrap_err(),
        RuntimeError::SessionBusy { .. }
    ));
    rt.release_held(tenant, session).await;
    rt.release_held(tenant, session).await;
    assert!(
        db.store
            .get_session(tenant, session)
            .await
            .unwrap()
            .lease
            .is_none()
    );
    let out = other.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
}
