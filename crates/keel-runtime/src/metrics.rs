//! Process metrics: one Prometheus registry ([`Metrics`]) for the runtime, the scheduler and
//! the server, rendered as the OpenMetrics text exposition (`keel serve`'s `/metrics`, on its
//! own `--metrics-listen` address, never the API's).
//!
//! **Every metric is registered when [`Metrics::new`] runs**, so a scrape before anything
//! happened shows each family: counters and histograms without labels at 0, session counts at 0
//! for every status, and labelled families with their `# HELP`/`# TYPE` lines. The names (the
//! exposition adds `_total` to counters and `_seconds` to the histograms' units):
//!
//! | metric | type | labels | recorded by |
//! |---|---|---|---|
//! | `keel_sessions` | gauge | `status` | [`Metrics::observe_store`] at scrape (`Store::session_counts`) |
//! | `keel_queue_depth` | gauge | `tenant` | [`Metrics::observe_store`] at scrape (`Store::queue_depths`) |
//! | `keel_sessions_left_for_newer_schema` | gauge | — | [`Metrics::observe_store`] at scrape; the scheduler ([`SchedulerObserver::left_for_newer`]) |
//! | `keel_claim_latency_seconds` | histogram | — | the scheduler ([`SchedulerObserver::claimed`]): `runnable_since` → claim |
//! | `keel_worker_claims_total` | counter | — | the scheduler, each claim |
//! | `keel_lease_takeovers_total` | counter | — | the scheduler, each claim that took an expired lease over |
//! | `keel_admission_rejections_total` | counter | `scope` (`tenant`, `overall`) | [`Metrics::admission_rejected`] (each 429) |
//! | `keel_admitted_turns_unwritten`, `keel_admitted_turns_unwritten_max` | gauge | — | [`Metrics::set_admitted_unwritten`] at scrape: turns the API admitted whose `turn.queued` is not written yet (an in-memory buffer, at most `max_queued_turns`), now and the most at once since start |
//! | `keel_step_latency_seconds` | histogram | — | the runtime: one model step (sampling phase, retries and fallbacks included) |
//! | `keel_model_tokens_total` | counter | `model`, `kind` | the runtime, per model attempt ([`TokenKind`]) |
//! | `keel_model_cost_usd_total` | counter | `model` | the runtime, per model attempt (USD, at the worker's prices) |
//! | `keel_tool_calls_total` | counter | `tool`, `outcome` | the runtime, per call it executed (the call's status after it ran) |
//! | `keel_session_runs_total`, `keel_session_run_errors_total` | counter | — | the scheduler: runs of claimed sessions, and those that failed ([`RunReport::Failed`]) |
//! | `keel_sessions_running` | gauge | — | the scheduler: sessions this process's workers run now |
//! | `keel_http_responses_total` | counter | `class` (`1xx` … `5xx`) | [`Metrics::http_response`] |
//! | `keel_sse_streams_open` | gauge | — | [`Metrics::stream_opened`], [`Metrics::stream_closed`] |
//! | `keel_sse_credential_checks_total` | counter | — | [`Metrics::stream_credential_checked`]: store reads made to recheck the keys of open event streams (one per key per check period, however many streams the key has) |
//! | `keel_idempotent_replays_total` | counter | — | [`Metrics::idempotent_replay`] |
//!
//! Model and tool labels are the model labels of the release routes and the tool names of the
//! registry (bounded sets); `tenant` is a tenant id, which is why the exposition is served only
//! on the operators' metrics address. Nothing else a tenant wrote (session ids, input, outputs)
//! is a label.
//!
//! A [`Metrics`] is a cheap handle (`Clone` shares the registry): hosts make one, put it in
//! [`crate::RuntimeOptions::metrics`] (every runtime built from those options records into it),
//! give it to their workers as their [`SchedulerObserver`], and render it with
//! [`Metrics::render`].

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keel_core::{SessionStatus, StateMachine};
use keel_store::{Claim, Store};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::scheduler::{RunReport, SchedulerObserver};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The kinds of model tokens counted by `keel_model_tokens_total` (label `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Prompt tokens, cached ones included.
    Input,
    /// Generated tokens, reasoning included.
    Output,
    /// Prompt tokens read from the provider's cache.
    CacheRead,
    /// Prompt tokens written to the provider's cache.
    CacheWrite,
    /// Output tokens spent on reasoning.
    Reasoning,
}

impl TokenKind {
    /// The label value (`input`, `output`, `cache_read`, `cache_write`, `reasoning`).
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::Output => "output",
            TokenKind::CacheRead => "cache_read",
            TokenKind::CacheWrite => "cache_write",
            TokenKind::Reasoning => "reasoning",
        }
    }
}

/// Where an admission limit refused a turn (label `scope` of
/// `keel_admission_rejections_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionScope {
    /// The tenant's queue was full.
    Tenant,
    /// The queue over all tenants was full.
    Overall,
}

impl AdmissionScope {
    /// The label value (`tenant`, `overall`).
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionScope::Tenant => "tenant",
            AdmissionScope::Overall => "overall",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelKindLabels {
    model: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabel {
    scope: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

/// The registry and every metric in it.
#[derive(Debug)]
struct Inner {
    registry: Registry,
    sessions: Family<StatusLabel, Gauge>,
    queue_depth: Family<TenantLabel, Gauge>,
    newer_schema: Gauge,
    claim_latency: Histogram,
    worker_claims: Counter,
    lease_takeovers: Counter,
    admission_rejections: Family<ScopeLabel, Counter>,
    admitted_unwritten: Gauge,
    admitted_unwritten_max: Gauge,
    step_latency: Histogram,
    model_tokens: Family<ModelKindLabels, Counter>,
    model_cost: Family<ModelLabel, Counter<f64, AtomicU64>>,
    tool_calls: Family<ToolLabels, Counter>,
    runs: Counter,
    run_errors: Counter,
    sessions_running: Gauge,
    http_responses: Family<ClassLabel, Counter>,
    streams_open: Gauge,
    stream_checks: Counter,
    replays: Counter,
    /// Serializes scrape-time store reads (two scrapes at once would interleave their writes
    /// to the queue-depth family).
    store_read: tokio::sync::Mutex<()>,
    /// Store reads that failed since the last success, by read (for one log line per failure
    /// streak, not one per scrape).
    failing: Mutex<[bool; 3]>,
}

/// The process's metrics: a shared handle on one registry (see the module docs for the list).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads from the store behind [`Metrics::observe_store`] (index into `Inner::failing`).
const SESSION_COUNTS: usize = 0;
const QUEUE_DEPTHS: usize = 1;
const NEWER_SCHEMA: usize = 2;

impl Metrics {
    /// A registry with every metric registered (at zero).
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let sessions = Family::<StatusLabel, Gauge>::default();
        for status in SessionStatus::ALL {
            let _ = sessions.get_or_create(&StatusLabel {
                status: status.as_str().to_owned(),
            });
        }
        registry.register(
            "keel_sessions",
            "Sessions by status over all tenants (read from the store at scrape time)",
            sessions.clone(),
        );
        let queue_depth = Family::<TenantLabel, Gauge>::default();
        registry.register(
            "keel_queue_depth",
            "Turns queued and not yet started, per tenant with any (read from the store at scrape time)",
            Shown(queue_depth.clone()),
        );
        let newer_schema = Gauge::default();
        registry.register(
            "keel_sessions_left_for_newer_schema",
            "Sessions with work whose journal was written by a newer event schema than this build reads: left for newer workers",
            newer_schema.clone(),
        );
        // 5 ms … ~164 s.
        let claim_latency = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        registry.register_with_unit(
            "keel_claim_latency",
            "Time from a session becoming runnable to a worker claiming it",
            Unit::Seconds,
            claim_latency.clone(),
        );
        let worker_claims = Counter::default();
        registry.register(
            "keel_worker_claims",
            "Sessions claimed by this process's workers",
            worker_claims.clone(),
        );
        let lease_takeovers = Counter::default();
        registry.register(
            "keel_lease_takeovers",
            "Sessions claimed whose previous worker's lease had expired (a dead or stuck worker)",
            lease_takeovers.clone(),
        );
        let admission_rejections = Family::<ScopeLabel, Counter>::default();
        for scope in [AdmissionScope::Tenant, AdmissionScope::Overall] {
            let _ = admission_rejections.get_or_create(&ScopeLabel {
                scope: scope.as_str().to_owned(),
            });
        }
        registry.register(
            "keel_admission_rejections",
            "New turns refused with 429 because a queue was full, by the limit that refused them",
            admission_rejections.clone(),
        );
        // 10 ms … ~328 s.
        let step_latency = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register_with_unit(
            "keel_step_latency",
            "One model step: from its request to its end, retries and fallbacks included",
            Unit::Seconds,
            step_latency.clone(),
        );
        let model_tokens = Family::<ModelKindLabels, Counter>::default();
        registry.register(
            "keel_model_tokens",
            "Model tokens used, by the model that served each attempt and kind (input, output, cache_read, cache_write, reasoning)",
            Shown(model_tokens.clone()),
        );
        let model_cost = Family::<ModelLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "keel_model_cost_usd",
            "Model cost in US dollars at this worker's prices, by the model that served each attempt",
            Shown(model_cost.clone()),
        );
        let tool_calls = Family::<ToolLabels, Counter>::default();
        registry.register(
            "keel_tool_calls",
            "Tool calls this process executed, by tool and outcome (the call's status after it ran)",
            Shown(tool_calls.clone()),
        );
        let runs = Counter::default();
        registry.register(
            "keel_session_runs",
            "Runs of claimed sessions started by this process's workers",
            runs.clone(),
        );
        let run_errors = Counter::default();
        registry.register(
            "keel_session_run_errors",
            "Session runs that ended with an error",
            run_errors.clone(),
        );
        let admitted_unwritten = Gauge::default();
        registry.register(
            "keel_admitted_turns_unwritten",
            "Turns the API admitted whose turn.queued is not written yet",
            admitted_unwritten.clone(),
        );
        let admitted_unwritten_max = Gauge::default();
        registry.register(
            "keel_admitted_turns_unwritten_max",
            "The most turns admitted and not yet written at once since start",
            admitted_unwritten_max.clone(),
        );
        let sessions_running = Gauge::default();
        registry.register(
            "keel_sessions_running",
            "Sessions this process's workers run now",
            sessions_running.clone(),
        );
        let http_responses = Family::<ClassLabel, Counter>::default();
        for class in 1..=5 {
            let _ = http_responses.get_or_create(&ClassLabel {
                class: format!("{class}xx"),
            });
        }
        registry.register(
            "keel_http_responses",
            "HTTP responses by status class",
            http_responses.clone(),
        );
        let streams_open = Gauge::default();
        registry.register(
            "keel_sse_streams_open",
            "Event streams open now",
            streams_open.clone(),
        );
        let stream_checks = Counter::default();
        registry.register(
            "keel_sse_credential_checks",
            "Store reads made to recheck the keys of open event streams (one per key per check period)",
            stream_checks.clone(),
        );
        let replays = Counter::default();
        registry.register(
            "keel_idempotent_replays",
            "Responses replayed for a repeated Idempotency-Key",
            replays.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                sessions,
                queue_depth,
                newer_schema,
                claim_latency,
                worker_claims,
                lease_takeovers,
                admission_rejections,
                admitted_unwritten,
                admitted_unwritten_max,
                step_latency,
                model_tokens,
                model_cost,
                tool_calls,
                runs,
                run_errors,
                sessions_running,
                http_responses,
                streams_open,
                stream_checks,
                replays,
                store_read: tokio::sync::Mutex::new(()),
                failing: Mutex::new([false; 3]),
            }),
        }
    }

    /// The OpenMetrics text exposition of every metric (serve it with [`CONTENT_TYPE`]).
    /// Call [`Metrics::observe_store`] first for the store's gauges to be current.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    // --- the scheduler ------------------------------------------------------------------------

    /// A new turn was refused with 429 by the `scope` queue limit.
    pub fn admission_rejected(&self, scope: AdmissionScope) {
        self.inner
            .admission_rejections
            .get_or_create(&ScopeLabel {
                scope: scope.as_str().to_owned(),
            })
            .inc();
    }

    /// Sets `keel_admitted_turns_unwritten` to `now` and `keel_admitted_turns_unwritten_max` to
    /// `most`: the turns the API admitted whose `turn.queued` is not written yet (held in
    /// memory between admission and the write), now and the most at once since the process
    /// started. Admission keeps both at most `max_queued_turns` (the host's admission counts).
    pub fn set_admitted_unwritten(&self, now: u64, most: u64) {
        self.inner.admitted_unwritten.set(gauge_value(now));
        self.inner.admitted_unwritten_max.set(gauge_value(most));
    }

    /// Sets `keel_sessions_left_for_newer_schema` (sessions this build will not claim).
    pub fn set_left_for_newer_schema(&self, sessions: u64) {
        self.inner.newer_schema.set(gauge_value(sessions));
    }

    // --- the runtime --------------------------------------------------------------------------

    /// One model step took `elapsed`.
    pub fn observe_step(&self, elapsed: Duration) {
        self.inner.step_latency.observe(elapsed.as_secs_f64());
    }

    /// What one model attempt served by `model` used: its tokens by kind (zero counts are not
    /// added, so a model never used shows no series) and its cost in USD.
    pub fn model_usage(&self, model: &str, usage: &keel_core::Usage, cost_usd: f64) {
        for (kind, n) in [
            (TokenKind::Input, usage.input_tokens),
            (TokenKind::Output, usage.output_tokens),
            (TokenKind::CacheRead, usage.cache_read_tokens),
            (TokenKind::CacheWrite, usage.cache_write_tokens),
            (TokenKind::Reasoning, usage.reasoning_tokens),
        ] {
            if n > 0 {
                self.inner
                    .model_tokens
                    .get_or_create(&ModelKindLabels {
                        model: model.to_owned(),
                        kind: kind.as_str().to_owned(),
                    })
                    .inc_by(n);
            }
        }
        let cost = keel_core::finite_cost(cost_usd);
        if cost > 0.0 {
            self.inner
                .model_cost
                .get_or_create(&ModelLabel {
                    model: model.to_owned(),
                })
                .inc_by(cost);
        }
    }

    /// A tool call this process executed ended with `outcome` (the call's status:
    /// `succeeded`, `failed`, `cancelled`, `rejected`, …; `unfinished` when the run stopped
    /// before the call had a result).
    pub fn tool_call(&self, tool: &str, outcome: &str) {
        self.inner
            .tool_calls
            .get_or_create(&ToolLabels {
                tool: tool.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    // --- the server ---------------------------------------------------------------------------

    /// An HTTP response with status `status` was sent.
    pub fn http_response(&self, status: u16) {
        let class = (status / 100).clamp(1, 5);
        self.inner
            .http_responses
            .get_or_create(&ClassLabel {
                class: format!("{class}xx"),
            })
            .inc();
    }

    /// An event stream opened.
    pub fn stream_opened(&self) {
        self.inner.streams_open.inc();
    }

    /// An event stream closed.
    pub fn stream_closed(&self) {
        self.inner.streams_open.dec();
    }

    /// The store was read to recheck the key of open event streams.
    pub fn stream_credential_checked(&self) {
        self.inner.stream_checks.inc();
    }

    /// A response was replayed for a repeated Idempotency-Key.
    pub fn idempotent_replay(&self) {
        self.inner.replays.inc();
    }

    // --- scrape time --------------------------------------------------------------------------

    /// Refreshes the gauges read from the store: sessions by status
    /// (`Store::session_counts`; a status with none is 0), queued turns per tenant
    /// (`Store::queue_depths`; tenants with none drop out) and the sessions left for a newer
    /// event schema than [`keel_core::event::SCHEMA_VERSION`]. A read that fails keeps the last
    /// value it had and is logged once per run of failures; it never fails the scrape.
    pub async fn observe_store(&self, store: &dyn Store) {
        let _one_at_a_time = self.inner.store_read.lock().await;
        match store.session_counts().await {
            Ok(counts) => {
                self.read_ok(SESSION_COUNTS);
                for status in SessionStatus::ALL {
                    let n = counts
                        .iter()
                        .filter(|(s, _)| s == status)
                        .map(|(_, n)| *n)
                        .sum::<u64>();
                    self.inner
                        .sessions
                        .get_or_create(&StatusLabel {
                            status: status.as_str().to_owned(),
                        })
                        .set(gauge_value(n));
                }
            }
            Err(e) => self.read_failed(SESSION_COUNTS, "session counts", &e),
        }
        match store.queue_depths().await {
            Ok(depths) => {
                self.read_ok(QUEUE_DEPTHS);
                self.inner.queue_depth.clear();
                for (tenant, n) in depths.into_iter().filter(|(_, n)| *n > 0) {
                    self.inner
                        .queue_depth
                        .get_or_create(&TenantLabel {
                            tenant: tenant.to_string(),
                        })
                        .set(gauge_value(n));
                }
            }
            Err(e) => self.read_failed(QUEUE_DEPTHS, "queue depths", &e),
        }
        match store
            .newer_schema_sessions(keel_core::event::SCHEMA_VERSION)
            .await
        {
            Ok(n) => {
                self.read_ok(NEWER_SCHEMA);
                self.set_left_for_newer_schema(n);
            }
            Err(e) => self.read_failed(NEWER_SCHEMA, "sessions left for a newer schema", &e),
        }
    }

    fn read_ok(&self, which: usize) {
        if let Some(f) = self
            .inner
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(which)
        {
            *f = false;
        }
    }

    fn read_failed(&self, which: usize, what: &str, error: &keel_store::StoreError) {
        let first = self
            .inner
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(which)
            .is_some_and(|f| !std::mem::replace(f, true));
        if first {
            tracing::warn!(
                "metrics: reading {what} from the store failed ({error}); /metrics keeps the last value until a read succeeds"
            );
        } else {
            tracing::debug!("metrics: reading {what} from the store failed again: {error}");
        }
    }
}

/// The scheduler's events: claims (with their latency and takeovers), runs and their failures,
/// sessions this process's workers run, and sessions left for newer schemas.
impl SchedulerObserver for Metrics {
    fn claimed(&self, claim: &Claim, latency: Option<Duration>) {
        let m = &self.inner;
        m.worker_claims.inc();
        m.runs.inc();
        m.sessions_running.inc();
        if let Some(latency) = latency {
            m.claim_latency.observe(latency.as_secs_f64());
        }
        if claim.took_over.is_some() {
            m.lease_takeovers.inc();
        }
    }

    fn ran(&self, _claim: &Claim, report: &RunReport) {
        self.inner.sessions_running.dec();
        if matches!(report, RunReport::Failed(_)) {
            self.inner.run_errors.inc();
        }
    }

    fn left_for_newer(&self, sessions: u64) {
        self.set_left_for_newer_schema(sessions);
    }
}

/// A family registered so that it is in the exposition before it has a series (the registry
/// leaves out empty metrics): its `# HELP` and `# TYPE` lines, and no sample yet.
#[derive(Debug)]
struct Shown<S, M>(Family<S, M>);

impl<S, M> EncodeMetric for Shown<S, M>
where
    S: Clone + std::hash::Hash + Eq + EncodeLabelSet,
    M: EncodeMetric + TypedMetric,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// A count as a gauge value (gauges are `i64`).
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
