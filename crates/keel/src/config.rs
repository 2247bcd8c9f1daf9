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

/// The agent definition of `[agents.NAME]` (or `.keel/agents/NAME.md`): a relative
/// `script:` model path is relative to the workspace; no model means the session's route.
fn agent_definition(name: &str, a: &AgentConfig, workspace: &Path) -> keel_core::AgentDefinition {
    keel_core::AgentDefinition {
        name: name.to_owned(),
        model_route: a
            .model
            .iter()
            .map(|m| crate::model_spec::absolutize(m, workspace))
            .collect(),
        instructions: a.instructions.clone().unwrap_or_default(),
        tools: a.tools.clone().unwrap_or_default(),
        policy: serde_json::Value::Null,
        budget: Budget::default(),
        mcp_servers: BTreeMap::new(),
        agents: BTreeMap::new(),
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

/// The directory of a workspace's agent files (`.keel/agents/*.md`).
pub const AGENTS_DIR: &str = ".keel/agents";

/// The directory of a workspace's command files (`.keel/commands/*.md`).
pub const COMMANDS_DIR: &str = ".keel/commands";

/// The name of the session's own agent (its memory namespace is `agent:keel`). A repository's
/// agent may not take it, nor the name of an agent of the user config.
pub const MAIN_AGENT: &str = "keel";

/// The command files among `files` (those directly under [`COMMANDS_DIR`]), as the input
/// pipeline takes them; a directory keel does not use (a symlink) gives none.
fn workspace_commands(
    files: &[crate::trust::CoveredFile],
) -> Vec<keel_runtime::input::CommandFile> {
    let prefix = format!("{COMMANDS_DIR}/");
    files
        .iter()
        .filter_map(|f| {
            let name = f.rel.strip_prefix(&prefix)?.strip_suffix(".md")?;
            let text = match &f.content {
                Ok(bytes) => {
                    String::from_utf8(bytes.clone()).map_err(|_| "it is not UTF-8 text".to_owned())
                }
                Err(why) => Err(why.clone()),
            };
            Some(keel_runtime::input::CommandFile {
                name: name.to_owned(),
                file: f.path.clone(),
                text,
            })
        })
        .collect()
}

/// Parses the agent files among `files` (those under [`AGENTS_DIR`]; `NAME.md`: optional front
/// matter between `---` lines with `model:`, `tools:` — `[a, b]` or `a, b` — and `name:`, then
/// the instructions). A file keel will not use (a symlink, a FIFO, too large, not UTF-8) is
/// skipped with a notice in `notices`.
///
/// # Errors
/// [`ConfigError::InFile`] naming the file: a front matter without its closing `---`, an
/// unknown key.
pub fn parse_agent_files(
    files: &[crate::trust::CoveredFile],
    notices: &mut Vec<String>,
) -> Result<BTreeMap<String, (PathBuf, AgentConfig)>, ConfigError> {
    let mut out = BTreeMap::new();
    let prefix = format!("{AGENTS_DIR}/");
    for file in files
        .iter()
        .filter(|f| f.rel.starts_with(&prefix) || f.rel == AGENTS_DIR)
    {
        let path = file.path.clone();
        let bad = |message: String| ConfigError::InFile {
            path: path.clone(),
            message,
        };
        let text = match &file.content {
            Ok(bytes) => String::from_utf8(bytes.clone()).map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        let text = match text {
            Ok(text) => text,
            Err(why) => {
                notices.push(format!(
                    "keel: note: {} is not used as an agent definition: {why}",
                    path.display()
                ));
                continue;
            }
        };
        let mut name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut agent = AgentConfig::default();
        let body = match text.strip_prefix("---\n") {
            Some(rest) => {
                let Some((front, body)) = rest.split_once("\n---") else {
                    return Err(bad("the front matter has no closing `---` line".into()));
                };
                for line in front.lines().filter(|l| !l.trim().is_empty()) {
                    let Some((key, value)) = line.split_once(':') else {
                        return Err(bad(format!(
                            "front matter line {line:?} is not `key: value`"
                        )));
                    };
                    let value = value.trim().trim_matches('"');
                    match key.trim() {
                        "name" => value.clone_into(&mut name),
                        "model" => agent.model = Some(value.to_owned()),
                        "tools" => {
                            agent.tools = Some(
                                value
                                    .trim_start_matches('[')
                                    .trim_end_matches(']')
                                    .split(',')
                                    .map(|t| t.trim().trim_matches('"').to_owned())
                                    .filter(|t| !t.is_empty())
                                    .collect(),
                            );
                        }
                        "description" => {}
                        other => {
                            return Err(bad(format!(
                                "unknown front matter key `{other}` (expected name, model, tools, description)"
                            )));
                        }
                    }
                }
                body.split_once('\n').map_or("", |(_, b)| b)
            }
            None => text.as_str(),
        };
        agent.instructions = Some(body.trim().to_owned());
        out.insert(name, (path, agent));
    }
    Ok(out)
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

/// Reads one file as a TOML table; a missing file is `None`.
fn read_table(path: &Path) -> Result<Option<toml::Table>, ConfigError> {
    read_config_bytes(path)?
        .map(|bytes| parse_table(path, &bytes))
        .transpose()
}

/// The bytes of the config file at `path`, `None` when there is none. Only a regular file is
/// read (a symlink is followed to one), at most [`keel_tools::files::MAX_CONFIG_BYTES`]: a
/// repository's `keel.toml` that is a FIFO, a device or a huge file is refused, never waited on
/// or read without end.
///
/// # Errors
/// [`ConfigError::Read`] naming the file and what is wrong with it.
pub(crate) fn read_config_bytes(path: &Path) -> Result<Option<Vec<u8>>, ConfigError> {
    keel_tools::files::read_regular_file_if_present(path, keel_tools::files::MAX_CONFIG_BYTES)
        .map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })
}

/// Parses the TOML text of the file at `path`.
fn parse_table(path: &Path, bytes: &[u8]) -> Result<toml::Table, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: format!("not UTF-8 text: {e}"),
    })?;
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })
}

