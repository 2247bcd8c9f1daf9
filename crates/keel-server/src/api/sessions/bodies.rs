//! Settings and sessions as the API shows them: settings applied and checked against the server's ceiling and roots, session and turn bodies with their ETags.

use super::*;

/// Applies the settings given to a config.
pub(super) fn apply_settings(c: &mut SessionConfig, s: &SettingsBody) {
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
pub(super) fn settings_of(c: &SessionConfig) -> SettingsBody {
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
pub(super) fn check_settings(s: &SettingsBody) -> Result<(), ApiError> {
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
pub(super) fn check_ceiling(state: &Shared, c: &SessionConfig) -> Result<(), ApiError> {
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

pub(super) fn mode_name(m: keel_tools::policy::PermissionMode) -> String {
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
pub(super) fn check_workspace(state: &Shared, ws: &str) -> Result<PathBuf, ApiError> {
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

pub(super) fn config_of(f: &Folded) -> Result<SessionConfig, ApiError> {
    serde_json::from_value(f.state.config.clone()).map_err(|e| ApiError::internal(&e))
}

/// A session's body: from its row, and with `f` its settings and turns.
pub(super) fn session_body(rec: &SessionRecord, f: Option<&Folded>) -> SessionBody {
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
pub(super) fn with_etag(status: StatusCode, body: SessionBody) -> Response {
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

pub(super) fn enum_name<T: serde::Serialize>(v: &T) -> String {
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
