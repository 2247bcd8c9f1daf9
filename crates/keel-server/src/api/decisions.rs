//! Human decisions: approvals (pending per tenant and per session; decide allow or deny, bound
//! to the approval id and the argument hash the decider saw) and effects (list; decide what an
//! `outcome_unknown` effect did). A decision wakes the session (its wake-up time is due), and
//! whichever worker claims it continues it.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use keel_core::{ApprovalDecision, ApprovalId, EffectDecision, OperationKey};
use keel_store::{ApprovalQuery, Role};

use super::{P, Q, next_cursor, page_limit, session_id};
use crate::auth::Caller;
use crate::error::{ApiError, Problem};
use crate::http::JsonBody;
use crate::state::Shared;
use crate::types::{
    ApprovalBody, ApprovalDecisionParam, ApprovalListQuery, ApprovalPage, DecideApprovalRequest,
    DecideEffectRequest, EffectDecidedBody, EffectDecisionParam, EffectListQuery, EffectPage,
    Kernel, approval_body, effect_body,
};

fn approval_id(text: &str) -> Result<ApprovalId, ApiError> {
    text.parse()
        .map_err(|_| ApiError::not_found("approval", text))
}

async fn page(
    state: &Shared,
    tenant: keel_core::TenantId,
    session: Option<keel_core::SessionId>,
    q: ApprovalListQuery,
) -> Result<ApprovalPage, ApiError> {
    let limit = page_limit(q.limit)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse()
                .map_err(|_| ApiError::bad_request("cursor", "not a cursor of this list"))
        })
        .transpose()?;
    // A session's list holds its sub-agents' approvals too (children, their children, …),
    // labelled with the agent: its host decides them like its own.
    let sessions = match session {
        Some(s) => with_children(state, tenant, s).await?,
        None => vec![(None, None)],
    };
    let mut items: Vec<(keel_core::ApprovalRecord, Option<String>)> = Vec::new();
    for (sid, agent) in sessions {
        let rows = state
            .store
            .list_approvals_page(
                tenant,
                &ApprovalQuery {
                    session_id: sid,
                    status: q.status.map(Kernel::kernel),
                    after,
                    limit: Some(limit),
                },
            )
            .await?;
        items.extend(rows.into_iter().map(|a| (a, agent.clone())));
    }
    items.sort_by_key(|(a, _)| a.approval_id);
    items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let items: Vec<ApprovalBody> = items
        .into_iter()
        .map(|(a, agent)| ApprovalBody {
            agent,
            ..approval_body(a)
        })
        .collect();
    Ok(ApprovalPage {
        next_cursor: next_cursor(&items, limit, |a| a.approval_id.clone()),
        items,
    })
}

/// `session` and its sub-agent sessions ([`keel_runtime::subagents::descendants`]), each
/// with its agent's name (`None` for `session` itself).
async fn with_children(
    state: &Shared,
    tenant: keel_core::TenantId,
    session: keel_core::SessionId,
) -> Result<Vec<(Option<keel_core::SessionId>, Option<String>)>, ApiError> {
    let mut out = vec![(Some(session), None)];
    for (child, agent) in
        keel_runtime::subagents::descendants(state.store.as_ref(), tenant, session).await?
    {
        out.push((Some(child), Some(agent)));
    }
    Ok(out)
}

