//! streaming
