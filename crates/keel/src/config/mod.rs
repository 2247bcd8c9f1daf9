//! Configuration: `keel.toml` in the user config directory, then in the workspace, then
//! command-line flags, each layer overriding the one before (tables merge key by key, any other
//! value — arrays included — is replaced whole; except that the workspace file's policy rules
//! are added to the user's, never replacing them).
//!
//! The workspace's `keel.toml` comes with the repository and is not trusted: it may only
//! tighten (stricter modes and sandbox, lower budgets and timeouts, fewer tools, more `deny` and
//! `ask` rules), unless the user config lists the workspace in `trusted_workspaces` (`keel
//! trust`, [`crate::trust`]). Some keys are never taken from a workspace file, trusted or not:
//! `[providers]`, `base_url` (and a model spec carrying `@URL`), `store`, `[env]`,
//! `sandbox_network` and `trusted_workspaces`. A looser or forbidden value stops the command
//! before anything runs ([`ConfigError::Untrusted`], naming the file, the key and how to accept
//! it); what needs trust and is merely not granted — `allow` rules, `[hooks]` (they run code),
//! `[mcp_servers]` (it starts programs), `[memory]` (facts kept across sessions), `[agents]`,
//! `[subagents]` and `.keel/agents/*.md` — is dropped with a notice
//! ([`Config::notices`]). A trusted workspace's hooks run after the user's.
//! docs/SECURITY.md has the table, key by key.
//!
//! ```toml
//! model = "openai:gpt-5"                   # primary: openai:M, openai-responses:M, anthropic:M, script:PATH
//! fallback_models = ["anthropic:claude-sonnet-4-5"]
//! base_url = "http://127.0.0.1:8080/v1"    # OpenAI-compatible server for openai: models
//! instructions = "You are a careful coding agent."
//! context_window = 128000                 # tokens; default: the model's known window
//! permission_mode = "default"              # default | accept_edits | read_only | bypass
//! sandbox = "workspace_write"              # off | read_only | workspace_write
//! sandbox_network = false                  # true: confined commands get the host's IP network (user config / --sandbox-network only)
//! output = "text"                          # text | jsonl
//! keep_reasoning = false                   # true: journal the model's reasoning (redacted)
//! store = "sqlite:///home/me/.local/share/keel/keel.db"   # or postgres://…
//! trusted_workspaces = [{ path = "/home/me/src/keel", keel_toml = "sha256:…" }]  # user config only (`keel trust`)
//!
//! [budget]                                 # per turn
//! max_steps = 50
//! max_cost_usd = 2.0
//! max_tokens = 2_000_000
//! max_tool_calls = 200
//! timeout = "15m"                          # 500ms, 30s, 15m, 2h or plain seconds
//!
//! [timeouts]                               # durations as in [budget] timeout
//! tool = "10m"                             # every tool call (default 10m); a shell timeout_ms above it is lowered to it
//! first_token = "2m"                       # a step's model call until its first token, retries included (default: none)
//! model_total = "20m"                      # a step's model call from start to end, retries included (default: none)
//! stream_idle = "60s"                      # longest silence mid-response, then a retryable timeout (default 60s)
//!
//! [tools]
//! enabled = ["read_file", "edit_file", "shell"]   # default: every built-in tool
//!
//! [policy]
//! allow = ["shell(cargo test *)"]
//! ask = ["shell(git push *)"]
//! deny = ["read_file(./secrets/**)"]
//!
//! [providers.openai]                       # openai, openai-responses, anthropic
//! api_key_env = "MY_OPENAI_KEY"            # where to read the key (default OPENAI_API_KEY)
//!
//! [hooks]                                  # see keel_runtime::hooks; a workspace's only when trusted
//! max_stop_continues = 3                   # stop hooks may make a turn continue this often
//! [[hooks.pre_tool_use]]                   # also session_start, user_prompt_submit, permission_request,
//! name = "guard"                           #   post_tool_use, pre_compact, stop
//! matcher = "shell"                        # glob on tool names (tool events only)
//! command = "./scripts/guard.sh"           # or url = "https://hooks.example/keel"
//! timeout_ms = 60000
//! fail_closed = true
//! [mcp_servers.git]                       # tools mcp__git__*; user config, or a trusted workspace
//! command = "mcp-server-git"               # stdio: command, args, env, env_vars
//! args = ["--repository", "."]
//! [mcp_servers.docs]                       # streamable HTTP: url, headers (values from env vars)
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = { env = "DOCS_TOKEN", prefix = "Bearer " } }
//!
//! [agents.reviewer]                        # spawn_agent's agents; a workspace's (and its
//! instructions = "Review the change."      #   .keel/agents/NAME.md files) only when trusted
//! tools = ["read_file", "grep"]            # default: every tool
//! model = "anthropic:claude-sonnet-4-5"    # default: the session's route
//! [subagents]
//! max_depth = 3                            # default 3
//! max_concurrent = 8                       # running children per session (default 8)
//! max_descendants = 32                     # live agents below one top-level session (default 32)
//! [memory]                                 # long-term memory tools; a workspace's only when trusted
//! enabled = true                           # memory_read, memory_write, memory_search (default false)
//! namespace = "agent"                      # agent (default) | user | shared
//! max_value_bytes = 65536                  # largest value, bytes of JSON (default 64 KiB)
//!
//! [env]                                    # set in every tool process (user config only)
//! RUST_LOG = "info"
//! DATABASE_URL = { value = "postgres://u:pw@h/db", secret = true }
//! GITHUB_TOKEN = {}                        # no value: pass keel's own GITHUB_TOKEN through
//! ```
//!
//! [`mask_secrets`] hides every value whose key names a key, token, secret or password (except
//! counts such as `max_tokens`), every `[env]` value marked `secret = true`, and passwords inside
//! URLs; `keel config show` prints the result.
//!
//! `[env]` sets environment variables of every tool process (`shell` commands). Tools get keel's
//! own environment minus every variable named like a secret (`KEY`, `SECRET`, `TOKEN`,
//! `PASSWORD`) and every provider key; an `[env]` entry with a value sets it, an entry without
//! one (`NAME = {}`, `NAME = { secret = true }`) passes keel's own value of `NAME` through the
//! scrub. The names of secret entries (marked, or named like a secret) become the session's
//! `secret_env` and their values are redacted from events and transcripts. `[env]` is read from
//! the user config only (a workspace file may not set it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_core::Budget;
use keel_tools::policy::PermissionMode;
use keel_tools::sandbox::SandboxMode;
use serde::{Deserialize, Serialize};

