//! HTTP semantics every operation shares: JSON bodies ([`JsonBody`], [`OptionalJsonBody`]: 415
//! for another media type, 413 past the limit, 408 for one that does not arrive within
//! `body_read_timeout_ms`, 400 for what is not JSON or is empty where the body is required,
//! 422 naming the field for a value that does not fit, unknown fields included), `ETag` and
//! `If-Match` ([`etag`], [`check_if_match`]: 428 without, 412 on a mismatch),
//! `Idempotency-Key` on every POST ([`idempotency`]), the
//! problem+json fallbacks for unknown routes and methods, and response counting.

use keel_core::mechanisms::Mechanism;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use keel_store::{IdempotencyBegin, IdempotencyKey, StoredResponse};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::Shared;

/// How long an idempotency record lives: 24 h.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
/// An in-flight record older than this belongs to a request whose process died: 10 min.
pub const IDEMPOTENCY_STALE: Duration = Duration::from_secs(600);
/// The header that marks a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";

/// A required JSON request body of type `T` (the operation's `requestBody` is `required`): an
/// empty body, or one of only JSON's whitespace ([`keel_api::body::is_blank`]), is 400 naming
/// `body`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// An optional JSON request body of type `T` (the operation's `requestBody` is not
/// `required`, as `content = Option<T>` writes it: the body or `null`): an empty body, one of
/// only JSON's whitespace, or `null` reads as `{}`.
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub T);

impl<T: DeserializeOwned + utoipa::ToSchema> FromRequest<Shared> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Shared) -> Result<Self, Self::Rejection> {
        read_body(req, state, false).await.map(JsonBody)
    }
}

impl<T: DeserializeOwned + utoipa::ToSchema> FromRequest<Shared> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Shared) -> Result<Self, Self::Rejection> {
        read_body(req, state, true).await.map(OptionalJsonBody)
    }
}

/// Reads a request body as `T`: 415 for another media type, 413 past the limit, 400 for an
/// empty body where it is required (`optional` false; else it reads as `{}`), then
/// [`BodySchemas::decode`].
async fn read_body<T: DeserializeOwned + utoipa::ToSchema>(
    req: Request,
    state: &Shared,
    optional: bool,
) -> Result<T, ApiError> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("?");
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(ApiError::unsupported_media_type(ct));
        }
    }
    let limit = state.config.body_limit_bytes;
    let wait = state.config.body_read_timeout_ms;
    let mut bytes =
        tokio::time::timeout(Duration::from_millis(wait), Bytes::from_request(req, state))
            .await
            .map_err(|_| ApiError::body_timeout(wait))?
            .map_err(|r| {
                if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::too_large(limit)
                } else {
                    ApiError::bad_request("body", format!("the body could not be read: {r}"))
                }
            })?;
    // An optional body may be absent: no bytes, JSON's whitespace, or `null` (what
    // `/openapi.json` allows for it).
    let absent = keel_api::body::is_blank(&bytes)
        || (optional && serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| v.is_null()));
    if absent {
        if !optional {
            return Err(ApiError::bad_request(
                "body",
                format!(
                    "the body is empty; this operation needs a JSON object ({}, see /openapi.json)",
                    T::name()
                ),
            ));
        }
        bytes = Bytes::from_static(b"{}");
    }
    let doc = state.openapi.get().map_or("{}", String::as_str);
    state.body_schemas.decode(doc, &bytes)
}

