//! Provider-level behaviour over the fake model server: read-only calls start while the model is
//! still streaming, and every request a turn sends is valid for every wire (every tool call has
//! exactly one result).

use std::sync::Arc;

use keel_core::{Budget, TerminalReason};
use keel_model::{HttpModel, ProviderConfig, Script, Wire};
use keel_testkit::{FakeModelServer, Pacing};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(a_read_only_call_starts_before_the_model_stream_ends);

/// The second call's label: long enough that its arguments stream for a second or more.
const LONG_LABEL: &str = "after the read, with a label long enough that the model's stream goes on \
     for a good while once the first call's arguments are complete, so that the read-only call \
     is seen to start before the stream ends even when the machine is busy";

fn script(lines: &[Value]) -> Script {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    Script::parse("fake.jsonl", &text.join("\n")).unwrap()
}

fn model(server: &FakeModelServer, wire: Wire) -> Arc<HttpModel> {
    Arc::new(
        HttpModel::new(
            wire,
            ProviderConfig::new("fake-model")
                .with_base_url(server.base_url(wire))
                .with_api_key("k"),
        )
        .unwrap(),
    )
}

async fn a_read_only_call_starts_before_the_model_stream_ends(b: Backend) {
    let lines = [
        json!({"text": "let me look", "tool_calls": [call("read_file", json!({"path": "README.md"})), call("counter", json!({"label": LONG_LABEL}))]}),
        json!({"text": "done"}),
    ];
    // Slow frames: the stream of the first response takes a while after the first call's
    // arguments are complete (the second call's long arguments: the read-only call has room to
    // start first on a loaded machine; with a five-letter label it once did not, in CI).
    let server = FakeModelServer::start_scripted(
        script(&lines),
        Pacing {
            time_to_first_token_ms: 0,
            tokens_per_second: Some(40.0),
        },
    )
    .await
    .unwrap();
    let f = fixture_with(
        b,
        model(&server, Wire::Anthropic),
        &[],
        Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "read and count")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::Completed,
        "{out:?}"
    );
    let evs = f.events().await;
    let seq = |ty: &str, name: Option<&str>| {
        evs.iter()
            .find(|e| {
                e.type_name() == ty
                    && name.is_none_or(|n| {
                        let id = e.correlation.tool_call_id.as_ref();
                        evs.iter().any(|p| p.type_name() == "tool_call.proposed" && p.correlation.tool_call_id.as_ref() == id && matches!(&p.body, keel_core::EventBody::ToolCallProposed { name: pn, .. } if pn == n))
                    })
            })
            .map(|e| e.seq)
            .unwrap()
    };
    let first_completed = seq("step.completed", None);
    // The read-only call started (and finished) while the step was still streaming…
    assert!(seq("tool_call.started", Some("read_file")) < first_completed);
    // …the side-effecting one waited for the end of the stream.
    assert!(seq("tool_call.started", Some("counter")) > first_completed);
    assert_eq!(f.counter_lines().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_wire_accepts_every_request_of_a_scripted_turn() {
    for wire in Wire::ALL {
        let lines = [
            json!({"tool_calls": [call("read_file", json!({"path": "README.md"})), call("teleport", json!({})), call("counter", json!({"label": "denied"}))]}),
            json!({"tool_calls": [call("read_file", json!({"path": "missing.txt"})), call("counter", json!({"label": "ok"}))]}),
            json!({"text": "finished"}),
        ];
        let server = FakeModelServer::start_scripted(script(&lines), Pacing::default())
            .await
            .unwrap();
        let f = fixture_with(
            Backend::Sqlite,
            model(&server, wire),
            &[],
            Budget::default(),
            |c| {
                c.permission_mode = PermissionMode::Bypass;
                c.deny = vec!["counter(*denied*)".into()];
            },
        )
        .await;
        f.rt.submit(f.tenant, f.session, "go").await.unwrap();
        let out = f.rt.run(f.tenant, f.session).await.unwrap();
        assert_eq!(
            out.turns[0].terminal_reason,
            TerminalReason::Completed,
            "{wire}: {out:?}"
        );
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3, "{wire}");
        for r in &reqs {
            assert!(
                r.unanswered_tool_calls().is_empty(),
                "{wire}: {:?}",
                r.unanswered_tool_calls()
            );
        }
    }
}
