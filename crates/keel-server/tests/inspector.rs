//! The inspector over plain HTTP: its page and assets (budget, security headers), sign-in for a
//! server-side session cookie, what the cookie may do (the key's role and tenant, CSRF checks),
//! sign-out, the limit on failed sign-ins (per client), and why the cookie alone is not a session
//! (another server on this host receives it). The browser tests are in `inspector_browser`.

use keel_server::inspector::{ASSETS, CSP, MAX_PAGE_BYTES};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    the_page_and_its_assets_are_served_whole_with_strict_headers,
    a_cookie_acts_as_its_key_and_needs_the_csrf_token_to_change_anything,
    the_cookie_alone_is_not_a_session_and_never_recovers_the_token,
    sign_in_refuses_bad_keys_and_is_limited,
    a_valid_key_signs_in_while_another_client_used_up_the_failure_limit,
    fallbacks_and_errors_carry_the_security_headers,
    behind_a_tls_proxy_public_url_makes_the_cookie_secure_and_is_the_only_origin,
    open_streams_end_when_the_key_is_revoked_or_the_session_signed_out_everywhere
);

/// A signed-in browser as HTTP sees it: the cookie and the token.
pub struct Signed {
    pub cookie: String,
    pub csrf: String,
    pub body: Value,
}

/// Signs in with `key` (asserting success) and returns the cookie pair and CSRF token.
pub async fn sign_in(s: &TestServer, key: &str) -> Signed {
    let res = s
        .http
        .post(format!("{}/inspector/sign-in", s.base))
        .header("content-type", "application/json")
        .header("origin", &s.base)
        .body(json!({ "key": key }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let set = res
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    assert!(!set.contains(key) && !set.contains(&key[5..]), "{set}");
    let port = s.base.rsplit(':').next().unwrap();
    assert!(
        set.starts_with(&format!("keel_inspector_{port}=")),
        "the port is in the cookie's name: {set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let body: Value = res.json().await.unwrap();
    Signed {
        cookie,
        csrf: body["csrf_token"].as_str().unwrap().to_owned(),
        body,
    }
}

/// Sends `method path` with the cookie and, when given, the CSRF token and an Origin.
pub async fn with_cookie(
    s: &TestServer,
    method: &str,
    path: &str,
    signed: &Signed,
    csrf: Option<&str>,
    origin: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let mut rb = s
        .http
        .request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", s.base),
        )
        .header("cookie", &signed.cookie);
    if let Some(t) = csrf {
        rb = rb.header("x-keel-csrf", t);
    }
    if let Some(o) = origin {
        rb = rb.header("origin", o);
    }
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let res = rb.send().await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.json().await.unwrap_or(Value::Null);
    (status, body, headers)
}

async fn the_page_and_its_assets_are_served_whole_with_strict_headers(b: Backend) {
    let s = start(b).await;
    let mut total = 0;
    for a in ASSETS {
        let res = s
            .http
            .get(format!("{}{}", s.base, a.path))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{}", a.path);
        let h = res.headers().clone();
        assert_eq!(h["content-security-policy"], CSP);
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["content-type"], a.content_type);
        let bytes = res.bytes().await.unwrap();
        assert_eq!(&bytes[..], a.bytes, "{} is served as embedded", a.path);
        total += bytes.len();
    }
    // The page at `/` loads every asset: its weight is their sum, measured as served.
    assert_eq!(total, ASSETS.iter().map(|a| a.bytes.len()).sum::<usize>());
    assert!(total <= MAX_PAGE_BYTES, "the page weighs {total} bytes");
    println!("inspector page weight: {total} bytes");
    assert!(CSP.contains("script-src 'self'") && !CSP.contains("unsafe-inline"));
    assert!(CSP.contains("frame-ancestors 'none'"));
    // Nobody is signed in: who-am-I says so.
    let r = s.call("GET", "/inspector/session", None, None, &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

async fn a_cookie_acts_as_its_key_and_needs_the_csrf_token_to_change_anything(b: Backend) {
    let s = start(b).await;
    let release = s
        .release(
            "quiet",
            &[json!({"text": "ok"}), json!({"text": "ok"})],
            &[],
        )
        .await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let op = sign_in(&s, &s.operator).await;
    assert_eq!(op.body["role"], "operator");
    assert_eq!(op.body["tenant_id"], s.tenant.to_string());
    // Reads carry the token too, and answer no-store.
    let t = Some(op.csrf.as_str());
    let (st, body, h) = with_cookie(&s, "GET", "/v1/sessions", &op, t, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["items"].as_array().unwrap().len(), 1);
    assert_eq!(h["cache-control"], "no-store");
    let (st, me, _) = with_cookie(&s, "GET", "/inspector/session", &op, t, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(me["role"], "operator");
    let turn = format!("/v1/sessions/{session}/turns");
    let input = || Some(json!({"input": "hi"}));
    // A change without the token, with another session's token, or from another origin: 403.
    let (st, body, _) = with_cookie(&s, "POST", &turn, &op, None, None, input()).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["field"], "x-keel-csrf");
    let other = sign_in(&s, &s.operator).await;
    let (st, _, _) = with_cookie(&s, "POST", &turn, &op, Some(&other.csrf), None, input()).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _, _) = with_cookie(
        &s,
        "POST",
        &turn,
        &op,
        Some(&op.csrf),
        Some("http://evil.example"),
        input(),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // With it, from this origin: done, and journaled with the key's principal.
    let (st, body, _) = with_cookie(
        &s,
        "POST",
        &turn,
        &op,
        Some(&op.csrf),
        Some(&s.base),
        input(),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    let queued = events_of(&s, &session, "turn.queued").await;
    assert_eq!(queued[0]["principal_id"], op.body["principal_id"]);
    // A viewer's cookie, even with its token, changes nothing.
    let viewer = sign_in(&s, &s.viewer).await;
    let (st, _, _) = with_cookie(
        &s,
        "POST",
        &turn,
        &viewer,
        Some(&viewer.csrf),
        Some(&s.base),
        input(),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _, _) = with_cookie(&s, "GET", &turn, &viewer, Some(&viewer.csrf), None, None).await;
    assert_eq!(st, StatusCode::OK);
    // Another tenant's cookie sees none of it.
    let mallory = sign_in(&s, &s.other).await;
    let m = Some(mallory.csrf.as_str());
    let (st, body, _) = with_cookie(&s, "GET", "/v1/sessions", &mallory, m, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["items"], json!([]));
    let (st, _, _) = with_cookie(
        &s,
        "GET",
        &format!("/v1/sessions/{session}"),
        &mallory,
        m,
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Sign-out needs the token too, then the cookie is refused.
    let (st, _, _) = with_cookie(&s, "POST", "/inspector/sign-out", &op, None, None, None).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _, h) = with_cookie(
        &s,
        "POST",
        "/inspector/sign-out",
        &op,
        Some(&op.csrf),
        Some(&s.base),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(h["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    let (st, body, _) = with_cookie(&s, "GET", "/v1/sessions", &op, t, None, None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert!(
        body["detail"].as_str().unwrap().contains("sign in again"),
        "{body}"
    );
    // The other session of the same key lives on until its key is revoked.
    let o = Some(other.csrf.as_str());
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &other, o, None, None).await;
    assert_eq!(st, StatusCode::OK);
    let keys = s.get("/v1/keys", &s.admin).await;
    let olga = keys.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "olga")
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s
        .post(&format!("/v1/keys/{olga}/revoke"), &s.admin, &json!({}))
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &other, o, None, None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

/// Attacker review F1: any server on this host (a dev server the agent started) receives the
/// cookie when the operator's browser visits it. With the cookie alone it gets nothing: not the
/// token (no answer but sign-in's holds it), not a read, not a change.
async fn the_cookie_alone_is_not_a_session_and_never_recovers_the_token(b: Backend) {
    let s = start(b).await;
    let op = sign_in(&s, &s.operator).await;
    assert_eq!(op.csrf.len(), 64, "the sign-in answer holds the token");
    for path in ["/inspector/session", "/v1/sessions", "/v1/approvals"] {
        let (st, body, h) = with_cookie(&s, "GET", path, &op, None, None, None).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["field"], "x-keel-csrf", "{path}");
        assert!(body.get("csrf_token").is_none(), "{path}: {body}");
        assert_eq!(h["cache-control"], "no-store", "{path}: errors too");
    }
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &op, Some("0"), None, None).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // The page's own session check, with the token, answers who, never the token.
    let (st, me, h) = with_cookie(
        &s,
        "GET",
        "/inspector/session",
        &op,
        Some(&op.csrf),
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{me}");
    assert!(me.get("csrf_token").is_none(), "{me}");
    assert_eq!(me["principal_id"], op.body["principal_id"]);
    assert_eq!(h["cache-control"], "no-store");
    // The SSE streams, GET too, need it as well.
    let (st, _, _) = with_cookie(&s, "GET", "/v1/events", &op, None, None, None).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // A cookie of another port's server is not this server's cookie.
    let foreign = Signed {
        cookie: op.cookie.replacen("keel_inspector_", "keel_inspector_1", 1),
        csrf: op.csrf.clone(),
        body: Value::Null,
    };
    let (st, _, _) = with_cookie(
        &s,
        "GET",
        "/v1/sessions",
        &foreign,
        Some(&op.csrf),
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // "Sign out everywhere" ends the key's other sessions (a leaked cookie stops working).
    let second = sign_in(&s, &s.operator).await;
    let (st, _, _) = with_cookie(
        &s,
        "POST",
        "/inspector/sign-out?all=1",
        &op,
        Some(&op.csrf),
        Some(&s.base),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _, _) = with_cookie(
        &s,
        "GET",
        "/v1/sessions",
        &second,
        Some(&second.csrf),
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

async fn sign_in_refuses_bad_keys_and_is_limited(b: Backend) {
    let s = start(b).await;
    let post = |body: Value, origin: Option<&'static str>| {
        let mut rb = s
            .http
            .post(format!("{}/inspector/sign-in", s.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        rb.send()
    };
    let r = post(json!({"key": s.system}), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("set-cookie").is_none());
    let r = post(json!({"key": s.operator}), Some("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "no sign-in from another site"
    );
    let r = post(json!({"nope": 1}), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let wrong = "keel_0000000000000000000000000000000000000000000000000000000000000000";
    for _ in 0..keel_server::inspector::signin::MAX_FAILURES {
        let r = post(json!({"key": wrong}), None).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().get("set-cookie").is_none());
    }
    let r = post(json!({"key": wrong}), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("retry-after").is_some());
    // A valid key is never refused, not even from the client that failed.
    let r = post(json!({"key": s.operator}), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// Attacker review F2: the failure limit is per client address, so one client's wrong keys
/// lock nobody else out.
async fn a_valid_key_signs_in_while_another_client_used_up_the_failure_limit(b: Backend) {
    let s = start(b).await;
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .build()
            .unwrap()
    };
    let (mallory, alice) = (from([127, 0, 0, 2]), from([127, 0, 0, 1]));
    let post = |c: &reqwest::Client, key: &str| {
        c.post(format!("{}/inspector/sign-in", s.base))
            .header("content-type", "application/json")
            .body(json!({ "key": key }).to_string())
            .send()
    };
    let wrong = "keel_1111111111111111111111111111111111111111111111111111111111111111";
    for _ in 0..keel_server::inspector::signin::MAX_FAILURES {
        assert_eq!(
            post(&mallory, wrong).await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        post(&mallory, wrong).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        post(&alice, wrong).await.unwrap().status(),
        StatusCode::UNAUTHORIZED,
        "another client's mistakes are its own"
    );
    assert_eq!(
        post(&alice, &s.operator).await.unwrap().status(),
        StatusCode::OK
    );
}

/// Attacker review F7: the security headers are on every response, the 404/405 fallbacks
/// (which echo the path) included.
async fn fallbacks_and_errors_carry_the_security_headers(b: Backend) {
    let s = start(b).await;
    for (method, path, want) in [
        ("GET", "/inspector/nope", StatusCode::NOT_FOUND),
        ("GET", "/index.html", StatusCode::NOT_FOUND),
        ("POST", "/", StatusCode::METHOD_NOT_ALLOWED),
        ("GET", "/inspector/sign-in", StatusCode::METHOD_NOT_ALLOWED),
        ("GET", "/v1/sessions", StatusCode::UNAUTHORIZED),
    ] {
        let r = s
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{}{path}", s.base),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{method} {path}");
        let h = r.headers();
        assert_eq!(h["content-security-policy"], CSP, "{method} {path}");
        assert_eq!(h["x-frame-options"], "DENY", "{method} {path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{method} {path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{method} {path}");
        assert_eq!(h["cache-control"], "no-store", "{method} {path}");
    }
}

/// Review item 4: behind a proxy that ends TLS (and forwards to this plain-HTTP server with its
/// own `Host`), `public_url` makes the cookie `Secure` with the `__Host-` prefix, and the
/// browser's `Origin` must be exactly the public one: the local origin and an `http://` public
/// one are refused, at sign-in and on every cookie request.
async fn behind_a_tls_proxy_public_url_makes_the_cookie_secure_and_is_the_only_origin(b: Backend) {
    let public = "https://keel.example.com";
    let s = start_with(b, |c| c.public_url = Some(format!("{public}/"))).await;
    let sign_in_from = |origin: &'static str| {
        s.http
            .post(format!("{}/inspector/sign-in", s.base))
            .header("content-type", "application/json")
            .header("origin", origin)
            .body(json!({ "key": s.operator }).to_string())
            .send()
    };
    for wrong in ["http://keel.example.com", "https://evil.example"] {
        let r = sign_in_from(wrong).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{wrong}");
    }
    let local = sign_in_from("http://127.0.0.1").await.unwrap();
    assert_eq!(local.status(), StatusCode::FORBIDDEN, "the local origin");
    let res = sign_in_from(public).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let set = res.headers()["set-cookie"].to_str().unwrap().to_owned();
    let port = s.base.rsplit(':').next().unwrap();
    assert!(
        set.starts_with(&format!("__Host-keel_inspector_{port}=")),
        "{set}"
    );
    for attr in ["; Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains("Domain"), "{set}");
    let body: Value = res.json().await.unwrap();
    let signed = Signed {
        cookie: set.split(';').next().unwrap().to_owned(),
        csrf: body["csrf_token"].as_str().unwrap().to_owned(),
        body,
    };
    let csrf = Some(signed.csrf.as_str());
    let (st, list, _) =
        with_cookie(&s, "GET", "/v1/sessions", &signed, csrf, Some(public), None).await;
    assert_eq!(st, StatusCode::OK, "{list}");
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &signed, csrf, None, None).await;
    assert_eq!(st, StatusCode::OK, "no Origin (a GET): the token decides");
    for wrong in [s.base.as_str(), "http://keel.example.com"] {
        let (st, _, _) =
            with_cookie(&s, "GET", "/v1/sessions", &signed, csrf, Some(wrong), None).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{wrong}");
    }
    // The cookie without its `__Host-` name is not this server's.
    let plain = Signed {
        cookie: signed.cookie.trim_start_matches("__Host-").to_owned(),
        csrf: signed.csrf.clone(),
        body: Value::Null,
    };
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &plain, csrf, Some(public), None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

/// Opens an SSE stream of `path` with the inspector's cookie and token.
async fn cookie_sse(s: &TestServer, path: &str, signed: &Signed) -> Sse {
    let res = s
        .http
        .get(format!("{}{path}", s.base))
        .header("cookie", &signed.cookie)
        .header("x-keel-csrf", &signed.csrf)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    Sse::of(res)
}

/// Attacker review 19-2: auth is not only checked when a stream opens. An open stream of a
/// bearer key ends when the key is revoked by another process (`keel keys revoke` writes the
/// store: the periodic check finds it), and an open stream of an inspector session ends at
/// "sign out everywhere" from another browser; a stream of a key still valid stays open.
async fn open_streams_end_when_the_key_is_revoked_or_the_session_signed_out_everywhere(b: Backend) {
    use keel_store::{KeyScope, Role};
    // A correctness deadline, 10x the recheck interval.
    let deadline = keel_server::api::events::RECHECK * 10;
    let s = start(b).await;
    let release = s.release("quiet", &[json!({"text": "hi"})], &[]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = format!("/v1/sessions/{session}/events");
    let kate = key(&s.store, Some(s.tenant), "kate", Role::Viewer).await;
    let mut control = s.sse("/v1/events", &s.viewer, None).await;
    let mut tenant = s.sse("/v1/events", &kate, None).await;
    let mut one = s.sse(&events, &kate, None).await;
    for st in [&control, &tenant, &one] {
        assert_eq!(st.status, StatusCode::OK);
    }
    let first = tenant.next().await.expect("the session's status");
    assert_eq!(first.event.as_deref(), Some("session.status"));
    let keys = s.get("/v1/keys", &s.admin).await;
    let kate_id = keys.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "kate")
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.store
        .revoke_api_key(KeyScope::All, &kate_id, chrono::Utc::now())
        .await
        .unwrap();
    assert!(
        tenant.ends_within(deadline).await,
        "the tenant stream of a revoked key ended"
    );
    assert!(
        one.ends_within(deadline).await,
        "the session stream of a revoked key ended"
    );
    // Attacker review 19-5: the artifact route refuses `.`, `..` and other non-ids (404: they
    // name no artifact).
    // (Sent raw: an HTTP client would resolve `%2E%2E` to `/v1/` before sending it.)
    for bad in ["%2E%2E", "%2E", ".hidden", "a%2Fb"] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let authority = s.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
        let request = format!(
            "GET /v1/artifacts/{bad} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            s.viewer
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 404"), "{bad}: {answer}");
        assert!(
            answer.contains("\"field\":\"artifact_id\""),
            "{bad}: {answer}"
        );
    }
    let alive = control.next().await.expect("a valid key's stream goes on");
    assert_eq!(alive.event.as_deref(), Some("session.status"));

    // Two browsers signed in with one key; the second signs out everywhere.
    let olga = key(&s.store, Some(s.tenant), "olga", Role::Operator).await;
    let here = sign_in(&s, &olga).await;
    let there = sign_in(&s, &olga).await;
    // Attacker review 19-3: a cookie of the same name planted by another server of this host
    // (`Path=/v1`, so the browser sends it first) does not hide the session's.
    let port = s.base.rsplit(':').next().unwrap();
    let planted = Signed {
        cookie: format!("keel_inspector_{port}=0000; {}", here.cookie),
        csrf: here.csrf.clone(),
        body: Value::Null,
    };
    let t = Some(here.csrf.as_str());
    let (st, _, _) = with_cookie(&s, "GET", "/v1/sessions", &planted, t, None, None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, me, _) = with_cookie(&s, "GET", "/inspector/session", &planted, t, None, None).await;
    assert_eq!(
        (st, me["role"].as_str()),
        (StatusCode::OK, Some("operator"))
    );
    let mut tenant = cookie_sse(&s, "/v1/events", &here).await;
    let mut one = cookie_sse(&s, &events, &here).await;
    let mut other = cookie_sse(&s, "/v1/events", &there).await;
    for st in [&tenant, &one, &other] {
        assert_eq!(st.status, StatusCode::OK);
    }
    assert!(tenant.next().await.is_some());
    let (st, _, _) = with_cookie(
        &s,
        "POST",
        "/inspector/sign-out?all=1",
        &there,
        Some(&there.csrf),
        Some(&s.base),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    for (what, st) in [
        ("tenant", &mut tenant),
        ("session", &mut one),
        ("signing-out", &mut other),
    ] {
        assert!(
            st.ends_within(deadline).await,
            "the {what} stream of a session signed out everywhere ended"
        );
    }
}
