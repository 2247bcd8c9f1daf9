//! `[mcp_servers.NAME]`: how to reach one MCP server (a command on stdio, or a streamable HTTP
//! URL), as written in `keel.toml` or a release definition.
//!
//! ```toml
//! [mcp_servers.git]
//! command = "uvx"
//! args = ["mcp-server-git", "--repository", "."]
//! env = { GIT_AUTHOR_NAME = "keel" }        # set in the server's environment
//! env_vars = ["GITHUB_TOKEN"]               # passed through from keel's own environment
//! startup_timeout_ms = 10000                # handshake + tool listing (default 10 s)
//! tool_timeout_ms = 60000                   # per call (default: the session's tool timeout)
//!
//! [mcp_servers.docs]
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = { env = "DOCS_TOKEN", prefix = "Bearer " }, X-Team = "core" }
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::McpError;

/// Default bound on a server's start: spawn or connect, handshake and first tool listing.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u64 = 10_000;

/// One HTTP header value: written literally, or read from an environment variable when the
/// server is connected (so the secret never sits in the file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderValueSpec {
    /// A literal value.
    Plain(String),
    /// The value of environment variable `env`, after `prefix` (e.g. `"Bearer "`).
    FromEnv {
        /// The environment variable holding the value.
        env: String,
        /// Text put before the variable's value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prefix: Option<String>,
    },
}

impl std::fmt::Debug for HeaderValueSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plain(_) => f.write_str("Plain(..)"),
            Self::FromEnv { env, .. } => write!(f, "FromEnv({env})"),
        }
    }
}

/// Which protocol revision to speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Probe with the sessionless revision's `server/discover` (2026-07-28) and fall back to
    /// the session-based `initialize` when the server does not know it. The default.
    #[default]
    Auto,
    /// Only the session-based revision (`initialize`, 2025-11-25 and older).
    Session,
    /// Only the sessionless revision (`server/discover`, 2026-07-28).
    Sessionless,
}

/// How to reach one MCP server. Exactly one of `command` (stdio) and `url` (streamable HTTP).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Program to spawn (looked up in `PATH`); it speaks MCP on its standard input and output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables set in the server's environment (on top of keel's scrubbed environment).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of keel's own variables passed through the scrub (e.g. `GITHUB_TOKEN`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_vars: Vec<String>,
    /// Streamable HTTP endpoint (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, HeaderValueSpec>,
    /// Bound on start (spawn/connect, handshake, tool listing), milliseconds. Default 10,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_ms: Option<u64>,
    /// Bound on one tool call, milliseconds. Default: the session's tool timeout; the lower of
    /// the two applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout_ms: Option<u64>,
    /// Protocol revision: `auto` (default), `session` or `sessionless`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// `false`: configured but not started. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// The transport a server config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport<'a> {
    /// Spawn `command` with `args`, speak over its standard input and output.
    Stdio {
        /// The program.
        command: &'a str,
        /// Its arguments.
        args: &'a [String],
    },
    /// Streamable HTTP at `url`.
    Http {
        /// The endpoint.
        url: &'a str,
    },
}

/// Whether `name` can name a server: `[a-zA-Z0-9_-]{1,32}` without `__` (the separator of
/// `mcp__<server>__<tool>`) and not ending in `_` (server `a_`'s tool `y` and server `a`'s
/// tool `_y` would both be `mcp__a___y`, and a rule `mcp__a__*` would match `a_`'s tools).
pub fn is_valid_server_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.contains("__")
        && !name.ends_with('_')
}

