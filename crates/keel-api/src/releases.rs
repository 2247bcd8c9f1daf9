//! Releases: immutable, content-hashed agent definitions (`/v1/releases`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::BudgetBody;

// --- releases -------------------------------------------------------------------------------

/// `POST /v1/releases`: an agent definition. The release id is the SHA-256 of its canonical
/// JSON, so the same definition twice is the same release.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReleaseRequest {
    /// The agent's name.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Model route, primary first (`openai:gpt-5`, `anthropic:claude-sonnet-4-5`, …; the
    /// providers are the server's).
    #[schema(min_items = 1, max_items = 8)]
    pub model_route: Vec<String>,
    /// System instructions.
    #[serde(default)]
    pub instructions: String,
    /// Tools the model may see (empty: every built-in tool).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Policy rules: `{"allow": [...], "ask": [...], "deny": [...]}` (patterns such as
    /// `shell(cargo test *)`), or `null` for none.
    #[serde(default)]
    pub policy: Option<PolicyBody>,
    /// Default per-turn budget.
    #[serde(default)]
    pub budget: BudgetBody,
    /// MCP servers whose tools the agent gets, by name (`[a-zA-Z0-9_-]{1,32}`, no `__`, not
    /// ending in `_`): each `{"url": "https://…", "headers": {"Authorization": {"env":
    /// "DOCS_TOKEN", "prefix": "Bearer "}}}` (streamable HTTP; a header value is a literal string
    /// or `{"env", "prefix"}` naming a variable of the server host listed in `[server]
    /// release_mcp_header_env`; redirects are not followed) or, where the host allows it
    /// (`[server] release_mcp_stdio`), `{"command": "…", "args": [...], "env": {...}}`; optional
    /// `startup_timeout_ms` (at most 60000 here), `tool_timeout_ms`, `protocol`
    /// (`"session"`/`"sessionless"`). The tools appear as `mcp__<server>__<tool>`; a non-empty
    /// `tools` list must name the ones it enables.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub mcp_servers: std::collections::BTreeMap<String, Value>,
    /// The agents this one may start with the `spawn_agent` tool, by name
    /// (`[a-zA-Z0-9_-]{1,64}`, at most 32 agents): each runs as a child session with its own
    /// instructions, tools and model route, under the parent session's permission mode,
    /// sandbox and rules (never looser) and within its budgets. The depth and concurrency of
    /// children are the server's bounds (`[subagents]` of its configuration), not a release's.
    /// With a non-empty `tools` list, list `spawn_agent` there too.
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, AgentBody>,
}

/// One agent a release may start with `spawn_agent` (`keel.toml`'s `[agents.NAME]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    /// Its system instructions.
    #[serde(default)]
    pub instructions: String,
    /// Tools it may see: built-in tools (and `spawn_agent`, to start agents of the parent's
    /// set itself); empty: every built-in tool.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Its model route, primary first; empty: the parent's route.
    #[serde(default)]
    #[schema(max_items = 8)]
    pub model_route: Vec<String>,
}

/// Policy rules of a release.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    /// Calls that run without asking.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Calls that always ask.
    #[serde(default)]
    pub ask: Vec<String>,
    /// Calls that never run.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A release.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReleaseBody {
    /// `sha256:<hex>` of its definition.
    #[schema(example = "sha256:4f1c…")]
    pub release_id: String,
    /// The agent's name.
    pub name: String,
    /// Model route.
    pub model_route: Vec<String>,
    /// Instructions.
    pub instructions: String,
    /// Tools.
    pub tools: Vec<String>,
    /// Policy rules (`null`: none).
    pub policy: Value,
    /// Default per-turn budget.
    pub budget: BudgetBody,
    /// MCP servers by name, as created (header values that name environment variables stay
    /// names).
    #[schema(value_type = Object)]
    pub mcp_servers: std::collections::BTreeMap<String, Value>,
    /// The agents it may start with `spawn_agent`, by name, as created.
    pub agents: std::collections::BTreeMap<String, AgentBody>,
    /// When this tenant first stored it (in lists; `null` elsewhere).
    pub created_at: Option<DateTime<Utc>>,
}

/// A page of releases.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReleasePage {
    /// Releases, in the order first stored.
    pub items: Vec<ReleaseBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}