/// Checks one layer on its own, so that an error names the file it is in; returns it typed.
fn check_layer(path: &Path, table: &toml::Table) -> Result<FileConfig, ConfigError> {
    let layer = FileConfig::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        ConfigError::Invalid {
            sources: path.display().to_string(),
            message: e.to_string().trim().replace('\n', " "),
        }
    })?;
    validate_layer(&layer).map_err(|e| ConfigError::InFile {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(layer)
}

/// Sections reserved for what keel does not have yet, with what each would do. Keel refuses
/// them where they would apply (the user config, a trusted workspace) rather than ignore a
/// setting someone relies on, and drops them with a notice from an untrusted workspace, where
/// they would never apply anyway.
pub const RESERVED_KEYS: [(&str, &str); 0] = [];

/// Sections a workspace's `keel.toml` may set only when the workspace is trusted (they run
/// programs it names), with what each does: dropped with a notice from an untrusted one.
pub const TRUSTED_ONLY_KEYS: [(&str, &str); 4] = [
    (
        "mcp_servers",
        "would start the MCP servers it names (programs run with your environment, or URLs called)",
    ),
    (
        "agents",
        "would define agents your agent may start, with their own instructions and models",
    ),
    (
        "subagents",
        "would change how deep agents nest and how many run at once",
    ),
    (
        "memory",
        "would give the agent long-term memory (facts kept across sessions, and the namespace they are shared in)",
    ),
];

/// Refuses a reserved section in a file whose settings apply (the user config, a trusted
/// workspace's).
fn refuse_reserved(path: &Path, table: &toml::Table, how: &str) -> Result<(), ConfigError> {
    for (key, what) in RESERVED_KEYS {
        if table.contains_key(key) {
            return Err(ConfigError::InFile {
                path: path.to_owned(),
                message: format!(
                    "`{key}` is reserved: keel does not {what} yet, and will not ignore a setting you may rely on; {how}"
                ),
            });
        }
    }
    Ok(())
}

/// Checks the values of one layer (or of the merged result), so that a mistake is reported
/// with the file it is in, by every command that reads the configuration.
///
/// # Errors
/// The first value out of its domain.
pub fn validate_layer(layer: &FileConfig) -> Result<(), ConfigError> {
    if let Some(m) = &layer.permission_mode {
        parse_permission_mode(m)?;
    }
    if let Some(m) = &layer.sandbox {
        parse_sandbox(m)?;
    }
    if let Some(m) = &layer.output {
        parse_output(m)?;
    }
    if let Some(s) = &layer.store {
        check_store_url(s)?;
    }
    if let Some(u) = &layer.base_url {
        check_base_url(u)?;
    }
    let specs = layer.model.iter().map(|m| ("model", m)).chain(
        layer
            .fallback_models
            .iter()
            .flatten()
            .map(|m| ("fallback_models", m)),
    );
    for (field, spec) in specs {
        crate::model_spec::ModelSpec::parse(crate::model_spec::split_base_url(spec).0).map_err(
            |_| ConfigError::Value {
                field,
                value: spec.clone(),
                expected: "openai:MODEL, openai-responses:MODEL, anthropic:MODEL or script:PATH",
            },
        )?;
    }
    if layer.context_window == Some(0) {
        return Err(ConfigError::Value {
            field: "context_window",
            value: "0".into(),
            expected: "a positive number of tokens, e.g. 128000",
        });
    }
    if let Some(b) = &layer.budget {
        if b.max_steps == Some(0) {
            return Err(ConfigError::Value {
                field: "budget.max_steps",
                value: "0".into(),
                expected: "1 or more (a turn with no step cannot run)",
            });
        }
        if let Some(c) = b.max_cost_usd {
            check_cost(c)?;
        }
        if let Some(t) = &b.timeout {
            parse_duration_field("budget.timeout", t)?;
        }
    }
    if let Some(t) = &layer.timeouts {
        t.parse()?;
    }
    if let Some(m) = &layer.memory {
        m.settings()?;
    }
    if let Some(tools) = &layer.tools {
        let known: Vec<String> = keel_tools::builtin::builtin_tools()
            .iter()
            .map(|t| t.name().to_owned())
            .chain(keel_runtime::memory::TOOL_NAMES.map(str::to_owned))
            .collect();
        if let Some(unknown) = tools.enabled.iter().find(|t| !known.contains(t)) {
            return Err(ConfigError::Unknown {
                field: "tools.enabled",
                value: unknown.clone(),
                known: known.join(", "),
            });
        }
    }
    if let Some(h) = &layer.hooks {
        keel_runtime::hooks::Hooks::new(h).map_err(|e| ConfigError::Rule {
            message: e.to_string(),
        })?;
    }
    keel_mcp::config::validate_servers(&layer.mcp_servers)?;
    if let Some(p) = &layer.policy {
        for rule in p.allow.iter().chain(&p.ask).chain(&p.deny) {
            keel_tools::policy::RulePattern::parse(rule).map_err(|e| ConfigError::Rule {
                message: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// Checks a budget in USD: finite and not negative.
///
/// # Errors
/// [`ConfigError::Value`].
pub fn check_cost(usd: f64) -> Result<f64, ConfigError> {
    if usd.is_finite() && usd >= 0.0 {
        Ok(usd)
    } else {
        Err(ConfigError::Value {
            field: "budget.max_cost_usd",
            value: usd.to_string(),
            expected: "a finite number of US dollars, 0 or more",
        })
    }
}

/// Checks a store location: `sqlite://PATH`, `postgres://…`, `postgresql://…` or a plain path.
///
/// # Errors
/// [`ConfigError::Value`] for any other scheme.
pub fn check_store_url(store: &str) -> Result<(), ConfigError> {
    match store.split_once("://") {
        None => Ok(()),
        Some(("sqlite" | "postgres" | "postgresql", _)) => Ok(()),
        Some(_) => Err(ConfigError::Value {
            field: "store",
            value: store.to_owned(),
            expected: "sqlite://PATH, postgres://…, postgresql://… or a plain file path",
        }),
    }
}

/// Checks a base URL: `http://` or `https://` with a host.
///
/// # Errors
/// [`ConfigError::Value`].
pub fn check_base_url(text: &str) -> Result<(), ConfigError> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(h) if !h.is_empty() && !text.chars().any(char::is_whitespace) => Ok(()),
        _ => Err(ConfigError::Value {
            field: "base_url",
            value: text.to_owned(),
            expected: "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1",
        }),
    }
}

/// Whether a base URL applies to model `spec` (`openai:` and `openai-responses:` do).
pub fn base_url_applies(spec: &str) -> bool {
    matches!(
        crate::model_spec::ModelSpec::parse(crate::model_spec::split_base_url(spec).0),
        Ok(crate::model_spec::ModelSpec::OpenaiChat(_)
            | crate::model_spec::ModelSpec::OpenaiResponses(_))
    )
}

/// How strict a permission mode is: higher is stricter.
fn permission_rank(mode: PermissionMode) -> u8 {
    match mode {
        PermissionMode::ReadOnly => 3,
        PermissionMode::Default => 2,
        PermissionMode::AcceptEdits => 1,
        PermissionMode::Bypass => 0,
    }
}

/// How strict a sandbox is: higher is stricter.
fn sandbox_rank(mode: SandboxMode) -> u8 {
    match mode {
        SandboxMode::ReadOnly => 2,
        SandboxMode::WorkspaceWrite => 1,
        SandboxMode::Off => 0,
    }
}

/// Keys a workspace's `keel.toml` may never set, trusted or not: what each could do, and where
/// the setting belongs instead (`{user}` is replaced by the user config's path, `{ws}` by the
/// workspace's).
const NEVER_FROM_WORKSPACE: [(&str, &str, &str); 6] = [
    (
        "providers",
        "could send your API keys (or any environment variable, as api_key_env) to a server of its choosing",
        "put it in your user config {user}",
    ),
    (
        "base_url",
        "could send your API key to a server of its choosing",
        "put it in your user config {user} or pass --base-url",
    ),
    (
        "store",
        "could make keel write into another database file",
        "put it in your user config {user} or pass --store",
    ),
    (
        "env",
        "could hide text from the approvals you are asked (its secret values are shown as [REDACTED]) or un-mark your secrets (secret = false)",
        "put it in your user config {user}",
    ),
    (
        "sandbox_network",
        "could give every shell command the host's network, loopback services included",
        "put it in your user config {user} or pass --sandbox-network",
    ),
    (
        "trusted_workspaces",
        "could trust itself or other directories",
        "to trust this workspace, run `keel trust {ws}` (it writes your user config {user})",
    ),
];

/// Refuses a model spec of a workspace file (`keel.toml`'s `model`, `fallback_models`,
/// `[agents.NAME] model`, or a `.keel/agents/NAME.md` front matter's `model:`) that carries its
/// own server (`openai:M@http://…`): it is a `base_url` by another name, which a workspace may
/// never set, trusted or not (it could send the user's API key to a server of its choosing).
///
/// # Errors
/// [`ConfigError::Untrusted`] naming `file`, `key` and the spec, and where the server belongs.
fn refuse_model_server(
    file: &Path,
    key: &str,
    spec: &str,
    user_file: &str,
) -> Result<(), ConfigError> {
    match crate::model_spec::split_base_url(spec) {
        (bare, Some(_)) => Err(ConfigError::Untrusted(format!(
            "{} sets `{key}` to {spec:?}, a model with its own server address, which a workspace file may not (trusted or not): it could send your API key to a server of its choosing; write {bare:?} and set the server as base_url in your user config {user_file} or pass --base-url",
            file.display(),
        ))),
        (_, None) => Ok(()),
    }
}

/// Why a repository (a workspace's `keel.toml` or `.keel/agents/*.md`) may not define an agent
/// named `name`, if it may not: the name picks the agent's memory namespace (`agent:NAME`), so
/// taking [`MAIN_AGENT`]'s or a user-config agent's name would read and write that agent's
/// memory (shared across every workspace) and stand in for the user's own agent.
fn taken_agent_name(name: &str, user: &FileConfig) -> Option<String> {
    if name == MAIN_AGENT {
        return Some(format!(
            "`{MAIN_AGENT}` is the main agent's name (and memory, agent:{MAIN_AGENT}); a repository's agent may not take it"
        ));
    }
    user.agents.contains_key(name).then(|| {
        format!(
            "your user config defines an agent of that name (and its memory, agent:{name}); a repository's agent may not take it"
        )
    })
}

/// The workspace's `keel.toml` while it is checked and admitted (see the module docs).
struct WorkspaceFile<'a> {
    /// The file.
    path: &'a Path,
    /// The workspace (canonical), named in `keel trust WS`.
    workspace: &'a Path,
    /// The user config, as named in messages.
    user_file: String,
    /// Whether the user config trusts the workspace.
    trusted: bool,
    /// Why a listed workspace is not trusted now (its keel.toml changed since, or no version
    /// is pinned), added to refusals.
    why_untrusted: Option<&'static str>,
}

impl WorkspaceFile<'_> {
    /// Refuses what a workspace file may never set, trusted or not ([`NEVER_FROM_WORKSPACE`]),
    /// and a model spec carrying its own server (`openai:M@http://…`, the form earlier builds
    /// pinned into releases): it is a `base_url` by another name.
    fn refuse_never(&self, layer: &toml::Table) -> Result<(), ConfigError> {
        for (key, why, how) in NEVER_FROM_WORKSPACE {
            if layer.contains_key(key) {
                let how = how
                    .replace("{user}", &self.user_file)
                    .replace("{ws}", &self.workspace.display().to_string());
                return Err(ConfigError::Untrusted(format!(
                    "{} sets `{key}`, which a workspace's keel.toml may not (trusted or not): it {why}; {how}",
                    self.path.display()
                )));
            }
        }
        let model = layer
            .get("model")
            .and_then(toml::Value::as_str)
            .map(|s| ("model", s));
        let fallbacks = layer
            .get("fallback_models")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_str)
            .map(|s| ("fallback_models", s));
        let agents: Vec<(String, &str)> = layer
            .get("agents")
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten()
            .filter_map(|(name, agent)| {
                let spec = agent.get("model").and_then(toml::Value::as_str)?;
                Some((format!("agents.{name}.model"), spec))
            })
            .collect();
        for (key, spec) in model
            .into_iter()
            .chain(fallbacks)
            .map(|(k, s)| (k.to_owned(), s))
            .chain(agents)
        {
            refuse_model_server(self.path, &key, spec, &self.user_file)?;
        }
        Ok(())
    }

    /// Refuses, in an untrusted workspace's file, a scripted model (`model` or
    /// `fallback_models` naming `script:FILE`): its "model" is a file of the repository's
    /// choosing, so the repository would speak as the model (and propose the calls the user is
    /// asked about). `--model` replaces the configured route, so with it nothing is refused.
    ///
    /// # Errors
    /// [`ConfigError::Untrusted`] naming the file, the key and the two ways out.
    fn refuse_script_model(
        &self,
        layer: &toml::Table,
        overrides: &Overrides,
    ) -> Result<(), ConfigError> {
        if self.trusted || overrides.model.is_some() {
            return Ok(());
        }
        let model = layer.get("model").map(|m| ("model", m));
        let fallbacks = layer
            .get("fallback_models")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .map(|m| ("fallback_models", m));
        for (key, spec) in model.into_iter().chain(fallbacks) {
            let Some(spec) = spec
                .as_str()
                .filter(|s| s.trim_start().starts_with("script:"))
            else {
                continue;
            };
            let ws = self.workspace.display();
            return Err(ConfigError::Untrusted(format!(
                "{} sets `{key}` to {spec:?}, a scripted model whose answers are a file of the repository's: an untrusted workspace may not name one (the repository would speak as the model); if you trust this repository run `keel trust {ws}`{}, or pass --model to use another model",
                self.path.display(),
                self.why_untrusted
                    .map(|why| format!(" (it is in trusted_workspaces, but {why})"))
                    .unwrap_or_default(),
            )));
        }
        Ok(())
    }

    /// Takes out the reserved sections ([`RESERVED_KEYS`]) of an untrusted workspace's file,
    /// with a notice each; refuses them in a trusted one's (they would apply, and keel cannot
    /// honour them).
    fn take_reserved(
        &self,
        layer: &mut toml::Table,
        notices: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        let ws = self.workspace.display();
        if self.trusted {
            return refuse_reserved(
                self.path,
                layer,
                &format!("remove it, or stop trusting the workspace (keel trust --remove {ws})"),
            );
        }
        for (key, what) in TRUSTED_ONLY_KEYS {
            if layer.remove(key).is_some() {
                notices.push(format!(
                    "keel: note: {} sets `{key}`; ignored: it {what}, and a workspace's applies only if you trust it (keel trust {ws})",
                    self.path.display()
                ));
            }
        }
        for (key, what) in RESERVED_KEYS {
            if layer.remove(key).is_some() {
                notices.push(format!(
                    "keel: note: {} sets `{key}`; ignored: keel does not {what} yet, and a workspace's will apply only if you trust it (keel trust {ws})",
                    self.path.display()
                ));
            }
        }
        Ok(())
    }

    /// Takes out the `[agents.NAME]` entries of the workspace's file whose name is taken
    /// ([`taken_agent_name`]), with a notice each.
    fn take_taken_agent_names(
        &self,
        layer: &mut toml::Table,
        user: &FileConfig,
        notices: &mut Vec<String>,
    ) {
        let Some(toml::Value::Table(agents)) = layer.get_mut("agents") else {
            return;
        };
        let names: Vec<String> = agents.keys().cloned().collect();
        for name in names {
            if let Some(why) = taken_agent_name(&name, user) {
                agents.remove(&name);
                notices.push(format!(
                    "keel: note: {} defines [agents.{name}]; refused: {why}",
                    self.path.display()
                ));
            }
        }
    }

    /// Takes out the `[hooks]` of an untrusted workspace's file (they run code), with a notice;
    /// announces those of a trusted one, which run after the user's.
    fn take_hooks(&self, layer: &mut toml::Table, notices: &mut Vec<String>) {
        let (ws, file) = (self.workspace.display(), self.path.display());
        if self.trusted {
            if layer.contains_key("hooks") {
                notices.push(format!(
                    "keel: note: {file} (a workspace you trust) adds [hooks]: commands or URLs keel runs at session events"
                ));
            }
        } else if layer.remove("hooks").is_some() {
            notices.push(format!(
                "keel: note: {file} sets [hooks]; ignored: hooks run code, and a workspace's run only if you trust it (keel trust {ws})"
            ));
        }
    }

    /// Takes out the `allow` rules of an untrusted workspace's file (checked already), with a
    /// notice naming them; announces those of a trusted one, which apply.
    fn take_allow(&self, layer: &mut toml::Table, notices: &mut Vec<String>) {
        let ws = self.workspace.display();
        let file = self.path.display();
        if self.trusted {
            let allow = layer
                .get("policy")
                .and_then(|p| p.get("allow"))
                .and_then(toml::Value::as_array)
                .map_or(0, Vec::len);
            if allow > 0 {
                notices.push(format!(
                    "keel: note: {file} (a workspace you trust) adds {allow} `allow` polic{} (calls that run without asking)",
                    if allow == 1 { "y rule" } else { "y rules" }
                ));
            }
            return;
        }
        if let Some(toml::Value::Table(policy)) = layer.get_mut("policy")
            && let Some(allow) = policy.remove("allow")
        {
            // Debug-quoted: the rules are the repository's text, shown on your terminal.
            let rules: Vec<String> = allow
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| format!("{:?}", r.as_str().unwrap_or_default()))
                .collect();
            if !rules.is_empty() {
                notices.push(format!(
                    "keel: note: {file} has `allow` rules, not applied because you do not trust this workspace (the calls they name are decided as usual): {}; to apply them, run `keel trust {ws}` or copy them into your user config {}",
                    rules.join(", "),
                    self.user_file
                ));
            }
        }
    }

    /// The error for a value looser than `baseline`: names the file, the key and the three
    /// ways to accept it (the flag where there is one, the user config, `keel trust`).
    fn looser(
        &self,
        key: &str,
        value: &str,
        baseline: &str,
        verb: &str,
        flag: Option<String>,
    ) -> ConfigError {
        let flag = flag.map(|f| format!("pass {f}, ")).unwrap_or_default();
        let why = self
            .why_untrusted
            .map(|w| {
                format!(
                    " — the workspace is listed in trusted_workspaces, but {w}; review it, then"
                )
            })
            .unwrap_or_default();
        ConfigError::Untrusted(format!(
            "{} sets {key} = {value}, looser than {baseline}; a workspace's keel.toml may only {verb} it unless you trust the workspace{why} (to accept: {flag}put it in your user config {}, or run `keel trust {}`)",
            self.path.display(),
            self.user_file,
            self.workspace.display()
        ))
    }

    /// Refuses a limit above the user's (`None`: no limit there, so any value is lower).
    fn refuse_higher<T: PartialOrd + std::fmt::Display>(
        &self,
        key: &str,
        ws: Option<T>,
        user: Option<T>,
        flag: Option<(&str, bool)>,
    ) -> Result<(), ConfigError> {
        if flag.is_some_and(|(_, given)| given) {
            return Ok(());
        }
        match (ws, user) {
            (Some(w), Some(u)) if w > u => Err(self.looser(
                key,
                &w.to_string(),
                &format!("{u} from your user config"),
                "lower",
                flag.map(|(f, _)| format!("{f} {w}")),
            )),
            _ => Ok(()),
        }
    }

    /// As [`Self::refuse_higher`] for durations, against the user's value or else `default_ms`.
    fn refuse_longer(
        &self,
        key: &'static str,
        ws: Option<&String>,
        user: Option<&String>,
        default_ms: Option<u64>,
        flag: Option<(&str, bool)>,
    ) -> Result<(), ConfigError> {
        if flag.is_some_and(|(_, given)| given) {
            return Ok(());
        }
        let Some(w) = ws else { return Ok(()) };
        let w_ms = parse_duration_field(key, w)?;
        let (base_ms, shown) = match (user, default_ms) {
            (Some(u), _) => (
                parse_duration_field(key, u)?,
                format!("\"{u}\" from your user config"),
            ),
            (None, Some(d)) => (d, format!("\"{}\" (the default)", format_duration_ms(d))),
            (None, None) => return Ok(()),
        };
        if w_ms > base_ms {
            return Err(self.looser(
                key,
                &format!("\"{w}\""),
                &shown,
                "lower",
                flag.map(|(f, _)| format!("{f} {w}")),
            ));
        }
        Ok(())
    }

    /// Refuses, in an untrusted workspace's file, every value looser than the user's (or the
    /// default): permission mode, sandbox, `keep_reasoning`, each `[budget]` and `[timeouts]`
    /// key, tools the user did not enable. A value the flags set is not checked: the flag wins.
    fn refuse_loosening(
        &self,
        ws: &FileConfig,
        user: &FileConfig,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        let from = |given: bool| {
            if given {
                "from your user config"
            } else {
                "(the default)"
            }
        };
        if let (Some(w), None) = (&ws.permission_mode, &flags.permission_mode) {
            let mode = parse_permission_mode(w)?;
            let base = match &user.permission_mode {
                Some(b) => parse_permission_mode(b)?,
                None => PermissionMode::Default,
            };
            if permission_rank(mode) < permission_rank(base) {
                return Err(self.looser(
                    "permission_mode",
                    &format!("\"{}\"", snake(&mode)),
                    &format!(
                        "\"{}\" {}",
                        snake(&base),
                        from(user.permission_mode.is_some())
                    ),
                    "tighten",
                    Some(format!(
                        "--permission-mode {}",
                        snake(&mode).replace('_', "-")
                    )),
                ));
            }
        }
        if let (Some(w), None) = (&ws.sandbox, &flags.sandbox) {
            let mode = parse_sandbox(w)?;
            let base = match &user.sandbox {
                Some(b) => parse_sandbox(b)?,
                None => SandboxMode::WorkspaceWrite,
            };
            if sandbox_rank(mode) < sandbox_rank(base) {
                return Err(self.looser(
                    "sandbox",
                    &format!("\"{}\"", mode.as_str()),
                    &format!("\"{}\" {}", base.as_str(), from(user.sandbox.is_some())),
                    "tighten",
                    Some(format!("--sandbox {}", mode.as_str().replace('_', "-"))),
                ));
            }
        }
        if ws.keep_reasoning == Some(true)
            && user.keep_reasoning != Some(true)
            && flags.keep_reasoning.is_none()
        {
            return Err(self.looser(
                "keep_reasoning",
                "true (it journals the model's reasoning)",
                &format!("false {}", from(user.keep_reasoning.is_some())),
                "turn off",
                Some("--keep-reasoning".into()),
            ));
        }
        let (wb, ub) = (
            ws.budget.clone().unwrap_or_default(),
            user.budget.clone().unwrap_or_default(),
        );
        self.refuse_higher(
            "budget.max_steps",
            wb.max_steps,
            ub.max_steps,
            Some(("--max-steps", flags.max_steps.is_some())),
        )?;
        self.refuse_higher(
            "budget.max_cost_usd",
            wb.max_cost_usd,
            ub.max_cost_usd,
            Some(("--max-cost-usd", flags.max_cost_usd.is_some())),
        )?;
        self.refuse_higher("budget.max_tokens", wb.max_tokens, ub.max_tokens, None)?;
        self.refuse_higher(
            "budget.max_tool_calls",
            wb.max_tool_calls,
            ub.max_tool_calls,
            None,
        )?;
        self.refuse_longer(
            "budget.timeout",
            wb.timeout.as_ref(),
            ub.timeout.as_ref(),
            None,
            Some(("--timeout", flags.timeout.is_some())),
        )?;
        let (wt, ut) = (
            ws.timeouts.clone().unwrap_or_default(),
            user.timeouts.clone().unwrap_or_default(),
        );
        self.refuse_longer(
            "timeouts.tool",
            wt.tool.as_ref(),
            ut.tool.as_ref(),
            Some(keel_runtime::config::DEFAULT_TOOL_TIMEOUT_MS),
            Some(("--tool-timeout", flags.tool_timeout.is_some())),
        )?;
        self.refuse_longer(
            "timeouts.first_token",
            wt.first_token.as_ref(),
            ut.first_token.as_ref(),
            None,
            None,
        )?;
        self.refuse_longer(
            "timeouts.model_total",
            wt.model_total.as_ref(),
            ut.model_total.as_ref(),
            None,
            None,
        )?;
        self.refuse_longer(
            "timeouts.stream_idle",
            wt.stream_idle.as_ref(),
            ut.stream_idle.as_ref(),
            Some(keel_runtime::config::DEFAULT_STREAM_IDLE_TIMEOUT_MS),
            None,
        )?;
        let user_tools = user
            .tools
            .as_ref()
            .map(|t| t.enabled.clone())
            .unwrap_or_default();
        if let Some(t) = &ws.tools
            && !user_tools.is_empty()
        {
            let extra: Vec<&String> = t
                .enabled
                .iter()
                .filter(|name| !user_tools.contains(name))
                .collect();
            if !extra.is_empty() {
                return Err(self.looser(
                    "tools.enabled",
                    &format!("{:?}", t.enabled),
                    &format!(
                        "{user_tools:?} from your user config (it adds {})",
                        extra
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "narrow",
                    None,
                ));
            }
        }
        Ok(())
    }
}

/// Merges the workspace's layer into `base`: as [`merge`], except that its policy rules are
/// added to the ones already there (never replacing them: `deny = []` erases nothing), and an
/// empty `[tools] enabled` (which would mean "every tool") changes nothing.
pub fn merge_workspace(base: &mut toml::Table, mut layer: toml::Table) {
    if let Some(toml::Value::Table(tools)) = layer.get_mut("tools")
        && tools
            .get("enabled")
            .and_then(toml::Value::as_array)
            .is_some_and(Vec::is_empty)
    {
        tools.remove("enabled");
    }
    if let Some(toml::Value::Table(policy)) = layer.remove("policy")
        && let toml::Value::Table(base_policy) = base
            .entry("policy")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
    {
        for (kind, rules) in policy {
            let toml::Value::Array(rules) = rules else {
                continue;
            };
            if let toml::Value::Array(existing) = base_policy
                .entry(kind)
                .or_insert_with(|| toml::Value::Array(Vec::new()))
            {
                for rule in rules {
                    if !existing.contains(&rule) {
                        existing.push(rule);
                    }
                }
            }
        }
    }
    // Its hooks run after the user's (both lists apply).
    if let Some(toml::Value::Table(hooks)) = layer.remove("hooks")
        && let toml::Value::Table(base_hooks) = base
            .entry("hooks")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
    {
        for (key, value) in hooks {
            match (base_hooks.get_mut(&key), value) {
                (Some(toml::Value::Array(existing)), toml::Value::Array(more)) => {
                    existing.extend(more);
                }
                (_, value) => {
                    base_hooks.insert(key, value);
                }
            }
        }
    }
    merge(base, layer);
}

/// Merges `over` into `base`: tables key by key, everything else replaced.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Parses a duration: `500ms`, `30s`, `15m`, `2h`, or plain seconds; returns milliseconds.
///
/// # Errors
/// [`ConfigError::Value`] for anything else.
pub fn parse_duration_ms(text: &str) -> Result<u64, ConfigError> {
    parse_duration_field("timeout", text)
}

/// As [`parse_duration_ms`], naming `field` (`timeouts.tool`, …) in the error.
///
/// # Errors
/// [`ConfigError::Value`] naming `field`.
pub fn parse_duration_field(field: &'static str, text: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::Value {
        field,
        value: text.to_owned(),
        expected: "a duration such as 500ms, 30s, 15m, 2h or plain seconds",
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(bad()),
    };
    let ms = n * factor;
    if !ms.is_finite() || !(1.0..=1e15).contains(&ms) {
        return Err(bad());
    }
    // In range by the check above.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(ms.round() as u64)
}

