//! Tests of [`super`]: the committed tail, subscriptions reading it, what they redact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::Utc;
use keel_core::{Correlation, EventBody};
use keel_store::SqlStore;

use super::*;

fn events(session: SessionId, seqs: std::ops::RangeInclusive<u64>) -> Vec<Event> {
    seqs.map(|seq| {
        Event::new(
            session,
            seq,
            Utc::now(),
            Correlation::default(),
            EventBody::TurnQueued {
                input: format!("input {seq}"),
                compiled: None,
            },
        )
    })
    .collect()
}

/// A subscription of a session the store has never heard of: a read of its journal fails
/// (`NotFound`), so anything it yields came from the tail.
async fn subscription(
    dir: &tempfile::TempDir,
    session: SessionId,
    from_seq: u64,
    tail: Arc<CommittedTail>,
) -> Subscription {
    let redactor = Arc::new(Redactor::with_values(&[], &[]).unwrap());
    subscription_with(dir, session, from_seq, tail, redactor).await
}

async fn subscription_with(
    dir: &tempfile::TempDir,
    session: SessionId,
    from_seq: u64,
    tail: Arc<CommittedTail>,
    redactor: Arc<Redactor>,
) -> Subscription {
    let store = SqlStore::open_sqlite(&dir.path().join("k.db"))
        .await
        .unwrap();
    let (tx, rx) = broadcast::channel(4);
    std::mem::forget(tx);
    Subscription::new(
        Arc::new(store),
        TenantId::new(),
        session,
        from_seq,
        (rx, tail),
        redactor,
    )
}

fn seqs(items: &[SubscriptionItem]) -> Vec<u64> {
    items
        .iter()
        .map(|i| match i {
            SubscriptionItem::Event { event } => event.seq,
            other => panic!("{other:?}"),
        })
        .collect()
}

/// The tail keeps the last `TAIL_EVENTS` consecutive committed events: a batch that does
/// not follow the kept ones replaces them; an append that commits nothing keeps nothing.
#[test]
fn the_tail_keeps_the_last_consecutive_committed_events() {
    let s = SessionId::new();
    let tail = Arc::new(CommittedTail::default());
    tail.begin().committed(&events(s, 1..=3), None);
    tail.begin().committed(&events(s, 4..=5), None);
    assert_eq!(tail.events_since(2).unwrap().0.len(), 4);
    assert!(tail.events_since(6).is_none() && tail.events_since(0).is_none());
    drop(tail.begin());
    tail.begin().committed(&events(s, 9..=10), None);
    assert!(
        tail.events_since(4).is_none(),
        "a gap replaces what was kept"
    );
    assert_eq!(tail.events_since(9).unwrap().0.len(), 2);
    tail.begin().committed(&events(s, 11..=100), None);
    assert_eq!(
        tail.events_since(100 - TAIL_EVENTS as u64 + 1)
            .unwrap()
            .0
            .len(),
        TAIL_EVENTS
    );
    assert!(tail.events_since(100 - TAIL_EVENTS as u64).is_none());
    assert!(!tail.may_bring(101), "no append under way");
}

