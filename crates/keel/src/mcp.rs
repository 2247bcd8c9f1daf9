//! MCP servers in the `keel` binary: the servers of a run (`[mcp_servers]` of the effective
//! configuration, started before the first step, their tools added to the registry, shut down
//! when the command ends), `keel mcp list`, and `keel mcp test-client`, the small client the
//! MCP conformance suite drives (`.ci/mcp-conformance.sh`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use keel_core::Release;
use keel_mcp::{McpManager, McpPool, McpServerConfig};
use keel_tools::ToolRegistry;
use serde_json::{Map, Value, json};

use crate::config::Config;

/// Pools started by this process, shut down by [`shutdown_all`].
static STARTED: Mutex<Vec<Arc<McpPool>>> = Mutex::new(Vec::new());

/// The provider of `release`'s MCP tools (`AgentDefinition::mcp_servers`, which a local run
/// takes from `[mcp_servers]` of the effective configuration), its servers started now in the
/// workspace, each bounded by its startup timeout; a server that does not start is a notice on
/// standard error and its tools are left out. `None` when the release names no server.
///
/// # Errors
/// A bad server entry (checked when the configuration was loaded, so only for a stored
/// release made elsewhere).
pub async fn provider(config: &Config, release: &Release) -> anyhow::Result<Option<Arc<McpPool>>> {
    let servers = &release.definition.mcp_servers;
    if servers.is_empty() {
        return Ok(None);
    }
    let pool = Arc::new(McpPool::new(crate::run::withheld_env(config), true));
    let workspace = keel_tools::workspace::Workspace::new(&config.workspace)
        .map(|w| w.root().to_owned())
        .unwrap_or_else(|_| config.workspace.clone());
    let (_, notices) = pool.manager(servers, &workspace).await?;
    for notice in notices {
        eprintln!("keel: note: {notice}");
    }
    STARTED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(pool.clone());
    Ok(Some(pool))
}

/// Shuts down every MCP server this process started (stdio: close stdin, SIGTERM, SIGKILL).
pub async fn shutdown_all() {
    let pools = std::mem::take(&mut *STARTED.lock().unwrap_or_else(PoisonError::into_inner));
    for pool in pools {
        pool.shutdown().await;
    }
}