/// Lists the tenant's approvals (e.g. `?status=pending`: everything waiting on a human).
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", operation_id = "list_approvals",
    params(ApprovalListQuery),
    responses(
        (status = 200, description = "A page", body = ApprovalPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_approvals(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<ApprovalListQuery>,
) -> Result<Json<ApprovalPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    Ok(Json(page(&state, tenant, None, q).await?))
}

/// Lists a session's approvals, its sub-agents' included (each labelled with its `agent` and
/// child `session_id`; decide them with `POST /v1/approvals/{approval_id}/decision`).
#[utoipa::path(get, path = "/v1/sessions/{session_id}/approvals", tag = "approvals", operation_id = "list_session_approvals",
    params(("session_id" = String, Path, description = "The session"), ApprovalListQuery),
    responses(
        (status = 200, description = "A page", body = ApprovalPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_session_approvals(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<ApprovalListQuery>,
) -> Result<Json<ApprovalPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    state.store.get_session(tenant, session).await?;
    Ok(Json(page(&state, tenant, Some(session), q).await?))
}

/// Reads an approval.
#[utoipa::path(get, path = "/v1/approvals/{approval_id}", tag = "approvals", operation_id = "get_approval",
    params(("approval_id" = String, Path, description = "The approval")),
    responses(
        (status = 200, description = "The approval", body = ApprovalBody),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such approval", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_approval(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> Result<Json<ApprovalBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let a = state.store.get_approval(tenant, approval_id(&id)?).await?;
    Ok(Json(approval_body(a)))
}

/// Decides an approval — bound to its id and the `args_hash` the decider saw, so it never
/// applies to other arguments, and never fails because the session moved on meanwhile. The
/// same decision twice is fine; the session then continues.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/decision", tag = "approvals", operation_id = "decide_approval",
    params(("approval_id" = String, Path, description = "The approval"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = DecideApprovalRequest,
    responses(
        (status = 200, description = "Decided", body = ApprovalBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such approval", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another hash, decided otherwise, expired, or withdrawn with its ended turn; or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn decide_approval(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    JsonBody(body): JsonBody<DecideApprovalRequest>,
) -> Result<Json<ApprovalBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let approval = approval_id(&id)?;
    let rec = state.store.get_approval(tenant, approval).await?;
    let decision = match body.decision {
        ApprovalDecisionParam::AllowOnce => ApprovalDecision::AllowOnce,
        ApprovalDecisionParam::AllowForSession => ApprovalDecision::AllowForSession,
        ApprovalDecisionParam::Deny => ApprovalDecision::Deny {
            reason: body
                .reason
                .clone()
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| "denied".to_owned()),
        },
    };
    let rt = state
        .runtimes
        .for_session_as(tenant, rec.session_id, caller.principal_id)
        .await?;
    rt.decide_approval(tenant, approval, decision, &body.args_hash)
        .await?;
    let a = state.store.get_approval(tenant, approval).await?;
    Ok(Json(approval_body(a)))
}

/// Lists a session's effects.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/effects", tag = "approvals", operation_id = "list_effects",
    params(("session_id" = String, Path, description = "The session"), EffectListQuery),
    responses(
        (status = 200, description = "The effects", body = EffectPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_effects(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<EffectListQuery>,
) -> Result<Json<EffectPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    state.store.get_session(tenant, session).await?;
    let items = state
        .store
        .list_effects(tenant, session, q.status.map(Kernel::kernel))
        .await?
        .into_iter()
        .map(effect_body)
        .collect();
    Ok(Json(EffectPage {
        items,
        next_cursor: None,
    }))
}

/// Says what an `outcome_unknown` effect did (`committed`, `failed`) or to dispatch it again
/// (`retry`); the session then continues. The operation key is percent-encoded in the path.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/effects/{operation_key}/decision", tag = "approvals", operation_id = "decide_effect",
    params(("session_id" = String, Path, description = "The session"), ("operation_key" = String, Path, description = "The effect's key, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = DecideEffectRequest,
    responses(
        (status = 200, description = "Recorded", body = EffectDecidedBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The effect is not outcome_unknown, or the same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn decide_effect(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((id, key)): P<(String, String)>,
    JsonBody(body): JsonBody<DecideEffectRequest>,
) -> Result<Json<EffectDecidedBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    let session = session_id(&id)?;
    let (decision, name) = match body.decision {
        EffectDecisionParam::Committed => (
            EffectDecision::Committed {
                outcome: body
                    .reason
                    .clone()
                    .map_or(serde_json::Value::Null, serde_json::Value::String),
            },
            "committed",
        ),
        EffectDecisionParam::Failed => (
            EffectDecision::Failed {
                error: body
                    .reason
                    .clone()
                    .unwrap_or_else(|| "a human says it did not happen".to_owned()),
            },
            "failed",
        ),
        EffectDecisionParam::Retry => (EffectDecision::Retry, "retry"),
    };
    let rt = state
        .runtimes
        .for_session_as(tenant, session, caller.principal_id)
        .await?;
    rt.resolve_effect(tenant, session, &OperationKey(key.clone()), decision)
        .await?;
    Ok(Json(EffectDecidedBody {
        session_id: session.to_string(),
        operation_key: key,
        decision: name.to_owned(),
    }))
}
