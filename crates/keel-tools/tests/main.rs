//! Integration tests of keel-tools: one binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test helpers outside #[test] fns.

mod approvals;
mod budget;
mod common;
mod confinement;
mod file_tools;
mod model_view;
mod replay;
mod sandbox;
mod search_tools;
mod shell;
mod store_artifacts;
mod validation;
