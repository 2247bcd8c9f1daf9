//! Claims of several sessions in one call ([`Store::claim_sessions`]): up to `k` in the claim
//! order, within the tenant's running-session limit, expired leases taken over with their
//! epochs bumped, and concurrent batch claimers never claiming a session twice.

use std::collections::HashSet;

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;

use super::harness::Harness;
use super::scheduling::{SCHEMA, TTL, runnable};

fn ids(claims: &[Claim]) -> Vec<SessionId> {
    claims.iter().map(|c| c.lease.session_id).collect()
}

pub async fn batch_claims_take_up_to_k_in_claim_order_within_the_limit(h: &Harness) {
    let t = TenantId::new();
    let mut made = Vec::new();
    for priority in [0, 2, 1, 0, 2] {
        made.push((priority, runnable(&h.store, t, priority, 1).await.id));
    }
    // Priority first (then the longest runnable: within a priority the order may tie on
    // the millisecond, so those are compared as sets).
    let of = |p: i32| -> HashSet<SessionId> {
        made.iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, id)| *id)
            .collect()
    };
    let batch = |limit: u32, max_leased: u64| {
        let store = h.store.clone();
        async move {
            store
                .claim_sessions(t, "w", TTL, Utc::now(), SCHEMA, max_leased, limit)
                .await
                .unwrap()
        }
    };
    assert!(
        batch(0, u64::MAX).await.is_empty(),
        "a limit of 0 claims nothing"
    );
    let first = batch(3, u64::MAX).await;
    assert_eq!(first.len(), 3);
    assert_eq!(ids(&first[..2]).into_iter().collect::<HashSet<_>>(), of(2));
    assert_eq!(ids(&first[2..]).into_iter().collect::<HashSet<_>>(), of(1));
    for c in &first {
        assert_eq!(c.tenant_id, t);
        assert_eq!(c.lease.owner, "w");
        // Created with epoch 1 (fixture), released, claimed: epoch 2.
        assert_eq!(c.lease.epoch, LeaseEpoch(2));
        assert_eq!(c.took_over, None);
        assert!(c.runnable_since.is_some());
        let rec = h.store.get_session(t, c.lease.session_id).await.unwrap();
        assert_eq!(rec.lease_epoch, LeaseEpoch(2));
        assert_eq!(rec.lease.unwrap().owner, "w");
    }
    let rest = batch(10, u64::MAX).await;
    assert_eq!(
        ids(&rest).into_iter().collect::<HashSet<_>>(),
        of(0),
        "the two left"
    );
    assert!(
        batch(10, u64::MAX).await.is_empty(),
        "every session is held"
    );

    // The tenant's limit bounds a batch: 4 claimable, limit 3 → 3, then none.
    let t2 = TenantId::new();
    for _ in 0..4 {
        runnable(&h.store, t2, 0, 1).await;
    }
    let limited = h
        .store
        .claim_sessions(t2, "w", TTL, Utc::now(), SCHEMA, 3, 10)
        .await
        .unwrap();
    assert_eq!(limited.len(), 3);
    let more = h
        .store
        .claim_sessions(t2, "w", TTL, Utc::now(), SCHEMA, 3, 10)
        .await
        .unwrap();
    assert!(more.is_empty(), "at the limit: {:?}", ids(&more));
}

/// A dead worker's sessions: once its leases have expired, one batch takes every one over,
/// each epoch bumped past the dead holder's (its writes are fenced off).
pub async fn expired_leases_are_taken_over_in_one_batch_with_their_epochs_bumped(h: &Harness) {
    let t = TenantId::new();
    for _ in 0..6 {
        runnable(&h.store, t, 0, 1).await;
    }
    let dead = h
        .store
        .claim_sessions(t, "dead", TTL, Utc::now(), SCHEMA, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(dead.len(), 6);
    let before_expiry = h
        .store
        .claim_sessions(t, "new", TTL, Utc::now(), SCHEMA, u64::MAX, 100)
        .await
        .unwrap();
    assert!(before_expiry.is_empty(), "live leases are not taken");
    let later = Utc::now() + ChronoDuration::from_std(TTL).unwrap() + ChronoDuration::seconds(1);
    let taken = h
        .store
        .claim_sessions(t, "new", TTL, later, SCHEMA, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(
        ids(&taken).into_iter().collect::<HashSet<_>>(),
        ids(&dead).into_iter().collect::<HashSet<_>>()
    );
    for c in &taken {
        assert_eq!(c.took_over.as_deref(), Some("dead"));
        assert_eq!(c.lease.epoch, LeaseEpoch(3));
        let old = dead
            .iter()
            .find(|d| d.lease.session_id == c.lease.session_id)
            .unwrap();
        // The dead holder's lease is fenced: renewing it fails.
        let renewed = h.store.renew_lease(t, &old.lease, TTL).await;
        assert!(
            matches!(renewed, Err(StoreError::LeaseLost { .. })),
            "{renewed:?}"
        );
    }
}

pub async fn concurrent_batch_claimers_never_claim_a_session_twice(h: &Harness) {
    let t = TenantId::new();
    let mut made = HashSet::new();
    for i in 0..40 {
        made.insert(runnable(&h.store, t, i % 3, 1).await.id);
    }
    // Four claimers, each with its own store (as four workers), 7 sessions per call.
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = h.reopen().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let owner = format!("worker-{w}");
            let mut mine = Vec::new();
            loop {
                let got = store
                    .claim_sessions(t, &owner, TTL, Utc::now(), SCHEMA, u64::MAX, 7)
                    .await
                    .unwrap();
                if got.is_empty() {
                    break;
                }
                assert!(got.len() <= 7);
                assert!(got.iter().all(|c| c.lease.owner == owner));
                mine.extend(got.into_iter().map(|c| c.lease.session_id));
            }
            mine
        }));
    }
    let mut claimed = Vec::new();
    for task in tasks {
        claimed.extend(task.await.unwrap());
    }
    let distinct: HashSet<SessionId> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), 40, "every session claimed exactly once");
    assert_eq!(distinct, made);
}

/// A round larger than the scheduler's largest (`keel_runtime::scheduler::MAX_CLAIM_BATCH`,
/// 1,000): the picked leases are taken by statements over up to 1,024 ids each (a second,
/// shorter one here, its list padded), within both backends' parameter limits.
pub async fn a_claim_of_over_a_thousand_sessions_takes_every_lease(h: &Harness) {
    let t = TenantId::new();
    let mut made = HashSet::new();
    for _ in 0..1030 {
        made.insert(runnable(&h.store, t, 0, 1).await.id);
    }
    let round = h
        .store
        .claim_sessions(t, "w", TTL, Utc::now(), SCHEMA, u64::MAX, 1029)
        .await
        .unwrap();
    assert_eq!(round.len(), 1029);
    let claimed: HashSet<SessionId> = ids(&round).into_iter().collect();
    assert_eq!(claimed.len(), 1029, "no session twice");
    assert!(claimed.is_subset(&made));
    assert!(round.iter().all(|c| c.lease.epoch == LeaseEpoch(2)));
    for some in [round[517].lease.session_id, round[1028].lease.session_id] {
        let rec = h.store.get_session(t, some).await.unwrap();
        assert_eq!(rec.lease_epoch, LeaseEpoch(2));
        assert_eq!(rec.lease.unwrap().owner, "w");
    }
    let rest = h
        .store
        .claim_sessions(t, "w", TTL, Utc::now(), SCHEMA, u64::MAX, 1000)
        .await
        .unwrap();
    assert_eq!(ids(&rest).len(), 1);
    assert!(!claimed.contains(&rest[0].lease.session_id));
}
