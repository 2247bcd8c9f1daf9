//! HTTP semantics: If-Match (428/412), Idempotency-Key (replay, 422, 409, 20 concurrent requests
//! with one key → one turn), the workspace roots and the mode/sandbox ceiling (403 naming the
//! limit), body limits (413), unknown fields (422 naming them), media types (415), another
//! tenant's ids (404 exactly like a missing id), bad input never getting a 5xx, and re-pinning a
//! session's release through `PATCH`.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    settings_close_and_delete_need_if_match_with_the_current_etag,
    idempotency_keys_replay_refuse_other_bodies_and_run_once_under_concurrency,
    workspaces_outside_the_roots_and_modes_beyond_the_ceiling_get_403_naming_the_limit,
    malformed_requests_get_4xx_problems_naming_the_fault,
    another_tenants_ids_answer_exactly_like_missing_ones,
    tenants_share_the_roots_but_never_a_workspace,
    a_workspace_replaced_by_a_symlink_after_its_claim_is_not_followed,
    input_strategies_and_decisions_are_bound_as_the_request_says,
    memory_and_artifacts_read_back_what_was_written,
    patch_re_pins_the_release_between_turns_journaled_with_the_caller,
    a_release_names_mcp_servers_the_host_checks,
    a_body_that_never_arrives_gets_408_and_gives_the_connection_back,
    closing_a_session_whose_turn_runs_says_to_cancel_it_and_names_no_worker,
);

