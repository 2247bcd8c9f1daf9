//! Long-term memory (issue 15, item 3): the `memory_read`, `memory_write` and `memory_search`
//! tools over the tenant-scoped memory store — namespaces per agent, per user or shared, the
//! value size limit, secrets refused, writes journaled as effects, full-text search — on both
//! stores.

use std::time::Duration;

use keel_core::{
    AgentDefinition, Budget, EventBody, PrincipalId, Release, SessionId, SessionStatus, TenantId,
};
use keel_runtime::memory::{MemoryScope, MemorySettings, memory_tools};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    an_agent_writes_reads_and_searches_its_own_memory,
    agents_do_not_see_each_others_memory,
    user_memory_follows_the_sessions_creator_and_shared_memory_the_tenant,
    oversized_values_and_secrets_are_refused_and_nothing_is_stored,
    reads_run_unasked_and_writes_ask_or_are_denied_like_other_writes,
    malformed_keys_and_namespaces_are_refused_before_the_call_starts,
);

fn agent(name: &str) -> Release {
    Release::new(AgentDefinition {
        name: name.into(),
        model_route: vec!["scripted".into()],
        instructions: "You remember things.".into(),
        tools: Vec::new(),
        policy: Value::Null,
        budget: Budget::default(),
        mcp_servers: Default::default(),
        agents: Default::default(),
    })
}

/// A runtime whose registry has the built-in tools and the memory tools over `db`'s store.
fn memory_runtime(db: &Db, lines: &[Value], settings: MemorySettings) -> Runtime {
    let mut tools = registry();
    for tool in memory_tools(db.store.clone(), settings) {
        tools.register(tool).unwrap();
    }
    Runtime::new(
        db.store.clone(),
        scripted(lines),
        tools,
        RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    )
}

fn call(name: &str, args: Value) -> Value {
    json!({"tool_calls": [{"name": name, "arguments": args}]})
}

/// Runs one turn of `input` in a new session of `release` (created through `rt`) and returns
/// the session with the `tool_call.finished` outputs (status, output) in order.
async fn turn(
    rt: &Runtime,
    tenant: TenantId,
    release: &Release,
    cfg: SessionConfig,
    input: &str,
) -> (SessionId, Vec<(String, String)>) {
    let session = rt.create_session(tenant, release, cfg).await.unwrap();
    rt.submit(tenant, session, input).await.unwrap();
    rt.run(tenant, session).await.unwrap();
    (session, finished(rt, tenant, session).await)
}

async fn finished(rt: &Runtime, tenant: TenantId, session: SessionId) -> Vec<(String, String)> {
    rt.store()
        .read(tenant, session, 1, None)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::ToolCallFinished { status, output, .. } => {
                Some((keel_core::StateMachine::as_str(status).to_owned(), output))
            }
            _ => None,
        })
        .collect()
}

