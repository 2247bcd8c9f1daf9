//! The scheduler's store side (`keel_store::scheduling`): work marks written with appends,
//! claims in priority then age order with their leases, what makes a session claimable (a
//! runnable mark, a decided approval, an intent, a due timer) and what does not (a live lease,
//! a deferral, a newer event schema), concurrent claimers, wake-ups, queue depths and token
//! windows.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;
use serde_json::json;

use super::cases::approval;
use super::harness::{Harness, Location, events, session};

pub(super) const TTL: Duration = Duration::from_secs(30);
/// The event schema this build writes (every appended event's envelope).
pub(super) const SCHEMA: u32 = 2;

/// A session of the test: its lease (while held) and journal version.
pub(super) struct S {
    pub(super) id: SessionId,
    lease: Lease,
    version: u64,
}

/// A created session, leased by `worker-a`, at version 1.
async fn new_session(store: &Arc<dyn Store>, t: TenantId) -> S {
    let f = session(store, t).await;
    S {
        id: f.session,
        lease: f.lease,
        version: 1,
    }
}

fn work(runnable: bool, queued_turns: u32) -> AppendExtras {
    AppendExtras {
        work: Some(WorkMark {
            runnable,
            queued_turns,
        }),
        ..AppendExtras::default()
    }
}

/// Appends one event under `s`'s lease with `extras`.
async fn commit(store: &Arc<dyn Store>, t: TenantId, s: &mut S, extras: &AppendExtras) {
    s.version = store
        .append_with(
            t,
            s.id,
            s.version,
            s.lease.epoch,
            &events(s.id, s.version, 1),
            extras,
        )
        .await
        .unwrap();
}

/// Ends a run of `s` under `lease` with nothing left to do: not runnable, claim released.
async fn finish(store: &Arc<dyn Store>, t: TenantId, s: &mut S, lease: Lease) {
    s.lease = lease;
    commit(store, t, s, &work(false, 0)).await;
    store.release_claim(t, &s.lease, None, None).await.unwrap();
}

/// A session marked runnable with `queued` turns at `priority`, its lease released: claimable.
pub(super) async fn runnable(store: &Arc<dyn Store>, t: TenantId, priority: i32, queued: u32) -> S {
    let mut s = new_session(store, t).await;
    commit(
        store,
        t,
        &mut s,
        &AppendExtras {
            priority: Some(priority),
            ..work(true, queued)
        },
    )
    .await;
    store.release_lease(t, &s.lease).await.unwrap();
    s
}

async fn claim(store: &Arc<dyn Store>, t: TenantId, owner: &str) -> Option<Claim> {
    store
        .claim_session(t, owner, TTL, Utc::now(), SCHEMA, u64::MAX)
        .await
        .unwrap()
}

async fn claim_id(store: &Arc<dyn Store>, t: TenantId) -> Option<SessionId> {
    claim(store, t, "w").await.map(|c| c.lease.session_id)
}

/// Unix ms, as the store keeps times.
fn ms(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap()
}

