//! Tenant budget reservations (`Store::reserve_usage`): grants capped at what the limit leaves,
//! refusals naming the limit, settlement with the step's usage in one append, concurrent
//! reservers that never hold more than the limit, and reservations that lapse with their lease.

use std::sync::Arc;
use std::time::Duration;

use keel_core::*;
use keel_store::*;

use super::harness::{Fixture, Harness, events, session};

const DAY: &str = "2026-04-01";

fn ask(f: &Fixture, tokens: u64, max_tokens: Option<u64>) -> UsageReservation {
    UsageReservation {
        session_id: f.session,
        lease_epoch: f.lease.epoch,
        day: DAY.into(),
        tokens,
        cost_usd: 0.0,
        max_tokens,
        max_cost_usd: None,
    }
}

fn granted(r: Reservation) -> (u64, f64) {
    match r {
        Reservation::Granted {
            tokens, cost_usd, ..
        } => (tokens, cost_usd),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Appends one event at `version` carrying `tokens` of usage (input only) and `cost_usd`, and
/// releasing the session's reservation; returns the new version.
async fn settle(
    store: &Arc<dyn Store>,
    t: TenantId,
    f: &Fixture,
    version: u64,
    tokens: u64,
    cost_usd: f64,
) -> u64 {
    store
        .append_with(
            t,
            f.session,
            version,
            f.lease.epoch,
            &events(f.session, version, 1),
            &AppendExtras {
                usage: vec![UsageDelta {
                    day: DAY.into(),
                    model: "m".into(),
                    usage: Usage {
                        input_tokens: tokens,
                        ..Usage::default()
                    },
                    cost_usd,
                    steps: 1,
                }],
                release_reservation: true,
                ..AppendExtras::default()
            },
        )
        .await
        .unwrap()
}

async fn live(store: &Arc<dyn Store>, t: TenantId) -> Vec<(SessionId, u64)> {
    store
        .usage_reservations(t, DAY)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.session_id, r.amount.tokens))
        .collect()
}

