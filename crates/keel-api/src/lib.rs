//! # keel-api — the wire types of Keel's HTTP API (`/v1`)
//!
//! **Owns:** every request body, response body, query and enum that crosses the wire between
//! `keel serve` (keel-server) and its clients (keel-client, the `keel --server` CLI), and the
//! RFC 9457 [`Problem`] error body. Request bodies (`*Request`) are `deny_unknown_fields`, so the
//! OpenAPI document says `additionalProperties: false`; response bodies accept unknown fields when
//! read, so a client keeps working when the server adds one. JSON is snake_case; ids are the
//! kernel's (UUIDs; releases `sha256:<hex>`); times are RFC 3339 UTC; money is USD.
//!
//! **Must not touch:** HTTP (no axum, no reqwest), the kernel's types (conversions to and from
//! them live in keel-server, which owns that mapping). Only serde and utoipa derives, so the
//! server's OpenAPI document is generated from exactly these types.
//!
//! ## Layout
//! - [`body`] — decoding a request body as the server does.
//! - [`common`] — enums a client sends (statuses, permission mode, sandbox, multitask, role),
//!   budgets, token usage, [`Problem`].
//! - [`admin`] — tenants and keys; [`releases`] — agent definitions;
//!   [`sessions`] — sessions, settings, turns, events, folded state;
//!   [`decisions`] — approvals and effects; [`resources`] — artifacts, usage, memory, health.
//!
//! Everything is re-exported at the crate root.

pub mod admin;
pub mod body;
pub mod common;
pub mod decisions;
pub mod releases;
pub mod resources;
pub mod sessions;

pub use admin::*;
pub use common::*;
pub use decisions::*;
pub use releases::*;
pub use resources::*;
pub use sessions::*;
