//! [`McpManager`]: every configured server of a session's host, started together, and the
//! [`Tool`]s they offer.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use keel_tools::ToolRegistry;
use keel_tools::tool::{Tool, ToolSource};
use serde::Serialize;

use crate::config::{McpServerConfig, validate_servers};
use crate::error::McpError;
use crate::server::{McpServer, ServerState, Servers};
use crate::tool::{McpTool, effect_of};

/// One server as `keel mcp list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ServerStatus {
    /// The server's name.
    pub name: String,
    /// `stdio: COMMAND ARGS…` or `http: URL`.
    pub transport: String,
    /// What it is doing.
    #[serde(flatten)]
    pub state: ServerState,
    /// Its tools (empty unless ready).
    pub tools: Vec<ToolStatus>,
}

/// One tool as `keel mcp list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ToolStatus {
    /// The name the model calls it by.
    pub name: String,
    /// The server's name for it.
    pub remote_name: String,
    /// The effect class its hints suggest (`read_only`, `idempotent_write`, `side_effecting`).
    pub effect: keel_tools::EffectClass,
}

/// Every configured server.
#[derive(Debug, Default)]
pub struct McpManager {
    servers: Servers,
}

impl McpManager {
    /// A manager of `configs` (checked first); servers run in (and answer `roots/list` with)
    /// `workspace`, stdio servers without the variables named in `withheld` (see
    /// [`McpServer::new`]). Nothing is started.
    ///
    /// # Errors
    /// The first [`McpError::Config`].
    pub fn new(
        configs: &BTreeMap<String, McpServerConfig>,
        workspace: &Path,
        withheld: &[String],
    ) -> Result<Self, McpError> {
        validate_servers(configs)?;
        let servers = configs
            .iter()
            .map(|(name, config)| {
                (
                    name.clone(),
                    Arc::new(McpServer::new(name, config.clone(), workspace, withheld)),
                )
            })
            .collect();
        Ok(Self { servers })
    }

    /// The servers by name.
    pub fn servers(&self) -> &Servers {
        &self.servers
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Starts every enabled server at once, each bounded by its `startup_timeout_ms`, and
    /// returns one notice per server that did not start (its tools are not offered). Never
    /// takes longer than the largest startup bound.
    pub async fn start(&self) -> Vec<String> {
        let mut tasks = tokio::task::JoinSet::new();
        for server in self.servers.values() {
            if server.config().is_enabled() {
                let server = Arc::clone(server);
                tasks.spawn(async move { server.start().await });
            }
        }
        let mut notices = Vec::new();
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => notices.push(format!("{e}; its tools are not offered")),
                Err(e) => notices.push(format!("an MCP server start panicked: {e}")),
            }
        }
        notices.sort();
        notices
    }

    /// The tools of every server that is ready (listing again where the list changed,
    /// restarting a server that exited), and a notice per server or tool left out.
    pub async fn tools(&self) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        let mut notices = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for server in self.servers.values() {
            if !matches!(
                server.state(),
                ServerState::Ready { .. } | ServerState::Exited { .. }
            ) {
                continue;
            }
            match server.tools().await {
                Ok(listed) => {
                    for tool in &listed {
                        let tool = McpTool::new(Arc::clone(server), tool);
                        if seen.insert(tool.name().to_owned()) {
                            tools.push(Arc::new(tool));
                        } else {
                            notices.push(format!(
                                "MCP server `{}`: tool `{}` is listed twice (as `{}`); the second is left out",
                                server.name(),
                                tool.remote_name(),
                                tool.name()
                            ));
                        }
                    }
                }
                Err(e) => notices.push(format!("{e}; its tools are not offered")),
            }
        }
        (tools, notices)
    }

    /// `registry` plus every MCP tool; a tool whose schema the registry refuses (or whose name
    /// is taken) is left out with a notice ([`ToolRegistry::extended`]).
    pub async fn extend(&self, registry: &ToolRegistry) -> (ToolRegistry, Vec<String>) {
        let (tools, mut notices) = self.tools().await;
        let (registry, left_out) = registry.extended(tools);
        notices.extend(left_out);
        (registry, notices)
    }

    /// What `keel mcp list` shows: every server, its state and its tools.
    pub async fn status(&self) -> Vec<ServerStatus> {
        let mut out = Vec::new();
        for server in self.servers.values() {
            let config = server.config();
            let transport = match (&config.command, &config.url) {
                (Some(command), _) => {
                    format!(
                        "stdio: {}",
                        std::iter::once(command)
                            .chain(&config.args)
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                }
                (None, Some(url)) => format!("http: {url}"),
                (None, None) => String::new(),
            };
            let tools = if matches!(server.state(), ServerState::Ready { .. }) {
                server
                    .tools()
                    .await
                    .unwrap_or_default()
                    .iter()
                    .map(|t| ToolStatus {
                        name: crate::naming::tool_name(server.name(), &t.name),
                        remote_name: t.name.to_string(),
                        effect: effect_of(t),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            out.push(ServerStatus {
                name: server.name().to_owned(),
                transport,
                state: server.state(),
                tools,
            });
        }
        out
    }

    /// The sum of the servers' [`McpServer::generation`]s: moves whenever any server's tools
    /// may have changed.
    pub fn generation(&self) -> u64 {
        self.servers.values().map(|s| s.generation()).sum()
    }

    /// Shuts every server down (stdio: close stdin, SIGTERM, SIGKILL), all at once.
    pub async fn shutdown(&self) {
        let mut tasks = tokio::task::JoinSet::new();
        for server in self.servers.values() {
            let server = Arc::clone(server);
            tasks.spawn(async move { server.shutdown().await });
        }
        while tasks.join_next().await.is_some() {}
    }
}

#[async_trait::async_trait]
impl ToolSource for McpManager {
    fn generation(&self) -> u64 {
        McpManager::generation(self)
    }

    async fn tools(&self) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
        McpManager::tools(self).await
    }
}
