//! The operations, one module per resource, and the router that serves them with the OpenAPI
//! document generated from the same registrations ([`router`]).
//!
//! Every route is registered through [`Routes::add`] (utoipa-axum's `routes!`): the method and
//! path of its `#[utoipa::path]` attribute go both to the axum router and to the document, and
//! into [`Routes::table`], which a test compares with the document's operations.

pub mod admin;
pub mod decisions;
pub mod events;
pub mod health;
pub mod links;
pub mod resources;
pub mod sessions;

use std::collections::{BTreeSet, HashMap};

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::middleware;
use chrono::{DateTime, Utc};
use keel_core::{Event, EventBody, SessionId, SessionState, TenantId, TurnId};
use keel_store::Store;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::state::Shared;

/// A query string of type `T`: 400 problem naming the parameter when it does not parse.
#[derive(Debug)]
pub struct Q<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Q(v))
            .map_err(|e| {
                let text = e.body_text();
                let field = text
                    .split('`')
                    .nth(1)
                    .map_or_else(|| "query".to_owned(), str::to_owned);
                ApiError::bad_request(&field, format!("the query string does not parse: {text}"))
            })
    }
}

/// Path parameters of type `T`: a segment that does not decode is a 404 (no such resource).
#[derive(Debug)]
pub struct P<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for P<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| P(v))
            .map_err(|_| ApiError::no_route(parts.uri.path()))
    }
}

/// A session id from a path: an id that does not parse names no session (404).
pub fn session_id(text: &str) -> Result<SessionId, ApiError> {
    text.parse()
        .map_err(|_| ApiError::not_found("session", text))
}

/// A page size: 1 to 1000, default 100.
///
/// # Errors
/// 400 naming `limit`.
pub fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(100),
        Some(n) if (1..=1000).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(
            "limit",
            format!("limit {n} is out of range: 1 to 1000"),
        )),
    }
}

/// The next page's cursor: the last item's, when the page is full.
pub fn next_cursor<T>(items: &[T], limit: u32, key: impl Fn(&T) -> String) -> Option<String> {
    if items.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
        items.last().map(key)
    } else {
        None
    }
}

/// A turn's end as journaled (`turn.finished`), and its last visible text.
#[derive(Debug, Clone, Default)]
pub struct TurnEnd {
    /// `turn.finished`'s payload fields.
    pub limit: Option<String>,
    /// Duration, ms.
    pub duration_ms: Option<u64>,
    /// Error, for `failed`.
    pub error: Option<String>,
    /// The model's last visible text in the turn.
    pub final_text: Option<String>,
}

/// A session folded from its journal (up to a seq), with what the API shows of its turns.
#[derive(Debug, Clone)]
pub struct Folded {
    /// The fold.
    pub state: SessionState,
    /// Per turn: its end and text.
    pub ends: HashMap<TurnId, TurnEnd>,
}

/// Folds `session`'s journal up to seq `upto` (all of it with `None`).
///
/// # Errors
/// 404 for an unknown session; 500 for a journal that does not fold.
pub async fn fold(
    store: &dyn Store,
    tenant: TenantId,
    session: SessionId,
    upto: Option<u64>,
) -> Result<Folded, ApiError> {
    let limit = upto.map(|u| u32::try_from(u).unwrap_or(u32::MAX));
    let events: Vec<Event> = if limit == Some(0) {
        store.get_session(tenant, session).await?;
        Vec::new()
    } else {
        store.read(tenant, session, 1, limit).await?
    };
    let mut state = SessionState::default();
    let mut ends: HashMap<TurnId, TurnEnd> = HashMap::new();
    for ev in &events {
        state
            .apply(ev)
            .map_err(|e| ApiError::internal(&format!("session {session}: {e}")))?;
        let turn = ev.correlation.turn_id;
        match (&ev.body, turn) {
            (EventBody::StepCompleted { text, .. }, Some(t)) if !text.is_empty() => {
                ends.entry(t).or_default().final_text = Some(text.clone());
            }
            (
                EventBody::TurnFinished {
                    limit,
                    duration_ms,
                    error,
                    ..
                },
                Some(t),
            ) => {
                let e = ends.entry(t).or_default();
                e.limit = limit.map(|l| {
                    serde_json::to_value(l)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                });
                e.duration_ms = Some(*duration_ms);
                e.error.clone_from(error);
            }
            _ => {}
        }
    }
    Ok(Folded { state, ends })
}

/// A time as RFC 3339, or the Unix epoch for none (never happens for stored rows).
pub fn time_or_epoch(t: Option<DateTime<Utc>>) -> DateTime<Utc> {
    t.unwrap_or_default()
}

/// The document's top level; operations come from the router registrations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Keel API",
        description = "Keel as a service: releases, sessions, turns, events (SSE), approvals, effects, artifacts, usage and memory, per tenant. Errors are RFC 9457 problem+json. Every POST honours Idempotency-Key (24 h, per tenant, principal and route). Settings changes, close and delete need If-Match with the session's ETag.",
        license(name = "Apache-2.0")
    ),
    modifiers(&SecurityAddon),
    tags(
        (name = "health", description = "Process and store health; no key needed."),
        (name = "tenants", description = "Tenants and their first keys (system keys)."),
        (name = "keys", description = "A tenant's API keys (admin)."),
        (name = "releases", description = "Immutable, content-hashed agent definitions."),
        (name = "sessions", description = "Sessions, their turns, events and state."),
        (name = "approvals", description = "Human decisions on tool calls and effects."),
        (name = "data", description = "Artifacts, usage and memory.")
    )
)]
pub struct ApiDoc;