/// A `wait_for_work` of `store` (20 s at most), started and given time to begin waiting.
async fn waiting(store: &Arc<dyn Store>) -> tokio::task::JoinHandle<Result<bool, StoreError>> {
    let store = store.clone();
    let waiter = tokio::spawn(async move { store.wait_for_work(Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter
}

/// The tenants with claimable sessions at `now` (for this build's schema).
async fn tenants(store: &Arc<dyn Store>, now: DateTime<Utc>) -> Vec<TenantBacklog> {
    store.runnable_tenants(now, SCHEMA, 10).await.unwrap()
}

/// Whether a `wait_for_work` of `store` of at most `ms` milliseconds was woken.
async fn woken(store: &Arc<dyn Store>, ms: u64) -> bool {
    store
        .wait_for_work(Duration::from_millis(ms))
        .await
        .unwrap()
}

/// Decides approval `a` of tenant `t`: allowed once, now.
async fn allow(store: &Arc<dyn Store>, t: TenantId, a: &ApprovalRecord) -> Decided {
    store
        .decide_approval(
            t,
            a.approval_id,
            ApprovalDecision::AllowOnce,
            &a.args_hash,
            Utc::now(),
        )
        .await
        .unwrap()
}

fn is_postgres(h: &Harness) -> bool {
    matches!(h.location, Location::Postgres { .. })
}

pub async fn appends_mark_sessions_runnable_and_keep_runnable_since(h: &Harness) {
    let t = TenantId::new();
    let mut s = new_session(&h.store, t).await;
    // A plain append leaves the mark (not runnable): nothing to claim, nothing queued.
    commit(&h.store, t, &mut s, &AppendExtras::default()).await;
    assert_eq!(h.store.queue_depth(t).await.unwrap(), (0, 0));
    let before = ms(Utc::now());
    commit(&h.store, t, &mut s, &work(true, 2)).await;
    let after = ms(Utc::now());
    assert_eq!(h.store.queue_depth(t).await.unwrap(), (2, 2));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The schema version only rises: this build's append (schema 2) raises 1 and keeps 3.
    let id = s.id;
    let set_schema =
        |v: u32| format!("UPDATE sessions SET schema_version = {v} WHERE session_id = '{id}'");
    h.raw(&set_schema(1)).await;
    commit(&h.store, t, &mut s, &work(true, 2)).await;
    assert_eq!(h.store.newer_schema_sessions(1).await.unwrap(), 1);
    assert_eq!(h.store.newer_schema_sessions(SCHEMA).await.unwrap(), 0);
    h.raw(&set_schema(SCHEMA + 1)).await;
    commit(&h.store, t, &mut s, &work(true, 2)).await;
    assert_eq!(h.store.newer_schema_sessions(SCHEMA).await.unwrap(), 1);
    h.raw(&set_schema(SCHEMA)).await;
    // Still runnable, one turn started: runnable_since stays the first mark's.
    commit(&h.store, t, &mut s, &work(true, 1)).await;
    // Leased by the appender: not claimable yet.
    assert_eq!(claim_id(&h.store, t).await, None);
    let tenants = tenants(&h.store, Utc::now()).await;
    assert!(tenants.iter().all(|b| b.tenant_id != t), "{tenants:?}");
    h.store.release_lease(t, &s.lease).await.unwrap();
    let c = claim(&h.store, t, "w").await.unwrap();
    assert_eq!(c.lease.session_id, s.id);
    assert_eq!(c.tenant_id, t);
    let since = c.runnable_since.expect("claimed as runnable");
    assert!(
        before <= since && since <= after,
        "runnable since {since}, marked between {before} and {after}"
    );
    assert_eq!(h.store.queue_depth(t).await.unwrap(), (1, 1));
    // Not runnable any more: the mark and queue clear, and nothing is claimable after release.
    finish(&h.store, t, &mut s, c.lease).await;
    assert_eq!(claim_id(&h.store, t).await, None);
    assert_eq!(h.store.queue_depth(t).await.unwrap(), (0, 0));
    // Runnable again: a new runnable_since.
    s.lease = h.store.acquire_lease(t, s.id, "w", TTL).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = ms(Utc::now());
    commit(&h.store, t, &mut s, &work(true, 1)).await;
    h.store.release_lease(t, &s.lease).await.unwrap();
    let c = claim(&h.store, t, "w").await.unwrap();
    assert!(c.runnable_since.unwrap() >= again, "{:?}", c.runnable_since);
}

pub async fn batched_appends_mark_each_session(h: &Harness) {
    // Concurrent appends from one handle: SQLite commits them in groups (set-wise for plain
    // marks, in savepoints for appends with side-table extras); each session gets its own mark.
    let t = TenantId::new();
    let mut sessions = Vec::new();
    for _ in 0..12 {
        sessions.push(new_session(&h.store, t).await);
    }
    let mut tasks = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        let store = h.store.clone();
        let (id, epoch) = (s.id, s.lease.epoch);
        tasks.push(tokio::spawn(async move {
            let mut extras = work(i % 3 != 0, u32::try_from(i).unwrap());
            extras.priority = Some(i32::try_from(i).unwrap());
            if i % 4 == 0 {
                // A side-table write too: this one commits in its own savepoint.
                extras.wake_at = Some(Some(Utc::now() + ChronoDuration::hours(1)));
            }
            store
                .append_with(t, id, 1, epoch, &events(id, 1, 3), &extras)
                .await
                .unwrap()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 4);
    }
    for s in &sessions {
        h.store.release_lease(t, &s.lease).await.unwrap();
    }
    let expected_queue: u64 = (0..12u64).sum();
    assert_eq!(
        h.store.queue_depth(t).await.unwrap(),
        (expected_queue, expected_queue)
    );
    // Runnable: every i not divisible by 3, claimed by priority (= i), highest first.
    let mut claimed = Vec::new();
    while let Some(id) = claim_id(&h.store, t).await {
        claimed.push(sessions.iter().position(|s| s.id == id).unwrap());
    }
    assert_eq!(claimed, vec![11, 10, 8, 7, 5, 4, 2, 1]);
}

pub async fn claims_follow_priority_then_age_then_timers_and_intents(h: &Harness) {
    let t = TenantId::new();
    let old = runnable(&h.store, t, 0, 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let young = runnable(&h.store, t, 0, 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let urgent = runnable(&h.store, t, 5, 1).await;
    let low = runnable(&h.store, t, -1, 1).await;
    // A due timer and an intent on sessions that are not runnable.
    let timer = new_session(&h.store, t).await;
    h.store
        .set_wake_at(t, timer.id, Some(Utc::now() - ChronoDuration::seconds(1)))
        .await
        .unwrap();
    h.store.release_lease(t, &timer.lease).await.unwrap();
    let intent = new_session(&h.store, t).await;
    h.store.release_lease(t, &intent.lease).await.unwrap();
    h.store
        .post_intent(t, intent.id, "cancel", &json!({}))
        .await
        .unwrap();
    // Neither a future timer nor a session without work is claimable.
    let later = new_session(&h.store, t).await;
    h.store
        .set_wake_at(t, later.id, Some(Utc::now() + ChronoDuration::hours(1)))
        .await
        .unwrap();
    h.store.release_lease(t, &later.lease).await.unwrap();
    let idle = new_session(&h.store, t).await;
    h.store.release_lease(t, &idle.lease).await.unwrap();
    // Another tenant's work is not this tenant's.
    let other = TenantId::new();
    runnable(&h.store, other, 9, 1).await;

    let backlog = tenants(&h.store, Utc::now()).await;
    let mine = backlog.iter().find(|b| b.tenant_id == t).unwrap();
    assert_eq!((mine.claimable, mine.leased), (6, 0));
    assert_eq!(backlog.len(), 2, "{backlog:?}");

    let mut order = Vec::new();
    let mut claims = Vec::new();
    while let Some(c) = claim(&h.store, t, "w").await {
        order.push(c.lease.session_id);
        claims.push(c);
    }
    // Priority first (timers and intents have the default, 0), then the runnable by age, then
    // the due timer, then the intent.
    assert_eq!(
        order,
        vec![urgent.id, old.id, young.id, timer.id, intent.id, low.id]
    );
    let marked: Vec<bool> = claims.iter().map(|c| c.runnable_since.is_some()).collect();
    assert_eq!(marked, vec![true, true, true, false, false, true]);
    // Every claim is a lease: the tenant now has 6 under live leases and nothing claimable.
    assert!(
        tenants(&h.store, Utc::now())
            .await
            .iter()
            .all(|b| b.tenant_id != t)
    );
    assert!(claim_id(&h.store, other).await.is_some());
}

pub async fn claims_skip_held_deferred_and_newer_schema_sessions_and_take_over_expired_ones(
    h: &Harness,
) {
    let t = TenantId::new();
    // Runnable but held by a live lease (the lowest priority, so it is claimed last).
    let mut held = new_session(&h.store, t).await;
    commit(
        &h.store,
        t,
        &mut held,
        &AppendExtras {
            priority: Some(-1),
            ..work(true, 1)
        },
    )
    .await;
    // Deferred by its last claim.
    let deferred = runnable(&h.store, t, 0, 1).await;
    let c = claim(&h.store, t, "w").await.unwrap();
    assert_eq!(c.lease.session_id, deferred.id);
    let until = Utc::now() + ChronoDuration::hours(1);
    h.store
        .release_claim(t, &c.lease, Some(until), None)
        .await
        .unwrap();
    // Written by a newer event schema.
    let newer = runnable(&h.store, t, 0, 1).await;
    h.raw(&format!(
        "UPDATE sessions SET schema_version = {} WHERE session_id = '{}'",
        SCHEMA + 1,
        newer.id
    ))
    .await;
    assert_eq!(claim_id(&h.store, t).await, None);
    assert_eq!(h.store.newer_schema_sessions(SCHEMA).await.unwrap(), 1);
    assert_eq!(h.store.newer_schema_sessions(SCHEMA + 1).await.unwrap(), 0);
    let backlog = tenants(&h.store, Utc::now()).await;
    assert!(backlog.iter().all(|b| b.tenant_id != t), "{backlog:?}");
    // A newer worker claims the newer session; past the deferral the deferred one is claimable.
    let c = h
        .store
        .claim_session(t, "new", TTL, Utc::now(), SCHEMA + 1, u64::MAX)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.lease.session_id, newer.id);
    let c = h
        .store
        .claim_session(
            t,
            "w",
            TTL,
            until + ChronoDuration::seconds(1),
            SCHEMA,
            u64::MAX,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.lease.session_id, deferred.id);

    // An expired lease: taken over, the previous holder named, the epoch bumped once. (The
    // caller's clock decides expiry: a claim a minute later.)
    h.store.release_lease(t, &held.lease).await.unwrap();
    let dead = h
        .store
        .acquire_lease(t, held.id, "dead", TTL)
        .await
        .unwrap();
    let backlog = tenants(&h.store, Utc::now()).await;
    assert!(backlog.iter().all(|b| b.tenant_id != t), "{backlog:?}");
    let minute_later = Utc::now() + ChronoDuration::minutes(1);
    let backlog = tenants(&h.store, minute_later).await;
    let mine = backlog.iter().find(|b| b.tenant_id == t).unwrap();
    // Claimable: the expired one; under live leases: the deferred one's claim (the newer
    // session's claim has expired by then too, but its schema is not this worker's).
    assert_eq!((mine.claimable, mine.leased), (1, 1));
    let before = h.store.commits();
    let c = h
        .store
        .claim_session(t, "w2", TTL, minute_later, SCHEMA, u64::MAX)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h.store.commits().leases, before.leases + 1);
    assert_eq!(c.lease.session_id, held.id);
    assert_eq!(c.took_over.as_deref(), Some("dead"));
    assert_eq!(c.lease.epoch, LeaseEpoch(dead.epoch.0 + 1));
    assert_eq!(c.lease.owner, "w2");
    let rec = h.store.get_session(t, held.id).await.unwrap();
    assert_eq!(rec.lease_epoch, c.lease.epoch);
    assert_eq!(rec.lease.unwrap().owner, "w2");
    // A claim of a free session takes over nobody.
    let free = runnable(&h.store, t, 0, 1).await;
    let c2 = claim(&h.store, t, "w2").await.unwrap();
    assert_eq!(c2.lease.session_id, free.id);
    assert_eq!(c2.took_over, None);
    assert_eq!(c2.lease.epoch, LeaseEpoch(free.lease.epoch.0 + 1));

    // Fencing: the previous holder's appends are refused; the claimer's go through.
    let stale = h
        .store
        .append(
            t,
            held.id,
            held.version,
            dead.epoch,
            &events(held.id, held.version, 1),
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost { current, .. }) if current == c.lease.epoch),
        "{stale:?}"
    );
    assert_eq!(
        h.store
            .append(
                t,
                held.id,
                held.version,
                c.lease.epoch,
                &events(held.id, held.version, 1)
            )
            .await
            .unwrap(),
        held.version + 1
    );
    // Releasing with the lost lease is refused and writes nothing.
    let lost = h
        .store
        .release_claim(t, &dead, Some(Utc::now() + ChronoDuration::hours(1)), None)
        .await;
    assert!(
        matches!(lost, Err(StoreError::LeaseLost { .. })),
        "{lost:?}"
    );
    let rec = h.store.get_session(t, held.id).await.unwrap();
    assert_eq!(rec.lease.unwrap().owner, "w2");
}

pub async fn decisions_and_intents_make_a_session_claimable(h: &Harness) {
    let t = TenantId::new();
    let mut s = new_session(&h.store, t).await;
    // Waiting on a human: not runnable, a wake-up at the approval's expiry.
    let a = approval(s.id, "call");
    let expiry = ms(a.expires_at);
    commit(
        &h.store,
        t,
        &mut s,
        &AppendExtras {
            approvals: vec![a.clone()],
            wake_at: Some(Some(expiry)),
            ..work(false, 0)
        },
    )
    .await;
    h.store.release_lease(t, &s.lease).await.unwrap();
    assert_eq!(claim_id(&h.store, t).await, None);
    assert!(matches!(allow(&h.store, t, &a).await, Decided::Now(_)));
    let wake = h.store.get_session(t, s.id).await.unwrap().wake_at.unwrap();
    assert!(wake <= Utc::now() && wake < expiry, "{wake}");
    let served = Utc::now();
    let c = claim(&h.store, t, "w").await.unwrap();
    assert_eq!(c.lease.session_id, s.id);
    assert_eq!(c.runnable_since, None);
    // The run serves the decision and sets a later timer; releasing clears only the served one.
    let later = ms(Utc::now() + ChronoDuration::minutes(10));
    h.store.set_wake_at(t, s.id, Some(later)).await.unwrap();
    h.store
        .release_claim(t, &c.lease, None, Some(served))
        .await
        .unwrap();
    assert_eq!(
        h.store.get_session(t, s.id).await.unwrap().wake_at,
        Some(later)
    );
    assert_eq!(claim_id(&h.store, t).await, None);
    // A decision again (a second approval) makes the wake-up due now, earlier than the timer.
    s.lease = h.store.acquire_lease(t, s.id, "w", TTL).await.unwrap();
    let b = approval(s.id, "call2");
    commit(
        &h.store,
        t,
        &mut s,
        &AppendExtras {
            approvals: vec![b.clone()],
            ..work(false, 0)
        },
    )
    .await;
    h.store.release_lease(t, &s.lease).await.unwrap();
    h.store
        .decide_approval(
            t,
            b.approval_id,
            ApprovalDecision::Deny {
                reason: "no".into(),
            },
            &b.args_hash,
            Utc::now(),
        )
        .await
        .unwrap();
    let c = claim(&h.store, t, "w").await.unwrap();
    assert_eq!(c.lease.session_id, s.id);
    // Served and released: the due wake-up is cleared; a later timer was replaced, none left.
    h.store
        .release_claim(t, &c.lease, None, Some(Utc::now()))
        .await
        .unwrap();
    assert_eq!(h.store.get_session(t, s.id).await.unwrap().wake_at, None);
    assert_eq!(claim_id(&h.store, t).await, None);

    // An intent: claimable until it is handled.
    h.store
        .post_intent(t, s.id, "input", &json!({"text": "hi"}))
        .await
        .unwrap();
    let c = claim(&h.store, t, "w").await.unwrap();
    assert_eq!(c.lease.session_id, s.id);
    assert_eq!(claim_id(&h.store, t).await, None, "claimed: leased now");
    h.store
        .release_claim(t, &c.lease, None, None)
        .await
        .unwrap();
    let c = claim(&h.store, t, "w").await.unwrap();
    for i in h.store.list_intents(t, s.id).await.unwrap() {
        assert!(h.store.delete_intent(t, s.id, &i.intent_id).await.unwrap());
    }
    h.store
        .release_claim(t, &c.lease, None, None)
        .await
        .unwrap();
    assert_eq!(claim_id(&h.store, t).await, None);
}

pub async fn concurrent_claimers_never_claim_a_session_twice(h: &Harness) {
    let t = TenantId::new();
    let mut ids = HashSet::new();
    for i in 0..50 {
        ids.insert(runnable(&h.store, t, i % 3, 1).await.id);
    }
    // Eight claimers, each with its own store (its own connections), as eight workers.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = h.reopen().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let owner = format!("worker-{w}");
            let mut mine = Vec::new();
            while let Some(c) = store
                .claim_session(t, &owner, TTL, Utc::now(), SCHEMA, u64::MAX)
                .await
                .unwrap()
            {
                assert_eq!(c.lease.owner, owner);
                mine.push(c.lease);
            }
            mine
        }));
    }
    let mut claimed = Vec::new();
    for task in tasks {
        claimed.extend(task.await.unwrap());
    }
    let distinct: HashSet<SessionId> = claimed.iter().map(|l| l.session_id).collect();
    assert_eq!(claimed.len(), 50, "every session claimed exactly once");
    assert_eq!(distinct, ids);
    for lease in &claimed {
        let rec = h.store.get_session(t, lease.session_id).await.unwrap();
        // Created with epoch 1 (fixture), released, claimed once: epoch 2, the claimer's.
        assert_eq!(rec.lease_epoch, LeaseEpoch(2));
        assert_eq!(rec.lease.unwrap().owner, lease.owner);
    }
    let backlog = tenants(&h.store, Utc::now()).await;
    assert!(backlog.iter().all(|b| b.tenant_id != t));
}

