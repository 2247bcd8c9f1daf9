//! One configured MCP server: its connection (started, restarted after death, shut down), its
//! tool list, and the calls made to it.
//!
//! **Start** is bounded by `startup_timeout_ms` (default 10 s): spawn or connect, the handshake
//! and the first `tools/list`. The handshake speaks whichever revision the server does, as rmcp
//! 3.11 negotiates it ([`ClientLifecycleMode::Auto`]): first the sessionless revision
//! (`server/discover`, protocol `2026-07-28`), falling back to the session-based one
//! (`initialize` / `notifications/initialized`, `2025-11-25` and older) when the server answers
//! the probe with an error or not at all within rmcp's fixed 10 s probe bound (which our startup
//! bound also caps).
//!
//! **Tool-list changes** arrive as `notifications/tools/list_changed` (session-based, handled by
//! [`crate::handler`]) or over a `subscriptions/listen` stream opened after a sessionless
//! handshake; either marks the list stale, and the next [`McpServer::tools`] lists again.
//!
//! **Stdio servers** run in their own process group, with keel's environment minus every
//! variable named like a secret ([`keel_tools::sandbox::is_secret_env_name`]), plus the
//! configured `env` and `env_vars`, in the workspace; their standard error goes to the log
//! (target `keel_mcp::stderr`) and its last lines into start and death messages. Shutdown is
//! the spec's: close the server's standard input, wait, `SIGTERM` the group, wait, `SIGKILL`
//! (rmcp's `TokioChildProcess::graceful_shutdown`, 3 s per wait).
//!
//! **Death**: a server whose transport closed is restarted by the next call (and by the next
//! tool listing); a call in flight when it died ends with an error result naming the death.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keel_tools::ToolOutput;
use keel_tools::tool::{ProgressSink, ToolContext};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, JsonObject, ProtocolVersion,
    ServerNotification, ServerResult, SubscriptionFilter,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, Peer, PeerRequestOptions, RoleClient, RunningService,
    ServiceError, Subscription,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde::Serialize;
use tokio::io::AsyncBufReadExt;

use crate::config::{HeaderValueSpec, McpServerConfig, Protocol, Transport};
use crate::error::McpError;
use crate::handler::{KeelClient, ProgressRoute, Shared};
use crate::result::map_result;

/// Lines of a server's standard error kept for messages.
const STDERR_TAIL_LINES: usize = 20;

/// What a server is doing, for `keel mcp list` and notices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ServerState {
    /// Not started yet.
    Stopped,
    /// `enabled = false`.
    Disabled,
    /// Connected, speaking `protocol`.
    Ready {
        /// The negotiated protocol revision, e.g. `2025-11-25`.
        protocol: String,
    },
    /// The last start failed (the next call tries again).
    Failed {
        /// Why.
        reason: String,
    },
    /// The server's transport closed (the next call restarts it).
    Exited {
        /// What is known (the end of its standard error).
        reason: String,
    },
}

/// One live connection.
struct Connection {
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, KeelClient>>>,
    shared: Arc<Shared>,
    tools: Mutex<Vec<rmcp::model::Tool>>,
    protocol: String,
    pid: Option<u32>,
    subscription: Option<tokio::task::JoinHandle<()>>,
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.peer.is_transport_closed()
    }

    /// Ends the connection as the spec says (for stdio: close stdin, SIGTERM, SIGKILL) and
    /// waits for it.
    async fn shutdown(&self) {
        if let Some(task) = &self.subscription {
            task.abort();
        }
        if let Some(service) = self.service.lock().await.take() {
            let _ = service.cancel().await;
        }
    }
}

