//! The tools a step sees: the host's registry (built-in tools) plus the tools of the release's
//! external sources (its MCP servers, through the host's [`ToolProvider`]).
//!
//! A source's list can change while a session runs (`notifications/tools/list_changed`, a
//! restarted server). The runner takes a registry when a run starts and again before each new
//! step ([`crate::driver::Runner::refresh_tools`]), and keeps it for the whole step: a change
//! reaches the next step's snapshot, never the step in progress — what the model was shown is
//! what its calls are validated and run against.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use keel_core::{Release, ReleaseId};
use keel_tools::{ToolProvider, ToolRegistry, ToolSource};

/// A release's sources and the registry last built from them.
struct Built {
    sources: Vec<Arc<dyn ToolSource>>,
    /// The sum of the sources' generations the registry was built at.
    generation: u64,
    registry: Arc<ToolRegistry>,
}

/// The host's tools and, per release and workspace, the tools its sources add.
pub(crate) struct ToolCatalog {
    base: Arc<ToolRegistry>,
    provider: RwLock<Option<Arc<dyn ToolProvider>>>,
    built: tokio::sync::Mutex<HashMap<(ReleaseId, PathBuf), Built>>,
}

impl ToolCatalog {
    pub(crate) fn new(base: ToolRegistry) -> Self {
        Self {
            base: Arc::new(base),
            provider: RwLock::new(None),
            built: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The host's own tools (no release's sources).
    pub(crate) fn base(&self) -> &Arc<ToolRegistry> {
        &self.base
    }

    pub(crate) fn set_provider(&self, provider: Arc<dyn ToolProvider>) {
        *self
            .provider
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(provider);
    }

    /// The registry for a step of a session pinned to `release` in `workspace`: the base, plus
    /// the sources' tools as they are now (listed again only when a source's generation
    /// moved). A tool left out (a schema that does not compile, a name taken, a server that did
    /// not start) is logged as a warning.
    pub(crate) async fn registry(&self, release: &Release, workspace: &Path) -> Arc<ToolRegistry> {
        let provider = self
            .provider
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(provider) = provider else {
            return self.base.clone();
        };
        if release.definition.mcp_servers.is_empty() {
            return self.base.clone();
        }
        let key = (release.id.clone(), workspace.to_owned());
        let known = self
            .built
            .lock()
            .await
            .get(&key)
            .map(|b| (b.sources.clone(), b.generation, b.registry.clone()));
        let (sources, was, registry) = match known {
            Some(known) => known,
            None => {
                // Outside the lock: starting a release's servers is bounded by their startup
                // timeouts, and other sessions' steps do not wait for it.
                let (sources, notices) = provider.sources(release, workspace).await;
                for notice in notices {
                    tracing::warn!(release = %release.id, "{notice}");
                }
                (sources, u64::MAX, self.base.clone())
            }
        };
        let now: u64 = sources.iter().map(|s| s.generation()).sum();
        if now == was {
            return registry;
        }
        let mut tools = Vec::new();
        for source in &sources {
            let (listed, notices) = source.tools().await;
            for notice in notices {
                tracing::warn!(release = %release.id, "{notice}");
            }
            tools.extend(listed);
        }
        let (registry, left_out) = self.base.extended(tools);
        for notice in left_out {
            tracing::warn!(release = %release.id, "{notice}");
        }
        let registry = Arc::new(registry);
        self.built.lock().await.insert(
            key,
            Built {
                sources,
                generation: now,
                registry: registry.clone(),
            },
        );
        registry
    }
}
