//! keel-model (work in progress).
