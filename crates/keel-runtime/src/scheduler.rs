//! The scheduler: a worker loop that claims runnable sessions from the shared store, runs each
//! under its lease, and gives it back — stateless, so any worker can run any session.
//!
//! **What it claims.** Sessions with work ([`keel_store::scheduling`]): a queued turn, an
//! active turn a dead or drained worker left, a due timer (an approval's expiry, a decision to
//! act on), a posted intent (input, a cancellation). The store hands one out per claim with its
//! lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL), only if its journal was written by an event
//! schema this build reads ([`keel_core::event::SCHEMA_VERSION`]): a session a newer build wrote
//! is left for newer workers, counted and logged, never misread.
//!
//! **Whom it serves next: deficit round robin between tenants.** Tenants with claimable
//! sessions form a ring; each visit adds the tenant's weight (its quantum, default 1) to its
//! deficit, and each claim costs one. A tenant with 1,000 queued turns therefore gets one claim
//! per round like a tenant with one: the light tenant waits at most one round, not behind the
//! heavy tenant's backlog. Within a tenant the store orders by turn priority, then age. A tenant
//! at its concurrency limit (sessions under a live lease on any worker, default 50) is skipped
//! that round. This follows the structure of Restate's virtual queues (DRR over per-tenant
//! queues, a per-worker concurrency budget) with the queues kept in the store, since workers
//! are stateless.
//!
//! **Yielding slots.** A run lasts until its session is idle — a long turn, or a session fed
//! new turns, keeps its slot — so with every slot taken round robin would never get to choose.
//! Each poll interval while the worker is full, a tenant with claimable work that holds a
//! smaller share of the worker's slots (runs per unit of weight) than the largest holder gets
//! one of that holder's runs (its oldest, claimed at least a poll interval ago) stopped at its
//! next durable boundary, like a drain, and given back; the freed slot goes by round robin. A
//! tool call is not interrupted: a run yields once its running step or tool calls finish.
//!
//! **Wake-ups.** [`keel_store::Store::wait_for_work`] returns when a session may have become
//! claimable (LISTEN/NOTIFY on PostgreSQL, in-process on SQLite), or after the poll interval
//! (the fallback, and the bound for due timers and expired leases nobody announced).
//!
//! **Drain.** [`WorkerHandle::drain`]: stop claiming, ask every run to stop at its next durable
//! boundary ([`crate::Runtime::run_claimed`]'s drain token: the running step finishes and
//! commits, the turn stays active for another worker), give each session back, then return.
//! After the drain deadline, or on [`WorkerHandle::stop_now`], the remaining runs are dropped
//! (like a crash, but their leases are released so another worker need not wait out the TTL).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use keel_core::TenantId;
use keel_store::{Claim, Store, StoreError, TenantBacklog};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How a claimed session's run ended, as the host's [`ClaimRunner`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunReport {
    /// It ran until idle, `requires_action` or closed (or ended its turns with their terminal
    /// reasons): give it back.
    Done,
    /// It stopped at a durable boundary because the worker drains or yields its slot to a
    /// starved tenant; a worker continues it.
    Drained,
    /// This worker cannot run it (its release names a model or tool this build does not
    /// have, say): give it back and do not offer it again before `retry_after` (so workers that
    /// can run it get it).
    Deferred {
        /// Why, for the log.
        reason: String,
        /// Backoff before it is claimable again.
        retry_after: Duration,
    },
    /// The run failed (a store error, an unreadable journal, a panic in the run — the scheduler
    /// reports a panic as this itself): give it back after the worker's error backoff.
    Failed(String),
    /// Another worker holds the session now (the lease was lost): nothing to give back.
    LeaseLost,
}

/// Boxed future of a run.
pub type RunFuture = Pin<Box<dyn Future<Output = RunReport> + Send>>;

/// Runs a claimed session: the host's part (the server picks the runtime of the session's
/// release and calls [`crate::Runtime::run_claimed`]). Must not release the lease: the
/// scheduler gives the session back with [`Store::release_claim`].
pub trait ClaimRunner: Send + Sync + 'static {
    /// Runs `claim`'s session until it is done or `drain` is cancelled (the worker drains, or
    /// the run yields its slot): then it stops at its next durable boundary.
    fn run(&self, claim: Claim, drain: CancellationToken) -> RunFuture;
}

