//! keel-store integration tests: the conformance suite, run once per backend
//! (`conformance::sqlite::…`, `conformance::postgres::…`), and crash tests with `kill -9`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;
mod conformance;