/// `memory_write` stores the value in the agent's namespace (`agent:<name>`, or
/// `agent:<name>/<namespace>`) with its effect journaled (prepared with a probe, dispatched,
/// committed); `memory_read` gives it back; `memory_search` finds it by words of its value or
/// key, best match first, only in the namespace asked.
async fn an_agent_writes_reads_and_searches_its_own_memory(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let rt = memory_runtime(
        &db,
        &[
            call(
                "memory_write",
                json!({"key": "build", "value": "run cargo nextest before committing"}),
            ),
            call(
                "memory_write",
                json!({"key": "deploy", "value": {"how": "the deploy script", "when": "never on Fridays"}}),
            ),
            call(
                "memory_write",
                json!({"namespace": "people", "key": "owner", "value": "Ada runs the deploy"}),
            ),
            call("memory_read", json!({"key": "build"})),
            call("memory_read", json!({"key": "missing"})),
            call("memory_search", json!({"query": "DEPLOY script"})),
            call(
                "memory_search",
                json!({"query": "deploy", "namespace": "people"}),
            ),
            call("memory_search", json!({"query": "nothing matches this"})),
            json!({"text": "remembered"}),
        ],
        MemorySettings::default(),
    );
    let (session, results) = turn(&rt, tenant, &agent("coder"), config(ws.path()), "go").await;
    let statuses: Vec<&str> = results.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(statuses, vec!["succeeded"; 8], "{results:#?}");
    let read: Value = serde_json::from_str(&results[3].1).unwrap();
    assert_eq!(read["key"], "build");
    assert_eq!(read["value"], "run cargo nextest before committing");
    assert_eq!(read["namespace"], Value::Null);
    assert!(results[4].1.contains("No memory entry \"missing\""));
    let found: Value = serde_json::from_str(&results[5].1).unwrap();
    let keys: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        vec!["deploy"],
        "only the default namespace is searched"
    );
    let found: Value = serde_json::from_str(&results[6].1).unwrap();
    assert_eq!(found[0]["key"], "owner");
    assert_eq!(found[0]["namespace"], "people");
    assert!(results[7].1.contains("No memory entry matches"));

    // Stored in the agent's namespaces of the session's tenant.
    let store = db.store.clone();
    let e = store
        .memory_get(tenant, "agent:coder", "build")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.value, json!("run cargo nextest before committing"));
    assert!(
        store
            .memory_get(tenant, "agent:coder/people", "owner")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .memory_get(TenantId::new(), "agent:coder", "build")
            .await
            .unwrap()
            .is_none()
    );

    // Each write is an effect: intent (with the probe) before, outcome after.
    let events = store.read(tenant, session, 1, None).await.unwrap();
    let effects: Vec<&str> = events
        .iter()
        .map(|e| e.type_name())
        .filter(|t| t.starts_with("effect."))
        .collect();
    assert_eq!(
        effects,
        ["effect.prepared", "effect.dispatched", "effect.committed"].repeat(3)
    );
    let probe = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::EffectPrepared { probe, .. } => probe.clone(),
            _ => None,
        })
        .unwrap();
    assert_eq!(probe["before"], "absent");
    assert!(probe["after"].as_str().unwrap().starts_with("hmac-sha256:"));
}

/// Per-agent namespaces (the default): another agent of the same tenant finds nothing of what
/// the first one wrote, and a session of the same agent finds it.
async fn agents_do_not_see_each_others_memory(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let writer = memory_runtime(
        &db,
        &[
            call(
                "memory_write",
                json!({"key": "secret_plan", "value": "paint it blue"}),
            ),
            json!({"text": "ok"}),
        ],
        MemorySettings::default(),
    );
    turn(&writer, tenant, &agent("painter"), config(ws.path()), "go").await;
    let reader = memory_runtime(
        &db,
        &[
            call("memory_read", json!({"key": "secret_plan"})),
            call("memory_search", json!({"query": "blue"})),
            json!({"text": "ok"}),
        ],
        MemorySettings::default(),
    );
    let (_, other) = turn(&reader, tenant, &agent("critic"), config(ws.path()), "go").await;
    assert!(other[0].1.contains("No memory entry"), "{other:?}");
    assert!(other[1].1.contains("No memory entry matches"), "{other:?}");
    let (_, same) = turn(&reader, tenant, &agent("painter"), config(ws.path()), "go").await;
    assert!(same[0].1.contains("paint it blue"), "{same:?}");
    assert!(same[1].1.contains("secret_plan"), "{same:?}");
}