/// One configured server.
pub struct McpServer {
    name: String,
    config: McpServerConfig,
    workspace: PathBuf,
    withheld: Vec<String>,
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
    state: Mutex<ServerState>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Bumped by every tool-list change and every (re)start: see [`McpServer::generation`].
    generation: Arc<AtomicU64>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// How a call ended before its result was mapped.
enum Ended {
    Answered(
        Box<Result<Result<ServerResult, ServiceError>, tokio::sync::oneshot::error::RecvError>>,
    ),
    Cancelled,
    TimedOut,
}

impl McpServer {
    /// A server named `name` configured by `config`, whose root (and stdio working directory)
    /// is `workspace`; a stdio server's environment leaves out the variables named in
    /// `withheld` (the host's provider keys and other credentials it withholds from tools)
    /// unless `env_vars` names them. Nothing is started.
    pub fn new(name: &str, config: McpServerConfig, workspace: &Path, withheld: &[String]) -> Self {
        let state = if config.is_enabled() {
            ServerState::Stopped
        } else {
            ServerState::Disabled
        };
        Self {
            name: name.to_owned(),
            config,
            workspace: workspace.to_owned(),
            withheld: withheld.to_vec(),
            current: tokio::sync::Mutex::new(None),
            state: Mutex::new(state),
            stderr: Arc::new(Mutex::new(VecDeque::new())),
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A number that moves whenever the server's tools may have changed: a list-change
    /// notification (either revision) or a (re)start. Never goes back.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its configuration.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// What it is doing now.
    pub fn state(&self) -> ServerState {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_state(&self, state: ServerState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }

    /// The process id of a running stdio server (it leads its own process group).
    pub async fn pid(&self) -> Option<u32> {
        self.current.lock().await.as_ref().and_then(|c| c.pid)
    }

    /// The last lines of the server's standard error, joined (empty for HTTP servers).
    pub fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn with_stderr(&self, message: String) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            message
        } else {
            format!("{message}; its standard error ended with:\n{tail}")
        }
    }

    /// The live connection, starting (or restarting) the server when there is none.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        if !self.config.is_enabled() {
            return Err(McpError::Disabled {
                server: self.name.clone(),
            });
        }
        let mut current = self.current.lock().await;
        if let Some(conn) = current.as_ref() {
            if !conn.is_closed() {
                return Ok(Arc::clone(conn));
            }
            tracing::warn!(server = %self.name, "MCP server exited; restarting it");
        }
        if let Some(old) = current.take() {
            old.shutdown().await;
        }
        let timeout_ms = self.config.startup_timeout_ms();
        let started = tokio::time::timeout(Duration::from_millis(timeout_ms), self.connect()).await;
        let conn = match started {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                self.set_state(ServerState::Failed {
                    reason: e.to_string(),
                });
                return Err(e);
            }
            Err(_) => {
                let e = McpError::StartupTimeout {
                    server: self.name.clone(),
                    timeout_ms,
                };
                self.set_state(ServerState::Failed {
                    reason: e.to_string(),
                });
                return Err(e);
            }
        };
        self.set_state(ServerState::Ready {
            protocol: conn.protocol.clone(),
        });
        *current = Some(Arc::clone(&conn));
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(conn)
    }

    /// Spawns or connects, handshakes, lists the tools (unbounded: the caller bounds it).
    async fn connect(&self) -> Result<Arc<Connection>, McpError> {
        let shared = Arc::new(Shared {
            generation: Arc::clone(&self.generation),
            ..Shared::default()
        });
        let handler = KeelClient {
            server: self.name.clone(),
            workspace: self.workspace.clone(),
            shared: Arc::clone(&shared),
        };
        let lifecycle = match self.config.protocol.unwrap_or_default() {
            Protocol::Auto => ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            },
            Protocol::Session => ClientLifecycleMode::Initialize,
            Protocol::Sessionless => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        };
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            McpError::start(&self.name, self.with_stderr(format!("{what}: {e}")))
        };
        let mut pid = None;
        let service = match self.config.transport(&self.name)? {
            Transport::Stdio { command, args } => {
                let transport = self.spawn(command, args)?;
                pid = transport.id();
                handler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .map_err(|e| fail("handshake failed", &e))?
            }
            Transport::Http { url } => {
                let transport = self.http_transport(url)?;
                handler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .map_err(|e| fail("handshake failed", &e))?
            }
        };
        let peer = service.peer().clone();
        let protocol = peer
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        let tools = peer
            .list_all_tools()
            .await
            .map_err(|e| fail("tools/list failed", &e))?;
        let sessionless = peer
            .peer_info()
            .is_some_and(|info| !info.protocol_version.has_initialize());
        // Opened (acknowledged) before the server counts as started, so no change after the
        // first listing is missed.
        let subscription = if sessionless {
            open_subscription(&peer, &self.name)
                .await
                .map(|subscription| {
                    let shared = Arc::clone(&shared);
                    let name = self.name.clone();
                    tokio::spawn(follow_tool_changes(subscription, shared, name))
                })
        } else {
            None
        };
        Ok(Arc::new(Connection {
            peer,
            service: tokio::sync::Mutex::new(Some(service)),
            shared,
            tools: Mutex::new(tools),
            protocol,
            pid,
            subscription,
        }))
    }

    /// Spawns the stdio server in its own process group with the scrubbed environment.
    fn spawn(&self, command: &str, args: &[String]) -> Result<TokioChildProcess, McpError> {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(args)
            .current_dir(&self.workspace)
            .env_clear()
            .envs(self.server_env(std::env::vars_os()));
        let mut wrap = process_wrap::tokio::CommandWrap::from(cmd);
        wrap.wrap(process_wrap::tokio::ProcessGroup::leader());
        let (transport, stderr) = TokioChildProcess::builder(wrap)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| McpError::start(&self.name, format!("cannot run `{command}`: {e}")))?;
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        if let Some(stderr) = stderr {
            let tail = Arc::clone(&self.stderr);
            let name = self.name.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "keel_mcp::stderr", server = %name, "{line}");
                    let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                    if tail.len() == STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        Ok(transport)
    }

    /// The environment of a stdio server: `base` (keel's own) without variables named like a
    /// secret or withheld by the host (as tools get it), then the configured `env_vars` passed
    /// through and `env` set.
    pub fn server_env(
        &self,
        base: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        let mut out: Vec<_> = base
            .into_iter()
            .filter(|(name, _)| {
                let name = name.to_string_lossy();
                self.config.env_vars.iter().any(|p| *p == name)
                    || !(keel_tools::sandbox::is_secret_env_name(&name)
                        || self.withheld.iter().any(|w| *w == name))
            })
            .collect();
        for (name, value) in &self.config.env {
            out.retain(|(n, _)| n.to_str() != Some(name.as_str()));
            out.push((name.into(), value.into()));
        }
        out
    }

    /// The streamable HTTP transport, with header values read from the environment now.
    fn http_transport(
        &self,
        url: &str,
    ) -> Result<StreamableHttpClientTransport<reqwest::Client>, McpError> {
        let mut headers = std::collections::HashMap::new();
        for (name, spec) in &self.config.headers {
            let value = match spec {
                HeaderValueSpec::Plain(v) => v.clone(),
                HeaderValueSpec::FromEnv { env, prefix } => {
                    let v = std::env::var(env).map_err(|_| {
                        McpError::start(
                            &self.name,
                            format!(
                                "header {name} needs environment variable {env}, which is not set"
                            ),
                        )
                    })?;
                    format!("{}{v}", prefix.as_deref().unwrap_or_default())
                }
            };
            let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| McpError::config(&self.name, format!("header {name}: {e}")))?;
            let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                McpError::config(
                    &self.name,
                    format!("header {name}: the value is not valid in an HTTP header"),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        // reqwest's rustls backend takes the process-wide provider (ring, as the rest of keel).
        let _ = rustls::crypto::ring::default_provider().install_default();
        // No redirects: a server's URL is where its headers (tokens) go, and nowhere else.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                McpError::start(&self.name, format!("cannot build the HTTP client: {e}"))
            })?;
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        Ok(StreamableHttpClientTransport::with_client(client, config))
    }

    /// Starts the server if it is not running (bounded by its startup timeout).
    ///
    /// # Errors
    /// [`McpError::Start`], [`McpError::StartupTimeout`] or [`McpError::Disabled`].
    pub async fn start(&self) -> Result<(), McpError> {
        self.connection().await.map(|_| ())
    }

    /// The server's tools as it last listed them, listing again first when the list changed
    /// (and restarting the server when it exited).
    ///
    /// # Errors
    /// As [`McpServer::start`]; a failed re-listing is [`McpError::Start`].
    pub async fn tools(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let conn = self.connection().await?;
        if conn.shared.tools_stale.swap(false, Ordering::SeqCst) {
            let bound = Duration::from_millis(self.config.startup_timeout_ms());
            match tokio::time::timeout(bound, conn.peer.list_all_tools()).await {
                Ok(Ok(tools)) => {
                    *conn.tools.lock().unwrap_or_else(PoisonError::into_inner) = tools;
                }
                Ok(Err(e)) => {
                    conn.shared.mark_stale();
                    return Err(McpError::start(
                        &self.name,
                        format!("tools/list failed: {e}"),
                    ));
                }
                Err(_) => {
                    conn.shared.mark_stale();
                    return Err(McpError::StartupTimeout {
                        server: self.name.clone(),
                        timeout_ms: self.config.startup_timeout_ms(),
                    });
                }
            }
        }
        let tools = conn
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(tools)
    }

    /// Whether the server told us its tool list changed since it was last listed.
    pub async fn tools_changed(&self) -> bool {
        let current = self.current.lock().await;
        current
            .as_ref()
            .is_some_and(|c| c.shared.tools_stale.load(Ordering::SeqCst))
    }

    /// Calls tool `tool` (the server's name for it) with `arguments`, bounded by `timeout`;
    /// cancelling `ctx.cancel` or reaching the timeout sends `notifications/cancelled`.
    /// Progress notifications go to `ctx.progress` as status lines of `ctx.call_id`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: JsonObject,
        ctx: &ToolContext,
        timeout: Duration,
    ) -> ToolOutput {
        let conn = match self.connection().await {
            Ok(conn) => conn,
            Err(e) => {
                return ToolOutput::not_performed(format!(
                    "{e}. The call was not made; the server is started again for the next call."
                ));
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut handle = match conn
            .peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(e) => {
                return ToolOutput::not_performed(format!(
                    "MCP server `{}`: the call could not be sent ({e}); the server is started again for the next call.",
                    self.name
                ));
            }
        };
        let token = handle.progress_token.clone();
        conn.shared.route(
            token.clone(),
            ProgressRoute {
                call_id: ctx.call_id.clone(),
                sink: Arc::clone(&ctx.progress) as Arc<dyn ProgressSink>,
            },
        );
        let ended = tokio::select! {
            answer = &mut handle.rx => Ended::Answered(Box::new(answer)),
            () = ctx.cancel.cancelled() => Ended::Cancelled,
            () = tokio::time::sleep(timeout) => Ended::TimedOut,
        };
        conn.shared.unroute(&token);
        let timeout_ms = timeout.as_millis();
        let ended = match ended {
            Ended::Answered(answer) => Ok(*answer),
            Ended::Cancelled => Err(true),
            Ended::TimedOut => Err(false),
        };
        match ended {
            Err(true) => {
                let _ = handle.cancel(Some("cancelled by the user".into())).await;
                ToolOutput::cancelled(format!(
                    "The call to MCP server `{}` was cancelled (notifications/cancelled sent).",
                    self.name
                ))
            }
            Err(false) => {
                let _ = handle
                    .cancel(Some(format!("timed out after {timeout_ms} ms")))
                    .await;
                ToolOutput::error(format!(
                    "MCP server `{}` did not answer `{tool}` within {timeout_ms} ms; the call was cancelled (notifications/cancelled sent). Its effect, if any, is unknown.",
                    self.name
                ))
                .with_details(serde_json::json!({"timed_out": true, "timeout_ms": timeout_ms}))
            }
            Ok(Ok(Ok(result))) => map_answer(&self.name, tool, result),
            Ok(Ok(Err(ServiceError::McpError(e)))) => ToolOutput::error(format!(
                "MCP server `{}` refused `{tool}`: {} (JSON-RPC error {})",
                self.name, e.message, e.code.0
            )),
            Ok(Ok(Err(ServiceError::TransportClosed)) | Err(_)) => self.died_mid_call(tool).await,
            Ok(Ok(Err(e))) => {
                if conn.is_closed() {
                    self.died_mid_call(tool).await
                } else {
                    ToolOutput::error(format!("MCP server `{}`: `{tool}` failed: {e}", self.name))
                }
            }
        }
    }

    /// The result of a call whose server went away before answering; the state says so.
    async fn died_mid_call(&self, tool: &str) -> ToolOutput {
        // Give the stderr reader a moment's chance to drain what the server said last.
        tokio::task::yield_now().await;
        let reason = self.with_stderr("the connection closed".into());
        self.set_state(ServerState::Exited {
            reason: reason.clone(),
        });
        ToolOutput::error(format!(
            "MCP server `{}` exited during `{tool}` ({reason}). Whether the call took effect is unknown; the server is restarted for the next call.",
            self.name
        ))
        .with_details(serde_json::json!({"server_exited": true}))
    }

    /// Shuts the server down (stdio: close stdin, SIGTERM, SIGKILL) and waits for it.
    pub async fn shutdown(&self) {
        if let Some(conn) = self.current.lock().await.take() {
            conn.shutdown().await;
        }
        if self.config.is_enabled() {
            self.set_state(ServerState::Stopped);
        }
    }
}

