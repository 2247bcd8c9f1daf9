//! An append that consumes an intent (`AppendExtras::consume_intent`): the intent's journal
//! entry and its poster's withdrawal (`Store::delete_intent`) exclude each other.

use std::sync::Arc;

use keel_core::*;
use keel_store::*;
use serde_json::json;

use super::harness::{Harness, events, session};

fn consuming(intent: &Intent) -> AppendExtras {
    AppendExtras {
        consume_intent: Some(intent.intent_id.clone()),
        ..AppendExtras::default()
    }
}

/// An append consuming a posted intent commits with the row's deletion (the poster's later
/// withdrawal finds nothing); one consuming an intent its poster withdrew — or another
/// session's intent — is `IntentGone` and writes nothing, events and other extras included.
pub async fn consuming_an_intent_commits_with_its_row_or_writes_nothing(h: &Harness) {
    let t = TenantId::new();
    let f = session(&h.store, t).await;
    let g = session(&h.store, t).await;
    let (s, epoch) = (f.session, f.lease.epoch);
    // Consumed: the events commit and the row is gone; the poster cannot withdraw it.
    let a = h
        .store
        .post_intent(t, s, "input", &json!({}))
        .await
        .unwrap();
    assert!(!consuming(&a).is_empty());
    let v = h
        .store
        .append_with(t, s, 1, epoch, &events(s, 1, 1), &consuming(&a))
        .await
        .unwrap();
    assert_eq!(v, 2);
    assert!(h.store.list_intents(t, s).await.unwrap().is_empty());
    assert!(
        !h.store.delete_intent(t, s, &a.intent_id).await.unwrap(),
        "the poster sees its intent taken"
    );

    // Withdrawn first: the append writes nothing, not even its other extras.
    let b = h
        .store
        .post_intent(t, s, "input", &json!({}))
        .await
        .unwrap();
    assert!(h.store.delete_intent(t, s, &b.intent_id).await.unwrap());
    let with_wake = AppendExtras {
        wake_at: Some(Some(chrono::Utc::now())),
        ..consuming(&b)
    };
    let err = h
        .store
        .append_with(t, s, 2, epoch, &events(s, 2, 1), &with_wake)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::IntentGone { session, intent_id } if *session == s && *intent_id == b.intent_id),
        "{err:?}"
    );
    assert_eq!(h.store.read(t, s, 0, None).await.unwrap().len(), 2);
    let row = h.store.get_session(t, s).await.unwrap();
    assert_eq!((row.version, row.wake_at), (2, None));

    // Another session's intent is not this append's to consume: gone for it, and kept.
    let c = h
        .store
        .post_intent(t, g.session, "cancel_turn", &json!({}))
        .await
        .unwrap();
    let err = h
        .store
        .append_with(t, s, 2, epoch, &events(s, 2, 1), &consuming(&c))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::IntentGone { .. }), "{err:?}");
    assert_eq!(h.store.list_intents(t, g.session).await.unwrap(), vec![c]);

    // Nothing moved: the next append at version 2 commits.
    assert_eq!(
        h.store
            .append(t, s, 2, epoch, &events(s, 2, 1))
            .await
            .unwrap(),
        3
    );
}

/// A poster's withdrawal racing a handler's consuming append, over and over, with another
/// session appending beside them (SQLite's group commit batches them): in every round exactly
/// one of them wins — the withdrawal returned `true` and nothing was journaled, or the append
/// committed and the withdrawal returned `false` — and the other session's appends all commit.
pub async fn consuming_an_intent_and_withdrawing_it_exclude_each_other(h: &Harness) {
    let t = TenantId::new();
    let f = session(&h.store, t).await;
    let other = session(&h.store, t).await;
    let (s, epoch) = (f.session, f.lease.epoch);
    let mut version = 1;
    let mut other_version = 1;
    let (mut withdrawn, mut consumed) = (0, 0);
    for _ in 0..40 {
        let intent = h
            .store
            .post_intent(t, s, "input", &json!({}))
            .await
            .unwrap();
        let store: Arc<dyn Store> = h.store.clone();
        let id = intent.intent_id.clone();
        let poster = tokio::spawn(async move { store.delete_intent(t, s, &id).await.unwrap() });
        let (other_events, own_events) = (
            events(other.session, other_version, 1),
            events(s, version, 1),
        );
        let extras = consuming(&intent);
        let beside = h.store.append(
            t,
            other.session,
            other_version,
            other.lease.epoch,
            &other_events,
        );
        let handler = h
            .store
            .append_with(t, s, version, epoch, &own_events, &extras);
        let (beside, handled) = tokio::join!(beside, handler);
        other_version = beside.unwrap();
        let took_back = poster.await.unwrap();
        match handled {
            Ok(v) => {
                assert!(!took_back, "journaled and withdrawn both");
                version = v;
                consumed += 1;
            }
            Err(StoreError::IntentGone { .. }) => {
                assert!(took_back, "refused but nobody withdrew it");
                withdrawn += 1;
            }
            Err(e) => panic!("unexpected append error: {e}"),
        }
        let stored = h.store.read(t, s, 0, None).await.unwrap();
        assert_eq!(
            stored.len() as u64,
            version,
            "the journal holds exactly the winners"
        );
        assert!(h.store.list_intents(t, s).await.unwrap().is_empty());
    }
    assert_eq!(withdrawn + consumed, 40);
    assert_eq!(other_version, 41);
}