/// A duration in the largest unit that writes it whole (`10m`, `90s`, `1500ms`): how `keel
/// config show` prints a default.
pub fn format_duration_ms(ms: u64) -> String {
    match ms {
        0 => "0ms".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Parses a permission mode (snake_case or kebab-case).
///
/// # Errors
/// [`ConfigError::Value`].
pub fn parse_permission_mode(text: &str) -> Result<PermissionMode, ConfigError> {
    PermissionMode::parse(text).map_err(|_| ConfigError::Value {
        field: "permission_mode",
        value: text.to_owned(),
        expected: "default, accept_edits, read_only or bypass",
    })
}

/// Parses a sandbox mode (snake_case or kebab-case).
///
/// # Errors
/// [`ConfigError::Value`].
pub fn parse_sandbox(text: &str) -> Result<SandboxMode, ConfigError> {
    match text.replace('-', "_").as_str() {
        "off" => Ok(SandboxMode::Off),
        "read_only" => Ok(SandboxMode::ReadOnly),
        "workspace_write" => Ok(SandboxMode::WorkspaceWrite),
        _ => Err(ConfigError::Value {
            field: "sandbox",
            value: text.to_owned(),
            expected: "off, read_only or workspace_write",
        }),
    }
}

fn parse_output(text: &str) -> Result<OutputFormat, ConfigError> {
    match text {
        "text" => Ok(OutputFormat::Text),
        "jsonl" => Ok(OutputFormat::Jsonl),
        _ => Err(ConfigError::Value {
            field: "output",
            value: text.to_owned(),
            expected: "text or jsonl",
        }),
    }
}

/// The default store: SQLite in the user data directory.
///
/// # Errors
/// [`ConfigError::NoDataDir`].
pub fn default_store(locations: &Locations) -> Result<String, ConfigError> {
    let dir = locations.data_dir.as_ref().ok_or(ConfigError::NoDataDir)?;
    Ok(format!("sqlite://{}", dir.join("keel.db").display()))
}

/// Resolves the workspace directory to an absolute, existing path.
///
/// # Errors
/// [`ConfigError::NoWorkspace`].
pub fn resolve_workspace(workspace: Option<&Path>) -> Result<PathBuf, ConfigError> {
    let given = workspace.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    match std::fs::canonicalize(&given) {
        Ok(p) if p.is_dir() => Ok(p),
        _ => Err(ConfigError::NoWorkspace(given)),
    }
}

impl Config {
    /// Builds the effective configuration: defaults, the user file, the workspace's `keel.toml`
    /// (admitted as the module docs say: only tightening unless the user config trusts the
    /// workspace), then `overrides`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or field at fault; [`ConfigError::Untrusted`] for a
    /// workspace file that loosens a setting or sets a key it may not.
    pub fn load(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        Self::load_layers(workspace, locations, overrides, true)
    }

    /// As [`Config::load`] without the workspace's `keel.toml`: defaults, the user file, then
    /// `overrides`. For commands that only need the store (`sessions`, `approve`, `deny`,
    /// `resolve`, `cancel`) and for finding a session before resuming it: the store never
    /// comes from a workspace file, so a repository whose file keel refuses cannot stop them.
    ///
    /// # Errors
    /// [`ConfigError`] naming the user file or flag at fault.
    pub fn load_user(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        Self::load_layers(workspace, locations, overrides, false)
    }

    fn load_layers(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
        read_workspace_file: bool,
    ) -> Result<Self, ConfigError> {
        let workspace = resolve_workspace(workspace)?;
        let mut merged = toml::Table::new();
        let mut sources = Vec::new();
        let mut notices = Vec::new();
        let workspace_file = workspace.join(CONFIG_FILE);
        let mut user = FileConfig::default();
        if let Some(user_file) = &locations.user_file
            && let Some(layer) = read_table(user_file)?
        {
            refuse_reserved(user_file, &layer, "remove it")?;
            user = check_layer(user_file, &layer)?;
            merge(&mut merged, layer);
            sources.push(user_file.display().to_string());
        }
        // The user file may name the workspace's own keel.toml (a workspace in the config dir):
        // read it once, as the user's.
        let same_file = locations.user_file.as_ref() == Some(&workspace_file);
        // Read once: the bytes trusted (their hash) are the bytes applied.
        let workspace_bytes = if read_workspace_file && !same_file {
            read_config_bytes(&workspace_file)?
        } else {
            None
        };
        // The agent and command files trust covers, read once too.
        let covered = if read_workspace_file {
            crate::trust::read_covered(&workspace)
        } else {
            Vec::new()
        };
        let user_file_shown = locations.user_file.as_ref().map_or_else(
            || "~/.config/keel/keel.toml".to_owned(),
            |p| p.display().to_string(),
        );
        let trust = match &locations.user_file {
            Some(user_file) if read_workspace_file => crate::trust::is_trusted(
                &workspace,
                &crate::trust::pin_of_workspace(workspace_bytes.as_deref(), &covered),
                user.trusted_workspaces.as_deref().unwrap_or_default(),
                user_file,
            )?,
            _ => crate::trust::Trust::Untrusted,
        };
        let trusted = trust == crate::trust::Trust::Trusted;
        let retrust = || {
            format!(
                "review it, then `keel trust {}` to trust this version",
                workspace.display()
            )
        };
        match trust {
            crate::trust::Trust::Changed => notices.push(format!(
                "keel: {} or its {AGENTS_DIR}/*.md or {COMMANDS_DIR}/*.md files changed since you trusted {} (or appeared, or went away): it is untrusted, may only tighten your settings, and its agents and commands are not used; {}",
                workspace_file.display(),
                workspace.display(),
                retrust()
            )),
            crate::trust::Trust::Unpinned => notices.push(format!(
                "keel: trusted_workspaces lists {} without the keel.toml version you trust (keel_toml): it is untrusted and may only tighten your settings; {}",
                workspace.display(),
                retrust()
            )),
            crate::trust::Trust::Trusted | crate::trust::Trust::Untrusted => {}
        }
        if let Some(bytes) = &workspace_bytes {
            let mut layer = parse_table(&workspace_file, bytes)?;
            let file = WorkspaceFile {
                path: &workspace_file,
                workspace: &workspace,
                user_file: user_file_shown.clone(),
                trusted,
                why_untrusted: match trust {
                    crate::trust::Trust::Changed => Some(
                        "its keel.toml (or an agent or command file under .keel) changed since you trusted it (or appeared, or went away)",
                    ),
                    crate::trust::Trust::Unpinned => {
                        Some("without the keel.toml version you trust (keel_toml)")
                    }
                    crate::trust::Trust::Trusted | crate::trust::Trust::Untrusted => None,
                },
            };
            file.refuse_never(&layer)?;
            file.refuse_script_model(&layer, overrides)?;
            file.take_reserved(&mut layer, &mut notices)?;
            let checked = check_layer(&workspace_file, &layer)?;
            if !trusted {
                file.refuse_loosening(&checked, &user, overrides)?;
            }
            file.take_allow(&mut layer, &mut notices);
            file.take_hooks(&mut layer, &mut notices);
            file.take_taken_agent_names(&mut layer, &user, &mut notices);
            merge_workspace(&mut merged, layer);
            sources.push(format!(
                "{}{}",
                workspace_file.display(),
                if trusted { " (trusted)" } else { "" }
            ));
        }
        let flags = overrides.to_table();
        if let Some(model) = &overrides.model
            && let Some(fallbacks) = merged
                .get("fallback_models")
                .and_then(toml::Value::as_array)
                .filter(|f| !f.is_empty())
        {
            let names: Vec<&str> = fallbacks.iter().filter_map(toml::Value::as_str).collect();
            notices.push(format!(
                "keel: --model {model} replaces the configured model route: fallback_models ({}) are not used",
                names.join(", ")
            ));
        }
        if overrides.base_url.is_some()
            && let Some(model) = &overrides.model
            && !base_url_applies(model)
        {
            return Err(ConfigError::Value {
                field: "--model",
                value: model.clone(),
                expected: "--base-url applies to openai: and openai-responses: models only (drop --base-url, or set [providers.NAME] base_url in keel.toml)",
            });
        }
        if !flags.is_empty() {
            merge(&mut merged, flags);
            sources.push("flags".into());
        }
        let file: FileConfig =
            FileConfig::deserialize(toml::Value::Table(merged)).map_err(|e| {
                ConfigError::Invalid {
                    sources: sources.join(", "),
                    message: e.to_string().trim().replace('\n', " "),
                }
            })?;
        let mut config = Self::from_file_config(workspace, sources, file, locations)?;
        // A repository's agent files count only when the workspace is trusted.
        let agents_dir = config.workspace.join(AGENTS_DIR);
        if trusted || same_file {
            for (name, (path, agent)) in parse_agent_files(&covered, &mut notices)? {
                if !same_file {
                    if let Some(spec) = &agent.model {
                        refuse_model_server(&path, "model", spec, &user_file_shown)?;
                    }
                    if let Some(why) = taken_agent_name(&name, &user) {
                        notices.push(format!(
                            "keel: note: {} defines agent `{name}`; refused: {why}",
                            path.display()
                        ));
                        continue;
                    }
                }
                config
                    .agents
                    .entry(name.clone())
                    .or_insert_with(|| agent_definition(&name, &agent, &config.workspace));
            }
        } else if read_workspace_file && agents_dir.is_dir() {
            config.notices.push(format!(
                "keel: note: {} holds agent definitions; ignored: a workspace's apply only if you trust it (keel trust {})",
                agents_dir.display(),
                config.workspace.display()
            ));
        }
        if trusted || same_file {
            config.workspace_commands = workspace_commands(&covered);
        }
        config.notices.splice(0..0, notices);
        config.trusted = trusted;
        Ok(config)
    }

    fn from_file_config(
        workspace: PathBuf,
        sources: Vec<String>,
        file: FileConfig,
        locations: &Locations,
    ) -> Result<Self, ConfigError> {
        // A relative `script:` path in a file is relative to the workspace (flags were made
        // absolute against the current directory already).
        let model_route: Vec<String> = file
            .model
            .iter()
            .chain(file.fallback_models.iter().flatten())
            .map(|s| crate::model_spec::absolutize(s, &workspace))
            .collect();
        let permission_mode = match &file.permission_mode {
            Some(m) => parse_permission_mode(m)?,
            None => PermissionMode::Default,
        };
        let sandbox = match &file.sandbox {
            Some(m) => parse_sandbox(m)?,
            None => SandboxMode::WorkspaceWrite,
        };
        let output = match &file.output {
            Some(m) => parse_output(m)?,
            None => OutputFormat::Text,
        };
        let store = match &file.store {
            Some(s) => s.clone(),
            None => default_store(locations)?,
        };
        validate_layer(&file)?;
        let b = file.budget.clone().unwrap_or_default();
        let budget = Budget {
            max_steps: b.max_steps,
            max_tokens: b.max_tokens,
            max_cost_usd: b.max_cost_usd.map(check_cost).transpose()?,
            max_tool_calls: b.max_tool_calls,
            max_wall_time_ms: b
                .timeout
                .as_deref()
                .map(|t| parse_duration_field("budget.timeout", t))
                .transpose()?,
        };
        let timeouts = file.timeouts.clone().unwrap_or_default().parse()?;
        let agents = file
            .agents
            .iter()
            .map(|(n, a)| (n.clone(), agent_definition(n, a, &workspace)))
            .collect();
        Ok(Config {
            workspace,
            sources,
            model_route,
            base_url: file.base_url.clone(),
            instructions: file.instructions.clone().unwrap_or_default(),
            context_window: file.context_window,
            permission_mode,
            sandbox,
            sandbox_network: file.sandbox_network.unwrap_or(false),
            output,
            store,
            keep_reasoning: file.keep_reasoning.unwrap_or(false),
            budget,
            timeouts,
            tools: file
                .tools
                .as_ref()
                .map(|t| t.enabled.clone())
                .unwrap_or_default(),
            policy: file.policy.clone().unwrap_or_default(),
            providers: file.providers.clone(),
            env: file.env.clone(),
            hooks: file.hooks.clone().unwrap_or_default(),
            agents,
            subagents: file.subagents.clone().unwrap_or_default(),
            memory: file
                .memory
                .as_ref()
                .map(MemoryConfig::settings)
                .transpose()?
                .flatten(),
            merged: file,
            trusted: false,
            notices: Vec::new(),
            workspace_commands: Vec::new(),
        })
    }

    /// The effective configuration as TOML values, defaults filled in, secrets masked; what
    /// `keel config show` prints.
    pub fn to_masked_table(&self) -> toml::Table {
        let mut shown = self.merged.clone();
        shown.model = self.model_route.first().cloned();
        shown.permission_mode = Some(snake(&self.permission_mode));
        shown.sandbox = Some(self.sandbox.as_str().to_owned());
        shown.sandbox_network = Some(self.sandbox_network);
        shown.output = Some(snake(&self.output));
        shown.store = Some(self.store.clone());
        // Timeouts with their defaults; the model limits only when set (none by default).
        let mut t = shown.timeouts.clone().unwrap_or_default();
        let fill = |v: &mut Option<String>, ms: u64| {
            v.get_or_insert_with(|| format_duration_ms(ms));
        };
        fill(&mut t.tool, self.timeouts.tool_ms);
        fill(&mut t.stream_idle, self.timeouts.stream_idle_ms);
        shown.timeouts = Some(t);
        shown.keep_reasoning = Some(self.keep_reasoning);
        // Agents from every source (`[agents]`, a trusted workspace's `.keel/agents/*.md`).
        shown.agents = self
            .agents
            .iter()
            .map(|(n, d)| {
                let agent = AgentConfig {
                    instructions: Some(d.instructions.clone()),
                    tools: (!d.tools.is_empty()).then(|| d.tools.clone()),
                    model: d.model_route.first().cloned(),
                };
                (n.clone(), agent)
            })
            .collect();
        let mut table = match toml::Value::try_from(&shown) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        table.insert(
            "workspace".into(),
            toml::Value::String(self.workspace.display().to_string()),
        );
        table.insert(
            "workspace_trusted".into(),
            toml::Value::Boolean(self.trusted),
        );
        // Keys the providers read from the environment, shown as set or not, never their values.
        for (provider, var) in [
            ("openai", "OPENAI_API_KEY"),
            ("anthropic", "ANTHROPIC_API_KEY"),
        ] {
            let settings = self.providers.get(provider);
            let var = settings
                .and_then(|s| s.api_key_env.clone())
                .unwrap_or_else(|| var.to_owned());
            if settings.is_some_and(|s| s.api_key.is_some()) {
                continue;
            }
            if std::env::var_os(&var).is_some_and(|v| !v.is_empty()) {
                let providers = table
                    .entry("providers")
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(providers) = providers
                    && let toml::Value::Table(p) = providers
                        .entry(provider)
                        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                {
                    p.insert(
                        "api_key".into(),
                        toml::Value::String(format!("{MASK} (from ${var})")),
                    );
                }
            }
        }
        mask_secrets(&mut table, &self.env);
        table
    }
}

fn snake<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// Whether a configuration key names a secret: it contains `key`, `token`, `secret` or
/// `password` (any case), and is not a count (`*_tokens`, `max_*`) or the name of a variable
/// holding one (`*_env`).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.ends_with("tokens") || n.starts_with("max_") || n.ends_with("_env") {
        return false;
    }
    ["key", "token", "secret", "password", "passwd"]
        .iter()
        .any(|w| n.contains(w))
}

