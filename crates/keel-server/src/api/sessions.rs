//! Sessions (create in a workspace under the server's roots, within its mode and sandbox
//! ceiling; read; list; change settings, close and delete under `If-Match`), their turns
//! (submit with a multitask strategy; read with terminal reason and usage by model; cancel the
//! turn or one tool call) and their folded state at any seq.
//!
//! Submitting input journals a queued turn (the session is then runnable) and a worker of any
//! node claims and runs it ([`crate::workers`]); beyond the queue depths of `[scheduler]`, new
//! turns get 429 with `Retry-After` ([`crate::workers::admit_turn`]).

use std::path::{Path, PathBuf};

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_core::state::TurnState;
use keel_core::{SessionStatus, StateMachine, ToolCallId, TurnId};
use keel_runtime::SessionConfig;
use keel_store::{Role, SessionQuery, SessionRecord};
use keel_tools::sandbox::SandboxMode;

use super::{Folded, P, Q, TurnEnd, fold, next_cursor, page_limit, session_id};
use crate::auth::Caller;
use crate::config::permission_rank;
use crate::error::{ApiError, Problem};
use crate::http::{JsonBody, OptionalJsonBody, check_if_match, etag};
use crate::state::Shared;
use crate::types::{
    CancelRequest, CancelledBody, CloseRequest, CommandBody, CreateSessionRequest, Kernel,
    ModelTotalsBody, MultitaskParam, PermissionModeParam, SandboxParam, SessionBody,
    SessionListQuery, SessionPage, SettingsBody, StateBody, StateQuery, SubmitTurnRequest,
    ToolCallStateBody, TurnBody, TurnPage, TurnPageQuery, UpdateSessionRequest, budget,
    budget_body, by_model, usage_body,
};

mod bodies;
pub use bodies::*;

mod turns;
pub use turns::*;

