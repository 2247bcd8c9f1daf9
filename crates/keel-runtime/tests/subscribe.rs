//! subscribe
