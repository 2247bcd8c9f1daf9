//! `PUT /v1/memory/{namespace}/{key}` holds a value to the `memory_write` tool's checks (one
//! function, `keel_runtime::memory::check_entry`): the host's size limit and the redactor's
//! secret patterns and values — 422 naming `value`, the secret never echoed, nothing stored.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(memory_writes_through_the_api_are_held_to_the_tools_limits);

async fn memory_writes_through_the_api_are_held_to_the_tools_limits(b: Backend) {
    let s = start_with_options(
        b,
        |_| {},
        |o| {
            o.memory.max_value_bytes = 100;
            o.secret_values = vec!["hunter2-deployment-secret".into()];
        },
    )
    .await;
    let put = |key: &str, value: serde_json::Value| {
        let path = format!("/v1/memory/notes/{key}");
        let s = &s;
        async move {
            s.call(
                "PUT",
                &path,
                Some(&s.operator),
                Some(&json!({"value": value})),
                &[],
            )
            .await
        }
    };
    // At the limit: stored. ("x" * 98 is 100 bytes as JSON, quotes included.)
    let ok = put("fits", json!("x".repeat(98))).await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    // One byte over the configured limit.
    let big = put("big", json!("x".repeat(99))).await;
    assert_eq!(big.status, StatusCode::UNPROCESSABLE_ENTITY, "{big:?}");
    assert_eq!(big.body["field"], "value", "{big:?}");
    assert_eq!(big.body["limit"], "max_value_bytes", "{big:?}");
    let detail = big.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("101 bytes") && detail.contains("limit of 100 bytes"),
        "{detail}"
    );
    // A built-in pattern (a GitHub token), nested in JSON, and a host secret value.
    let token = "ghp_0123456789abcdefghijABCDEFGHIJ";
    for (key, value) in [
        ("tok", json!({"note": format!("use {token}")})),
        ("host", json!("the password is hunter2-deployment-secret")),
    ] {
        let r = put(key, value).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
        assert_eq!(r.body["field"], "value", "{r:?}");
        let text = r.body.to_string();
        assert!(text.contains("holds a secret"), "{text}");
        assert!(
            !text.contains(token) && !text.contains("hunter2"),
            "the secret is echoed: {text}"
        );
    }
    // A secret in the key is refused too (the tool checks names alike).
    let r = put(&format!("k-{token}"), json!("v")).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
    // Nothing refused was stored.
    let listed = s.get("/v1/memory/notes", &s.viewer).await;
    let keys: Vec<&str> = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["fits"], "{listed:?}");
}