/// Hides the password of a `scheme://user:password@host` URL.
pub fn mask_url_password(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:{MASK}@{host}{path}")
        }
        _ => value.to_owned(),
    }
}

/// Masks secrets in a configuration table in place (see the module docs).
pub fn mask_secrets(table: &mut toml::Table, env: &BTreeMap<String, EnvValue>) {
    for (key, value) in table.iter_mut() {
        if key == "env" {
            if let toml::Value::Table(vars) = value {
                for (name, v) in vars.iter_mut() {
                    if env.get(name).is_some_and(|e| e.is_secret(name)) {
                        *v = toml::Value::String(MASK.into());
                    } else if let toml::Value::Table(detailed) = v {
                        // `{ value = "…", secret = false }`: the flag is not a secret.
                        if let Some(toml::Value::String(s)) = detailed.get_mut("value") {
                            *s = mask_url_password(s);
                        }
                    } else {
                        mask_value(name, v);
                    }
                }
            }
            continue;
        }
        if key == "timeouts" {
            // Durations, never secrets (though `first_token` is named like one).
            continue;
        }
        // A literal header value may be a credential whatever the header is called; one read
        // from an environment variable (`{ env = "…" }`) only names the variable. MCP servers
        // are a table of servers, hooks a table of lists (`[[hooks.permission_request]]`).
        if let ("mcp_servers" | "hooks", toml::Value::Table(entries)) = (key.as_str(), &mut *value)
        {
            let specs = entries.iter_mut().flat_map(|(_, v)| match v {
                toml::Value::Array(list) => list.iter_mut().collect::<Vec<_>>(),
                other => vec![other],
            });
            for spec in specs {
                if let Some(toml::Value::Table(headers)) = spec.get_mut("headers") {
                    for (_, header) in headers.iter_mut() {
                        if let toml::Value::String(text) = header {
                            *text = MASK.to_owned();
                        }
                    }
                }
            }
        }
        mask_value(key, value);
    }
}