/// What the scheduler tells the host's metrics (all optional to record).
pub trait SchedulerObserver: Send + Sync + 'static {
    /// A session was claimed, `latency` after it became runnable (`None` for a timer or an
    /// intent), taking over `took_over`'s expired lease if any.
    fn claimed(&self, claim: &Claim, latency: Option<Duration>);
    /// A claimed session's run ended.
    fn ran(&self, claim: &Claim, report: &RunReport);
    /// Sessions with work written by a newer event schema, left alone (sampled periodically).
    fn left_for_newer(&self, sessions: u64);
}

/// An observer that records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl SchedulerObserver for NoObserver {
    fn claimed(&self, _: &Claim, _: Option<Duration>) {}
    fn ran(&self, _: &Claim, _: &RunReport) {}
    fn left_for_newer(&self, _: u64) {}
}

/// One tenant's scheduling limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLimits {
    /// Sessions of the tenant running at once, over all workers (default 50).
    pub max_sessions: u64,
    /// Its share in deficit round robin: claims per round (default 1).
    pub weight: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            max_sessions: 50,
            weight: 1,
        }
    }
}

/// A worker's settings.
#[derive(Clone)]
pub struct SchedulerConfig {
    /// Lease owner string (`<name>@<host>:<pid>/pidns:<inode>`, see [`crate::lease::LeaseOwner`]).
    pub owner: String,
    /// Sessions this worker runs at once (default 16; 0 counts as 1, more than
    /// [`Semaphore::MAX_PERMITS`] as that).
    pub concurrency: usize,
    /// Lease time-to-live (default 10 s): a dead worker's sessions are claimable this long
    /// after its last heartbeat. Must match the runtimes' `lease_ttl` (they renew it).
    pub lease_ttl: Duration,
    /// Longest wait between looks at the store without a wake-up (default 1 s): bounds how late
    /// a due timer or an expired lease is noticed.
    pub poll: Duration,
    /// How long a draining worker lets running steps finish (default 30 s).
    pub drain_timeout: Duration,
    /// Backoff after a failed run before the session is claimable again (default 5 s).
    pub error_backoff: Duration,
    /// Limits for tenants without an entry in `tenants`.
    pub default_limits: TenantLimits,
    /// Per-tenant limits.
    pub tenants: HashMap<TenantId, TenantLimits>,
    /// Newest event schema this build reads (default [`keel_core::event::SCHEMA_VERSION`]).
    pub max_schema_version: u32,
    /// Tenants whose sessions this worker never claims (default none). Server nodes list
    /// [`TenantId::local`]: the local CLI's sessions run in the CLI that owns them, under its
    /// permission mode and workspace, never under a server's ceilings and roots.
    pub skip_tenants: Vec<TenantId>,
}

impl std::fmt::Debug for SchedulerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerConfig")
            .field("owner", &self.owner)
            .field("concurrency", &self.concurrency)
            .field("lease_ttl", &self.lease_ttl)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            owner: crate::lease::owner_string("worker"),
            concurrency: 16,
            lease_ttl: Duration::from_secs(10),
            poll: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(30),
            error_backoff: Duration::from_secs(5),
            default_limits: TenantLimits::default(),
            tenants: HashMap::new(),
            max_schema_version: keel_core::event::SCHEMA_VERSION,
            skip_tenants: Vec::new(),
        }
    }
}

impl SchedulerConfig {
    fn limits(&self, tenant: TenantId) -> TenantLimits {
        self.tenants
            .get(&tenant)
            .copied()
            .unwrap_or(self.default_limits)
    }
}

/// Deficit round robin over tenants (unit cost per claim, quantum = the tenant's weight).
#[derive(Debug, Default)]
struct Ring {
    order: VecDeque<TenantId>,
    deficit: HashMap<TenantId, u64>,
}

impl Ring {
    /// Brings the ring in line with the tenants that have work now: new ones join at the back,
    /// gone ones leave (and lose their deficit, as DRR drops an emptied queue's).
    fn refresh(&mut self, present: &[TenantId]) {
        let now: HashSet<TenantId> = present.iter().copied().collect();
        self.order.retain(|t| now.contains(t));
        self.deficit.retain(|t, _| now.contains(t));
        for t in present {
            if !self.deficit.contains_key(t) {
                self.deficit.insert(*t, 0);
                self.order.push_back(*t);
            }
        }
    }

