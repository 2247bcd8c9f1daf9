//! Every API operation of the served OpenAPI document, called with tenant A's admin key on
//! tenant B's ids and on ids nobody has: the two answers must be the same (status and body,
//! the ids themselves aside); operations without ids must show A nothing of B's; afterwards
//! B's session, approval, effect, memory, keys and artifact are as they were.

use std::collections::BTreeMap;

use chrono::Utc;
use keel_core::{EffectStatus, OperationKey, SessionId, TenantId, ToolCallId};
use keel_store::{EffectRecord, EffectUpdate};
use serde_json::{Value, json};

use crate::common::{Env, stdout};
use crate::release_validation::harness::{Api, Backend, FreshStore, pending_approval};
use crate::remote::{Options, serve_with};

/// B's ids under the names the API's path parameters use, and ids of the same shapes that
/// nobody has.
struct Ids {
    b: BTreeMap<&'static str, String>,
    missing: BTreeMap<&'static str, String>,
}

/// An id of the same shape as `id` that no tenant has.
fn missing_like(name: &str, id: &str) -> String {
    if id.parse::<uuid::Uuid>().is_ok() {
        uuid::Uuid::now_v7().to_string()
    } else if id.starts_with("sha256:") {
        format!("sha256:{}", "0".repeat(64))
    } else {
        format!("{id}-nobody-{name}")
    }
}

/// The JSON body an operation is called with (`{}` for an operation this test has no body
/// for: both variants get the same).
fn body_of(op: &str, ids: &BTreeMap<&'static str, String>, ws: &str) -> Option<Value> {
    Some(match op {
        "create_tenant" => json!({"name": format!("t-{}", uuid::Uuid::now_v7())}),
        "create_tenant_key" | "create_key" => json!({"name": "k", "role": "viewer"}),
        "create_release" => {
            json!({"name": "a-release", "model_route": ["script:/nonexistent.jsonl"]})
        }
        "create_session" => json!({"release_id": ids["release_id"], "workspace": ws}),
        "update_session" => json!({"settings": {"multitask": "enqueue"}}),
        "submit_turn" => json!({"input": "from another tenant"}),
        "decide_approval" => {
            json!({"decision": "allow_once", "args_hash": ids["args_hash"], "reason": "A says so"})
        }
        "decide_effect" => json!({"decision": "committed"}),
        "put_memory" => json!({"value": "written by A"}),
        _ => return None,
    })
}

