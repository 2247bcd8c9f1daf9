//! # keel-server — Keel as a service: the HTTP API behind `keel serve`
//!
//! **Owns:** the `/v1` HTTP API (JSON, SSE), authentication by API key (tenants, principals,
//! roles), HTTP semantics (ETag/If-Match, Idempotency-Key, RFC 9457 problems, body limits,
//! stream limits), the server's limits on workspaces and on permission mode and sandbox, the
//! OpenAPI 3.1 document generated from the handlers' types, the node's workers (the scheduler
//! of `keel_runtime` with the runtime of each session's release, per-tenant limits, admission
//! control, drain), `/healthz`, `/readyz` and `/metrics`, and TLS.
//!
//! **Must not touch:** session semantics (every change goes through
//! [`keel_runtime::Runtime`]), SQL (only [`keel_store::Store`]), provider wire formats or keys
//! (models come from the host's [`ModelFactory`]), argument parsing (the `keel` binary wires
//! this crate: `keel serve`, `keel tenants`, `keel keys`).
//!
//! ## Layout
//! - [`Server`] (here) — bind, then run: the API listener (plain or TLS), the metrics
//!   listener, the workers, the background work (idempotency cleanup); a first shutdown
//!   signal drains, a second stops at once.
//! - [`workers`] — [`workers::Workers`]: the node's scheduler loops and what runs a claimed
//!   session; [`workers::TenantPolicy`] and [`workers::admit_turn`] (429 + `Retry-After`).
//! - [`api`] — the operations, one module per resource, and [`api::router`]: routes and the
//!   OpenAPI document registered together. Start reading there.
//! - [`http`] — bodies, If-Match, Idempotency-Key, fallbacks; [`auth`] — keys and callers;
//!   [`error`] — [`ApiError`] (problem+json) and [`ServerError`].
//! - [`inspector`] — the web page at `/` (embedded assets, sign-in with a key for a
//!   server-side session cookie, CSRF checks); its data comes from the `/v1` routes.
//! - [`state`] — [`AppState`]: runtimes per model route, tenant limits, stream slots,
//!   metrics; [`types`] — the wire types; [`config`] — [`ServerConfig`] (`[server]`).

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod http;
pub mod inspector;
pub mod state;
pub mod types;
pub mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use chrono::Utc;
use keel_runtime::RuntimeOptions;
use keel_store::Store;
use tokio::net::TcpListener;

pub use config::{SchedulerSettings, ServerConfig, TenantSettings};
pub use error::{ApiError, ServerError};
pub use state::{AppState, ModelFactory, Runtimes, Shared, ToolsFactory};

/// Longest `startup_timeout_ms` a release's MCP server may ask for on this server, ms: a
/// release whose servers are slow to start delays only its own sessions, for at most this.
pub const RELEASE_MCP_MAX_STARTUP_MS: u64 = 60_000;

/// What the host gives the server.
pub struct Deps {
    /// The store (`keel_store::open` of the same location as every other command).
    pub store: Arc<dyn Store>,
    /// Builds models from release routes, with the host's providers and keys.
    pub models: Arc<dyn ModelFactory>,
    /// Builds each runtime's tool registry.
    pub tools: ToolsFactory,
    /// Runtime options (seal key, withheld environment, secrets); each runtime's worker name
    /// gets a suffix, the server adds its workspace roots to `workspace_roots`, and sets
    /// `lease_ttl` to `[scheduler] lease_ttl_ms` (`lease_wait` one second more, at least the
    /// default). Their
    /// `metrics` registry is the one `/metrics` serves (the runtimes record into it too).
    pub runtime_options: RuntimeOptions,
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("store", &self.store.backend())
            .finish_non_exhaustive()
    }
}

