//! MCP servers an ACP client passes (`session/new`, `session/load`) as Keel's
//! `[mcp_servers]` entries: they go into the session's release and run on keel-mcp, as the
//! configuration's do.
//!
//! ## The editor's `env` and `headers` values never reach the store
//! A stdio server's `env` values and an HTTP server's `headers` values are often tokens. The
//! release (journaled, stored) holds each as a placeholder, `keel-acp:withheld:<uuid>`; the
//! value stays in this process's memory ([`Withheld`]) and the servers start with it
//! ([`Unsealing`] puts the values back into the release the MCP pool is given). `session/load`
//! in the same process finds the values there; in a new process the editor passes its
//! `mcpServers` again on `session/load`, and a server of the session's release named like one
//! of them takes its values: the stored placeholder of that server and variable (or header) is
//! bound to the value the editor passes now, so the release, and the session, stay as they
//! were. A placeholder no value was passed for stays as it is (the server gets the placeholder
//! text, and fails to authenticate rather than get a stale token). The values are also secret
//! values of the sessions' redactors ([`Withheld::values`]): an event that would carry one (a
//! server printing its environment) carries `[REDACTED]`, and the session's sealed `secrets` row
//! keeps them, encrypted, for later processes' redactors.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol as acp;
use keel_mcp::McpServerConfig;
use keel_mcp::config::HeaderValueSpec;
use keel_tools::tool::{ToolProvider, ToolSource};
use serde_json::Value;

/// What a withheld value is stored as, before its id.
pub const PLACEHOLDER_PREFIX: &str = "keel-acp:withheld:";

/// The editor's `env` and `headers` values of this process, by placeholder.
#[derive(Debug, Default)]
pub struct Withheld {
    values: Mutex<HashMap<String, String>>,
}

/// Which part of a server entry a value belongs to.
#[derive(Debug, Clone, Copy)]
enum Field {
    Env,
    Headers,
}

impl Field {
    fn key(self) -> &'static str {
        match self {
            Field::Env => "env",
            Field::Headers => "headers",
        }
    }
}

impl Withheld {
    /// The placeholder of `value`, `field` `key` of server `server`: the one `pinned` (the
    /// session's stored servers, `session/load`) has there, bound to `value` now, else a new
    /// one.
    fn seal(
        &self,
        pinned: &BTreeMap<String, Value>,
        server: &str,
        field: Field,
        key: &str,
        value: String,
    ) -> String {
        let stored = pinned
            .get(server)
            .and_then(|s| s.get(field.key()))
            .and_then(|f| f.get(key))
            .and_then(Value::as_str)
            .filter(|p| p.starts_with(PLACEHOLDER_PREFIX));
        let placeholder = stored.map_or_else(
            || format!("{PLACEHOLDER_PREFIX}{}", uuid::Uuid::new_v4().simple()),
            str::to_owned,
        );
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(placeholder.clone(), value);
        placeholder
    }