/// Validators of request bodies, compiled once per schema from the document the server
/// serves, so a body is held to exactly the contract `/openapi.json` states (serde alone
/// also takes a struct written as a JSON array, for one).
#[derive(Debug, Default)]
pub struct BodySchemas {
    cache: std::sync::Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl BodySchemas {
    /// Reads `bytes` as a request body of type `T`, held to `T`'s schema
    /// (`#/components/schemas/{T::name()}`) in the OpenAPI document `doc` (the server's, see
    /// [`crate::api::document`]), as every `/v1` route does: JSON first
    /// ([`keel_api::body::decode`]), then the schema, then `T` from the same bytes (so a field
    /// given twice is refused, not read as its last value).
    ///
    /// # Errors
    /// 400 for a body that is not JSON; 422 naming the field for one that does not fit the
    /// schema or `T`; 500 when `doc` has no such schema or it does not compile (a bug, never
    /// input).
    pub fn decode<T: DeserializeOwned + utoipa::ToSchema>(
        &self,
        doc: &str,
        bytes: &[u8],
    ) -> Result<T, ApiError> {
        let body: Value = parse_json(bytes)?;
        let validator = self.validator(doc, &T::name())?;
        if let Some(e) = validator.iter_errors(&body).next() {
            return Err(schema_error(&e, &body));
        }
        // From the bytes, not from `body`: a JSON object keeps only the last of duplicate keys,
        // and serde refuses a field given twice (fuzz finding of 2026-12-05, `api_body_schema`:
        // `{"args_hash": "a", "args_hash": "b"}` was taken as "b").
        parse_json(bytes)
    }

    /// The validator of `#/components/schemas/{name}` of `doc` (JSON Schema 2020-12, as
    /// OpenAPI 3.1), compiled once per name: one `BodySchemas` serves one document.
    ///
    /// # Errors
    /// 500 when the document has no such schema or it does not compile: a bug, never input.
    fn validator(&self, doc: &str, name: &str) -> Result<Arc<jsonschema::Validator>, ApiError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = cache.get(name) {
            return Ok(v.clone());
        }
        let doc: Value = serde_json::from_str(doc).map_err(|e| ApiError::internal(&e))?;
        if doc["components"]["schemas"][name].is_null() {
            return Err(ApiError::internal(&format!(
                "no schema {name} in the document"
            )));
        }
        let root = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": format!("#/components/schemas/{name}"),
            "components": doc["components"],
        });
        let v = Arc::new(jsonschema::validator_for(&root).map_err(|e| ApiError::internal(&e))?);
        cache.insert(name.to_owned(), v.clone());
        Ok(v)
    }
}

/// 422 naming the field a schema violation is about (`settings.approval_ttl_ms`; the missing
/// or unknown property itself for `required` and `additionalProperties`). A `oneOf` (how the
/// document spells a nullable object) names the field inside the branch that failed for a
/// reason other than its type (`settings.turn_budget.max_tokens`, not `settings.turn_budget`).
/// `body` is the instance validated: an object whose schema has no properties at all
/// (`CloseRequest`, `CancelRequest`) fails `additionalProperties: false` as a `false` schema at
/// the object, naming no property, so the first key of that object is named.
fn schema_error(e: &jsonschema::ValidationError<'_>, body: &Value) -> ApiError {
    use jsonschema::error::ValidationErrorKind as K;
    if let K::OneOfNotValid { context } = e.kind()
        && let Some(inner) = context
            .iter()
            .flatten()
            .filter(|d| !matches!(d.kind(), K::Type { .. }))
            .max_by_key(|d| d.instance_path().as_str().len())
    {
        return schema_error(inner, body);
    }
    let path: Vec<String> = e
        .instance_path()
        .as_str()
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let mut field = path.join(".");
    let child = match e.kind() {
        K::Required { property } => property.as_str().map(str::to_owned),
        K::AdditionalProperties { unexpected } => unexpected.first().cloned(),
        K::FalseSchema if e.schema_path().as_str().ends_with("/additionalProperties") => body
            .pointer(e.instance_path().as_str())
            .and_then(Value::as_object)
            .and_then(|o| o.keys().next().cloned()),
        _ => None,
    };
    if let Some(c) = child {
        field = if field.is_empty() {
            c
        } else {
            format!("{field}.{c}")
        };
    }
    if field.is_empty() {
        field = "body".to_owned();
    }
    ApiError::invalid(&field, format!("the body does not fit the schema: {e}"))
}