async fn idle_session(s: &TestServer) -> String {
    let release = s.release("done", &[json!({"text": "ok"})], &[]).await;
    s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn settings_close_and_delete_need_if_match_with_the_current_etag(b: Backend) {
    let s = start(b).await;
    let session = idle_session(&s).await;
    let path = format!("/v1/sessions/{session}");
    let got = s.get(&path, &s.viewer).await;
    let tag = got.header("etag").unwrap();
    assert_eq!(tag, format!("\"{}\"", got.body["version"]));
    let change = json!({"settings": {"multitask": "reject", "turn_budget": {"max_steps": 3}}});
    let r = s
        .call("PATCH", &path, Some(&s.operator), Some(&change), &[])
        .await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED, "{r:?}");
    assert_eq!(
        r.header("content-type").unwrap(),
        "application/problem+json"
    );
    assert_eq!(r.body["field"], "if-match");
    let r = s
        .call(
            "PATCH",
            &path,
            Some(&s.operator),
            Some(&change),
            &[("if-match", "\"999\"")],
        )
        .await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{r:?}");
    let r = s
        .call(
            "PATCH",
            &path,
            Some(&s.operator),
            Some(&change),
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["settings"]["multitask"], "reject");
    assert_eq!(r.body["settings"]["turn_budget"]["max_steps"], 3);
    let new_tag = r.header("etag").unwrap();
    assert_ne!(new_tag, tag, "a change moves the version");
    // The old tag is stale now, for close and delete too.
    let close = format!("{path}/close");
    let r = s.call("POST", &close, Some(&s.operator), None, &[]).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED);
    let r = s
        .call(
            "POST",
            &close,
            Some(&s.operator),
            None,
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    let r = s
        .call(
            "POST",
            &close,
            Some(&s.operator),
            None,
            &[("if-match", &new_tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["status"], "closed");
    let closed_tag = r.header("etag").unwrap();
    // A closed session takes no input.
    let r = s
        .post(
            &format!("{path}/turns"),
            &s.operator,
            &json!({"input": "more"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = s.call("DELETE", &path, Some(&s.operator), None, &[]).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED);
    let r = s
        .call(
            "DELETE",
            &path,
            Some(&s.operator),
            None,
            &[("if-match", &new_tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    let r = s
        .call(
            "DELETE",
            &path,
            Some(&s.operator),
            None,
            &[("if-match", &closed_tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    assert_eq!(s.get(&path, &s.viewer).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        s.get(&format!("{path}/events"), &s.viewer).await.status,
        StatusCode::NOT_FOUND,
        "everything it owned went with it"
    );
}

async fn idempotency_keys_replay_refuse_other_bodies_and_run_once_under_concurrency(b: Backend) {
    let s = start(b).await;
    let release = s
        .release(
            "slow",
            &[
                json!({"delay_ms": 50, "text": "one"}),
                json!({"delay_ms": 50, "text": "two"}),
                json!({"delay_ms": 50, "text": "three"}),
            ],
            &[],
        )
        .await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let turns = format!("/v1/sessions/{session}/turns");
    let body = json!({"input": "once"});
    let first = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            Some(&body),
            &[("idempotency-key", "k-1")],
        )
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    assert!(first.header("idempotent-replayed").is_none());
    // The same key and body (keys in another order): the first response again, nothing new.
    let same = json!({"input": "once"});
    let replay = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            Some(&same),
            &[("idempotency-key", "k-1")],
        )
        .await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    // Another body with the key: 422.
    let other = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            Some(&json!({"input": "different"})),
            &[("idempotency-key", "k-1")],
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.body["field"], "idempotency-key");
    // Scoped by principal: another key holder's k-1 is its own.
    let admin = s
        .call(
            "POST",
            &turns,
            Some(&s.admin),
            Some(&json!({"input": "admin's"})),
            &[("idempotency-key", "k-1")],
        )
        .await;
    assert_eq!(admin.status, StatusCode::ACCEPTED);
    assert_ne!(admin.body["turn_id"], first.body["turn_id"]);
    // A bad key is a 400.
    let bad = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            Some(&body),
            &[("idempotency-key", "")],
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // 20 concurrent requests with one key: one turn.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let http = s.http.clone();
        let url = format!("{}{turns}", s.base);
        let key = s.operator.clone();
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .bearer_auth(key)
                .header("content-type", "application/json")
                .header("idempotency-key", "race")
                .body(json!({"input": "raced"}).to_string())
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body: Value =
                serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null);
            (status, body)
        }));
    }
    let mut turn_ids = BTreeSet::new();
    let mut statuses = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        statuses.push(status.as_u16());
        match status {
            StatusCode::ACCEPTED => {
                turn_ids.insert(body["turn_id"].as_str().unwrap().to_owned());
            }
            StatusCode::CONFLICT => assert_eq!(body["field"], "idempotency-key", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(turn_ids.len(), 1, "one turn for one key: {statuses:?}");
    let listed = s.get(&format!("{turns}?limit=1000"), &s.viewer).await;
    let raced = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["input"] == "raced")
        .count();
    assert_eq!(raced, 1, "{}", listed.body);
}

async fn workspaces_outside_the_roots_and_modes_beyond_the_ceiling_get_403_naming_the_limit(
    b: Backend,
) {
    let s = start(b).await;
    let release = s.release("w", &[json!({"text": "ok"})], &[]).await;
    let outside = tempfile::tempdir().unwrap();
    let make = |ws: String, settings: Value| json!({"release_id": release, "workspace": ws, "settings": settings});
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(outside.path().display().to_string(), json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert_eq!(r.body["limit"], "workspace_roots");
    assert_eq!(r.body["field"], "workspace");
    // A symlink under the root that leads outside is outside.
    let link = s.root.path().join("escape");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(link.display().to_string(), json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert_eq!(r.body["limit"], "workspace_roots");
    let dotdot = format!("{}/../", s.workspace.display());
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(format!("{dotdot}.."), json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make("relative/ws".into(), json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let missing = s.root.path().join("nope").display().to_string();
    let r = s
        .post("/v1/sessions", &s.operator, &make(missing, json!({})))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let ws = s.workspace.display().to_string();
    // The ceiling: no bypass, no sandbox off.
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(ws.clone(), json!({"permission_mode": "bypass"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert_eq!(r.body["limit"], "max_permission_mode");
    assert_eq!(r.body["field"], "settings.permission_mode");
    assert!(r.body["detail"].as_str().unwrap().contains("accept_edits"));
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(ws.clone(), json!({"sandbox": "off"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body["limit"], "allow_sandbox_off");
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &make(
                ws.clone(),
                json!({"permission_mode": "accept_edits", "sandbox": "read_only"}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // Changing settings meets the same ceiling.
    let path = format!("/v1/sessions/{}", r.body["session_id"].as_str().unwrap());
    let r = s
        .call(
            "PATCH",
            &path,
            Some(&s.operator),
            Some(&json!({"settings": {"permission_mode": "bypass"}})),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body["limit"], "max_permission_mode");
    // A server that allows more takes it.
    let open = start_with(b, |c| {
        c.max_permission_mode = keel_tools::policy::PermissionMode::Bypass;
        c.allow_sandbox_off = true;
    })
    .await;
    let release = open.release("w", &[json!({"text": "ok"})], &[]).await;
    let r = open
        .session(
            &release,
            json!({"permission_mode": "bypass", "sandbox": "off"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // A server without roots takes no workspace at all.
    let none = start_with(b, |c| c.workspace_roots.clear()).await;
    let release = none.release("w", &[json!({"text": "ok"})], &[]).await;
    let r = none.session(&release, json!({})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body["limit"], "workspace_roots");
}

async fn malformed_requests_get_4xx_problems_naming_the_fault(b: Backend) {
    let s = start_with(b, |c| c.body_limit_bytes = 4096).await;
    let session = idle_session(&s).await;
    let turns = format!("/v1/sessions/{session}/turns");
    let check = |r: &Res, status: StatusCode, field: &str| {
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(
            r.header("content-type").unwrap(),
            "application/problem+json"
        );
        assert_eq!(r.body["status"], status.as_u16());
        assert!(
            r.body["type"]
                .as_str()
                .unwrap()
                .starts_with("urn:keel:problem:")
        );
        assert_eq!(r.body["field"], field, "{r:?}");
    };
    // Unknown field.
    let r = s
        .post(&turns, &s.operator, &json!({"input": "x", "extra": 1}))
        .await;
    check(&r, StatusCode::UNPROCESSABLE_ENTITY, "extra");
    // Missing field, wrong type, bad enum value.
    check(
        &s.post(&turns, &s.operator, &json!({})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "input",
    );
    let r = s.post(&turns, &s.operator, &json!({"input": 5})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = s
        .post(
            &turns,
            &s.operator,
            &json!({"input": "x", "multitask": "sometimes"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = s.post(&turns, &s.operator, &json!({"input": "   "})).await;
    check(&r, StatusCode::UNPROCESSABLE_ENTITY, "input");
    // A viewer changes nothing: a bad body gets the same 403 as a good one.
    let good = s.post(&turns, &s.viewer, &json!({"input": "x"})).await;
    let bad = s
        .post(&turns, &s.viewer, &json!({"input": 5, "extra": 1}))
        .await;
    assert_eq!(good.status, StatusCode::FORBIDDEN, "{good:?}");
    assert_eq!(
        (bad.status, bad.body.clone()),
        (good.status, good.body.clone())
    );
    // Bodies are held to the document's schema, not only to what serde takes: an object
    // written as an array (serde reads a struct from one) is refused, naming the body; a
    // nested field's violation names its path.
    let r = s.post(&turns, &s.operator, &json!(["x"])).await;
    check(&r, StatusCode::UNPROCESSABLE_ENTITY, "body");
    let memory = "/v1/memory/notes/k";
    let r = s
        .call(
            "PUT",
            memory,
            Some(&s.operator),
            Some(&json!([{"value": 1}])),
            &[],
        )
        .await;
    check(&r, StatusCode::UNPROCESSABLE_ENTITY, "body");
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &json!({"release_id": "x", "workspace": "/w", "settings": {"approval_ttl_ms": "soon"}}),
        )
        .await;
    check(
        &r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "settings.approval_ttl_ms",
    );
    // A u64 field holds what the schema's `int64` holds: past i64::MAX is refused, and the
    // body is judged before the If-Match precondition (a stale ETag does not hide a 422).
    for field in [
        "approval_ttl_ms",
        "tool_timeout_ms",
        "context_window_tokens",
    ] {
        let r = s
            .call(
                "PATCH",
                &format!("/v1/sessions/{session}"),
                Some(&s.operator),
                Some(&json!({"settings": {field: 9_223_372_036_854_775_808_u64}})),
                &[("if-match", "\"B\"")],
            )
            .await;
        check(
            &r,
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("settings.{field}"),
        );
    }
    let r = s
        .call(
            "PATCH",
            &format!("/v1/sessions/{session}"),
            Some(&s.operator),
            Some(&json!({"settings": {"turn_budget": {"max_tokens": u64::MAX}}})),
            &[("if-match", "\"B\"")],
        )
        .await;
    check(
        &r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "settings.turn_budget.max_tokens",
    );
    // Not JSON; another media type.
    let r = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            None,
            &[("content-type", "application/json")],
        )
        .await;
    check(&r, StatusCode::BAD_REQUEST, "body");
    // An empty (or whitespace) body where the body is required is 400 before the If-Match
    // precondition is judged (schemathesis seed 31053111: ' ' with a stale ETag got 412);
    // where it is optional (cancel, close) it reads as `{}` and the operation goes on.
    for body in ["", " ", "\n\t "] {
        let res = s
            .http
            .patch(format!("{}/v1/sessions/{session}", s.base))
            .bearer_auth(&s.operator)
            .header("content-type", "application/json")
            .header("if-match", "\"hxw\\\"")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body:?}");
        let problem: serde_json::Value = res.json().await.unwrap();
        assert_eq!(problem["field"], "body", "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("UpdateSessionRequest"),
            "{problem}"
        );
        let res = s
            .http
            .post(format!("{}/v1/sessions/{session}/cancel", s.base))
            .bearer_auth(&s.operator)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            StatusCode::CONFLICT,
            "{body:?}: no turn to cancel"
        );
    }
    // Attack pass of 2026-12-06: `null` is what the document allows for an optional body (read
    // as `{}`); a form feed is not JSON's whitespace; no body and `{}` are one request to an
    // Idempotency-Key (both read as `{}`).
    let cancel = format!("{}/v1/sessions/{session}/cancel", s.base);
    let send = |body: &'static str, key: Option<&'static str>| {
        let mut req = s
            .http
            .post(&cancel)
            .bearer_auth(&s.operator)
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        req.send()
    };
    assert_eq!(
        send("null", None).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    // An unknown field of a body without fields is named, like any other unknown field.
    let res = send(r#"{"x": 1}"#, None).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["field"], "x", "{problem}");
    let res = send("\u{c}", None).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("not JSON"),
        "{problem}"
    );
    // A refusal is not kept (nothing was done): the same key answers again, not replayed.
    for body in ["", "{}"] {
        let r = send(body, Some("refused")).await.unwrap();
        assert_eq!(r.status(), StatusCode::CONFLICT, "{body:?}");
        assert!(r.headers().get("idempotent-replayed").is_none(), "{body:?}");
    }
    let other = idle_session(&s).await;
    let close = format!("{}/v1/sessions/{other}/close", s.base);
    let closing = |body: &'static str| {
        s.http
            .post(&close)
            .bearer_auth(&s.operator)
            .header("content-type", "application/json")
            .header("if-match", "*")
            .header("idempotency-key", "empty-then-object")
            .body(body)
            .send()
    };
    let first = closing("").await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    for body in ["{}", " "] {
        let again = closing(body).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK, "{body:?}");
        assert_eq!(
            again.headers()["idempotent-replayed"],
            "true",
            "{body:?} replays the first answer"
        );
    }
    // A key given twice is refused also when an integral float makes the body be read again
    // (through `serde_json::Value`, which keeps only the last of duplicate keys).
    let r = s
        .call(
            "PATCH",
            &format!("/v1/sessions/{session}"),
            Some(&s.operator),
            None,
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let res = s
        .http
        .patch(format!("{}/v1/sessions/{session}", s.base))
        .bearer_auth(&s.operator)
        .header("content-type", "application/json")
        .header("if-match", "*")
        .body(r#"{"settings": {"approval_ttl_ms": 3000, "approval_ttl_ms": 4000, "tool_timeout_ms": 5000.0}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["field"], "approval_ttl_ms", "{problem}");
    let res = s
        .http
        .post(format!("{}{turns}", s.base))
        .bearer_auth(&s.operator)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res = s
        .http
        .post(format!("{}{turns}", s.base))
        .bearer_auth(&s.operator)
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Too large: 413 naming the limit, with or without an idempotency key.
    let big = json!({"input": "x".repeat(8192)});
    let r = s.post(&turns, &s.operator, &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{r:?}");
    assert_eq!(r.body["limit"], "body_limit_bytes");
    let r = s
        .call(
            "POST",
            &turns,
            Some(&s.operator),
            Some(&big),
            &[("idempotency-key", "big")],
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Bad query parameters, ids, cursors; unknown routes and methods.
    for (path, status) in [
        ("/v1/sessions?limit=0", StatusCode::BAD_REQUEST),
        ("/v1/sessions?limit=abc", StatusCode::BAD_REQUEST),
        ("/v1/sessions?status=sleeping", StatusCode::BAD_REQUEST),
        ("/v1/sessions?cursor=nope", StatusCode::BAD_REQUEST),
        ("/v1/sessions?bogus=1", StatusCode::BAD_REQUEST),
        ("/v1/sessions/not-a-uuid", StatusCode::NOT_FOUND),
        ("/v1/sessions/not-a-uuid/events", StatusCode::NOT_FOUND),
        ("/v1/usage?from=yesterday", StatusCode::BAD_REQUEST),
        ("/v1/approvals/zzz", StatusCode::NOT_FOUND),
        ("/v1/artifacts/zzz?offset=-1", StatusCode::BAD_REQUEST),
        ("/v1/nothing", StatusCode::NOT_FOUND),
        (
            "/v1/sessions/00000000-0000-0000-0000-000000000000/events?after=18446744073709551615",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let r = s.get(path, &s.admin).await;
        assert_eq!(r.status, status, "{path}: {r:?}");
        assert_eq!(
            r.header("content-type").unwrap(),
            "application/problem+json",
            "{path}"
        );
    }
    // The last representable seq (schemathesis seeds 88903057): `after` at it reads an empty
    // page, `at` past it is a 400 naming `at` (it was folded as if it were the end).
    let r = s
        .get(
            &format!("/v1/sessions/{session}/events?after=9223372036854775807"),
            &s.viewer,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["items"], json!([]), "{r:?}");
    let r = s
        .get(
            &format!("/v1/sessions/{session}/state?at=9223372036854775808"),
            &s.viewer,
        )
        .await;
    check(&r, StatusCode::BAD_REQUEST, "at");
    let r = s
        .get(
            &format!("/v1/sessions/{session}/state?at=9223372036854775807"),
            &s.viewer,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = s
        .call("PUT", "/v1/sessions", Some(&s.admin), None, &[])
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        r.header("content-type").unwrap(),
        "application/problem+json"
    );
    // Keys: missing, malformed, unknown, revoked.
    let r = s.call("GET", "/v1/sessions", None, None, &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    let r = s
        .call(
            "GET",
            "/v1/sessions",
            None,
            None,
            &[("authorization", "Basic abc")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = s.get("/v1/sessions", "keel_0000").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let created = s
        .post(
            "/v1/keys",
            &s.admin,
            &json!({"name": "temp", "role": "viewer"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    // A name that would rewrite a terminal or read as another is refused, naming the field.
    for name in ["red\u{1b}[31m", "alice\u{202e}nimda", "al\u{200b}ice"] {
        let r = s
            .post(
                "/v1/keys",
                &s.admin,
                &json!({"name": name, "role": "viewer"}),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name:?}: {r:?}"
        );
        assert!(r.body.to_string().contains("name"), "{r:?}");
    }
    let temp = created.body["key"].as_str().unwrap().to_owned();
    assert_eq!(s.get("/v1/sessions", &temp).await.status, StatusCode::OK);
    let id = created.body["key_id"].as_str().unwrap();
    let r = s
        .post(&format!("/v1/keys/{id}/revoke"), &s.admin, &json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        s.get("/v1/sessions", &temp).await.status,
        StatusCode::UNAUTHORIZED
    );
}

async fn another_tenants_ids_answer_exactly_like_missing_ones(b: Backend) {
    let s = start(b).await;
    let session = idle_session(&s).await;
    let missing = uuid::Uuid::now_v7().to_string();
    for suffix in [
        "",
        "/events",
        "/state",
        "/turns",
        "/approvals",
        "/effects",
        "/artifacts",
    ] {
        let theirs = s
            .get(&format!("/v1/sessions/{session}{suffix}"), &s.other)
            .await;
        let none = s
            .get(&format!("/v1/sessions/{missing}{suffix}"), &s.other)
            .await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{suffix}: {theirs:?}");
        assert_eq!(none.status, StatusCode::NOT_FOUND);
        let shape = |v: &Value| {
            let mut v = v.clone();
            let m = v.as_object_mut().unwrap();
            m.remove("detail");
            m.remove("id");
            v
        };
        assert_eq!(shape(&theirs.body), shape(&none.body), "{suffix}");
        assert_eq!(
            theirs.body["detail"]
                .as_str()
                .unwrap()
                .replace(&session, "ID"),
            none.body["detail"]
                .as_str()
                .unwrap()
                .replace(&missing, "ID")
        );
    }
    // Their lists never show it.
    let listed = s.get("/v1/sessions", &s.other).await;
    assert_eq!(listed.body["items"], json!([]));
    // Writes too.
    let r = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.other,
            &json!({"input": "hi"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

/// Tenants share the server's workspace roots, never a workspace: once tenant A works in a
/// directory, tenant B gets 403 for it, for the root above it (whose sessions would see A's
/// files), for a directory below it, and for any spelling of them (`..`, a symlink); A keeps
/// using it, and B gets a directory of its own.
async fn tenants_share_the_roots_but_never_a_workspace(b: Backend) {
    let s = start(b).await;
    let mine = s.release("a", &[json!({"text": "ok"})], &[]).await;
    let a = s.session(&mine, json!({})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    // Tenant B: its own release (its admin may also run sessions).
    let theirs = other_tenants_release(&s).await;
    let below = s.workspace.join("sub");
    std::fs::create_dir_all(&below).unwrap();
    let link = s.root.path().join("to-a");
    std::os::unix::fs::symlink(&s.workspace, &link).unwrap();
    let ws = s.workspace.display().to_string();
    for path in [
        ws.clone(),
        format!("{ws}/"),
        format!("{ws}/sub/.."),
        link.display().to_string(),
        s.root.path().display().to_string(),
        below.display().to_string(),
    ] {
        let r = s
            .post(
                "/v1/sessions",
                &s.other,
                &json!({"release_id": theirs, "workspace": path}),
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {r:?}");
        assert_eq!(r.body["limit"], "workspace_roots", "{path}");
        assert_eq!(r.body["field"], "workspace", "{path}");
        assert!(
            r.body["detail"]
                .as_str()
                .unwrap()
                .contains("another tenant"),
            "{path}: {r:?}"
        );
    }
    // A goes on working there, below it too; B gets its own directory.
    assert_eq!(
        s.session(&mine, json!({})).await.status,
        StatusCode::CREATED
    );
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &json!({"release_id": mine, "workspace": below.display().to_string()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let own = s.root.path().join("b-ws");
    std::fs::create_dir_all(&own).unwrap();
    let r = s
        .post(
            "/v1/sessions",
            &s.other,
            &json!({"release_id": theirs, "workspace": own.display().to_string()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // And now the root is refused to A as well: B works below it.
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &json!({"release_id": mine, "workspace": s.root.path().display().to_string()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
}

/// The claim is checked on the canonical path when the session is created; a directory on
/// that path replaced afterwards by a symlink to another tenant's workspace (a shell call of
/// the tenant's other session can do it) must not take the session there: its next turn does
/// not run, and nothing of the other workspace is read.
async fn a_workspace_replaced_by_a_symlink_after_its_claim_is_not_followed(b: Backend) {
    let s = start(b).await;
    // Tenant B's workspace, claimed, with its secret.
    let theirs_ws = s.root.path().join("b-ws");
    std::fs::create_dir_all(&theirs_ws).unwrap();
    std::fs::write(theirs_ws.join("secret.txt"), "B-SECRET-42\n").unwrap();
    let theirs = other_tenants_release(&s).await;
    let r = s
        .post(
            "/v1/sessions",
            &s.other,
            &json!({"release_id": theirs, "workspace": theirs_ws.display().to_string()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // Tenant A: a session in a directory of its own, whose next turn reads secret.txt.
    let mine_ws = s.root.path().join("a2").join("sub");
    std::fs::create_dir_all(&mine_ws).unwrap();
    std::fs::write(mine_ws.join("secret.txt"), "A-OWN\n").unwrap();
    let release = s
        .release(
            "reader",
            &[
                json!({"tool_calls": [call("read_file", json!({"path": "secret.txt"}))]}),
                json!({"text": "read"}),
            ],
            &["read_file"],
        )
        .await;
    let r = s
        .post(
            "/v1/sessions",
            &s.operator,
            &json!({"release_id": release, "workspace": mine_ws.display().to_string()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let session = r.body["session_id"].as_str().unwrap().to_owned();
    // The swap: the claimed directory becomes a symlink to B's.
    std::fs::rename(&mine_ws, s.root.path().join("a2").join("sub.old")).unwrap();
    std::os::unix::fs::symlink(&theirs_ws, &mine_ws).unwrap();
    let turn = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "read the secret"}),
        )
        .await;
    assert_eq!(turn.status, StatusCode::ACCEPTED, "{turn:?}");
    // Without the check the call runs within milliseconds; give it ample time to.
    let events_path = format!("/v1/sessions/{session}/events?limit=1000");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let text = loop {
        let text = s.get(&events_path, &s.viewer).await.body.to_string();
        if text.contains("tool_call.finished") || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!text.contains("B-SECRET"), "{text}");
    assert!(!text.contains("tool_call.finished"), "a call ran: {text}");
    assert!(!theirs_ws.join("out.txt").exists());
}

/// A release of the other tenant (its admin key), on a one-line script.
async fn other_tenants_release(s: &TestServer) -> String {
    let script = s.root.path().join("b.jsonl");
    std::fs::write(&script, json!({"text": "ok"}).to_string()).unwrap();
    let r = s
        .post(
            "/v1/releases",
            &s.other,
            &json!({"name": "b", "model_route": [format!("script:{}", script.display())]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r.body["release_id"].as_str().unwrap().to_owned()
}

/// Per request, while a turn waits on an approval: `multitask: reject` is refused (409) and
/// writes nothing, `enqueue` queues behind it. A decision naming other arguments' hash is
/// refused (409 naming `args_hash`) and decides nothing; with the hash shown it runs the call,
/// and both turns complete in order.
async fn input_strategies_and_decisions_are_bound_as_the_request_says(b: Backend) {
    let s = start(b).await;
    let write = call("write_file", json!({"path": "w.txt", "content": "w"}));
    let lines = [
        json!({"tool_calls": [write]}),
        json!({"text": "wrote"}),
        json!({"text": "next"}),
    ];
    let release = s.release("bound", &lines, &["write_file"]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let turns = format!("/v1/sessions/{session}/turns");
    let first = s
        .post(&turns, &s.operator, &json!({"input": "write"}))
        .await;
    s.wait_session(&session, |b| b["status"] == "requires_action")
        .await;
    let r = s
        .post(
            &turns,
            &s.operator,
            &json!({"input": "no", "multitask": "reject"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    let r = s
        .post(
            &turns,
            &s.operator,
            &json!({"input": "then", "multitask": "enqueue"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let pending = s
        .get(&format!("/v1/sessions/{session}/approvals"), &s.viewer)
        .await;
    let a = pending.body["items"][0].clone();
    let path = format!("/v1/approvals/{}", a["approval_id"].as_str().unwrap());
    let other =
        json!({"decision": "allow_once", "args_hash": format!("sha256:{}", "0".repeat(64))});
    let r = s
        .post(&format!("{path}/decision"), &s.operator, &other)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.body["field"], "args_hash", "{r:?}");
    assert_eq!(s.get(&path, &s.viewer).await.body["status"], "pending");
    let seen = json!({"decision": "allow_once", "args_hash": a["args_hash"]});
    let r = s
        .post(&format!("{path}/decision"), &s.operator, &seen)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    s.wait_session(&session, |b| {
        b["status"] == "idle" && b["active_turn_id"].is_null() && b["queued_turn_ids"] == json!([])
    })
    .await;
    let listed = s.get(&turns, &s.viewer).await.body;
    let got: Vec<(&Value, &Value)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (&t["input"], &t["status"]))
        .collect();
    assert_eq!(
        got,
        [
            (&json!("write"), &json!("completed")),
            (&json!("then"), &json!("completed"))
        ]
    );
    assert_eq!(listed["items"][0]["turn_id"], first.body["turn_id"]);
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("w.txt")).unwrap(),
        "w"
    );
}

/// A memory entry written is read, listed by key and found by a case-insensitive search, in
/// its namespace only; an artifact larger than a page reads back whole across pages of
/// `limit` bytes, none ending inside a multibyte character.
async fn memory_and_artifacts_read_back_what_was_written(b: Backend) {
    let s = start(b).await;
    for (k, v) in [
        ("build", json!("cargo test -q")),
        ("lint", json!({"cmd": "clippy"})),
    ] {
        let r = s
            .call(
                "PUT",
                &format!("/v1/memory/notes/{k}"),
                Some(&s.operator),
                Some(&json!({"value": v})),
                &[],
            )
            .await;
        assert_eq!((r.status, &r.body["value"]), (StatusCode::OK, &v), "{r:?}");
    }
    let got = s.get("/v1/memory/notes/lint", &s.viewer).await;
    assert_eq!(got.body["value"], json!({"cmd": "clippy"}), "{got:?}");
    let keys = |r: &Res| -> Vec<String> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        keys(&s.get("/v1/memory/notes", &s.viewer).await),
        ["build", "lint"]
    );
    assert_eq!(
        keys(&s.get("/v1/memory/notes?q=CARGO", &s.viewer).await),
        ["build"]
    );
    assert_eq!(
        keys(&s.get("/v1/memory/other?q=cargo", &s.viewer).await),
        Vec::<String>::new()
    );
    let session = idle_session(&s).await;
    let text = "ab€🦀".repeat(20_000); // 180,000 bytes: 1-, 3- and 4-byte characters
    let sid: keel_core::SessionId = session.parse().unwrap();
    let id = s
        .store
        .put_artifact(s.tenant, sid, "out.txt", "text/plain", text.as_bytes())
        .await
        .unwrap();
    let (mut read, mut offset) = (String::new(), Some(0u64));
    while let Some(at) = offset {
        let r = s
            .get(
                &format!("/v1/artifacts/{id}?offset={at}&limit=65537"),
                &s.viewer,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.body["size"], text.len());
        read.push_str(r.body["text"].as_str().unwrap());
        offset = r.body["next_offset"].as_u64();
    }
    assert!(read == text, "the pages do not add up to the artifact");
}

/// Submits `input` to `session`, waits until the session is idle again and returns the turn's
/// final text.
async fn turn_text(s: &TestServer, session: &str, input: &str) -> Value {
    let turns = format!("/v1/sessions/{session}/turns");
    let t = s.post(&turns, &s.operator, &json!({"input": input})).await;
    assert_eq!(t.status, StatusCode::ACCEPTED, "{t:?}");
    let id = t.body["turn_id"].as_str().unwrap();
    s.wait_session(session, |b| {
        b["status"] == "idle" && b["active_turn_id"].is_null() && b["queued_turn_ids"] == json!([])
    })
    .await;
    let t = s.get(&format!("{turns}/{id}"), &s.viewer).await;
    assert_eq!(t.body["status"], "completed", "{t:?}");
    t.body["final_text"].clone()
}

/// `PATCH` with a `release_id` re-pins the session: an unknown release, another tenant's, or a
/// stale `If-Match` change nothing (404 naming `release_id`, the same 404, 412); a re-pin with
/// settings is one `session.release_pinned {from, to}` by the operator's principal followed by
/// `session.config_changed`, and the next turn's answer comes from the new release's script.
/// While a turn is active (waiting on an approval), a re-pin is refused with 409 saying why.
async fn patch_re_pins_the_release_between_turns_journaled_with_the_caller(b: Backend) {
    let s = start(b).await;
    let a = s.release("pin-a", &[json!({"text": "from A"})], &[]).await;
    // A script answers by the session's model response number: B's second line is the answer
    // to the session's second call.
    let bb = s
        .release(
            "pin-b",
            &[json!({"text": "unused"}), json!({"text": "from B"})],
            &[],
        )
        .await;
    let session = s.session(&a, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(turn_text(&s, &session, "one").await, "from A");
    let path = format!("/v1/sessions/{session}");
    let before = s.get(&path, &s.viewer).await;
    let tag = before.header("etag").unwrap();
    let patch = |body: Value, tag: String| {
        let s = &s;
        let path = path.clone();
        async move {
            s.call(
                "PATCH",
                &path,
                Some(&s.operator),
                Some(&body),
                &[("if-match", tag.as_str())],
            )
            .await
        }
    };

    // Nothing changes on a refusal.
    let foreign = other_tenants_release(&s).await;
    let missing = format!("rel_{}", "0".repeat(16));
    let mut refusals = Vec::new();
    for release in [missing.as_str(), foreign.as_str()] {
        let r = patch(
            json!({"release_id": release, "settings": {"multitask": "reject"}}),
            tag.clone(),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
        assert_eq!(r.body["field"], "release_id", "{r:?}");
        refusals.push((r.body["title"].clone(), r.body["type"].clone()));
    }
    assert_eq!(
        refusals[0], refusals[1],
        "another tenant's release is unknown"
    );
    let r = patch(json!({"release_id": bb}), "\"1\"".to_owned()).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{r:?}");
    let after = s.get(&path, &s.viewer).await;
    assert_eq!(after.body, before.body, "a refused PATCH changes nothing");
    assert!(
        events_of(&s, &session, "session.release_pinned")
            .await
            .is_empty()
    );

    // Re-pin with a settings change: one commit, the version moves by its two events.
    let r = patch(
        json!({"release_id": bb, "settings": {"multitask": "reject"}}),
        tag.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["release_id"], bb.as_str());
    assert_eq!(r.body["settings"]["multitask"], "reject");
    let version = before.body["version"].as_u64().unwrap();
    assert_eq!(r.body["version"], version + 2);
    assert_eq!(r.header("etag").unwrap(), format!("\"{}\"", version + 2));
    let keys = s.get("/v1/keys", &s.admin).await;
    let operator = keys.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "olga")
        .unwrap()["principal_id"]
        .clone();
    let pinned = events_of(&s, &session, "session.release_pinned").await;
    assert_eq!(pinned.len(), 1, "{pinned:?}");
    let ev = &pinned[0];
    assert_eq!(ev["seq"], version + 1, "{ev}");
    assert_eq!(ev["principal_id"], operator, "{ev}");
    let text = ev.to_string();
    assert!(
        text.contains(&format!("\"from_release_id\":\"{a}\""))
            && text.contains(&format!("\"to_release_id\":\"{bb}\"")),
        "{ev}"
    );
    let changed = events_of(&s, &session, "session.config_changed").await;
    assert_eq!(changed.last().unwrap()["seq"], version + 2, "{changed:?}");
    assert_eq!(changed.last().unwrap()["principal_id"], operator);
    // The same release again writes nothing.
    let r = patch(json!({"release_id": bb}), format!("\"{}\"", version + 2)).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["version"], version + 2);

    // The next turn runs the new release's route.
    assert_eq!(turn_text(&s, &session, "two").await, "from B");

    // While a turn is active, a re-pin is refused and names why.
    let write = call("write_file", json!({"path": "p.txt", "content": "p"}));
    let filler = json!({"text": "unused"});
    let w = s
        .release(
            "pin-w",
            &[
                filler.clone(),
                filler,
                json!({"tool_calls": [write]}),
                json!({"text": "wrote"}),
            ],
            &["write_file"],
        )
        .await;
    let now = s.get(&path, &s.viewer).await.header("etag").unwrap();
    let r = patch(json!({"release_id": w}), now).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    s.post(
        &format!("{path}/turns"),
        &s.operator,
        &json!({"input": "write"}),
    )
    .await;
    s.wait_session(&session, |b| b["status"] == "requires_action")
        .await;
    // The worker may still append (its lease, the approval) after the status: the PATCH
    // carries the version read just before it, again when that one moved on (412).
    let mut r = patch(
        json!({"release_id": a}),
        s.get(&path, &s.viewer).await.header("etag").unwrap(),
    )
    .await;
    for _ in 0..50 {
        if r.status != StatusCode::PRECONDITION_FAILED {
            break;
        }
        let now = s.get(&path, &s.viewer).await.header("etag").unwrap();
        r = patch(json!({"release_id": a}), now).await;
    }
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap()
            .contains("only between turns"),
        "{r:?}"
    );
    let still = s.get(&path, &s.viewer).await;
    assert_eq!(still.body["release_id"], w.as_str());
    assert_eq!(
        events_of(&s, &session, "session.release_pinned")
            .await
            .len(),
        2
    );
}

/// `POST /v1/releases` with `mcp_servers`: a malformed entry or a stdio server on a host that
/// does not allow them is a 422 naming `mcp_servers` and stores nothing; a `url` server is
/// stored (and read back) — its header values reading only the host variables the operator
/// offers (`release_mcp_header_env`), so a release cannot send the host's keys away —, its tools may be listed by their `mcp__<server>__` names, and the
/// release id differs from the same definition without servers.
async fn a_release_names_mcp_servers_the_host_checks(b: Backend) {
    let s = start_with(b, |c| c.release_mcp_header_env = vec!["DOCS_TOKEN".into()]).await;
    let base = json!({"name": "m", "model_route": ["script:/dev/null"], "tools": ["read_file"]});
    let with = |servers: Value, tools: Value| {
        let mut v = base.clone();
        v["mcp_servers"] = servers;
        v["tools"] = tools;
        v
    };
    let before = s.get("/v1/releases", &s.viewer).await.body["items"]
        .as_array()
        .unwrap()
        .len();
    for (servers, why) in [
        (
            json!({"x": {"command": "mcp-server-git"}}),
            "release_mcp_stdio",
        ),
        (
            json!({"x": {"url": "http://h/mcp", "command": "y"}}),
            "not both",
        ),
        (json!({"x": {"url": 5}}), "x"),
        (json!({"bad name!": {"url": "http://h/mcp"}}), "bad name!"),
        (
            json!({"x": {"url": "http://h/mcp", "headers": {"Authorization": {"env": "OPENAI_API_KEY"}}}}),
            "release_mcp_header_env",
        ),
        (
            json!({"x": {"url": "http://h/mcp", "startup_timeout_ms": 1_000_000_000_000_u64}}),
            "at most 60000",
        ),
        (json!({"a_": {"url": "http://h/mcp"}}), "a_"),
    ] {
        let r = s
            .post("/v1/releases", &s.admin, &with(servers.clone(), json!([])))
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{servers}: {r:?}"
        );
        assert_eq!(r.body["field"], "mcp_servers", "{r:?}");
        assert!(
            r.body["detail"].as_str().unwrap().contains(why),
            "{why}: {r:?}"
        );
    }
    let listed = s.get("/v1/releases", &s.viewer).await.body["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(listed, before, "nothing stored");

    // A tool of a server the release does not name is unknown.
    let docs = json!({"docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": {"env": "DOCS_TOKEN", "prefix": "Bearer "}}}});
    let r = s
        .post(
            "/v1/releases",
            &s.admin,
            &with(docs.clone(), json!(["mcp__other__x"])),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
    assert_eq!(r.body["field"], "tools", "{r:?}");

    let r = s
        .post(
            "/v1/releases",
            &s.admin,
            &with(docs.clone(), json!(["read_file", "mcp__docs__search"])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["mcp_servers"], docs, "{r:?}");
    let id = r.body["release_id"].as_str().unwrap().to_owned();
    let read = s.get(&format!("/v1/releases/{id}"), &s.viewer).await;
    assert_eq!(read.body["mcp_servers"], docs, "{read:?}");
    let plain = s.post("/v1/releases", &s.admin, &base).await;
    assert_ne!(plain.body["release_id"], id.as_str(), "{plain:?}");
    assert_eq!(plain.body["mcp_servers"], json!({}), "{plain:?}");
    // A token written into the definition is never shown back.
    let literal = json!({"wiki": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer s3cr3t-token", "X-Team": "core"}}});
    let lit = s
        .post("/v1/releases", &s.admin, &with(literal, json!([])))
        .await;
    assert_eq!(lit.status, StatusCode::CREATED, "{lit:?}");
    assert!(!lit.body.to_string().contains("s3cr3t"), "{lit:?}");
    assert_eq!(
        lit.body["mcp_servers"]["wiki"]["headers"]["Authorization"],
        "<redacted>"
    );
    let id2 = lit.body["release_id"].as_str().unwrap().to_owned();
    let shown = s.get(&format!("/v1/releases/{id2}"), &s.viewer).await;
    assert!(!shown.body.to_string().contains("s3cr3t"), "{shown:?}");
}

/// A client that announces a body (`Content-Length: 10`) and sends none gets 408 naming
/// `body_read_timeout_ms` once it passes, with and without an `Idempotency-Key` (whose
/// middleware reads the body first), and the server closes the connection (attack pass of
/// 2026-12-06: 1,200 such requests stayed open indefinitely). A timeout of 0 is refused.
async fn a_body_that_never_arrives_gets_408_and_gives_the_connection_back(b: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let zero = keel_server::ServerConfig {
        body_read_timeout_ms: 0,
        ..keel_server::ServerConfig::default()
    };
    let e = zero.check().unwrap_err().to_string();
    assert!(e.contains("body_read_timeout_ms"), "{e}");
    let s = start_with(b, |c| c.body_read_timeout_ms = 300).await;
    let session = idle_session(&s).await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    for key in ["", "idempotency-key: slow\r\n"] {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/sessions/{session}/turns HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: 10\r\n{key}\r\n",
            s.operator
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // 10x the limit: the answer and the close must come well before.
        tokio::time::timeout(
            std::time::Duration::from_secs(3),
            tcp.read_to_end(&mut answer),
        )
        .await
        .expect("the server answers and closes within 10x the limit")
        .unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{key:?}: {text}");
        assert!(text.contains("body_read_timeout_ms"), "{key:?}: {text}");
    }
}

/// Closing a session while the server's worker runs its turn is 409 saying what to do (cancel
/// the turn), without the worker's host and process (new-user pass of 2026-12-06: the detail
/// named `keel-serve-2@vm:30241/pidns:…` and said to wait for the lease to expire).
async fn closing_a_session_whose_turn_runs_says_to_cancel_it_and_names_no_worker(b: Backend) {
    let s = start(b).await;
    let release = s
        .release("slow", &[json!({"delay_ms": 3000, "text": "done"})], &[])
        .await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let turns = format!("/v1/sessions/{session}/turns");
    let r = s.post(&turns, &s.operator, &json!({"input": "go"})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let r = loop {
        let r = s
            .call(
                "POST",
                &format!("/v1/sessions/{session}/close"),
                Some(&s.operator),
                None,
                &[("if-match", "*")],
            )
            .await;
        if r.status == StatusCode::CONFLICT
            && r.body["detail"]
                .as_str()
                .unwrap_or("")
                .contains("being run")
        {
            break r;
        }
        assert!(tokio::time::Instant::now() < deadline, "{r:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let detail = r.body["detail"].as_str().unwrap();
    assert!(detail.contains("/cancel"), "{detail}");
    assert!(!detail.contains('@') && !detail.contains("pid"), "{detail}");
    let r = s
        .post(
            &format!("/v1/sessions/{session}/cancel"),
            &s.operator,
            &json!({}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
}
