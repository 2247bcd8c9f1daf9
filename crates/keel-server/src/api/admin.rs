//! Tenants (system keys) and API keys (a tenant's admins; system keys give a tenant its first).

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_core::TenantId;
use keel_store::{KeyScope, Role};

use super::{P, Q, next_cursor, page_limit};
use crate::auth::{Caller, KeySpec, create_key as mint_key};
use crate::error::{ApiError, Problem};
use crate::http::JsonBody;
use crate::state::Shared;
use crate::types::{
    CreateKeyRequest, CreateTenantRequest, CreatedKeyBody, Kernel, KeyBody, KeyPage, PageQuery,
    TenantBody, TenantPage, TenantPageQuery, key_body,
};

fn tenant_body(t: keel_store::TenantRecord) -> TenantBody {
    TenantBody {
        tenant_id: t.tenant_id.to_string(),
        name: t.name,
        created_at: t.created_at,
    }
}

fn tenant_id(text: &str) -> Result<TenantId, ApiError> {
    text.parse()
        .map_err(|_| ApiError::not_found("tenant", text))
}

/// Creates a tenant.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", operation_id = "create_tenant",
    request_body = CreateTenantRequest,
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    responses(
        (status = 201, description = "Created", body = TenantBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a system key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Name in use, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_tenant(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateTenantRequest>,
) -> Result<Response, ApiError> {
    caller.system()?;
    if let Some(problem) = keel_core::text::name_problem(&body.name) {
        return Err(ApiError::invalid("name", problem));
    }
    let t = state.store.create_tenant(&body.name).await?;
    Ok((StatusCode::CREATED, Json(tenant_body(t))).into_response())
}

/// Lists tenants.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", operation_id = "list_tenants",
    params(TenantPageQuery),
    responses(
        (status = 200, description = "A page", body = TenantPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_tenants(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<TenantPageQuery>,
) -> Result<Json<TenantPage>, ApiError> {
    caller.system()?;
    let limit = page_limit(q.limit)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<TenantId>()
                .map_err(|_| ApiError::bad_request("cursor", "not a cursor of this list"))
        })
        .transpose()?;
    let items: Vec<TenantBody> = state
        .store
        .list_tenants(after, limit)
        .await?
        .into_iter()
        .map(tenant_body)
        .collect();
    Ok(Json(TenantPage {
        next_cursor: next_cursor(&items, limit, |t| t.tenant_id.clone()),
        items,
    }))
}

/// Reads a tenant.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}", tag = "tenants", operation_id = "get_tenant",
    params(("tenant_id" = String, Path, description = "The tenant")),
    responses(
        (status = 200, description = "The tenant", body = TenantBody),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tenant", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_tenant(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> Result<Json<TenantBody>, ApiError> {
    caller.system()?;
    let t = state.store.get_tenant(tenant_id(&id)?).await?;
    Ok(Json(tenant_body(t)))
}

fn key_spec(tenant: TenantId, body: &CreateKeyRequest) -> Result<KeySpec, ApiError> {
    if let Some(problem) = keel_core::text::name_problem(&body.name) {
        return Err(ApiError::invalid("name", problem));
    }
    if body.expires_at.is_some_and(|e| e <= chrono::Utc::now()) {
        return Err(ApiError::invalid("expires_at", "expires_at is in the past"));
    }
    Ok(KeySpec {
        tenant: Some(tenant),
        name: body.name.clone(),
        role: Kernel::kernel(body.role),
        expires_at: body.expires_at,
    })
}

async fn created_key(state: &Shared, spec: KeySpec) -> Result<Response, ApiError> {
    let (key, record) = mint_key(state.store.as_ref(), &spec).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKeyBody {
            key,
            record: key_body(record),
        }),
    )
        .into_response())
}

/// Creates a key of a tenant (its first admin, typically).
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/keys", tag = "tenants", operation_id = "create_tenant_key",
    params(("tenant_id" = String, Path, description = "The tenant"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "Created; the key is shown only now", body = CreatedKeyBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_tenant_key(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    JsonBody(body): JsonBody<CreateKeyRequest>,
) -> Result<Response, ApiError> {
    caller.system()?;
    let tenant = tenant_id(&id)?;
    state.store.get_tenant(tenant).await?;
    created_key(&state, key_spec(tenant, &body)?).await
}

/// Creates a key in the caller's tenant.
#[utoipa::path(post, path = "/v1/keys", tag = "keys", operation_id = "create_key",
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "Created; the key is shown only now", body = CreatedKeyBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_key(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateKeyRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Admin)?;
    created_key(&state, key_spec(tenant, &body)?).await
}

/// Lists the caller's tenant's keys.
#[utoipa::path(get, path = "/v1/keys", tag = "keys", operation_id = "list_keys",
    params(PageQuery),
    responses(
        (status = 200, description = "A page", body = KeyPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_keys(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<PageQuery>,
) -> Result<Json<KeyPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Admin)?;
    let limit = page_limit(q.limit)?;
    let items: Vec<KeyBody> = state
        .store
        .list_api_keys(KeyScope::Tenant(tenant), q.cursor.as_deref(), limit)
        .await?
        .into_iter()
        .map(key_body)
        .collect();
    Ok(Json(KeyPage {
        next_cursor: next_cursor(&items, limit, |k| k.key_id.clone()),
        items,
    }))
}

/// Revokes a key of the caller's tenant (for good; revoking twice is fine).
#[utoipa::path(post, path = "/v1/keys/{key_id}/revoke", tag = "keys", operation_id = "revoke_key",
    params(("key_id" = String, Path, description = "The key"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    responses(
        (status = 200, description = "Revoked", body = KeyBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The key making the request (revoke it with another admin key or `keel keys revoke`), or the same Idempotency-Key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn revoke_key(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> Result<Json<KeyBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Admin)?;
    // A key revoking itself would lock its holder out mid-request (and an automated
    // client out for good when it is the tenant's only admin key).
    if id == caller.key_id {
        return Err(ApiError::conflict(
            "a key cannot revoke itself; revoke it with another admin key of the tenant or `keel keys revoke`",
        )
        .id(id));
    }
    let k = state
        .store
        .revoke_api_key(KeyScope::Tenant(tenant), &id, chrono::Utc::now())
        .await?;
    // Open streams of the key (and of its inspector sessions) check it again now.
    state.inspector.changed();
    Ok(Json(key_body(k)))
}