/// The shared state and the API's router (with its document served at `/openapi.json`).
///
/// # Errors
/// [`ServerError::WorkspaceRoot`] for a root that is not an existing directory;
/// [`ServerError::Config`] for a `[scheduler.tenants.X]` that names no tenant.
pub async fn app(config: ServerConfig, deps: Deps) -> Result<(Shared, Router), ServerError> {
    let roots = config.canonical_roots()?;
    let policy = workers::TenantPolicy::resolve(&config.scheduler, deps.store.as_ref()).await?;
    // Sessions of many principals share this process: a confined command of one sees no
    // workspace under the roots but its own.
    let mut runtime_options = deps.runtime_options;
    runtime_options
        .workspace_roots
        .extend(roots.iter().cloned());
    let metrics = runtime_options.metrics.clone();
    // The workers claim sessions for `[scheduler] lease_ttl_ms`, and the runs' heartbeats must
    // renew within that TTL: with the runtimes' own TTL (10 s by default, renewed every third
    // of it) a shorter scheduler TTL ran out under a live run, and another worker took the
    // session over while its tool call still ran.
    runtime_options.lease_ttl = Duration::from_millis(config.scheduler.lease_ttl_ms);
    // Waiting for another holder's lease is bounded by a TTL and a second, never less than the
    // runtimes' default: requests contend for a session's short leases (30 concurrent submits
    // to one session each take it in turn), and a short TTL must not make them give up sooner.
    runtime_options.lease_wait = (runtime_options.lease_ttl + Duration::from_secs(1))
        .max(RuntimeOptions::default().lease_wait);
    // Token-rate admission of every model call, by the tenant's `[scheduler]` limit.
    if policy.any_token_limit() {
        let limits = policy.clone();
        runtime_options.token_rate = Some(keel_runtime::config::TokenRate::per_tenant(move |t| {
            Some(limits.limits(t).tokens_per_minute).filter(|n| *n > 0)
        }));
    }
    // A release's MCP servers run without the variables the tools go without either.
    let mcp = Arc::new(
        keel_mcp::McpPool::new(
            runtime_options.withheld_env.clone(),
            config.release_mcp_stdio,
        )
        .with_header_env(config.release_mcp_header_env.clone())
        .with_max_startup_timeout_ms(RELEASE_MCP_MAX_STARTUP_MS),
    );
    let state: Shared = Arc::new(AppState {
        runtimes: Arc::new(Runtimes::new(
            deps.store.clone(),
            deps.models,
            deps.tools,
            runtime_options,
            mcp,
        )),
        policy,
        draining: std::sync::atomic::AtomicBool::new(false),
        closing: tokio_util::sync::CancellationToken::new(),
        admissions: workers::Admissions::default(),
        store: deps.store,
        roots,
        streams: std::sync::Mutex::default(),
        metrics,
        openapi: std::sync::OnceLock::new(),
        body_schemas: http::BodySchemas::default(),
        inspector: inspector::signin::SignIns::default(),
        stream_checks: auth::StreamChecks::default(),
        config,
    });
    let (router, doc, _table) = api::router(&state);
    let _ = state
        .openapi
        .set(api::links::render(&doc).unwrap_or_default());
    let router = router
        .merge(inspector::router())
        .fallback(http::no_route)
        .method_not_allowed_fallback(http::no_method)
        .layer(middleware::from_fn(inspector::headers))
        .layer(DefaultBodyLimit::max(state.config.body_limit_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), http::count))
        .with_state(state.clone());
    Ok((state, router))
}

/// A bound server, ready to run.
pub struct Server {
    state: Shared,
    router: Router,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.local_addr())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

async fn bind_addr(text: &str) -> Result<TcpListener, ServerError> {
    let addr = config::parse_addr(text)?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: text.to_owned(),
            source,
        })
}

impl Server {
    /// Checks `config` ([`ServerConfig::check`]), loads TLS, binds the API and metrics
    /// addresses.
    ///
    /// # Errors
    /// [`ServerError`] naming what to fix.
    pub async fn bind(config: ServerConfig, deps: Deps) -> Result<Self, ServerError> {
        config.check()?;
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
            _ => None,
        };
        let listener = bind_addr(&config.listen).await?;
        let metrics = match &config.metrics_listen {
            Some(m) => Some(bind_addr(m).await?),
            None => None,
        };
        let (state, router) = app(config, deps).await?;
        Ok(Self {
            state,
            router,
            listener,
            metrics,
            tls,
        })
    }

    /// The API's address (the port chosen when `listen` says port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// The metrics address, when served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|m| m.local_addr().ok())
    }

    /// The shared state.
    pub fn state(&self) -> &Shared {
        &self.state
    }

    /// Serves until `shutdown` completes, then drains (see [`Server::run_until`]) with no
    /// second signal.
    ///
    /// # Errors
    /// [`ServerError::Bind`] when the listener fails.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        self.run_until(shutdown, std::future::pending()).await
    }

    /// Serves the API, the metrics, this node's `[scheduler] workers` workers and the
    /// background work (expired idempotency records deleted hourly) until `shutdown`
    /// completes. Then drains: `/readyz` answers 503 at once, the workers stop claiming and
    /// their running steps finish (up to `drain_timeout_ms`; a turn cut there is resumed by
    /// another worker, not aborted), every session is given back, and the API stops: open event
    /// streams end (their last chunk sent), other open requests get up to 5 s more. When `force` completes during the drain (a second
    /// SIGTERM), the workers stop at once and give their sessions back.
    ///
    /// # Errors
    /// [`ServerError::Bind`] when the listener fails.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        force: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Server {
            state,
            router,
            listener,
            metrics,
            tls,
        } = self;
        let stop = tokio_util_stop::Stop::new();
        let background = tokio::spawn(maintain(state.clone(), stop.clone()));
        let workers = workers::Workers::for_node(&state, state.config.scheduler.workers);
        let metrics_task =
            metrics.map(|m| tokio::spawn(serve_metrics(state.clone(), m, stop.clone())));
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(%addr, tls = tls.is_some(), workers = workers.len(), "keel serve: listening");
        let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
        let http_shutdown = async move {
            let _ = http_stopped.await;
        };
        let mut http = tokio::spawn(async move {
            match tls {
                None => axum::serve(
                    listener,
                    router.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .with_graceful_shutdown(http_shutdown)
                .await
                .map_err(|source| ServerError::Bind { addr, source }),
                Some(acceptor) => {
                    serve_tls(listener, router, acceptor, http_shutdown).await;
                    Ok(())
                }
            }
        });
        let mut early = None;
        tokio::select! {
            () = shutdown => {}
            r = &mut http => early = Some(r),
        }
        state
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(workers = workers.len(), "keel serve: draining");
        workers.drain_until(force).await;
        state.runtimes.mcp().shutdown().await;
        let result = match early {
            Some(r) => r.unwrap_or(Ok(())),
            None => {
                // Open event streams end now (cleanly, with the stream's last chunk); requests
                // in progress get up to 5 s.
                state.closing.cancel();
                let _ = http_stop.send(());
                match tokio::time::timeout(Duration::from_secs(5), &mut http).await {
                    Ok(r) => r.unwrap_or(Ok(())),
                    Err(_) => {
                        http.abort();
                        Ok(())
                    }
                }
            }
        };
        stop.stop();
        let _ = background.await;
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        result
    }
}