/// Maps a `tools/call` answer (complete result, or the 2026-07-28 input-required and task
/// results keel does not drive) to a tool output.
fn map_answer(server: &str, tool: &str, result: ServerResult) -> ToolOutput {
    match result {
        ServerResult::CallToolResult(result) => map_result(&result),
        ServerResult::InputRequiredResult(_) => ToolOutput::error(format!(
            "MCP server `{server}` asked for more input to run `{tool}` (input_required), which keel does not provide (no sampling, elicitation or roots rounds on a call)."
        )),
        ServerResult::CreateTaskResult(_) => ToolOutput::error(format!(
            "MCP server `{server}` turned `{tool}` into a task, which keel does not poll; keel did not declare the tasks extension."
        )),
        other => ToolOutput::error(format!(
            "MCP server `{server}` answered `{tool}` with something other than a tool result: {}",
            serde_json::to_string(&other).unwrap_or_default()
        )),
    }
}

/// Opens a `subscriptions/listen` stream for tool-list changes (sessionless revision); `None`
/// when the server refuses it (changes are then not followed, and the log says so).
async fn open_subscription(peer: &Peer<RoleClient>, name: &str) -> Option<Subscription> {
    let filter: SubscriptionFilter =
        serde_json::from_value(serde_json::json!({"toolsListChanged": true})).ok()?;
    match peer.listen(filter).await {
        Ok(subscription) => Some(subscription),
        Err(e) => {
            tracing::info!(server = %name, "subscriptions/listen refused ({e}); tool-list changes are not followed");
            None
        }
    }
}

