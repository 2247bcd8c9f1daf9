#![allow(clippy::unwrap_used)]

use super::*;

/// An input intent posted by an older build has no priority: it reads as 0. A priority of 0
/// is left out of the payload, which older builds then read as before.
#[test]
fn an_input_intent_without_a_priority_reads_as_zero() {
    let turn = TurnId::new();
    let old = serde_json::json!({"turn_id": turn, "input": "hi"});
    let p: InputIntent = serde_json::from_value(old.clone()).unwrap();
    assert_eq!(p.priority, 0);
    assert_eq!(serde_json::to_value(&p).unwrap(), old);
    let high = InputIntent { priority: 7, ..p };
    let v = serde_json::to_value(&high).unwrap();
    assert_eq!(v["priority"], 7);
    assert_eq!(
        serde_json::from_value::<InputIntent>(v).unwrap().priority,
        7
    );
}

// --- an intent withdrawn by its poster after the worker listed it -----------------------------

use std::future::Future;

use keel_testkit::db::{Backend, TestDb};

use crate::{Runtime, SessionConfig};

/// A session created by `worker`, and `submitter`: another process's runtime on the same store
/// that gives up on a held session after a short `lease_wait`.
struct Race {
    db: TestDb,
    worker: Runtime,
    submitter: Runtime,
    tenant: TenantId,
    session: SessionId,
    _ws: tempfile::TempDir,
}

async fn race(backend: Backend) -> Race {
    let db = TestDb::new(backend).await;
    let ws = tempfile::tempdir().unwrap();
    let runtime = |name: &str, lease_wait: Duration| {
        crate::test_support::scripted_runtime(db.store.clone(), name, lease_wait)
    };
    let worker = runtime("worker", Duration::from_secs(10));
    let submitter = runtime("submitter", Duration::from_millis(300));
    let release = crate::test_support::scripted_release();
    let tenant = TenantId::new();
    let config = SessionConfig {
        workspace: ws.path().to_path_buf(),
        ..SessionConfig::default()
    };
    let session = worker
        .create_session(tenant, &release, config)
        .await
        .unwrap();
    Race {
        db,
        worker,
        submitter,
        tenant,
        session,
        _ws: ws,
    }
}

/// The worker holds the session; the submitter's call (`ask`) posts its intent; the worker
/// lists the intents (its read, before it handles them); then, if `worker_first`, the worker
/// handles them at once, else only after the submitter's call returned (its `lease_wait` ran out
/// and it withdrew the intent). Returns the submitter's answer, the listed intents, how many the
/// worker took, and the journal's events after both.
async fn run_race<T: Send + 'static>(
    r: &Race,
    worker_first: bool,
    ask: impl Future<Output = crate::Result<T>> + Send + 'static,
) -> (crate::Result<T>, Vec<Intent>, usize, Vec<keel_core::Event>) {
    let (t, s) = (r.tenant, r.session);
    let mut held = r.worker.inner.hold_now(t, s).await.unwrap().unwrap();
    let asked = tokio::spawn(ask);
    // Correctness deadline only (the post comes within milliseconds).
    let listed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let l = r.db.store.list_intents(t, s).await.unwrap();
            if !l.is_empty() {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the submitter posts its intent");
    let (answer, taken) = if worker_first {
        let taken = handle_listed(&r.worker.inner, held.journal(), None, listed.clone())
            .await
            .unwrap();
        r.worker.inner.unhold(t, held).await;
        (asked.await.unwrap(), taken)
    } else {
        let answer = asked.await.unwrap();
        let taken = handle_listed(&r.worker.inner, held.journal(), None, listed.clone())
            .await
            .unwrap();
        r.worker.inner.unhold(t, held).await;
        (answer, taken)
    };
    assert!(
        r.db.store.list_intents(t, s).await.unwrap().is_empty(),
        "no intent is left behind"
    );
    let events = r.db.store.read(t, s, 1, None).await.unwrap();
    (answer, listed, taken, events)
}

fn count(events: &[keel_core::Event], ty: &str, turn: TurnId) -> usize {
    events
        .iter()
        .filter(|e| e.type_name() == ty && e.correlation.turn_id == Some(turn))
        .count()
}

/// The bug this guards: the submitter answered "busy" (409/503) after withdrawing its input, but
/// the worker, which had listed the intent before the withdrawal, still queued the turn — a
/// caller that retried got two turns. Now the worker's `turn.queued` commits only with the
/// intent's deletion: the withdrawal won, so no turn is queued and "busy" is the truth.
async fn an_input_withdrawn_after_the_workers_list_is_never_queued(b: Backend) {
    let r = race(b).await;
    let sub = r.submitter.clone();
    let (t, s) = (r.tenant, r.session);
    let (answer, listed, taken, events) =
        run_race(&r, false, async move { sub.submit(t, s, "hello").await }).await;
    assert!(
        matches!(answer, Err(RuntimeError::SessionBusy { .. })),
        "{answer:?}"
    );
    let p: InputIntent = serde_json::from_value(listed[0].payload.clone()).unwrap();
    assert_eq!(taken, 0, "the worker drops the withdrawn intent");
    assert_eq!(
        count(&events, "turn.queued", p.turn_id),
        0,
        "busy, and not queued"
    );
    assert!(r.worker.fold(t, s).await.unwrap().turns.is_empty());
}

/// The other order: the worker journals first; the submitter's withdrawal then finds nothing
/// to delete, and it answers with the queued turn — the one turn in the journal.
async fn an_input_the_worker_took_first_is_the_submitters_answer(b: Backend) {
    let r = race(b).await;
    let sub = r.submitter.clone();
    let (t, s) = (r.tenant, r.session);
    let (answer, listed, taken, events) =
        run_race(&r, true, async move { sub.submit(t, s, "hello").await }).await;
    let p: InputIntent = serde_json::from_value(listed[0].payload.clone()).unwrap();
    assert_eq!(taken, 1);
    assert_eq!(answer.unwrap(), p.turn_id);
    assert_eq!(count(&events, "turn.queued", p.turn_id), 1);
}

/// As for input, for a cancellation: withdrawn after the worker's list, it is never journaled
/// (`turn.cancel_requested`) and the turn is not stopped; the canceller's "busy" is the truth.
async fn a_cancel_withdrawn_after_the_workers_list_is_never_journaled(b: Backend) {
    let r = race(b).await;
    let (t, s) = (r.tenant, r.session);
    let turn = r.worker.submit(t, s, "first").await.unwrap();
    let sub = r.submitter.clone();
    let (answer, _, taken, events) =
        run_race(&r, false, async move { sub.cancel_turn(t, s).await }).await;
    assert!(
        matches!(answer, Err(RuntimeError::SessionBusy { .. })),
        "{answer:?}"
    );
    assert_eq!(taken, 0);
    assert_eq!(count(&events, "turn.cancel_requested", turn), 0);
    let state = r.worker.fold(t, s).await.unwrap();
    assert!(state.turns[&turn].cancel_requested.is_none());
}

macro_rules! on_both {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(super::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name(super::Backend::Postgres).await
                }
            }
        )+
    };
}

on_both!(
    an_input_withdrawn_after_the_workers_list_is_never_queued,
    an_input_the_worker_took_first_is_the_submitters_answer,
    a_cancel_withdrawn_after_the_workers_list_is_never_journaled,
);