/// `namespace = "user"`: the memory of the principal that created the session (the same agent
/// run for two people keeps two memories); `namespace = "shared"`: one memory for the tenant,
/// and still none of another tenant's.
async fn user_memory_follows_the_sessions_creator_and_shared_memory_the_tenant(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let (ada, bob) = (PrincipalId::new(), PrincipalId::new());
    let lines = [
        call("memory_read", json!({"key": "editor"})),
        call("memory_write", json!({"key": "editor", "value": "vim"})),
        json!({"text": "ok"}),
    ];
    for (scope, bob_sees_ada) in [(MemoryScope::User, false), (MemoryScope::Shared, true)] {
        let tenant = if scope == MemoryScope::Shared {
            TenantId::new()
        } else {
            tenant
        };
        let settings = MemorySettings {
            scope,
            ..MemorySettings::default()
        };
        let rt = memory_runtime(&db, &lines, settings);
        // What the first call (the read) of a new session answered.
        let read_as = |who: PrincipalId, tenant: TenantId| {
            let (rt, path) = (rt.acting_as(who), ws.path().to_owned());
            async move {
                let (_, mut results) =
                    turn(&rt, tenant, &agent("helper"), config(&path), "go").await;
                results.remove(0).1
            }
        };
        let first = read_as(ada, tenant).await;
        assert!(first.contains("No memory entry"), "{first}");
        let second = read_as(bob, tenant).await;
        assert_eq!(second.contains("vim"), bob_sees_ada, "{scope:?}: {second}");
        let again = read_as(ada, tenant).await;
        assert!(again.contains("vim"), "{scope:?}: {again}");
        // Another tenant's session of the same agent, by the same principal: nothing.
        let elsewhere = read_as(ada, TenantId::new()).await;
        assert!(elsewhere.contains("No memory entry"), "{elsewhere}");
    }
    let store = db.store.clone();
    for p in [ada, bob] {
        assert!(
            store
                .memory_get(tenant, &format!("user:{p}"), "editor")
                .await
                .unwrap()
                .is_some()
        );
    }
    // A session the local host created (no principal) uses `user:local`.
    let rt = memory_runtime(
        &db,
        &lines,
        MemorySettings {
            scope: MemoryScope::User,
            ..MemorySettings::default()
        },
    );
    turn(&rt, tenant, &agent("helper"), config(ws.path()), "go").await;
    assert!(
        store
            .memory_get(tenant, "user:local", "editor")
            .await
            .unwrap()
            .is_some()
    );
}

/// A value over `max_value_bytes` (as compact JSON) and a value, key or sub-namespace holding a
/// secret (a built-in pattern, the session's configured pattern) are refused with a tool error saying why;
/// nothing is stored, and the refused calls changed nothing (their effect is not committed).
async fn oversized_values_and_secrets_are_refused_and_nothing_is_stored(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let big = "x".repeat(200);
    let rt = memory_runtime(
        &db,
        &[
            call("memory_write", json!({"key": "big", "value": big})),
            call(
                "memory_write",
                json!({"key": "token", "value": {"note": "the key is sk-ant-abcdefghijklmnopqrstuv"}}),
            ),
            call(
                "memory_write",
                json!({"key": "internal tok_12345678", "value": "fine"}),
            ),
            call(
                "memory_write",
                json!({"namespace": "AKIAABCDEFGHIJKLMNOP", "key": "k", "value": "fine"}),
            ),
            call(
                "memory_write",
                json!({"key": "small", "value": "x".repeat(98)}),
            ),
            json!({"text": "ok"}),
        ],
        MemorySettings {
            scope: MemoryScope::Agent,
            max_value_bytes: 100,
        },
    );
    let mut cfg = config(ws.path());
    cfg.secret_patterns = vec!["tok_[0-9]{8}".into()];
    let (session, results) = turn(&rt, tenant, &agent("coder"), cfg, "go").await;
    assert_eq!(results.len(), 5, "{results:#?}");
    assert_eq!(results[0].0, "failed");
    assert!(
        results[0]
            .1
            .contains("the value is 202 bytes (as JSON), over the memory limit of 100 bytes"),
        "{}",
        results[0].1
    );
    for r in &results[1..4] {
        assert_eq!(r.0, "failed");
        assert!(
            r.1.contains("memory_write refused: the entry holds a secret"),
            "{r:?}"
        );
        assert!(!r.1.contains("sk-ant-"));
    }
    // 98 characters are 100 bytes of JSON: at the limit, stored.
    assert_eq!(results[4].0, "succeeded", "{:?}", results[4]);
    let stored = db
        .store
        .memory_list(tenant, "agent:coder", None, 100)
        .await
        .unwrap();
    assert_eq!(
        stored.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["small"]
    );
    let events = db.store.read(tenant, session, 1, None).await.unwrap();
    let committed = events
        .iter()
        .filter(|e| e.type_name() == "effect.committed")
        .count();
    let failed = events
        .iter()
        .filter(|e| e.type_name() == "effect.failed")
        .count();
    assert_eq!((committed, failed), (1, 4));
}

