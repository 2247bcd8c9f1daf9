//! Authorization, generated from `/openapi.json`: every operation of the served document is
//! called as {no key, another tenant's admin, a system key, viewer, operator, admin}, and each
//! answer is checked against the operation's row below. An operation without a row fails the
//! test (so a new route cannot ship without deciding who may call it), as does a row without an
//! operation.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(every_operation_answers_each_kind_of_caller_as_its_row_says);

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Anyone, without a key.
    Public,
    /// System keys only.
    System,
    /// A tenant key of at least this role.
    Viewer,
    Operator,
    Admin,
}

/// What another tenant's admin gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Other {
    /// 404, exactly as for a missing id: the path names this tenant's resource.
    NotFound,
    /// It acts in its own tenant (lists, creations): allowed.
    Own,
    /// 403: a system operation.
    Forbidden,
    /// As anyone (public).
    Public,
}

fn rows() -> BTreeMap<&'static str, (Need, Other)> {
    use Need::*;
    use Other::{Forbidden, NotFound, Own};
    BTreeMap::from([
        ("healthz", (Public, Other::Public)),
        ("readyz", (Public, Other::Public)),
        ("openapi", (Public, Other::Public)),
        ("create_tenant", (System, Forbidden)),
        ("list_tenants", (System, Forbidden)),
        ("get_tenant", (System, Forbidden)),
        ("create_tenant_key", (System, Forbidden)),
        ("create_key", (Admin, Own)),
        ("list_keys", (Admin, Own)),
        ("revoke_key", (Admin, NotFound)),
        ("create_release", (Admin, Own)),
        ("list_releases", (Viewer, Own)),
        ("get_release", (Viewer, NotFound)),
        ("create_session", (Operator, NotFound)),
        ("list_sessions", (Viewer, Own)),
        ("get_session", (Viewer, NotFound)),
        ("update_session", (Operator, NotFound)),
        ("delete_session", (Operator, NotFound)),
        ("close_session", (Operator, NotFound)),
        ("get_session_state", (Viewer, NotFound)),
        ("submit_turn", (Operator, NotFound)),
        ("list_turns", (Viewer, NotFound)),
        ("get_turn", (Viewer, NotFound)),
        ("cancel_turn", (Operator, NotFound)),
        ("cancel_tool_call", (Operator, NotFound)),
        ("session_events", (Viewer, NotFound)),
        ("tenant_events", (Viewer, Own)),
        ("list_approvals", (Viewer, Own)),
        ("list_session_approvals", (Viewer, NotFound)),
        ("get_approval", (Viewer, NotFound)),
        ("decide_approval", (Operator, NotFound)),
        ("list_effects", (Viewer, NotFound)),
        ("decide_effect", (Operator, NotFound)),
        ("list_artifacts", (Viewer, NotFound)),
        ("get_artifact", (Viewer, NotFound)),
        ("get_usage", (Viewer, Own)),
        ("list_memory", (Viewer, Own)),
        ("get_memory", (Viewer, NotFound)),
        ("put_memory", (Operator, Own)),
        ("delete_memory", (Operator, Own)),
    ])
}

/// The ids one operation's calls use: a session of this tenant waiting on an approval, with
/// an artifact; a memory entry; a key to revoke.
struct Ids(BTreeMap<&'static str, String>);

async fn fixture(s: &TestServer, release: &str) -> Ids {
    let created = s.session(release, json!({})).await;
    let session = created.body["session_id"].as_str().unwrap().to_owned();
    let turn = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "write"}),
        )
        .await;
    let turn_id = turn.body["turn_id"].as_str().unwrap().to_owned();
    s.wait_session(&session, |b| b["status"] == "requires_action")
        .await;
    let approvals = s
        .get(&format!("/v1/sessions/{session}/approvals"), &s.viewer)
        .await;
    let a = &approvals.body["items"][0];
    let sid: keel_core::SessionId = session.parse().unwrap();
    let artifact = s
        .store
        .put_artifact(s.tenant, sid, "out.txt", "text/plain", b"all of it")
        .await
        .unwrap();
    s.store
        .memory_put(s.tenant, "ns", "k", &json!("v"))
        .await
        .unwrap();
    let key = s
        .post(
            "/v1/keys",
            &s.admin,
            &json!({"name": "to-revoke", "role": "viewer"}),
        )
        .await;
    let release_id = release.to_owned();
    Ids(BTreeMap::from([
        ("session_id", session),
        ("turn_id", turn_id),
        ("approval_id", a["approval_id"].as_str().unwrap().to_owned()),
        ("args_hash", a["args_hash"].as_str().unwrap().to_owned()),
        (
            "tool_call_id",
            a["tool_call_id"].as_str().unwrap().to_owned(),
        ),
        ("operation_key", "no-such-effect".to_owned()),
        ("artifact_id", artifact),
        ("key_id", key.body["key_id"].as_str().unwrap().to_owned()),
        ("tenant_id", s.tenant.to_string()),
        ("release_id", release_id),
        ("namespace", "ns".to_owned()),
        ("key", "k".to_owned()),
    ]))
}

