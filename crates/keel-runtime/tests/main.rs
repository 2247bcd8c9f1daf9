//! keel-runtime integration tests: one binary, one module per behaviour area. Tests that talk
//! to PostgreSQL use a fresh schema of `KEEL_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

mod attacks;
mod budgets;
mod cancel;
mod close;
mod commits;
mod compaction;
mod config_changes;
mod context;
mod effects;
mod expiry;
mod intents;
mod reasoning;
mod recovery;
mod releases;
mod sealed;
mod streaming;
mod subscribe;
mod timeouts;
mod tools;
mod transcript;
mod turn_loop;
