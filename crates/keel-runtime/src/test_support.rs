//! Fixtures for this crate's unit tests: a runtime over a real store answering from a one-line
//! script, and the release its sessions pin.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentDefinition, Budget, Release};
use keel_model::{Script, ScriptedModel};
use keel_store::Store;

use crate::{Runtime, RuntimeOptions};

/// A runtime on `store` named `worker_name` (its lease owner), whose model answers "done",
/// waiting `lease_wait` for a session another worker holds.
pub(crate) fn scripted_runtime(
    store: Arc<dyn Store>,
    worker_name: &str,
    lease_wait: Duration,
) -> Runtime {
    let model: Arc<dyn keel_model::ModelClient> = Arc::new(ScriptedModel::new(
        Script::parse("t.jsonl", r#"{"text":"done"}"#).unwrap(),
    ));
    Runtime::new(
        store,
        model,
        keel_tools::ToolRegistry::with_builtins().unwrap(),
        RuntimeOptions {
            worker_name: worker_name.into(),
            lease_wait,
            ..RuntimeOptions::default()
        },
    )
}

/// A release of the scripted model, no tools, no policy.
pub(crate) fn scripted_release() -> Release {
    Release::new(AgentDefinition {
        name: "t".into(),
        model_route: vec!["scripted".into()],
        instructions: "test".into(),
        tools: Vec::new(),
        policy: serde_json::Value::Null,
        budget: Budget::default(),
        mcp_servers: Default::default(),
        agents: Default::default(),
    })
}
