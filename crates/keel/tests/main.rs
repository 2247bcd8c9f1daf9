//! Integration tests of the `keel` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

mod acp;
mod acp_approvals;
mod acp_attacks;
mod acp_config;
mod acp_edges;
mod acp_wire;
mod cancel;
mod close;
mod common;
mod config_files;
mod config_show;
mod crash_injection;
mod decisions;
mod disk_full;
mod error_lines;
mod errors;
mod example;
mod headless;
mod home_workspace;
mod input;
mod interactive;
mod mcp;
mod memory;
mod model_parse;
mod newuser;
mod otlp;
mod postgres;
mod realworld;
mod release_validation;
mod remote;
mod repo_files;
mod resume_changes;
mod secret_attacks;
mod secrets;
mod serve;
mod session_secrets;
mod shell_sandbox;
mod shutdown;
mod sse;
mod subagents;
mod terminal_escapes;
mod timeouts;
mod untrusted_config;
mod workers;
