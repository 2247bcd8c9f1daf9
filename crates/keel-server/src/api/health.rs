//! Health and the contract: `/healthz` (the process is up), `/readyz` (the store is reachable
//! and migrated, and the node is not draining), `/openapi.json` (this document). None needs a key.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Problem};
use crate::state::Shared;
use crate::types::HealthBody;

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", operation_id = "healthz",
    responses((status = 200, description = "Up", body = HealthBody)))]
pub async fn healthz() -> Json<HealthBody> {
    Json(HealthBody {
        status: "ok".into(),
        checked: "process".into(),
    })
}

/// The store is reachable and its schema is this build's.
#[utoipa::path(get, path = "/readyz", tag = "health", operation_id = "readyz",
    responses(
        (status = 200, description = "Ready", body = HealthBody),
        (status = 503, description = "The store is not reachable or not migrated, or the node drains", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(State(state): State<Shared>) -> Result<Json<HealthBody>, ApiError> {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::unavailable(
            "this node is draining: it takes no new work and stops soon".to_owned(),
        ));
    }
    state
        .store
        .ready()
        .await
        .map_err(|e| ApiError::unavailable(format!("the store is not ready: {e}")))?;
    Ok(Json(HealthBody {
        status: "ok".into(),
        checked: "store".into(),
    }))
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", tag = "health", operation_id = "openapi",
    responses((status = 200, description = "The document", content_type = "application/json", body = Object)))]
pub async fn openapi_json(State(state): State<Shared>) -> Response {
    let doc = state.openapi.get().cloned().unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}
