//! What encoding one request's body costs, per wire (docs/BENCHMARKS.md, issue 16's HTTP row):
//! the bytes `HttpModel::stream` sends for a step deep in a session — a system prompt, eight
//! tools with schemas the size of keel's built-ins, and `KEEL_BENCH_MESSAGES` transcript
//! messages (default 200: 100 `shell` calls and their results). The calls hold no raw argument
//! text, as the runtime's transcript keeps them (the model's text is not journaled: it may hold
//! a secret the journaled arguments redact), so the OpenAI wires serialize each call's
//! arguments; `KEEL_BENCH_RAW=1` gives every call its raw text. Two figures per wire, each the
//! median and p90 in µs over `KEEL_BENCH_RUNS` rounds (default 2,000), with the body's size:
//! `whole`, a transcript the model has not seen (its first request in a process, or a session
//! past the ones it keeps), then `step`, the same transcript with the next call and its result
//! added, as each step of a session sends (the model reuses what it encoded for the one
//! before). Exits 0.
//!
//! `cargo bench -p keel-model --bench request_body`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use keel_model::{HttpModel, Message, ModelRequest, ProviderConfig, ToolCall, ToolSchema, Wire};
use serde_json::json;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A tool schema of ~1.5 KB, as keel's built-ins are.
fn tool(i: usize) -> ToolSchema {
    let mut properties = serde_json::Map::new();
    for p in 0..6 {
        properties.insert(
            format!("param_{p}"),
            json!({"type": if p % 2 == 0 { "string" } else { "integer" },
                   "description": format!("Parameter {p} of tool {i}: what it means, its unit and its default, in a sentence or two as the built-ins describe theirs."),
                   "minimum": 0}),
        );
    }
    ToolSchema {
        name: format!("tool_{i}"),
        description: format!("Tool {i}. ").repeat(30),
        parameters: json!({"type": "object", "properties": properties,
                           "required": ["param_0"], "additionalProperties": false}),
    }
}

fn request(messages: usize, raw: bool) -> ModelRequest {
    let mut transcript = vec![Arc::new(Message::User {
        content: "run the steps".into(),
    })];
    for k in 0..messages / 2 {
        let id = format!("call_{k:024}");
        let arguments = json!({"command": format!("echo step {k}")});
        transcript.push(Arc::new(Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: "shell".into(),
                raw_arguments: raw.then(|| arguments.to_string()),
                arguments,
            }],
            reasoning: Vec::new(),
        }));
        transcript.push(Arc::new(Message::Tool {
            call_id: id,
            content: format!("step {k}\n[exit code 0]"),
            is_error: false,
        }));
    }
    ModelRequest {
        instructions: Some("You are a coding agent. ".repeat(80)),
        messages: transcript,
        tools: (0..8).map(tool).collect::<Vec<_>>().into(),
        ..ModelRequest::default()
    }
}

/// The median and p90 of `times` (µs), sorted in place.
fn summary(times: &mut [f64]) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() * 9 / 10])
}

fn main() {
    let runs = env("KEEL_BENCH_RUNS", 2_000);
    let messages = env("KEEL_BENCH_MESSAGES", 200);
    let full = request(messages + 2, env("KEEL_BENCH_RAW", 0) == 1);
    // The first `n` messages (after the user's), new to any model: fresh `Arc`s.
    let unseen = |n: usize| -> Vec<Arc<Message>> {
        full.messages[..=n]
            .iter()
            .map(|m| Arc::new((**m).clone()))
            .collect()
    };
    for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
        let model = HttpModel::new(wire, ProviderConfig::new("gpt-4o").with_api_key("bench"))
            .expect("model");
        let (mut whole, mut step) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
        let mut sizes = (0, 0);
        for _ in 0..runs {
            // `whole`: a transcript the model has not seen; `step`: the same with the next
            // call and its result added.
            let mut request = ModelRequest {
                messages: unseen(messages + 2),
                ..full.clone()
            };
            let added = request.messages.split_off(messages + 1);
            let start = Instant::now();
            let body = model.encode_body(&request).expect("encodes");
            whole.push(start.elapsed().as_secs_f64() * 1e6);
            sizes.0 = body.len();
            std::hint::black_box(body);
            request.messages.extend(added);
            let start = Instant::now();
            let body = model.encode_body(&request).expect("encodes");
            step.push(start.elapsed().as_secs_f64() * 1e6);
            sizes.1 = body.len();
            std::hint::black_box(body);
        }
        for (name, times, size, n) in [
            ("whole", &mut whole, sizes.0, messages + 1),
            ("step", &mut step, sizes.1, messages + 3),
        ] {
            let (median, p90) = summary(times);
            println!(
                "{wire:?} {name}: body {size} bytes, {n} messages: median {median:.1} µs, p90 {p90:.1} µs ({runs} runs)"
            );
        }
    }
}