struct SecurityAddon;

impl utoipa::Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key: Authorization: Bearer keel_… (keel keys create)",
                    ))
                    .build(),
            ),
        );
    }
}

/// Routes as registered: what went to the axum router, and the document.
pub struct Routes {
    router: OpenApiRouter<Shared>,
    /// `(METHOD, path)` of every registration, as given to the axum router.
    pub table: BTreeSet<(String, String)>,
}

impl Routes {
    fn new() -> Self {
        Self {
            router: OpenApiRouter::with_openapi(ApiDoc::openapi()),
            table: BTreeSet::new(),
        }
    }

    /// Registers the operations of one `routes!` (one path).
    fn add(mut self, r: UtoipaMethodRouter<Shared>) -> Self {
        for (path, item) in &r.1.paths {
            for (method, op) in operations(item) {
                let _ = op;
                self.table.insert((method.to_owned(), path.clone()));
            }
        }
        self.router = self.router.routes(r);
        self
    }
}

/// The operations of a path item that the API serves (GET, PUT, POST, DELETE, PATCH), to change.
pub fn operations_mut(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

/// The operations of a path item, by method.
pub fn operations(
    item: &utoipa::openapi::PathItem,
) -> Vec<(&'static str, &utoipa::openapi::path::Operation)> {
    [
        ("GET", &item.get),
        ("PUT", &item.put),
        ("POST", &item.post),
        ("DELETE", &item.delete),
        ("PATCH", &item.patch),
        ("HEAD", &item.head),
        ("OPTIONS", &item.options),
        ("TRACE", &item.trace),
    ]
    .into_iter()
    .filter_map(|(m, o)| o.as_ref().map(|o| (m, o)))
    .collect()
}

/// The operations: those that need a key, then the public ones (`/healthz`, `/readyz`,
/// `/openapi.json`).
fn routes() -> (Routes, Routes) {
    let authed = Routes::new()
        .add(routes!(admin::create_tenant, admin::list_tenants))
        .add(routes!(admin::get_tenant))
        .add(routes!(admin::create_tenant_key))
        .add(routes!(admin::create_key, admin::list_keys))
        .add(routes!(admin::revoke_key))
        .add(routes!(resources::create_release, resources::list_releases))
        .add(routes!(resources::get_release))
        .add(routes!(sessions::create_session, sessions::list_sessions))
        .add(routes!(
            sessions::get_session,
            sessions::update_session,
            sessions::delete_session
        ))
        .add(routes!(sessions::close_session))
        .add(routes!(sessions::get_state))
        .add(routes!(sessions::submit_turn, sessions::list_turns))
        .add(routes!(sessions::get_turn))
        .add(routes!(sessions::cancel_turn))
        .add(routes!(sessions::cancel_tool_call))
        .add(routes!(events::session_events))
        .add(routes!(events::tenant_events))
        .add(routes!(decisions::list_approvals))
        .add(routes!(decisions::list_session_approvals))
        .add(routes!(decisions::get_approval))
        .add(routes!(decisions::decide_approval))
        .add(routes!(decisions::list_effects))
        .add(routes!(decisions::decide_effect))
        .add(routes!(resources::list_artifacts))
        .add(routes!(resources::get_artifact))
        .add(routes!(resources::usage))
        .add(routes!(resources::list_memory))
        .add(routes!(
            resources::get_memory,
            resources::put_memory,
            resources::delete_memory
        ));
    let public = Routes::new()
        .add(routes!(health::healthz))
        .add(routes!(health::readyz))
        .add(routes!(health::openapi_json));
    (authed, public)
}

/// Completes the document of the routes: every operation needs a key but the public ones; the
/// links between operations.
fn finish(doc: &mut utoipa::openapi::OpenApi) {
    let needs_key =
        utoipa::openapi::security::SecurityRequirement::new("api_key", Vec::<String>::new());
    for (path, item) in doc.paths.paths.iter_mut() {
        let public = matches!(path.as_str(), "/healthz" | "/readyz" | "/openapi.json");
        for op in operations_mut(item) {
            op.security = Some(if public {
                vec![utoipa::openapi::security::SecurityRequirement::default()]
            } else {
                vec![needs_key.clone()]
            });
        }
    }
    links::add(doc);
}

/// The OpenAPI document exactly as `/openapi.json` serves it ([`links::render`] of the
/// [`router`]'s document), built without a server: it depends on the routes only. The fuzz
/// targets hold request bodies to it as the server does ([`crate::http::BodySchemas`]).
///
/// # Errors
/// serde_json's, if the document does not serialize (a bug).
pub fn document() -> serde_json::Result<String> {
    let (authed, public) = routes();
    let (_, mut doc) = authed.router.merge(public.router).split_for_parts();
    finish(&mut doc);
    links::render(&doc)
}

/// The API's router with its OpenAPI document and route table. Public operations (`/healthz`,
/// `/readyz`, `/openapi.json`) take no key; every other one authenticates, then honours
/// `Idempotency-Key`.
pub fn router(
    state: &Shared,
) -> (
    axum::Router<Shared>,
    utoipa::openapi::OpenApi,
    BTreeSet<(String, String)>,
) {
    let (authed, public) = routes();
    let mut table = authed.table;
    table.extend(public.table);
    let authed = authed
        .router
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::http::idempotency,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ));
    let (router, mut doc) = authed.merge(public.router).split_for_parts();
    finish(&mut doc);
    (router, doc, table)
}