/// Creates a session pinned to a release, in a workspace under the server's roots.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", operation_id = "create_session",
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = CreateSessionRequest,
    responses(
        (status = 201, description = "Created", body = SessionBody, headers(("ETag" = String, description = "The session's version"), ("Location" = String, description = "The session"))),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator, or beyond a server limit (workspace_roots, max_permission_mode, allow_sandbox_off)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such release", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateSessionRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    check_settings(&body.settings)?;
    let workspace = check_workspace(&state, &body.workspace)?;
    let mut config = SessionConfig {
        workspace,
        ..SessionConfig::default()
    };
    apply_settings(&mut config, &body.settings);
    check_ceiling(&state, &config)?;
    let release = state
        .store
        .get_release(tenant, &keel_core::ReleaseId(body.release_id.clone()))
        .await?;
    let rt = state
        .runtimes
        .for_release(&release)?
        .acting_as(caller.principal_id);
    // Tenants share the roots, never a workspace: the first tenant in a directory keeps it,
    // with every directory above and below it (a confined command of this session sees its
    // whole workspace, so another tenant's files must never lie in it).
    let path = config.workspace.to_str().ok_or_else(|| {
        ApiError::invalid("workspace", "the workspace path is not UTF-8 on the server")
    })?;
    match state.store.claim_workspace(tenant, path).await {
        Ok(()) => {}
        Err(keel_store::StoreError::Conflict(detail)) => {
            return Err(ApiError::beyond_limit(
                "workspace_roots",
                "workspace",
                format!("{detail}; choose a directory of your own under the workspace roots"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    let session = rt.create_session(tenant, &release, config).await?;
    let rec = state.store.get_session(tenant, session).await?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    Ok(with_etag(StatusCode::CREATED, session_body(&rec, Some(&f))))
}

/// Lists sessions, oldest first.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", operation_id = "list_sessions",
    params(SessionListQuery),
    responses(
        (status = 200, description = "A page", body = SessionPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_sessions(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<SessionListQuery>,
) -> Result<Json<SessionPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let limit = page_limit(q.limit)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse()
                .map_err(|_| ApiError::bad_request("cursor", "not a cursor of this list"))
        })
        .transpose()?;
    let rows = state
        .store
        .list_sessions(
            tenant,
            &SessionQuery {
                status: q.status.map(|s| s.kernel()),
                release_id: q.release_id.map(keel_core::ReleaseId),
                after,
                limit: Some(limit),
                ..SessionQuery::default()
            },
        )
        .await?;
    let items: Vec<SessionBody> = rows.iter().map(|r| session_body(r, None)).collect();
    Ok(Json(SessionPage {
        next_cursor: next_cursor(&items, limit, |s| s.session_id.clone()),
        items,
    }))
}

/// Reads a session (its settings, active and queued turns); `ETag` is its version.
#[utoipa::path(get, path = "/v1/sessions/{session_id}", tag = "sessions", operation_id = "get_session",
    params(("session_id" = String, Path, description = "The session")),
    responses(
        (status = 200, description = "The session", body = SessionBody, headers(("ETag" = String, description = "The session's version"))),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    let rec = state.store.get_session(tenant, session).await?;
    let f = fold(state.store.as_ref(), tenant, session, Some(rec.version)).await?;
    Ok(with_etag(StatusCode::OK, session_body(&rec, Some(&f))))
}

/// Changes a session's settings and/or re-pins it to another release of the tenant. Needs
/// `If-Match`. Settings alone change between turns and while a turn waits on a human; with a
/// `release_id`, between turns only (409 while a turn is active). Both in one request are one
/// commit: `session.release_pinned` then `session.config_changed`, both naming the caller's
/// principal.
#[utoipa::path(patch, path = "/v1/sessions/{session_id}", tag = "sessions", operation_id = "update_session",
    params(("session_id" = String, Path, description = "The session"),
        ("If-Match" = String, Header, description = "The session's ETag")),
    request_body = UpdateSessionRequest,
    responses(
        (status = 200, description = "Changed", body = SessionBody, headers(("ETag" = String, description = "The session's version"))),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator, or beyond a server limit", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session, or no such release (`field`: `release_id`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn runs (or, to re-pin, is active at all), or the session is closed", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "If-Match names another version", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "If-Match missing", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn update_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<UpdateSessionRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    check_settings(&body.settings)?;
    let rec = state.store.get_session(tenant, session).await?;
    check_if_match(&headers, rec.version)?;
    let release = match &body.release_id {
        None => None,
        Some(r) => Some(
            state
                .store
                .get_release(tenant, &keel_core::ReleaseId(r.clone()))
                .await
                .map_err(|e| match e {
                    keel_store::StoreError::NotFound { .. } => {
                        ApiError::not_found("release", r.clone()).field("release_id")
                    }
                    e => e.into(),
                })?,
        ),
    };
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    let mut next = config_of(&f)?;
    apply_settings(&mut next, &body.settings);
    check_ceiling(&state, &next)?;
    let settings = body.settings.clone();
    match release {
        None => {
            state
                .runtimes
                .for_session_as(tenant, session, caller.principal_id)
                .await?
                .update_config(tenant, session, |c| apply_settings(c, &settings))
                .await?;
        }
        Some(release) => {
            // The new release's runtime: an unknown model route is refused before anything is
            // written, and the next turn's worker builds the same one.
            state
                .runtimes
                .for_release(&release)?
                .acting_as(caller.principal_id)
                .repin_with_config(tenant, session, &release, |c| apply_settings(c, &settings))
                .await?;
        }
    }
    let rec = state.store.get_session(tenant, session).await?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    Ok(with_etag(StatusCode::OK, session_body(&rec, Some(&f))))
}

/// Closes a session for good (refused while a turn is active or queued). Needs `If-Match`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/close", tag = "sessions", operation_id = "close_session",
    params(("session_id" = String, Path, description = "The session"),
        ("If-Match" = String, Header, description = "The session's ETag"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body(content = Option<CloseRequest>, description = "Optional, empty"),
    responses(
        (status = 200, description = "Closed", body = SessionBody, headers(("ETag" = String, description = "The session's version"))),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn is open, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "If-Match names another version", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "If-Match missing", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn close_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    headers: HeaderMap,
    OptionalJsonBody(_body): OptionalJsonBody<CloseRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rec = state.store.get_session(tenant, session).await?;
    check_if_match(&headers, rec.version)?;
    let rt = state
        .runtimes
        .for_session_as(tenant, session, caller.principal_id)
        .await?;
    rt.close_session(tenant, session).await?;
    let rec = state.store.get_session(tenant, session).await?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    Ok(with_etag(StatusCode::OK, session_body(&rec, Some(&f))))
}

/// Deletes a session with everything it owns (journal, transcript, effects, approvals,
/// artifacts); refused while a turn is active or queued. Needs `If-Match`.
#[utoipa::path(delete, path = "/v1/sessions/{session_id}", tag = "sessions", operation_id = "delete_session",
    params(("session_id" = String, Path, description = "The session"),
        ("If-Match" = String, Header, description = "The session's ETag")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn is open or the server runs the session", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "If-Match names another version", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "If-Match missing", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rec = state.store.get_session(tenant, session).await?;
    check_if_match(&headers, rec.version)?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    if let Some(t) = f
        .state
        .active_turn
        .or_else(|| f.state.queue.front().copied())
    {
        return Err(ApiError::conflict(format!(
            "session {session} has turn {t} open; cancel it (POST /v1/sessions/{session}/cancel) before deleting"
        ))
        .id(session.to_string()));
    }
    if rec
        .lease
        .as_ref()
        .is_some_and(|l| l.expires_at > chrono::Utc::now())
    {
        return Err(ApiError::conflict(format!(
            "session {session} is being run; delete it once it is idle"
        ))
        .id(session.to_string()));
    }
    state.store.delete_session(tenant, session).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The session folded from its journal up to `at` (default: now).
#[utoipa::path(get, path = "/v1/sessions/{session_id}/state", tag = "sessions", operation_id = "get_session_state",
    params(("session_id" = String, Path, description = "The session"), StateQuery),
    responses(
        (status = 200, description = "The folded state", body = StateBody),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_state(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<StateQuery>,
) -> Result<Json<StateBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    if let Some(at) = q.at
        && i64::try_from(at).is_err()
    {
        return Err(ApiError::bad_request(
            "at",
            format!("at {at} is past any seq (at most 2^63 - 1)"),
        ));
    }
    let f = fold(state.store.as_ref(), tenant, session, q.at).await?;
    let s = &f.state;
    Ok(Json(StateBody {
        session_id: session.to_string(),
        version: s.version,
        status: s.status.as_str().to_owned(),
        release_id: s.release_id.as_ref().map(|r| r.0.clone()),
        config: s.config.clone(),
        turns: s
            .turn_order
            .iter()
            .filter_map(|t| s.turns.get(t))
            .map(|t| turn_body(&f, t))
            .collect(),
        active_turn_id: s.active_turn.map(|t| t.to_string()),
        queued_turn_ids: s.queue.iter().map(ToString::to_string).collect(),
        tool_calls: s
            .tool_calls
            .values()
            .map(|c| ToolCallStateBody {
                tool_call_id: c.id.to_string(),
                turn_id: c.turn_id.to_string(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
                status: c.status.as_str().to_owned(),
                approval_id: c.approval_id.map(|a| a.to_string()),
                operation_key: c.operation_key.as_ref().map(|k| k.0.clone()),
            })
            .collect(),
        effects: s
            .effects
            .iter()
            .map(|(k, e)| (k.0.clone(), e.status.as_str().to_owned()))
            .collect(),
        approvals: s
            .approvals
            .iter()
            .map(|(k, a)| (k.to_string(), a.status.as_str().to_owned()))
            .collect(),
        usage: usage_body(s.usage),
        cost_usd: s.cost_usd,
        usage_by_model: by_model(&s.usage_by_model)
            .into_iter()
            .collect::<std::collections::BTreeMap<String, ModelTotalsBody>>(),
    }))
}