/// `keel mcp list`: every configured server, started, with its state and tools.
///
/// # Errors
/// A bad `[mcp_servers]` entry; the async runtime failing to start.
pub fn list(config: &Config, json_out: bool) -> anyhow::Result<ExitCode> {
    let servers = &config.merged.mcp_servers;
    let rt = crate::cli::tokio_runtime()?;
    rt.block_on(async {
        let manager = McpManager::new(
            servers,
            &config.workspace,
            &crate::run::withheld_env(config),
        )?;
        let notices = manager.start().await;
        let status = manager.status().await;
        manager.shutdown().await;
        if json_out {
            for server in &status {
                println!("{}", serde_json::to_string(server)?);
            }
            return Ok(ExitCode::SUCCESS);
        }
        if status.is_empty() {
            println!("no MCP servers configured ([mcp_servers.NAME] in keel.toml)");
        }
        for server in &status {
            let state = serde_json::to_value(&server.state)?;
            let detail = state
                .get("protocol")
                .or_else(|| state.get("reason"))
                .and_then(Value::as_str)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            println!(
                "{}  {}  {}{detail}",
                server.name,
                server.transport,
                state["state"].as_str().unwrap_or_default()
            );
            for tool in &server.tools {
                let effect = serde_json::to_value(tool.effect)?;
                println!("  {}  [{}]", tool.name, effect.as_str().unwrap_or_default());
            }
        }
        for notice in notices {
            eprintln!("keel: note: {notice}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Arguments a schema's required properties get from `keel mcp test-client`: a value of the
/// declared type (numbers 1, strings "keel", booleans true, arrays and objects empty).
fn sample_arguments(schema: &Value) -> Map<String, Value> {
    let mut args = Map::new();
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        let value = match schema["properties"][name]["type"].as_str() {
            Some("number" | "integer") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("keel"),
        };
        args.insert(name.to_owned(), value);
    }
    args
}

/// `keel mcp test-client URL --protocol P`: connects to the MCP server at `url` (streamable HTTP) as a run
/// does, calls each of its tools once with sample arguments, prints each result and shuts the
/// connection down. Exit status 1 when the server cannot be started. The MCP conformance
/// suite's client scenarios run it (they pass the URL last).
///
/// # Errors
/// The async runtime failing to start.
pub fn test_client(config: &Config, url: &str, protocol: &str) -> anyhow::Result<ExitCode> {
    let protocol: keel_mcp::config::Protocol =
        serde_json::from_value(json!(protocol)).map_err(|_| {
            crate::exit::UsageError(format!(
                "--protocol {protocol:?}: expected auto, session or sessionless"
            ))
        })?;
    let rt = crate::cli::tokio_runtime()?;
    rt.block_on(async {
        let servers: BTreeMap<String, McpServerConfig> = [(
            "test".to_owned(),
            McpServerConfig {
                url: Some(url.to_owned()),
                protocol: Some(protocol),
                ..McpServerConfig::default()
            },
        )]
        .into();
        let manager = McpManager::new(
            &servers,
            &config.workspace,
            &crate::run::withheld_env(config),
        )?;
        let notices = manager.start().await;
        if let Some(notice) = notices.first() {
            eprintln!("keel: {notice}");
            return Ok(ExitCode::FAILURE);
        }
        let (registry, left_out) = manager.extend(&ToolRegistry::new()).await;
        for notice in left_out {
            eprintln!("keel: note: {notice}");
        }
        let ctx = test_context(config)?;
        for spec in registry.specs() {
            let call = keel_tools::ToolCallRequest {
                call_id: format!("call_{}", spec.name),
                name: spec.name.clone(),
                arguments: Value::Object(sample_arguments(&spec.input_schema)),
            };
            match registry.validate(&call) {
                Ok(valid) => {
                    let result = registry.execute(&valid, &ctx).await;
                    println!("{}: {:?}: {}", spec.name, result.status, result.content);
                }
                Err(rejected) => println!("{}: {}", spec.name, rejected.content),
            }
        }
        manager.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// A tool context for `keel mcp test-client` (no sandboxed tool runs; artifacts in a temp dir).
fn test_context(config: &Config) -> anyhow::Result<keel_tools::ToolContext> {
    let artifacts =
        std::env::temp_dir().join(format!("keel-mcp-test-client-{}", std::process::id()));
    Ok(keel_tools::ToolContext {
        call_id: String::new(),
        cancel: tokio_util::sync::CancellationToken::new(),
        progress: Arc::new(keel_tools::tool::NoProgress),
        workspace: keel_tools::workspace::Workspace::new(&config.workspace)?,
        sandbox: keel_tools::sandbox::Sandbox::new(keel_tools::sandbox::SandboxMode::Off)?,
        artifacts: Arc::new(keel_tools::artifact::FsArtifactSink::new(artifacts)),
        snapshot: Arc::new(keel_tools::tool::StepSnapshot::default()),
        limits: keel_tools::tool::ToolLimits::default(),
        hash_key: keel_tools::keyed_hash::HashKey::derive(b"keel mcp test-client", "test"),
        scope: None,
        session: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_arguments_fill_required_properties_by_type() {
        let schema = json!({"type": "object", "required": ["a", "b", "c"], "properties": {
            "a": {"type": "number"}, "b": {"type": "string"}, "c": {"type": "boolean"},
            "d": {"type": "string"}}});
        assert_eq!(
            Value::Object(sample_arguments(&schema)),
            json!({"a": 1, "b": "keel", "c": true})
        );
    }
}