mod agents;
mod load;
mod parse;
mod secrets;
mod validate;
mod workspace;

pub use agents::*;
pub use parse::*;
pub use secrets::*;
pub use validate::*;
#[allow(unused_imports)]
use workspace::*;

/// The file name looked for in the user config directory and the workspace.
pub const CONFIG_FILE: &str = "keel.toml";

/// What a masked secret is replaced with.
pub const MASK: &str = "********";

/// Why the configuration could not be built. Each variant names the file or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A config file exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A config file is not valid TOML.
    #[error("{path} is not valid TOML: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A field has the wrong type or an unknown name.
    #[error("invalid configuration ({sources}): {message}")]
    Invalid {
        /// The layers that were merged.
        sources: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of its domain.
    #[error("invalid {field} {value:?}: {expected}")]
    Value {
        /// The field (`permission_mode`, `budget.timeout`, …).
        field: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The workspace directory does not exist.
    #[error(
        "workspace {0} does not exist or is not a directory (create it or pass an existing one with --workspace)"
    )]
    NoWorkspace(PathBuf),
    /// A value in one file is wrong; the message says what is accepted.
    #[error("{path}: {message}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// The workspace's `keel.toml` (untrusted: it comes with the repository) loosens a safety
    /// setting; the message names the file, the setting and how to accept it.
    #[error("{0}")]
    Untrusted(String),
    /// An `[mcp_servers.NAME]` entry is wrong (names the server, the key and what is expected).
    #[error("{0}")]
    Mcp(#[from] keel_mcp::McpError),
    /// A name that is not one of the known ones.
    #[error("unknown {field} entry {value:?}: known are {known}")]
    Unknown {
        /// The field (`tools.enabled`).
        field: &'static str,
        /// The unknown name.
        value: String,
        /// The known names.
        known: String,
    },
    /// A policy rule does not parse.
    #[error("{message}")]
    Rule {
        /// The parser's message (names the rule).
        message: String,
    },
    /// No user data directory is known (no `$HOME`, no `$XDG_DATA_HOME`).
    #[error("no data directory for the default store: set $XDG_DATA_HOME or pass --store")]
    NoDataDir,
    /// No user config directory is known (no `$HOME`, no `$XDG_CONFIG_HOME`): `keel trust` has
    /// nowhere to write.
    #[error("no user config directory: set $XDG_CONFIG_HOME (or $HOME)")]
    NoConfigDir,
    /// The user config file cannot be written (`keel trust`).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Output format of `run` and `resume`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Human-readable text (interactive when stdout is a terminal).
    #[default]
    Text,
    /// One JSON event per line, ending with one `result` line.
    Jsonl,
}

