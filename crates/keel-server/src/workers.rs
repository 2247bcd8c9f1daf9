//! The workers of a Keel node: `keel serve` runs `[scheduler] workers` of them in-process (0:
//! an API-only node), `keel worker` runs them without the API. Each is a
//! [`keel_runtime::scheduler`] loop over the shared store; this module supplies what runs a
//! claimed session (the runtime of the release it pins, [`Runtimes`]), the per-tenant limits of
//! the `[scheduler]` table (tenant names resolved to ids at start), and admission control for
//! new turns (429 with `Retry-After` beyond the queue depths).

use keel_core::mechanisms::{Mechanism, is_off};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use keel_core::TenantId;
use keel_runtime::RuntimeError;
use keel_runtime::scheduler::{
    ClaimRunner, NoObserver, RunFuture, RunReport, SchedulerConfig, SchedulerObserver,
    TenantLimits, WorkerControl, WorkerHandle, spawn_worker,
};
use keel_store::{Claim, Store};
use tokio_util::sync::CancellationToken;

use crate::config::SchedulerSettings;
use crate::error::{ApiError, ServerError};
use crate::state::Runtimes;

/// How long a session this node cannot run (its release names a model or tool the node does
/// not have) is left unclaimed before any worker looks again. The backoff is the session's (in
/// the store), so it is short: a misconfigured node delays such a session for a correctly
/// configured one by at most this, and a session no node can run costs one claim per worker
/// every 5 s (each logged).
pub const DEFER_UNRUNNABLE: Duration = Duration::from_secs(5);

/// Runs a claimed session with the runtime of the release it pins.
struct ReleaseRunner {
    runtimes: Arc<Runtimes>,
}

impl ClaimRunner for ReleaseRunner {
    fn run(&self, claim: Claim, drain: CancellationToken) -> RunFuture {
        let runtimes = self.runtimes.clone();
        Box::pin(async move {
            let (tenant, session) = (claim.tenant_id, claim.lease.session_id);
            let rt = match runtimes.for_session(tenant, session).await {
                Ok(rt) => rt,
                Err(e) => {
                    return RunReport::Deferred {
                        reason: format!("this worker cannot run it: {}", e.problem.detail),
                        retry_after: DEFER_UNRUNNABLE,
                    };
                }
            };
            match rt.run_claim(&claim, drain).await {
                Ok(outcome) if outcome.drained => RunReport::Drained,
                Ok(_) => RunReport::Done,
                Err(RuntimeError::LeaseLost { .. }) => RunReport::LeaseLost,
                Err(e) => RunReport::Failed(e.to_string()),
            }
        })
    }
}

/// The per-tenant limits of `[scheduler]`, with tenant names resolved to ids.
#[derive(Debug, Clone, Default)]
pub struct TenantPolicy {
    defaults: Limits,
    by_tenant: HashMap<TenantId, Limits>,
}

/// One tenant's limits, resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Sessions running at once.
    pub max_sessions: u64,
    /// Model tokens per minute (0: none).
    pub tokens_per_minute: u64,
    /// Queued turns before 429.
    pub max_queued_turns: u64,
    /// DRR weight.
    pub weight: u32,
}

