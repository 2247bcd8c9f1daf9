//! Errors: [`ApiError`] is what a request gets back — an RFC 9457 `application/problem+json`
//! body naming the field, id or limit at fault — and [`ServerError`] is why the server could not
//! start.
//!
//! Every runtime and store error a request can cause maps to a 4xx with a message that says what
//! to do; only a fault of the server itself (a store that fails, a bug) is a 500, logged with its
//! cause and answered without it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_runtime::RuntimeError;
use keel_store::StoreError;
use keel_tools::ToolsError;

pub use keel_api::{PROBLEM_JSON, Problem};

/// An error answered to a request.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// The body (boxed: errors travel through every handler's `Result`).
    pub problem: Box<Problem>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, title: &str, detail: impl Into<String>) -> Self {
        Self {
            status,
            problem: Box::new(Problem {
                kind: format!("urn:keel:problem:{kind}"),
                title: title.to_owned(),
                status: status.as_u16(),
                detail: detail.into(),
                field: None,
                id: None,
                limit: None,
            }),
            retry_after_s: None,
        }
    }

    /// Names the field at fault.
    #[must_use]
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.problem.field = Some(field.into());
        self
    }

    /// Names the id at fault.
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.problem.id = Some(id.into());
        self
    }

    /// Names the server limit that refused the request.
    #[must_use]
    pub fn limit(mut self, limit: impl Into<String>) -> Self {
        self.problem.limit = Some(limit.into());
        self
    }

    /// 400: the request is malformed (a body that is not JSON, a bad query parameter).
    pub fn bad_request(field: &str, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Bad request",
            detail,
        )
        .field(field)
    }

    /// 401: no key, or one that does not authenticate.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            detail,
        )
        .field("authorization")
    }

    /// 403: the key's role may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// 403: a server limit refuses the request (workspace roots, the mode and sandbox ceiling).
    pub fn beyond_limit(limit: &str, field: &str, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "beyond-server-limit",
            "Beyond a server limit",
            detail,
        )
        .limit(limit)
        .field(field)
    }

    /// 404: no such entity for this tenant (another tenant's id answers exactly the same).
    pub fn not_found(entity: &str, id: impl Into<String>) -> Self {
        let id = id.into();
        Self::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "Not found",
            format!("{entity} {id} not found"),
        )
        .id(id)
    }

    /// 404 for a path no route serves.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "no-route",
            "No such route",
            format!("no operation at {path}; see /openapi.json"),
        )
    }

    /// 405 for a method a route does not serve.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            format!("{method} is not an operation of {path}; see /openapi.json"),
        )
    }

    /// 409: the request conflicts with the resource's state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    /// 409: a request with this `Idempotency-Key` is still running.
    pub fn idempotency_in_flight(key: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency-in-flight",
            "Request in flight",
            format!(
                "a request with Idempotency-Key {key:?} is still being processed; retry after it finishes to get its response"
            ),
        )
        .field("idempotency-key")
    }

    /// 422: the key was used before with another body.
    pub fn idempotency_mismatch(key: &str) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency key reused",
            format!(
                "Idempotency-Key {key:?} was used with a different request body in the last 24 h; use a new key for a new request"
            ),
        )
        .field("idempotency-key")
    }

    /// 422: the body is JSON but a value is not acceptable.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request",
            "Invalid request",
            detail,
        )
        .field(field)
    }

    /// 412: `If-Match` names another version.
    pub fn precondition_failed(current: u64, given: &str) -> Self {
        Self::new(
            StatusCode::PRECONDITION_FAILED,
            "precondition-failed",
            "Precondition failed",
            format!(
                "If-Match {given} does not match the session's ETag \"{current}\" (an entity tag is quoted); read the session again and retry with its ETag"
            ),
        )
        .field("if-match")
    }

    /// 428: `If-Match` is required and missing.
    pub fn precondition_required() -> Self {
        Self::new(
            StatusCode::PRECONDITION_REQUIRED,
            "precondition-required",
            "Precondition required",
            "this operation needs If-Match with the session's ETag (its version, from GET /v1/sessions/{session_id})",
        )
        .field("if-match")
    }

    /// 413: the body is larger than the server takes.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "Payload too large",
            format!("request bodies are limited to {limit} bytes"),
        )
        .limit("body_limit_bytes")
    }

    /// 408: the request's body did not all arrive within `ms` of its headers (RFC 9110
    /// §15.5.9), naming the limit `body_read_timeout_ms`.
    pub fn body_timeout(ms: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            "Request timeout",
            format!("the request body did not arrive within {ms} ms"),
        )
        .limit("body_read_timeout_ms")
    }

    /// 415: a body that is not JSON.
    pub fn unsupported_media_type(got: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            format!("request bodies are application/json, not {got}"),
        )
        .field("content-type")
    }

    /// 406: the client accepts none of the operation's media types.
    pub fn not_acceptable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            "not-acceptable",
            "Not acceptable",
            detail,
        )
        .field("accept")
    }

    /// 429: too many concurrent streams for this key.
    pub fn too_many_streams(limit: usize) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-streams",
            "Too many streams",
            format!(
                "this key has {limit} event streams open already; close one before opening another"
            ),
        )
        .limit("max_streams_per_key")
    }

    /// 429: admission control refuses a new turn — the queue of `scope` (`tenant` or
    /// `overall`) is full; `Retry-After: retry_after_s`. Nothing accepted before is dropped.
    pub fn queue_full(scope: &str, detail: impl Into<String>, retry_after_s: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue-full",
            "Too many queued turns",
            detail,
        )
        .limit(if scope == "tenant" {
            "tenant_max_queued_turns"
        } else {
            "max_queued_turns"
        });
        e.retry_after_s = Some(retry_after_s);
        e
    }

    /// 403: a request made with an inspector session cookie that fails the CSRF checks (no
    /// or a wrong `X-Keel-CSRF` token, or an `Origin` of another site).
    pub fn csrf(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "csrf",
            "Cross-site request refused",
            detail,
        )
        .field("x-keel-csrf")
    }

    /// 429: too many failed inspector sign-ins lately; `Retry-After: retry_after_s`.
    pub fn sign_in_limited(retry_after_s: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "sign-in-limited",
            "Too many failed sign-ins",
            format!(
                "too many failed sign-ins on this server lately; try again in {retry_after_s} s"
            ),
        )
        .limit("inspector_sign_in_failures");
        e.retry_after_s = Some(retry_after_s);
        e
    }

    /// 503: the store is not reachable or not migrated, or the node is shutting down.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            detail,
        )
    }

    /// 500: a fault of the server; the cause is logged, not answered.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!("internal error: {cause}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the server failed to handle the request; it is logged, and retrying may help",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&*self.problem).unwrap_or_default();
        let mut res = (self.status, body).into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = self.retry_after_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"keel\""),
            );
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { entity, id } => ApiError::not_found(entity, id),
            StoreError::Conflict(m) => ApiError::conflict(m),
            StoreError::InvalidInput(m) => ApiError::invalid("body", m),
            StoreError::Approval(a) => ApiError::conflict(a.to_string()),
            StoreError::Transition(t) => ApiError::conflict(t.to_string()),
            StoreError::StaleVersion { session, .. } | StoreError::LeaseLost { session, .. } => {
                ApiError::conflict(format!(
                    "session {session} changed while the request ran; retry it"
                ))
                .id(session.to_string())
            }
            StoreError::LeaseHeld { session, .. } => ApiError::conflict(format!(
                "session {session} is being run; retry once it is idle"
            ))
            .id(session.to_string()),
            StoreError::Locked(m) => {
                let mut e = ApiError::unavailable(format!("the store is busy: {m}"));
                e.retry_after_s = Some(1);
                e
            }
            // Every pooled connection stayed in use past the pool's acquire timeout: overload,
            // not a fault; the client retries.
            e if e.is_pool_timeout() => {
                let mut e = ApiError::unavailable(
                    "the store is busy: every connection stayed in use; retry in a moment",
                );
                e.retry_after_s = Some(1);
                e
            }
            other => ApiError::internal(&other),
        }
    }
}

