//! Requests, typed errors and pagination.

use keel_client::api::{CreateSessionRequest, SettingsBody};
use keel_client::{Client, Error};
use serde_json::json;

use crate::common::{Backend, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_carry_the_problem_body_and_name_the_limit() {
    let s = start(Backend::Sqlite).await;
    let release = s.release("errs", &[json!({"text": "hi"})], &[]).await;

    let bad = Client::new(&s.base, Some("keel_not_a_key")).unwrap();
    let e = bad
        .get_session("0190a0a0-0000-7000-8000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let p = e.problem().expect("a problem body");
    assert!(p.kind.starts_with("urn:keel:problem:"), "{p:?}");

    let op = Client::new(&s.base, Some(&s.operator)).unwrap();
    let e = op
        .get_session("0190a0a0-0000-7000-8000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");

    // A workspace outside the server's roots: 403 naming the limit.
    let e = op
        .create_session(&CreateSessionRequest {
            release_id: release.clone(),
            workspace: "/".into(),
            settings: SettingsBody::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    assert_eq!(
        e.problem().and_then(|p| p.limit.as_deref()),
        Some("workspace_roots"),
        "{e}"
    );

    // The viewer may not create releases: 403 (a role, no limit).
    let viewer = Client::new(&s.base, Some(&s.viewer)).unwrap();
    let e = viewer
        .cancel_turn("0190a0a0-0000-7000-8000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");

    // Nothing listens: a connection error that says so.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = Client::new(&format!("http://127.0.0.1:{port}"), Some(&s.operator)).unwrap();
    let e = gone.list_sessions(None).await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("cannot connect to"), "{e}");
    assert!(e.to_string().to_lowercase().contains("refused"), "{e}");

    assert!(matches!(
        Client::new("127.0.0.1:7878", None),
        Err(Error::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pagination_follows_cursors_to_the_last_page() {
    let s = start(Backend::Sqlite).await;
    let release = s.release("pages", &[json!({"text": "hi"})], &[]).await;
    let op = Client::new(&s.base, Some(&s.operator)).unwrap();
    let mut created = Vec::new();
    for _ in 0..5 {
        let body = op
            .create_session(&CreateSessionRequest {
                release_id: release.clone(),
                workspace: s.workspace.display().to_string(),
                settings: SettingsBody::default(),
            })
            .await
            .unwrap();
        created.push(body.session_id);
    }
    // Pages of 2: three requests, five sessions, in order.
    let all = op
        .all::<keel_client::api::SessionPage>("/v1/sessions", &[("limit", "2".into())])
        .await
        .unwrap();
    let ids: Vec<String> = all.into_iter().map(|b| b.session_id).collect();
    assert_eq!(ids, created);
    assert_eq!(op.list_sessions(Some("created")).await.unwrap().len(), 5);

    // The same release definition twice is the same release.
    let again = s.release("pages", &[json!({"text": "hi"})], &[]).await;
    assert_eq!(again, release);
    assert_eq!(op.get_release(&release).await.unwrap().release_id, release);
}
