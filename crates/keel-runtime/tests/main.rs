//! keel-runtime integration tests: one binary, one module per behaviour area. Tests that talk
//! to PostgreSQL use a fresh schema of `KEEL_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

mod accounting;
mod attacks;
mod budgets;
mod cancel;
mod close;
mod commits;
mod compaction;
mod config_changes;
mod context;
mod drain;
mod effects;
mod expiry;
mod hooks;
mod hung_probes;
mod input;
mod intents;
mod lease_fence;
mod leases;
mod long_term_memory;
mod memory;
mod metrics;
mod principals;
mod priority;
mod reasoning;
mod recovery;
mod releases;
mod scheduler;
mod sealed;
mod secrets;
mod streaming;
mod subagents;
mod subscribe;
mod timeouts;
mod token_rate;
mod tools;
mod transcript;
mod turn_loop;
mod work_marks;
