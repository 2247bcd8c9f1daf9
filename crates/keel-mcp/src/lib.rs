//! # keel-mcp — MCP servers' tools behind keel's Tool trait
//!
//! **Owns:** the MCP client, on the official `rmcp` crate: starting, restarting and shutting
//! down configured servers (stdio and streamable HTTP), the handshake in whichever protocol
//! revision the server speaks, tool listing and list changes, the names the model sees, and
//! one [`keel_tools::Tool`] per MCP tool ([`tool::McpTool`]), so that MCP calls take the same
//! path as built-in ones: validation, policy, approval, journal, budget, cancellation. The turn
//! loop has no MCP branch.
//!
//! **Must not touch:** the journal, sessions or turns (`keel-runtime`), policy decisions
//! (`keel_tools::policy` — which gives MCP tools no read-only auto-allow whatever their hints),
//! or configuration files (the `keel` binary reads `[mcp_servers]` and hands the tables here).
//!
//! ## Layout
//! - [`config`] — `McpServerConfig` (`[mcp_servers.NAME]`): command/args/env/env_vars or
//!   url/headers, timeouts; `validate`.
//! - [`naming`] — `tool_name`: `mcp__<server>__<tool>` fitted to `^[a-zA-Z0-9_-]{1,64}$`.
//! - [`server`] — `McpServer`: connection, restart after death, tool list, `call`, shutdown.
//! - [`handler`] — what keel answers a server: roots, declined sampling and elicitation,
//!   progress, list changes.
//! - [`tool`] — `McpTool`: strict schema, effect class from hints, per-call timeout.
//! - [`result`] — `map_result`: text, images, resource links, structured content, `isError`.
//! - [`manager`] — `McpManager`: every server, started together; tools for a registry;
//!   `keel mcp list`'s status.
//! - [`error`] — `McpError`.
//!
//! Start reading at [`manager::McpManager`] and [`server::McpServer::call`].

pub mod config;
pub mod error;
pub mod handler;
pub mod manager;
pub mod naming;
pub mod pool;
pub mod result;
pub mod server;
pub mod tool;

pub use config::McpServerConfig;
pub use error::McpError;
pub use manager::McpManager;
pub use pool::McpPool;
pub use server::{McpServer, ServerState};
pub use tool::McpTool;
