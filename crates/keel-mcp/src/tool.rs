//! [`McpTool`]: one tool of one MCP server behind keel's [`Tool`] trait, so the registry
//! validates, authorizes, budgets and journals it like any built-in tool.
//!
//! - **Name**: `mcp__<server>__<tool>` ([`crate::naming::tool_name`]).
//! - **Schema**: the server's `inputSchema`, made strict for the registry: `"type": "object"`,
//!   and `"additionalProperties": false` unless it already says so — the model is offered exactly
//!   the declared properties, and arguments are validated against that before any call is made.
//! - **Effect class** (crash recovery only): `readOnlyHint: true` → `read_only` (re-run after a
//!   crash); else `idempotentHint: true` → `idempotent_write`; else `side_effecting`. The hints
//!   never loosen policy: `keel_tools::policy` gives no MCP tool the read-only auto-allow, so
//!   a server cannot declare itself safe.
//! - **Timeout**: the session's tool timeout, or the server's `tool_timeout_ms` when lower.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use serde_json::{Map, Value};

use crate::naming::tool_name;
use crate::server::McpServer;

/// One MCP tool.
pub struct McpTool {
    name: String,
    remote: String,
    description: String,
    schema: Value,
    effect: EffectClass,
    server: Arc<McpServer>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.name)
            .field("server", &self.server.name())
            .field("effect", &self.effect)
            .finish_non_exhaustive()
    }
}

/// The effect class the hints of `tool` suggest (see the module docs).
pub fn effect_of(tool: &rmcp::model::Tool) -> EffectClass {
    let hints = tool.annotations.as_ref();
    if hints.and_then(|h| h.read_only_hint) == Some(true) {
        EffectClass::ReadOnly
    } else if hints.and_then(|h| h.idempotent_hint) == Some(true) {
        EffectClass::IdempotentWrite
    } else {
        EffectClass::SideEffecting
    }
}

/// The server's input schema made strict (see the module docs).
pub fn strict_schema(schema: &Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    schema.insert("type".into(), Value::String("object".into()));
    schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    schema.insert("additionalProperties".into(), Value::Bool(false));
    Value::Object(schema)
}

impl McpTool {
    /// The keel tool for `tool` of `server`.
    pub fn new(server: Arc<McpServer>, tool: &rmcp::model::Tool) -> Self {
        let description = tool
            .description
            .as_deref()
            .map(str::to_owned)
            .or_else(|| tool.title.clone())
            .unwrap_or_else(|| format!("Tool `{}` of MCP server `{}`.", tool.name, server.name()));
        Self {
            name: tool_name(server.name(), &tool.name),
            remote: tool.name.to_string(),
            description,
            schema: strict_schema(&tool.input_schema),
            effect: effect_of(tool),
            server,
        }
    }

    /// The server's name for the tool.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }

    /// The server the tool belongs to.
    pub fn server(&self) -> &Arc<McpServer> {
        &self.server
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn effect(&self) -> EffectClass {
        self.effect
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return ToolOutput::rejected(format!(
                    "`{}` takes an object of arguments, not {other}",
                    self.name
                ));
            }
        };
        let session_ms = ctx.limits.shell_max_timeout_ms.max(1);
        let timeout_ms = self
            .server
            .config()
            .tool_timeout_ms
            .map_or(session_ms, |ms| ms.min(session_ms));
        self.server
            .call(
                &self.remote,
                arguments,
                ctx,
                Duration::from_millis(timeout_ms),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(annotations: Value) -> rmcp::model::Tool {
        serde_json::from_value(json!({
            "name": "t", "inputSchema": {"type": "object"}, "annotations": annotations
        }))
        .unwrap()
    }

    #[test]
    fn hints_give_the_effect_class() {
        assert_eq!(
            effect_of(&tool(json!({"readOnlyHint": true}))),
            EffectClass::ReadOnly
        );
        assert_eq!(
            effect_of(&tool(
                json!({"idempotentHint": true, "destructiveHint": true})
            )),
            EffectClass::IdempotentWrite
        );
        assert_eq!(effect_of(&tool(json!({}))), EffectClass::SideEffecting);
    }

    #[test]
    fn schemas_are_made_strict() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true});
        let Value::Object(map) = schema else {
            unreachable!()
        };
        assert_eq!(
            strict_schema(&map),
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false})
        );
        assert_eq!(
            strict_schema(&Map::new()),
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
    }
}