/// Budget section of `keel.toml` (per turn).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Most model samplings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Most cost, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock limit: `500ms`, `30s`, `15m`, `2h` or plain seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// Timeouts section of `keel.toml`: durations such as `500ms`, `30s`, `15m`, `2h` or plain
/// seconds. (`model` is the route's key at top level, hence `model_total`.)
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// Limit of every tool call (default 10 min); a shell `timeout_ms` above it is lowered to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A step's model call until its first token, retries included (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token: Option<String>,
    /// A step's model call from start to end, retries included (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_total: Option<String>,
    /// Longest silence of a model stream once it has started (default 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_idle: Option<String>,
}

impl TimeoutsConfig {
    /// Each duration parsed, in ms, with the field named on error.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming `timeouts.<key>`.
    pub fn parse(&self) -> Result<TimeoutSettings, ConfigError> {
        let get = |field, v: &Option<String>| {
            v.as_deref()
                .map(|t| parse_duration_field(field, t))
                .transpose()
        };
        Ok(TimeoutSettings {
            tool_ms: get("timeouts.tool", &self.tool)?
                .unwrap_or(keel_runtime::config::DEFAULT_TOOL_TIMEOUT_MS),
            first_token_ms: get("timeouts.first_token", &self.first_token)?,
            model_total_ms: get("timeouts.model_total", &self.model_total)?,
            stream_idle_ms: get("timeouts.stream_idle", &self.stream_idle)?
                .unwrap_or(keel_runtime::config::DEFAULT_STREAM_IDLE_TIMEOUT_MS),
        })
    }
}

/// The effective timeouts, in ms (defaults filled in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutSettings {
    /// Every tool call, ms.
    pub tool_ms: u64,
    /// A step's model call until its first token, ms (`None`: no limit of the session's).
    pub first_token_ms: Option<u64>,
    /// A step's model call from start to end, ms (`None`: no limit of the session's).
    pub model_total_ms: Option<u64>,
    /// Longest silence of a started model stream, ms.
    pub stream_idle_ms: u64,
}

impl Default for TimeoutSettings {
    /// The runtime's defaults: 10 min per tool call, 60 s of stream silence, no model limits.
    fn default() -> Self {
        Self {
            tool_ms: keel_runtime::config::DEFAULT_TOOL_TIMEOUT_MS,
            first_token_ms: None,
            model_total_ms: None,
            stream_idle_ms: keel_runtime::config::DEFAULT_STREAM_IDLE_TIMEOUT_MS,
        }
    }
}

/// Tools section of `keel.toml`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// The tools the model sees; empty means every built-in tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enabled: Vec<String>,
}

/// `[memory]` of `keel.toml`: the long-term memory tools (`memory_read`, `memory_write`,
/// `memory_search`; see `keel_runtime::memory`). From the user config, or a workspace's only
/// when it is trusted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Offer the memory tools (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Whose memory: `agent` (default), `user` or `shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Largest value, bytes of compact JSON (default 65,536; at most 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_value_bytes: Option<u64>,
}

