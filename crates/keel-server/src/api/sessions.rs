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
use crate::http::{JsonBody, check_if_match, etag};
use crate::state::Shared;
use crate::types::{
    CancelRequest, CancelledBody, CloseRequest, CommandBody, CreateSessionRequest, Kernel,
    ModelTotalsBody, MultitaskParam, PermissionModeParam, SandboxParam, SessionBody,
    SessionListQuery, SessionPage, SettingsBody, StateBody, StateQuery, SubmitTurnRequest,
    ToolCallStateBody, TurnBody, TurnPage, TurnPageQuery, UpdateSessionRequest, budget,
    budget_body, by_model, usage_body,
};

/// Applies the settings given to a config.
fn apply_settings(c: &mut SessionConfig, s: &SettingsBody) {
    if let Some(m) = s.permission_mode {
        c.permission_mode = m.kernel();
    }
    if let Some(m) = s.sandbox {
        c.sandbox = m.kernel();
    }
    if let Some(r) = &s.ask {
        c.ask.clone_from(r);
    }
    if let Some(r) = &s.deny {
        c.deny.clone_from(r);
    }
    if let Some(b) = s.turn_budget {
        c.turn_budget = budget(b);
    }
    if let Some(b) = s.session_budget {
        c.session_budget = budget(b);
    }
    if let Some(b) = s.tenant_daily_budget {
        c.tenant_daily_budget = budget(b);
    }
    if let Some(m) = s.multitask {
        c.multitask = m.kernel();
    }
    if let Some(ms) = s.tool_timeout_ms {
        c.tool_timeout_ms = Some(ms);
    }
    if let Some(ms) = s.approval_ttl_ms {
        c.approval_ttl_ms = ms;
    }
    if let Some(n) = s.context_window_tokens {
        c.context_window_tokens = Some(n);
    }
    if let Some(k) = s.keep_reasoning {
        c.keep_reasoning = k;
    }
}

/// The settings a config shows.
fn settings_of(c: &SessionConfig) -> SettingsBody {
    use keel_runtime::MultitaskStrategy as M;
    use keel_tools::policy::PermissionMode as PM;
    SettingsBody {
        permission_mode: Some(match c.permission_mode {
            PM::Default => PermissionModeParam::Default,
            PM::AcceptEdits => PermissionModeParam::AcceptEdits,
            PM::ReadOnly => PermissionModeParam::ReadOnly,
            PM::Bypass => PermissionModeParam::Bypass,
        }),
        sandbox: Some(match c.sandbox {
            SandboxMode::Off => SandboxParam::Off,
            SandboxMode::ReadOnly => SandboxParam::ReadOnly,
            SandboxMode::WorkspaceWrite => SandboxParam::WorkspaceWrite,
        }),
        ask: Some(c.ask.clone()),
        deny: Some(c.deny.clone()),
        turn_budget: Some(budget_body(c.turn_budget)),
        session_budget: Some(budget_body(c.session_budget)),
        tenant_daily_budget: Some(budget_body(c.tenant_daily_budget)),
        multitask: Some(match c.multitask {
            M::Enqueue => MultitaskParam::Enqueue,
            M::Reject => MultitaskParam::Reject,
            M::Interrupt => MultitaskParam::Interrupt,
        }),
        tool_timeout_ms: c.tool_timeout_ms,
        approval_ttl_ms: Some(c.approval_ttl_ms),
        context_window_tokens: c.context_window_tokens,
        keep_reasoning: Some(c.keep_reasoning),
    }
}

/// Refuses values the schema's minimums exclude.
fn check_settings(s: &SettingsBody) -> Result<(), ApiError> {
    for (field, v) in [
        ("settings.tool_timeout_ms", s.tool_timeout_ms),
        ("settings.approval_ttl_ms", s.approval_ttl_ms),
        ("settings.context_window_tokens", s.context_window_tokens),
    ] {
        if v == Some(0) {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be at least 1"),
            ));
        }
    }
    for (field, b) in [
        ("settings.turn_budget", s.turn_budget),
        ("settings.session_budget", s.session_budget),
        ("settings.tenant_daily_budget", s.tenant_daily_budget),
    ] {
        if let Some(c) = b.and_then(|b| b.max_cost_usd)
            && !(c.is_finite() && c >= 0.0)
        {
            return Err(ApiError::invalid(
                &format!("{field}.max_cost_usd"),
                "max_cost_usd must be a finite number, 0 or more",
            ));
        }
    }
    Ok(())
}