    /// The tenants in serving order for this pick: the head first (topping its deficit up by
    /// its quantum when it has none left), then the rest.
    fn candidates(&mut self, quantum: impl Fn(TenantId) -> u64) -> Vec<TenantId> {
        if let Some(head) = self.order.front().copied() {
            let d = self.deficit.entry(head).or_insert(0);
            if *d == 0 {
                *d = quantum(head).max(1);
            }
        }
        self.order.iter().copied().collect()
    }

    /// `tenant` got a claim: charge it; when its deficit is spent it goes to the back.
    fn charge(&mut self, tenant: TenantId, quantum: impl Fn(TenantId) -> u64) {
        let d = self.deficit.entry(tenant).or_insert(0);
        if *d == 0 {
            // Served out of turn (the head had nothing claimable): a fresh quantum, spent.
            *d = quantum(tenant).max(1);
        }
        *d -= 1;
        if *d == 0
            && let Some(pos) = self.order.iter().position(|t| *t == tenant)
            && let Some(t) = self.order.remove(pos)
        {
            self.order.push_back(t);
        }
    }

    /// `tenant` had nothing claimable when asked: its turn is over for this round.
    fn pass(&mut self, tenant: TenantId) {
        self.deficit.insert(tenant, 0);
        if let Some(pos) = self.order.iter().position(|t| *t == tenant)
            && let Some(t) = self.order.remove(pos)
        {
            self.order.push_back(t);
        }
    }
}

/// Drains or stops a worker from anywhere (cloneable; see [`WorkerHandle::control`]).
#[derive(Debug, Clone)]
pub struct WorkerControl {
    drain: CancellationToken,
    stop: CancellationToken,
}

impl WorkerControl {
    /// As [`WorkerHandle::drain`].
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// As [`WorkerHandle::stop_now`].
    pub fn stop_now(&self) {
        self.drain.cancel();
        self.stop.cancel();
    }
}

/// Controls a running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    drain: CancellationToken,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerHandle {
    /// Starts a graceful drain: no new claims; runs stop at their next durable boundary (up to
    /// the drain timeout) and are given back. Idempotent.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Stops at once: drops the remaining runs and gives their sessions back.
    pub fn stop_now(&self) {
        self.drain.cancel();
        self.stop.cancel();
    }

    /// A cloneable control of this worker (drain, stop) for use while [`WorkerHandle::join`]
    /// is awaited.
    pub fn control(&self) -> WorkerControl {
        WorkerControl {
            drain: self.drain.clone(),
            stop: self.stop.clone(),
        }
    }

    /// Whether a drain (or stop) was asked for.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Waits until the worker has given every session back.
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

/// A run in flight: its claim (to give back when the run is dropped), when it was claimed, and
/// the token that asks it to stop at its next durable boundary (the worker's drain, or a yield
/// of its slot to a starved tenant).
#[derive(Debug, Clone)]
struct Running {
    claim: Claim,
    since: tokio::time::Instant,
    stop_at_boundary: CancellationToken,
}

/// The runs in flight by session.
type InFlight = Arc<Mutex<HashMap<keel_core::SessionId, Running>>>;

/// Starts a worker on `store`: claims and runs sessions with `runner` until drained.
pub fn spawn_worker(
    store: Arc<dyn Store>,
    config: SchedulerConfig,
    runner: Arc<dyn ClaimRunner>,
    observer: Arc<dyn SchedulerObserver>,
) -> WorkerHandle {
    let drain = CancellationToken::new();
    let stop = CancellationToken::new();
    let task = tokio::spawn(worker_loop(
        store,
        Arc::new(config),
        runner,
        observer,
        drain.clone(),
        stop.clone(),
    ));
    WorkerHandle { drain, stop, task }
}