impl TenantPolicy {
    /// Resolves `settings.tenants` keys (a tenant id, else a tenant name) against the store.
    ///
    /// # Errors
    /// [`ServerError::Config`] for a key that names no tenant; store errors as `Config`.
    pub async fn resolve(
        settings: &SchedulerSettings,
        store: &dyn Store,
    ) -> Result<Self, ServerError> {
        let defaults = Limits {
            max_sessions: settings.tenant_max_sessions,
            tokens_per_minute: settings.tenant_tokens_per_minute,
            max_queued_turns: settings.tenant_max_queued_turns,
            weight: 1,
        };
        let mut by_tenant = HashMap::new();
        if settings.tenants.is_empty() {
            return Ok(Self {
                defaults,
                by_tenant,
            });
        }
        let mut names = HashMap::new();
        let mut after = None;
        loop {
            let page = store.list_tenants(after, 1000).await.map_err(|e| {
                ServerError::Config(format!("[scheduler.tenants]: listing tenants: {e}"))
            })?;
            for t in &page {
                names.insert(t.name.clone(), t.tenant_id);
            }
            match page.last() {
                Some(last) if page.len() == 1000 => after = Some(last.tenant_id),
                _ => break,
            }
        }
        for (key, t) in &settings.tenants {
            let id = match key.parse::<TenantId>() {
                Ok(id) => id,
                Err(_) => *names.get(key).ok_or_else(|| {
                    ServerError::Config(format!(
                        "[scheduler.tenants.{key}]: no tenant has this name or id (keel tenants list)"
                    ))
                })?,
            };
            by_tenant.insert(
                id,
                Limits {
                    max_sessions: t.max_sessions.unwrap_or(defaults.max_sessions),
                    tokens_per_minute: t.tokens_per_minute.unwrap_or(defaults.tokens_per_minute),
                    max_queued_turns: t.max_queued_turns.unwrap_or(defaults.max_queued_turns),
                    weight: t.weight.unwrap_or(1),
                },
            );
        }
        Ok(Self {
            defaults,
            by_tenant,
        })
    }

    /// `tenant`'s limits.
    pub fn limits(&self, tenant: TenantId) -> Limits {
        self.by_tenant
            .get(&tenant)
            .copied()
            .unwrap_or(self.defaults)
    }

    /// Whether any tenant has a token rate (else model calls reserve nothing).
    pub fn any_token_limit(&self) -> bool {
        self.defaults.tokens_per_minute > 0
            || self.by_tenant.values().any(|l| l.tokens_per_minute > 0)
    }

    /// The scheduler's view: concurrency and weights.
    fn scheduler_limits(&self) -> (TenantLimits, HashMap<TenantId, TenantLimits>) {
        let conv = |l: &Limits| TenantLimits {
            max_sessions: l.max_sessions,
            weight: l.weight.max(1),
        };
        (
            conv(&self.defaults),
            self.by_tenant.iter().map(|(t, l)| (*t, conv(l))).collect(),
        )
    }
}

/// Turns this node admitted whose submission has not finished, per tenant and in all: what
/// the store's queue depths may not show yet ([`admit_turn`]).
#[derive(Debug, Default)]
pub struct Admissions {
    pending: std::sync::Mutex<Pending>,
    /// One judgement at a time: a submission reads the depths and is admitted or refused
    /// before the next one reads them (held only while judging, never while a turn is written).
    gate: tokio::sync::Mutex<()>,
}

/// The counts behind [`Admissions`].
#[derive(Debug, Default)]
struct Pending {
    /// Admitted submissions in flight (their `turn.queued` maybe not written yet) per tenant.
    by_tenant: HashMap<TenantId, u64>,
    /// Admitted submissions in flight over all tenants.
    all: u64,
    /// The most in flight at once since start.
    all_max: u64,
}

impl Admissions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The admitted submissions in flight: `tenant`'s and all tenants'.
    fn in_flight(&self, tenant: TenantId) -> (u64, u64) {
        let p = self.lock();
        (p.by_tenant.get(&tenant).copied().unwrap_or(0), p.all)
    }

    /// Counts one more admitted submission of `tenant` in flight until the guard is dropped.
    fn admit(&self, tenant: TenantId) -> Admitted<'_> {
        let mut p = self.lock();
        *p.by_tenant.entry(tenant).or_insert(0) += 1;
        p.all += 1;
        p.all_max = p.all_max.max(p.all);
        Admitted {
            admissions: self,
            tenant,
        }
    }

    /// The in-memory buffer of admission: turns admitted whose submission has not finished
    /// (their `turn.queued` maybe not written yet), now and the most at once since start.
    /// [`admit_turn`] keeps both at most the service's `max_queued_turns` on one node (each
    /// admitted turn counts against the bound until its submission finishes); `/metrics`
    /// serves them as `keel_admitted_turns_unwritten` and `keel_admitted_turns_unwritten_max`.
    pub fn unwritten(&self) -> (u64, u64) {
        let p = self.lock();
        (p.all, p.all_max)
    }
}

