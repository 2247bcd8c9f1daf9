//! keel-client against a started `keel serve` over real HTTP (the server's own test harness):
//! typed errors with their problem bodies, pagination, and the event stream's reconnect.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../../keel-server/tests/common.rs"]
mod common;

mod client;
mod input;
mod reconnect;
mod typed;