async fn worker_loop(
    store: Arc<dyn Store>,
    config: Arc<SchedulerConfig>,
    runner: Arc<dyn ClaimRunner>,
    observer: Arc<dyn SchedulerObserver>,
    drain: CancellationToken,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(
        config.concurrency.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut runs: JoinSet<()> = JoinSet::new();
    let in_flight: InFlight = Arc::default();
    let mut ring = Ring::default();
    let mut last_newer_check: Option<tokio::time::Instant> = None;
    tracing::info!(owner = %config.owner, concurrency = config.concurrency, "worker started");
    loop {
        while runs.try_join_next().is_some() {}
        if drain.is_cancelled() {
            break;
        }
        if last_newer_check.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
            last_newer_check = Some(tokio::time::Instant::now());
            match store.newer_schema_sessions(config.max_schema_version).await {
                Ok(n) => {
                    observer.left_for_newer(n);
                    if n > 0 {
                        tracing::warn!(
                            sessions = n,
                            max_schema_version = config.max_schema_version,
                            "sessions written by a newer event schema are left for newer workers"
                        );
                    }
                }
                Err(e) => tracing::warn!("counting sessions of newer schemas: {e}"),
            }
        }
        let permit = loop {
            tokio::select! {
                () = drain.cancelled() => break None,
                p = slots.clone().acquire_owned() => break p.ok(),
                // Every slot is taken: each poll, a starved tenant may have a slot yielded.
                () = tokio::time::sleep(config.poll) => {
                    if let Err(e) = yield_to_starved(store.as_ref(), &config, &in_flight).await {
                        tracing::warn!("looking for starved tenants: {e}");
                    }
                }
            }
        };
        let Some(permit) = permit else { break };
        let claim = match next_claim(store.as_ref(), &config, &mut ring).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                drop(permit);
                tokio::select! {
                    () = drain.cancelled() => break,
                    r = store.wait_for_work(config.poll) => {
                        if let Err(e) = r {
                            tracing::warn!("waiting for work: {e}");
                            tokio::time::sleep(config.poll).await;
                        }
                    }
                }
                continue;
            }
            Err(e) => {
                drop(permit);
                tracing::warn!("claiming: {e}");
                tokio::select! {
                    () = drain.cancelled() => break,
                    () = tokio::time::sleep(config.poll) => {}
                }
                continue;
            }
        };
        let now = Utc::now();
        let latency = claim
            .runnable_since
            .and_then(|since| (now - since).to_std().ok());
        observer.claimed(&claim, latency);
        if let Some(prev) = &claim.took_over {
            tracing::info!(session = %claim.lease.session_id, previous = %prev, "took over an expired lease");
        }
        let stop_at_boundary = drain.child_token();
        lock(&in_flight).insert(
            claim.lease.session_id,
            Running {
                claim: claim.clone(),
                since: tokio::time::Instant::now(),
                stop_at_boundary: stop_at_boundary.clone(),
            },
        );
        let (store, runner, observer, config, in_flight, drain) = (
            store.clone(),
            runner.clone(),
            observer.clone(),
            config.clone(),
            in_flight.clone(),
            stop_at_boundary,
        );
        runs.spawn(async move {
            let _permit = permit;
            let report = run_caught(runner, claim.clone(), drain).await;
            observer.ran(&claim, &report);
            lock(&in_flight).remove(&claim.lease.session_id);
            give_back(store.as_ref(), &config, &claim, &report, now).await;
        });
    }
    // Draining: runs stop at their boundaries; after the deadline (or a stop) they are dropped.
    tracing::info!(owner = %config.owner, running = runs.len(), "worker draining");
    let deadline = tokio::time::sleep(config.drain_timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            r = runs.join_next() => if r.is_none() { break },
            () = &mut deadline => break,
            () = stop.cancelled() => break,
        }
    }
    runs.abort_all();
    while runs.join_next().await.is_some() {}
    let left: Vec<Claim> = lock(&in_flight).drain().map(|(_, r)| r.claim).collect();
    for claim in left {
        tracing::warn!(session = %claim.lease.session_id, "run dropped (drain deadline or a second signal); giving the session back");
        if let Err(e) = store
            .release_claim(claim.tenant_id, &claim.lease, None, None)
            .await
        {
            tracing::debug!(session = %claim.lease.session_id, "release: {e}");
        }
    }
    tracing::info!(owner = %config.owner, "worker stopped");
}

