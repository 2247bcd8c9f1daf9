//! MCP tools in a running session: the release names the servers, the host's [`McpPool`]
//! provides them, and a tool-list change reaches the next step's snapshot, never the current
//! one (issue 14).

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_core::{AgentDefinition, Budget, EventBody, Release, TenantId};
use keel_mcp::McpPool;
use keel_model::{Script, ScriptedModel};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_store::SqlStore;
use keel_tools::ToolRegistry;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::test_server;

fn release(servers: BTreeMap<String, Value>) -> Release {
    Release::new(AgentDefinition {
        name: "mcp".into(),
        model_route: vec!["scripted".into()],
        instructions: String::new(),
        tools: Vec::new(),
        policy: Value::Null,
        budget: Budget::default(),
        mcp_servers: servers,
        agents: Default::default(),
    })
}

fn call(id: &str, name: &str) -> Value {
    json!({"id": id, "name": name, "arguments": {}})
}

/// What each call of the session ended with, in order: (tool, is_error, output).
async fn results(
    store: &SqlStore,
    tenant: TenantId,
    session: keel_core::SessionId,
) -> Vec<(String, bool, String)> {
    use keel_store::Store;
    let events = store.read(tenant, session, 1, None).await.unwrap();
    let mut names = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        let id = e.correlation.tool_call_id;
        match &e.body {
            EventBody::ToolCallProposed { name, .. } => {
                names.insert(id, name.clone());
            }
            EventBody::ToolCallFinished {
                output, is_error, ..
            } => out.push((names[&id].clone(), *is_error, output.clone())),
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_list_change_reaches_the_next_step_never_the_current_one() {
    for legacy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqlStore::open_sqlite(&dir.path().join("keel.db"))
                .await
                .unwrap(),
        );
        // Step 1 adds `extra` and, in the same step, calls it: refused as unknown (the step's
        // tools were taken before the change). Step 2 calls it: it runs.
        let script = [
            json!({"tool_calls": [call("c_add", "mcp__test__add_tool"), call("c_early", "mcp__test__extra")]}),
            json!({"tool_calls": [call("c_late", "mcp__test__extra")]}),
            json!({"text": "done"}),
        ]
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
        let model = Arc::new(ScriptedModel::new(
            Script::parse("t.jsonl", &script).unwrap(),
        ));
        let rt = Runtime::new(
            store.clone(),
            model,
            ToolRegistry::with_builtins().unwrap(),
            RuntimeOptions::default(),
        );
        let pool = Arc::new(McpPool::new(Vec::new(), true));
        rt.set_tool_provider(pool.clone());
        let mut args = vec![];
        if legacy {
            args.push("--legacy");
        }
        let servers = BTreeMap::from([(
            "test".to_owned(),
            json!({"command": test_server(), "args": args}),
        )]);
        let tenant = TenantId::new();
        let config = SessionConfig {
            workspace: ws.path().to_owned(),
            permission_mode: PermissionMode::Bypass,
            sandbox: keel_tools::sandbox::SandboxMode::Off,
            ..SessionConfig::default()
        };
        let session = rt
            .create_session(tenant, &release(servers), config)
            .await
            .unwrap();
        let before = rt.project_context(tenant, session).await.unwrap();
        let names = |s: &keel_runtime::context::ContextSnapshot| -> Vec<String> {
            s.tools.iter().map(|t| t.name.clone()).collect()
        };
        assert!(
            names(&before).contains(&"mcp__test__add_tool".to_owned()),
            "{:?}",
            names(&before)
        );
        assert!(!names(&before).contains(&"mcp__test__extra".to_owned()));

        rt.submit(tenant, session, "add a tool, then use it")
            .await
            .unwrap();
        let out = rt.run(tenant, session).await.unwrap();
        assert_eq!(out.turns.len(), 1);
        let results = results(&store, tenant, session).await;
        let extra: Vec<_> = results
            .iter()
            .filter(|(name, ..)| name == "mcp__test__extra")
            .collect();
        assert_eq!(extra.len(), 2, "legacy={legacy}: {results:?}");
        // The first (same step as the change) is unknown to its step; the second runs.
        assert!(
            extra[0].1 && extra[0].2.to_lowercase().contains("unknown tool"),
            "legacy={legacy}: {results:?}"
        );
        assert!(
            !extra[1].1 && extra[1].2.contains("extra ran"),
            "legacy={legacy}: {results:?}"
        );
        let after = rt.project_context(tenant, session).await.unwrap();
        assert!(
            names(&after).contains(&"mcp__test__extra".to_owned()),
            "{:?}",
            names(&after)
        );
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_names_its_servers_and_a_host_may_refuse_stdio_ones() {
    let servers = BTreeMap::from([("test".to_owned(), json!({"command": test_server()}))]);
    let refusing = McpPool::new(Vec::new(), false);
    let e = refusing.check(&servers).unwrap_err().to_string();
    assert!(e.contains("test") && e.contains("stdio"), "{e}");
    let http = BTreeMap::from([("docs".to_owned(), json!({"url": "http://127.0.0.1:9/mcp"}))]);
    refusing.check(&http).unwrap();
    let bad = BTreeMap::from([("x".to_owned(), json!({"command": "a", "url": "http://h/"}))]);
    let e = refusing.check(&bad).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
}

/// A release whose server never answers its handshake delays no other release's servers:
/// the pool does not hold its map across a start (attack review: one tenant's slow server
/// stalled every tenant's sessions on the node). The healthy set starts while the hanging one
/// is still inside its startup bound.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_never_answers_delays_no_other_release() {
    let ws = tempfile::tempdir().unwrap();
    let pool = Arc::new(McpPool::new(Vec::new(), true));
    let hanging = BTreeMap::from([(
        "slow".to_owned(),
        json!({"command": test_server(), "args": ["--hang"], "startup_timeout_ms": 30_000}),
    )]);
    let healthy = BTreeMap::from([("test".to_owned(), json!({"command": test_server()}))]);
    let slow = {
        let (pool, ws) = (pool.clone(), ws.path().to_owned());
        tokio::spawn(async move { pool.manager(&hanging, &ws).await.map(|(_, n)| n) })
    };
    // Let the hanging start take the pool first.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (manager, notices) = pool.manager(&healthy, ws.path()).await.unwrap();
    assert!(notices.is_empty(), "{notices:?}");
    assert!(
        !slow.is_finished(),
        "the hanging start is still within its bound"
    );
    assert!(
        manager
            .tools()
            .await
            .0
            .iter()
            .any(|t| t.name() == "mcp__test__add_tool")
    );
    slow.abort();
    pool.shutdown().await;
}
