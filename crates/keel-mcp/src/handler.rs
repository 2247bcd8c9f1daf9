//! The client side of one connection: what keel answers when a server asks something, and where
//! a server's notifications go.
//!
//! - `roots/list` answers the workspace (one `file://` root);
//! - `sampling/createMessage` and `elicitation/create` are declined with an error that says so
//!   (keel does not advertise either capability; a server asking anyway is told why not);
//! - `notifications/progress` becomes [`keel_tools::tool::ToolProgress::Status`] of the call
//!   whose progress token it carries;
//! - `notifications/tools/list_changed` (session-based revision, or an unscoped one) marks the
//!   server's tool list stale; on the sessionless revision the same arrives over the
//!   `subscriptions/listen` stream ([`crate::server`] opens it);
//! - `notifications/message` (server logs) goes to the log.

// Roots, sampling and logging are deprecated by the 2026-07-28 revision (SEP-2577) but are how
// the session-based revision works; keel answers them for the servers that speak it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use keel_tools::tool::{ProgressSink, ToolProgress};
use rmcp::ClientHandler;
use rmcp::model::{
    ClientConfig, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, ErrorCode, ErrorData, ListRootsResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, Root,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};

/// Where progress of one running call goes.
#[derive(Clone)]
pub(crate) struct ProgressRoute {
    pub(crate) call_id: String,
    pub(crate) sink: Arc<dyn ProgressSink>,
}

/// State shared between a server's connection and its handler.
#[derive(Default)]
pub(crate) struct Shared {
    /// Running calls' progress routes by progress token.
    pub(crate) progress: Mutex<HashMap<ProgressToken, ProgressRoute>>,
    /// Set by a tool-list change; cleared when the list is fetched again.
    pub(crate) tools_stale: AtomicBool,
    /// The server's tool-list generation ([`crate::McpServer::generation`]), bumped by a change.
    pub(crate) generation: Arc<AtomicU64>,
}

impl Shared {
    pub(crate) fn route(&self, token: ProgressToken, route: ProgressRoute) {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token, route);
    }

    pub(crate) fn unroute(&self, token: &ProgressToken) {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token);
    }

    pub(crate) fn mark_stale(&self) {
        self.tools_stale.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// The [`ClientHandler`] of one server connection.
pub(crate) struct KeelClient {
    pub(crate) server: String,
    pub(crate) workspace: PathBuf,
    pub(crate) shared: Arc<Shared>,
}

/// What keel says of itself in the handshake: its name and version, and the one capability it
/// has (`roots`, not changing during a connection).
pub(crate) fn client_config() -> ClientConfig {
    serde_json::from_value(serde_json::json!({
        "protocolVersion": rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
        "capabilities": {"roots": {"listChanged": false}},
        "clientInfo": {"name": "keel", "version": env!("CARGO_PKG_VERSION")},
    }))
    .unwrap_or_default()
}

/// The `file://` URI of `path` (absolute), with the characters RFC 3986 does not allow in a path
/// percent-encoded.
pub(crate) fn file_uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for byte in path.to_string_lossy().bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl ClientHandler for KeelClient {
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let name = self
            .workspace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "workspace".into());
        Ok(ListRootsResult::new(vec![
            Root::new(file_uri(&self.workspace)).with_name(name),
        ]))
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        tracing::info!(server = %self.server, "declined a sampling request");
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "keel declines sampling/createMessage: this client does not let MCP servers sample its model",
            None,
        ))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        tracing::info!(server = %self.server, "declined an elicitation request");
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "keel declines elicitation/create: this client does not ask its user for input on a server's behalf",
            None,
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let route = self
            .shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&params.progress_token)
            .cloned();
        let Some(route) = route else {
            return;
        };
        let amount = match params.total {
            Some(total) => format!("{}/{}", params.progress, total),
            None => params.progress.to_string(),
        };
        let text = match params.message {
            Some(message) => format!("progress {amount}: {message}"),
            None => format!("progress {amount}"),
        };
        route
            .sink
            .report(&route.call_id, ToolProgress::Status { text });
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(server = %self.server, "tool list changed");
        self.shared.mark_stale();
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::info!(server = %self.server, level = ?params.level, data = %params.data, "MCP server log");
    }

    fn get_info(&self) -> ClientConfig {
        client_config()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_encode_what_a_path_may_not_hold() {
        assert_eq!(file_uri(Path::new("/tmp/a b/c")), "file:///tmp/a%20b/c");
        assert_eq!(file_uri(Path::new("/w/é")), "file:///w/%C3%A9");
    }

    #[test]
    fn the_client_advertises_roots_only() {
        let config = serde_json::to_value(client_config()).unwrap();
        assert_eq!(
            config["capabilities"],
            serde_json::json!({"roots": {"listChanged": false}})
        );
        assert_eq!(config["clientInfo"]["name"], "keel");
    }
}