/// The largest `[memory] max_value_bytes`, 16 MiB.
pub const MAX_MEMORY_VALUE_BYTES: u64 = 16 * 1024 * 1024;

impl MemoryConfig {
    /// The memory tools' settings, or `None` when memory is not enabled.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming `memory.namespace` or `memory.max_value_bytes`.
    pub fn settings(&self) -> Result<Option<keel_runtime::memory::MemorySettings>, ConfigError> {
        use keel_runtime::memory::{MemoryScope, MemorySettings};
        let scope = match self.namespace.as_deref() {
            None | Some("agent") => MemoryScope::Agent,
            Some("user") => MemoryScope::User,
            Some("shared") => MemoryScope::Shared,
            Some(other) => {
                return Err(ConfigError::Value {
                    field: "memory.namespace",
                    value: other.to_owned(),
                    expected: "agent, user or shared",
                });
            }
        };
        let max_value_bytes = match self.max_value_bytes {
            None => keel_runtime::memory::DEFAULT_MAX_VALUE_BYTES,
            Some(n @ 1..=MAX_MEMORY_VALUE_BYTES) => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(ConfigError::Value {
                    field: "memory.max_value_bytes",
                    value: n.to_string(),
                    expected: "a number of bytes from 1 to 16777216 (16 MiB)",
                });
            }
        };
        Ok(self.enabled.unwrap_or(false).then_some(MemorySettings {
            scope,
            max_value_bytes,
        }))
    }
}

/// Policy rules of `keel.toml` (patterns such as `shell(cargo test *)`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Calls that run without asking.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Calls that ask a human.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
    /// Calls that are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// Settings of one provider (`[providers.openai]`, `[providers.anthropic]`, …).
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    /// Base URL (OpenAI bases include `/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The API key itself (prefer `api_key_env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

impl std::fmt::Debug for ProviderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| MASK))
            .field("api_key_env", &self.api_key_env)
            .finish()
    }
}

/// One `[env]` entry: a plain string, or `{ value = "…", secret = true }`; without a `value`
/// (`{}`, `{ secret = true }`) keel's own value of the variable is passed to tools.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// A plain value.
    Plain(String),
    /// A value with flags, or none (pass keel's own).
    Detailed {
        /// The value; `None`: keel's own value of the variable is passed through.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        /// Masked by `config show` and redacted from events.
        #[serde(default)]
        secret: bool,
    },
}

impl EnvValue {
    /// The value written in the file; `None` for an entry that passes keel's own value.
    pub fn value(&self) -> Option<&str> {
        match self {
            EnvValue::Plain(v) => Some(v),
            EnvValue::Detailed { value, .. } => value.as_deref(),
        }
    }

    /// Whether the value is secret: marked so, or its name looks like a secret.
    pub fn is_secret(&self, name: &str) -> bool {
        matches!(self, EnvValue::Detailed { secret: true, .. }) || is_secret_name(name)
    }
}

impl std::fmt::Debug for EnvValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvValue::Plain(_) => f.write_str("EnvValue(..)"),
            EnvValue::Detailed { secret, .. } => write!(f, "EnvValue(.., secret: {secret})"),
        }
    }
}