/// Parses a request body: 400 for what is not JSON, 422 naming the field for the rest.
///
/// # Errors
/// As said.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    keel_api::body::decode::<T>(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request("body", format!("the body is not JSON: {e}"))
            }
            Category::Data => {
                let text = e.to_string();
                let field = named_field(&text).unwrap_or_else(|| "body".to_owned());
                ApiError::invalid(&field, format!("the body does not fit the schema: {text}"))
            }
        }
    })
}

/// The field a serde message names (`unknown field `x``, `missing field `x``).
fn named_field(text: &str) -> Option<String> {
    let start = text.find('`')? + 1;
    let end = start + text[start..].find('`')?;
    Some(text[start..end].to_owned())
}

/// The `ETag` of a session at `version`.
pub fn etag(version: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// Checks `If-Match` against the session's current `version`: `*` or a list naming it passes.
///
/// # Errors
/// 428 without the header; 412 when it names other versions.
pub fn check_if_match(headers: &HeaderMap, version: u64) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Err(ApiError::precondition_required());
    };
    let text = value.to_str().unwrap_or("");
    let want = format!("\"{version}\"");
    let ok = text
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag == want || tag.strip_prefix("W/") == Some(want.as_str()));
    if ok {
        Ok(())
    } else {
        Err(ApiError::precondition_failed(version, text))
    }
}

/// The hash an idempotency record binds: of the canonical JSON when the body is JSON (so key
/// order and spacing do not matter), else of the bytes.
pub fn request_hash(bytes: &[u8]) -> String {
    // No body hashes as `{}`, which an optional body reads as ([`OptionalJsonBody`]).
    let bytes: &[u8] = if keel_api::body::is_blank(bytes) {
        b"{}"
    } else {
        bytes
    };
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) => keel_core::canonical::content_hash(&v),
        Err(_) => format!("sha256:{}", hex::encode(Sha256::digest(bytes))),
    }
}

fn valid_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Middleware on every authenticated route: a POST with `Idempotency-Key` runs once per
/// (tenant, principal, route, key) for 24 h. The same key and body replay the first response
/// (marked `Idempotent-Replayed: true`); another body is 422; while the first still runs,
/// 409. Only a success (2xx) is kept: a refusal (4xx: validation, a precondition, a conflict)
/// changed nothing and a 5xx may not have finished, so the key may be used again — with a
/// corrected request — as Stripe's idempotent requests do
/// (<https://docs.stripe.com/api/idempotent_requests>: "no idempotent result is saved" for a
/// request that failed validation or conflicted).
pub async fn idempotency(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || keel_core::mechanisms::is_off(Mechanism::IdempotencyKey) {
        return next.run(req).await;
    }
    let Some(raw) = req.headers().get("idempotency-key").cloned() else {
        return next.run(req).await;
    };
    let Some(key) = raw
        .to_str()
        .ok()
        .filter(|k| valid_key(k))
        .map(str::to_owned)
    else {
        return ApiError::bad_request(
            "idempotency-key",
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )
        .into_response();
    };
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let limit = state.config.body_limit_bytes;
    let wait = state.config.body_read_timeout_ms;
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, limit);
    let bytes = match tokio::time::timeout(Duration::from_millis(wait), read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return ApiError::too_large(limit).into_response(),
        Err(_) => return ApiError::body_timeout(wait).into_response(),
    };
    let hash = request_hash(&bytes);
    let ikey = IdempotencyKey {
        scope: caller.scope(),
        principal_id: caller.principal_id,
        route: format!("POST {}", parts.uri.path()),
        key: key.clone(),
    };
    let store = state.store.clone();
    match store
        .idempotency_begin(&ikey, &hash, Utc::now(), IDEMPOTENCY_TTL, IDEMPOTENCY_STALE)
        .await
    {
        Err(e) => ApiError::from(e).into_response(),
        Ok(IdempotencyBegin::Mismatch) => ApiError::idempotency_mismatch(&key).into_response(),
        Ok(IdempotencyBegin::InFlight) => ApiError::idempotency_in_flight(&key).into_response(),
        Ok(IdempotencyBegin::Done(stored)) => {
            state.metrics.idempotent_replay();
            replay(stored)
        }
        Ok(IdempotencyBegin::Started) => {
            let req = Request::from_parts(parts, Body::from(bytes));
            let res = next.run(req).await;
            let (parts, body) = res.into_parts();
            let body = match axum::body::to_bytes(body, usize::MAX).await {
                Ok(b) => b,
                Err(e) => {
                    let _ = store.idempotency_abandon(&ikey, &hash).await;
                    return ApiError::internal(&e).into_response();
                }
            };
            if !parts.status.is_success() {
                if let Err(e) = store.idempotency_abandon(&ikey, &hash).await {
                    tracing::warn!("idempotency record not abandoned: {e}");
                }
            } else {
                let stored = StoredResponse {
                    status: parts.status.as_u16(),
                    headers: [header::CONTENT_TYPE, header::ETAG, header::LOCATION]
                        .iter()
                        .filter_map(|h| {
                            parts
                                .headers
                                .get(h)
                                .and_then(|v| v.to_str().ok())
                                .map(|v| (h.as_str().to_owned(), v.to_owned()))
                        })
                        .collect(),
                    body: String::from_utf8_lossy(&body).into_owned(),
                };
                if let Err(e) = store.idempotency_finish(&ikey, &hash, &stored).await {
                    tracing::warn!("idempotency record not kept: {e}");
                }
            }
            Response::from_parts(parts, Body::from(body))
        }
    }
}

