//! Integration tests of keel-tools: one binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test helpers outside #[test] fns.

mod approvals;
mod budget;
mod common;
mod confinement;
mod escapes;
mod file_tools;
mod isolation;
mod model_view;
mod own_files;
mod replay;
mod sandbox;
mod search_tools;
mod session_root;
mod shell;
mod shell_policy;
mod special_files;
mod store_artifacts;
mod symlink_races;
mod validation;
