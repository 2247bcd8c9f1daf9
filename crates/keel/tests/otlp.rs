//! Span export over OTLP (issue 13 item 6): the real `keel` binary, a receiver started here
//! taking `POST /v1/traces`, and the official protobuf types decoding what arrived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span};
use prost::Message as _;

use crate::common::{Env, check_stream, jsonl_lines, stderr};

const SECRET: &str = "otel-db-pass-5531";
const HEADER_SECRET: &str = "collector-token-8812";

/// One export request: its headers and body.
type Export = (axum::http::HeaderMap, Vec<u8>);

/// What the receiver got.
#[derive(Default, Clone)]
struct Received(Arc<Mutex<Vec<Export>>>);

impl Received {
    fn bodies(&self) -> Vec<Vec<u8>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }
}

/// An OTLP/HTTP receiver on a free port of 127.0.0.1 (or `addr`), answering every export with
/// an empty `ExportTraceServiceResponse`.
fn receiver(rt: &tokio::runtime::Runtime, addr: &str) -> Option<(Received, std::net::SocketAddr)> {
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).ok()?;
    let local = listener.local_addr().unwrap();
    let got = Received::default();
    let store = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let store = store.clone();
                async move {
                    store.0.lock().unwrap().push((headers, body.to_vec()));
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            },
        ),
    );
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Some((got, local))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn str_attr<'a>(s: &'a Span, key: &str) -> &'a str {
    match attr(&s.attributes, key) {
        Some(any_value::Value::StringValue(v)) => v,
        other => panic!("{} has no string {key}: {other:?}", s.name),
    }
}

fn int_attr(s: &Span, key: &str) -> i64 {
    match attr(&s.attributes, key) {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("{} has no int {key}: {other:?}", s.name),
    }
}

