//! # keel-fuzz — what each fuzz target does with its bytes
//!
//! **Owns:** one entry function per fuzz target ([`TARGETS`]), each taking arbitrary bytes and
//! panicking only when an invariant of the code under test is broken (a panic inside that code is
//! a finding too). The cargo-fuzz crate in `fuzz/` (outside the workspace, run by `fuzz/run.sh`)
//! calls these, and this crate's test replays every committed corpus file and crash reproducer
//! (`fuzz/corpus/<target>/*`, `fuzz/regressions/<target>/*`) through the same functions, so
//! `cargo test` covers them without cargo-fuzz. Figures and findings: docs/RELIABILITY.md.
//!
//! **Must not touch:** anything with I/O beyond an in-memory tokio runtime: no store, no network,
//! no files, no processes. (`api_body_schema` links keel-server for its body checks, which are
//! pure functions; it opens nothing.)
//!
//! ## Layout
//! - `sse` — [`sse`]: the three wires' SSE parsers through the adapters' own pump.
//! - `tools` — [`tool_arguments`], [`policy_rule`], [`shell_analysis`].
//! - `journal` — [`event_fold`]: event envelope decoding and the session fold.
//! - `api` — [`api_request`]: the `/v1` request bodies.
//! - `schema` — [`api_body_schema`]: the same bodies through the server's schema check, and the
//!   inspector's sign-in body.

mod api;
mod journal;
mod schema;
mod sse;
mod tools;

pub use api::api_request;
pub use journal::event_fold;
pub use schema::api_body_schema;
pub use sse::sse;
pub use tools::{policy_rule, shell_analysis, tool_arguments};

/// A fuzz target: its name (the `fuzz/fuzz_targets/<name>.rs` file, the `fuzz/corpus/<name>/`
/// folder) and its entry function.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target.
pub const TARGETS: [Target; 9] = [
    ("sse_openai_chat", |d| sse(keel_model::Wire::OpenaiChat, d)),
    ("sse_openai_responses", |d| {
        sse(keel_model::Wire::OpenaiResponses, d)
    }),
    ("sse_anthropic", |d| sse(keel_model::Wire::Anthropic, d)),
    ("tool_arguments", tool_arguments),
    ("policy_rule", policy_rule),
    ("shell_analysis", shell_analysis),
    ("event_fold", event_fold),
    ("api_request", api_request),
    ("api_body_schema", api_body_schema),
];

/// Splits `data` at its first newline: (the first line, the rest), both as text (invalid
/// UTF-8 replaced).
pub(crate) fn first_line(data: &[u8]) -> (String, String) {
    let text = String::from_utf8_lossy(data);
    match text.split_once('\n') {
        Some((head, rest)) => (head.to_owned(), rest.to_owned()),
        None => (text.into_owned(), String::new()),
    }
}
