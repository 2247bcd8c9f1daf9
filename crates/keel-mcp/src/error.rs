//! The crate's one error type: what goes wrong configuring, starting or talking to a server.
//! A failed tool *call* is not an error of this type: it becomes a
//! [`keel_tools::ToolOutput`] the model reads.

/// Everything that can go wrong in `keel-mcp` that is the caller's concern.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A `[mcp_servers.NAME]` entry is wrong.
    #[error("[mcp_servers.{server}]: {message}")]
    Config {
        /// The server's name.
        server: String,
        /// What is wrong and what is expected.
        message: String,
    },
    /// The server could not be started or connected, or its handshake or tool listing failed.
    #[error("MCP server `{server}` did not start: {message}")]
    Start {
        /// The server's name.
        server: String,
        /// What failed (with the end of its standard error, for a command).
        message: String,
    },
    /// The server did not finish its handshake and tool listing within its startup bound.
    #[error(
        "MCP server `{server}` did not answer its handshake and tool listing within {timeout_ms} ms (startup_timeout_ms)"
    )]
    StartupTimeout {
        /// The server's name.
        server: String,
        /// The bound, milliseconds.
        timeout_ms: u64,
    },
    /// The server is configured with `enabled = false`.
    #[error("MCP server `{server}` is disabled (enabled = false)")]
    Disabled {
        /// The server's name.
        server: String,
    },
}

impl McpError {
    pub(crate) fn config(server: &str, message: impl Into<String>) -> Self {
        Self::Config {
            server: server.to_owned(),
            message: message.into(),
        }
    }

    pub(crate) fn start(server: &str, message: impl Into<String>) -> Self {
        Self::Start {
            server: server.to_owned(),
            message: message.into(),
        }
    }
}