fn string_array(s: &Span, key: &str) -> Vec<String> {
    match attr(&s.attributes, key) {
        Some(any_value::Value::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| match &v.value {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        other => panic!("{} has no array {key}: {other:?}", s.name),
    }
}

/// An environment whose configuration marks `DB_PASSWORD` secret, and a script: a failed
/// attempt (rate limited, retried), a `shell` call that prints the secret, a final text.
fn scripted_env() -> Env {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        &format!("[env]\nDB_PASSWORD = {{ value = \"{SECRET}\", secret = true }}\n"),
    );
    let script = [
        serde_json::json!({"error": {"kind": "rate_limited", "retry_after_ms": 10}}),
        serde_json::json!({
            "tool_calls": [{"name": "shell", "arguments": {"command": format!("printf '%s' \"$DB_PASSWORD\"; echo {SECRET}")}}],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }),
        serde_json::json!({"text": format!("done {SECRET}"), "usage": {"input_tokens": 20, "output_tokens": 7, "cache_read_tokens": 3}}),
    ]
    .map(|l| l.to_string())
    .join("\n");
    env.write("script.jsonl", &script);
    env
}

fn run(env: &Env, vars: &[(&str, String)]) -> std::process::Output {
    let mut cmd = env.keel();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass"])
        .arg(format!("go {SECRET}"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_run_exports_its_turn_attempts_and_tool_calls_as_genai_spans() {
    let rt = runtime();
    let (got, addr) = receiver(&rt, "127.0.0.1:0").unwrap();
    let env = scripted_env();
    let out = run(
        &env,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                format!("x-collector-token={HEADER_SECRET}"),
            ),
        ],
    );
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&out));
    let session = result["session_id"].as_str().unwrap();
    let call_id = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished")
        .and_then(|l| l["tool_call_id"].as_str())
        .unwrap();

    // The exporter flushed before the process ended: everything is here now.
    let requests = got.0.lock().unwrap().clone();
    assert!(!requests.is_empty(), "nothing exported: {}", stderr(&out));
    for (headers, body) in &requests {
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["x-collector-token"], HEADER_SECRET);
        for secret in [SECRET, HEADER_SECRET] {
            assert!(!contains(body, secret), "{secret} in an exported span");
        }
    }
    let mut spans: Vec<Span> = Vec::new();
    for body in got.bodies() {
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for rs in req.resource_spans {
            let resource = rs.resource.unwrap();
            assert_eq!(
                attr(&resource.attributes, "service.name"),
                Some(&any_value::Value::StringValue("keel".into()))
            );
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
    }
    spans.sort_by_key(|s| s.start_time_unix_nano);
    let by_op = |op: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| str_attr(s, "gen_ai.operation.name") == op)
            .collect()
    };
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(spans.len(), 5, "{names:?}");

    // The turn: the root.
    let roots = by_op("invoke_agent");
    assert_eq!(roots.len(), 1, "{names:?}");
    let root = roots[0];
    assert!(root.parent_span_id.is_empty(), "the turn is a root span");
    assert_eq!(root.kind, span::SpanKind::Internal as i32);
    assert_eq!(str_attr(root, "gen_ai.conversation.id"), session);
    assert_eq!(str_attr(root, "keel.session.id"), session);
    assert_eq!(str_attr(root, "gen_ai.provider.name"), "keel.scripted");
    assert_eq!(str_attr(root, "keel.terminal_reason"), "completed");
    assert_eq!(int_attr(root, "gen_ai.usage.input_tokens"), 30);
    assert_eq!(int_attr(root, "gen_ai.usage.output_tokens"), 12);
    assert_eq!(int_attr(root, "keel.steps"), 2);
    assert!(str_attr(root, "keel.worker").starts_with("keel-cli@"));
    let turn = str_attr(root, "keel.turn.id");

    // One `chat` per attempt: the rate-limited one, the tool call, the answer.
    let chats = by_op("chat");
    assert_eq!(chats.len(), 3, "{names:?}");
    for c in &chats {
        assert_eq!(c.trace_id, root.trace_id);
        assert_eq!(c.parent_span_id, root.span_id);
        assert_eq!(c.kind, span::SpanKind::Client as i32);
        let model = str_attr(c, "gen_ai.request.model");
        assert!(model.starts_with("scripted:"), "{model}");
        assert_eq!(c.name, format!("chat {model}"));
        assert_eq!(str_attr(c, "gen_ai.response.model"), model);
        assert_eq!(str_attr(c, "gen_ai.conversation.id"), session);
        assert_eq!(str_attr(c, "keel.turn.id"), turn);
    }
    assert_eq!(str_attr(chats[0], "error.type"), "rate_limited");
    assert_eq!(
        chats[0].status.as_ref().map(|s| s.code),
        Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32)
    );
    assert_eq!(int_attr(chats[0], "keel.attempt"), 1);
    assert_eq!(int_attr(chats[1], "keel.attempt"), 2);
    assert_eq!(
        str_attr(chats[0], "keel.step.id"),
        str_attr(chats[1], "keel.step.id")
    );
    assert_eq!(
        string_array(chats[1], "gen_ai.response.finish_reasons"),
        ["tool_use"]
    );
    assert_eq!(int_attr(chats[1], "gen_ai.usage.input_tokens"), 10);
    assert_eq!(int_attr(chats[1], "gen_ai.usage.output_tokens"), 5);
    assert_eq!(
        string_array(chats[2], "gen_ai.response.finish_reasons"),
        ["end_turn"]
    );
    assert_eq!(int_attr(chats[2], "gen_ai.usage.input_tokens"), 20);
    assert_eq!(int_attr(chats[2], "gen_ai.usage.output_tokens"), 7);
    assert_eq!(
        int_attr(chats[2], "gen_ai.usage.cache_read.input_tokens"),
        3
    );

    // The tool call.
    let tools = by_op("execute_tool");
    assert_eq!(tools.len(), 1, "{names:?}");
    let tool = tools[0];
    assert_eq!(tool.name, "execute_tool shell");
    assert_eq!(tool.parent_span_id, root.span_id);
    assert_eq!(tool.trace_id, root.trace_id);
    assert_eq!(str_attr(tool, "gen_ai.tool.name"), "shell");
    assert_eq!(str_attr(tool, "gen_ai.tool.call.id"), call_id);
    assert_eq!(str_attr(tool, "keel.tool_call.id"), call_id);
    assert_eq!(str_attr(tool, "gen_ai.tool.type"), "function");
    assert_eq!(str_attr(tool, "keel.tool_call.status"), "succeeded");
    assert_eq!(
        str_attr(tool, "keel.step.id"),
        str_attr(chats[1], "keel.step.id")
    );
    // Children lie within the turn.
    for s in chats.iter().chain(&tools) {
        assert!(s.start_time_unix_nano >= root.start_time_unix_nano);
        assert!(s.end_time_unix_nano <= root.end_time_unix_nano);
    }
}

#[test]
fn without_otel_variables_nothing_is_exported_and_the_run_is_the_same() {
    let rt = runtime();
    let (got, addr) = receiver(&rt, "127.0.0.1:0").unwrap();
    // The OTLP/HTTP default port: an SDK left on would post here.
    let default_port = receiver(&rt, "127.0.0.1:4318");
    let results: Vec<serde_json::Value> = [
        vec![],
        // Disabled outright, whatever else is set.
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_SDK_DISABLED", "true".to_owned()),
        ],
    ]
    .iter()
    .map(|vars| {
        let env = scripted_env();
        let out = run(&env, vars);
        assert!(stderr(&out).is_empty(), "{}", stderr(&out));
        check_stream(&jsonl_lines(&out.stdout))
    })
    .collect();
    for r in &results {
        assert_eq!(r["terminal_reason"], "completed");
        assert_eq!(r["usage"], results[0]["usage"]);
        assert_eq!(r["num_steps"], 2);
    }
    assert!(got.bodies().is_empty());
    if let Some((default, _)) = default_port {
        assert!(default.bodies().is_empty());
    }
}

