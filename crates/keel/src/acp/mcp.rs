//! MCP servers an ACP client passes (`session/new`, `session/load`) as Keel's
//! `[mcp_servers]` entries: they go into the session's release and run on keel-mcp, as the
//! configuration's do.

use agent_client_protocol as acp;
use keel_mcp::McpServerConfig;
use keel_mcp::config::HeaderValueSpec;
use serde_json::json;

/// Keel's MCP server entry for one the client passes (stdio and streamable HTTP; the same
/// keel-mcp client as `[mcp_servers]`).
pub fn mcp_entry(server: acp::McpServer) -> Result<(String, McpServerConfig), acp::Error> {
    match server {
        acp::McpServer::Stdio(s) => Ok((
            s.name,
            McpServerConfig {
                command: Some(s.command.to_string_lossy().into_owned()),
                args: s.args,
                env: s.env.into_iter().map(|v| (v.name, v.value)).collect(),
                ..McpServerConfig::default()
            },
        )),
        acp::McpServer::Http(h) => Ok((
            h.name,
            McpServerConfig {
                url: Some(h.url),
                headers: h
                    .headers
                    .into_iter()
                    .map(|h| (h.name, HeaderValueSpec::Plain(h.value)))
                    .collect(),
                ..McpServerConfig::default()
            },
        )),
        other => Err(acp::Error::invalid_params().data(json!(format!(
            "keel acp: MCP transport not supported (stdio and http are): {other:?}"
        )))),
    }
}