/// Runs `[scheduler] workers` (or `count`) workers without the API — `keel worker` — until
/// `shutdown` completes, then drains them like [`Server::run_until`] (`force`: stop at once).
/// With `metrics`, serves `/metrics`, `/healthz` and `/readyz` (503 while draining) there.
///
/// # Errors
/// As [`app`] (the worker reads the same settings as the server: workspace roots, scheduler).
pub async fn run_worker_node(
    config: ServerConfig,
    deps: Deps,
    count: usize,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    force: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.scheduler.check()?;
    let (state, _router) = app(config, deps).await?;
    let stop = tokio_util_stop::Stop::new();
    let metrics_task = metrics.map(|m| tokio::spawn(serve_metrics(state.clone(), m, stop.clone())));
    let workers = workers::Workers::for_node(&state, count);
    tracing::info!(workers = workers.len(), "keel worker: running");
    shutdown.await;
    state
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tracing::info!("keel worker: draining");
    workers.drain_until(force).await;
    state.runtimes.mcp().shutdown().await;
    stop.stop();
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    Ok(())
}

/// Serves `/metrics` (and the health probes) on its own listener until `stop`.
async fn serve_metrics(state: Shared, listener: TcpListener, stop: tokio_util_stop::Stop) {
    let metrics_state = state.clone();
    let app = Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let state = metrics_state.clone();
                async move {
                    // Store reads that fail keep their last values (and are logged).
                    state.metrics.observe_store(state.store.as_ref()).await;
                    let (now, most) = state.admissions.unwritten();
                    state.metrics.set_admitted_unwritten(now, most);
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            keel_runtime::metrics::CONTENT_TYPE,
                        )],
                        state.metrics.render(),
                    )
                }
            }),
        )
        .route("/healthz", axum::routing::get(api::health::healthz))
        .route("/readyz", axum::routing::get(api::health::readyz))
        .with_state(state);
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.wait().await })
        .await;
}

/// A small stop signal shared by the background tasks.
mod tokio_util_stop {
    use std::sync::Arc;

    use tokio::sync::watch;

    /// Cloneable; `stop()` wakes every `wait()`.
    #[derive(Clone)]
    pub struct Stop(Arc<watch::Sender<bool>>);

    impl Stop {
        pub fn new() -> Self {
            Self(Arc::new(watch::channel(false).0))
        }
        pub fn stop(&self) {
            self.0.send_replace(true);
        }
        pub async fn wait(&self) {
            let mut rx = self.0.subscribe();
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

/// Background work: every hour, deletes expired idempotency records. (Sessions left running,
/// queued turns and due timers are the workers' to claim.)
async fn maintain(state: Shared, stop: tokio_util_stop::Stop) {
    loop {
        match state.store.idempotency_cleanup(Utc::now()).await {
            Ok(n) if n > 0 => tracing::info!("deleted {n} expired idempotency records"),
            Ok(_) => {}
            Err(e) => tracing::warn!("idempotency cleanup: {e}"),
        }
        tokio::select! {
            () = stop.wait() => return,
            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &Path, e: &dyn std::fmt::Display| {
        ServerError::Tls(format!("{}: {e}", what.display()))
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, &e))?;
    if certs.is_empty() {
        return Err(bad(cert, &"no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| ServerError::Tls(format!("certificate and key: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

async fn serve_tls(
    listener: TcpListener,
    router: Router,
    acceptor: tokio_rustls::TlsAcceptor,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let svc = router
            .clone()
            .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!("TLS handshake: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let svc = hyper_util::service::TowerToHyperService::new(svc);
            let io = hyper_util::rt::TokioIo::new(tls);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .with_upgrades()
                .await
            {
                tracing::debug!("connection: {e}");
            }
        });
    }
}