impl From<ToolsError> for ApiError {
    fn from(e: ToolsError) -> Self {
        match e {
            ToolsError::ApprovalNotFound { approval_id } => {
                ApiError::not_found("approval", approval_id)
            }
            ToolsError::ApprovalArgsMismatch {
                ref approval_id, ..
            } => ApiError::conflict(e.to_string())
                .id(approval_id.clone())
                .field("args_hash"),
            ToolsError::ApprovalConflict {
                ref approval_id, ..
            }
            | ToolsError::ApprovalExpired {
                ref approval_id, ..
            } => ApiError::conflict(e.to_string()).id(approval_id.clone()),
            ToolsError::Store(s) => s.into(),
            other => ApiError::invalid("body", other.to_string()),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let text = e.to_string();
        match e {
            RuntimeError::Store(s) => s.into(),
            RuntimeError::Tools(t) => t.into(),
            RuntimeError::InvalidInput(m) => ApiError::invalid("body", m),
            // Refused by the input pipeline (unknown command, `/resume`, a bad `@path`).
            RuntimeError::Input(m) => ApiError::invalid("input", format!("input: {m}")),
            // Without the holder's name (a worker's host and process are not the caller's
            // business), and with what to do about it.
            RuntimeError::SessionBusy { session, owner } => {
                tracing::debug!(%session, %owner, "refused: the session is being run");
                ApiError::conflict(format!(
                    "session {session} is being run by a worker; cancel its turn (POST /v1/sessions/{session}/cancel) or wait for it to finish"
                ))
                .id(session.to_string())
            }
            RuntimeError::LeaseLost { session }
            | RuntimeError::TurnActive { session, .. }
            | RuntimeError::TurnInProgress { session, .. }
            | RuntimeError::NoActiveTurn { session }
            | RuntimeError::TurnOpen { session, .. }
            | RuntimeError::Closed { session } => ApiError::conflict(text).id(session.to_string()),
            // Name the session to continue instead: the parent.
            RuntimeError::SubAgentSession { parent, .. } => {
                ApiError::conflict(text).id(parent.to_string())
            }
            RuntimeError::NoSuchToolCall { call, .. } => {
                ApiError::conflict(text).id(call.to_string())
            }
            RuntimeError::EffectNotUnknown { key, .. } => ApiError::conflict(text).id(key.0),
            RuntimeError::ApprovalWithdrawn { approval, .. } => {
                ApiError::conflict(text).id(approval.to_string())
            }
            // The node is stopping: try again (on it once it is back, or on another node).
            RuntimeError::ShuttingDown { session } => {
                ApiError::unavailable(text).id(session.to_string())
            }
            // The host's hook configuration is checked at start; never a caller's fault.
            RuntimeError::Config { .. }
            | RuntimeError::Release { .. }
            | RuntimeError::HookConfig { .. }
            | RuntimeError::Rejected { .. } => ApiError::internal(&text),
        }
    }
}

/// Why `keel serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listen address that does not parse.
    #[error("--listen {0:?} is not an address (use HOST:PORT, e.g. 127.0.0.1:7878)")]
    BadAddress(String),
    /// A non-loopback address without TLS or `--insecure-listen`.
    #[error(
        "refusing to listen on {0} without TLS: pass --tls-cert and --tls-key, or --insecure-listen if something in front terminates TLS"
    )]
    NeedsTls(String),
    /// Only one of `--tls-cert` / `--tls-key`.
    #[error("--tls-cert and --tls-key go together; pass both")]
    HalfTls,
    /// The certificate or key could not be read.
    #[error("TLS: {0}")]
    Tls(String),
    /// A workspace root that is not an existing directory.
    #[error("[server] workspace_roots: {path}: {reason}")]
    WorkspaceRoot {
        /// The configured root.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The settings file does not parse, or a value in it is refused: the message names the
    /// table and key (`[scheduler] concurrency: …`) or carries the TOML parser's, which points
    /// at the line.
    #[error("{0}")]
    Config(String),
    /// Binding the address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The store failed at start-up.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Setting up the tools failed.
    #[error("tools: {0}")]
    Tools(#[from] ToolsError),
}
