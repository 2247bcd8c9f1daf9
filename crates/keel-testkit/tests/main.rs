//! Integration tests of keel-testkit's fake model server at the HTTP level (the normalized
//! results of every fault are asserted in keel-model's tests).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

mod encode;
mod server;
