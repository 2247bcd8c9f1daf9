//! keel-mcp's integration tests: real MCP servers over the wire (installed by `.ci/run` and the
//! README) and the crate's own test server for what they cannot show on demand.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test helpers outside #[test] fns.

mod common;
mod real_servers;
mod runtime;
mod test_server;
