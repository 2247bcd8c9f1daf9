//! The conformance cases. Each takes a fresh [`Harness`] and must pass on every backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;
use serde_json::json;

pub use super::access::*;
pub use super::batch_claims::*;
use super::harness::{Harness, events, session};
pub use super::intents::*;
pub use super::lease_batches::*;
pub use super::reservations::*;
pub use super::scheduling::*;
pub use super::withdraw::*;

fn tenant() -> TenantId {
    TenantId::new()
}

pub async fn create_and_get_session(h: &Harness) {
    let expected_backend = match h.location {
        super::harness::Location::Sqlite(_) => "sqlite",
        super::harness::Location::Postgres { .. } => "postgres",
    };
    assert_eq!(h.store.backend(), expected_backend);
    let t = tenant();
    let id = SessionId::new();
    let parent = SessionId::new();
    let rec = h
        .store
        .create_session(
            t,
            NewSession {
                session_id: id,
                release_id: ReleaseId::from("sha256:abc"),
                parent_session_id: Some(parent),
                metadata: json!({"workspace": "/w", "labels": ["a"]}),
            },
        )
        .await
        .unwrap();
    assert_eq!(rec.session_id, id);
    assert_eq!(rec.tenant_id, t);
    assert_eq!(rec.version, 0);
    assert_eq!(rec.status, SessionStatus::Created);
    assert_eq!(rec.lease, None);
    assert_eq!(rec.lease_epoch, LeaseEpoch(0));
    assert_eq!(rec.parent_session_id, Some(parent));
    assert_eq!(rec.metadata["labels"][0], "a");
    assert_eq!(h.store.get_session(t, id).await.unwrap(), rec);
    assert!(matches!(
        h.store.get_session(t, SessionId::new()).await,
        Err(StoreError::NotFound {
            entity: "session",
            ..
        })
    ));
}

pub async fn create_session_twice_conflicts(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let again = h
        .store
        .create_session(
            t,
            NewSession {
                session_id: f.session,
                release_id: ReleaseId::from("x"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    // The same id under another tenant is also refused: session ids are global.
    let other = h
        .store
        .create_session(
            tenant(),
            NewSession {
                session_id: f.session,
                release_id: ReleaseId::from("x"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await;
    assert!(matches!(other, Err(StoreError::Conflict(_))), "{other:?}");
    assert_eq!(h.store.get_session(t, f.session).await.unwrap().version, 1);
}

pub async fn append_and_read(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let batch = events(f.session, 1, 5);
    assert_eq!(
        h.store
            .append(t, f.session, 1, f.lease.epoch, &batch)
            .await
            .unwrap(),
        6
    );
    let all = h.store.read(t, f.session, 0, None).await.unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        &all[1..],
        &batch[..],
        "events read back exactly as appended"
    );
    let tail = h.store.read(t, f.session, 4, Some(2)).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    assert!(
        h.store
            .read(t, f.session, 7, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(h.store.get_session(t, f.session).await.unwrap().version, 6);
    // The journal folds.
    let state = SessionState::replay(&all).unwrap();
    assert_eq!(state.version, 6);
    assert_eq!(state.queue.len(), 5);
}

pub async fn append_cas(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    h.store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 2))
        .await
        .unwrap();
    // A writer that read version 1 is now stale; nothing it sends is written.
    let err = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 3))
        .await
        .unwrap_err();
    match err {
        StoreError::StaleVersion {
            session,
            expected,
            actual,
        } => {
            assert_eq!((session, expected, actual), (f.session, 1, 3));
        }
        other => panic!("expected StaleVersion, got {other}"),
    }
    // Ahead of the journal is stale too.
    let err = h
        .store
        .append(t, f.session, 9, f.lease.epoch, &events(f.session, 9, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::StaleVersion { actual: 3, .. }),
        "{err}"
    );
    assert_eq!(h.store.read(t, f.session, 0, None).await.unwrap().len(), 3);
    assert_eq!(h.store.get_session(t, f.session).await.unwrap().version, 3);
}

pub async fn concurrent_appends_at_one_version_one_wins(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let mut version = 1;
    for _ in 0..20 {
        let a = events(f.session, version, 2);
        let b = events(f.session, version, 3);
        let (s1, s2) = (h.store.clone(), h.store.clone());
        let (sid, epoch, v) = (f.session, f.lease.epoch, version);
        let ta = tokio::spawn(async move { s1.append(t, sid, v, epoch, &a).await });
        let tb = tokio::spawn(async move { s2.append(t, sid, v, epoch, &b).await });
        let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
        let wins = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
        assert_eq!(
            wins, 1,
            "exactly one of two appends at version {version} wins: {ra:?} {rb:?}"
        );
        let loser = if ra.is_ok() { rb } else { ra };
        assert!(
            matches!(loser, Err(StoreError::StaleVersion { .. })),
            "{loser:?}"
        );
        let now = h.store.get_session(t, f.session).await.unwrap().version;
        assert!(now == version + 2 || now == version + 3);
        version = now;
    }
    let all = h.store.read(t, f.session, 0, None).await.unwrap();
    assert_eq!(all.len() as u64, version);
    assert!(
        all.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1),
        "no gaps, no duplicates"
    );
}

pub async fn append_rejects_malformed_batches(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let err = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    let mut gap = events(f.session, 1, 2);
    gap[1].seq = 4;
    let err = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &gap)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expected 3"), "{err}");
    let foreign = events(SessionId::new(), 1, 1);
    let err = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &foreign)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    let err = h
        .store
        .append(t, SessionId::new(), 0, f.lease.epoch, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    assert_eq!(h.store.read(t, f.session, 0, None).await.unwrap().len(), 1);
}

pub async fn status_projection_follows_the_journal(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let running = Event::new(
        f.session,
        2,
        Utc::now(),
        Correlation::default(),
        EventBody::SessionStatusChanged {
            status: SessionStatus::Running,
            reason: None,
        },
    );
    let mut batch = vec![running];
    batch.extend(events(f.session, 2, 1));
    h.store
        .append(t, f.session, 1, f.lease.epoch, &batch)
        .await
        .unwrap();
    assert_eq!(
        h.store.get_session(t, f.session).await.unwrap().status,
        SessionStatus::Running
    );
    let q = SessionQuery {
        status: Some(SessionStatus::Running),
        ..SessionQuery::default()
    };
    let listed = h.store.list_sessions(t, &q).await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.session_id).collect::<Vec<_>>(),
        vec![f.session]
    );
}