/// A turn admitted by [`admit_turn`]: counted as in flight until dropped (keep it until the
/// submission is written).
#[derive(Debug)]
pub struct Admitted<'a> {
    admissions: &'a Admissions,
    tenant: TenantId,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut p = self.admissions.lock();
        if let Some(n) = p.by_tenant.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                p.by_tenant.remove(&self.tenant);
            }
        }
        p.all = p.all.saturating_sub(1);
    }
}

/// Admission control for a new turn of `tenant`: refuses (429 with `Retry-After`) when the
/// tenant's queued turns reached its `max_queued_turns`, or all tenants' reached
/// `max_queued_turns`. Nothing already accepted is dropped: this only refuses new input. The
/// refusal for the service's limit says it is full, not how many turns other tenants queued.
///
/// Never past the limit on one node under concurrent submits: submissions are judged one at a
/// time (the in-flight count read, then the store's depths, and the decision made under
/// `admissions`' gate), and an admitted one stays counted until the returned [`Admitted`] is
/// dropped (after its turn is written): a turn is in the count, the depths, or both. A turn
/// written but not yet dropped is counted twice — in the store's depth and in flight — so a
/// burst may be refused a little early (never late); a refused submission counts against no
/// one, so a burst at an empty queue always admits its first. Submissions on different API
/// nodes are not counted by each other: with several API nodes the depth can pass the limit
/// by the submissions the other nodes have in flight at that moment.
///
/// # Errors
/// The 429; store errors (500).
pub async fn admit_turn<'a>(
    store: &dyn Store,
    settings: &SchedulerSettings,
    policy: &TenantPolicy,
    admissions: &'a Admissions,
    tenant: TenantId,
    metrics: &keel_runtime::metrics::Metrics,
) -> Result<Admitted<'a>, ApiError> {
    use keel_runtime::metrics::AdmissionScope;
    let _judging = admissions.gate.lock().await;
    // The others admitted whose turns may not be in the depths yet — read *before* the depths.
    // An admitted submission stops counting in flight only after its turn is committed, so a
    // turn missing from this count is in the depths read next. Read the other way round, a
    // turn committed while the depths were read (not in them) whose submission then finished
    // (no longer in flight) was counted by neither, and the queue passed the bound by one.
    let (mine_flight, all_flight) = admissions.in_flight(tenant);
    let (mine, all) = store.queue_depth(tenant).await?;
    let mine = mine.saturating_add(mine_flight);
    let all = all.saturating_add(all_flight);
    let limit = policy.limits(tenant).max_queued_turns;
    // The queue drains at the workers' pace; one poll interval per hundred queued turns over
    // the limit is the estimate, at least a second, at most a minute.
    let retry = |over: u64| {
        let s = (settings.poll_ms.saturating_mul(1 + over / 100)).div_ceil(1000);
        s.clamp(1, 60)
    };
    if mine >= limit && !is_off(Mechanism::QueueBound) {
        metrics.admission_rejected(AdmissionScope::Tenant);
        return Err(ApiError::queue_full(
            "tenant",
            format!("this tenant has {mine} queued turns, its limit is {limit}; retry later"),
            retry(mine - limit),
        ));
    }
    if all >= settings.max_queued_turns && !is_off(Mechanism::QueueBound) {
        metrics.admission_rejected(AdmissionScope::Overall);
        return Err(ApiError::queue_full(
            "overall",
            "the service has as many queued turns as it takes; retry later".to_owned(),
            retry(all - settings.max_queued_turns),
        ));
    }
    Ok(admissions.admit(tenant))
}

