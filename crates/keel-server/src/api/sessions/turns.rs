//! A session's turns: submit (input or a command), list, read, cancel, and cancel one tool call.

use super::*;

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
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
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
        .for_session_as(tenant, session, caller.principal_id)
        .await?;
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
pub(super) async fn run_command(
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
        Command::Clear => match rt.clear(tenant, session).await? {
            Some(new) => {
                new_session_id = Some(new.to_string());
                format!("new session {new} (session {session} is kept)")
            }
            None => keel_runtime::Runtime::nothing_to_clear(session),
        },
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
    request_body(content = Option<CancelRequest>, description = "Optional, empty"),
    responses(
        (status = 202, description = "Cancellation journaled", body = CancelledBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No turn to cancel, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn cancel_turn(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    OptionalJsonBody(_body): OptionalJsonBody<CancelRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rt = state
        .runtimes
        .for_session_as(tenant, session, caller.principal_id)
        .await?;
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
    request_body(content = Option<CancelRequest>, description = "Optional, empty"),
    responses(
        (status = 202, description = "Cancelled", body = CancelledBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The call is not running, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn cancel_tool_call(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((id, call)): P<(String, String)>,
    OptionalJsonBody(_body): OptionalJsonBody<CancelRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let rt = state
        .runtimes
        .for_session_as(tenant, session, caller.principal_id)
        .await?;
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