fn body_of(op: &str, ids: &Ids, s: &TestServer, n: usize) -> Option<Value> {
    Some(match op {
        "create_tenant" => json!({"name": format!("tenant-{n}-{}", uuid::Uuid::now_v7())}),
        "create_tenant_key" | "create_key" => json!({"name": "k", "role": "viewer"}),
        "create_release" => {
            json!({"name": format!("r{n}"), "model_route": ["script:/nonexistent.jsonl"]})
        }
        "create_session" => {
            json!({"release_id": ids.0["release_id"], "workspace": s.workspace.display().to_string()})
        }
        "update_session" => json!({"settings": {"multitask": "enqueue"}}),
        "submit_turn" => json!({"input": "more"}),
        "decide_approval" => {
            json!({"decision": "deny", "args_hash": ids.0["args_hash"], "reason": "no"})
        }
        "decide_effect" => json!({"decision": "retry"}),
        "put_memory" => json!({"value": 1}),
        "close_session" | "cancel_turn" | "cancel_tool_call" | "revoke_key" => json!({}),
        _ => return None,
    })
}

/// Calls without reading an event stream's body.
async fn status_of(
    s: &TestServer,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let mut rb = s
        .http
        .request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", s.base),
        )
        .header("if-match", "*");
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let res = tokio::time::timeout(Duration::from_secs(20), rb.send())
        .await
        .expect("no answer within 20 s")
        .unwrap();
    let status = res.status();
    let sse = res
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
    if sse {
        return (status, Value::Null);
    }
    let bytes = res.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn every_operation_answers_each_kind_of_caller_as_its_row_says(b: Backend) {
    let s = start(b).await;
    let doc = s.call("GET", "/openapi.json", None, None, &[]).await.body;
    let release = s
        .release(
            "authz",
            &[
                json!({"tool_calls": [call("write_file", json!({"path": "a.txt", "content": "a"}))]}),
                json!({"text": "ok"}),
            ],
            &["write_file"],
        )
        .await;
    let rows = rows();
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if !["get", "put", "post", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            ops.push((
                method.to_uppercase(),
                path.clone(),
                op["operationId"].as_str().unwrap().to_owned(),
            ));
        }
    }
    let missing: Vec<&String> = ops
        .iter()
        .map(|o| &o.2)
        .filter(|id| !rows.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "operations without an authorization row: {missing:?}"
    );
    let extra: Vec<&&str> = rows
        .keys()
        .filter(|k| !ops.iter().any(|o| o.2 == **k))
        .collect();
    assert!(extra.is_empty(), "rows without an operation: {extra:?}");
    let callers: [(&str, Option<&str>); 6] = [
        ("no key", None),
        ("other tenant", Some(&s.other)),
        ("system", Some(&s.system)),
        ("viewer", Some(&s.viewer)),
        ("operator", Some(&s.operator)),
        ("admin", Some(&s.admin)),
    ];
    for (n, (method, template, op)) in ops.iter().enumerate() {
        let (need, other) = rows[op.as_str()];
        let ids = fixture(&s, &release).await;
        let mut path = template.clone();
        for (k, v) in &ids.0 {
            path = path.replace(&format!("{{{k}}}"), v);
        }
        assert!(!path.contains('{'), "{op}: unfilled {path}");
        let body = body_of(op, &ids, &s, n);
        for (who, key) in callers {
            let (status, answer) = status_of(&s, method, &path, key, body.as_ref()).await;
            let ctx = format!("{op} ({method} {path}) as {who}: {status} {answer}");
            assert!(status.as_u16() < 500, "{ctx}");
            let allowed = |role: &str| match need {
                Need::Public => true,
                Need::System => role == "system",
                Need::Viewer => ["viewer", "operator", "admin"].contains(&role),
                Need::Operator => ["operator", "admin"].contains(&role),
                Need::Admin => role == "admin",
            };
            match who {
                "no key" if need == Need::Public => assert!(status.is_success(), "{ctx}"),
                "no key" => {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{ctx}");
                    assert_eq!(answer["type"], "urn:keel:problem:unauthorized", "{ctx}");
                }
                "other tenant" => match other {
                    Other::Public => assert!(status.is_success(), "{ctx}"),
                    Other::Forbidden => assert_eq!(status, StatusCode::FORBIDDEN, "{ctx}"),
                    Other::NotFound => {
                        assert_eq!(status, StatusCode::NOT_FOUND, "{ctx}");
                        assert_eq!(answer["type"], "urn:keel:problem:not-found", "{ctx}");
                    }
                    Other::Own => assert!(
                        ![
                            StatusCode::UNAUTHORIZED,
                            StatusCode::FORBIDDEN,
                            StatusCode::NOT_FOUND
                        ]
                        .contains(&status),
                        "{ctx}"
                    ),
                },
                role if allowed(role) => assert!(
                    ![
                        StatusCode::UNAUTHORIZED,
                        StatusCode::FORBIDDEN,
                        StatusCode::NOT_FOUND,
                        StatusCode::METHOD_NOT_ALLOWED
                    ]
                    .contains(&status),
                    "{ctx}"
                ),
                _ => {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{ctx}");
                    assert_eq!(answer["type"], "urn:keel:problem:forbidden", "{ctx}");
                }
            }
        }
    }
}