/// In the default permission mode `memory_read` and `memory_search` run without asking (like
/// `read_file`) and `memory_write` waits for an approval (like `write_file`); in `read_only`
/// mode the write is denied and nothing is stored.
async fn reads_run_unasked_and_writes_ask_or_are_denied_like_other_writes(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    db.store
        .memory_put(tenant, "agent:coder", "seed", &json!("seeded value"))
        .await
        .unwrap();
    let lines = [
        call("memory_read", json!({"key": "seed"})),
        call("memory_search", json!({"query": "seeded"})),
        call("memory_write", json!({"key": "new", "value": "v"})),
        json!({"text": "ok"}),
    ];
    let rt = memory_runtime(&db, &lines, MemorySettings::default());
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Default;
    let session = rt
        .create_session(tenant, &agent("coder"), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    assert_eq!(out.pending.len(), 1, "only the write asks");
    let results = finished(&rt, tenant, session).await;
    assert_eq!(results.len(), 2);
    assert!(results[0].1.contains("seeded value"));
    assert!(results[1].1.contains("seed"));

    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::ReadOnly;
    let (_, results) = turn(&rt, tenant, &agent("coder"), cfg, "go").await;
    assert_eq!(results.len(), 3);
    assert_eq!(results[2].0, "rejected", "{results:?}");
    assert!(
        db.store
            .memory_get(tenant, "agent:coder", "new")
            .await
            .unwrap()
            .is_none()
    );
}

/// A malformed key or sub-namespace (empty, a control character, a `/`, `..`) is refused when
/// the call is validated: a tool error the model sees, no `tool_call.started`, no effect, and the
/// turn goes on. (Refused inside the tool after the call had started, a read once re-ran forever
/// — `running -> rejected` is illegal — and a write failed the turn; attack review of issue 15.)
async fn malformed_keys_and_namespaces_are_refused_before_the_call_starts(backend: Backend) {
    let db = db(backend).await;
    let ws = workspace();
    let tenant = TenantId::new();
    let bad = [
        ("memory_read", json!({"key": ""})),
        ("memory_read", json!({"key": "a\u{7}b"})),
        ("memory_search", json!({"query": "x", "namespace": "a/b"})),
        ("memory_write", json!({"key": "", "value": 1})),
        (
            "memory_write",
            json!({"namespace": "../x", "key": "k", "value": 1}),
        ),
        (
            "memory_write",
            json!({"namespace": "", "key": "k", "value": 1}),
        ),
    ];
    let mut lines: Vec<Value> = bad.iter().map(|(n, a)| call(n, a.clone())).collect();
    lines.push(json!({"text": "ok"}));
    let rt = memory_runtime(&db, &lines, MemorySettings::default());
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Bypass;
    let session = rt
        .create_session(tenant, &agent("coder"), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), rt.run(tenant, session))
        .await
        .expect("the turn must end")
        .unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(
        out.turns[0].terminal_reason,
        keel_core::TerminalReason::Completed
    );
    let results = finished(&rt, tenant, session).await;
    assert_eq!(results.len(), bad.len(), "{results:#?}");
    for (r, (tool, args)) in results.iter().zip(&bad) {
        assert_eq!(r.0, "rejected", "{tool} {args}: {r:?}");
        assert!(
            r.1.to_lowercase().contains("invalid arguments"),
            "{tool} {args}: {r:?}"
        );
    }
    let events = db.store.read(tenant, session, 1, None).await.unwrap();
    let count = |t: &str| events.iter().filter(|e| e.type_name() == t).count();
    assert_eq!(count("tool_call.started"), 0);
    assert_eq!(count("effect.prepared") + count("effect.dispatched"), 0);
    assert!(
        db.store
            .memory_list(tenant, "agent:coder", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}
