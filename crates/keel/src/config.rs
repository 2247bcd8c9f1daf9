//! Configuration: `keel.toml` in the user config directory, then in the workspace, then
//! command-line flags, each layer overriding the one before (tables merge key by key, any other
//! value — arrays included — is replaced whole).
//!
//! ```toml
//! model = "openai:gpt-5"                   # primary: openai:M, openai-responses:M, anthropic:M, script:PATH
//! fallback_models = ["anthropic:claude-sonnet-4-5"]
//! base_url = "http://127.0.0.1:8080/v1"    # OpenAI-compatible server for openai: models
//! instructions = "You are a careful coding agent."
//! context_window = 128000                 # tokens; default: the model's known window
//! permission_mode = "default"              # default | accept_edits | read_only | bypass
//! sandbox = "workspace_write"              # off | read_only | workspace_write
//! output = "text"                          # text | jsonl
//! keep_reasoning = false                   # true: journal the model's reasoning (redacted)
//! store = "sqlite:///home/me/.local/share/keel/keel.db"   # or postgres://…
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
//! [env]                                    # secret names: redacted from events (see below)
//! RUST_LOG = "info"
//! DATABASE_URL = { value = "postgres://u:pw@h/db", secret = true }
//! ```
//!
//! [`mask_secrets`] hides every value whose key names a key, token, secret or password (except
//! counts such as `max_tokens`), every `[env]` value marked `secret = true`, and passwords inside
//! URLs; `keel config show` prints the result.
//!
//! `[env]` names environment variables; the names of secret ones (marked, or named like a secret)
//! become the session's `secret_env`, so the runtime redacts their values from events and
//! transcripts. Tools inherit keel's own environment: the values written here are not passed to
//! them yet (that needs a hook in keel-tools/keel-runtime).

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

/// One `[env]` entry: a plain string, or `{ value = "…", secret = true }`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// A plain value.
    Plain(String),
    /// A value with flags.
    Detailed {
        /// The value.
        value: String,
        /// Masked by `config show` and redacted from events.
        #[serde(default)]
        secret: bool,
    },
}