/// `claim_session`'s `max_leased`: the tenant's sessions under a live lease (any holder,
/// claimed or not) bound its claims; an expired lease counts no more. Then eight claimers,
/// each with its own store (as eight worker processes), race for 24 sessions of one tenant
/// with a limit of 3, each holding what it claimed for 50 ms: at no moment do they hold more
/// than 3 leases together (counted from a claim's return to before its release, inside the
/// lease's life in the store), and every session is claimed once.
pub async fn concurrent_claimers_never_take_a_tenant_past_its_session_limit(h: &Harness) {
    let t = TenantId::new();
    // Leased outside any claim (a host's `acquire_lease`): it counts.
    let outside = new_session(&h.store, t).await;
    for _ in 0..3 {
        runnable(&h.store, t, 0, 1).await;
    }
    let limited = |now| {
        let store = h.store.clone();
        async move {
            store
                .claim_session(t, "w", TTL, now, SCHEMA, 2)
                .await
                .unwrap()
        }
    };
    assert!(limited(Utc::now()).await.is_some());
    assert!(
        limited(Utc::now()).await.is_none(),
        "the session leased outside a claim and the claim make two"
    );
    h.store.release_lease(t, &outside.lease).await.unwrap();
    assert!(limited(Utc::now()).await.is_some());
    assert!(limited(Utc::now()).await.is_none(), "two claims");
    // Once both leases have expired they count no more.
    let later = Utc::now() + ChronoDuration::from_std(TTL).unwrap() + ChronoDuration::seconds(1);
    assert!(limited(later).await.is_some());

    const SESSIONS: usize = 24;
    const LIMIT: u64 = 3;
    let t = TenantId::new();
    let mut ids = HashSet::new();
    for _ in 0..SESSIONS {
        ids.insert(runnable(&h.store, t, 0, 1).await.id);
    }
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let claimed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = h.reopen().await.unwrap();
        let (held, most, claimed) = (held.clone(), most.clone(), claimed.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("worker-{w}");
            let mut mine = Vec::new();
            while claimed.load(Ordering::SeqCst) < SESSIONS {
                let Some(c) = store
                    .claim_session(t, &owner, TTL, Utc::now(), SCHEMA, LIMIT)
                    .await
                    .unwrap()
                else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                claimed.fetch_add(1, Ordering::SeqCst);
                let now_held = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now_held, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                held.fetch_sub(1, Ordering::SeqCst);
                // Given back deferred for an hour: claimed no more.
                store
                    .release_claim(
                        t,
                        &c.lease,
                        Some(Utc::now() + ChronoDuration::hours(1)),
                        None,
                    )
                    .await
                    .unwrap();
                mine.push(c.lease.session_id);
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} leases held at once (limit {LIMIT})");
    assert_eq!(most, LIMIT, "the claimers did overlap up to the limit");
    assert_eq!(all.len(), SESSIONS, "every session claimed exactly once");
    assert_eq!(all.into_iter().collect::<HashSet<_>>(), ids);
}

pub async fn wait_for_work_is_woken_by_work_from_another_handle(h: &Harness) {
    let t = TenantId::new();
    // PostgreSQL: another store on the same schema (another process); SQLite: this process.
    let other = if is_postgres(h) {
        h.reopen().await.unwrap()
    } else {
        h.store.clone()
    };
    let mut s = new_session(&other, t).await;
    assert!(
        !woken(&h.store, 200).await,
        "nothing happened: the wait times out"
    );
    // An append that makes a session runnable wakes a waiting worker.
    let waiter = waiting(&h.store).await;
    commit(&other, t, &mut s, &work(true, 1)).await;
    assert!(waiter.await.unwrap().unwrap(), "woken by the append");
    // Giving the lease back with work left wakes again: the session is claimable only now. A
    // wake-up that arrives while nobody waits is kept for the next wait.
    other.release_lease(t, &s.lease).await.unwrap();
    assert!(woken(&h.store, 20000).await);
    let c = claim(&h.store, t, "w").await.unwrap();
    // A release that leaves no work wakes nobody.
    finish(&h.store, t, &mut s, c.lease).await;
    assert!(
        !woken(&h.store, 300).await,
        "no work left: nothing to wake for"
    );
    // An intent and a decision are work too.
    let waiter = waiting(&h.store).await;
    other
        .post_intent(t, s.id, "cancel", &json!({}))
        .await
        .unwrap();
    assert!(waiter.await.unwrap().unwrap(), "woken by the intent");
    let a = approval(s.id, "c");
    other.create_approval(t, &a).await.unwrap();
    let waiter = waiting(&h.store).await;
    allow(&other, t, &a).await;
    assert!(waiter.await.unwrap().unwrap(), "woken by the decision");
}

pub async fn token_windows_admit_refuse_and_settle(h: &Harness) {
    let (t, u) = (TenantId::new(), TenantId::new());
    let w = 1_800_000_000_000; // a minute's start, Unix ms
    // Reservations against a limit of 1000 tokens a minute.
    let at = |tenant, start, tokens| h.store.reserve_tokens(tenant, start, tokens, 1000);
    let r = |tokens| at(t, w, tokens);
    let window = |admitted, used| TokenWindow { admitted, used };
    assert_eq!(r(600).await.unwrap(), window(true, 600));
    assert_eq!(r(500).await.unwrap(), window(false, 600), "over the limit");
    assert_eq!(
        r(400).await.unwrap(),
        window(true, 1000),
        "exactly the limit"
    );
    assert_eq!(r(1).await.unwrap(), window(false, 1000));
    // The steps used less than reserved.
    h.store.settle_tokens(t, w, -700).await.unwrap();
    assert_eq!(r(800).await.unwrap(), window(false, 300));
    assert_eq!(r(700).await.unwrap(), window(true, 1000));
    // Settled below zero: the window is empty (clamped), and an empty window admits one
    // request larger than the limit, alone.
    h.store.settle_tokens(t, w, -5000).await.unwrap();
    assert_eq!(r(5000).await.unwrap(), window(true, 5000));
    assert_eq!(r(1).await.unwrap(), window(false, 5000));
    // A step that used more than reserved counts it.
    h.store.settle_tokens(t, w, 250).await.unwrap();
    assert_eq!(r(1).await.unwrap(), window(false, 5250));
    // Another tenant's window is its own; its first request is admitted whatever its size.
    assert_eq!(at(u, w, 3000).await.unwrap(), window(true, 3000));
    // The next minute starts empty.
    assert_eq!(at(t, w + 60_000, 900).await.unwrap(), window(true, 900));
    // Three minutes later, the first window is deleted on the way: it starts over, empty.
    assert_eq!(at(t, w + 180_000, 10).await.unwrap(), window(true, 10));
    assert_eq!(r(10).await.unwrap(), window(true, 10));
    // A settlement of a window nobody reserved in records what was used.
    h.store.settle_tokens(t, w + 240_000, 42).await.unwrap();
    assert_eq!(at(t, w + 240_000, 1000).await.unwrap(), window(false, 42));
}

pub async fn concurrent_token_reservations_never_exceed_the_limit(h: &Harness) {
    let t = TenantId::new();
    let w = 1_800_000_060_000;
    let mut stores = vec![h.store.clone()];
    for _ in 0..3 {
        stores.push(h.reopen().await.unwrap());
    }
    let mut tasks = Vec::new();
    for i in 0..24 {
        let store = stores[i % stores.len()].clone();
        tasks.push(tokio::spawn(async move {
            store.reserve_tokens(t, w, 100, 1000).await.unwrap()
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        let got = task.await.unwrap();
        assert!(got.used <= 1000, "{got:?}");
        admitted += u32::from(got.admitted);
    }
    assert_eq!(admitted, 10);
    assert_eq!(
        h.store.reserve_tokens(t, w, 0, 1000).await.unwrap(),
        TokenWindow {
            admitted: true,
            used: 1000
        }
    );
}

pub async fn queue_depths_and_session_counts(h: &Harness) {
    let (a, b) = (TenantId::new(), TenantId::new());
    runnable(&h.store, a, 0, 2).await;
    let mut s = new_session(&h.store, a).await;
    commit(&h.store, a, &mut s, &work(true, 3)).await;
    runnable(&h.store, b, 0, 1).await;
    new_session(&h.store, b).await;
    assert_eq!(h.store.queue_depth(a).await.unwrap(), (5, 6));
    assert_eq!(h.store.queue_depth(b).await.unwrap(), (1, 6));
    assert_eq!(h.store.queue_depth(TenantId::new()).await.unwrap(), (0, 6));
    let mut depths = h.store.queue_depths().await.unwrap();
    depths.sort();
    let mut expected = vec![(a, 5), (b, 1)];
    expected.sort();
    assert_eq!(depths, expected);
    // A turn starts: the queue shrinks.
    commit(&h.store, a, &mut s, &work(true, 2)).await;
    assert_eq!(h.store.queue_depth(a).await.unwrap(), (4, 5));
    // Sessions by status: the projection of the journal.
    let running = Event::new(
        s.id,
        s.version + 1,
        Utc::now(),
        Correlation::default(),
        EventBody::SessionStatusChanged {
            status: SessionStatus::Running,
            reason: None,
        },
    );
    s.version = h
        .store
        .append(a, s.id, s.version, s.lease.epoch, &[running])
        .await
        .unwrap();
    let mut counts = h.store.session_counts().await.unwrap();
    counts.sort_by_key(|(status, _)| status.as_str());
    assert_eq!(
        counts,
        vec![(SessionStatus::Created, 3), (SessionStatus::Running, 1)]
    );
}

/// A lease of the longest TTL a caller can ask for (`i64::MAX` ms, or `Duration::MAX`) is held
/// until far in the future — claimed, acquired, renewed and taken over alike — not wrapped into
/// the past, where any worker would claim the session again while its holder runs it.
pub async fn a_lease_of_the_longest_ttl_is_held_not_wrapped_into_the_past(h: &Harness) {
    let t = TenantId::new();
    let longest = Duration::from_millis(u64::try_from(i64::MAX).unwrap());
    let s = runnable(&h.store, t, 0, 1).await;
    let c = h
        .store
        .claim_session(t, "w", longest, Utc::now(), SCHEMA, u64::MAX)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.lease.session_id, s.id);
    assert!(c.lease.expires_at > Utc::now(), "{:?}", c.lease.expires_at);
    assert_eq!(
        claim_id(&h.store, t).await,
        None,
        "a held session was claimed again"
    );
    let renewed = h
        .store
        .renew_lease(t, &c.lease, Duration::MAX)
        .await
        .unwrap();
    assert!(renewed.expires_at > Utc::now(), "{:?}", renewed.expires_at);
    assert_eq!(
        claim_id(&h.store, t).await,
        None,
        "a held session was claimed again"
    );
    h.store.release_lease(t, &renewed).await.unwrap();
    let acquired = h
        .store
        .acquire_lease(t, s.id, "w", Duration::MAX)
        .await
        .unwrap();
    assert!(
        acquired.expires_at > Utc::now(),
        "{:?}",
        acquired.expires_at
    );
    let taken = h
        .store
        .take_over_lease(t, s.id, "w", acquired.epoch, "x", Duration::MAX)
        .await
        .unwrap();
    assert!(taken.expires_at > Utc::now(), "{:?}", taken.expires_at);
    assert_eq!(
        claim_id(&h.store, t).await,
        None,
        "a held session was claimed again"
    );
}
