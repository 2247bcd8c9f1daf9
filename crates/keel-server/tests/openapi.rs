//! The OpenAPI document is the contract: the routes the router serves and the operations the
//! document lists are the same set; it is OpenAPI 3.1; every request body denies unknown
//! fields; every operation but the public ones needs a key and documents its errors as
//! problem+json.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

fn doc_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if [
                "get", "put", "post", "patch", "delete", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                ops.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_routes_and_the_documents_operations_are_the_same_set() {
    let db = db(Backend::Sqlite).await;
    let deps = keel_server::Deps {
        store: db.store.clone(),
        models: Arc::new(Scripts),
        tools: Arc::new(keel_tools::ToolRegistry::with_builtins),
        runtime_options: keel_runtime::RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            ..keel_runtime::RuntimeOptions::default()
        },
    };
    let (state, _router) = keel_server::app(keel_server::ServerConfig::default(), deps)
        .await
        .unwrap();
    let (_router, doc, table) = keel_server::api::router(&state);
    let doc = serde_json::to_value(&doc).unwrap();
    assert_eq!(table, doc_operations(&doc));
    assert!(table.len() >= 39, "{table:?}");
    // What the server serves is that document.
    let s = start(Backend::Sqlite).await;
    let served = s.call("GET", "/openapi.json", None, None, &[]).await.body;
    assert_eq!(doc_operations(&served), table);
    assert_eq!(served["openapi"], "3.1.0");
    // Every reference resolves: a dangling one makes clients skip that part of the schema.
    let mut refs = Vec::new();
    collect_refs(&served, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{r} is not local"));
        assert!(served.pointer(pointer).is_some(), "{r} does not resolve");
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r.clone());
            }
            map.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// Resolves `#/components/schemas/X`.
fn schema<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(r) => &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")],
        None => v,
    }
}

/// Every object schema reachable from `v` says `additionalProperties: false`.
fn closed(doc: &Value, v: &Value, path: &str, seen: &mut BTreeSet<String>) {
    if let Some(r) = v["$ref"].as_str()
        && !seen.insert(r.to_owned())
    {
        return;
    }
    let s = schema(doc, v);
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(list) = s[key].as_array() {
            for (i, x) in list.iter().enumerate() {
                closed(doc, x, &format!("{path}.{key}[{i}]"), seen);
            }
        }
    }
    if s.get("properties").is_some() {
        assert_eq!(
            s["additionalProperties"],
            Value::Bool(false),
            "{path} accepts unknown fields: {s}"
        );
        for (name, p) in s["properties"].as_object().unwrap() {
            // Free-form values (memory values, policies) are data, not request shape.
            if p.get("$ref").is_some() || p.get("properties").is_some() || p.get("oneOf").is_some()
            {
                closed(doc, p, &format!("{path}.{name}"), seen);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_deny_unknown_fields_and_errors_are_documented_problems() {
    let s = start(Backend::Sqlite).await;
    let doc = s.call("GET", "/openapi.json", None, None, &[]).await.body;
    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
            assert!(ids.insert(id.to_owned()), "operationId {id} twice");
            if let Some(content) = op["requestBody"]["content"].as_object() {
                // Only these take an empty body (as `{}`, `OptionalJsonBody`); every other body
                // is required, and an empty one is 400 (`JsonBody`).
                let optional = ["close_session", "cancel_turn", "cancel_tool_call"];
                assert_eq!(
                    op["requestBody"]["required"].as_bool().unwrap_or(false),
                    !optional.contains(&id),
                    "{id}: requestBody.required"
                );
                for (ct, media) in content {
                    assert_eq!(ct, "application/json", "{id}");
                    closed(&doc, &media["schema"], id, &mut BTreeSet::new());
                }
            }
            let public = ["/healthz", "/readyz", "/openapi.json"].contains(&path.as_str());
            let security = &op["security"];
            if public {
                assert_eq!(security, &serde_json::json!([{}]), "{id} is public");
                continue;
            }
            assert_eq!(security, &serde_json::json!([{"api_key": []}]), "{id}");
            let responses = op["responses"].as_object().unwrap();
            for status in ["401", "403"] {
                let r = responses
                    .get(status)
                    .unwrap_or_else(|| panic!("{id} does not document {status}"));
                assert!(
                    r["content"]["application/problem+json"].is_object(),
                    "{id} {status}: {r}"
                );
            }
            for (status, r) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    assert!(
                        r["content"]["application/problem+json"].is_object(),
                        "{id} {status} is not problem+json"
                    );
                }
            }
            // Every path parameter is declared.
            for seg in path.split('/').filter(|s| s.starts_with('{')) {
                let name = seg.trim_matches(|c| c == '{' || c == '}');
                assert!(
                    op["parameters"].as_array().is_some_and(|ps| ps
                        .iter()
                        .any(|p| p["name"] == name && p["in"] == "path")),
                    "{id}: path parameter {name} undeclared"
                );
            }
        }
    }
    assert!(doc["components"]["securitySchemes"]["api_key"]["scheme"] == "bearer");
}

/// Validates `body` against `#/components/schemas/{name}` of the served document.
fn assert_matches(doc: &Value, name: &str, body: &Value) {
    let root = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    let v = jsonschema::validator_for(&root).unwrap();
    let errors: Vec<String> = v.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}: {errors:?} in {body}");
}

/// Responses keep to their documented schemas at every point of a session's life — the
/// state folded at `?at=0` (before any event: no config yet) included, which schemathesis
/// once found declared as an object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_match_their_schemas_from_version_zero_on() {
    let s = start(Backend::Sqlite).await;
    let doc = s.call("GET", "/openapi.json", None, None, &[]).await.body;
    let release = s
        .release("done", &[serde_json::json!({"text": "ok"})], &[])
        .await;
    let created = s.session(&release, serde_json::json!({})).await.body;
    assert_matches(&doc, "SessionBody", &created);
    let id = created["session_id"].as_str().unwrap();
    let r = s
        .post(
            &format!("/v1/sessions/{id}/turns"),
            &s.operator,
            &serde_json::json!({"input": "hi"}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    s.wait_session(id, |b| b["status"] == "idle").await;
    let at0 = s
        .get(&format!("/v1/sessions/{id}/state?at=0"), &s.viewer)
        .await
        .body;
    assert_eq!(at0["config"], Value::Null, "{at0}");
    assert_matches(&doc, "StateBody", &at0);
    let now = s
        .get(&format!("/v1/sessions/{id}/state"), &s.viewer)
        .await
        .body;
    assert!(now["config"].is_object(), "{now}");
    assert_matches(&doc, "StateBody", &now);
    for (path, name) in [
        (format!("/v1/sessions/{id}"), "SessionBody"),
        (format!("/v1/sessions/{id}/events"), "EventPage"),
        (format!("/v1/sessions/{id}/turns"), "TurnPage"),
        ("/v1/sessions".to_owned(), "SessionPage"),
        (format!("/v1/releases/{release}"), "ReleaseBody"),
    ] {
        let r = s.get(&path, &s.viewer).await;
        assert_eq!(r.status, reqwest::StatusCode::OK, "{path}: {r:?}");
        assert_matches(&doc, name, &r.body);
    }
}
