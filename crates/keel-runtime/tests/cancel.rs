//! cancel
