//! Releases (content-hashed agent definitions), artifacts (full tool outputs, paged), usage
//! (per tenant, day and model) and memory (tenant-scoped, by namespace).

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{NaiveDate, Utc};
use keel_core::{AgentDefinition, Release, ReleaseId};
use keel_store::Role;

use super::{P, Q, next_cursor, page_limit, session_id};
use crate::auth::Caller;
use crate::error::{ApiError, Problem};
use crate::http::JsonBody;
use crate::state::Shared;
use crate::types::{
    AgentBody, ArtifactChunkBody, ArtifactInfoBody, ArtifactPage, ArtifactQuery,
    CreateReleaseRequest, MemoryBody, MemoryListQuery, MemoryPage, PageQuery, PutMemoryRequest,
    ReleaseBody, ReleasePage, UsageQuery, UsageReport, UsageRowBody, budget, budget_body,
    usage_body,
};

fn release_body(r: Release, created_at: Option<chrono::DateTime<Utc>>) -> ReleaseBody {
    let d = r.definition;
    ReleaseBody {
        release_id: r.id.0,
        name: d.name,
        model_route: d.model_route,
        instructions: d.instructions,
        tools: d.tools,
        policy: d.policy,
        budget: budget_body(d.budget),
        mcp_servers: d
            .mcp_servers
            .into_iter()
            .map(|(name, server)| (name, shown_server(server)))
            .collect(),
        agents: d
            .agents
            .into_iter()
            .map(|(name, a)| {
                (
                    name,
                    AgentBody {
                        instructions: a.instructions,
                        tools: a.tools,
                        model_route: a.model_route,
                    },
                )
            })
            .collect(),
        created_at,
    }
}

/// A release's MCP server as the API shows it: literal header values and `env` values (a
/// token written into the definition) are `"<redacted>"` — anyone who may read releases sees
/// where the servers are and which host variables they read, never a credential.
fn shown_server(mut server: serde_json::Value) -> serde_json::Value {
    for field in ["headers", "env"] {
        if let Some(map) = server
            .get_mut(field)
            .and_then(serde_json::Value::as_object_mut)
        {
            for value in map.values_mut().filter(|v| v.is_string()) {
                *value = serde_json::Value::String("<redacted>".into());
            }
        }
    }
    server
}

