//! What every request shares ([`AppState`]): the store, the settings, one
//! [`keel_runtime::Runtime`] per model route ([`Runtimes`], shared with the node's workers), the
//! per-key stream counts and the metrics ([`keel_runtime::metrics::Metrics`]).
//!
//! **Why a runtime per route.** A `Runtime` samples the one `ModelClient` its host gave it; a
//! server's sessions pin releases with different routes, so the server builds one runtime per
//! route (through the host's [`ModelFactory`]) and runs, cancels and watches each session
//! through the runtime of the release it pins now (live deltas come from the runtime that runs
//! the session).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use keel_core::{Release, SessionId, TenantId};
use keel_model::ModelClient;
use keel_runtime::{Runtime, RuntimeOptions};
use keel_store::Store;
use keel_tools::ToolRegistry;

use crate::config::ServerConfig;
use crate::error::ApiError;

/// Builds the model a release's route names. The host (the `keel` binary) supplies it, with its
/// providers and keys; a route the server will not serve (a `script:` model when they are not
/// allowed, an unknown provider, a provider without a key) is refused with a message naming
/// the spec.
pub trait ModelFactory: Send + Sync + 'static {
    /// The model for `route` (primary first).
    ///
    /// # Errors
    /// A message naming the spec at fault and what to do.
    fn build(&self, route: &[String]) -> Result<Arc<dyn ModelClient>, String>;
}

/// Builds the tool registry of each runtime.
pub type ToolsFactory = Arc<dyn Fn() -> Result<ToolRegistry, keel_tools::ToolsError> + Send + Sync>;

/// Shared state of the server.
pub type Shared = Arc<AppState>;

/// Everything requests share.
pub struct AppState {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Settings.
    pub config: ServerConfig,
    /// The workspace roots, symlinks resolved.
    pub roots: Vec<PathBuf>,
    /// Runtimes by route (shared with this node's workers).
    pub runtimes: Arc<Runtimes>,
    /// Per-tenant limits of `[scheduler]`, names resolved.
    pub policy: crate::workers::TenantPolicy,
    /// Set when the node drains (`/readyz` answers 503 from then on).
    pub draining: std::sync::atomic::AtomicBool,
    /// Cancelled when the API stops (after the drain): every open event stream ends then, so
    /// the HTTP server's graceful shutdown does not wait on streams that never end by themselves.
    pub closing: tokio_util::sync::CancellationToken,
    /// Turns admitted and not yet written ([`crate::workers::admit_turn`]).
    pub admissions: crate::workers::Admissions,
    /// Open SSE streams by key id.
    pub streams: Mutex<HashMap<String, usize>>,
    /// The process's metrics (shared with every runtime's options), served at `/metrics`.
    pub metrics: keel_runtime::metrics::Metrics,
    /// The OpenAPI document, as served at `/openapi.json`.
    pub openapi: std::sync::OnceLock<String>,
    /// Validators of request bodies against that document.
    pub body_schemas: crate::http::BodySchemas,
    /// The inspector's signed-in browsers (in memory: a restart signs everyone out).
    pub inspector: crate::inspector::signin::SignIns,
    /// The open streams' credential checks, shared per key ([`crate::auth::still_valid`]).
    pub stream_checks: crate::auth::StreamChecks,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("store", &self.store.backend())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Runtimes by model route.
pub struct Runtimes {
    factory: Arc<dyn ModelFactory>,
    tools: ToolsFactory,
    options: RuntimeOptions,
    store: Arc<dyn Store>,
    cache: Mutex<HashMap<Vec<String>, Runtime>>,
    mcp: Arc<keel_mcp::McpPool>,
}

impl Runtimes {
    /// Runtimes over `store`, built with `factory` and `tools`, with `options` (each runtime's
    /// worker name gets a suffix). Every runtime gets the MCP servers its sessions' releases
    /// name from `mcp` (one pool per process: a release's servers start once per workspace).
    pub fn new(
        store: Arc<dyn Store>,
        factory: Arc<dyn ModelFactory>,
        tools: ToolsFactory,
        options: RuntimeOptions,
        mcp: Arc<keel_mcp::McpPool>,
    ) -> Self {
        // A child session (`spawn_agent`) samples its agent's route, built by the same factory
        // as every release's (the server's providers, its `allow_script_models`).
        let mut options = options;
        let models = factory.clone();
        options.subagents.models = Some(Arc::new(move |route: &[String]| models.build(route)));
        Self {
            factory,
            tools,
            options,
            store,
            cache: Mutex::new(HashMap::new()),
            mcp,
        }
    }

