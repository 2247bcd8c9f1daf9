//! The scheduler: a worker loop that claims runnable sessions from the shared store, runs each
//! under its lease, and gives it back — stateless, so any worker can run any session.
//!
//! **What it claims.** Sessions with work ([`keel_store::scheduling`]): a queued turn, an
//! active turn a dead or drained worker left, a due timer (an approval's expiry, a decision to
//! act on), a posted intent (input, a cancellation). Each round claims for every free slot
//! (up to [`MAX_CLAIM_BATCH`]): the slots are shared out between tenants as claims one at a time
//! would share them (below), and each tenant's share is claimed in one store transaction
//! ([`Store::claim_sessions`], `FOR UPDATE SKIP LOCKED … LIMIT k` on PostgreSQL), each session
//! with its lease, only if its journal was written by an event schema this build reads ([`keel_core::event::SCHEMA_VERSION`]): a session a newer build wrote
//! is left for newer workers, counted and logged, never misread.
//!
//! **Whom it serves next: deficit round robin between tenants.** Tenants with claimable
//! sessions form a ring; each visit adds the tenant's weight (its quantum, default 1) to its
//! deficit, and each claim costs one. A tenant with 1,000 queued turns therefore gets one claim
//! per round like a tenant with one: the light tenant waits at most one round, not behind the
//! heavy tenant's backlog. A claim round of `k` free slots plays `k` such picks on a copy of the
//! ring, claims each tenant's picks at once, and charges the ring as the picks would have
//! (a tenant that had fewer sessions than its picks loses its turn; its slots go round again).
//! After a round that claimed anything the worker claims again at once; it waits for a
//! wake-up (or the poll interval) only when a round finds nothing. Within a tenant the store orders by turn priority, then age. A tenant
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

use std::collections::HashMap;
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

mod ring;
use ring::{Ring, Step};

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
        // Every free slot is claimed for in this round (one store transaction per tenant).
        let mut permits = vec![permit];
        while permits.len() < MAX_CLAIM_BATCH {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let claims = match next_claims(store.as_ref(), &config, &mut ring, permits.len()).await {
            Ok(c) if !c.is_empty() => c,
            Ok(_) => {
                drop(permits);
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
                drop(permits);
                tracing::warn!("claiming: {e}");
                tokio::select! {
                    () = drain.cancelled() => break,
                    () = tokio::time::sleep(config.poll) => {}
                }
                continue;
            }
        };
        // Slots the round did not fill go back at once; the loop claims again without
        // waiting (a successful round may have left more to claim).
        permits.truncate(claims.len());
        for (claim, permit) in claims.into_iter().zip(permits) {
            start_run(
                &mut runs, &store, &config, &runner, &observer, &in_flight, &drain, claim, permit,
            );
        }
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

/// Most sessions one claim round takes: the free slots, up to this many. A round takes its
/// leases with one statement per tenant, so a larger round costs little more than a small
/// one, while every round waits behind the running sessions for the worker's threads: a
/// worker taking over 1,000 sessions in rounds of 100 took 3 s for it, the runs it had
/// already started delaying each next round (docs/BENCHMARKS.md, "Cold start and take-over").
/// Bounds the statement's parameters (SQLite allows 32,766) and how long claimed sessions wait
/// for their runs to start.
pub const MAX_CLAIM_BATCH: usize = 1000;

/// Starts the run of `claim` in a slot (`permit`): records it in flight, runs it, reports it
/// and gives the session back.
#[allow(clippy::too_many_arguments)]
fn start_run(
    runs: &mut JoinSet<()>,
    store: &Arc<dyn Store>,
    config: &Arc<SchedulerConfig>,
    runner: &Arc<dyn ClaimRunner>,
    observer: &Arc<dyn SchedulerObserver>,
    in_flight: &InFlight,
    drain: &CancellationToken,
    claim: Claim,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let now = Utc::now();
    let latency = claim
        .runnable_since
        .and_then(|since| (now - since).to_std().ok());
    observer.claimed(&claim, latency);
    if let Some(prev) = &claim.took_over {
        tracing::info!(session = %claim.lease.session_id, previous = %prev, "took over an expired lease");
    }
    let stop_at_boundary = drain.child_token();
    lock(in_flight).insert(
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

/// Up to `slots` claims by deficit round robin, in serving order; empty when no tenant has
/// claimable work within its limits. The slots are shared out as if claimed one at a time
/// ([`Ring::plan`]), then each tenant's share is claimed in one store call
/// ([`Store::claim_sessions`]); a tenant that yields fewer than its share loses its turn, and
/// the slots left go round again to the others. A store error after some claims ends the round
/// with those (logged), so no claimed lease is dropped.
async fn next_claims(
    store: &dyn Store,
    config: &SchedulerConfig,
    ring: &mut Ring,
    slots: usize,
) -> Result<Vec<Claim>, StoreError> {
    let now = crate::lease::lease_clock();
    let backlog: Vec<TenantBacklog> = store
        .runnable_tenants(now, config.max_schema_version, 10_000)
        .await?;
    // What each eligible tenant can take now: its claimable sessions, up to its limit.
    let mut room: HashMap<TenantId, u64> = HashMap::new();
    let mut eligible = Vec::new();
    for b in &backlog {
        let limit = config.limits(b.tenant_id).max_sessions;
        if b.claimable > 0 && b.leased < limit && !config.skip_tenants.contains(&b.tenant_id) {
            room.insert(b.tenant_id, b.claimable.min(limit - b.leased));
            eligible.push(b.tenant_id);
        }
    }
    ring.refresh(&eligible);
    let quantum = |t: TenantId| u64::from(config.limits(t).weight);
    let mut claims = Vec::new();
    while claims.len() < slots {
        let steps = ring.plan(slots - claims.len(), &room, quantum);
        let mut want: Vec<(TenantId, u64)> = Vec::new();
        for step in &steps {
            if let Step::Serve(t) = step {
                match want.iter_mut().find(|(w, _)| w == t) {
                    Some((_, n)) => *n += 1,
                    None => want.push((*t, 1)),
                }
            }
        }
        if want.is_empty() {
            break;
        }
        let mut got: HashMap<TenantId, u64> = HashMap::new();
        for (tenant, n) in want {
            let limit = u32::try_from(n).unwrap_or(u32::MAX);
            let taken = match store
                .claim_sessions(
                    tenant,
                    &config.owner,
                    config.lease_ttl,
                    // The clock now, not the round's start: the leases run from here.
                    crate::lease::lease_clock(),
                    config.max_schema_version,
                    config.limits(tenant).max_sessions,
                    limit,
                )
                .await
            {
                Ok(taken) => taken,
                Err(e) if claims.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!("claiming: {e}");
                    room.clear();
                    Vec::new()
                }
            };
            let k = taken.len() as u64;
            got.insert(tenant, k);
            if let Some(r) = room.get_mut(&tenant) {
                // Short of its share: nothing more to claim for it this round.
                *r = if k < n { 0 } else { r.saturating_sub(k) };
            }
            claims.extend(taken);
        }
        let progress = got.values().any(|k| *k > 0);
        ring.replay(&steps, &mut got, quantum);
        if !progress {
            break;
        }
    }
    Ok(claims)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