/// A subscriber takes committed events from the tail, and one that needs the events of an
/// append under way waits for it to end instead of reading the journal before they are
/// there.
#[tokio::test]
async fn a_subscriber_takes_committed_events_from_the_tail_and_waits_for_an_append_under_way() {
    let dir = tempfile::tempdir().unwrap();
    let s = SessionId::new();
    let tail = Arc::new(CommittedTail::default());
    let mut sub = subscription(&dir, s, 5, tail.clone()).await;
    assert!(tail.watched());
    // Far longer than the test takes: the waits below end with the append, not the bound.
    sub.tail_wait = Duration::from_secs(60);
    tail.begin().committed(&events(s, 5..=7), None);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            sub.next_timeout(Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(seqs(&got), [5, 6, 7]);

    let appending = tail.begin();
    let waiting = tokio::spawn(async move {
        let item = sub.next_timeout(Duration::from_secs(20)).await.unwrap();
        (item, sub)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "waits for the append under way");
    appending.committed(&events(s, 8..=9), None);
    let (item, mut sub) = waiting.await.unwrap();
    let next = sub
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&[item.unwrap(), next]), [8, 9]);

    // An append that ends without committing: the subscriber goes to the journal (which
    // fails here: the store has no such session) rather than waiting on the tail.
    let not_found = |r: &Result<Option<SubscriptionItem>>| {
        matches!(
            r,
            Err(crate::RuntimeError::Store(
                keel_store::StoreError::NotFound { .. }
            ))
        )
    };
    let appending = tail.begin();
    let waiting = tokio::spawn(async move {
        let read = sub.next_timeout(Duration::from_secs(20)).await;
        (read, sub)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "waits for the append under way");
    drop(appending);
    let (read, mut sub) = waiting.await.unwrap();
    assert!(not_found(&read), "{read:?}");

    // An append that does not end: the subscriber gives up on it after its bound and reads
    // the journal (and goes on delivering deltas) instead of waiting with it.
    sub.tail_wait = Duration::from_millis(50);
    let _stuck = tail.begin();
    let read = sub.next_timeout(Duration::from_secs(20)).await;
    assert!(not_found(&read), "{read:?}");
    drop(sub);
    assert!(
        !tail.watched() && tail.events_since(9).is_none(),
        "the events go with the last subscriber"
    );
}

/// The next item of `sub` as JSON text.
async fn next_text(sub: &mut Subscription) -> String {
    let item = sub.next_timeout(Duration::from_secs(5)).await.unwrap();
    serde_json::to_string(&item.unwrap()).unwrap()
}

/// Events this process committed reach a subscriber redacted by the subscriber's own
/// redactor: their bodies are not gone over again only when that very redactor staged all
/// of them, and the envelope (a model's tool call id) is looked at always.
#[tokio::test]
async fn tail_events_are_redacted_again_unless_the_subscribers_redactor_staged_them() {
    const SECRET: &str = "sk-abcdefghijklmnopqrstuvwxyz012345";
    let dir = tempfile::tempdir().unwrap();
    let s = SessionId::new();
    let mine = Arc::new(Redactor::with_values(&[], &[]).unwrap());
    let other = Arc::new(Redactor::with_values(&[], &[]).unwrap());
    let event = |seq: u64, call: Option<&str>| {
        let corr = Correlation {
            tool_call_id: call.map(|c| keel_core::ToolCallId(c.to_owned())),
            ..Correlation::default()
        };
        Event::new(
            s,
            seq,
            Utc::now(),
            corr,
            EventBody::TurnQueued {
                input: format!("input {SECRET}"),
                compiled: None,
            },
        )
    };
    let tail = Arc::new(CommittedTail::default());
    let mut sub = subscription_with(&dir, s, 1, tail.clone(), mine.clone()).await;
    tail.begin()
        .committed(&[event(1, None)], Some(other.clone()));
    tail.begin()
        .committed(&[event(2, None)], Some(mine.clone()));
    assert!(
        tail.events_since(1).unwrap().1.is_none(),
        "kept events staged by two redactors name neither"
    );
    for _ in 1..=2 {
        let got = next_text(&mut sub).await;
        assert!(
            !got.contains(SECRET),
            "not all staged by its redactor: {got}"
        );
        assert!(got.contains(crate::redact::REDACTED), "{got}");
    }

    // Staged by the subscriber's own redactor: the body went through it already, so it is
    // handed on as it was committed (a staged body never holds what the redactor finds;
    // this one does only to show the body is not gone over twice) ...
    let tail = Arc::new(CommittedTail::default());
    let mut sub = subscription_with(&dir, s, 1, tail.clone(), mine.clone()).await;
    tail.begin()
        .committed(&[event(1, None)], Some(mine.clone()));
    let first = next_text(&mut sub).await;
    assert!(first.contains(SECRET), "{first}");
    // ... but an envelope holding a secret sends the event through the whole redaction,
    // however deep its spelling is escaped: each id is looked at on its own (serialized
    // together, one level of escaping went to the serialization, and a secret escaped
    // three levels deep in a call id passed).
    let deep = format!("\\\\\\\\u0073{}", &SECRET[1..]);
    assert!(mine.holds_secret(&deep), "{deep}");
    for (seq, id) in [(2, SECRET), (3, deep.as_str())] {
        tail.begin()
            .committed(&[event(seq, Some(id))], Some(mine.clone()));
        let got = next_text(&mut sub).await;
        assert!(!got.contains(&SECRET[1..]), "{got}");
    }
    // Another redactor's: gone over again.
    let tail = Arc::new(CommittedTail::default());
    let mut sub = subscription_with(&dir, s, 1, tail.clone(), mine.clone()).await;
    tail.begin()
        .committed(&[event(1, None)], Some(other.clone()));
    let first = next_text(&mut sub).await;
    assert!(!first.contains(SECRET), "{first}");
}

/// A delta's call id is the model's string: redacted like its text.
#[tokio::test]
async fn a_deltas_call_id_is_redacted() {
    const SECRET: &str = "sk-abcdefghijklmnopqrstuvwxyz012345";
    let dir = tempfile::tempdir().unwrap();
    let s = SessionId::new();
    let sub = subscription(&dir, s, 1, Arc::new(CommittedTail::default())).await;
    for kind in [
        DeltaKind::ToolArguments {
            call_id: SECRET.into(),
            delta: "{}".into(),
        },
        DeltaKind::ToolProgress {
            call_id: SECRET.into(),
            progress: ToolProgress::Status { text: "ok".into() },
        },
    ] {
        let d = sub.redact_delta(Delta {
            session_id: s,
            after_seq: 1,
            kind,
        });
        let text = serde_json::to_string(&d).unwrap();
        assert!(!text.contains(SECRET), "{text}");
    }
}
