//! Tenants and API keys (`/v1/tenants`, `/v1/keys`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::RoleParam;

// --- tenants and keys -----------------------------------------------------------------------

/// `POST /v1/tenants`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantRequest {
    /// A unique name, 1 to 200 bytes, without control or format characters (422 otherwise).
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
}

/// A tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantBody {
    /// Its id.
    #[schema(format = Uuid)]
    pub tenant_id: String,
    /// Its name.
    pub name: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// A page of tenants.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantPage {
    /// The tenants, oldest first.
    pub items: Vec<TenantBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/keys`, `POST /v1/tenants/{tenant_id}/keys`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// The new principal's name (a person or a program), 1 to 200 bytes, without control or
    /// format characters (escapes, bidi controls, zero-width characters; 422 otherwise).
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Its role.
    pub role: RoleParam,
    /// When the key stops working; absent: never.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// A stored key (never the key itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyBody {
    /// Its id.
    #[schema(format = Uuid)]
    pub key_id: String,
    /// Its principal (what the journal records as the actor).
    #[schema(format = Uuid)]
    pub principal_id: String,
    /// The principal's name.
    pub name: String,
    /// The tenant; `null` for a system key.
    pub tenant_id: Option<String>,
    /// `system`, `admin`, `operator` or `viewer`.
    #[schema(example = "operator")]
    pub role: String,
    /// The key's first characters, to tell keys apart.
    pub prefix: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A key just created: the only time the key text is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedKeyBody {
    /// The bearer token (`keel_…`): shown once, stored only as a hash.
    pub key: String,
    /// The stored key.
    #[serde(flatten)]
    pub record: KeyBody,
}

/// A page of keys.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyPage {
    /// The keys, oldest first.
    pub items: Vec<KeyBody>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}