/// `text` with every value of `ids` replaced by `<id>` and every RFC 3339 time
/// (`2026-12-04T16:54:26.589Z`) by `<ts>`.
fn normalized(text: &str, ids: &BTreeMap<&'static str, String>) -> String {
    let mut values: Vec<&String> = ids.values().collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut t = text.to_owned();
    for v in values {
        t = t.replace(v.as_str(), "<id>");
    }
    let mut out = String::new();
    let mut rest = t.as_str();
    while let Some(pos) = rest.find('T') {
        let stamp = pos >= 10
            && rest.is_char_boundary(pos - 10)
            && chrono::DateTime::parse_from_rfc3339(
                rest[pos - 10..]
                    .split(['"', ' ', ','])
                    .next()
                    .unwrap_or_default(),
            )
            .is_ok();
        if stamp {
            let end = rest[pos - 10..]
                .find(['"', ' ', ','])
                .map_or(rest.len(), |e| pos - 10 + e);
            out.push_str(&rest[..pos - 10]);
            out.push_str("<ts>");
            rest = &rest[end..];
        } else {
            out.push_str(&rest[..=pos]);
            rest = &rest[pos + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// The operations of the served document: `(method, path template, operationId)`, reads
/// first, deletions last (so A's own writes under B's names, which the API allows, never make
/// a read differ from the nonexistent case).
fn operations(doc: &Value) -> Vec<(String, String, String)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if ["get", "put", "post", "patch", "delete"].contains(&method.as_str()) {
                ops.push((
                    method.to_uppercase(),
                    path.clone(),
                    op["operationId"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    let rank = |m: &str| match m {
        "GET" => 0,
        "DELETE" => 2,
        _ => 1,
    };
    ops.sort_by_key(|(m, p, _)| (rank(m), p.clone()));
    ops
}

/// How many events `sid`'s journal holds, read by its owner `b`.
async fn journal_len(b: &Api, sid: &str) -> usize {
    b.ok(
        "GET",
        &format!("/v1/sessions/{sid}/events?limit=1000"),
        None,
    )
    .await["items"]
        .as_array()
        .unwrap()
        .len()
}

/// `template` with its `{name}` parameters filled from `ids`; panics naming the route for a
/// parameter the test does not know.
fn fill(template: &str, op: &str, ids: &BTreeMap<&'static str, String>) -> String {
    let mut path = template.to_owned();
    for (k, v) in ids {
        path = path.replace(&format!("{{{k}}}"), v);
    }
    assert!(
        !path.contains('{'),
        "{op} ({template}): a path parameter this test cannot fill — add it to the ids"
    );
    path
}

/// B (tenant `acme`, the served key) with a session waiting on an approval, a memory entry,
/// a second key, an artifact and an effect whose outcome is unknown; A (tenant `globex`) with
/// an admin key of its own.
pub(super) async fn every_api_route_across_the_boundary(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let env = Env::new();
    let served = serve_with(
        &env,
        &Options {
            store: Some(&fresh.location),
            server_toml: "\n[scheduler]\npoll_ms = 100\n",
            ..Options::default()
        },
    );
    let created = env.run(&["tenants", "create", "globex"]);
    assert!(created.status.success());
    let a_key = stdout(&env.run(&[
        "keys", "create", "--tenant", "globex", "--name", "mallory", "--role", "admin",
    ]))
    .trim()
    .to_owned();
    let b = Api::new(&served.url, Some(&served.key));
    let a = Api::new(&served.url, Some(&a_key));
    let b_tenant: TenantId = stdout(&env.run(&["tenants", "list"]))
        .lines()
        .find(|l| l.ends_with("  acme"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();

    // B's things.
    env.write(
        "b.jsonl",
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"b.txt\",\"content\":\"b\"}}]}\n{\"text\":\"done\"}\n",
    );
    let release = b
        .ok(
            "POST",
            "/v1/releases",
            Some(&json!({
                "name": "b-release",
                "model_route": [format!("script:{}", env.path("b.jsonl").display())],
                "tools": ["write_file"],
                "policy": {},
            })),
        )
        .await;
    let session = b
        .ok(
            "POST",
            "/v1/sessions",
            Some(&json!({"release_id": release["release_id"], "workspace": env.ws().display().to_string()})),
        )
        .await;
    let sid = session["session_id"].as_str().unwrap().to_owned();
    let turn = b
        .ok(
            "POST",
            &format!("/v1/sessions/{sid}/turns"),
            Some(&json!({"input": "write b"})),
        )
        .await;
    let approval = pending_approval(&b, &sid).await;
    b.ok(
        "PUT",
        "/v1/memory/bns-victim/bkey-victim",
        Some(&json!({"value": "b-secret"})),
    )
    .await;
    let extra_key = b
        .ok(
            "POST",
            "/v1/keys",
            Some(&json!({"name": "b-extra", "role": "viewer"})),
        )
        .await;
    let store = fresh.open().await;
    let session_id: SessionId = sid.parse().unwrap();
    let artifact = store
        .put_artifact(b_tenant, session_id, "b.txt", "text/plain", b"b's bytes")
        .await
        .unwrap();
    let op_key = format!("{sid}/step_b/call_b");
    let now = Utc::now();
    store
        .insert_effect(
            b_tenant,
            &EffectRecord {
                operation_key: OperationKey::from(op_key.as_str()),
                session_id,
                tool_call_id: ToolCallId::from("call_b"),
                tool_name: "shell".into(),
                status: EffectStatus::Prepared,
                request_hash: "sha256:b".into(),
                attempts: 0,
                outcome: None,
                error: None,
                created_at: now,
                updated_at: now,
            },
        )
        .await
        .unwrap();
    for (from, to) in [
        (EffectStatus::Prepared, EffectStatus::Dispatched),
        (EffectStatus::Dispatched, EffectStatus::OutcomeUnknown),
    ] {
        store
            .update_effect(
                b_tenant,
                &OperationKey::from(op_key.as_str()),
                EffectUpdate {
                    from,
                    to,
                    outcome: None,
                    error: None,
                },
            )
            .await
            .unwrap();
    }
    let b_ids: BTreeMap<&'static str, String> = BTreeMap::from([
        ("session_id", sid.clone()),
        ("turn_id", turn["turn_id"].as_str().unwrap().to_owned()),
        (
            "approval_id",
            approval["approval_id"].as_str().unwrap().to_owned(),
        ),
        (
            "args_hash",
            approval["args_hash"].as_str().unwrap().to_owned(),
        ),
        (
            "tool_call_id",
            approval["tool_call_id"].as_str().unwrap().to_owned(),
        ),
        ("operation_key", op_key.clone()),
        ("artifact_id", artifact.clone()),
        ("key_id", extra_key["key_id"].as_str().unwrap().to_owned()),
        ("tenant_id", b_tenant.to_string()),
        (
            "release_id",
            release["release_id"].as_str().unwrap().to_owned(),
        ),
        ("namespace", "bns-victim".to_owned()),
        ("key", "bkey-victim".to_owned()),
    ]);
    let mut missing: BTreeMap<&'static str, String> = b_ids
        .iter()
        .map(|(k, v)| (*k, missing_like(k, v)))
        .collect();
    // The hash binds a decision to arguments, it names nothing: the same in both variants.
    missing.insert("args_hash", b_ids["args_hash"].clone());
    let ids = Ids { b: b_ids, missing };
    let before = b.ok("GET", &format!("/v1/sessions/{sid}"), None).await;
    let events_before = journal_len(&b, &sid).await;

    // Every operation, as A.
    let doc = a.ok("GET", "/openapi.json", None).await;
    let ops = operations(&doc);
    assert!(ops.len() >= 40, "{ops:?}");
    let a_ws = env.path("ws-a");
    std::fs::create_dir_all(&a_ws).unwrap();
    let a_ws = a_ws.display().to_string();
    let b_values: Vec<&String> = ids
        .b
        .iter()
        .filter(|(k, _)| **k != "args_hash")
        .map(|(_, v)| v)
        .collect();
    let mut tried = Vec::new();
    for (method, template, op) in &ops {
        let headers = [("if-match", "*")];
        let cross_path = fill(template, op, &ids.b);
        let cross_body = body_of(op, &ids.b, &a_ws).or_else(|| {
            ["POST", "PUT", "PATCH"]
                .contains(&method.as_str())
                .then(|| json!({}))
        });
        let (cross_status, cross) = a
            .call(method, &cross_path, cross_body.as_ref(), &headers)
            .await;
        let ctx = format!("{op} ({method} {cross_path}) as A: {cross_status} {cross}");
        assert!(cross_status < 500, "{ctx}");
        if template.contains('{')
            || cross_body
                .as_ref()
                .is_some_and(|b| b.to_string().contains(&ids.b["release_id"]))
        {
            // B's ids against ids nobody has: the same answer.
            let missing_path = fill(template, op, &ids.missing);
            let missing_body = body_of(op, &ids.missing, &a_ws).or(cross_body.clone());
            let (missing_status, nobody) = a
                .call(method, &missing_path, missing_body.as_ref(), &headers)
                .await;
            assert_eq!(
                (cross_status, normalized(&cross.to_string(), &ids.b)),
                (
                    missing_status,
                    normalized(&nobody.to_string(), &ids.missing)
                ),
                "{op}: B's ids answer A differently from ids nobody has ({method} {template})"
            );
            assert!(
                !(200..300).contains(&cross_status)
                    || ["put_memory", "get_memory", "delete_memory", "list_memory"]
                        .contains(&op.as_str()),
                "{ctx}"
            );
        } else {
            // No ids: A's own view, with nothing of B's in it.
            let text = cross.to_string();
            for v in &b_values {
                assert!(!text.contains(v.as_str()), "{ctx}: shows B's {v}");
            }
        }
        tried.push(op.clone());
    }
    eprintln!("tenant_isolation: {} operations tried as A", tried.len());

    // B's things are as they were.
    let after = b.ok("GET", &format!("/v1/sessions/{sid}"), None).await;
    assert_eq!(after, before, "B's session changed");
    let events_after = journal_len(&b, &sid).await;
    assert_eq!(events_after, events_before, "B's journal changed");
    let approval_after = b
        .ok(
            "GET",
            &format!("/v1/approvals/{}", ids.b["approval_id"]),
            None,
        )
        .await;
    assert_eq!(approval_after["status"], "pending", "{approval_after}");
    let memory = b.ok("GET", "/v1/memory/bns-victim/bkey-victim", None).await;
    assert_eq!(memory["value"], "b-secret", "{memory}");
    let keys = b.ok("GET", "/v1/keys", None).await;
    let extra = keys["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key_id"] == ids.b["key_id"].as_str())
        .cloned()
        .unwrap_or_else(|| panic!("B's key is gone: {keys}"));
    assert!(extra["revoked_at"].is_null(), "{extra}");
    let effect = store
        .get_effect(b_tenant, &OperationKey::from(op_key.as_str()))
        .await
        .unwrap();
    assert_eq!(effect.status, EffectStatus::OutcomeUnknown);
    let bytes = store.get_artifact(b_tenant, &artifact).await.unwrap();
    assert_eq!(bytes.data, b"b's bytes");
    drop(served);
}