#[test]
fn an_unsupported_protocol_stops_keel_before_anything_runs() {
    let env = scripted_env();
    let out = run(
        &env,
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:9".to_owned(),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && err.contains("http/protobuf"),
        "{err}"
    );
    assert!(
        !env.path("data/keel/keel.db").exists(),
        "nothing was created"
    );
}

#[test]
fn the_exporter_headers_are_withheld_from_tools() {
    let env = Env::new();
    env.write(
        "script.jsonl",
        &[
            serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": "printf 'H=%s\\n' \"$OTEL_EXPORTER_OTLP_HEADERS\""}}]}).to_string(),
            serde_json::json!({"text": "ok"}).to_string(),
        ]
        .join("\n"),
    );
    let out = env
        .keel()
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization=Bearer%20{HEADER_SECRET}"),
        )
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass", "go"])
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    assert_eq!(check_stream(&lines)["terminal_reason"], "completed");
    let finished: HashMap<&str, &serde_json::Value> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .map(|l| (l["tool_call_id"].as_str().unwrap(), &l["payload"]))
        .collect();
    let output = finished.values().next().unwrap()["output"]
        .as_str()
        .unwrap();
    assert!(output.starts_with("H=\n"), "{output}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(HEADER_SECRET));
}

/// Spans from a `keel worker` process (where turns run in a deployment), with the batch
/// exporter's delay set to ten minutes (`OTEL_BSP_SCHEDULE_DELAY`) so that only a flush can
/// send them: an API-only node and the worker share a PostgreSQL schema, the worker runs a
/// turn (a `shell` call, then an answer), and nothing has been exported when the turn has
/// ended. SIGTERM drains the worker: it exits 0, and by then the receiver holds the turn's
/// `invoke_agent` root (the session as `gen_ai.conversation.id`, the worker's lease owner as
/// `keel.worker`), a `chat` span per attempt and the `execute_tool` span, children of the root.
#[test]
fn a_worker_exports_the_turns_it_runs_and_flushes_them_when_drained() {
    use crate::workers::{Cluster, shell, wait};

    let rt = runtime();
    let (got, addr) = receiver(&rt, "127.0.0.1:0").unwrap();
    let c = Cluster::postgres();
    let mut worker = c.worker_with_env(
        &["--concurrency", "2"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000".to_owned()),
        ],
    );
    let session = c.start_turn(
        "traced",
        &[
            shell("echo traced >> otlp.txt"),
            serde_json::json!({"text": "done", "usage": {"input_tokens": 20, "output_tokens": 7}}),
        ],
    );
    c.completed_turn(&session);
    // Ended spans wait in the batch queue: nothing has left the process yet.
    assert!(got.bodies().is_empty(), "exported before the flush");

    worker.run.signal("TERM");
    let code = wait(60, "the worker exits after SIGTERM", || {
        worker.run.child.try_wait().unwrap().map(|s| s.code())
    });
    assert_eq!(code, Some(0), "{:#?}", worker.run.stderr_lines());
    let mut spans: Vec<Span> = Vec::new();
    for body in got.bodies() {
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
    }
    spans.sort_by_key(|s| s.start_time_unix_nano);
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let by_op = |op: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| str_attr(s, "gen_ai.operation.name") == op)
            .collect()
    };
    let roots = by_op("invoke_agent");
    assert_eq!(roots.len(), 1, "{names:?}");
    let root = roots[0];
    assert!(root.parent_span_id.is_empty(), "the turn is a root span");
    assert_eq!(str_attr(root, "gen_ai.conversation.id"), session);
    assert_eq!(str_attr(root, "keel.terminal_reason"), "completed");
    let owner = str_attr(root, "keel.worker");
    assert!(worker.owns(owner), "{owner}");
    let chats = by_op("chat");
    assert_eq!(chats.len(), 2, "{names:?}");
    let tools = by_op("execute_tool");
    assert_eq!(tools.len(), 1, "{names:?}");
    assert_eq!(tools[0].name, "execute_tool shell");
    assert_eq!(str_attr(tools[0], "keel.tool_call.status"), "succeeded");
    for s in chats.iter().chain(&tools) {
        assert_eq!(s.trace_id, root.trace_id);
        assert_eq!(s.parent_span_id, root.span_id);
        assert_eq!(str_attr(s, "gen_ai.conversation.id"), session);
    }
    assert_eq!(int_attr(chats[1], "gen_ai.usage.output_tokens"), 7);
    assert_eq!(spans.len(), 4, "{names:?}");
}
