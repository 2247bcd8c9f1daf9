//! keel-server integration tests: a started server over real HTTP, on SQLite and on PostgreSQL
//! (a fresh schema of `KEEL_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

mod authz;

mod e2e;
mod inspector;
mod inspector_browser;
mod memory_checks;
mod metrics;
mod openapi;
mod scheduling;
mod secrets;
mod semantics;
mod sse;
mod subagents;
mod transport;
mod withdrawn;
