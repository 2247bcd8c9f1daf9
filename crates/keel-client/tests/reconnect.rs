//! The event stream survives a connection cut mid-turn: a TCP proxy between the client and the
//! server drops every connection it carries while the turn runs, and the client reconnects with
//! `Last-Event-ID` and receives every durable event exactly once.

use std::time::Duration;

use keel_client::api::{CreateSessionRequest, SettingsBody};
use keel_client::{Client, Reconnect, StreamItem};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common::{Backend, call, start};

/// A TCP proxy to `target`; sending on its `cut` channel drops every connection open then
/// (new ones are still accepted).
struct Proxy {
    addr: std::net::SocketAddr,
    cut: watch::Sender<u64>,
}

async fn proxy(target: String) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (cut, rx) = watch::channel(0u64);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            let mut rx = rx.clone();
            rx.mark_unchanged();
            tokio::spawn(async move {
                let Ok(mut outbound) = TcpStream::connect(&target).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = rx.changed() => {
                        // Cut: both sides see the connection end abruptly.
                        let _ = inbound.shutdown().await;
                    }
                }
            });
        }
    });
    Proxy { addr, cut }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_cut_mid_turn_reconnects_and_delivers_every_durable_event_once() {
    let s = start(Backend::Sqlite).await;
    // Three slow steps, so the turn is still running when the connection is cut.
    let release = s
        .release(
            "cut",
            &[
                json!({"delay_ms": 300, "tool_calls": [call("read_file", json!({"path": "README.md"}))]}),
                json!({"delay_ms": 300, "tool_calls": [call("list_dir", json!({"path": "."}))]}),
                json!({"delay_ms": 300, "text": "done"}),
            ],
            &[],
        )
        .await;
    let target = s.base.trim_start_matches("http://").to_owned();
    let p = proxy(target).await;
    let client = Client::new(&format!("http://{}", p.addr), Some(&s.operator)).unwrap();
    let session = client
        .create_session(&CreateSessionRequest {
            release_id: release,
            workspace: s.workspace.display().to_string(),
            settings: SettingsBody::default(),
        })
        .await
        .unwrap()
        .session_id;
    let policy = Reconnect {
        max_attempts: 20,
        initial_delay: Duration::from_millis(50),
    };
    let mut stream = client.stream_events(&session, 0, policy).await.unwrap();
    let turn = client
        .submit_turn(&session, "look around")
        .await
        .unwrap()
        .turn_id;

    let mut seqs: Vec<u64> = Vec::new();
    let mut kinds: Vec<String> = Vec::new();
    let mut cut_at = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let item = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .expect("the turn finishes within 60 s")
            .expect("the stream goes on")
            .unwrap();
        let StreamItem::Event { seq, kind, data } = item else {
            continue;
        };
        assert_eq!(data["seq"], json!(seq));
        seqs.push(seq);
        kinds.push(kind.clone());
        if kind == "step.started" && cut_at.is_none() {
            // Mid-turn: the first step is sampling (300 ms), more events are coming.
            cut_at = Some(seq);
            p.cut.send_modify(|n| *n += 1);
        }
        if kind == "turn.finished" && data["turn_id"] == json!(turn) {
            break;
        }
    }
    assert!(cut_at.is_some(), "the turn never started a step: {kinds:?}");
    assert!(stream.reconnects() >= 1, "the cut forced a reconnect");

    // Exactly once: contiguous from 1, no repeats, and the journal's own events.
    let expected: Vec<u64> = (1..=*seqs.last().unwrap()).collect();
    assert_eq!(
        seqs, expected,
        "every durable event once, in order ({kinds:?})"
    );
    let journal = client.events(&session, 0).await.unwrap();
    let journal_kinds: Vec<String> = journal
        .iter()
        .take(seqs.len())
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, journal_kinds);
    assert!(
        journal
            .iter()
            .take(seqs.len())
            .map(|e| e["seq"].clone())
            .eq(seqs.iter().map(|s| Value::from(*s)))
    );
}
