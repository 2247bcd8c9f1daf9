//! Artifacts, usage, memory, and the health probes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::UsageBody;

// --- artifacts, usage, memory ---------------------------------------------------------------

/// An artifact without its bytes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactInfoBody {
    /// Its id (what `artifact://<id>` names).
    pub artifact_id: String,
    /// Its session.
    pub session_id: String,
    /// A name for people.
    pub name: String,
    /// MIME type.
    pub content_type: String,
    /// Size, bytes.
    pub size: u64,
    /// Creation time.
    pub created_at: DateTime<Utc>,
}

/// A page of artifacts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactPage {
    /// Artifacts, oldest first.
    pub items: Vec<ArtifactInfoBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/artifacts/{artifact_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ArtifactQuery {
    /// First byte (default 0).
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    pub offset: Option<u64>,
    /// Most bytes (default and at most 262144).
    #[param(minimum = 1, maximum = 262_144)]
    pub limit: Option<u64>,
}

/// A byte range of an artifact, as text.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactChunkBody {
    /// The artifact.
    pub artifact_id: String,
    /// Its name.
    pub name: String,
    /// MIME type.
    pub content_type: String,
    /// Total size, bytes.
    pub size: u64,
    /// First byte of this chunk.
    pub offset: u64,
    /// The chunk as UTF-8 text (a chunk ends on a character boundary; invalid bytes are
    /// replaced by U+FFFD).
    pub text: String,
    /// Where the next chunk starts; `null` at the end.
    pub next_offset: Option<u64>,
}

/// Query of `GET /v1/usage`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First UTC day, `YYYY-MM-DD` (default: 30 days ago).
    #[param(format = Date)]
    pub from: Option<String>,
    /// Last UTC day, `YYYY-MM-DD` (default: today).
    #[param(format = Date)]
    pub to: Option<String>,
}

/// One day and model of a tenant's usage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageRowBody {
    /// UTC day.
    pub day: String,
    /// Model.
    pub model: String,
    /// Tokens.
    pub usage: UsageBody,
    /// Cost, USD.
    pub cost_usd: f64,
    /// Model steps.
    pub steps: u64,
}

/// A tenant's usage over days.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// First day.
    pub from: String,
    /// Last day.
    pub to: String,
    /// By day, then model.
    pub rows: Vec<UsageRowBody>,
    /// Total cost, USD.
    pub total_cost_usd: f64,
    /// Total input plus output tokens.
    pub total_tokens: u64,
}

/// `PUT /v1/memory/{namespace}/{key}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutMemoryRequest {
    /// Any JSON value.
    pub value: Value,
}

/// A memory entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemoryBody {
    /// Namespace.
    pub namespace: String,
    /// Key.
    pub key: String,
    /// Value.
    pub value: Value,
    /// Last write.
    pub updated_at: DateTime<Utc>,
}

/// A page of memory entries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemoryPage {
    /// Entries: by key, or best match first for a search.
    pub items: Vec<MemoryBody>,
    /// Pass as `cursor` for the next page; `null` on the last page (and for searches).
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/memory/{namespace}`.
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MemoryListQuery {
    /// Full-text search instead of listing: entries whose key or value has every word of this
    /// text (case-insensitive, a word or the start of one), best match first.
    pub q: Option<String>,
    /// From a previous page's `next_cursor` (lists only).
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

// --- health ---------------------------------------------------------------------------------

/// `/healthz` and `/readyz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthBody {
    /// `ok`.
    pub status: String,
    /// What was checked (`process`, or `store` for readiness).
    pub checked: String,
}
