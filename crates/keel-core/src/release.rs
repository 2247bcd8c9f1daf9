//! Tenants, principals and releases.
//!
//! A [`Release`] is an immutable, content-hashed [`AgentDefinition`]: model route, instructions,
//! tools, policy rules and default budgets. A session runs one pinned release at a time: the one
//! in `session.created`, until an explicit re-pin (`session.release_pinned`, naming the old and
//! the new release) between turns. So what an agent was allowed to do at any point is always
//! answerable from the journal: the release pinned before that point.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::Budget;
use crate::canonical::content_hash;
use crate::ids::{PrincipalId, ReleaseId, TenantId};

/// An isolation boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its id; every stored row carries it.
    pub id: TenantId,
    /// Display name.
    pub name: String,
}

/// What kind of actor a principal is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// A person.
    User,
    /// Another program acting through the API.
    Service,
    /// A Keel worker process.
    Worker,
}

/// Who acts, within one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Its id.
    pub id: PrincipalId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// User, service or worker.
    pub kind: PrincipalKind,
    /// Display name.
    pub name: String,
}

/// An agent definition, as written by its author.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    /// The agent's name.
    pub name: String,
    /// Model route: primary first, then ordered fallbacks (`openai:gpt-5`, `anthropic:claude-…`,
    /// `script:PATH`).
    pub model_route: Vec<String>,
    /// System instructions.
    #[serde(default)]
    pub instructions: String,
    /// Names of the tools it may see.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Policy rules, as the runtime reads them: `{"allow": [...], "ask": [...], "deny": [...]}`
    /// (each optional, patterns such as `shell(cargo test *)`), or `null` for none. The
    /// permission mode is a session setting, not part of the release.
    #[serde(default)]
    pub policy: Value,
    /// Default per-turn budget.
    #[serde(default)]
    pub budget: Budget,
    /// MCP servers whose tools the agent gets (`mcp__<server>__<tool>`), by name, each an object
    /// in `keel.toml`'s `[mcp_servers.NAME]` shape (`command`/`args`/`env`/`env_vars` or
    /// `url`/`headers`, timeouts; see `keel_mcp::config`). Hosts check them when the release is
    /// made; left out of the hashed JSON when empty, so releases without servers keep their ids.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, Value>,
    /// The agents this one may start with the `spawn_agent` tool, by name: each a definition
    /// (its `agents` are ignored: a child may spawn from its parent's set, which it inherits).
    /// Left out of the hashed JSON when empty, so releases without agents keep their ids.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, AgentDefinition>,
}

/// An immutable, content-hashed agent definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Release {
    /// `sha256:<hex>` of the canonical JSON of `definition`.
    pub id: ReleaseId,
    /// What was hashed.
    pub definition: AgentDefinition,
}

impl Release {
    /// Hashes `definition` into a release. Equal definitions give equal ids, whatever the key order
    /// of their policy JSON.
    pub fn new(definition: AgentDefinition) -> Self {
        let value = serde_json::to_value(&definition).unwrap_or(Value::Null);
        Release {
            id: ReleaseId(content_hash(&value)),
            definition,
        }
    }

    /// Whether `id` matches the definition (a tampered or corrupt stored release fails this).
    pub fn verify(&self) -> bool {
        Release::new(self.definition.clone()).id == self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(policy: Value) -> AgentDefinition {
        AgentDefinition {
            name: "coder".into(),
            model_route: vec!["openai:gpt-5".into(), "anthropic:claude-sonnet-4-5".into()],
            instructions: "Be brief.".into(),
            tools: vec!["read_file".into()],
            policy,
            budget: Budget {
                max_steps: Some(10),
                ..Budget::default()
            },
            mcp_servers: Default::default(),
            agents: BTreeMap::new(),
        }
    }

    #[test]
    fn a_release_without_mcp_servers_hashes_as_before_the_field_existed() {
        let json = serde_json::to_value(def(Value::Null)).unwrap();
        assert!(json.get("mcp_servers").is_none(), "{json}");
        let mut with = def(Value::Null);
        with.mcp_servers
            .insert("git".into(), json!({"command": "mcp-server-git"}));
        assert_ne!(Release::new(with).id, Release::new(def(Value::Null)).id);
    }

    #[test]
    fn a_release_without_agents_hashes_as_before_the_field_existed() {
        let json = serde_json::to_value(def(Value::Null)).unwrap();
        assert!(json.get("agents").is_none(), "{json}");
        let mut with = def(Value::Null);
        with.agents.insert("reviewer".into(), def(Value::Null));
        assert_ne!(Release::new(with).id, Release::new(def(Value::Null)).id);
    }

    #[test]
    fn equal_definitions_hash_equal_and_changes_change_the_id() {
        let a = Release::new(def(serde_json::from_str(
            r#"{"ask":["shell(git push *)"],"deny":["shell(rm *)"]}"#,
        )
        .unwrap()));
        let b = Release::new(def(serde_json::from_str(
            r#"{"deny":["shell(rm *)"],"ask":["shell(git push *)"]}"#,
        )
        .unwrap()));
        assert_eq!(a.id, b.id);
        assert!(a.verify());
        let c = Release::new(def(json!({"allow": ["shell"]})));
        assert_ne!(a.id, c.id);
        let mut tampered = a.clone();
        tampered.definition.instructions.push('!');
        assert!(!tampered.verify());
    }
}