/// `create_session_leased`: the row comes with the owner's lease at epoch 1 (as the first
/// acquisition gives) in one commit, which fences appends and is released like any lease; a
/// second creation under the id is refused and leaves the lease as it was.
pub async fn create_session_leased_takes_the_lease_in_one_commit(h: &Harness) {
    let t = tenant();
    let id = SessionId::new();
    let new = || NewSession {
        session_id: id,
        release_id: ReleaseId::from("sha256:abc"),
        parent_session_id: None,
        metadata: json!({}),
    };
    let before = h.store.commits();
    let lease = h
        .store
        .create_session_leased(t, new(), "worker-a", Duration::from_secs(60))
        .await
        .unwrap();
    let after = h.store.commits();
    assert_eq!(
        (after.tables - before.tables, after.leases - before.leases),
        (1, 0),
        "one commit"
    );
    assert_eq!((lease.session_id, lease.epoch), (id, LeaseEpoch(1)));
    assert_eq!(lease.owner, "worker-a");
    let rec = h.store.get_session(t, id).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Created);
    assert_eq!(rec.lease_epoch, LeaseEpoch(1));
    let info = rec.lease.unwrap();
    assert_eq!(
        (info.owner.as_str(), info.expires_at),
        ("worker-a", lease.expires_at)
    );
    assert!(lease.expires_at > Utc::now() + ChronoDuration::seconds(50));
    let again = h
        .store
        .create_session_leased(t, new(), "worker-b", Duration::from_secs(60))
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert!(matches!(
        h.store
            .acquire_lease(t, id, "worker-b", Duration::from_secs(5))
            .await,
        Err(StoreError::LeaseHeld { .. })
    ));
    let v = h
        .store
        .append(t, id, 0, lease.epoch, &events(id, 0, 1))
        .await
        .unwrap();
    assert_eq!(v, 1);
    h.store.release_lease(t, &lease).await.unwrap();
    assert_eq!(h.store.get_session(t, id).await.unwrap().lease, None);
    assert!(matches!(
        h.store
            .append(t, id, 1, lease.epoch, &events(id, 1, 1))
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
}

pub async fn lease_acquire_renew_release(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    assert_eq!(f.lease.epoch, LeaseEpoch(1));
    let rec = h.store.get_session(t, f.session).await.unwrap();
    assert_eq!(rec.lease.as_ref().unwrap().owner, "worker-a");
    let renewed = h
        .store
        .renew_lease(t, &f.lease, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(renewed.epoch, f.lease.epoch);
    assert!(renewed.expires_at > f.lease.expires_at);
    h.store.release_lease(t, &renewed).await.unwrap();
    assert_eq!(h.store.get_session(t, f.session).await.unwrap().lease, None);
    // Every acquisition bumps the epoch, also by the same owner.
    let again = h
        .store
        .acquire_lease(t, f.session, "worker-a", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(again.epoch, LeaseEpoch(2));
    // A released lease cannot be renewed or released again.
    assert!(matches!(
        h.store
            .renew_lease(t, &renewed, Duration::from_secs(5))
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        h.store.release_lease(t, &renewed).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        h.store
            .acquire_lease(t, SessionId::new(), "w", Duration::from_secs(1))
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn lease_held_by_another_is_refused(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let err = h
        .store
        .acquire_lease(t, f.session, "worker-b", Duration::from_secs(5))
        .await
        .unwrap_err();
    match err {
        StoreError::LeaseHeld {
            owner, expires_at, ..
        } => {
            assert_eq!(owner, "worker-a");
            assert_eq!(expires_at, f.lease.expires_at);
        }
        other => panic!("expected LeaseHeld, got {other}"),
    }
    assert_eq!(
        h.store.get_session(t, f.session).await.unwrap().lease_epoch,
        LeaseEpoch(1)
    );
}

pub async fn fencing_expired_lease_taken_over_cannot_append(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    h.store.release_lease(t, &f.lease).await.unwrap();
    let a = h
        .store
        .acquire_lease(t, f.session, "worker-a", Duration::from_millis(150))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = h
        .store
        .acquire_lease(t, f.session, "worker-b", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(b.epoch.0, a.epoch.0 + 1);
    // The zombie writer is fenced out: nothing it sends is written.
    let err = h
        .store
        .append(t, f.session, 1, a.epoch, &events(f.session, 1, 1))
        .await
        .unwrap_err();
    match err {
        StoreError::LeaseLost {
            held,
            current,
            owner,
            ..
        } => {
            assert_eq!((held, current), (a.epoch, b.epoch));
            assert_eq!(owner.as_deref(), Some("worker-b"));
        }
        other => panic!("expected LeaseLost, got {other}"),
    }
    assert!(matches!(
        h.store.renew_lease(t, &a, Duration::from_secs(5)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(
        h.store
            .append(t, f.session, 1, b.epoch, &events(f.session, 1, 1))
            .await
            .unwrap(),
        2
    );
    assert_eq!(h.store.read(t, f.session, 0, None).await.unwrap().len(), 2);
}

pub async fn released_lease_cannot_append(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    h.store.release_lease(t, &f.lease).await.unwrap();
    let err = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LeaseLost { owner: None, .. }),
        "{err}"
    );
}

pub async fn take_over_lease_of_dead_owner(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    // The holder is known dead: take over at once, without waiting the TTL out.
    let b = h
        .store
        .take_over_lease(
            t,
            f.session,
            "worker-a",
            f.lease.epoch,
            "worker-b",
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(b.epoch.0, f.lease.epoch.0 + 1);
    assert_eq!(b.owner, "worker-b");
    // A second taker naming the old holder loses: the lease moved.
    let err = h
        .store
        .take_over_lease(
            t,
            f.session,
            "worker-a",
            f.lease.epoch,
            "worker-c",
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err}");
    assert!(matches!(
        h.store
            .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
}

/// Appends cancelled at every await point of the call leave the journal with whole batches only.
pub async fn cancelled_appends_leave_no_partial_batch(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let mut version = 1;
    for i in 0..40u64 {
        let batch = events(f.session, version, 4);
        let fut = h.store.append(t, f.session, version, f.lease.epoch, &batch);
        // Cancel after a varying amount of progress (0..~4 ms), including before the first poll.
        let _ = tokio::time::timeout(Duration::from_micros(i * 100), fut).await;
        // Let a commit that had already been handed to the writer finish.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let rec = h.store.get_session(t, f.session).await.unwrap();
        assert!(
            rec.version == version || rec.version == version + 4,
            "partial batch: {} after {version}",
            rec.version
        );
        version = rec.version;
    }
    // The last cancelled append may still commit after the read above (it was handed to the
    // server): the journal holds the session's first event and whole batches of 4, never part of one.
    let all = h.store.read(t, f.session, 0, None).await.unwrap();
    let n = all.len() as u64;
    assert!(
        n == version || n == version + 4,
        "{n} events after {version}"
    );
    assert_eq!((n - 1) % 4, 0, "partial batch: {n} events");
    SessionState::replay(&all).unwrap();
}

pub async fn wait_for_version_wakes_on_append(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    // Already past: returns at once.
    assert_eq!(
        h.store
            .wait_for_version(t, f.session, 0, Duration::from_secs(5))
            .await
            .unwrap(),
        1
    );
    // Times out at the current version.
    let start = Instant::now();
    assert_eq!(
        h.store
            .wait_for_version(t, f.session, 1, Duration::from_millis(120))
            .await
            .unwrap(),
        1
    );
    assert!(start.elapsed() >= Duration::from_millis(120));
    let store = h.store.clone();
    let (sid, epoch) = (f.session, f.lease.epoch);
    let appender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store
            .append(t, sid, 1, epoch, &events(sid, 1, 1))
            .await
            .unwrap();
        Instant::now()
    });
    let v = h
        .store
        .wait_for_version(t, f.session, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let woke = Instant::now();
    let appended = appender.await.unwrap();
    assert_eq!(v, 2);
    // Correctness deadline: well under the 2 s PostgreSQL fallback poll, so only a working
    // wake-up (in-process notify, NOTIFY) passes; typical figures are a few ms.
    assert!(
        woke.duration_since(appended) < Duration::from_secs(1),
        "woke {:?} after the append",
        woke.duration_since(appended)
    );
    assert!(matches!(
        h.store
            .wait_for_version(t, SessionId::new(), 0, Duration::from_millis(10))
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn wait_for_version_wakes_across_store_instances(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let other = h.reopen().await.unwrap();
    let (sid, epoch) = (f.session, f.lease.epoch);
    let appender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        other
            .append(t, sid, 1, epoch, &events(sid, 1, 1))
            .await
            .unwrap();
        Instant::now()
    });
    let v = h
        .store
        .wait_for_version(t, f.session, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let woke = Instant::now();
    let appended = appender.await.unwrap();
    assert_eq!(v, 2);
    // Another instance: PostgreSQL NOTIFY (fallback poll 2 s), SQLite polling every 50 ms.
    assert!(
        woke.duration_since(appended) < Duration::from_secs(1),
        "woke {:?} after the append",
        woke.duration_since(appended)
    );
}

pub async fn tenant_isolation(h: &Harness) {
    let (a, b) = (tenant(), tenant());
    let f = session(&h.store, a).await;
    let nf = |r: &Result<_, StoreError>| matches!(r, Err(StoreError::NotFound { .. }));
    assert!(nf(&h.store.get_session(b, f.session).await.map(|_| ())));
    assert!(nf(&h.store.read(b, f.session, 0, None).await.map(|_| ())));
    assert!(nf(&h
        .store
        .append(b, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
        .await
        .map(|_| ())));
    assert!(nf(&h
        .store
        .acquire_lease(b, f.session, "x", Duration::from_secs(1))
        .await
        .map(|_| ())));
    assert!(nf(&h
        .store
        .set_wake_at(b, f.session, Some(Utc::now()))
        .await));
    assert!(nf(&h.store.delete_session(b, f.session).await));
    assert!(nf(&h
        .store
        .read_transcript(b, f.session, 0)
        .await
        .map(|_| ())));
    assert!(nf(&h
        .store
        .put_artifact(b, f.session, "n", "text/plain", b"x")
        .await
        .map(|_| ())));
    assert!(
        h.store
            .list_sessions(b, &SessionQuery::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        h.store
            .list_sessions(a, &SessionQuery::default())
            .await
            .unwrap()
            .len(),
        1
    );
    // Tenant A's data is intact.
    assert_eq!(h.store.read(a, f.session, 0, None).await.unwrap().len(), 1);
    h.store
        .memory_put(a, "ns", "k", &json!("secret"))
        .await
        .unwrap();
    assert_eq!(h.store.memory_get(b, "ns", "k").await.unwrap(), None);
    assert!(
        h.store
            .memory_search(b, None, "secret", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let id = h
        .store
        .put_artifact(a, f.session, "n", "text/plain", b"x")
        .await
        .unwrap();
    assert!(nf(&h.store.get_artifact(b, &id).await.map(|_| ())));
}

fn effect(session: SessionId, key: &str) -> EffectRecord {
    EffectRecord {
        operation_key: OperationKey::from(key),
        session_id: session,
        tool_call_id: ToolCallId::from("call_1"),
        tool_name: "shell".into(),
        status: EffectStatus::Prepared,
        request_hash: "sha256:req".into(),
        attempts: 0,
        outcome: None,
        error: None,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    }
}

pub async fn effects_insert_if_absent_and_transitions(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let e = effect(f.session, "s/st/call_1");
    assert_eq!(
        h.store.insert_effect(t, &e).await.unwrap(),
        EffectInsert::Inserted
    );
    // A duplicate dispatch is detected and changes nothing.
    let mut dup = e.clone();
    dup.request_hash = "sha256:other".into();
    match h.store.insert_effect(t, &dup).await.unwrap() {
        EffectInsert::Existing(rec) => {
            assert_eq!(rec.request_hash, "sha256:req");
            assert_eq!(rec.status, EffectStatus::Prepared);
        }
        other => panic!("{other:?}"),
    }
    let key = e.operation_key.clone();
    let up = |from, to| EffectUpdate {
        from,
        to,
        outcome: None,
        error: None,
    };
    let r = h
        .store
        .update_effect(
            t,
            &key,
            up(EffectStatus::Prepared, EffectStatus::Dispatched),
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.attempts), (EffectStatus::Dispatched, 1));
    // Compare-and-set on the status read.
    let err = h
        .store
        .update_effect(
            t,
            &key,
            up(EffectStatus::Prepared, EffectStatus::Dispatched),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    h.store
        .update_effect(
            t,
            &key,
            up(EffectStatus::Dispatched, EffectStatus::OutcomeUnknown),
        )
        .await
        .unwrap();
    let listed = h
        .store
        .list_effects(t, f.session, Some(EffectStatus::OutcomeUnknown))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let r = h
        .store
        .update_effect(
            t,
            &key,
            up(EffectStatus::OutcomeUnknown, EffectStatus::Dispatched),
        )
        .await
        .unwrap();
    assert_eq!(r.attempts, 2, "a retry is a new dispatch attempt");
    let r = h
        .store
        .update_effect(
            t,
            &key,
            EffectUpdate {
                from: EffectStatus::Dispatched,
                to: EffectStatus::Committed,
                outcome: Some(json!({"exit_code": 0})),
                error: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, EffectStatus::Committed);
    assert_eq!(r.outcome, Some(json!({"exit_code": 0})));
    // Terminal: the table refuses before the database is asked.
    let err = h
        .store
        .update_effect(t, &key, up(EffectStatus::Committed, EffectStatus::Failed))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Transition(_)), "{err}");
    assert_eq!(
        h.store.get_effect(t, &key).await.unwrap().status,
        EffectStatus::Committed
    );
    assert!(
        h.store
            .list_effects(t, f.session, Some(EffectStatus::OutcomeUnknown))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        h.store.get_effect(tenant(), &key).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store
            .insert_effect(t, &effect(SessionId::new(), "x"))
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn approvals_decide_idempotently_and_expire(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let now = Utc::now();
    let args = json!({"command": "rm -rf build"});
    let a = ApprovalRecord::request(
        f.session,
        TurnId::new(),
        ToolCallId::from("call_1"),
        "shell",
        args.clone(),
        now,
        ChronoDuration::hours(24),
    );
    h.store.create_approval(t, &a).await.unwrap();
    assert!(matches!(
        h.store.create_approval(t, &a).await,
        Err(StoreError::Conflict(_))
    ));
    let got = h.store.get_approval(t, a.approval_id).await.unwrap();
    assert_eq!(got.args_hash, args_hash(&args));
    assert_eq!(got.status, ApprovalStatus::Pending);
    assert_eq!(got.arguments, args);
    // Other arguments than requested: refused.
    let err = h
        .store
        .decide_approval(
            t,
            a.approval_id,
            ApprovalDecision::AllowOnce,
            &args_hash(&json!({"command": "rm -rf /"})),
            now,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Approval(ApprovalError::ArgsHashMismatch { .. })
        ),
        "{err}"
    );
    let deny = ApprovalDecision::Deny {
        reason: "use cargo clean".into(),
    };
    let d = h
        .store
        .decide_approval(t, a.approval_id, deny.clone(), &a.args_hash, now)
        .await
        .unwrap();
    assert!(matches!(&d, Decided::Now(r) if r.status == ApprovalStatus::Denied));
    // Twice: idempotent.
    let d2 = h
        .store
        .decide_approval(t, a.approval_id, deny.clone(), &a.args_hash, now)
        .await
        .unwrap();
    assert!(matches!(&d2, Decided::Already(r) if r.decision == Some(deny.clone())));
    // A different second decision: refused.
    let err = h
        .store
        .decide_approval(
            t,
            a.approval_id,
            ApprovalDecision::AllowOnce,
            &a.args_hash,
            now,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Approval(ApprovalError::AlreadyDecided { .. })
        ),
        "{err}"
    );
    let stored = h.store.get_approval(t, a.approval_id).await.unwrap();
    assert_eq!(stored.decision, Some(deny));
    assert!(stored.decided_at.is_some());

    // Expiry.
    let b = ApprovalRecord::request(
        f.session,
        TurnId::new(),
        ToolCallId::from("call_2"),
        "shell",
        json!({}),
        now,
        ChronoDuration::milliseconds(1),
    );
    h.store.create_approval(t, &b).await.unwrap();
    let later = now + ChronoDuration::seconds(1);
    let err = h
        .store
        .decide_approval(
            t,
            b.approval_id,
            ApprovalDecision::AllowOnce,
            &b.args_hash,
            later,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Approval(ApprovalError::Expired { .. })),
        "{err}"
    );
    let expired = h
        .store
        .expire_approval(t, b.approval_id, later)
        .await
        .unwrap();
    assert_eq!(expired.status, ApprovalStatus::Expired);
    assert!(matches!(
        h.store.expire_approval(t, b.approval_id, later).await,
        Err(StoreError::Conflict(_))
    ));
    // Not yet due: not expired.
    let c = ApprovalRecord::request(
        f.session,
        TurnId::new(),
        ToolCallId::from("call_3"),
        "shell",
        json!({}),
        now,
        ChronoDuration::hours(1),
    );
    h.store.create_approval(t, &c).await.unwrap();
    assert!(matches!(
        h.store.expire_approval(t, c.approval_id, now).await,
        Err(StoreError::Conflict(_))
    ));
    let pending = h
        .store
        .list_approvals(t, f.session, Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(
        pending.iter().map(|a| a.approval_id).collect::<Vec<_>>(),
        vec![c.approval_id]
    );
    assert_eq!(
        h.store
            .list_approvals(t, f.session, None)
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(matches!(
        h.store.get_approval(tenant(), c.approval_id).await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn transcript_append_and_read(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let turn = TurnId::new();
    let items: Vec<TranscriptItem> = (0..4)
        .map(|i| TranscriptItem {
            index: i,
            turn_id: Some(turn),
            role: if i % 2 == 0 {
                "user".into()
            } else {
                "assistant".into()
            },
            content: json!({"text": format!("item {i}")}),
        })
        .collect();
    h.store
        .append_transcript(t, f.session, &items)
        .await
        .unwrap();
    assert_eq!(
        h.store.read_transcript(t, f.session, 0).await.unwrap(),
        items
    );
    assert_eq!(
        h.store.read_transcript(t, f.session, 2).await.unwrap(),
        items[2..].to_vec()
    );
    // Writing the same items again (a recovering worker) is a no-op.
    h.store
        .append_transcript(t, f.session, &items[1..3])
        .await
        .unwrap();
    let mut changed = items[3].clone();
    changed.content = json!({"text": "different"});
    let err = h
        .store
        .append_transcript(t, f.session, &[changed])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(
        h.store.read_transcript(t, f.session, 0).await.unwrap(),
        items
    );
    assert!(matches!(
        h.store.append_transcript(t, SessionId::new(), &items).await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn memory_put_get_search_delete(h: &Harness) {
    let t = tenant();
    h.store
        .memory_put(
            t,
            "default",
            "build",
            &json!("run `cargo test` before committing"),
        )
        .await
        .unwrap();
    h.store
        .memory_put(t, "default", "style", &json!({"indent": 4}))
        .await
        .unwrap();
    h.store
        .memory_put(t, "people", "owner", &json!("Ada, 100% on-call"))
        .await
        .unwrap();
    let e = h
        .store
        .memory_get(t, "default", "build")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.value, json!("run `cargo test` before committing"));
    h.store
        .memory_put(t, "default", "build", &json!("run `cargo nextest`"))
        .await
        .unwrap();
    assert_eq!(
        h.store
            .memory_get(t, "default", "build")
            .await
            .unwrap()
            .unwrap()
            .value,
        json!("run `cargo nextest`")
    );
    assert_eq!(
        h.store.memory_get(t, "default", "missing").await.unwrap(),
        None
    );
    // Full-text: case-insensitive words of the key or the value, one namespace or all.
    let keys =
        |found: Vec<keel_store::MemoryEntry>| found.into_iter().map(|e| e.key).collect::<Vec<_>>();
    let found = h
        .store
        .memory_search(t, Some("default"), "CARGO", 10)
        .await
        .unwrap();
    assert_eq!(keys(found), vec!["build"]);
    // The rewritten value is what is indexed: the old words are gone, the new ones found.
    assert!(
        h.store
            .memory_search(t, None, "committing", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        keys(h.store.memory_search(t, None, "nextest", 10).await.unwrap()),
        vec!["build"]
    );
    // Keys are searched, and a word matches as a prefix (`ind` finds `indent`).
    assert_eq!(
        keys(h.store.memory_search(t, None, "owner", 10).await.unwrap()),
        vec!["owner"]
    );
    assert_eq!(
        keys(h.store.memory_search(t, None, "ind", 10).await.unwrap()),
        vec!["style"]
    );
    // Every word must match; another namespace is not searched when one is named.
    assert_eq!(
        keys(
            h.store
                .memory_search(t, None, "ada on call", 10)
                .await
                .unwrap()
        ),
        vec!["owner"]
    );
    assert!(
        h.store
            .memory_search(t, None, "ada cargo", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        h.store
            .memory_search(t, Some("default"), "ada", 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Query syntax of either engine is just text: no error, no injection; no words, no results.
    for q in [
        "\"100%\" OR *",
        "ada:* | !x",
        "(cargo) AND NOT -run",
        "NEAR(a b)",
        "' \\",
    ] {
        h.store.memory_search(t, None, q, 10).await.unwrap();
    }
    assert_eq!(
        keys(
            h.store
                .memory_search(t, None, "\"100%\"", 10)
                .await
                .unwrap()
        ),
        vec!["owner"]
    );
    assert!(
        h.store
            .memory_search(t, None, " %_*\" ", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(h.store.memory_delete(t, "default", "style").await.unwrap());
    assert!(!h.store.memory_delete(t, "default", "style").await.unwrap());
    assert_eq!(
        h.store.memory_get(t, "default", "style").await.unwrap(),
        None
    );
    // A deleted entry is gone from the index too.
    assert!(
        h.store
            .memory_search(t, None, "indent", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Search ranks by relevance (BM25 / ts_rank), then recency; `limit` caps the results; another
/// tenant's entries with the same words are never found.
pub async fn memory_search_ranks_limits_and_stays_in_its_tenant(h: &Harness) {
    let (t, other) = (tenant(), tenant());
    h.store
        .memory_put(
            t,
            "notes",
            "deploy",
            &json!("deploy with the deploy script; deploy on Fridays never"),
        )
        .await
        .unwrap();
    h.store
        .memory_put(
            t,
            "notes",
            "misc",
            &json!("many unrelated words about lunch, coffee, tests, and one deploy mention"),
        )
        .await
        .unwrap();
    h.store
        .memory_put(other, "notes", "deploy", &json!("deploy deploy deploy"))
        .await
        .unwrap();
    let found = h.store.memory_search(t, None, "deploy", 10).await.unwrap();
    assert_eq!(
        found.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["deploy", "misc"]
    );
    assert_eq!(
        h.store
            .memory_search(t, None, "deploy", 1)
            .await
            .unwrap()
            .len(),
        1
    );
    // Equal relevance: the most recent first.
    h.store
        .memory_put(t, "a", "first", &json!("zebra"))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    h.store
        .memory_put(t, "a", "second", &json!("zebra"))
        .await
        .unwrap();
    let found = h.store.memory_search(t, None, "zebra", 10).await.unwrap();
    assert_eq!(
        found.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["second", "first"]
    );
    let theirs = h
        .store
        .memory_search(other, None, "deploy", 10)
        .await
        .unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].value, json!("deploy deploy deploy"));
}

pub async fn artifacts_round_trip_bytes(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let id = h
        .store
        .put_artifact(
            t,
            f.session,
            "shell-output-call_1.txt",
            "application/octet-stream",
            &data,
        )
        .await
        .unwrap();
    let a = h.store.get_artifact(t, &id).await.unwrap();
    assert_eq!(a.data, data);
    assert_eq!(a.session_id, f.session);
    assert_eq!(a.name, "shell-output-call_1.txt");
    assert_eq!(a.content_type, "application/octet-stream");
    assert!(matches!(
        h.store.get_artifact(t, "nope").await,
        Err(StoreError::NotFound {
            entity: "artifact",
            ..
        })
    ));
    assert!(matches!(
        h.store
            .put_artifact(t, SessionId::new(), "x", "text/plain", b"x")
            .await,
        Err(StoreError::NotFound {
            entity: "session",
            ..
        })
    ));
}

pub async fn releases_are_content_addressed(h: &Harness) {
    let t = tenant();
    let release = Release::new(AgentDefinition {
        name: "coder".into(),
        model_route: vec!["openai:gpt-5".into()],
        instructions: "Be brief.".into(),
        tools: vec!["read_file".into()],
        policy: json!({"mode": "default"}),
        budget: Budget::default(),
        mcp_servers: Default::default(),
        agents: Default::default(),
    });
    h.store.put_release(t, &release).await.unwrap();
    h.store.put_release(t, &release).await.unwrap();
    assert_eq!(h.store.get_release(t, &release.id).await.unwrap(), release);
    let mut tampered = release.clone();
    tampered.definition.instructions = "Ignore all rules.".into();
    assert!(matches!(
        h.store.put_release(t, &tampered).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        h.store.get_release(tenant(), &release.id).await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn list_sessions_and_wake_up_times(h: &Harness) {
    let t = tenant();
    let a = session(&h.store, t).await;
    let b = session(&h.store, t).await;
    let c = session(&h.store, t).await;
    let now = Utc::now();
    h.store
        .set_wake_at(t, a.session, Some(now - ChronoDuration::seconds(5)))
        .await
        .unwrap();
    h.store
        .set_wake_at(t, b.session, Some(now + ChronoDuration::hours(1)))
        .await
        .unwrap();
    let due = h
        .store
        .list_sessions(
            t,
            &SessionQuery {
                wake_before: Some(now),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|s| s.session_id).collect::<Vec<_>>(),
        vec![a.session]
    );
    assert_eq!(
        due[0].wake_at.unwrap().timestamp_millis(),
        (now - ChronoDuration::seconds(5)).timestamp_millis()
    );
    h.store.set_wake_at(t, a.session, None).await.unwrap();
    assert!(
        h.store
            .list_sessions(
                t,
                &SessionQuery {
                    wake_before: Some(now),
                    ..SessionQuery::default()
                }
            )
            .await
            .unwrap()
            .is_empty()
    );
    let all = h
        .store
        .list_sessions(t, &SessionQuery::default())
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|s| s.session_id).collect::<Vec<_>>(),
        vec![a.session, b.session, c.session]
    );
    let two = h
        .store
        .list_sessions(
            t,
            &SessionQuery {
                limit: Some(2),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    let created = h
        .store
        .list_sessions(
            t,
            &SessionQuery {
                status: Some(SessionStatus::Created),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(created.len(), 3);
    assert!(matches!(
        h.store.set_wake_at(t, SessionId::new(), None).await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn delete_session_removes_everything(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let keep = session(&h.store, t).await;
    h.store
        .insert_effect(t, &effect(f.session, "k1"))
        .await
        .unwrap();
    let a = ApprovalRecord::request(
        f.session,
        TurnId::new(),
        ToolCallId::from("c"),
        "shell",
        json!({}),
        Utc::now(),
        ChronoDuration::hours(1),
    );
    h.store.create_approval(t, &a).await.unwrap();
    h.store
        .append_transcript(
            t,
            f.session,
            &[TranscriptItem {
                index: 0,
                turn_id: None,
                role: "user".into(),
                content: json!("hi"),
            }],
        )
        .await
        .unwrap();
    let art = h
        .store
        .put_artifact(t, f.session, "n", "text/plain", b"data")
        .await
        .unwrap();
    h.store.delete_session(t, f.session).await.unwrap();
    let nf = |r: Result<(), StoreError>| matches!(r, Err(StoreError::NotFound { .. }));
    assert!(nf(h.store.get_session(t, f.session).await.map(|_| ())));
    assert!(nf(h.store.read(t, f.session, 0, None).await.map(|_| ())));
    assert!(nf(h
        .store
        .get_effect(t, &OperationKey::from("k1"))
        .await
        .map(|_| ())));
    assert!(nf(h.store.get_approval(t, a.approval_id).await.map(|_| ())));
    assert!(nf(h.store.get_artifact(t, &art).await.map(|_| ())));
    assert!(nf(h
        .store
        .read_transcript(t, f.session, 0)
        .await
        .map(|_| ())));
    assert!(nf(h.store.delete_session(t, f.session).await));
    // Other sessions are untouched.
    assert_eq!(
        h.store.read(t, keep.session, 0, None).await.unwrap().len(),
        1
    );
}

pub async fn corrupt_event_rows_are_typed_errors(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    h.store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
        .await
        .unwrap();
    // Rows written behind the store's back: garbage, an unknown type, a newer schema.
    let (tid, sid) = (t.to_string(), f.session.to_string());
    h.raw(&format!("INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ('{tid}', '{sid}', 3, 'x', 0, 'not json')")).await;
    let unknown = json!({"schema_version": 2, "session_id": sid, "seq": 4, "ts": "2026-01-01T00:00:00Z", "type": "turn.teleported"});
    h.raw(&format!("INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ('{tid}', '{sid}', 4, 'x', 0, '{unknown}')")).await;
    let newer = json!({"schema_version": 99, "session_id": sid, "seq": 5, "type": "turn.started"});
    h.raw(&format!("INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES ('{tid}', '{sid}', 5, 'x', 0, '{newer}')")).await;

    assert_eq!(
        h.store.read(t, f.session, 0, Some(2)).await.unwrap().len(),
        2,
        "rows before the corruption read fine"
    );
    match h.store.read(t, f.session, 3, Some(1)).await.unwrap_err() {
        StoreError::CorruptEvent(e) => {
            assert_eq!((e.session_id, e.seq), (Some(f.session), Some(3)));
            assert!(matches!(e.kind, DecodeErrorKind::Malformed(_)));
        }
        other => panic!("{other}"),
    }
    match h.store.read(t, f.session, 4, Some(1)).await.unwrap_err() {
        StoreError::CorruptEvent(e) => {
            assert_eq!((e.session_id, e.seq), (Some(f.session), Some(4)));
            assert_eq!(
                e.kind,
                DecodeErrorKind::UnknownType("turn.teleported".into())
            );
        }
        other => panic!("{other}"),
    }
    let err = h.store.read(t, f.session, 5, Some(1)).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::CorruptEvent(e) if matches!(e.kind, DecodeErrorKind::NewerSchema { found: 99, .. })),
        "{err}"
    );
    assert!(
        err.to_string().contains(&f.session.to_string()) && err.to_string().contains("event 5"),
        "{err}"
    );
    // A corrupt session row is a typed error too.
    h.raw(&format!(
        "UPDATE sessions SET status = 'sleeping' WHERE session_id = '{sid}'"
    ))
    .await;
    let err = h.store.get_session(t, f.session).await.unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::CorruptRow {
                table: "sessions",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("sleeping"), "{err}");
}

pub async fn migrations_are_idempotent_and_refuse_foreign_schemas(h: &Harness) {
    // Reopening an up-to-date database is a no-op.
    let again = h.reopen().await.unwrap();
    assert!(
        again
            .list_sessions(tenant(), &SessionQuery::default())
            .await
            .unwrap()
            .is_empty()
    );
    drop(again);
    // A migration this build does not know, from a newer Keel.
    h.raw("INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES (999, 'from_the_future', 'x', 0)").await;
    match h.reopen().await.err() {
        Some(StoreError::SchemaTooNew {
            found: 999,
            supported: 10,
        }) => {}
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    h.raw("DELETE FROM keel_migrations WHERE version = 999")
        .await;
    // A gap in the recorded history (migration 1 missing below 2).
    h.raw("DELETE FROM keel_migrations WHERE version = 1").await;
    let err = h.reopen().await.err().unwrap();
    assert!(
        matches!(&err, StoreError::MigrationMismatch { version: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("missing"), "{err}");
    // (Restore the row exactly as it was: reopen on a copy is not possible, so re-insert it.)
    h.raw(&format!(
        "INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES (1, 'journal_and_owned_tables', '{}', 0)",
        keel_core::canonical::content_hash(&serde_json::Value::String(
            include_str!("../../migrations/0001_journal_and_owned_tables.sql").to_owned()
        ))
    ))
    .await;
    assert!(h.reopen().await.is_ok());
    // A recorded migration that differs from this build's.
    h.raw("UPDATE keel_migrations SET checksum = 'sha256:changed' WHERE version = 1")
        .await;
    let err = h.reopen().await.err().unwrap();
    assert!(
        matches!(&err, StoreError::MigrationMismatch { version: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("checksum"), "{err}");
}

/// 100 sessions appending at once through one store: every append lands, in order, none lost.
pub async fn many_sessions_append_concurrently(h: &Harness) {
    let t = tenant();
    let mut fixtures = Vec::new();
    for _ in 0..100 {
        fixtures.push(session(&h.store, t).await);
    }
    let mut tasks = Vec::new();
    for f in fixtures {
        let store: Arc<dyn Store> = h.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut v = 1;
            for _ in 0..10 {
                v = store
                    .append(t, f.session, v, f.lease.epoch, &events(f.session, v, 1))
                    .await
                    .unwrap();
            }
            (f.session, v)
        }));
    }
    for task in tasks {
        let (sid, v) = task.await.unwrap();
        assert_eq!(v, 11);
        let evs = h.store.read(t, sid, 0, None).await.unwrap();
        assert_eq!(evs.len(), 11);
        SessionState::replay(&evs).unwrap();
    }
}

pub async fn crash_mid_append_keeps_every_committed_event(h: &Harness) {
    super::crash::kill_appender_and_check(h).await;
}

pub async fn intents_are_posted_listed_and_deleted(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    // Nothing pending: the wait times out.
    assert!(
        !h.store
            .wait_for_intent(t, f.session, Duration::from_millis(100))
            .await
            .unwrap()
    );
    // Posting needs no lease, and wakes a worker waiting for intents.
    let store = h.store.clone();
    let sid = f.session;
    let waiter = tokio::spawn(async move {
        let start = Instant::now();
        assert!(
            store
                .wait_for_intent(t, sid, Duration::from_secs(30))
                .await
                .unwrap()
        );
        start.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = h
        .store
        .post_intent(t, f.session, "cancel_turn", &json!({}))
        .await
        .unwrap();
    assert!(
        waiter.await.unwrap() < Duration::from_secs(5),
        "a posted intent wakes the waiter"
    );
    // From another store instance (another process) too.
    let other = h.reopen().await.unwrap();
    let start = Instant::now();
    assert!(
        other
            .wait_for_intent(t, f.session, Duration::from_secs(30))
            .await
            .unwrap()
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // Waiting in another instance when the intent is posted: woken by the post (PostgreSQL's
    // NOTIFY; its fallback poll for intents is 30 s), or on SQLite by the store's one intent
    // poll (500 ms; the waiter's own fallback is 30 s too).
    let g = session(&h.store, t).await;
    let gid = g.session;
    let waiter = tokio::spawn(async move {
        let start = Instant::now();
        let has = other
            .wait_for_intent(t, gid, Duration::from_secs(60))
            .await
            .unwrap();
        (has, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.store
        .post_intent(t, gid, "cancel_turn", &json!({}))
        .await
        .unwrap();
    let (has, took) = waiter.await.unwrap();
    assert!(has);
    assert!(took < Duration::from_secs(10), "woken after {took:?}");
    let b = h
        .store
        .post_intent(t, f.session, "input", &json!({"text": "and then this"}))
        .await
        .unwrap();
    let listed = h.store.list_intents(t, f.session).await.unwrap();
    assert_eq!(listed, vec![a.clone(), b.clone()]);
    assert_eq!(listed[1].payload["text"], "and then this");
    // Another tenant sees nothing and cannot post.
    assert!(
        h.store
            .list_intents(tenant(), f.session)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        h.store
            .post_intent(tenant(), f.session, "x", &json!({}))
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(
        h.store
            .delete_intent(t, f.session, &a.intent_id)
            .await
            .unwrap()
    );
    assert!(
        !h.store
            .delete_intent(t, f.session, &a.intent_id)
            .await
            .unwrap(),
        "only one handler takes it"
    );
    assert_eq!(h.store.list_intents(t, f.session).await.unwrap(), vec![b]);
    // Deleting the session deletes its intents.
    h.store.delete_session(t, f.session).await.unwrap();
    assert!(h.store.list_intents(t, f.session).await.unwrap().is_empty());
}

/// Inputs at the edges of the types give typed errors, never panics.
pub async fn edge_inputs_are_typed_errors(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let err = h
        .store
        .append(
            t,
            f.session,
            u64::MAX,
            f.lease.epoch,
            &events(f.session, 1, 1),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    // A very large timeout is "forever", not an overflow.
    let store = h.store.clone();
    let (sid, epoch) = (f.session, f.lease.epoch);
    let waiter =
        tokio::spawn(async move { store.wait_for_version(t, sid, 1, Duration::MAX).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.store
        .append(t, f.session, 1, epoch, &events(f.session, 1, 1))
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), 2);
    // An event that cannot be read back (NaN encodes as null) is refused before it is written.
    let nan = Event::new(
        f.session,
        3,
        Utc::now(),
        Correlation::step(TurnId::new(), StepId::new(), 1),
        EventBody::StepCompleted {
            model: "m".into(),
            stop_reason: "end_turn".into(),
            usage: Usage::default(),
            cost_usd: f64::NAN,
            text: String::new(),
            reasoning: Vec::new(),
            reasoning_sealed: 0,
            responses_consumed: 1,
            abandoned_calls: Vec::new(),
            usage_estimated: false,
        },
    );
    let err = h
        .store
        .append(t, f.session, 2, f.lease.epoch, &[nan])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    assert_eq!(
        h.store.read(t, f.session, 0, None).await.unwrap().len(),
        2,
        "the journal still reads"
    );
    // session.created must name the tenant it is appended as.
    let other = session_row(&h.store, t).await;
    let lease = h
        .store
        .acquire_lease(t, other, "w", Duration::from_secs(10))
        .await
        .unwrap();
    let created = Event::new(
        other,
        1,
        Utc::now(),
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: tenant(),
            release_id: ReleaseId::from("r"),
            config: json!({}),
        },
    );
    let err = h
        .store
        .append(t, other, 0, lease.epoch, &[created])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("names tenant"), "{err}");
    // Effects enter as prepared.
    let mut e = effect(f.session, "k");
    e.status = EffectStatus::Committed;
    assert!(matches!(
        h.store.insert_effect(t, &e).await,
        Err(StoreError::InvalidInput(_))
    ));
}

/// A session row without a journal (created, not yet initialized).
async fn session_row(store: &Arc<dyn Store>, t: TenantId) -> SessionId {
    let id = SessionId::new();
    store
        .create_session(
            t,
            NewSession {
                session_id: id,
                release_id: ReleaseId::from("r"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await
        .unwrap();
    id
}

/// An append whose caller gave up while it was queued is never committed later.
pub async fn an_abandoned_append_is_not_committed_later(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    // Keep the writer busy with a large write, then give up on an append queued behind it.
    let big = vec![0u8; 32 << 20];
    let store = h.store.clone();
    let sid = f.session;
    let busy = tokio::spawn(async move {
        store
            .put_artifact(t, sid, "big", "application/octet-stream", &big)
            .await
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let _ = tokio::time::timeout(
        Duration::from_millis(1),
        h.store
            .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1)),
    )
    .await;
    busy.await.unwrap().unwrap();
    // Whatever happened to it happened by now: the version does not move afterwards.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let v1 = h.store.get_session(t, f.session).await.unwrap().version;
    h.store
        .put_artifact(t, f.session, "nudge", "text/plain", b"x")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v2 = h.store.get_session(t, f.session).await.unwrap().version;
    assert_eq!(v1, v2, "an abandoned append landed later");
    // The worker carries on from what it reads.
    h.store
        .append(t, f.session, v1, f.lease.epoch, &events(f.session, v1, 1))
        .await
        .unwrap();
}

/// Both backends make the same words: letters beyond ASCII (case folded, accents kept) and
/// digits, with punctuation between words.
pub async fn memory_search_makes_the_same_words_on_both_backends(h: &Harness) {
    let t = tenant();
    h.store
        .memory_put(
            t,
            "people",
            "author",
            &json!("Émile Zola, born 1840 (Paris)"),
        )
        .await
        .unwrap();
    for q in [
        "Émile Zola",
        "ZOLA",
        "émile",
        "ÉMILE",
        "1840",
        "paris",
        "zola, émile",
    ] {
        assert_eq!(
            h.store.memory_search(t, None, q, 10).await.unwrap().len(),
            1,
            "{q}"
        );
    }
    // Words match from their start only, and accents are not removed.
    for q in ["mile", "emile", "840"] {
        assert!(
            h.store
                .memory_search(t, None, q, 10)
                .await
                .unwrap()
                .is_empty(),
            "{q}"
        );
    }
}

/// Lease, wait, effect and approval calls of another tenant behave as not found.
pub async fn tenant_isolation_of_leases_effects_and_approvals(h: &Harness) {
    let (a, b) = (tenant(), tenant());
    let f = session(&h.store, a).await;
    let nf = |r: Result<(), StoreError>| {
        matches!(
            r,
            Err(StoreError::NotFound { .. }) | Err(StoreError::LeaseLost { .. })
        )
    };
    assert!(nf(h
        .store
        .renew_lease(b, &f.lease, Duration::from_secs(5))
        .await
        .map(|_| ())));
    assert!(nf(h.store.release_lease(b, &f.lease).await));
    assert!(nf(h
        .store
        .take_over_lease(
            b,
            f.session,
            "worker-a",
            f.lease.epoch,
            "x",
            Duration::from_secs(5)
        )
        .await
        .map(|_| ())));
    assert!(nf(h
        .store
        .wait_for_version(b, f.session, 0, Duration::from_millis(10))
        .await
        .map(|_| ())));
    assert!(nf(h
        .store
        .wait_for_intent(b, f.session, Duration::from_millis(10))
        .await
        .map(|_| ())));
    h.store
        .insert_effect(a, &effect(f.session, "k"))
        .await
        .unwrap();
    let up = EffectUpdate {
        from: EffectStatus::Prepared,
        to: EffectStatus::Dispatched,
        outcome: None,
        error: None,
    };
    assert!(nf(h
        .store
        .update_effect(b, &OperationKey::from("k"), up)
        .await
        .map(|_| ())));
    let ap = ApprovalRecord::request(
        f.session,
        TurnId::new(),
        ToolCallId::from("c"),
        "shell",
        json!({}),
        Utc::now(),
        ChronoDuration::hours(1),
    );
    h.store.create_approval(a, &ap).await.unwrap();
    assert!(nf(h
        .store
        .decide_approval(
            b,
            ap.approval_id,
            ApprovalDecision::AllowOnce,
            &ap.args_hash,
            Utc::now()
        )
        .await
        .map(|_| ())));
    assert!(nf(h
        .store
        .expire_approval(b, ap.approval_id, Utc::now())
        .await
        .map(|_| ())));
    // A's lease, effect and approval are untouched.
    assert_eq!(
        h.store.get_session(a, f.session).await.unwrap().lease_epoch,
        f.lease.epoch
    );
    assert_eq!(
        h.store
            .get_effect(a, &OperationKey::from("k"))
            .await
            .unwrap()
            .status,
        EffectStatus::Prepared
    );
    assert_eq!(
        h.store
            .get_approval(a, ap.approval_id)
            .await
            .unwrap()
            .status,
        ApprovalStatus::Pending
    );
}

/// Opening a store is Send, so it can happen inside tokio::spawn.
pub async fn opening_a_store_is_send(h: &Harness) {
    let location = h.location.open_string();
    let store = tokio::spawn(async move { keel_store::open(&location).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.backend(), h.store.backend());
}

/// Listing pages past any number of sessions; due timers come earliest first; the scheduler's scan
/// sees due sessions of every tenant, each named with its tenant.
pub async fn sessions_page_and_due_timers_span_tenants(h: &Harness) {
    let (a, b) = (tenant(), tenant());
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(session(&h.store, a).await.session);
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = h
            .store
            .list_sessions(
                a,
                &SessionQuery {
                    after,
                    limit: Some(2),
                    ..SessionQuery::default()
                },
            )
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(|s| s.session_id);
        seen.extend(page.into_iter().map(|s| s.session_id));
    }
    assert_eq!(
        seen, ids,
        "pages cover every session once, in creation order"
    );
    let now = Utc::now();
    let other = session(&h.store, b).await.session;
    h.store
        .set_wake_at(a, ids[3], Some(now - ChronoDuration::seconds(1)))
        .await
        .unwrap();
    h.store
        .set_wake_at(a, ids[1], Some(now - ChronoDuration::seconds(3)))
        .await
        .unwrap();
    h.store
        .set_wake_at(b, other, Some(now - ChronoDuration::seconds(2)))
        .await
        .unwrap();
    h.store
        .set_wake_at(a, ids[0], Some(now + ChronoDuration::hours(1)))
        .await
        .unwrap();
    let due = h
        .store
        .list_sessions(
            a,
            &SessionQuery {
                wake_before: Some(now),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|s| s.session_id).collect::<Vec<_>>(),
        vec![ids[1], ids[3]],
        "earliest wake-up first"
    );
    let all_due = h.store.due_sessions(now, 100).await.unwrap();
    let mine: Vec<(TenantId, SessionId)> = all_due
        .iter()
        .filter(|d| d.tenant_id == a || d.tenant_id == b)
        .map(|d| (d.tenant_id, d.session_id))
        .collect();
    assert_eq!(mine, vec![(a, ids[1]), (b, other), (a, ids[3])]);
}

/// A journal row whose type column disagrees with its body is reported, not trusted.
pub async fn an_event_row_whose_type_disagrees_is_corrupt(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    h.store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
        .await
        .unwrap();
    h.raw(&format!(
        "UPDATE events SET type = 'turn.started' WHERE session_id = '{}' AND seq = 2",
        f.session
    ))
    .await;
    let err = h.store.read(t, f.session, 2, None).await.unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::CorruptRow {
                table: "events",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("turn.queued"), "{err}");
}

// --- append extras, usage, commit counts ---------------------------------------------------------

/// A pending approval of `session` for tool call `call`, expiring in an hour.
pub fn approval(session: SessionId, call: &str) -> ApprovalRecord {
    ApprovalRecord::request(
        session,
        TurnId::new(),
        ToolCallId::from(call),
        "shell",
        json!({"command": call}),
        Utc::now(),
        ChronoDuration::hours(1),
    )
}

fn delta(day: &str, model: &str, input: u64, cost_usd: f64, steps: u32) -> UsageDelta {
    UsageDelta {
        day: day.into(),
        model: model.into(),
        usage: Usage {
            input_tokens: input,
            output_tokens: 2 * input,
            cache_read_tokens: 3,
            cache_write_tokens: 4,
            reasoning_tokens: 5,
        },
        cost_usd,
        steps,
    }
}

/// A time at the store's millisecond precision.
fn ms(t: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap()
}

/// Everything an append's extras could have written, to compare before and after a refused one.
async fn side_tables(
    h: &Harness,
    t: TenantId,
    s: SessionId,
) -> (
    u64,
    usize,
    Vec<EffectRecord>,
    Vec<ApprovalRecord>,
    Vec<UsageRow>,
    Option<chrono::DateTime<Utc>>,
    Vec<(String, Vec<u8>)>,
    Vec<ReservationRow>,
) {
    let rec = h.store.get_session(t, s).await.unwrap();
    (
        rec.version,
        h.store.read(t, s, 0, None).await.unwrap().len(),
        h.store.list_effects(t, s, None).await.unwrap(),
        h.store.list_approvals(t, s, None).await.unwrap(),
        h.store.usage(t, "2000-01-01", "2999-12-31").await.unwrap(),
        rec.wake_at,
        h.store
            .sealed_rows(t, s, SealedKind::Arguments)
            .await
            .unwrap(),
        h.store.usage_reservations(t, "2026-03-01").await.unwrap(),
    )
}

/// Reserves 10 tokens for `f`'s session on 2026-03-01 (what `release_reservation` ends).
async fn reserve(h: &Harness, t: TenantId, f: &super::harness::Fixture) {
    let r = UsageReservation {
        session_id: f.session,
        lease_epoch: f.lease.epoch,
        day: "2026-03-01".into(),
        tokens: 10,
        cost_usd: 0.0,
        max_tokens: None,
        max_cost_usd: None,
    };
    assert!(matches!(
        h.store.reserve_usage(t, &r).await.unwrap(),
        Reservation::Granted { tokens: 10, .. }
    ));
}

pub async fn append_with_writes_events_and_extras_atomically(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    // An effect first inserted the ordinary way; the append's row replaces it.
    let prepared = effect(f.session, "k/replaced");
    h.store.insert_effect(t, &prepared).await.unwrap();
    let first = h
        .store
        .get_effect(t, &prepared.operation_key)
        .await
        .unwrap();
    let wake = ms(Utc::now() + ChronoDuration::minutes(5));
    let mut dispatched = first.clone();
    dispatched.status = EffectStatus::Dispatched;
    dispatched.attempts = 1;
    dispatched.updated_at = ms(Utc::now() + ChronoDuration::seconds(1));
    let mut fresh = effect(f.session, "k/new");
    fresh.status = EffectStatus::Committed;
    fresh.attempts = 1;
    fresh.outcome = Some(json!({"exit_code": 0}));
    fresh.created_at = ms(Utc::now());
    fresh.updated_at = fresh.created_at;
    let ask = approval(f.session, "call_9");
    reserve(h, t, &f).await;
    let extras = AppendExtras {
        effects: vec![dispatched.clone(), fresh.clone()],
        claims: Vec::new(),
        approvals: vec![ask.clone()],
        usage: vec![delta("2026-03-01", "openai:gpt", 100, 0.25, 1)],
        wake_at: Some(Some(wake)),
        seal: vec![(args_key("call_9"), b"sealed".to_vec())],
        unseal: vec![args_key("call_8")],
        release_id: None,
        release_reservation: true,
        transcript: Vec::new(),
        work: None,
        priority: None,
        consume_intent: None,
    };
    assert!(!extras.is_empty());
    assert!(AppendExtras::default().is_empty());
    let v = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 2),
            &extras,
        )
        .await
        .unwrap();
    assert_eq!(v, 3);
    assert_eq!(h.store.read(t, f.session, 0, None).await.unwrap().len(), 3);
    assert!(
        h.store
            .usage_reservations(t, "2026-03-01")
            .await
            .unwrap()
            .is_empty(),
        "the reservation ended with the append"
    );
    let got = h
        .store
        .get_effect(t, &dispatched.operation_key)
        .await
        .unwrap();
    assert_eq!((got.status, got.attempts), (EffectStatus::Dispatched, 1));
    assert_eq!(got.updated_at, dispatched.updated_at);
    assert_eq!(
        got.created_at, first.created_at,
        "a replaced row keeps created_at"
    );
    let got = h.store.get_effect(t, &fresh.operation_key).await.unwrap();
    assert_eq!(got, fresh, "a new effect row is written as given");
    let stored = h.store.get_approval(t, ask.approval_id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Pending);
    assert_eq!(stored.args_hash, ask.args_hash);
    assert_eq!(ms(stored.expires_at), ms(ask.expires_at));
    assert_eq!(
        h.store
            .sealed_rows(t, f.session, SealedKind::Arguments)
            .await
            .unwrap(),
        vec![("call_9".to_owned(), b"sealed".to_vec())]
    );
    let usage = h.store.usage(t, "2026-03-01", "2026-03-01").await.unwrap();
    assert_eq!(
        usage,
        vec![UsageRow {
            day: "2026-03-01".into(),
            model: "openai:gpt".into(),
            usage: delta("", "", 100, 0.0, 0).usage,
            cost_usd: 0.25,
            steps: 1,
        }]
    );
    let rec = h.store.get_session(t, f.session).await.unwrap();
    assert_eq!((rec.version, rec.wake_at), (3, Some(wake)));
    // Whatever the wake-up time, `None` leaves it; `Some(None)` clears it.
    let mut committed = dispatched.clone();
    committed.status = EffectStatus::Committed;
    committed.outcome = Some(json!({"ok": true}));
    h.store
        .append_with(
            t,
            f.session,
            3,
            f.lease.epoch,
            &events(f.session, 3, 1),
            &AppendExtras {
                effects: vec![committed.clone()],
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        h.store.get_session(t, f.session).await.unwrap().wake_at,
        Some(wake)
    );
    let got = h
        .store
        .get_effect(t, &committed.operation_key)
        .await
        .unwrap();
    assert_eq!(got.status, EffectStatus::Committed);
    assert_eq!(got.outcome, Some(json!({"ok": true})));
    h.store
        .append_with(
            t,
            f.session,
            4,
            f.lease.epoch,
            &events(f.session, 4, 1),
            &AppendExtras {
                wake_at: Some(None),
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap();
    let rec = h.store.get_session(t, f.session).await.unwrap();
    assert_eq!((rec.version, rec.wake_at), (5, None));
    // Plain `append` is `append_with` with no extras.
    h.store
        .append(t, f.session, 5, f.lease.epoch, &events(f.session, 5, 1))
        .await
        .unwrap();
    assert_eq!(
        h.store
            .list_effects(t, f.session, None)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        h.store
            .list_approvals(t, f.session, None)
            .await
            .unwrap()
            .len(),
        1
    );
}

pub async fn stale_append_with_writes_none_of_its_extras(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let wake = ms(Utc::now() + ChronoDuration::minutes(5));
    h.store.set_wake_at(t, f.session, Some(wake)).await.unwrap();
    reserve(h, t, &f).await;
    let extras = AppendExtras {
        effects: vec![effect(f.session, "k/stale")],
        claims: Vec::new(),
        approvals: vec![approval(f.session, "call_1")],
        usage: vec![delta("2026-03-01", "m", 10, 1.0, 1)],
        wake_at: Some(None),
        seal: vec![(args_key("call_9"), b"sealed".to_vec())],
        unseal: vec![args_key("call_8")],
        release_id: None,
        release_reservation: true,
        transcript: Vec::new(),
        work: None,
        priority: None,
        consume_intent: None,
    };
    let before = side_tables(h, t, f.session).await;
    // Stale version (behind and ahead).
    for expected in [0, 7] {
        let err = h
            .store
            .append_with(
                t,
                f.session,
                expected,
                f.lease.epoch,
                &events(f.session, expected, 1),
                &extras,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::StaleVersion { actual: 1, .. }),
            "{err}"
        );
    }
    // A lost lease.
    let err = h
        .store
        .append_with(
            t,
            f.session,
            1,
            LeaseEpoch(f.lease.epoch.0 + 1),
            &events(f.session, 1, 1),
            &extras,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err}");
    // Another tenant's view of the session.
    let err = h
        .store
        .append_with(
            tenant(),
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 1),
            &extras,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    assert_eq!(side_tables(h, t, f.session).await, before);
    assert!(matches!(
        h.store
            .get_approval(t, extras.approvals[0].approval_id)
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A first dispatch's claim ([`AppendExtras::claims`]): granted on a new key and on a row still
/// `prepared`; refused, writing nothing of the append, on a row past `prepared`; a key
/// claimed without its row is invalid input; an unclaimed row past `prepared` is replaced.
pub async fn a_claimed_effect_past_prepared_refuses_the_whole_append(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let dispatched_as = |key: &str| {
        let mut e = effect(f.session, key);
        e.status = EffectStatus::Dispatched;
        e.attempts = 1;
        e
    };
    let claim = |e: &EffectRecord| AppendExtras {
        effects: vec![e.clone()],
        claims: vec![e.operation_key.clone()],
        ..AppendExtras::default()
    };
    let append = async |v: u64, n: usize, extras: &AppendExtras| {
        h.store
            .append_with(
                t,
                f.session,
                v,
                f.lease.epoch,
                &events(f.session, v, n),
                extras,
            )
            .await
    };
    // A new key, and a key whose row is still `prepared`: granted.
    let new = dispatched_as("k/new");
    let mut v = 1;
    v = append(v, 1, &claim(&new)).await.unwrap();
    let prepared = effect(f.session, "k/prepared");
    h.store.insert_effect(t, &prepared).await.unwrap();
    v = append(v, 1, &claim(&dispatched_as("k/prepared")))
        .await
        .unwrap();
    for key in ["k/new", "k/prepared"] {
        let row = h
            .store
            .get_effect(t, &OperationKey::from(key))
            .await
            .unwrap();
        assert_eq!(row.status, EffectStatus::Dispatched, "{key}");
    }
    // A row past `prepared` (a dispatch the journal lacks): refused, nothing written.
    let mut ahead = effect(f.session, "k/ahead");
    h.store.insert_effect(t, &ahead).await.unwrap();
    h.store
        .update_effect(
            t,
            &ahead.operation_key,
            EffectUpdate {
                from: EffectStatus::Prepared,
                to: EffectStatus::Dispatched,
                outcome: None,
                error: None,
            },
        )
        .await
        .unwrap();
    let before = side_tables(h, t, f.session).await;
    ahead.status = EffectStatus::Dispatched;
    ahead.attempts = 1;
    ahead.request_hash = "sha256:mine".into();
    let err = append(v, 2, &claim(&ahead)).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::EffectClaimed { key } if key == "k/ahead"),
        "{err}"
    );
    assert_eq!(
        h.store.read(t, f.session, 0, None).await.unwrap().len() as u64,
        v
    );
    assert_eq!(side_tables(h, t, f.session).await, before);
    let row = h.store.get_effect(t, &ahead.operation_key).await.unwrap();
    assert_ne!(
        row.request_hash, "sha256:mine",
        "the other writer's row is kept"
    );
    // A claim without its row.
    let err = append(
        v,
        1,
        &AppendExtras {
            claims: vec![OperationKey::from("k/nowhere")],
            ..claim(&dispatched_as("k/other"))
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    // The same row unclaimed (the journal settles it: outcome unknown): replaced.
    ahead.status = EffectStatus::OutcomeUnknown;
    let settled = append(
        v,
        2,
        &AppendExtras {
            effects: vec![ahead.clone()],
            ..AppendExtras::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(settled, v + 2);
    let row = h.store.get_effect(t, &ahead.operation_key).await.unwrap();
    assert_eq!(row.status, EffectStatus::OutcomeUnknown);
}

pub async fn a_failing_extra_makes_the_whole_append_write_nothing(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let other = session(&h.store, t).await;
    let existing = approval(f.session, "call_1");
    h.store.create_approval(t, &existing).await.unwrap();
    h.store
        .insert_effect(t, &effect(other.session, "k/other"))
        .await
        .unwrap();
    let wake = ms(Utc::now() + ChronoDuration::minutes(5));
    let good = AppendExtras {
        effects: vec![effect(f.session, "k/1")],
        claims: Vec::new(),
        approvals: vec![approval(f.session, "call_2")],
        usage: vec![delta("2026-03-01", "m", 10, 1.0, 1)],
        wake_at: Some(Some(wake)),
        seal: vec![(args_key("call_9"), b"sealed".to_vec())],
        unseal: vec![args_key("call_8")],
        release_id: None,
        release_reservation: true,
        transcript: Vec::new(),
        work: None,
        priority: None,
        consume_intent: None,
    };
    reserve(h, t, &f).await;
    let before = side_tables(h, t, f.session).await;
    assert_eq!(before.7.len(), 1);
    let try_with = |extras: AppendExtras| {
        let store = h.store.clone();
        let (sid, epoch) = (f.session, f.lease.epoch);
        async move {
            store
                .append_with(t, sid, 1, epoch, &events(sid, 1, 2), &extras)
                .await
        }
    };
    // An approval id that exists: Conflict, and neither events nor any other extra are written
    // (the good rows come first, so they were written and rolled back).
    let mut dup = good.clone();
    dup.approvals.push(existing.clone());
    let err = try_with(dup).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    // An operation key held by another session: Conflict.
    let mut taken = good.clone();
    let mut stolen = effect(f.session, "k/other");
    stolen.status = EffectStatus::Committed;
    taken.effects.push(stolen);
    let err = try_with(taken).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    // Rows of another session, bad usage: InvalidInput before anything is written.
    let mut foreign = good.clone();
    foreign.effects.push(effect(other.session, "k/2"));
    let err = try_with(foreign).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    let mut foreign = good.clone();
    foreign.approvals = vec![approval(other.session, "call_3")];
    let err = try_with(foreign).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidInput(_)), "{err}");
    for (day, cost) in [
        ("2026-3-01", 1.0),
        ("2026-02-30", 1.0),
        ("today", 1.0),
        ("2026-03-01", f64::NAN),
        ("2026-03-01", -1.0),
        ("2026-03-01", f64::INFINITY),
    ] {
        let mut bad = good.clone();
        bad.usage.push(delta(day, "m", 1, cost, 1));
        let err = try_with(bad).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidInput(_)),
            "{day} {cost}: {err}"
        );
    }
    assert_eq!(side_tables(h, t, f.session).await, before);
    assert_eq!(
        h.store
            .get_effect(t, &OperationKey::from("k/other"))
            .await
            .unwrap()
            .status,
        EffectStatus::Prepared,
        "the other session's effect is untouched"
    );
    // The same append without the failing extra goes through at the same version.
    assert_eq!(try_with(good.clone()).await.unwrap(), 3);
    let after = side_tables(h, t, f.session).await;
    assert_eq!(
        (after.0, after.1, after.2.len(), after.3.len()),
        (3, 3, 1, 2)
    );
    assert_eq!(after.4.len(), 1);
    assert_eq!(after.5, Some(wake));
    assert!(after.7.is_empty(), "the reservation ended with the append");
}

pub async fn usage_accumulates_and_is_tenant_scoped(h: &Harness) {
    let (t, u) = (tenant(), tenant());
    let f = session(&h.store, t).await;
    let g = session(&h.store, u).await;
    let mut v = 1;
    for (day, model, input, cost) in [
        ("2026-03-02", "b", 10, 0.5),
        ("2026-03-01", "b", 1, 0.25),
        ("2026-03-02", "a", 100, 1.0),
        ("2026-03-02", "b", 20, 0.5),
        ("2026-03-03", "a", 7, 0.125),
    ] {
        v = h
            .store
            .append_with(
                t,
                f.session,
                v,
                f.lease.epoch,
                &events(f.session, v, 1),
                &AppendExtras {
                    usage: vec![delta(day, model, input, cost, 1)],
                    ..AppendExtras::default()
                },
            )
            .await
            .unwrap();
    }
    // Two deltas in one append add up too.
    h.store
        .append_with(
            u,
            g.session,
            1,
            g.lease.epoch,
            &events(g.session, 1, 1),
            &AppendExtras {
                usage: vec![
                    delta("2026-03-02", "b", 1000, 10.0, 3),
                    delta("2026-03-02", "b", 1000, 10.0, 3),
                ],
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap();
    let rows = h.store.usage(t, "2026-03-01", "2026-03-03").await.unwrap();
    let keys: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.day.as_str(), r.model.as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("2026-03-01", "b"),
            ("2026-03-02", "a"),
            ("2026-03-02", "b"),
            ("2026-03-03", "a"),
        ],
        "ordered by day, then model"
    );
    let b2 = &rows[2];
    assert_eq!(
        b2.usage,
        Usage {
            input_tokens: 30,
            output_tokens: 60,
            cache_read_tokens: 6,
            cache_write_tokens: 8,
            reasoning_tokens: 10,
        }
    );
    assert_eq!((b2.cost_usd, b2.steps), (1.0, 2));
    assert_eq!(rows[3].cost_usd, 0.125);
    // The range is inclusive at both ends.
    let mid = h.store.usage(t, "2026-03-02", "2026-03-02").await.unwrap();
    assert_eq!(mid.len(), 2);
    assert!(
        h.store
            .usage(t, "2026-03-04", "2026-12-31")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        h.store
            .usage(t, "2026-03-03", "2026-03-01")
            .await
            .unwrap()
            .is_empty()
    );
    // The other tenant sees only its own.
    let theirs = h.store.usage(u, "2026-01-01", "2026-12-31").await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(
        (
            theirs[0].usage.input_tokens,
            theirs[0].cost_usd,
            theirs[0].steps
        ),
        (2000, 20.0, 6)
    );
    assert!(
        h.store
            .usage(tenant(), "2026-01-01", "2026-12-31")
            .await
            .unwrap()
            .is_empty()
    );
    for (from, to) in [
        ("2026-3-1", "2026-03-02"),
        ("2026-03-01", "2026-13-01"),
        ("", "2026-03-01"),
        ("2026-03-01 ", "2026-03-02"),
    ] {
        let err = h.store.usage(t, from, to).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidInput(_)),
            "{from}..{to}: {err}"
        );
    }
    // Usage is the tenant's, not the session's: it outlives the session.
    h.store.delete_session(t, f.session).await.unwrap();
    assert_eq!(
        h.store.usage(t, "2026-03-01", "2026-03-03").await.unwrap(),
        rows
    );
}

/// Many tasks appending with extras at once (on SQLite they share group commits): two racers per
/// session and version (one wins; only the winner's extras land), a request whose approval always
/// conflicts (fails alone), and plain appends on the fast path, all mixed in the same batches.
pub async fn concurrent_append_with_applies_each_requests_extras_once(h: &Harness) {
    const TASKS: usize = 24;
    const ROUNDS: u64 = 5;
    let t = tenant();
    let day = "2026-04-01";
    let before = h.store.commits();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store: Arc<dyn Store> = h.store.clone();
        let s = session(&store, t).await;
        let poison = session(&store, t).await;
        let plain = session(&store, t).await;
        let taken = approval(poison.session, "taken");
        store.create_approval(t, &taken).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut v = 1;
            let mut vq = 1;
            let mut winners = Vec::new();
            for i in 0..ROUNDS {
                let extras_for = |who: &str| AppendExtras {
                    effects: vec![effect(s.session, &format!("{}/{i}/{who}", s.session))],
                    approvals: vec![approval(s.session, &format!("{i}/{who}"))],
                    usage: vec![delta(day, "race", 1, 0.5, 1)],
                    wake_at: Some(Some(ms(Utc::now()))),
                    ..AppendExtras::default()
                };
                let (xa, xb) = (extras_for("a"), extras_for("b"));
                let (ea, eb) = (events(s.session, v, 1), events(s.session, v, 2));
                let ep = events(poison.session, 1, 1);
                let eq = events(plain.session, vq, 1);
                let xp = AppendExtras {
                    approvals: vec![approval(poison.session, "new"), taken.clone()],
                    usage: vec![delta(day, "poison", 1, 0.5, 1)],
                    ..AppendExtras::default()
                };
                let (ra, rb, rp, rq) = tokio::join!(
                    store.append_with(t, s.session, v, s.lease.epoch, &ea, &xa),
                    store.append_with(t, s.session, v, s.lease.epoch, &eb, &xb),
                    store.append_with(t, poison.session, 1, poison.lease.epoch, &ep, &xp),
                    store.append(t, plain.session, vq, plain.lease.epoch, &eq),
                );
                assert!(matches!(rp, Err(StoreError::Conflict(_))), "{rp:?}");
                vq = rq.unwrap();
                let (won, lost, lost_x) = match (ra, rb) {
                    (Ok(n), Err(e)) => ((n, xa), e, xb),
                    (Err(e), Ok(n)) => ((n, xb), e, xa),
                    other => panic!("exactly one racer wins: {other:?}"),
                };
                assert!(matches!(lost, StoreError::StaleVersion { .. }), "{lost}");
                assert!(matches!(
                    store.get_approval(t, lost_x.approvals[0].approval_id).await,
                    Err(StoreError::NotFound { .. })
                ));
                assert!(matches!(
                    store.get_effect(t, &lost_x.effects[0].operation_key).await,
                    Err(StoreError::NotFound { .. })
                ));
                v = won.0;
                winners.push(won.1);
            }
            (s, poison, plain, v, vq, winners)
        }));
    }
    for task in tasks {
        let (s, poison, plain, v, vq, winners) = task.await.unwrap();
        let evs = h.store.read(t, s.session, 0, None).await.unwrap();
        assert_eq!(evs.len() as u64, v);
        SessionState::replay(&evs).unwrap();
        let effects = h.store.list_effects(t, s.session, None).await.unwrap();
        let mut want: Vec<_> = winners
            .iter()
            .map(|x| x.effects[0].operation_key.clone())
            .collect();
        let mut got: Vec<_> = effects.iter().map(|e| e.operation_key.clone()).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want, "exactly the winners' effects");
        let approvals = h.store.list_approvals(t, s.session, None).await.unwrap();
        assert_eq!(approvals.len(), ROUNDS as usize);
        for x in &winners {
            h.store
                .get_approval(t, x.approvals[0].approval_id)
                .await
                .unwrap();
        }
        let rec = h.store.get_session(t, s.session).await.unwrap();
        assert_eq!(rec.wake_at, winners.last().unwrap().wake_at.unwrap());
        // The poisoned requests wrote nothing.
        let p = side_tables(h, t, poison.session).await;
        assert_eq!((p.0, p.1, p.2.len(), p.3.len()), (1, 1, 0, 1));
        assert_eq!(vq, 1 + ROUNDS);
        assert_eq!(
            h.store.get_session(t, plain.session).await.unwrap().version,
            vq
        );
    }
    let usage = h.store.usage(t, day, day).await.unwrap();
    assert_eq!(usage.len(), 1, "no poison usage: {usage:?}");
    let n = TASKS as u64 * ROUNDS;
    assert_eq!(usage[0].model, "race");
    assert_eq!((usage[0].steps, usage[0].usage.input_tokens), (n, n));
    assert_eq!(usage[0].cost_usd, 0.5 * n as f64);
    // One journal commit per successful caller (winners, plain appends, and each fixture's
    // session.created), however group commit merged them.
    let after = h.store.commits();
    assert_eq!(after.journal - before.journal, 2 * n + 3 * TASKS as u64);
}

pub async fn commit_counts_follow_committed_writes(h: &Harness) {
    let t = tenant();
    let c0 = h.store.commits();
    let f = session(&h.store, t).await;
    let c1 = h.store.commits();
    assert_eq!(
        (
            c1.journal - c0.journal,
            c1.tables - c0.tables,
            c1.leases - c0.leases
        ),
        (1, 1, 1),
        "create_session, acquire_lease, append"
    );
    // One append_with with every kind of extra: one journal commit, no table commit.
    h.store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 3),
            &AppendExtras {
                effects: vec![effect(f.session, "k/1"), effect(f.session, "k/2")],
                approvals: vec![approval(f.session, "c")],
                usage: vec![delta("2026-03-01", "m", 1, 0.0, 1)],
                wake_at: Some(Some(Utc::now())),
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap();
    let c2 = h.store.commits();
    assert_eq!(
        c2,
        CommitCounts {
            journal: c1.journal + 1,
            ..c1
        }
    );
    // An append that sets the scheduler's columns counts among `journal_row_columns` too; the
    // one above (extras, but no work mark, priority or status change) did not.
    h.store
        .append_with(
            t,
            f.session,
            4,
            f.lease.epoch,
            &events(f.session, 4, 1),
            &AppendExtras {
                work: Some(keel_store::WorkMark {
                    runnable: true,
                    queued_turns: 1,
                }),
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap();
    let c2 = {
        let c = h.store.commits();
        assert_eq!(
            c,
            CommitCounts {
                journal: c2.journal + 1,
                journal_row_columns: c2.journal_row_columns + 1,
                ..c2
            }
        );
        c
    };
    h.store
        .insert_effect(t, &effect(f.session, "k/3"))
        .await
        .unwrap();
    let c3 = h.store.commits();
    assert_eq!(
        c3,
        CommitCounts {
            tables: c2.tables + 1,
            ..c2
        }
    );
    let other = SessionId::new();
    h.store
        .create_session(
            t,
            NewSession {
                session_id: other,
                release_id: ReleaseId::from("x"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await
        .unwrap();
    let lease = h
        .store
        .acquire_lease(t, other, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let c4 = h.store.commits();
    assert_eq!(
        c4,
        CommitCounts {
            tables: c3.tables + 1,
            leases: c3.leases + 1,
            ..c3
        }
    );
    // Failed writes count nothing: stale, lost lease, failing extras, a held lease, a conflict.
    let _ = h
        .store
        .append(t, f.session, 1, f.lease.epoch, &events(f.session, 1, 1))
        .await
        .unwrap_err();
    let _ = h
        .store
        .append(t, f.session, 5, LeaseEpoch(99), &events(f.session, 5, 1))
        .await
        .unwrap_err();
    let _ = h
        .store
        .append_with(
            t,
            f.session,
            5,
            f.lease.epoch,
            &events(f.session, 5, 1),
            &AppendExtras {
                approvals: vec![
                    h.store.list_approvals(t, f.session, None).await.unwrap()[0].clone(),
                ],
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap_err();
    let _ = h
        .store
        .acquire_lease(t, other, "x", Duration::from_secs(30))
        .await
        .unwrap_err();
    let _ = h
        .store
        .create_approval(
            t,
            &h.store.list_approvals(t, f.session, None).await.unwrap()[0],
        )
        .await
        .unwrap_err();
    let _ = h
        .store
        .set_wake_at(t, SessionId::new(), None)
        .await
        .unwrap_err();
    assert_eq!(h.store.commits(), c4);
    // Lease writes count as leases, the rest as tables; reads count nothing.
    let lease = h
        .store
        .renew_lease(t, &lease, Duration::from_secs(30))
        .await
        .unwrap();
    h.store.release_lease(t, &lease).await.unwrap();
    h.store.set_wake_at(t, other, None).await.unwrap();
    h.store.memory_put(t, "ns", "k", &json!(1)).await.unwrap();
    h.store.memory_get(t, "ns", "k").await.unwrap();
    h.store.usage(t, "2026-03-01", "2026-03-01").await.unwrap();
    h.store.read(t, f.session, 0, None).await.unwrap();
    let c5 = h.store.commits();
    assert_eq!(
        c5,
        CommitCounts {
            tables: c4.tables + 2,
            leases: c4.leases + 2,
            ..c4
        }
    );
}

fn args_key(call: &str) -> SealedKey {
    SealedKey::new(SealedKind::Arguments, call)
}

/// Sealed rows commit with the append that carries them, are replaced by a later seal of the same
/// key, deleted by an unseal (an absent row is fine), scoped to their tenant, session and kind
/// (the same id under another kind is another row), not written by a stale append, and removed
/// with their session.
pub async fn sealed_rows_commit_with_the_journal(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let other = session(&h.store, t).await;
    let seal = |rows: &[(SealedKind, &str, &[u8])]| AppendExtras {
        seal: rows
            .iter()
            .map(|(k, c, b)| (SealedKey::new(*k, *c), b.to_vec()))
            .collect(),
        ..AppendExtras::default()
    };
    let rows = |s: SessionId, k: SealedKind| {
        let store = h.store.clone();
        async move { store.sealed_rows(t, s, k).await.unwrap() }
    };
    let v = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 1),
            &seal(&[
                (SealedKind::Arguments, "call_b", b"\x00\xffB"),
                (SealedKind::Arguments, "call_a", b"A"),
                (SealedKind::Reasoning, "call_a", b"R"),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(
        rows(f.session, SealedKind::Arguments).await,
        vec![
            ("call_a".to_owned(), b"A".to_vec()),
            ("call_b".to_owned(), b"\x00\xffB".to_vec())
        ]
    );
    assert_eq!(
        rows(f.session, SealedKind::Reasoning).await,
        vec![("call_a".to_owned(), b"R".to_vec())]
    );
    assert!(rows(other.session, SealedKind::Arguments).await.is_empty());
    assert!(
        h.store
            .sealed_rows(tenant(), f.session, SealedKind::Arguments)
            .await
            .unwrap()
            .is_empty()
    );
    // A stale append writes none of its rows.
    let stale = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 1),
            &seal(&[(SealedKind::Arguments, "call_c", b"C")]),
        )
        .await;
    assert!(stale.is_err());
    assert_eq!(rows(f.session, SealedKind::Arguments).await.len(), 2);
    // Replace one, delete another and an absent one, in one append; the reasoning row of the
    // same id stays.
    let extras = AppendExtras {
        seal: vec![(args_key("call_b"), b"B2".to_vec())],
        unseal: vec![args_key("call_a"), args_key("call_zzz")],
        ..AppendExtras::default()
    };
    let v = h
        .store
        .append_with(
            t,
            f.session,
            v,
            f.lease.epoch,
            &events(f.session, v, 1),
            &extras,
        )
        .await
        .unwrap();
    assert_eq!(
        rows(f.session, SealedKind::Arguments).await,
        vec![("call_b".to_owned(), b"B2".to_vec())]
    );
    assert_eq!(rows(f.session, SealedKind::Reasoning).await.len(), 1);
    let extras = AppendExtras {
        unseal: vec![SealedKey::new(SealedKind::Reasoning, "call_a")],
        ..AppendExtras::default()
    };
    h.store
        .append_with(
            t,
            f.session,
            v,
            f.lease.epoch,
            &events(f.session, v, 1),
            &extras,
        )
        .await
        .unwrap();
    assert!(rows(f.session, SealedKind::Reasoning).await.is_empty());
    h.store.delete_session(t, f.session).await.unwrap();
    assert!(rows(f.session, SealedKind::Arguments).await.is_empty());
}

/// A re-pin's `release_id` extra moves the session row to the new release in the commit of its
/// `session.release_pinned`; a release the tenant has not stored (or stored only for another
/// tenant) makes the whole append write nothing, as does a stale append.
pub async fn a_re_pin_moves_the_session_row_with_its_event(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let release = |name: &str| {
        Release::new(AgentDefinition {
            name: name.into(),
            model_route: vec!["script:/tmp/other.jsonl".into()],
            instructions: String::new(),
            tools: Vec::new(),
            policy: json!({"deny": ["shell"]}),
            budget: Budget::default(),
            mcp_servers: Default::default(),
            agents: Default::default(),
        })
    };
    let (next, foreign, missing) = (release("next"), release("foreign"), release("missing"));
    h.store.put_release(t, &next).await.unwrap();
    h.store.put_release(tenant(), &foreign).await.unwrap();
    let repin = |version: u64, to: &Release| {
        vec![Event::new(
            f.session,
            version + 1,
            Utc::now(),
            Correlation::default(),
            EventBody::SessionReleasePinned {
                from_release_id: ReleaseId::from("sha256:test"),
                to_release_id: to.id.clone(),
            },
        )]
    };
    let extras = |to: &Release| AppendExtras {
        release_id: Some(to.id.clone()),
        ..AppendExtras::default()
    };
    for absent in [&missing, &foreign] {
        let err = h
            .store
            .append_with(
                t,
                f.session,
                1,
                f.lease.epoch,
                &repin(1, absent),
                &extras(absent),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::NotFound { entity: "release", id } if *id == absent.id.0),
            "{err}"
        );
        let rec = h.store.get_session(t, f.session).await.unwrap();
        assert_eq!(
            (rec.version, rec.release_id),
            (1, ReleaseId::from("sha256:test")),
            "nothing written"
        );
    }
    let v = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &repin(1, &next),
            &extras(&next),
        )
        .await
        .unwrap();
    let rec = h.store.get_session(t, f.session).await.unwrap();
    assert_eq!((rec.version, &rec.release_id), (v, &next.id));
    assert_eq!(
        h.store.read(t, f.session, v, None).await.unwrap()[0].type_name(),
        "session.release_pinned"
    );
    // A stale append does not move the row.
    h.store.put_release(t, &missing).await.unwrap();
    assert!(
        h.store
            .append_with(
                t,
                f.session,
                1,
                f.lease.epoch,
                &repin(1, &missing),
                &extras(&missing)
            )
            .await
            .is_err()
    );
    assert_eq!(
        h.store.get_session(t, f.session).await.unwrap().release_id,
        next.id
    );
}

/// Transcript rows given to `append_with` commit with its events: a stale append writes none;
/// a row written again unchanged is a no-op; a different row at a written index is a
/// `Conflict` and the whole append (events too) writes nothing; another tenant sees nothing.
pub async fn transcript_rows_commit_with_the_journal(h: &Harness) {
    let t = tenant();
    let f = session(&h.store, t).await;
    let turn = TurnId::new();
    let row = |i: u64, role: &str, text: &str| TranscriptItem {
        index: i,
        turn_id: Some(turn),
        role: role.into(),
        content: json!({"role": role, "content": text}),
    };
    let rows = |items: Vec<TranscriptItem>| AppendExtras {
        transcript: items,
        ..AppendExtras::default()
    };
    let commits = h.store.commits();
    let v = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 1),
            &rows(vec![row(0, "user", "hi"), row(1, "assistant", "hello")]),
        )
        .await
        .unwrap();
    let after = h.store.commits();
    assert_eq!(
        (
            after.journal - commits.journal,
            after.tables - commits.tables
        ),
        (1, 0),
        "one journal commit"
    );
    assert_eq!(
        h.store.read_transcript(t, f.session, 0).await.unwrap(),
        vec![row(0, "user", "hi"), row(1, "assistant", "hello")]
    );
    // Stale: nothing of it.
    let stale = h
        .store
        .append_with(
            t,
            f.session,
            1,
            f.lease.epoch,
            &events(f.session, 1, 1),
            &rows(vec![row(2, "user", "stale")]),
        )
        .await;
    assert!(stale.is_err());
    assert_eq!(
        h.store
            .read_transcript(t, f.session, 0)
            .await
            .unwrap()
            .len(),
        2
    );
    // The same row again (a repeated write) and a new one.
    let v = h
        .store
        .append_with(
            t,
            f.session,
            v,
            f.lease.epoch,
            &events(f.session, v, 1),
            &rows(vec![
                row(1, "assistant", "hello"),
                row(2, "summary", "so far"),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(
        h.store.read_transcript(t, f.session, 1).await.unwrap(),
        vec![row(1, "assistant", "hello"), row(2, "summary", "so far")]
    );
    // A different row at a written index: Conflict, and the events are not written either.
    let err = h
        .store
        .append_with(
            t,
            f.session,
            v,
            f.lease.epoch,
            &events(f.session, v, 1),
            &rows(vec![row(3, "user", "new"), row(2, "summary", "rewritten")]),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(h.store.get_session(t, f.session).await.unwrap().version, v);
    assert_eq!(
        h.store
            .read_transcript(t, f.session, 0)
            .await
            .unwrap()
            .len(),
        3
    );
    // Another tenant sees nothing; deleting the session deletes its rows.
    assert!(
        h.store
            .read_transcript(tenant(), f.session, 0)
            .await
            .is_err()
    );
    h.store.delete_session(t, f.session).await.unwrap();
    assert!(h.store.read_transcript(t, f.session, 0).await.is_err());
}