/// Runs `claim` with `runner`; a panic in it (in [`ClaimRunner::run`] or in its future) is a
/// failed run, [`RunReport::Failed`] naming the panic, logged here: the session is then given
/// back at once (with the error backoff) and counted like any failed run, instead of holding
/// its lease until it expires or taking the worker loop down.
async fn run_caught(
    runner: Arc<dyn ClaimRunner>,
    claim: Claim,
    drain: CancellationToken,
) -> RunReport {
    use futures_util::FutureExt as _;
    let session = claim.lease.session_id;
    // Unwind safety: nothing the run touched is read after a panic but the run's own state,
    // which the panic discards; shared locks are taken poison-tolerantly.
    let run = std::panic::AssertUnwindSafe(async move { runner.run(claim, drain).await });
    match run.catch_unwind().await {
        Ok(report) => report,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text payload".to_owned());
            tracing::error!(%session, "the session's run panicked: {what}");
            RunReport::Failed(format!("the run panicked: {what}"))
        }
    }
}

/// Gives a claimed session back after its run, with the backoff its report asks for; a served
/// timer (due at or before the claim) is cleared.
async fn give_back(
    store: &dyn Store,
    config: &SchedulerConfig,
    claim: &Claim,
    report: &RunReport,
    claimed_at: chrono::DateTime<Utc>,
) {
    let backoff = match report {
        RunReport::LeaseLost => return,
        RunReport::Done | RunReport::Drained => None,
        RunReport::Deferred {
            reason,
            retry_after,
        } => {
            tracing::warn!(session = %claim.lease.session_id, "session deferred: {reason}");
            Some(*retry_after)
        }
        RunReport::Failed(e) => {
            tracing::warn!(session = %claim.lease.session_id, "session run failed: {e}");
            Some(config.error_backoff)
        }
    };
    let until = backoff.map(|d| Utc::now() + chrono::Duration::from_std(d).unwrap_or_default());
    let clear = match report {
        // A drained run may not have served its timer yet.
        RunReport::Drained => None,
        _ => Some(claimed_at),
    };
    match store
        .release_claim(claim.tenant_id, &claim.lease, until, clear)
        .await
    {
        Ok(()) | Err(StoreError::LeaseLost { .. }) => {}
        Err(e) => tracing::warn!(session = %claim.lease.session_id, "giving the session back: {e}"),
    }
}

/// Runs of each tenant on this worker, not counting those already asked to yield.
fn runs_by_tenant(in_flight: &InFlight) -> HashMap<TenantId, Vec<Running>> {
    let mut by: HashMap<TenantId, Vec<Running>> = HashMap::new();
    for r in lock(in_flight).values() {
        if !r.stop_at_boundary.is_cancelled() {
            by.entry(r.claim.tenant_id).or_default().push(r.clone());
        }
    }
    by
}

/// With every slot taken, frees one for a starved tenant: a tenant with claimable work within
/// its limits that holds a smaller share of this worker's slots (runs per unit of weight) than
/// the tenant holding the largest share. That tenant's oldest run, claimed at least one poll
/// interval ago, is asked to stop at its next durable boundary (as in a drain: its step or tool
/// calls finish and commit, the turn stays active and runnable) and is given back; deficit round
/// robin then decides who gets the slot. At most as many yields are pending as there are
/// starved tenants. Without this, runs that last (a long turn, a session fed turns) keep every
/// slot and round robin never gets to choose.
async fn yield_to_starved(
    store: &dyn Store,
    config: &SchedulerConfig,
    in_flight: &InFlight,
) -> Result<(), StoreError> {
    let backlog = store
        .runnable_tenants(
            crate::lease::lease_clock(),
            config.max_schema_version,
            10_000,
        )
        .await?;
    let by = runs_by_tenant(in_flight);
    let pending = lock(in_flight)
        .values()
        .filter(|r| r.stop_at_boundary.is_cancelled())
        .count();
    let weight = |t: TenantId| u64::from(config.limits(t).weight.max(1));
    let runs = |t: TenantId| by.get(&t).map_or(0, |v| v.len() as u64);
    // The largest share: runs(a) / weight(a) > runs(b) / weight(b).
    let Some(holder) = by
        .keys()
        .copied()
        .max_by(|a, b| (runs(*a) * weight(*b)).cmp(&(runs(*b) * weight(*a))))
    else {
        return Ok(());
    };
    let starved = backlog
        .iter()
        .filter(|b| {
            b.claimable > 0
                && b.leased < config.limits(b.tenant_id).max_sessions
                && !config.skip_tenants.contains(&b.tenant_id)
        })
        .filter(|b| runs(b.tenant_id) * weight(holder) < runs(holder) * weight(b.tenant_id))
        .count();
    if pending >= starved {
        return Ok(());
    }
    let oldest = by
        .get(&holder)
        .and_then(|v| v.iter().min_by_key(|r| r.since))
        .filter(|r| r.since.elapsed() >= config.poll);
    if let Some(r) = oldest {
        tracing::info!(
            session = %r.claim.lease.session_id,
            tenant = %holder,
            "yielding the slot to a starved tenant at the run's next boundary"
        );
        r.stop_at_boundary.cancel();
    }
    Ok(())
}

