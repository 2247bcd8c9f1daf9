//! Raw HTTP behaviour: endpoints, whole unpaced bodies, headers of faults, recording.

use keel_testkit::{FakeModelServer, FakeResponse, Fault, Pacing, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn raw(server: &FakeModelServer, path: &str, body: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn unpaced_response_is_one_complete_body_with_content_length() {
    let server = FakeModelServer::start_fixed(
        Reply::Respond(FakeResponse::text("hi there")),
        Pacing::default(),
    )
    .await
    .unwrap();
    let out = raw(&server, "/v1/chat/completions", r#"{"model":"m"}"#).await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(out.contains("content-type: text/event-stream"), "{out}");
    assert!(
        out.contains("content-length: "),
        "unpaced bodies are sent whole, not chunked: {out}"
    );
    assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
    let recorded = server.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].body["model"], "m");
    assert_eq!(recorded[0].header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn rate_limit_fault_sends_retry_after_headers_and_unknown_paths_404() {
    let server = FakeModelServer::start_fixed(
        Reply::Fault(Fault::RateLimited {
            retry_after_ms: 1500,
        }),
        Pacing::default(),
    )
    .await
    .unwrap();
    let out = raw(&server, "/v1/messages", "{}").await;
    assert!(out.starts_with("HTTP/1.1 429"), "{out}");
    assert!(
        out.contains("retry-after-ms: 1500\r\n") && out.contains("retry-after: 2\r\n"),
        "{out}"
    );
    assert!(out.contains(r#""type":"rate_limit_error""#), "{out}");
    let out = raw(&server, "/v1/embeddings", "{}").await;
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
}

#[tokio::test]
async fn a_paced_body_counts_as_abandoned_only_when_the_client_leaves_early() {
    let pacing = Pacing {
        time_to_first_token_ms: 10,
        tokens_per_second: Some(500.0),
    };
    let server = FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("a b c")), pacing)
        .await
        .unwrap();
    let out = raw(&server, "/v1/messages", "{}").await;
    assert!(out.contains("message_stop"), "{out}");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(server.abandoned_responses(), 0, "a complete response");

    let slow = Pacing {
        time_to_first_token_ms: 30_000,
        tokens_per_second: None,
    };
    let server = FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("x")), slow)
        .await
        .unwrap();
    let mut tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    tcp.write_all(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert_eq!(server.abandoned_responses(), 0, "still streaming");
    drop(tcp);
    assert!(
        server
            .wait_for_abandoned(1, std::time::Duration::from_secs(2))
            .await
    );
}
