//! [`LeaseKeeper`]: one heartbeat for every lease a runtime holds — one renewal statement per
//! tenant per round ([`Store::renew_leases`]), not one per running session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use keel_core::TenantId;
use keel_store::{Lease, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::renewal_due_in;

/// Renews the leases of the runs registered with it ([`LeaseKeeper::keep`]), all of them in
/// one [`Store::renew_leases`] call per tenant whenever one of them is due: a lease is due a
/// third of the TTL after it was granted or last renewed (reckoned from its `expires_at`, so a
/// run whose setup took most of the TTL is renewed at once); every lease due within the
/// next sixth of the TTL is renewed with it, so leases taken at different moments fall into
/// one round. A lease the store no longer has at its epoch (taken over, released) is lost:
/// its run's `lost` token is cancelled and it is kept no more. An expired lease nobody took
/// over is renewed (its epoch is still current). A round started by a lease being kept waits
/// a sixtieth of the TTL (at most 50 ms) first, so the runs of one claim round starting at once
/// are renewed together. A round that fails (the store is slow or
/// unreachable) is retried after a twelfth of the TTL, while the leases may still be live.
///
/// Its task starts with the first lease kept and ends when the keeper is dropped.
pub struct LeaseKeeper {
    store: Arc<dyn Store>,
    ttl: Duration,
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    /// A lease was kept: the task looks again at when the next one is due.
    wake: Arc<Notify>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Held {
    tenant: TenantId,
    lease: Lease,
    lost: CancellationToken,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("ttl", &self.ttl)
            .field("held", &lock(&self.held).len())
            .finish_non_exhaustive()
    }
}

/// A lease kept by a [`LeaseKeeper`]; dropping it stops renewing the lease (the run ended).
#[derive(Debug)]
pub struct Kept {
    keeper: Weak<LeaseKeeper>,
    id: u64,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.upgrade() {
            lock(&k.held).remove(&self.id);
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

impl LeaseKeeper {
    /// A keeper renewing leases of `ttl` on `store` (the TTL the leases were taken for).
    pub fn new(store: Arc<dyn Store>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            store,
            ttl,
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            wake: Arc::new(Notify::new()),
            task: Mutex::new(None),
        })
    }

    /// Renews `lease` (of `tenant`) from now until the returned [`Kept`] is dropped; cancels
    /// `lost` when the lease is found lost. Must be called within a Tokio runtime (the first
    /// call starts the keeper's task).
    pub fn keep(self: &Arc<Self>, tenant: TenantId, lease: Lease, lost: CancellationToken) -> Kept {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.held).insert(
            id,
            Held {
                tenant,
                lease,
                lost,
            },
        );
        {
            let mut task = lock(&self.task);
            if task.is_none() {
                *task = Some(tokio::spawn(run(Arc::downgrade(self), self.wake.clone())));
            }
        }
        self.wake.notify_one();
        Kept {
            keeper: Arc::downgrade(self),
            id,
        }
    }

    /// How many leases it keeps now.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    /// Whether it keeps no lease now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn period(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(10))
    }

    /// Until the first kept lease is due (`None`: none kept).
    fn next_due(&self) -> Option<Duration> {
        let period = self.period();
        lock(&self.held)
            .values()
            .map(|h| renewal_due_in(&h.lease, self.ttl, period))
            .min()
    }

    /// One round: renews every lease due within `slack`, one store call per tenant. `Err`
    /// when a call failed (those leases are retried next round).
    async fn renew_due(&self, slack: Duration) -> Result<(), keel_store::StoreError> {
        let period = self.period();
        let mut by_tenant: HashMap<TenantId, Vec<(u64, Lease)>> = HashMap::new();
        for (id, h) in lock(&self.held).iter() {
            if renewal_due_in(&h.lease, self.ttl, period) <= slack {
                by_tenant
                    .entry(h.tenant)
                    .or_default()
                    .push((*id, h.lease.clone()));
            }
        }
        let mut failed = None;
        for (tenant, due) in by_tenant {
            let leases: Vec<Lease> = due.iter().map(|(_, l)| l.clone()).collect();
            match self.store.renew_leases(tenant, &leases, self.ttl).await {
                Ok(renewed) => {
                    let fresh: HashMap<_, _> = renewed
                        .into_iter()
                        .map(|l| ((l.session_id, l.epoch), l.expires_at))
                        .collect();
                    let mut held = lock(&self.held);
                    for (id, lease) in due {
                        let Some(h) = held.get_mut(&id) else { continue };
                        match fresh.get(&(lease.session_id, lease.epoch)) {
                            Some(at) => h.lease.expires_at = *at,
                            None => {
                                tracing::warn!(session = %lease.session_id, "lease lost; stopping the session here");
                                h.lost.cancel();
                                held.remove(&id);
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%tenant, leases = leases.len(), "lease renewal failed: {e}");
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// The keeper's task: sleeps until the first lease is due (or a lease is kept), renews, and
/// ends when the keeper is gone.
async fn run(keeper: Weak<LeaseKeeper>, wake: Arc<Notify>) {
    let mut backoff = Duration::ZERO;
    loop {
        let Some(k) = keeper.upgrade() else { return };
        let notified = wake.notified();
        let wait = k
            .next_due()
            .unwrap_or(Duration::from_secs(3600))
            .max(backoff);
        let (retry, slack) = ((k.ttl / 12).max(Duration::from_millis(10)), k.ttl / 6);
        let coalesce = (k.ttl / 60).clamp(Duration::from_millis(1), Duration::from_millis(50));
        // Not holding the keeper while asleep: dropping it ends this task.
        drop(k);
        let woken = tokio::select! {
            () = notified => true,
            () = tokio::time::sleep(wait) => false,
        };
        if woken || wait.is_zero() {
            // Leases kept at once (a claim round's runs starting) are renewed in one round —
            // also when the first of them is already due: the task started by its `keep` found
            // it due at once and renewed it alone, before the others were kept (the renewal
            // test failed so under load, 2026-12-06).
            tokio::time::sleep(coalesce).await;
        }
        let Some(k) = keeper.upgrade() else { return };
        backoff = match k.renew_due(slack).await {
            Ok(()) => Duration::ZERO,
            Err(_) => retry,
        };
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
