//! Integration tests of keel-core: the fold over whole journals, and property tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fold;
mod plan;
mod props;
