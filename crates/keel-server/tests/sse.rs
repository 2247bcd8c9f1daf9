//! Events over SSE: a client that disconnects mid-turn and reconnects with `Last-Event-ID`
//! gets every durable event exactly once, in order; heartbeats keep an idle stream talking;
//! a key holds at most `max_streams_per_key` streams.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    reconnecting_with_last_event_id_delivers_every_durable_event_exactly_once,
    streams_beyond_the_per_key_limit_get_429_and_heartbeats_flow,
    the_tenant_stream_reports_every_session_beyond_one_page,
);
on_both!(a_paused_reader_of_a_revoked_key_gets_nothing_written_after_the_revocation);

/// Reads durable events (with ids) until `stop` holds on one; returns their seqs and types.
async fn read_until(sse: &mut Sse, stop: impl Fn(&str, &Value) -> bool) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    while let Some(f) = sse.next().await {
        let Some(id) = f.id else {
            let data: Value = serde_json::from_str(&f.data).unwrap();
            assert_eq!(data["ephemeral"], true, "{f:?}");
            continue;
        };
        let ty = f.event.clone().unwrap();
        let data: Value = serde_json::from_str(&f.data).unwrap();
        got.push((id.parse().unwrap(), ty.clone()));
        if stop(&ty, &data) {
            return got;
        }
    }
    panic!("the stream ended early after {got:?}");
}

async fn reconnecting_with_last_event_id_delivers_every_durable_event_exactly_once(b: Backend) {
    let s = start(b).await;
    let read = call("read_file", json!({"path": "README.md"}));
    let mut lines: Vec<Value> = (0..4)
        .map(|_| json!({"delay_ms": 120, "tool_calls": [read.clone()]}))
        .collect();
    lines.push(json!({"text": "read it four times"}));
    let release = s.release("reader", &lines, &["read_file"]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/sessions/{session}/events");
    let mut first = s.sse(&path, &s.viewer, None).await;
    let r = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "read"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    // Disconnect mid-turn: after the first step completed.
    let before = read_until(&mut first, |ty, _| ty == "step.completed").await;
    first.close();
    drop(first);
    let last = before.last().unwrap().0;
    // Let the turn move on while nobody listens.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut second = s.sse(&path, &s.viewer, Some(last)).await;
    assert_eq!(second.status, StatusCode::OK);
    let after = read_until(&mut second, |ty, d| {
        ty == "turn.finished" && d["payload"]["terminal_reason"] == "completed"
    })
    .await;
    assert_eq!(
        after.first().unwrap().0,
        last + 1,
        "resumes right after the last id"
    );
    let seqs: Vec<u64> = before.iter().chain(&after).map(|(s, _)| *s).collect();
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "no event twice: {seqs:?}");
    assert_eq!(
        seqs,
        (1..=*seqs.last().unwrap()).collect::<Vec<_>>(),
        "every event, in order"
    );
    // The same events the JSON pages hold, with the same types.
    let page = s.get(&format!("{path}?limit=1000"), &s.viewer).await;
    let journal: Vec<(u64, String)> = page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .take(seqs.len())
        .collect();
    let streamed: Vec<(u64, String)> = before.into_iter().chain(after).collect();
    assert_eq!(streamed, journal);
    // JSON pages: after + limit.
    let p = s.get(&format!("{path}?after=2&limit=3"), &s.viewer).await;
    let got: Vec<u64> = p.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(got, vec![3, 4, 5]);
    assert_eq!(p.body["next_after"], 5);
    assert_eq!(p.body["has_more"], true);
    // A bad Last-Event-ID is a 400 naming the header: not a number, or past any seq (as
    // `after` is).
    for id in ["x", "9223372036854775808", "18446744073709551615"] {
        let bad = s
            .call(
                "GET",
                &path,
                Some(&s.viewer),
                None,
                &[("accept", "text/event-stream"), ("last-event-id", id)],
            )
            .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{id}");
        assert_eq!(bad.body["field"], "last-event-id", "{id}");
    }
}

