//! [`McpPool`]: the MCP servers of every release a host runs, as a [`ToolProvider`] — one
//! [`McpManager`] per workspace and server set, started on first use and shared by every session
//! of that release in that workspace.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_core::Release;
use keel_tools::tool::{ToolProvider, ToolSource};

use crate::config::{McpServerConfig, Transport, release_servers};
use crate::error::McpError;
use crate::manager::McpManager;

/// The MCP servers of the releases a host runs.
pub struct McpPool {
    withheld: Vec<String>,
    allow_stdio: bool,
    header_env: Option<Vec<String>>,
    max_startup_timeout_ms: Option<u64>,
    managers: std::sync::Mutex<HashMap<(PathBuf, String), Started>>,
}

/// One server set's manager, started once by whoever asked first.
type Started = Arc<tokio::sync::OnceCell<Arc<McpManager>>>;

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPool")
            .field("allow_stdio", &self.allow_stdio)
            .finish_non_exhaustive()
    }
}

impl McpPool {
    /// A pool whose stdio servers run without the variables named in `withheld` (see
    /// [`crate::McpServer::new`]). `allow_stdio: false` refuses every stdio server (`command`):
    /// a host serving releases made over its API (`keel serve`) does not spawn programs they
    /// name unless its operator says so.
    pub fn new(withheld: Vec<String>, allow_stdio: bool) -> Self {
        Self {
            withheld,
            allow_stdio,
            header_env: None,
            max_startup_timeout_ms: None,
            managers: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// This pool refusing servers whose `startup_timeout_ms` is over `ms`: a host serving
    /// releases made over its API bounds how long one release's servers may take to start.
    #[must_use]
    pub fn with_max_startup_timeout_ms(mut self, ms: u64) -> Self {
        self.max_startup_timeout_ms = Some(ms);
        self
    }

    /// This pool with header values of `url` servers (`{"env": "NAME"}`) limited to the host's
    /// environment variables in `names`: a release made over an API must not read any other
    /// variable of the host (its provider keys, say) and send it to a URL it chose. Without
    /// this call every variable may be named (a CLI, whose releases come from its user's own
    /// configuration).
    #[must_use]
    pub fn with_header_env(mut self, names: Vec<String>) -> Self {
        self.header_env = Some(names);
        self
    }

    /// Checks a release's servers as this pool would run them: they parse and validate, and a
    /// stdio server is allowed here.
    ///
    /// # Errors
    /// [`McpError::Config`] naming the server and what is wrong.
    pub fn check(
        &self,
        servers: &BTreeMap<String, serde_json::Value>,
    ) -> Result<BTreeMap<String, McpServerConfig>, McpError> {
        let parsed = release_servers(servers)?;
        if !self.allow_stdio
            && let Some((name, _)) = parsed.iter().find(|(name, config)| {
                matches!(config.transport(name), Ok(Transport::Stdio { .. }))
            })
        {
            return Err(McpError::config(
                name,
                "stdio servers (`command`) are not allowed in releases on this host; use a `url` server, or allow them in the host's configuration (`keel serve`: `[server] release_mcp_stdio = true`)",
            ));
        }
        if let Some(max) = self.max_startup_timeout_ms
            && let Some((name, _)) = parsed
                .iter()
                .find(|(_, config)| config.startup_timeout_ms() > max)
        {
            return Err(McpError::config(
                name,
                format!("startup_timeout_ms is at most {max} on this host"),
            ));
        }
        if let Some(allowed) = &self.header_env {
            // Nor may a stdio server be handed a variable the tools go without.
            if let Some((name, var)) = parsed.iter().find_map(|(name, config)| {
                config
                    .env_vars
                    .iter()
                    .find(|v| self.withheld.contains(v) && !allowed.contains(v))
                    .map(|v| (name, v))
            }) {
                return Err(McpError::config(
                    name,
                    format!(
                        "env_vars names {var}, which this host withholds from the programs it runs"
                    ),
                ));
            }
            for (name, config) in &parsed {
                let read = config
                    .headers
                    .iter()
                    .find_map(|(header, value)| match value {
                        crate::config::HeaderValueSpec::FromEnv { env, .. }
                            if !allowed.contains(env) =>
                        {
                            Some((header, env))
                        }
                        _ => None,
                    });
                if let Some((header, env)) = read {
                    return Err(McpError::config(
                        name,
                        format!(
                            "header {header} reads the host's environment variable {env}, which this host does not offer to releases (`keel serve`: `[server] release_mcp_header_env`)"
                        ),
                    ));
                }
            }
        }
        Ok(parsed)
    }

    /// The manager of `servers` in `workspace`, started (each server bounded by its startup
    /// timeout) when this is its first use, and one notice per server that did not start.
    ///
    /// # Errors
    /// A bad entry ([`McpPool::check`]).
    pub async fn manager(
        &self,
        servers: &BTreeMap<String, serde_json::Value>,
        workspace: &Path,
    ) -> Result<(Arc<McpManager>, Vec<String>), McpError> {
        let parsed = self.check(servers)?;
        let key = (
            workspace.to_owned(),
            serde_json::to_string(&parsed).unwrap_or_default(),
        );
        // One start per server set, by whoever asks first; the others wait for that start
        // only — the pool's map is not held across it, so a release whose servers are slow to
        // start delays no other release's sessions.
        let cell = Arc::clone(
            self.managers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key)
                .or_default(),
        );
        let mut notices = Vec::new();
        let manager = cell
            .get_or_try_init(|| async {
                let manager = Arc::new(McpManager::new(&parsed, workspace, &self.withheld)?);
                notices = manager.start().await;
                Ok::<_, McpError>(manager)
            })
            .await?;
        Ok((Arc::clone(manager), notices))
    }

    /// Shuts down every server this pool started.
    pub async fn shutdown(&self) {
        let started: Vec<_> = self
            .managers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .filter_map(|(_, cell)| cell.get().cloned())
            .collect();
        for manager in started {
            manager.shutdown().await;
        }
    }
}

#[async_trait::async_trait]
impl ToolProvider for McpPool {
    async fn sources(
        &self,
        release: &Release,
        workspace: &Path,
    ) -> (Vec<Arc<dyn ToolSource>>, Vec<String>) {
        let servers = &release.definition.mcp_servers;
        if servers.is_empty() {
            return (Vec::new(), Vec::new());
        }
        match self.manager(servers, workspace).await {
            Ok((manager, notices)) => (vec![manager as Arc<dyn ToolSource>], notices),
            Err(e) => (Vec::new(), vec![format!("{e}; its tools are not offered")]),
        }
    }
}
