//! keel-testkit (work in progress).
