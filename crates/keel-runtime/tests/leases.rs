//! Taking a session's lease (`keel_runtime::lease::acquire`, issue 13): a holder that is a dead
//! process of this host and PID namespace is taken over at once; a holder in another PID
//! namespace on a host of the same name (another container) is waited out, whatever its
//! process id looks like here.

use std::time::{Duration, Instant};

use keel_runtime::RuntimeError;
use keel_runtime::lease::{self, LeaseOwner};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    a_worker_in_another_pid_namespace_keeps_its_lease_while_a_dead_local_one_loses_it,
    the_keeper_renews_every_lease_in_one_round_and_stops_a_run_whose_lease_was_taken,
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

/// `LeaseKeeper` (one heartbeat for every lease of a runtime): three leases taken a few
/// milliseconds apart are renewed together, by one statement (one lease commit, the same
/// expiry for all three), an expired one nobody took over included; a lease another worker
/// took over is reported lost (its run's token cancelled) and is renewed no more; a lease
/// whose `Kept` was dropped is renewed no more.
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
    // The last one has expired before it is kept: its holder still renews it.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
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
}