/// Whether `name` is a plausible environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl McpServerConfig {
    /// Whether the server is to be started.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The startup bound in milliseconds.
    pub fn startup_timeout_ms(&self) -> u64 {
        self.startup_timeout_ms
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT_MS)
    }

    /// The transport, assuming [`McpServerConfig::validate`] passed.
    ///
    /// # Errors
    /// [`McpError::Config`] when neither or both of `command` and `url` are set.
    pub fn transport(&self, name: &str) -> Result<Transport<'_>, McpError> {
        match (&self.command, &self.url) {
            (Some(command), None) => Ok(Transport::Stdio {
                command,
                args: &self.args,
            }),
            (None, Some(url)) => Ok(Transport::Http { url }),
            (Some(_), Some(_)) => Err(McpError::config(
                name,
                "set either `command` (stdio) or `url` (streamable HTTP), not both",
            )),
            (None, None) => Err(McpError::config(
                name,
                "set `command` (a program speaking MCP on stdio) or `url` (a streamable HTTP endpoint)",
            )),
        }
    }

    /// Checks the server named `name`: a valid name, one transport, options that fit it.
    ///
    /// # Errors
    /// [`McpError::Config`] naming the server, the key and what is expected.
    pub fn validate(&self, name: &str) -> Result<(), McpError> {
        if !is_valid_server_name(name) {
            return Err(McpError::config(
                name,
                "server names are 1-32 characters of [a-zA-Z0-9_-] without `__`, not ending in `_` (tools appear as mcp__<server>__<tool>)",
            ));
        }
        match self.transport(name)? {
            Transport::Stdio { command, .. } => {
                if command.trim().is_empty() {
                    return Err(McpError::config(name, "`command` is empty"));
                }
                if !self.headers.is_empty() {
                    return Err(McpError::config(
                        name,
                        "`headers` apply to `url` servers only; a `command` server gets `env`/`env_vars`",
                    ));
                }
            }
            Transport::Http { url } => {
                let rest = url
                    .strip_prefix("http://")
                    .or_else(|| url.strip_prefix("https://"));
                let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
                if !matches!(host, Some(h) if !h.is_empty()) || url.contains(char::is_whitespace) {
                    return Err(McpError::config(
                        name,
                        format!(
                            "`url` {url:?} is not an http:// or https:// URL with a host, e.g. http://127.0.0.1:3001/mcp"
                        ),
                    ));
                }
                if !self.args.is_empty() || !self.env.is_empty() || !self.env_vars.is_empty() {
                    return Err(McpError::config(
                        name,
                        "`args`, `env` and `env_vars` apply to `command` servers only",
                    ));
                }
            }
        }
        for var in self.env.keys().chain(&self.env_vars) {
            if !is_env_name(var) {
                return Err(McpError::config(
                    name,
                    format!("{var:?} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                ));
            }
        }
        for (header, value) in &self.headers {
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(McpError::config(
                    name,
                    format!("{header:?} is not an HTTP header name"),
                ));
            }
            if let HeaderValueSpec::FromEnv { env, .. } = value
                && !is_env_name(env)
            {
                return Err(McpError::config(
                    name,
                    format!(
                        "header {header}: {env:?} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
                    ),
                ));
            }
        }
        for (key, value) in [
            ("startup_timeout_ms", self.startup_timeout_ms),
            ("tool_timeout_ms", self.tool_timeout_ms),
        ] {
            if value == Some(0) {
                return Err(McpError::config(
                    name,
                    format!("`{key}` must be 1 or more milliseconds"),
                ));
            }
        }
        Ok(())
    }
}

/// Checks every server of a `[mcp_servers]` table.
///
/// # Errors
/// The first [`McpError::Config`].
pub fn validate_servers(servers: &BTreeMap<String, McpServerConfig>) -> Result<(), McpError> {
    servers
        .iter()
        .try_for_each(|(name, server)| server.validate(name))
}

/// The servers of a release (`AgentDefinition::mcp_servers`: JSON objects in the
/// `[mcp_servers.NAME]` shape), parsed and checked.
///
/// # Errors
/// [`McpError::Config`] naming the first server that does not parse (an unknown key, a wrong
/// type) or does not pass [`McpServerConfig::validate`].
pub fn release_servers(
    servers: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, McpServerConfig>, McpError> {
    let parsed = servers
        .iter()
        .map(|(name, value)| {
            serde_json::from_value::<McpServerConfig>(value.clone())
                .map(|config| (name.clone(), config))
                .map_err(|e| McpError::config(name, e.to_string()))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    validate_servers(&parsed)?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BTreeMap<String, McpServerConfig>, String> {
        #[derive(Deserialize)]
        struct File {
            mcp_servers: BTreeMap<String, McpServerConfig>,
        }
        let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
        validate_servers(&file.mcp_servers).map_err(|e| e.to_string())?;
        Ok(file.mcp_servers)
    }

    #[test]
    fn release_servers_parse_and_name_the_bad_one() {
        let ok = BTreeMap::from([(
            "git".to_owned(),
            serde_json::json!({"command": "mcp-server-git", "startup_timeout_ms": 5000}),
        )]);
        assert_eq!(
            release_servers(&ok).unwrap()["git"].command.as_deref(),
            Some("mcp-server-git")
        );
        let unknown_key = BTreeMap::from([(
            "docs".to_owned(),
            serde_json::json!({"url": "https://x.example/mcp", "token": "t"}),
        )]);
        let e = release_servers(&unknown_key).unwrap_err().to_string();
        assert!(e.contains("docs") && e.contains("token"), "{e}");
        let neither = BTreeMap::from([("empty".to_owned(), serde_json::json!({}))]);
        let e = release_servers(&neither).unwrap_err().to_string();
        assert!(e.contains("empty") && e.contains("command"), "{e}");
    }

    #[test]
    fn stdio_and_http_servers_parse() {
        let servers = parse(
            r#"{"mcp_servers": {
                "git": {"command": "uvx", "args": ["mcp-server-git"], "env_vars": ["GITHUB_TOKEN"]},
                "docs": {"url": "https://mcp.example.com/mcp",
                         "headers": {"Authorization": {"env": "DOCS_TOKEN", "prefix": "Bearer "}, "X-Team": "core"}}
            }}"#,
        )
        .unwrap();
        assert_eq!(
            servers["git"].transport("git").unwrap(),
            Transport::Stdio {
                command: "uvx",
                args: &["mcp-server-git".to_owned()]
            }
        );
        assert_eq!(
            servers["docs"].headers["Authorization"],
            HeaderValueSpec::FromEnv {
                env: "DOCS_TOKEN".into(),
                prefix: Some("Bearer ".into())
            }
        );
        assert_eq!(servers["git"].startup_timeout_ms(), 10_000);
    }

    #[test]
    fn bad_servers_are_refused_with_the_reason() {
        let cases = [
            (r#"{"a__b": {"command": "x"}}"#, "without `__`"),
            (r#"{"s": {}}"#, "set `command`"),
            (r#"{"s": {"command": "x", "url": "http://h"}}"#, "not both"),
            (r#"{"s": {"url": "ftp://h"}}"#, "not an http://"),
            (
                r#"{"s": {"url": "http://h", "args": ["a"]}}"#,
                "`command` servers only",
            ),
            (
                r#"{"s": {"command": "x", "headers": {"A": "b"}}}"#,
                "`url` servers only",
            ),
            (
                r#"{"s": {"command": "x", "env_vars": ["A-B"]}}"#,
                "environment variable name",
            ),
            (
                r#"{"s": {"command": "x", "startup_timeout_ms": 0}}"#,
                "1 or more",
            ),
            (
                r#"{"s": {"command": "x", "colour": "red"}}"#,
                "unknown field",
            ),
            (
                r#"{"s": {"command": "x", "protocol": "v9"}}"#,
                "unknown variant",
            ),
        ];
        for (servers, expected) in cases {
            let err = parse(&format!(r#"{{"mcp_servers": {servers}}}"#)).unwrap_err();
            assert!(err.contains(expected), "{servers}: {err}");
        }
    }
}