/// One `keel.toml` as written (every field optional), and the merged result of all layers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Primary model spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Fallback model specs, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_models: Option<Vec<String>>,
    /// Base URL of an OpenAI-compatible server (for `openai:` and `openai-responses:` models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// System instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The model's context window in tokens (compaction starts at 80% of it); default: the
    /// window keel knows for the model (keel-model's table), or 128,000 for an unknown one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// `default`, `accept_edits`, `read_only`, `bypass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
    /// `off`, `read_only`, `workspace_write`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Confined commands share the host's network (never from a workspace file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_network: Option<bool>,
    /// `text` or `jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Store location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Keep the model's reasoning in the journal (redacted); default false: it is shown live
    /// and kept, sealed, only until its turn ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_reasoning: Option<bool>,
    /// Workspaces whose `keel.toml` may loosen settings and add `allow` rules: absolute paths
    /// (or `~/…`), matched canonically and exactly, each with the hash of the `keel.toml`
    /// version trusted ([`crate::trust`]). Read from the user config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_workspaces: Option<Vec<crate::trust::TrustEntry>>,
    /// Per-turn budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
    /// Time limits of tool calls and model streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<TimeoutsConfig>,
    /// Tool selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsConfig>,
    /// Policy rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyConfig>,
    /// Provider settings by provider name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Environment variables; secret ones are redacted from events.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    /// Hooks per event (`[[hooks.pre_tool_use]]`, …; see `keel_runtime::hooks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<keel_runtime::hooks::HooksConfig>,
    /// MCP servers whose tools the agent gets (`mcp__<server>__<tool>`; see [`keel_mcp::config`]).
    /// From the user config, or a workspace's only when it is trusted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, keel_mcp::McpServerConfig>,
    /// Long-term memory tools. From the user config, or a workspace's only when it is trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryConfig>,
    /// Agents the session's agent may start with `spawn_agent` (`[agents.NAME]`; also
    /// `.keel/agents/NAME.md`). From the user config, or a workspace's only when it is trusted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, AgentConfig>,
    /// Bounds of sub-agents (`[subagents]`). From the user config, or a trusted workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagents: Option<SubagentsConfig>,
}

/// One `[agents.NAME]` entry (or the front matter and body of `.keel/agents/NAME.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Its instructions (system prompt); default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The tools it may see; default: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Its model spec; default: the session's model route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `[subagents]`: how deep agents nest and how many children of one session run at once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentsConfig {
    /// Deepest child (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// Most children of one session running at once (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// Most live descendants of one top-level session at once; past it `spawn_agent` is
    /// refused with a tool error (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_descendants: Option<usize>,
}

/// Settings given on the command line; `None` leaves the configured value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `--model`: replaces the whole route (no fallbacks).
    pub model: Option<String>,
    /// `--base-url`.
    pub base_url: Option<String>,
    /// `--permission-mode` (snake_case).
    pub permission_mode: Option<String>,
    /// `--sandbox` (snake_case).
    pub sandbox: Option<String>,
    /// `--sandbox-network`.
    pub sandbox_network: Option<bool>,
    /// `--output`.
    pub output: Option<String>,
    /// `--max-steps`.
    pub max_steps: Option<u32>,
    /// `--max-cost-usd`.
    pub max_cost_usd: Option<f64>,
    /// `--timeout`.
    pub timeout: Option<String>,
    /// `--tool-timeout`.
    pub tool_timeout: Option<String>,
    /// `--store`.
    pub store: Option<String>,
    /// `--keep-reasoning`.
    pub keep_reasoning: Option<bool>,
}

impl Overrides {
    /// The overrides as a config layer.
    fn to_table(&self) -> toml::Table {
        let mut t = toml::Table::new();
        let mut put = |k: &str, v: Option<toml::Value>| {
            if let Some(v) = v {
                t.insert(k.to_owned(), v);
            }
        };
        put("model", self.model.clone().map(toml::Value::String));
        if self.model.is_some() {
            put("fallback_models", Some(toml::Value::Array(Vec::new())));
        }
        put("base_url", self.base_url.clone().map(toml::Value::String));
        put(
            "permission_mode",
            self.permission_mode.clone().map(toml::Value::String),
        );
        put("sandbox", self.sandbox.clone().map(toml::Value::String));
        put(
            "sandbox_network",
            self.sandbox_network.map(toml::Value::Boolean),
        );
        put("output", self.output.clone().map(toml::Value::String));
        put("store", self.store.clone().map(toml::Value::String));
        put(
            "keep_reasoning",
            self.keep_reasoning.map(toml::Value::Boolean),
        );
        let mut budget = toml::Table::new();
        if let Some(v) = self.max_steps {
            budget.insert("max_steps".into(), toml::Value::Integer(i64::from(v)));
        }
        if let Some(v) = self.max_cost_usd {
            budget.insert("max_cost_usd".into(), toml::Value::Float(v));
        }
        if let Some(v) = &self.timeout {
            budget.insert("timeout".into(), toml::Value::String(v.clone()));
        }
        if !budget.is_empty() {
            t.insert("budget".into(), toml::Value::Table(budget));
        }
        if let Some(v) = &self.tool_timeout {
            let mut timeouts = toml::Table::new();
            timeouts.insert("tool".into(), toml::Value::String(v.clone()));
            t.insert("timeouts".into(), toml::Value::Table(timeouts));
        }
        t
    }
}

