//! keel-tools (work in progress).
