//! [`LeaseKeeper`]: one heartbeat for every lease a runtime holds — one renewal statement per
//! tenant per round ([`Store::renew_leases`]), not one per running session — and the fence
//! that stops a run before a lease it could not renew expires.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

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
/// its run's `lost` token is cancelled and it is kept no more. A round started by a lease being
/// kept waits a sixtieth of the TTL (at most 50 ms) first, so the runs of one claim round
/// starting at once are renewed together. A round that fails (the store is slow or
/// unreachable) is retried after a twelfth of the TTL, while the leases may still be live.
///
/// **The fence.** The epoch fences the journal, not what a tool does outside it: a run still
/// running a command when another worker takes its session over could finish the effect after
/// the new owner found it `outcome_unknown` and a human (or a reconcile) saw it had not
/// happened — and the effect would happen twice (the chaos trials caught it, 2026-12-07: a
/// PostgreSQL outage longer than the TTL, the run's dispatch committed as the server came
/// back, the command started, and another worker took the expired lease over). So the keeper
/// also knows, on this process's monotonic clock, until when each lease is surely still its
/// own: from when the request that granted or renewed it was *sent*, plus the TTL (the store
/// reckons the expiry from when it ran the statement, which is later). A tenth of the TTL
/// before that moment (at least 1 ms: room for the run's tools to be killed, and for a small
/// skew between hosts' clocks), a lease not renewed since is *lapsed*: its `lost` token is
/// cancelled — the run stops at once and its tools are killed, no grace — and it is kept no
/// more, whether or not another worker takes it over later. A lease already that close to its
/// expiry when it is kept lapses at once. The fence has its own task, so a renewal stuck on an
/// unreachable store never holds it up.
///
/// Its tasks start with the first lease kept and end when the keeper is dropped.
pub struct LeaseKeeper {
    store: Arc<dyn Store>,
    ttl: Duration,
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    /// A lease was kept: the renewal task looks again at when the next one is due.
    wake: Arc<Notify>,
    /// A lease was kept: the fence task looks again at when the next one lapses.
    fence_wake: Arc<Notify>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

struct Held {
    tenant: TenantId,
    lease: Lease,
    lost: CancellationToken,
    /// Until when (this process's monotonic clock) the lease is surely this process's: the
    /// moment the request that granted or last renewed it was sent, plus the TTL.
    valid_until: Instant,
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

impl Kept {
    /// The lease as the keeper has it now: its `expires_at` moved by every renewal. `None`
    /// once it is kept no more (lost, lapsed, or the keeper is gone).
    pub fn lease(&self) -> Option<Lease> {
        let k = self.keeper.upgrade()?;
        lock(&k.held).get(&self.id).map(|h| h.lease.clone())
    }
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
        for t in lock(&self.tasks).drain(..) {
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
            fence_wake: Arc::new(Notify::new()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Renews `lease` (of `tenant`) from now until the returned [`Kept`] is dropped; cancels
    /// `lost` when the lease is found lost, or when it lapses unrenewed (see **The fence** on
    /// [`LeaseKeeper`]). Its validity is reckoned from its `expires_at` (in the lease clock, as
    /// the store set it). Must be called within a Tokio runtime (the first call starts the
    /// keeper's tasks).
    pub fn keep(self: &Arc<Self>, tenant: TenantId, lease: Lease, lost: CancellationToken) -> Kept {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let left = (lease.expires_at - super::lease_clock())
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(self.ttl);
        lock(&self.held).insert(
            id,
            Held {
                tenant,
                lease,
                lost,
                valid_until: Instant::now() + left,
            },
        );
        {
            let mut tasks = lock(&self.tasks);
            if tasks.is_empty() {
                tasks.push(tokio::spawn(run(Arc::downgrade(self), self.wake.clone())));
                tasks.push(tokio::spawn(fence(
                    Arc::downgrade(self),
                    self.fence_wake.clone(),
                )));
            }
        }
        self.wake.notify_one();
        self.fence_wake.notify_one();
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

    /// How long before the end of its validity a lease not renewed lapses: a tenth of the TTL,
    /// at least 1 ms.
    fn fence_margin(&self) -> Duration {
        (self.ttl / 10).max(Duration::from_millis(1))
    }

    /// When the first kept lease lapses (`None`: none kept).
    fn next_lapse(&self) -> Option<Instant> {
        let margin = self.fence_margin();
        lock(&self.held)
            .values()
            .map(|h| h.valid_until.checked_sub(margin).unwrap_or(h.valid_until))
            .min()
    }

    /// Fences every lease lapsed by now: cancels its run's `lost` token and keeps it no more.
    fn fence_lapsed(&self) {
        let margin = self.fence_margin();
        let now = Instant::now();
        lock(&self.held).retain(|_, h| {
            if now + margin < h.valid_until {
                return true;
            }
            tracing::warn!(
                session = %h.lease.session_id,
                "lease lapsed: not renewed within its TTL (the store did not answer in time): stopping the \
                 session here, and its tools, before another worker can take it over"
            );
            h.lost.cancel();
            false
        });
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
            let sent = Instant::now();
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
                            Some(at) => {
                                h.lease.expires_at = *at;
                                h.valid_until = sent + self.ttl;
                            }
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

/// The fence's task: sleeps until the first kept lease lapses (or a lease is kept), fences
/// what lapsed, and ends when the keeper is gone. Apart from the renewals, so one waiting on
/// an unreachable store does not hold it up.
async fn fence(keeper: Weak<LeaseKeeper>, wake: Arc<Notify>) {
    loop {
        let Some(k) = keeper.upgrade() else { return };
        let notified = wake.notified();
        let until = k.next_lapse();
        drop(k);
        match until {
            Some(at) => {
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => notified.await,
        }
        let Some(k) = keeper.upgrade() else { return };
        k.fence_lapsed();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