fn replay(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut res = (status, stored.body).into_response();
    res.headers_mut().remove(header::CONTENT_TYPE);
    for (k, v) in stored.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            res.headers_mut().insert(k, v);
        }
    }
    res.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    res
}

/// Middleware: counts every response by status class.
pub async fn count(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    state.metrics.http_response(res.status().as_u16());
    res
}

/// Fallback: no route at this path.
pub async fn no_route(req: Request) -> ApiError {
    ApiError::no_route(req.uri().path())
}

/// Fallback: the path exists, the method does not.
pub async fn no_method(req: Request) -> ApiError {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_requires_the_current_version() {
        let mut h = HeaderMap::new();
        assert_eq!(
            check_if_match(&h, 3).unwrap_err().status,
            StatusCode::PRECONDITION_REQUIRED
        );
        h.insert(header::IF_MATCH, HeaderValue::from_static("\"2\""));
        assert_eq!(
            check_if_match(&h, 3).unwrap_err().status,
            StatusCode::PRECONDITION_FAILED
        );
        for ok in ["\"3\"", "W/\"3\"", "\"1\", \"3\"", "*"] {
            h.insert(header::IF_MATCH, HeaderValue::from_static(ok));
            assert!(check_if_match(&h, 3).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bodies_name_the_field_at_fault() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct B {
            input: String,
        }
        let e = parse_json::<B>(b"{\"input\": \"x\", \"extra\": 1}").unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.problem.field.as_deref(), Some("extra"));
        // No body is not JSON here; `JsonBody` refuses it first, `OptionalJsonBody` reads `{}`.
        let e = parse_json::<B>(b"").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.problem.field.as_deref(), Some("body"));
        let e = parse_json::<B>(b"{}").unwrap_err();
        assert_eq!(e.problem.field.as_deref(), Some("input"));
        let e = parse_json::<B>(b"{nope").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            request_hash(b"{\"a\": 1, \"b\": 2}"),
            request_hash(b"{\"b\":2,\"a\":1}")
        );
        assert_eq!(request_hash(b""), request_hash(b" {}\n"));
        assert_ne!(request_hash(b"\x0c"), request_hash(b"{}"));
    }

    #[test]
    fn integers_written_with_a_zero_fraction_are_integers() {
        #[derive(Debug, serde::Deserialize)]
        struct B {
            n: u64,
            m: i64,
            x: f64,
        }
        let b = parse_json::<B>(b"{\"n\": 370122.0, \"m\": -2.0, \"x\": 1.5}").unwrap();
        assert_eq!((b.n, b.m, b.x), (370_122, -2, 1.5));
        let e = parse_json::<B>(b"{\"n\": 1.5, \"m\": 0, \"x\": 0}").unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
}