/// The workers of this node.
#[derive(Debug, Default)]
pub struct Workers {
    handles: Vec<WorkerHandle>,
}

impl Workers {
    /// Starts `settings.workers` workers (or `count` when given) on `store`, running sessions
    /// with `runtimes`, named `<name>-<n>@<host>:<pid>/pidns:<inode>`.
    pub fn start(
        store: Arc<dyn Store>,
        runtimes: Arc<Runtimes>,
        settings: &SchedulerSettings,
        policy: &TenantPolicy,
        name: &str,
        count: usize,
        observer: Option<Arc<dyn SchedulerObserver>>,
    ) -> Self {
        let (default_limits, tenants) = policy.scheduler_limits();
        let runner: Arc<dyn ClaimRunner> = Arc::new(ReleaseRunner { runtimes });
        let observer = observer.unwrap_or_else(|| Arc::new(NoObserver));
        let handles = (1..=count)
            .map(|n| {
                let config = SchedulerConfig {
                    owner: keel_runtime::lease::owner_string(&format!("{name}-{n}")),
                    concurrency: settings.concurrency,
                    lease_ttl: Duration::from_millis(settings.lease_ttl_ms),
                    poll: Duration::from_millis(settings.poll_ms),
                    drain_timeout: Duration::from_millis(settings.drain_timeout_ms),
                    default_limits,
                    tenants: tenants.clone(),
                    skip_tenants: vec![keel_core::TenantId::local()],
                    ..SchedulerConfig::default()
                };
                spawn_worker(store.clone(), config, runner.clone(), observer.clone())
            })
            .collect();
        Self { handles }
    }

    /// `count` workers of the node whose state is `state`: its store, runtimes, `[scheduler]`
    /// settings and tenant limits, counted in its `/metrics`.
    pub fn for_node(state: &crate::state::Shared, count: usize) -> Self {
        Self::start(
            state.store.clone(),
            state.runtimes.clone(),
            &state.config.scheduler,
            &state.policy,
            state.runtimes.worker_name(),
            count,
            Some(Arc::new(state.metrics.clone())),
        )
    }

    /// How many workers run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether this node runs no worker.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Controls of every worker, usable while [`Workers::join`] is awaited.
    pub fn control(&self) -> WorkersControl {
        WorkersControl(self.handles.iter().map(WorkerHandle::control).collect())
    }

    /// Starts a graceful drain of every worker.
    pub fn drain(&self) {
        self.handles.iter().for_each(WorkerHandle::drain);
    }

    /// Stops every worker at once (sessions given back).
    pub fn stop_now(&self) {
        self.handles.iter().for_each(WorkerHandle::stop_now);
    }

    /// Drains every worker and waits until each gave its sessions back; when `force`
    /// completes first (a second SIGTERM), stops them at once (their sessions are still given
    /// back).
    pub async fn drain_until(self, force: impl std::future::Future<Output = ()>) {
        let control = self.control();
        control.drain();
        let joined = self.join();
        tokio::pin!(joined);
        tokio::pin!(force);
        tokio::select! {
            () = &mut joined => {}
            () = &mut force => {
                tracing::warn!("stopping the workers at once");
                control.stop_now();
                joined.await;
            }
        }
    }

    /// Waits until every worker gave its sessions back.
    pub async fn join(self) {
        for h in self.handles {
            h.join().await;
        }
    }
}

/// Drains or stops every worker of a node ([`Workers::control`]).
#[derive(Debug, Clone)]
pub struct WorkersControl(Vec<WorkerControl>);

impl WorkersControl {
    /// Starts a graceful drain of every worker.
    pub fn drain(&self) {
        self.0.iter().for_each(WorkerControl::drain);
    }

    /// Stops every worker at once.
    pub fn stop_now(&self) {
        self.0.iter().for_each(WorkerControl::stop_now);
    }
}