/// Where the layers come from.
#[derive(Debug, Clone, Default)]
pub struct Locations {
    /// The user config file (`$XDG_CONFIG_HOME/keel/keel.toml`), if a config dir is known.
    pub user_file: Option<PathBuf>,
    /// The user data directory for the default store (`$XDG_DATA_HOME/keel`).
    pub data_dir: Option<PathBuf>,
}

impl Locations {
    /// The XDG locations of this user.
    pub fn from_env() -> Self {
        Self {
            user_file: dirs::config_dir().map(|d| d.join("keel").join(CONFIG_FILE)),
            data_dir: dirs::data_dir().map(|d| d.join("keel")),
        }
    }
}

/// The effective configuration of one invocation.
#[derive(Debug, Clone)]
pub struct Config {
    /// The workspace (absolute, existing).
    pub workspace: PathBuf,
    /// What was merged, lowest priority first (file paths, `flags`).
    pub sources: Vec<String>,
    /// The merged layers as written, before defaults.
    pub merged: FileConfig,
    /// Model route, primary first (may be empty when nothing is configured).
    pub model_route: Vec<String>,
    /// Base URL for OpenAI-compatible models.
    pub base_url: Option<String>,
    /// System instructions.
    pub instructions: String,
    /// The configured context window, tokens (`None`: the model's).
    pub context_window: Option<u64>,
    /// Permission mode.
    pub permission_mode: PermissionMode,
    /// Sandbox for `shell`.
    pub sandbox: SandboxMode,
    /// Confined `shell` commands share the host's network.
    pub sandbox_network: bool,
    /// Output format.
    pub output: OutputFormat,
    /// Store location (`sqlite://…` or `postgres://…`).
    pub store: String,
    /// Journal the model's reasoning (the session's `keep_reasoning`).
    pub keep_reasoning: bool,
    /// Per-turn budget, wall time included.
    pub budget: Budget,
    /// Time limits of tool calls and model streams, defaults filled in.
    pub timeouts: TimeoutSettings,
    /// Tools the model sees (empty: every built-in).
    pub tools: Vec<String>,
    /// Policy rules.
    pub policy: PolicyConfig,
    /// Provider settings.
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Environment variables; secret ones are redacted from events.
    pub env: BTreeMap<String, EnvValue>,
    /// Hooks: the user config's, then a trusted workspace's.
    pub hooks: keel_runtime::hooks::HooksConfig,
    /// Agents `spawn_agent` may start, by name (`[agents.NAME]`, then `.keel/agents/*.md`
    /// of a trusted workspace).
    pub agents: BTreeMap<String, keel_core::AgentDefinition>,
    /// `[subagents]`.
    pub subagents: SubagentsConfig,
    /// The memory tools' settings (`[memory]`), `None` unless enabled.
    pub memory: Option<keel_runtime::memory::MemorySettings>,
    /// Whether the user config trusts the workspace (`trusted_workspaces`), so that its
    /// `keel.toml` was applied without the only-tighten rule.
    pub trusted: bool,
    /// What was dropped from the workspace's `keel.toml` (untrusted `allow` rules, reserved
    /// sections) or added by it, one line each, for the command to print on standard error.
    pub notices: Vec<String>,
    /// The `.keel/commands/*.md` files of a trusted workspace, read when its trust was decided
    /// (the bytes trust covers are the bytes used); empty when it is not trusted.
    pub workspace_commands: Vec<keel_runtime::input::CommandFile>,
}

#[cfg(test)]
mod tests;
