//! Integration tests of keel-model: recorded streams, the fake server's faults, retries and
//! fallback, cancellation, request shapes, the scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

mod fixtures;