/// Stores a release; the same definition twice is the same release (200 the second time).
#[utoipa::path(post, path = "/v1/releases", tag = "releases", operation_id = "create_release",
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "Replays the first response of this key for 24 h")),
    request_body = CreateReleaseRequest,
    responses(
        (status = 201, description = "Stored", body = ReleaseBody),
        (status = 200, description = "The same definition was stored before", body = ReleaseBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The same key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field (an unknown tool, a model the server does not serve, a rule that does not parse, an MCP server entry that is malformed or a stdio server this host does not allow, an agent with a bad name, an unknown tool or a route the server does not serve: `agents`), or the key reused with another body", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_release(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateReleaseRequest>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Admin)?;
    if body.name.trim().is_empty() || body.name.len() > 200 {
        return Err(ApiError::invalid("name", "name must be 1 to 200 bytes"));
    }
    if body.model_route.is_empty() || body.model_route.len() > 8 {
        return Err(ApiError::invalid(
            "model_route",
            "model_route needs 1 to 8 model specs, primary first",
        ));
    }
    let servers = state
        .runtimes
        .mcp()
        .check(&body.mcp_servers)
        .map_err(|e| ApiError::invalid("mcp_servers", e.to_string()))?;
    let known = state.runtimes.tool_names()?;
    // An MCP tool's name is known once its server runs; the release may name any tool of a
    // server it lists.
    let of_release_server = |t: &str| {
        servers
            .keys()
            .any(|s| t.starts_with(&format!("{}{s}__", keel_mcp::naming::PREFIX)))
    };
    if let Some(t) = body
        .tools
        .iter()
        .find(|t| !known.contains(t) && !of_release_server(t))
    {
        return Err(ApiError::invalid(
            "tools",
            format!("unknown tool {t:?}; known are {}", known.join(", ")),
        ));
    }
    let agents = agents_of(&state, &body.agents, &known)?;
    let policy = match &body.policy {
        None => serde_json::Value::Null,
        Some(p) => serde_json::to_value(p).map_err(|e| ApiError::internal(&e))?,
    };
    let release = Release::new(AgentDefinition {
        name: body.name.clone(),
        model_route: body.model_route.clone(),
        instructions: body.instructions.clone(),
        tools: body.tools.clone(),
        policy,
        budget: budget(body.budget),
        mcp_servers: body.mcp_servers.clone(),
        agents,
    });
    keel_runtime::pinned::check_release(&release).map_err(|e| {
        let text = e.to_string();
        ApiError::invalid("policy", text)
    })?;
    // The route must be one this server serves (providers it has keys for, scripts if
    // allowed): building it now refuses it before any session pins it.
    state.runtimes.for_release(&release)?;
    let existed = match state.store.get_release(tenant, &release.id).await {
        Ok(_) => true,
        Err(keel_store::StoreError::NotFound { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    state.store.put_release(tenant, &release).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let location = format!("/v1/releases/{}", release.id);
    let stored = state.store.get_release_record(tenant, &release.id).await?;
    let mut res = (
        status,
        Json(release_body(stored.release, Some(stored.created_at))),
    )
        .into_response();
    if let Ok(v) = location.parse() {
        res.headers_mut().insert(header::LOCATION, v);
    }
    Ok(res)
}

/// Most agents one release may define.
const MAX_AGENTS: usize = 32;

/// The agent definitions of a release's `agents`, checked: names of 1 to 64 letters, digits,
/// `_` or `-`; tools the server has (or `spawn_agent`); a model route of at most 8 specs the
/// server serves (empty: the parent's). 422 naming `agents` (and the agent) otherwise.
fn agents_of(
    state: &Shared,
    agents: &std::collections::BTreeMap<String, AgentBody>,
    known: &[String],
) -> Result<std::collections::BTreeMap<String, AgentDefinition>, ApiError> {
    if agents.len() > MAX_AGENTS {
        return Err(ApiError::invalid(
            "agents",
            format!("a release defines at most {MAX_AGENTS} agents"),
        ));
    }
    let mut out = std::collections::BTreeMap::new();
    for (name, a) in agents {
        let ok_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok_name {
            return Err(ApiError::invalid(
                "agents",
                format!("agent name {name:?}: use 1 to 64 letters, digits, `_` or `-`"),
            ));
        }
        if let Some(t) = a.tools.iter().find(|t| !known.contains(t)) {
            return Err(ApiError::invalid(
                "agents",
                format!(
                    "agent {name:?}: unknown tool {t:?}; known are {}",
                    known.join(", ")
                ),
            ));
        }
        if a.model_route.len() > 8 {
            return Err(ApiError::invalid(
                "agents",
                format!("agent {name:?}: model_route takes at most 8 model specs"),
            ));
        }
        if !a.model_route.is_empty() {
            // The route must be one this server serves, as a release's own.
            state.runtimes.for_route(&a.model_route).map_err(|e| {
                ApiError::invalid("agents", format!("agent {name:?}: {}", e.problem.detail))
            })?;
        }
        out.insert(
            name.clone(),
            AgentDefinition {
                name: name.clone(),
                model_route: a.model_route.clone(),
                instructions: a.instructions.clone(),
                tools: a.tools.clone(),
                policy: serde_json::Value::Null,
                budget: keel_core::Budget::default(),
                mcp_servers: Default::default(),
                agents: Default::default(),
            },
        );
    }
    Ok(out)
}

/// Lists the tenant's releases.
#[utoipa::path(get, path = "/v1/releases", tag = "releases", operation_id = "list_releases",
    params(PageQuery),
    responses(
        (status = 200, description = "A page", body = ReleasePage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_releases(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<PageQuery>,
) -> Result<Json<ReleasePage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let limit = page_limit(q.limit)?;
    let after = q.cursor.map(ReleaseId);
    let items: Vec<ReleaseBody> = state
        .store
        .list_releases(tenant, after.as_ref(), limit)
        .await?
        .into_iter()
        .map(|r| release_body(r.release, Some(r.created_at)))
        .collect();
    Ok(Json(ReleasePage {
        next_cursor: next_cursor(&items, limit, |r| r.release_id.clone()),
        items,
    }))
}

/// Reads a release.
#[utoipa::path(get, path = "/v1/releases/{release_id}", tag = "releases", operation_id = "get_release",
    params(("release_id" = String, Path, description = "`sha256:<hex>`")),
    responses(
        (status = 200, description = "The release", body = ReleaseBody),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such release", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_release(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> Result<Json<ReleaseBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let r = state
        .store
        .get_release_record(tenant, &ReleaseId(id))
        .await?;
    Ok(Json(release_body(r.release, Some(r.created_at))))
}

/// Lists a session's artifacts (without their bytes).
#[utoipa::path(get, path = "/v1/sessions/{session_id}/artifacts", tag = "data", operation_id = "list_artifacts",
    params(("session_id" = String, Path, description = "The session"), PageQuery),
    responses(
        (status = 200, description = "A page", body = ArtifactPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_artifacts(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<PageQuery>,
) -> Result<Json<ArtifactPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    let limit = page_limit(q.limit)?;
    let items: Vec<ArtifactInfoBody> = state
        .store
        .list_artifacts(tenant, session, q.cursor.as_deref(), limit)
        .await?
        .into_iter()
        .map(|a| ArtifactInfoBody {
            artifact_id: a.artifact_id,
            session_id: a.session_id.to_string(),
            name: a.name,
            content_type: a.content_type,
            size: a.size,
            created_at: a.created_at,
        })
        .collect();
    Ok(Json(ArtifactPage {
        next_cursor: next_cursor(&items, limit, |a| a.artifact_id.clone()),
        items,
    }))
}

/// Most bytes of an artifact per request.
pub const ARTIFACT_CHUNK: u64 = 262_144;

/// Reads an artifact (a tool's full output) in chunks.
#[utoipa::path(get, path = "/v1/artifacts/{artifact_id}", tag = "data", operation_id = "get_artifact",
    params(("artifact_id" = String, Path, description = "The artifact (`artifact://<id>` in a truncated result)"), ArtifactQuery),
    responses(
        (status = 200, description = "A chunk", body = ArtifactChunkBody),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such artifact", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_artifact(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    Q(q): Q<ArtifactQuery>,
) -> Result<Json<ArtifactChunkBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    // Not an id (`..`, `.`, a slash, non-ASCII): it names no artifact — 404 like a missing
    // one, which is also what the document allows for any string.
    if !keel_tools::artifact::valid_id(&id) {
        return Err(ApiError::not_found("artifact", id).field("artifact_id"));
    }
    let limit = match q.limit {
        None => ARTIFACT_CHUNK,
        Some(n) if (1..=ARTIFACT_CHUNK).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(
                "limit",
                format!("limit {n} is out of range: 1 to {ARTIFACT_CHUNK}"),
            ));
        }
    };
    let a = state.store.get_artifact(tenant, &id).await?;
    let size = a.data.len();
    let offset = usize::try_from(q.offset.unwrap_or(0)).unwrap_or(usize::MAX);
    if offset > size {
        return Err(ApiError::bad_request(
            "offset",
            format!("offset {offset} is past the end ({size} bytes)"),
        ));
    }
    let mut end = offset
        .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
        .min(size);
    // End on a character boundary when the bytes are UTF-8 (at most 3 bytes back).
    let continuation = |b: u8| (b & 0b1100_0000) == 0b1000_0000;
    let mut steps = 0;
    while end < size && end > offset + 1 && steps < 3 && continuation(a.data[end]) {
        end -= 1;
        steps += 1;
    }
    let text = String::from_utf8_lossy(&a.data[offset..end]).into_owned();
    Ok(Json(ArtifactChunkBody {
        artifact_id: a.artifact_id,
        name: a.name,
        content_type: a.content_type,
        size: size as u64,
        offset: offset as u64,
        text,
        next_offset: (end < size).then_some(end as u64),
    }))
}

fn day(field: &str, text: Option<&str>, default: NaiveDate) -> Result<NaiveDate, ApiError> {
    match text {
        None => Ok(default),
        Some(t) => NaiveDate::parse_from_str(t, "%Y-%m-%d").map_err(|_| {
            ApiError::bad_request(field, format!("{field} {t:?} is not a day (YYYY-MM-DD)"))
        }),
    }
}

/// The tenant's usage (tokens and cost) by UTC day and model.
#[utoipa::path(get, path = "/v1/usage", tag = "data", operation_id = "get_usage",
    params(UsageQuery),
    responses(
        (status = 200, description = "Usage", body = UsageReport),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn usage(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Q(q): Q<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let today = Utc::now().date_naive();
    let to = day("to", q.to.as_deref(), today)?;
    let from = day("from", q.from.as_deref(), to - chrono::Duration::days(30))?;
    if from > to {
        return Err(ApiError::bad_request("from", "from is after to"));
    }
    let (from, to) = (
        from.format("%Y-%m-%d").to_string(),
        to.format("%Y-%m-%d").to_string(),
    );
    let rows = state.store.usage(tenant, &from, &to).await?;
    // f64 sums start at -0.0: an empty range is 0.
    let total_cost_usd = rows.iter().map(|r| r.cost_usd).sum::<f64>() + 0.0;
    let total_tokens = rows.iter().map(|r| r.usage.total_tokens()).sum();
    Ok(Json(UsageReport {
        rows: rows
            .into_iter()
            .map(|r| UsageRowBody {
                day: r.day,
                model: r.model,
                usage: usage_body(r.usage),
                cost_usd: r.cost_usd,
                steps: r.steps,
            })
            .collect(),
        from,
        to,
        total_cost_usd,
        total_tokens,
    }))
}

fn check_name(field: &str, text: &str) -> Result<(), ApiError> {
    if text.is_empty() || text.len() > 512 {
        return Err(ApiError::bad_request(
            field,
            format!("{field} must be 1 to 512 bytes"),
        ));
    }
    Ok(())
}

fn memory_body(m: keel_store::MemoryEntry) -> MemoryBody {
    MemoryBody {
        namespace: m.namespace,
        key: m.key,
        value: m.value,
        updated_at: m.updated_at,
    }
}

/// Lists a memory namespace by key, or searches it (`q`: full-text, every word as a word or the
/// start of one, best match first).
#[utoipa::path(get, path = "/v1/memory/{namespace}", tag = "data", operation_id = "list_memory",
    params(("namespace" = String, Path, description = "The namespace"), MemoryListQuery),
    responses(
        (status = 200, description = "A page", body = MemoryPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_memory(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P(ns): P<String>,
    Q(q): Q<MemoryListQuery>,
) -> Result<Json<MemoryPage>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    check_name("namespace", &ns)?;
    let limit = page_limit(q.limit)?;
    if let Some(query) = q.q {
        let items = state
            .store
            .memory_search(tenant, Some(&ns), &query, limit)
            .await?
            .into_iter()
            .map(memory_body)
            .collect();
        return Ok(Json(MemoryPage {
            items,
            next_cursor: None,
        }));
    }
    let items: Vec<MemoryBody> = state
        .store
        .memory_list(tenant, &ns, q.cursor.as_deref(), limit)
        .await?
        .into_iter()
        .map(memory_body)
        .collect();
    Ok(Json(MemoryPage {
        next_cursor: next_cursor(&items, limit, |m| m.key.clone()),
        items,
    }))
}

/// Reads a memory entry.
#[utoipa::path(get, path = "/v1/memory/{namespace}/{key}", tag = "data", operation_id = "get_memory",
    params(("namespace" = String, Path, description = "The namespace"), ("key" = String, Path, description = "The key")),
    responses(
        (status = 200, description = "The entry", body = MemoryBody),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such entry", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_memory(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((ns, key)): P<(String, String)>,
) -> Result<Json<MemoryBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    check_name("namespace", &ns)?;
    check_name("key", &key)?;
    let m = state
        .store
        .memory_get(tenant, &ns, &key)
        .await?
        .ok_or_else(|| ApiError::not_found("memory entry", format!("{ns}/{key}")))?;
    Ok(Json(memory_body(m)))
}

/// Writes a memory entry (insert or replace), checked as the `memory_write` tool checks it: a
/// value whose compact JSON is over the host's `[memory] max_value_bytes` (64 KiB by default),
/// or a value, key or namespace holding a secret (the redactor's patterns, the host's secret
/// values), is refused with 422 naming `value` (the secret is not echoed).
#[utoipa::path(put, path = "/v1/memory/{namespace}/{key}", tag = "data", operation_id = "put_memory",
    params(("namespace" = String, Path, description = "The namespace"), ("key" = String, Path, description = "The key")),
    request_body = PutMemoryRequest,
    responses(
        (status = 200, description = "Written", body = MemoryBody),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within `body_read_timeout_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field: `value` over the memory size limit (`limit`: `max_value_bytes`) or holding a secret", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_memory(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((ns, key)): P<(String, String)>,
    JsonBody(body): JsonBody<PutMemoryRequest>,
) -> Result<Json<MemoryBody>, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    check_name("namespace", &ns)?;
    check_name("key", &key)?;
    // The `memory_write` tool's checks: the host's size limit, no secret (never echoed).
    let options = state.runtimes.options();
    let secrets = keel_runtime::host_redactor(options);
    if let Err(refused) = keel_runtime::memory::check_entry(
        &body.value,
        &[&ns, &key],
        options.memory.max_value_bytes,
        &secrets,
    ) {
        let e = ApiError::invalid("value", format!("memory entry refused: {refused}"));
        return Err(match refused {
            keel_runtime::memory::Refusal::TooLarge { .. } => e.limit("max_value_bytes"),
            keel_runtime::memory::Refusal::Secret => e,
        });
    }
    state
        .store
        .memory_put(tenant, &ns, &key, &body.value)
        .await?;
    let m = state
        .store
        .memory_get(tenant, &ns, &key)
        .await?
        .ok_or_else(|| ApiError::not_found("memory entry", format!("{ns}/{key}")))?;
    Ok(Json(memory_body(m)))
}

/// Deletes a memory entry (what an agent remembered, for people to forget it). Idempotent: an
/// entry that is not there (any more) answers 204 too; `GET` first tells whether it is.
#[utoipa::path(delete, path = "/v1/memory/{namespace}/{key}", tag = "data", operation_id = "delete_memory",
    params(("namespace" = String, Path, description = "The namespace"), ("key" = String, Path, description = "The key")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_memory(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    P((ns, key)): P<(String, String)>,
) -> Result<axum::http::StatusCode, ApiError> {
    let tenant = caller.tenant_as(Role::Operator)?;
    check_name("namespace", &ns)?;
    check_name("key", &key)?;
    state.store.memory_delete(tenant, &ns, &key).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}