/// Refuses a config beyond the server's ceiling: a permission mode above
/// `max_permission_mode`, or `sandbox = off` unless `allow_sandbox_off`.
fn check_ceiling(state: &Shared, c: &SessionConfig) -> Result<(), ApiError> {
    let max = state.config.max_permission_mode;
    if permission_rank(c.permission_mode) > permission_rank(max) {
        return Err(ApiError::beyond_limit(
            "max_permission_mode",
            "settings.permission_mode",
            format!(
                "permission_mode {} is beyond this server's ceiling: max_permission_mode = {} ([server] max_permission_mode)",
                mode_name(c.permission_mode),
                mode_name(max)
            ),
        ));
    }
    if c.sandbox == SandboxMode::Off && !state.config.allow_sandbox_off {
        return Err(ApiError::beyond_limit(
            "allow_sandbox_off",
            "settings.sandbox",
            "sandbox off is beyond this server's ceiling: allow_sandbox_off = false ([server] allow_sandbox_off)",
        ));
    }
    Ok(())
}

fn mode_name(m: keel_tools::policy::PermissionMode) -> String {
    serde_json::to_value(m)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The workspace, resolved, if it lies under one of the server's roots.
///
/// # Errors
/// 403 naming `workspace_roots` for a path outside them (or a server with none); 422 for a
/// relative path or one that does not exist under a root.
fn check_workspace(state: &Shared, ws: &str) -> Result<PathBuf, ApiError> {
    let beyond = |detail: String| ApiError::beyond_limit("workspace_roots", "workspace", detail);
    if state.roots.is_empty() {
        return Err(beyond(
            "this server has no workspace_roots ([server] workspace_roots), so no workspace is allowed"
                .into(),
        ));
    }
    let path = Path::new(ws);
    if !path.is_absolute() {
        return Err(ApiError::invalid(
            "workspace",
            format!("workspace {ws:?} must be an absolute path on the server"),
        ));
    }
    let roots = state
        .roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match std::fs::canonicalize(path) {
        Ok(real) if state.roots.iter().any(|r| real.starts_with(r)) && real.is_dir() => Ok(real),
        Ok(real) if state.roots.iter().any(|r| real.starts_with(r)) => Err(ApiError::invalid(
            "workspace",
            format!("workspace {ws:?} is not a directory"),
        )),
        Ok(_) => Err(beyond(format!(
            "workspace {ws:?} is not under this server's workspace_roots ({roots})"
        ))),
        Err(_) if state.roots.iter().any(|r| path.starts_with(r)) => Err(ApiError::invalid(
            "workspace",
            format!("workspace {ws:?} does not exist on the server"),
        )),
        Err(_) => Err(beyond(format!(
            "workspace {ws:?} is not under this server's workspace_roots ({roots})"
        ))),
    }
}

fn config_of(f: &Folded) -> Result<SessionConfig, ApiError> {
    serde_json::from_value(f.state.config.clone()).map_err(|e| ApiError::internal(&e))
}

/// A session's body: from its row, and with `f` its settings and turns.
fn session_body(rec: &SessionRecord, f: Option<&Folded>) -> SessionBody {
    let config = f.and_then(|f| config_of(f).ok());
    SessionBody {
        session_id: rec.session_id.to_string(),
        release_id: rec.release_id.0.clone(),
        status: rec.status.as_str().to_owned(),
        version: rec.version,
        workspace: rec
            .metadata
            .get("workspace")
            .and_then(|w| w.as_str())
            .map(str::to_owned),
        settings: config.as_ref().map(settings_of),
        active_turn_id: f.and_then(|f| f.state.active_turn.map(|t| t.to_string())),
        queued_turn_ids: f
            .map(|f| f.state.queue.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        created_at: rec.created_at,
        updated_at: rec.updated_at,
    }
}

/// A response with the session's body and its `ETag`.
fn with_etag(status: StatusCode, body: SessionBody) -> Response {
    let tag = etag(body.version);
    let location = format!("/v1/sessions/{}", body.session_id);
    let mut res = (status, Json(body)).into_response();
    res.headers_mut().insert(header::ETAG, tag);
    if status == StatusCode::CREATED
        && let Ok(v) = location.parse()
    {
        res.headers_mut().insert(header::LOCATION, v);
    }
    res
}

fn enum_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A turn's body.
pub fn turn_body(f: &Folded, t: &TurnState) -> TurnBody {
    let end = f.ends.get(&t.id).cloned().unwrap_or_else(TurnEnd::default);
    let waiting =
        f.state.status == SessionStatus::RequiresAction && f.state.active_turn == Some(t.id);
    TurnBody {
        turn_id: t.id.to_string(),
        session_id: f
            .state
            .session_id
            .map(|s| s.to_string())
            .unwrap_or_default(),
        status: t.status.as_str().to_owned(),
        terminal_reason: t
            .terminal_reason
            .map(|r| enum_name(&r))
            .or_else(|| waiting.then(|| "requires_action".to_owned())),
        limit: end.limit,
        input: t.input.clone(),
        usage: usage_body(t.usage),
        cost_usd: t.cost_usd,
        usage_by_model: by_model(&t.usage_by_model),
        num_steps: u32::try_from(t.steps.len()).unwrap_or(u32::MAX),
        queued_at: t.queued_at,
        started_at: t.started_at,
        duration_ms: end.duration_ms,
        final_text: end.final_text,
        error: end.error,
        cancel_requested: t.cancel_requested.clone(),
    }
}

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
                .for_session(tenant, session)
                .await?
                .acting_as(caller.principal_id)
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
    request_body(content = CloseRequest, description = "Optional, empty"),
    responses(
        (status = 200, description = "Closed", body = SessionBody, headers(("ETag" = String, description = "The session's version"))),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn is open, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "If-Match names another version", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "If-Match missing", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn close_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    headers: HeaderMap,
    JsonBody(_body): JsonBody<CloseRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rec = state.store.get_session(tenant, session).await?;
    check_if_match(&headers, rec.version)?;
    let rt = state
        .runtimes
        .for_session(tenant, session)
        .await?
        .acting_as(caller.principal_id);
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

/// Submits input, compiled by the input pipeline (`keel_runtime::input`) first: a prompt (with
/// `@path` attachments) is journaled as a queued turn before anything runs, by the multitask
/// strategy (`enqueue`, `reject`: 409 while a turn is in progress, `interrupt`), then run by
/// the server (202). A slash command is carried out here with no model call to its text (200,
/// a `CommandBody`): `/help`, `/cost`, `/status`, `/permissions` answer, `/compact [focus]`
/// compacts between turns, `/model NAME` re-pins the session, `/clear` answers with a new
/// session's id. `/resume` (terminal only), an unknown command and an `@path` that is missing,
/// outside the workspace or denied are 422 naming `input`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/turns", tag = "sessions", operation_id = "submit_turn",
    params(("session_id" = String, Path, description = "The session"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = SubmitTurnRequest,
    responses(
        (status = 200, description = "A slash command carried out; no turn", body = CommandBody),
        (status = 202, description = "Queued; a worker runs it", body = TurnBody, headers(("Location" = String, description = "The turn"))),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Refused (reject while a turn runs, a closed session), or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many queued turns (the tenant's or the service's); retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json", headers(("Retry-After" = String, description = "Seconds to wait"))),
    ))]
pub async fn submit_turn(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    JsonBody(body): JsonBody<SubmitTurnRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    if body.input.trim().is_empty() {
        return Err(ApiError::invalid(
            "input",
            "input is empty; a turn needs a message",
        ));
    }
    // Counted in flight until the turn is written (or refused).
    let _admitted = crate::workers::admit_turn(
        state.store.as_ref(),
        &state.config.scheduler,
        &state.policy,
        &state.admissions,
        tenant,
        &state.metrics,
    )
    .await?;
    let rt = state
        .runtimes
        .for_session(tenant, session)
        .await?
        .acting_as(caller.principal_id);
    let opts = keel_runtime::config::SubmitOptions {
        strategy: body.multitask.map(|m| m.kernel()),
        priority: body.priority.unwrap_or(0),
    };
    // The API offers the built-in commands only (no user command directories: a server has
    // no trusted workspace), and no terminal (`/resume` is refused).
    let input = keel_runtime::input::InputOptions::default();
    let prompt = match rt
        .compile_input(tenant, session, &body.input, &input)
        .await?
    {
        keel_runtime::input::Compiled::Prompt(p) => p,
        keel_runtime::input::Compiled::Command(c) => {
            let out = run_command(&state, &rt, tenant, session, &c, &input).await?;
            return Ok((StatusCode::OK, Json(out)).into_response());
        }
    };
    let turn = rt.submit_prompt(tenant, session, &prompt, opts).await?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    let t = f
        .state
        .turns
        .get(&turn)
        .ok_or_else(|| ApiError::internal(&format!("turn {turn} not in the journal")))?;
    let mut res = (StatusCode::ACCEPTED, Json(turn_body(&f, t))).into_response();
    if let Ok(v) = format!("/v1/sessions/{session}/turns/{turn}").parse() {
        res.headers_mut().insert(header::LOCATION, v);
    }
    Ok(res)
}

/// Carries out a built-in command the pipeline returned (see `submit_turn`).
async fn run_command(
    state: &Shared,
    rt: &keel_runtime::Runtime,
    tenant: keel_core::TenantId,
    session: keel_core::SessionId,
    command: &keel_runtime::input::Command,
    input: &keel_runtime::input::InputOptions,
) -> Result<CommandBody, ApiError> {
    use keel_runtime::input::Command;
    let mut new_session_id = None;
    let output = match command {
        Command::Help | Command::Cost | Command::Status | Command::Permissions => {
            rt.answer(tenant, session, command, input).await?
        }
        Command::Compact { focus } => {
            let c = rt.compact_now(tenant, session, focus.as_deref()).await?;
            format!(
                "compacted the conversation: ~{} → ~{} tokens",
                c.tokens_before, c.tokens_after
            )
        }
        Command::Model { name } => {
            let f = fold(state.store.as_ref(), tenant, session, None).await?;
            let pinned = f
                .state
                .release_id
                .clone()
                .ok_or_else(|| ApiError::internal(&"the journal has no session.created"))?;
            let pinned = state.store.get_release(tenant, &pinned).await?;
            let release = keel_core::Release::new(keel_core::AgentDefinition {
                model_route: vec![name.clone()],
                ..pinned.definition.clone()
            });
            // The new release's runtime: an unknown model route is refused before anything
            // is written (as `PATCH` re-pins).
            let runtime = state.runtimes.for_release(&release)?;
            let runtime = match rt.actor() {
                Some(p) => runtime.acting_as(p),
                None => runtime,
            };
            runtime.repin(tenant, session, &release).await?;
            format!("session {session} now runs model {name}")
        }
        Command::Clear => {
            let new = rt.clear(tenant, session).await?;
            new_session_id = Some(new.to_string());
            format!("new session {new} (session {session} is kept)")
        }
        Command::Resume { .. } => {
            return Err(ApiError::invalid(
                "input",
                "input: /resume is a terminal-only command",
            ));
        }
    };
    Ok(CommandBody {
        command: command.name().to_owned(),
        output,
        session_id: session.to_string(),
        new_session_id,
    })
}

/// Lists a session's turns in the order they were queued.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/turns", tag = "sessions", operation_id = "list_turns",
    params(("session_id" = String, Path, description = "The session"), TurnPageQuery),
    responses(
        (status = 200, description = "A page", body = TurnPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_turns(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<TurnPageQuery>,
) -> Result<Json<TurnPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    let limit = page_limit(q.limit)?;
    let start = match q.cursor.as_deref() {
        None => 0,
        Some(c) => c
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request("cursor", "not a cursor of this list"))?,
    };
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    let order = &f.state.turn_order;
    let end = start
        .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
        .min(order.len());
    let items: Vec<TurnBody> = order
        .get(start.min(end)..end)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| f.state.turns.get(t))
        .map(|t| turn_body(&f, t))
        .collect();
    Ok(Json(TurnPage {
        next_cursor: (end < order.len()).then(|| end.to_string()),
        items,
    }))
}

/// Reads a turn: status, terminal reason, usage and cost by model, final text.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/turns/{turn_id}", tag = "sessions", operation_id = "get_turn",
    params(("session_id" = String, Path, description = "The session"), ("turn_id" = String, Path, description = "The turn")),
    responses(
        (status = 200, description = "The turn", body = TurnBody),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session or turn", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_turn(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((id, turn)): P<(String, String)>,
) -> Result<Json<TurnBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    let f = fold(state.store.as_ref(), tenant, session, None).await?;
    let t = turn
        .parse::<TurnId>()
        .ok()
        .and_then(|t| f.state.turns.get(&t))
        .ok_or_else(|| ApiError::not_found("turn", &turn))?;
    Ok(Json(turn_body(&f, t)))
}

/// Cancels the active turn (or the oldest queued one): durable, every open call gets a result,
/// the turn ends `aborted`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/cancel", tag = "sessions", operation_id = "cancel_turn",
    params(("session_id" = String, Path, description = "The session"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body(content = CancelRequest, description = "Optional, empty"),
    responses(
        (status = 202, description = "Cancellation journaled", body = CancelledBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No turn to cancel, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn cancel_turn(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    JsonBody(_body): JsonBody<CancelRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rt = state
        .runtimes
        .for_session(tenant, session)
        .await?
        .acting_as(caller.principal_id);
    let turn = rt.cancel_turn(tenant, session).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelledBody {
            session_id: session.to_string(),
            turn_id: Some(turn.to_string()),
            tool_call_id: None,
        }),
    )
        .into_response())
}

/// Cancels one running tool call: it gets a `cancelled` result and the turn goes on.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/tool_calls/{tool_call_id}/cancel", tag = "sessions", operation_id = "cancel_tool_call",
    params(("session_id" = String, Path, description = "The session"), ("tool_call_id" = String, Path, description = "The call"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body(content = CancelRequest, description = "Optional, empty"),
    responses(
        (status = 202, description = "Cancelled", body = CancelledBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The call is not running, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn cancel_tool_call(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((id, call)): P<(String, String)>,
    JsonBody(_body): JsonBody<CancelRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rt = state
        .runtimes
        .for_session(tenant, session)
        .await?
        .acting_as(caller.principal_id);
    rt.cancel_tool_call(tenant, session, &ToolCallId::from(call.as_str()))
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelledBody {
            session_id: session.to_string(),
            turn_id: None,
            tool_call_id: Some(call),
        }),
    )
        .into_response())
}