    /// The MCP servers of releases (see [`keel_mcp::McpPool::check`] for what a release may
    /// name on this host).
    pub fn mcp(&self) -> &keel_mcp::McpPool {
        &self.mcp
    }

    /// The runtime of `route`, built on first use.
    ///
    /// # Errors
    /// 422 naming `model_route` when the factory refuses the route; 500 when tools cannot be
    /// set up.
    pub fn for_route(&self, route: &[String]) -> Result<Runtime, ApiError> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rt) = cache.get(route) {
            return Ok(rt.clone());
        }
        let model = self
            .factory
            .build(route)
            .map_err(|m| ApiError::invalid("model_route", m))?;
        let tools = (self.tools)().map_err(|e| ApiError::internal(&e))?;
        let mut options = self.options.clone();
        options.worker_name = format!("{}-{}", options.worker_name, cache.len() + 1);
        let rt = Runtime::new(self.store.clone(), model, tools, options);
        rt.set_tool_provider(self.mcp.clone());
        cache.insert(route.to_vec(), rt.clone());
        Ok(rt)
    }

    /// The runtime of the release `session` pins now.
    ///
    /// # Errors
    /// 404 for an unknown session (or another tenant's); as [`Runtimes::for_route`].
    pub async fn for_session(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<Runtime, ApiError> {
        let rec = self.store.get_session(tenant, session).await?;
        let release = self.store.get_release(tenant, &rec.release_id).await?;
        self.for_release(&release)
    }

    /// The runtime of the release `session` pins now, acting as `principal` (the caller whose
    /// changes it journals).
    ///
    /// # Errors
    /// As [`Runtimes::for_session`].
    pub async fn for_session_as(
        &self,
        tenant: TenantId,
        session: SessionId,
        principal: keel_core::PrincipalId,
    ) -> Result<Runtime, ApiError> {
        Ok(self
            .for_session(tenant, session)
            .await?
            .acting_as(principal))
    }

    /// The names of the tools a release may list: the host's, and `spawn_agent` (every
    /// runtime has it; it is offered to releases that define agents).
    ///
    /// # Errors
    /// 500 when the tools cannot be set up.
    pub fn tool_names(&self) -> Result<Vec<String>, ApiError> {
        let tools = (self.tools)().map_err(|e| ApiError::internal(&e))?;
        let mut names: Vec<String> = tools.specs().into_iter().map(|s| s.name).collect();
        let spawn = keel_runtime::subagents::SPAWN_AGENT;
        if !names.iter().any(|n| n == spawn) {
            names.push(spawn.to_owned());
        }
        Ok(names)
    }

    /// The runtime options the runtimes were built with.
    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// The worker name the runtimes were given (`RuntimeOptions::worker_name`).
    pub fn worker_name(&self) -> &str {
        &self.options.worker_name
    }

    /// The runtime of `release`.
    ///
    /// # Errors
    /// As [`Runtimes::for_route`].
    pub fn for_release(&self, release: &Release) -> Result<Runtime, ApiError> {
        self.for_route(&release.definition.model_route)
    }
}

/// One open SSE stream of a key; dropping it frees the slot.
pub struct StreamSlot {
    state: Shared,
    key: String,
}

impl AppState {
    /// Takes a stream slot for `key_id`.
    ///
    /// # Errors
    /// 429 when the key holds `max_streams_per_key` streams already.
    pub fn open_stream(self: &Arc<Self>, key_id: &str) -> Result<StreamSlot, ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let n = streams.entry(key_id.to_owned()).or_insert(0);
        if *n >= self.config.max_streams_per_key {
            return Err(ApiError::too_many_streams(self.config.max_streams_per_key));
        }
        *n += 1;
        self.metrics.stream_opened();
        Ok(StreamSlot {
            state: self.clone(),
            key: key_id.to_owned(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self
            .state
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = streams.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.key);
            }
        }
        self.state.metrics.stream_closed();
    }
}
