//! Integration tests of the `keel` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

mod close;
mod common;
mod config_show;
mod crash_injection;
mod decisions;
mod disk_full;
mod error_lines;
mod errors;
mod example;
mod headless;
mod interactive;
mod model_parse;
mod postgres;
mod realworld;
mod resume_changes;
mod secret_attacks;
mod secrets;
mod terminal_escapes;
mod timeouts;
mod untrusted_config;