impl EnvValue {
    /// The value.
    pub fn value(&self) -> &str {
        match self {
            EnvValue::Plain(v) | EnvValue::Detailed { value: v, .. } => v,
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
}

/// Reads one layer; a missing file is an empty layer.
fn read_layer(path: &Path) -> Result<Option<toml::Table>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
    // Check the layer on its own so that an error names the file it is in.
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
    Ok(Some(table))
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
    if layer.context_window == Some(0) {
        return Err(ConfigError::Value {
            field: "context_window",
            value: "0".into(),
            expected: "a positive number of tokens, e.g. 128000",
        });
    }
    if let Some(b) = &layer.budget {
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
    if let Some(tools) = &layer.tools {
        let known: Vec<String> = keel_tools::builtin::builtin_tools()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        if let Some(unknown) = tools.enabled.iter().find(|t| !known.contains(t)) {
            return Err(ConfigError::Unknown {
                field: "tools.enabled",
                value: unknown.clone(),
                known: known.join(", "),
            });
        }
    }
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

/// Refuses a workspace layer that loosens `permission_mode` or `sandbox` relative to `trusted`
/// (the defaults and the user config), or turns `keep_reasoning` on (it keeps what the model
/// thought, for good), unless the flags set the field themselves; and one that sets
/// `[providers]`, `base_url`, `store` or `[env]` at all (where keys go, where keel writes and
/// what is hidden from the user are the user's to say).
fn check_workspace_layer(
    path: &Path,
    workspace: &toml::Table,
    trusted: &toml::Table,
    flags: &toml::Table,
    user_file: Option<&Path>,
) -> Result<(), ConfigError> {
    let text = |t: &toml::Table, k: &str| t.get(k).and_then(toml::Value::as_str).map(str::to_owned);
    let user_file = user_file.map_or_else(
        || "~/.config/keel/keel.toml".to_owned(),
        |p| p.display().to_string(),
    );
    let untrusted = |field: &str, value: String, baseline: String, flag: &str| {
        ConfigError::Untrusted(format!(
            "{} sets {field} = \"{value}\", looser than \"{baseline}\" from your configuration; a workspace's keel.toml may only tighten it (to accept, pass --{flag} {} or put it in your user config {user_file})",
            path.display(),
            value.replace('_', "-"),
        ))
    };
    if let (Some(ws), None) = (
        text(workspace, "permission_mode"),
        text(flags, "permission_mode"),
    ) {
        let mode = parse_permission_mode(&ws)?;
        let base = match text(trusted, "permission_mode") {
            Some(b) => parse_permission_mode(&b)?,
            None => PermissionMode::Default,
        };
        if permission_rank(mode) < permission_rank(base) {
            return Err(untrusted(
                "permission_mode",
                snake(&mode),
                snake(&base),
                "permission-mode",
            ));
        }
    }
    if let (Some(ws), None) = (text(workspace, "sandbox"), text(flags, "sandbox")) {
        let mode = parse_sandbox(&ws)?;
        let base = match text(trusted, "sandbox") {
            Some(b) => parse_sandbox(&b)?,
            None => SandboxMode::WorkspaceWrite,
        };
        if sandbox_rank(mode) < sandbox_rank(base) {
            return Err(untrusted(
                "sandbox",
                mode.as_str().to_owned(),
                base.as_str().to_owned(),
                "sandbox",
            ));
        }
    }
    // Where keys go and what is hidden from you are yours to say, never a repository's: a
    // workspace `[providers]` or `base_url` could send your API key (or any variable, as
    // `api_key_env`) to its own server, `store` could take over another database, and `[env]`
    // values marked secret would be shown as [REDACTED] in the approvals you are asked.
    for (key, why) in [
        (
            "providers",
            "could send your API keys (or any environment variable, as api_key_env) to a server of its choosing",
        ),
        (
            "base_url",
            "could send your API key to a server of its choosing",
        ),
        ("store", "could make keel write into another database file"),
        (
            "env",
            "could hide text from the approvals you are asked (its secret values are shown as [REDACTED])",
        ),
    ] {
        if workspace.contains_key(key) {
            return Err(ConfigError::Untrusted(format!(
                "{} sets `{key}`, which a workspace's keel.toml may not: it {why}; put it in your user config {user_file} or pass it as a flag",
                path.display()
            )));
        }
    }
    let flag = |t: &toml::Table| t.get("keep_reasoning").and_then(toml::Value::as_bool);
    if flag(workspace) == Some(true)
        && flag(trusted) != Some(true)
        && flags.get("keep_reasoning").is_none()
    {
        return Err(ConfigError::Untrusted(format!(
            "{} sets keep_reasoning = true, which journals the model's reasoning; a workspace's keel.toml may not turn it on (to accept, pass --keep-reasoning or put it in your user config {user_file})",
            path.display()
        )));
    }
    Ok(())
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
    /// Builds the effective configuration: defaults, the user file, the workspace's `keel.toml`,
    /// then `overrides`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or field at fault.
    pub fn load(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let workspace = resolve_workspace(workspace)?;
        let mut merged = toml::Table::new();
        let mut sources = Vec::new();
        let workspace_file = workspace.join(CONFIG_FILE);
        if let Some(user_file) = &locations.user_file
            && let Some(layer) = read_layer(user_file)?
        {
            merge(&mut merged, layer);
            sources.push(user_file.display().to_string());
        }
        let flags = overrides.to_table();
        // The user file may name the workspace's own keel.toml (a workspace in the config dir):
        // read it once, as the user's.
        let same_file = locations.user_file.as_ref() == Some(&workspace_file);
        if !same_file && let Some(layer) = read_layer(&workspace_file)? {
            check_workspace_layer(
                &workspace_file,
                &layer,
                &merged,
                &flags,
                locations.user_file.as_deref(),
            )?;
            let allow = layer
                .get("policy")
                .and_then(|p| p.get("allow"))
                .and_then(toml::Value::as_array)
                .map_or(0, Vec::len);
            if allow > 0 {
                eprintln!(
                    "keel: note: {} adds {allow} `allow` polic{} (calls that run without asking)",
                    workspace_file.display(),
                    if allow == 1 { "y rule" } else { "y rules" }
                );
            }
            merge(&mut merged, layer);
            sources.push(workspace_file.display().to_string());
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
        Self::from_file_config(workspace, sources, file, locations)
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
        Ok(Config {
            workspace,
            sources,
            model_route,
            base_url: file.base_url.clone(),
            instructions: file.instructions.clone().unwrap_or_default(),
            context_window: file.context_window,
            permission_mode,
            sandbox,
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
            merged: file,
        })
    }

    /// The effective configuration as TOML values, defaults filled in, secrets masked; what
    /// `keel config show` prints.
    pub fn to_masked_table(&self) -> toml::Table {
        let mut shown = self.merged.clone();
        shown.model = self.model_route.first().cloned();
        shown.permission_mode = Some(snake(&self.permission_mode));
        shown.sandbox = Some(self.sandbox.as_str().to_owned());
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
        let mut table = match toml::Value::try_from(&shown) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        table.insert(
            "workspace".into(),
            toml::Value::String(self.workspace.display().to_string()),
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
