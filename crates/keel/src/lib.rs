//! # keel (the CLI) — a coding agent in the terminal and headless, on the durable runtime
//!
//! **Owns:** the command line (`keel run|resume|acp|sessions|approve|deny|resolve|cancel|memory|config|trust|model`),
//! configuration files (`keel.toml`) and their merging with flags, secret masking for display,
//! model specs → model routes, the headless JSONL stream and its `result` line, the interactive
//! terminal, exit codes, and turning errors into one line a person can act on.
//!
//! **Must not touch:** session semantics (the turn loop, recovery, budgets and policy are
//! `keel-runtime`'s and `keel-tools`'), SQL (only through `keel_store::Store`), provider wire
//! formats (`keel-model`). The binary (`main.rs`) only parses arguments and calls [`cli::run`].
//!
//! ## Layout
//! - [`cli`] — the clap command tree and the dispatch of each command. Start reading here.
//! - [`config`] — `keel.toml` layers, [`config::Config`], [`config::mask_secrets`].
//! - [`trust`] — `trusted_workspaces` and `keel trust`.
//! - [`model_spec`] — `openai:M`, `anthropic:M`, `script:PATH` → `keel_model::ModelRoute`.
//! - [`exit`] — exit codes, one per terminal reason.
//! - [`store`] — opening the store with actionable errors; the local tenant.
//! - [`sessions`] — `sessions list|show|events`.
//! - [`decide`] — `approve` / `deny`.
//! - [`memory_cmd`] — `memory list|get|rm`: what agents remember (local store or `--server`).
//! - [`run`] — `run` / `resume` on `keel_runtime::Runtime`: release and session settings from
//!   the configuration, driving, Ctrl-C, the result.
//! - [`session_cmd`] — the `run`, `resume`, `cancel`, `resolve` commands; JSONL, text or
//!   interactive mode.
//! - [`interactive`] — prompts, follow-ups, approval and effect questions on a terminal.
//! - [`output`] — the JSONL stream and its `result` line; text and the live terminal view.
//! - [`report`] — failure messages that say what to do.
//! - [`remote`] — `--server URL`: the session commands against a remote `keel serve`
//!   through `keel-client`.
//! - [`acp`] — `keel acp`: the Agent Client Protocol over stdio for editors, on the same
//!   runtime, input pipeline, event stream and durable approvals as `run`.
//! - [`serve`] — `serve` (the HTTP API of `keel-server`), `tenants`, `keys`.
//! - [`signals`] — Ctrl-C and SIGTERM as one queue for the process.
//! - [`logging`] — the `tracing` subscriber: stderr, `KEEL_LOG`/`RUST_LOG`, `--log-format`,
//!   redacted lines; [`telemetry`] — the runtime's spans exported over OTLP (http/protobuf)
//!   when the `OTEL_EXPORTER_OTLP_*` variables ask for it.

pub mod acp;
pub mod cli;
pub mod config;
pub mod decide;
pub mod exit;
pub mod input;
pub mod interactive;
pub mod logging;
pub mod mcp;
pub mod memory_cmd;
pub mod model_spec;
pub mod output;
pub mod remote;
pub mod report;
pub mod run;
pub mod serve;
pub mod session_cmd;
pub mod sessions;
pub mod signals;
pub mod store;
pub mod telemetry;
pub mod trust;
