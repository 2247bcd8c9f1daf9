//! The listeners: HTTPS with the given certificate (rustls), and `/metrics` on its own address
//! with no tenant's data (a tenant id shows only as a `keel_queue_depth` label while it has turns
//! queued; none here, the session is idle when scraped).

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_https_with_the_given_certificate_and_refuses_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let db = db(Backend::Sqlite).await;
    let config = keel_server::ServerConfig {
        listen: "127.0.0.1:0".into(),
        metrics_listen: None,
        tls_cert: Some(cert),
        tls_key: Some(key),
        ..keel_server::ServerConfig::default()
    };
    let deps = keel_server::Deps {
        store: db.store.clone(),
        models: Arc::new(Scripts),
        tools: Arc::new(keel_tools::ToolRegistry::with_builtins),
        runtime_options: keel_runtime::RuntimeOptions::default(),
    };
    let server = keel_server::Server::bind(config, deps).await.unwrap();
    let port = server.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ck.cert.pem().as_bytes()).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = client
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = client
        .get(format!("https://localhost:{port}/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("http://localhost:{port}/healthz"))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    // A server with a certificate file that is not one refuses to start, naming it.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let err = keel_server::Server::bind(
        keel_server::ServerConfig {
            listen: "127.0.0.1:0".into(),
            metrics_listen: None,
            tls_cert: Some(bad.clone()),
            tls_key: Some(bad),
            ..keel_server::ServerConfig::default()
        },
        keel_server::Deps {
            store: db.store.clone(),
            models: Arc::new(Scripts),
            tools: Arc::new(keel_tools::ToolRegistry::with_builtins),
            runtime_options: keel_runtime::RuntimeOptions::default(),
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("bad.pem"), "{err}");
    let _ = tx.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_apart_and_show_no_tenants_data() {
    let s = start(Backend::Sqlite).await;
    let release = s.release("m", &[json!({"text": "ok"})], &[]).await;
    let session = s.run_to_idle(&release, "secret-ish input").await;
    let metrics = s.metrics.unwrap();
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("keel_http_responses_total{class=\"2xx\"}"),
        "{text}"
    );
    assert!(text.contains("keel_session_runs_total"));
    for private in [
        session.as_str(),
        &s.tenant.to_string(),
        "secret-ish",
        "acme",
    ] {
        assert!(!text.contains(private), "{private} in metrics");
    }
    // The API's port does not serve metrics.
    let r = s.call("GET", "/metrics", None, None, &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}