/// The next claim by deficit round robin, or `None` when no tenant has claimable work within
/// its limits.
async fn next_claim(
    store: &dyn Store,
    config: &SchedulerConfig,
    ring: &mut Ring,
) -> Result<Option<Claim>, StoreError> {
    let now = crate::lease::lease_clock();
    let backlog: Vec<TenantBacklog> = store
        .runnable_tenants(now, config.max_schema_version, 10_000)
        .await?;
    let eligible: Vec<TenantId> = backlog
        .iter()
        .filter(|b| {
            b.claimable > 0
                && b.leased < config.limits(b.tenant_id).max_sessions
                && !config.skip_tenants.contains(&b.tenant_id)
        })
        .map(|b| b.tenant_id)
        .collect();
    ring.refresh(&eligible);
    let quantum = |t: TenantId| u64::from(config.limits(t).weight);
    for tenant in ring.candidates(quantum) {
        match store
            .claim_session(
                tenant,
                &config.owner,
                config.lease_ttl,
                now,
                config.max_schema_version,
                config.limits(tenant).max_sessions,
            )
            .await?
        {
            Some(claim) => {
                ring.charge(tenant, quantum);
                return Ok(Some(claim));
            }
            None => ring.pass(tenant),
        }
    }
    Ok(None)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn t(n: u128) -> TenantId {
        TenantId::from(uuid::Uuid::from_u128(n))
    }

    /// Serves the ring as the worker does when every tenant always has work: returns the
    /// sequence of tenants served.
    fn serve(ring: &mut Ring, weights: &HashMap<TenantId, u64>, picks: usize) -> Vec<TenantId> {
        let q = |x: TenantId| weights.get(&x).copied().unwrap_or(1);
        (0..picks)
            .map(|_| {
                let first = ring.candidates(q)[0];
                ring.charge(first, q);
                first
            })
            .collect()
    }

    #[test]
    fn equal_weights_alternate_whatever_the_backlog() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let served = serve(&mut ring, &HashMap::new(), 6);
        assert_eq!(served, vec![t(1), t(2), t(1), t(2), t(1), t(2)]);
    }

    #[test]
    fn a_newcomer_is_served_within_one_round() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2), t(3)]);
        let _ = serve(&mut ring, &HashMap::new(), 2);
        ring.refresh(&[t(1), t(2), t(3), t(9)]);
        let served = serve(&mut ring, &HashMap::new(), 4);
        assert!(served.contains(&t(9)), "{served:?}");
    }

    #[test]
    fn weights_are_claims_per_round() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let weights = HashMap::from([(t(1), 3)]);
        let served = serve(&mut ring, &weights, 8);
        assert_eq!(served, vec![t(1), t(1), t(1), t(2), t(1), t(1), t(1), t(2)]);
    }

    #[test]
    fn a_tenant_with_nothing_claimable_loses_its_turn_not_its_place() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let q = |_: TenantId| 1;
        assert_eq!(ring.candidates(q), vec![t(1), t(2)]);
        ring.pass(t(1));
        ring.charge(t(2), q);
        // t(2) was served out of turn; t(1) is next again.
        assert_eq!(ring.candidates(q)[0], t(1));
        // A tenant without work leaves the ring.
        ring.refresh(&[t(2)]);
        assert_eq!(ring.candidates(q), vec![t(2)]);
    }
}
