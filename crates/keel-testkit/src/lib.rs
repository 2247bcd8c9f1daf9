//! keel-testkit: test doubles for Keel, starting with a fake model server.
//!
//! **Owns:** [`FakeModelServer`], a real HTTP/1.1 server on 127.0.0.1 speaking the OpenAI Chat
//! Completions (`/v1/chat/completions`), OpenAI Responses (`/v1/responses`) and Anthropic Messages
//! (`/v1/messages`) wire protocols with SSE streaming; driven by a [`keel_model::Script`] (the
//! scripted format of docs/ARCHITECTURE.md) or a [`Handler`]; with [`Pacing`] (time to first
//! token, tokens per second) and [`Fault`]s (HTTP 429 with retry-after, 500, 529, mid-stream
//! disconnect, malformed chunk, in-stream error event). It records every request
//! ([`RecordedRequest`]) so tests can assert on what was sent, and counts streamed responses
//! the client abandoned by closing the connection ([`FakeModelServer::abandoned_responses`]),
//! so tests can prove that cancellation closes it. It doubles as the model of load benchmarks:
//! unpaced responses go out in one write on a `TCP_NODELAY` socket. And [`db::TestDb`]: a fresh
//! store on either backend (SQLite in a temporary directory, a fresh PostgreSQL schema of
//! `KEEL_TEST_DATABASE_URL`), for tests of more than one crate.
//!
//! **Must not touch:** anything outside tests and benchmarks; it binds loopback only.
//!
//! **Layout:** `db` — test stores on both backends; `server` — the server, faults, recorded
//! requests; `encode` — a [`FakeResponse`]
//! (reasoning, text, tool calls, usage) as each wire's SSE frames, reasoning items included
//! where the wire has them (Anthropic thinking with signature, Responses encrypted reasoning).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use keel_testkit::{FakeModelServer, FakeResponse, Pacing, Reply};
//! let server = FakeModelServer::start_fixed(Reply::Respond(FakeResponse::text("hi")), Pacing::default()).await?;
//! let base = server.openai_base_url(); // give it to keel_model::ProviderConfig::with_base_url
//! # Ok(()) }
//! ```

pub mod db;
mod encode;
mod server;

pub use encode::{FakeResponse, FakeToolCall, encode, stream_error_frame};
pub use server::{FakeModelServer, Fault, Handler, Pacing, RecordedRequest, Reply, reply_for};
