//! Batched lease renewal ([`Store::renew_leases`]) and the claimer's own leases: one call
//! renews every lease still held (expired ones nobody took over included) in one statement and
//! leaves out the lost; a claimer does not take over its own lease until it has been expired
//! for a whole TTL.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;

use super::harness::Harness;
use super::scheduling::{SCHEMA, TTL, runnable};

fn ids(leases: &[Lease]) -> HashSet<SessionId> {
    leases.iter().map(|l| l.session_id).collect()
}

async fn claim_all(h: &Harness, t: TenantId, owner: &str, ttl: Duration, k: u32) -> Vec<Lease> {
    h.store
        .claim_sessions(t, owner, ttl, Utc::now(), SCHEMA, u64::MAX, k)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.lease)
        .collect()
}

pub async fn renew_leases_renews_every_held_lease_in_one_statement_and_leaves_out_the_lost(
    h: &Harness,
) {
    let t = TenantId::new();
    for _ in 0..6 {
        runnable(&h.store, t, 0, 1).await;
    }
    // Two of the six expire at once (a 1 ms TTL): one is taken over by another worker, the
    // other stays expired and is still its holder's.
    let held = claim_all(h, t, "w", TTL, 3).await;
    let short = claim_all(h, t, "w", Duration::from_millis(1), 2).await;
    let released = claim_all(h, t, "w", TTL, 1).await;
    assert_eq!((held.len(), short.len(), released.len()), (3, 2, 1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = h
        .store
        .acquire_lease(t, short[0].session_id, "other", TTL)
        .await
        .unwrap();
    h.store.release_lease(t, &released[0]).await.unwrap();
    // A lease of another tenant's session, named with this tenant: not renewed.
    let u = TenantId::new();
    runnable(&h.store, u, 0, 1).await;
    let foreign = claim_all(h, u, "w", TTL, 1).await;

    let mut asked: Vec<Lease> = held.clone();
    asked.extend(short.iter().cloned());
    asked.extend(released.iter().cloned());
    asked.extend(foreign.iter().cloned());
    let before = h.store.commits().leases;
    let long = Duration::from_secs(300);
    let renewed = h.store.renew_leases(t, &asked, long).await.unwrap();
    assert_eq!(
        h.store.commits().leases,
        before + 1,
        "one statement renews the batch"
    );
    let mut expected = ids(&held);
    expected.insert(short[1].session_id);
    assert_eq!(
        ids(&renewed),
        expected,
        "the held ones, the expired one included"
    );
    assert_eq!(renewed.len(), expected.len());
    let floor = Utc::now() + ChronoDuration::seconds(200);
    for l in &renewed {
        let asked = asked.iter().find(|a| a.session_id == l.session_id).unwrap();
        assert_eq!((&l.owner, l.epoch), (&asked.owner, asked.epoch));
        assert!(l.expires_at > floor, "{l:?}");
        let rec = h.store.get_session(t, l.session_id).await.unwrap();
        assert_eq!(rec.lease_epoch, l.epoch, "renewal keeps the epoch");
        assert_eq!(rec.lease.unwrap().expires_at, l.expires_at);
    }
    // The lost are untouched: the taker's lease, the released session, the other tenant's.
    let rec = h.store.get_session(t, taken.session_id).await.unwrap();
    assert_eq!(rec.lease.unwrap().owner, "other");
    assert_eq!(
        h.store
            .get_session(t, released[0].session_id)
            .await
            .unwrap()
            .lease,
        None
    );
    let rec = h.store.get_session(u, foreign[0].session_id).await.unwrap();
    assert_eq!(rec.lease.unwrap().expires_at, foreign[0].expires_at);
    // Each renewed lease renews again one by one; nothing asked, nothing written.
    for l in &renewed {
        h.store.renew_lease(t, l, TTL).await.unwrap();
    }
    let before = h.store.commits().leases;
    assert!(h.store.renew_leases(t, &[], TTL).await.unwrap().is_empty());
    assert!(
        h.store
            .renew_leases(t, &released, TTL)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(h.store.commits().leases, before);
}

pub async fn renew_leases_takes_more_than_one_statement_batch(h: &Harness) {
    let t = TenantId::new();
    for _ in 0..3 {
        runnable(&h.store, t, 0, 1).await;
    }
    let held = claim_all(h, t, "w", TTL, 3).await;
    // The same leases asked many times over: more than one statement's worth, each renewed
    // (every copy matches its row).
    let asked: Vec<Lease> = held.iter().cycle().take(RENEW_BATCH + 2).cloned().collect();
    let renewed = h.store.renew_leases(t, &asked, TTL).await.unwrap();
    assert_eq!(ids(&renewed), ids(&held));
}

pub async fn a_claimer_leaves_its_own_expired_lease_to_its_renewal_for_a_ttl(h: &Harness) {
    let t = TenantId::new();
    runnable(&h.store, t, 0, 1).await;
    let mine = claim_all(h, t, "w", Duration::from_millis(1), 1).await;
    assert_eq!(mine.len(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Expired, but its own: not claimed by "w" again (its run renews it instead).
    assert!(claim_all(h, t, "w", TTL, 10).await.is_empty());
    let renewed = h.store.renew_leases(t, &mine, TTL).await.unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(renewed[0].epoch, mine[0].epoch);
    // Once it has been expired for a whole TTL more, "w" takes it over like anyone's.
    let much_later =
        Utc::now() + ChronoDuration::from_std(TTL * 2).unwrap() + ChronoDuration::seconds(1);
    let again = h
        .store
        .claim_sessions(t, "w", TTL, much_later, SCHEMA, u64::MAX, 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].took_over.as_deref(), Some("w"));
    assert_eq!(again[0].lease.epoch, LeaseEpoch(mine[0].epoch.0 + 1));

    // Another worker takes an expired lease over at once.
    let u = TenantId::new();
    runnable(&h.store, u, 0, 1).await;
    let theirs = claim_all(h, u, "w", Duration::from_millis(1), 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = claim_all(h, u, "other", TTL, 10).await;
    assert_eq!(ids(&taken), ids(&theirs));
    assert!(
        h.store
            .renew_leases(u, &theirs, TTL)
            .await
            .unwrap()
            .is_empty(),
        "the taken-over lease is lost"
    );
}