fn mask_value(key: &str, value: &mut toml::Value) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                mask_value(k, v);
            }
        }
        toml::Value::Array(items) => {
            for v in items {
                mask_value(key, v);
            }
        }
        toml::Value::String(s) if is_secret_name(key) && !s.starts_with(MASK) => {
            *s = MASK.into();
        }
        toml::Value::String(_) if is_secret_name(key) => {}
        toml::Value::String(s) => *s = mask_url_password(s),
        _ if is_secret_name(key) => *value = toml::Value::String(MASK.into()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
        assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("30").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("1.5m").unwrap(), 90_000);
        assert_eq!(parse_duration_ms("2h").unwrap(), 7_200_000);
        assert!(parse_duration_ms("soon").is_err());
        assert!(parse_duration_ms("0s").is_err());
        assert!(parse_duration_ms("5 days").is_err());
    }

    #[test]
    fn defaults_print_in_their_largest_whole_unit() {
        assert_eq!(format_duration_ms(600_000), "10m");
        assert_eq!(format_duration_ms(60_000), "1m");
        assert_eq!(format_duration_ms(90_000), "90s");
        assert_eq!(format_duration_ms(7_200_000), "2h");
        assert_eq!(format_duration_ms(1_500), "1500ms");
        for ms in [1, 999, 1_000, 61_000, 600_000, 5_400_000] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)).unwrap(), ms);
        }
    }

    #[test]
    fn timeouts_parse_with_defaults_and_name_the_key_at_fault() {
        let t = TimeoutsConfig {
            first_token: Some("2m".into()),
            ..TimeoutsConfig::default()
        }
        .parse()
        .unwrap();
        assert_eq!(
            t,
            TimeoutSettings {
                tool_ms: 600_000,
                first_token_ms: Some(120_000),
                model_total_ms: None,
                stream_idle_ms: 60_000,
            }
        );
        let e = TimeoutsConfig {
            stream_idle: Some("soon".into()),
            ..TimeoutsConfig::default()
        }
        .parse()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("timeouts.stream_idle") && e.contains("\"soon\""),
            "{e}"
        );
    }

    #[test]
    fn secret_names_exclude_counts_and_variable_names() {
        for s in [
            "api_key",
            "API_KEY",
            "GITHUB_TOKEN",
            "client_secret",
            "db_password",
        ] {
            assert!(is_secret_name(s), "{s}");
        }
        for s in ["max_tokens", "api_key_env", "model", "base_url"] {
            assert!(!is_secret_name(s), "{s}");
        }
    }

    #[test]
    fn literal_mcp_header_values_are_masked() {
        let mut table: toml::Table = toml::from_str(
            "[mcp_servers.d]\nurl = \"https://h/mcp\"\nheaders = { Authorization = \"Bearer s3cret\", X-Key = { env = \"K\" } }\n",
        )
        .unwrap();
        mask_secrets(&mut table, &BTreeMap::new());
        let text = toml::to_string(&table).unwrap();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("env = \"K\""), "{text}");
    }

    /// Attack (issue 14): an HTTP hook's literal header (the README's own example,
    /// `headers = { Authorization = "Bearer …" }`) is a credential as much as an MCP server's,
    /// and `keel config show` must not print it.
    #[test]
    fn literal_hook_header_values_are_masked() {
        let mut table: toml::Table = toml::from_str(
            "[hooks]\nmax_stop_continues = 2\n[[hooks.permission_request]]\nurl = \"https://approvals.example/keel\"\nheaders = { Authorization = \"Bearer h00ksecret\", X-Team = \"t3amsecret\" }\n",
        )
        .unwrap();
        mask_secrets(&mut table, &BTreeMap::new());
        let text = toml::to_string(&table).unwrap();
        assert!(
            !text.contains("h00ksecret") && !text.contains("t3amsecret"),
            "{text}"
        );
        assert!(text.contains("https://approvals.example/keel"), "{text}");
        assert!(text.contains("max_stop_continues = 2"), "{text}");
    }

    /// Attack (issue 14): an untrusted workspace's file spells `[hooks]` and `[mcp_servers]`
    /// every way TOML allows — dotted keys, inline tables, arrays of tables — or in another case;
    /// none of them starts a server or runs a hook.
    #[test]
    fn no_spelling_of_hooks_or_servers_applies_from_an_untrusted_workspace() {
        let spellings = [
            "mcp_servers.x.command = \"sh\"\n",
            "mcp_servers = { x = { command = \"sh\", env_vars = [\"OPENAI_API_KEY\"] } }\n",
            "[mcp_servers]\nx = { url = \"http://127.0.0.1:5432/\" }\n",
            "hooks.stop = [{ command = \"touch pwned\" }]\n",
            "hooks = { pre_tool_use = [{ command = \"touch pwned\" }] }\n",
            "[[hooks.session_start]]\ncommand = \"touch pwned\"\n",
            "[hooks]\nmax_stop_continues = 1000\n",
        ];
        for text in spellings {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(CONFIG_FILE), text).unwrap();
            let locations = Locations {
                user_file: Some(dir.path().join("user.toml")),
                data_dir: Some(dir.path().join("data")),
            };
            let config = Config::load(Some(dir.path()), &locations, &Overrides::default())
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(config.merged.mcp_servers.is_empty(), "{text:?}");
            assert!(config.hooks.is_empty(), "{text:?}");
            assert_eq!(config.hooks.max_stop_continues, None, "{text:?}");
            assert!(!config.notices.is_empty(), "{text:?}: no notice");
        }
        for text in [
            "[MCP_Servers.x]\ncommand = \"sh\"\n",
            "[[Hooks.stop]]\ncommand = \"sh\"\n",
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(CONFIG_FILE), text).unwrap();
            let locations = Locations {
                user_file: Some(dir.path().join("user.toml")),
                data_dir: Some(dir.path().join("data")),
            };
            assert!(
                Config::load(Some(dir.path()), &locations, &Overrides::default()).is_err(),
                "{text:?} is an unknown key, refused"
            );
        }
    }

    #[test]
    fn url_passwords_are_masked() {
        assert_eq!(
            mask_url_password("postgres://u:pw@h:5432/db?x=1"),
            format!("postgres://u:{MASK}@h:5432/db?x=1")
        );
        assert_eq!(mask_url_password("postgres://h/db"), "postgres://h/db");
        assert_eq!(
            mask_url_password("sqlite:///tmp/a.db"),
            "sqlite:///tmp/a.db"
        );
    }

    #[test]
    fn a_workspace_layer_adds_rules_and_an_empty_tool_list_changes_nothing() {
        let mut base: toml::Table =
            "[policy]\ndeny = ['a', 'b']\nask = ['q']\n[tools]\nenabled = ['read_file']"
                .parse()
                .unwrap();
        let over: toml::Table =
            "[policy]\ndeny = []\nask = ['q', 'r']\nallow = ['z']\n[tools]\nenabled = []"
                .parse()
                .unwrap();
        merge_workspace(&mut base, over);
        let c = FileConfig::deserialize(toml::Value::Table(base)).unwrap();
        let p = c.policy.unwrap();
        assert_eq!(p.deny, ["a", "b"]);
        assert_eq!(p.ask, ["q", "r"]);
        assert_eq!(p.allow, ["z"]);
        assert_eq!(c.tools.unwrap().enabled, ["read_file"]);
    }

    #[test]
    fn layers_merge_tables_and_replace_arrays() {
        let mut base: toml::Table = "model = 'a'\n[budget]\nmax_steps = 3\nmax_cost_usd = 1.0\n[policy]\nallow = ['x', 'y']".parse().unwrap();
        let over: toml::Table = "[budget]\nmax_steps = 5\n[policy]\nallow = ['z']"
            .parse()
            .unwrap();
        merge(&mut base, over);
        let c = FileConfig::deserialize(toml::Value::Table(base)).unwrap();
        let b = c.budget.unwrap();
        assert_eq!((b.max_steps, b.max_cost_usd), (Some(5), Some(1.0)));
        assert_eq!(c.policy.unwrap().allow, vec!["z".to_string()]);
        assert_eq!(c.model.as_deref(), Some("a"));
    }
}