async fn streams_beyond_the_per_key_limit_get_429_and_heartbeats_flow(b: Backend) {
    let s = start_with(b, |c| {
        c.max_streams_per_key = 2;
        c.heartbeat_ms = 100;
    })
    .await;
    let release = s.release("idle", &[json!({"text": "x"})], &[]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/sessions/{session}/events");
    let mut one = s.sse(&path, &s.viewer, None).await;
    let two = s.sse("/v1/events", &s.viewer, None).await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(two.status, StatusCode::OK);
    let three = s
        .call(
            "GET",
            &path,
            Some(&s.viewer),
            None,
            &[("accept", "text/event-stream")],
        )
        .await;
    assert_eq!(three.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(three.body["limit"], "max_streams_per_key");
    // Another key has its own streams.
    let other = s.sse(&path, &s.operator, None).await;
    assert_eq!(other.status, StatusCode::OK);
    // Heartbeats: an idle stream still sends a comment.
    assert!(one.raw_until(": heartbeat").await, "no heartbeat");
    // Closing one frees its slot.
    drop(two);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = s.sse(&path, &s.viewer, None).await;
        if again.status == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With 5 sessions per store read and 12 sessions, the tenant-wide stream reports each of the
/// 12, then a change to the newest (beyond the first two pages).
async fn the_tenant_stream_reports_every_session_beyond_one_page(b: Backend) {
    let s = start_with(b, |c| c.tenant_stream_page = 5).await;
    let release = s.release("idle", &[json!({"text": "x"})], &[]).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        let r = s.session(&release, json!({})).await;
        ids.push(r.body["session_id"].as_str().unwrap().to_owned());
    }
    let mut stream = s.sse("/v1/events", &s.viewer, None).await;
    assert_eq!(stream.status, StatusCode::OK);
    let mut seen = BTreeSet::new();
    while seen.len() < ids.len() {
        let f = stream
            .next()
            .await
            .unwrap_or_else(|| panic!("the stream ended after reporting {seen:?}"));
        let data: Value = serde_json::from_str(&f.data).unwrap();
        assert_eq!(data["status"], "created", "{data}");
        seen.insert(data["session_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ids.iter().cloned().collect::<BTreeSet<_>>());
    // Closing the newest session is reported.
    let newest = ids.last().unwrap();
    let path = format!("/v1/sessions/{newest}");
    let tag = s.get(&path, &s.viewer).await.header("etag").unwrap();
    let r = s
        .call(
            "POST",
            &format!("{path}/close"),
            Some(&s.operator),
            None,
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let f = stream.next().await.expect("no frame after the close");
    let data: Value = serde_json::from_str(&f.data).unwrap();
    assert_eq!(data["session_id"], newest.as_str(), "{data}");
    assert_eq!(data["status"], "closed", "{data}");
}

/// A client that stops reading its session stream (a small receive buffer, so the server's
/// writes back up) while the stream's key is revoked by another process gets no event
/// written after the revocation when it reads again: the stream's credential is watched
/// whether or not the client reads, and the stream ends before anything still buffered for it.
/// Before, the checks ran only as items flowed to the client, and a paused client, resuming,
/// could get events of a turn run after the revocation from the stream's backlog (attacker
/// review, 2026-12-06: 81 events after a revocation; this test's timing did not reproduce that
/// against the old code, it holds the property of the new one).
async fn a_paused_reader_of_a_revoked_key_gets_nothing_written_after_the_revocation(b: Backend) {
    use keel_store::{KeyScope, Role};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start(b).await;
    // Large events (~400 KB of text each turn) fill the socket buffers quickly.
    let big = "word ".repeat(80_000);
    let lines: Vec<Value> = (0..6).map(|_| json!({"text": big})).collect();
    let release = s.release("big", &lines, &[]).await;
    let session = s.run_to_idle(&release, "one").await;
    for input in ["two", "three"] {
        s.post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": input}),
        )
        .await;
        s.wait_session(&session, |b| b["status"] == "idle").await;
    }
    let kate = key(&s.store, Some(s.tenant), "kate", Role::Viewer).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let authority = s.base.trim_start_matches("http://").to_owned();
    let mut tcp = socket.connect(authority.parse().unwrap()).await.unwrap();
    let request = format!(
        "GET /v1/sessions/{session}/events HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {kate}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 1024];
    let n = tcp.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    // Paused: the server writes until the buffers are full.
    tokio::time::sleep(Duration::from_secs(1)).await;
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
    // Past the periodic check (twice its interval), then a turn after the revocation.
    tokio::time::sleep(keel_server::api::events::RECHECK * 2).await;
    let first_after = last_seq(&s, &session).await + 1;
    s.post(
        &format!("/v1/sessions/{session}/turns"),
        &s.operator,
        &json!({"input": "after"}),
    )
    .await;
    s.wait_session(&session, |b| b["status"] == "idle").await;
    assert!(
        last_seq(&s, &session).await >= first_after,
        "the turn after ran"
    );
    // Resumes: reads to the end of the response (it must end).
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the stream of the revoked key ended");
    let text = String::from_utf8_lossy(&got);
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    assert!(
        ids.iter().all(|id| *id < first_after),
        "events of the turn after the revocation (from seq {first_after}) reached the revoked key: {:?}",
        ids.iter()
            .filter(|id| **id >= first_after)
            .collect::<Vec<_>>()
    );
}

/// The session's last seq (the events pages followed to the end).
async fn last_seq(s: &TestServer, session: &str) -> u64 {
    let mut after = 0;
    loop {
        let r = s
            .get(
                &format!("/v1/sessions/{session}/events?after={after}&limit=1000"),
                &s.viewer,
            )
            .await;
        let next = r.body["next_after"].as_u64().unwrap();
        if next == after {
            return after;
        }
        after = next;
    }
}