pub async fn usage_reservations_are_capped_refused_and_settled_with_the_usage(h: &Harness) {
    let (t, other) = (TenantId::new(), TenantId::new());
    let s = &h.store;
    let (a, b, c) = (
        session(s, t).await,
        session(s, t).await,
        session(s, t).await,
    );
    let limit = Some(1000);
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&a, 600, limit)).await.unwrap()).0,
        600
    );
    // Capped at what the limit leaves.
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&b, 600, limit)).await.unwrap()).0,
        400
    );
    // Nothing left but usage is under the limit: busy, not exhausted.
    match s.reserve_usage(t, &ask(&c, 600, limit)).await.unwrap() {
        Reservation::Busy {
            limit: BudgetLimit::Tokens,
            used,
            reserved,
        } => assert_eq!((used.tokens, reserved.tokens), (0, 1000)),
        other => panic!("{other:?}"),
    }
    // Another tenant's budget is its own.
    let o = session(s, other).await;
    assert_eq!(
        granted(s.reserve_usage(other, &ask(&o, 600, limit)).await.unwrap()).0,
        600
    );
    // A session's new reservation replaces its own (not counted as another's).
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&a, 600, limit)).await.unwrap()).0,
        600
    );
    let mut want = vec![(a.session, 600), (b.session, 400)];
    want.sort();
    assert_eq!(live(s, t).await, want);
    // a's step used 500: its usage and the end of its reservation commit together.
    settle(s, t, &a, 1, 500, 0.0).await;
    assert_eq!(live(s, t).await, [(b.session, 400)]);
    match s.reserve_usage(t, &ask(&c, 600, limit)).await.unwrap() {
        Reservation::Granted {
            tokens,
            used,
            reserved,
            ..
        } => assert_eq!((tokens, used.tokens, reserved.tokens), (100, 500, 400)),
        other => panic!("{other:?}"),
    }
    settle(s, t, &b, 1, 500, 0.0).await;
    // Usage reached the limit: exhausted, whatever is reserved; a refusal drops the asker's own.
    match s.reserve_usage(t, &ask(&c, 10, limit)).await.unwrap() {
        Reservation::Exhausted {
            limit: BudgetLimit::Tokens,
            used,
        } => assert_eq!(used.tokens, 1000),
        other => panic!("{other:?}"),
    }
    assert!(live(s, t).await.is_empty());
    // No limit: granted as asked.
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&c, 10, None)).await.unwrap()).0,
        10
    );

    // Cost (USD) works the same, checked after tokens.
    let u = TenantId::new();
    let d = session(s, TenantId::new()).await;
    let x = session(s, u).await;
    let y = session(s, u).await;
    let cost = |f: &Fixture, usd: f64| UsageReservation {
        cost_usd: usd,
        max_cost_usd: Some(1.0),
        ..ask(f, 5, Some(1_000_000))
    };
    assert!((granted(s.reserve_usage(u, &cost(&x, 0.75)).await.unwrap()).1 - 0.75).abs() < 1e-12);
    assert!((granted(s.reserve_usage(u, &cost(&y, 0.75)).await.unwrap()).1 - 0.25).abs() < 1e-12);
    settle(s, u, &x, 1, 5, 1.0).await;
    assert!(matches!(
        s.reserve_usage(u, &cost(&y, 0.1)).await.unwrap(),
        Reservation::Exhausted {
            limit: BudgetLimit::Cost,
            ..
        }
    ));
    // Bad input is refused before anything is written; a session of another tenant is unknown.
    for bad in [
        UsageReservation {
            day: "2026-4-1".into(),
            ..ask(&x, 1, None)
        },
        UsageReservation {
            cost_usd: f64::NAN,
            ..ask(&x, 1, None)
        },
        UsageReservation {
            max_cost_usd: Some(-1.0),
            ..ask(&x, 1, None)
        },
    ] {
        assert!(
            matches!(
                s.reserve_usage(u, &bad).await,
                Err(StoreError::InvalidInput(_))
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        s.reserve_usage(u, &ask(&d, 1, None)).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// Many sessions reserving at once (each from its own task; on PostgreSQL over separate pool
/// connections): the grants never add up to more than the limit, and they use all of it.
pub async fn concurrent_reservers_never_hold_more_than_the_limit(h: &Harness) {
    for round in 0..3 {
        let t = TenantId::new();
        let mut fixtures = Vec::new();
        for _ in 0..8 {
            fixtures.push(session(&h.store, t).await);
        }
        let mut tasks = Vec::new();
        for f in fixtures {
            let store = h.store.clone();
            tasks.push(tokio::spawn(async move {
                store.reserve_usage(t, &ask(&f, 300, Some(1000))).await
            }));
        }
        let mut total = 0;
        let mut grants = 0;
        for task in tasks {
            match task.await.unwrap().unwrap() {
                Reservation::Granted { tokens, .. } => {
                    total += tokens;
                    grants += 1;
                }
                Reservation::Busy { .. } => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!((total, grants), (1000, 4), "round {round}");
        let held: u64 = live(&h.store, t).await.iter().map(|(_, n)| n).sum();
        assert_eq!(held, 1000, "round {round}");
    }
}

/// A reservation counts only while its session's lease is held at its epoch: it lapses when the
/// lease expires (a crashed worker), is released, or is taken over; a stale epoch cannot reserve.
pub async fn a_reservation_lapses_with_its_lease(h: &Harness) {
    let t = TenantId::new();
    let s = &h.store;
    let limit = Some(100);
    let (a, b) = (session(s, t).await, session(s, t).await);
    // A short lease, as a worker that then dies holds it.
    let short = s
        .renew_lease(t, &a.lease, Duration::from_millis(300))
        .await
        .unwrap();
    let a = Fixture {
        session: a.session,
        lease: short,
    };
    granted(s.reserve_usage(t, &ask(&a, 100, limit)).await.unwrap());
    assert!(matches!(
        s.reserve_usage(t, &ask(&b, 100, limit)).await.unwrap(),
        Reservation::Busy { .. }
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(live(s, t).await, [], "expired with the lease");
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&b, 100, limit)).await.unwrap()).0,
        100
    );
    // Released: the holder has no step in flight.
    s.release_lease(t, &b.lease).await.unwrap();
    assert!(live(s, t).await.is_empty());
    assert!(matches!(
        s.reserve_usage(t, &ask(&b, 1, limit)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    // Taken over: the dead owner's reservation is gone at once; its epoch cannot reserve again.
    let c = session(s, t).await;
    granted(s.reserve_usage(t, &ask(&c, 100, limit)).await.unwrap());
    let taken = s
        .take_over_lease(
            t,
            c.session,
            &c.lease.owner,
            c.lease.epoch,
            "worker-b",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(live(s, t).await.is_empty());
    assert!(matches!(
        s.reserve_usage(t, &ask(&c, 1, limit)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    let c2 = Fixture {
        session: c.session,
        lease: taken,
    };
    assert_eq!(
        granted(s.reserve_usage(t, &ask(&c2, 100, limit)).await.unwrap()).0,
        100
    );
    // Deleting a session deletes its reservation.
    s.delete_session(t, c2.session).await.unwrap();
    assert!(live(s, t).await.is_empty());
}