    /// Every value this process holds: redacted from the sessions' events (and sealed in
    /// their `secrets` rows) as the configuration's secrets are — a server that prints its
    /// environment does not put them in the journal either.
    pub fn values(&self) -> Vec<String> {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// `servers` with every placeholder this process holds a value for replaced by the value.
    pub fn unseal(&self, servers: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
        let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = servers.clone();
        for server in out.values_mut() {
            for field in [Field::Env, Field::Headers] {
                let Some(Value::Object(map)) = server.get_mut(field.key()) else {
                    continue;
                };
                for v in map.values_mut() {
                    if let Some(real) = v.as_str().and_then(|p| values.get(p)) {
                        *v = Value::String(real.clone());
                    }
                }
            }
        }
        out
    }

    /// `release` as the MCP pool must see it: placeholders replaced by their values.
    pub fn unseal_release(&self, release: &keel_core::Release) -> keel_core::Release {
        let mut real = release.clone();
        real.definition.mcp_servers = self.unseal(&release.definition.mcp_servers);
        real
    }
}

/// A tool provider that gives the MCP pool each release with the editor's values put back
/// ([`Withheld::unseal`]).
pub struct Unsealing {
    /// The pool.
    pub inner: Arc<dyn ToolProvider>,
    /// The values.
    pub withheld: Arc<Withheld>,
}

#[async_trait::async_trait]
impl ToolProvider for Unsealing {
    async fn sources(
        &self,
        release: &keel_core::Release,
        workspace: &Path,
    ) -> (Vec<Arc<dyn ToolSource>>, Vec<String>) {
        let real = self.withheld.unseal_release(release);
        self.inner.sources(&real, workspace).await
    }
}

/// Keel's MCP server entry for the `index`th server the client passes (stdio and streamable
/// HTTP; the same keel-mcp client as `[mcp_servers]`), its `env` and `headers` values as
/// placeholders ([`Withheld`]; `pinned`: the session's stored servers on `session/load`, empty
/// on `session/new`).
///
/// # Errors
/// Invalid params naming `mcpServers[index]`: a transport Keel does not speak (SSE), or an
/// entry keel-mcp refuses (a bad name, an empty command, a URL that is not http(s)).
pub fn mcp_entry(
    withheld: &Withheld,
    pinned: &BTreeMap<String, Value>,
    index: usize,
    server: acp::McpServer,
) -> Result<(String, McpServerConfig), acp::Error> {
    let invalid = |what: String| {
        super::agent::invalid(
            Some(&format!("mcpServers[{index}]")),
            format!("keel acp: mcpServers[{index}]: {what}"),
        )
    };
    let (name, entry) = match server {
        acp::McpServer::Stdio(s) => {
            let env = s
                .env
                .into_iter()
                .map(|v| {
                    let sealed = withheld.seal(pinned, &s.name, Field::Env, &v.name, v.value);
                    (v.name, sealed)
                })
                .collect();
            let entry = McpServerConfig {
                command: Some(s.command.to_string_lossy().into_owned()),
                args: s.args,
                env,
                ..McpServerConfig::default()
            };
            (s.name, entry)
        }
        acp::McpServer::Http(h) => {
            let headers = h
                .headers
                .into_iter()
                .map(|v| {
                    let sealed = withheld.seal(pinned, &h.name, Field::Headers, &v.name, v.value);
                    (v.name, HeaderValueSpec::Plain(sealed))
                })
                .collect();
            let entry = McpServerConfig {
                url: Some(h.url),
                headers,
                ..McpServerConfig::default()
            };
            (h.name, entry)
        }
        other => {
            return Err(invalid(format!(
                "MCP transport not supported (stdio and http are): {other:?}"
            )));
        }
    };
    entry.validate(&name).map_err(|e| invalid(e.to_string()))?;
    Ok((name, entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio(name: &str, env: &[(&str, &str)]) -> acp::McpServer {
        serde_json::from_value(json!({
            "name": name, "command": "srv", "args": [],
            "env": env.iter().map(|(n, v)| json!({"name": n, "value": v})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    /// The entry holds placeholders; unsealing gives the values back; a later load (a new
    /// process: a new `Withheld`) binds the stored placeholders to the values passed again.
    #[test]
    fn env_and_header_values_are_placeholders_bound_in_memory() {
        let w = Withheld::default();
        let (name, entry) = mcp_entry(
            &w,
            &BTreeMap::new(),
            0,
            stdio("gh", &[("GITHUB_TOKEN", "ghp_secret_value")]),
        )
        .unwrap();
        let stored = entry.env["GITHUB_TOKEN"].clone();
        assert!(stored.starts_with(PLACEHOLDER_PREFIX), "{stored}");
        let servers: BTreeMap<String, Value> =
            [(name.clone(), serde_json::to_value(&entry).unwrap())].into();
        assert!(
            !serde_json::to_string(&servers)
                .unwrap()
                .contains("ghp_secret_value")
        );
        assert_eq!(
            w.unseal(&servers)["gh"]["env"]["GITHUB_TOKEN"],
            "ghp_secret_value"
        );

        let http: acp::McpServer = serde_json::from_value(json!({
            "type": "http", "name": "docs", "url": "https://docs.example/mcp",
            "headers": [{"name": "Authorization", "value": "Bearer tok_123456"}],
        }))
        .unwrap();
        let (_, h) = mcp_entry(&w, &BTreeMap::new(), 1, http).unwrap();
        let HeaderValueSpec::Plain(p) = &h.headers["Authorization"] else {
            panic!("plain")
        };
        assert!(p.starts_with(PLACEHOLDER_PREFIX));

        let fresh = Withheld::default();
        let (_, again) = mcp_entry(
            &fresh,
            &servers,
            0,
            stdio("gh", &[("GITHUB_TOKEN", "ghp_rotated_value")]),
        )
        .unwrap();
        assert_eq!(
            again.env["GITHUB_TOKEN"], stored,
            "the release stays the same"
        );
        assert_eq!(
            fresh.unseal(&servers)["gh"]["env"]["GITHUB_TOKEN"],
            "ghp_rotated_value"
        );
        // A placeholder this process holds no value for stays as it is.
        assert_eq!(Withheld::default().unseal(&servers), servers);
    }

    #[test]
    fn a_bad_entry_is_invalid_params_naming_the_field() {
        let e = mcp_entry(
            &Withheld::default(),
            &BTreeMap::new(),
            2,
            stdio("a__b", &[]),
        )
        .unwrap_err();
        assert_eq!(e.code, acp::ErrorCode::InvalidParams);
        assert_eq!(e.data.unwrap()["field"], "mcpServers[2]");
    }
}