/// Reads `subscription` for `notifications/tools/list_changed` until it ends.
async fn follow_tool_changes(mut subscription: Subscription, shared: Arc<Shared>, name: String) {
    while let Ok(Some(notification)) = subscription.next().await {
        if matches!(
            notification,
            ServerNotification::ToolListChangedNotification(_)
        ) {
            tracing::info!(server = %name, "tool list changed");
            shared.mark_stale();
        }
    }
}

/// Servers by name.
pub type Servers = BTreeMap<String, Arc<McpServer>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack (issue 14): a stdio server gets the environment tools get. The collector's
    /// credentials (`OTEL_EXPORTER_OTLP_HEADERS`) and a provider key under a name that does
    /// not look secret (`api_key_env = "OPENAI_CREDS"`) are withheld from tools; they were
    /// passed to every MCP server. `env_vars` still passes one on purpose.
    #[test]
    fn a_stdio_server_gets_no_withheld_variable() {
        let withheld = [
            "OTEL_EXPORTER_OTLP_HEADERS".to_owned(),
            "OPENAI_CREDS".to_owned(),
        ];
        let base = || {
            [
                ("PATH", "/usr/bin"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "Authorization=Bearer c0llector",
                ),
                ("OPENAI_CREDS", "sk-proj-creds"),
                ("GITHUB_TOKEN", "ghp_x"),
            ]
            .map(|(k, v)| (k.into(), v.into()))
        };
        let names = |server: &McpServer| -> Vec<String> {
            server
                .server_env(base())
                .into_iter()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect()
        };
        let config = McpServerConfig {
            command: Some("true".into()),
            ..McpServerConfig::default()
        };
        let server = McpServer::new("s", config.clone(), Path::new("/"), &withheld);
        assert_eq!(names(&server), ["PATH"]);
        let passing = McpServer::new(
            "s",
            McpServerConfig {
                env_vars: vec!["OPENAI_CREDS".into()],
                ..config
            },
            Path::new("/"),
            &withheld,
        );
        assert_eq!(names(&passing), ["PATH", "OPENAI_CREDS"]);
    }
}
