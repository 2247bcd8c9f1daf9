//! The conformance cases. Each takes a fresh [`Harness`] and must pass on every backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;
use serde_json::json;

use super::harness::{Harness, events, session};

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
    let all = h.store.read(t, f.session, 0, None).await.unwrap();
    assert_eq!(all.len() as u64, version);
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
    // Case-insensitive, key or value, one namespace or all.
    let found = h
        .store
        .memory_search(t, Some("default"), "CARGO", 10)
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["build"]
    );
    let found = h.store.memory_search(t, None, "E", 10).await.unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(
        h.store.memory_search(t, None, "e", 2).await.unwrap().len(),
        2
    );
    // `%` and `_` are literal.
    let found = h.store.memory_search(t, None, "100%", 10).await.unwrap();
    assert_eq!(
        found.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["owner"]
    );
    assert!(
        h.store
            .memory_search(t, None, "1_0", 10)
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
            supported: 2,
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
            responses_consumed: 1,
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

/// Case folding agrees on both backends for what both can fold (ASCII), and exact text always
/// matches.
pub async fn memory_search_folds_ascii_and_matches_exact_text(h: &Harness) {
    let t = tenant();
    h.store
        .memory_put(t, "people", "author", &json!("Émile Zola"))
        .await
        .unwrap();
    assert_eq!(
        h.store
            .memory_search(t, None, "Émile Zola", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        h.store
            .memory_search(t, None, "ZOLA", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        h.store
            .memory_search(t, None, "mile", 10)
            .await
            .unwrap()
            .len(),
        1
    );
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
