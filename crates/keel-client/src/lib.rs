//! # keel-client — a typed Rust client of Keel's HTTP API (`keel serve`)
//!
//! **Owns:** requests to `/v1` with a bearer key, decoding responses into the `keel-api` wire
//! types, errors as one enum carrying the server's problem+json body ([`Error`]), the SSE event
//! stream with automatic `Last-Event-ID` reconnect ([`EventStream`]), and cursor pagination
//! ([`Client::all`]).
//!
//! **Must not touch:** the wire types (they are `keel-api`'s, shared with the server, so the
//! OpenAPI document and this client cannot drift), the kernel (it talks HTTP only), printing
//! (the `keel` binary renders what this returns).
//!
//! ## Layout
//! - [`Client`] (here) — one method per operation the CLI uses, plus [`Client::get_json`] /
//!   [`Client::post_json`] for the rest. Start reading here.
//! - [`error`] — [`Error`]; [`sse`] — [`EventStream`], [`StreamItem`], [`Reconnect`].
//!
//! TLS is rustls with the ring provider (the server's); `https://` URLs are verified against
//! the platform's roots, or against [`ClientOptions::ca_pem`] when given.

pub mod error;
pub mod sse;

use std::time::Duration;

pub use error::Error;
pub use keel_api as api;
use keel_api::{
    ApprovalBody, ApprovalDecisionParam, ApprovalPage, CancelledBody, CreateReleaseRequest,
    CreateSessionRequest, DecideApprovalRequest, DecideEffectRequest, EffectDecidedBody,
    EffectDecisionParam, EventPage, Problem, ReleaseBody, SessionBody, SessionPage, StateBody,
    SubmitTurnRequest, TurnBody,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
pub use sse::{EventStream, Reconnect, SessionStatusFrame, StatusStream, StreamItem};

/// The `operationId` of every operation in the server's `/openapi.json` that [`Client`] has a
/// typed method for (the method's name is the id, except `get_session_state` →
/// [`Client::session_state_at`], `session_events` → [`Client::events_page`] /
/// [`Client::stream_events`], `list_session_approvals` → [`Client::session_approvals`],
/// `tenant_events` → [`Client::tenant_events`], `openapi` → [`Client::openapi`]). A test
/// compares it with the document, so an operation without a method fails it.
pub const OPERATIONS: &[&str] = &[
    "healthz",
    "readyz",
    "openapi",
    "create_release",
    "list_releases",
    "get_release",
    "create_session",
    "list_sessions",
    "get_session",
    "update_session",
    "close_session",
    "delete_session",
    "get_session_state",
    "submit_turn",
    "list_turns",
    "get_turn",
    "cancel_turn",
    "cancel_tool_call",
    "session_events",
    "tenant_events",
    "list_artifacts",
    "get_artifact",
    "get_usage",
    "list_memory",
    "get_memory",
    "put_memory",
    "delete_memory",
    "list_approvals",
    "list_session_approvals",
    "get_approval",
    "decide_approval",
    "list_effects",
    "decide_effect",
    "create_tenant",
    "list_tenants",
    "get_tenant",
    "create_tenant_key",
    "create_key",
    "list_keys",
    "revoke_key",
];

/// How a [`Client`] is built.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// A PEM certificate (or bundle) to trust for `https://` instead of the platform's roots
    /// (a server with a self-signed certificate).
    pub ca_pem: Option<Vec<u8>>,
    /// Limit of each non-streaming request (default 60 s); streams have none.
    pub timeout: Option<Duration>,
}

/// A client of one server with one key. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
    timeout: Duration,
}

/// One page of a cursor-paginated list.
pub trait Page: DeserializeOwned {
    /// The item type.
    type Item;
    /// Takes the items and the next cursor (`None` on the last page).
    fn into_parts(self) -> (Vec<Self::Item>, Option<String>);
}

macro_rules! page {
    ($($page:ty => $item:ty),* $(,)?) => {$(
        impl Page for $page {
            type Item = $item;
            fn into_parts(self) -> (Vec<$item>, Option<String>) {
                (self.items, self.next_cursor)
            }
        }
    )*};
}

page!(
    SessionPage => SessionBody,
    ApprovalPage => ApprovalBody,
    keel_api::TurnPage => TurnBody,
    keel_api::ReleasePage => ReleaseBody,
    keel_api::KeyPage => keel_api::KeyBody,
    keel_api::TenantPage => keel_api::TenantBody,
    keel_api::EffectPage => keel_api::EffectBody,
    keel_api::ArtifactPage => keel_api::ArtifactInfoBody,
    keel_api::MemoryPage => keel_api::MemoryBody,
);

/// A path segment percent-encoded (ids are UUIDs, but operation keys hold `/`).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The response if it is a success; its problem (or status) as an [`Error`] otherwise.
async fn check(url: &str, resp: reqwest::Response) -> Result<reqwest::Response, Error> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    match serde_json::from_slice::<Problem>(&bytes) {
        Ok(problem) => Err(Error::Api {
            status: status.as_u16(),
            problem: Box::new(problem),
        }),
        Err(_) => {
            let text = String::from_utf8_lossy(&bytes);
            let body: String = text.chars().take(500).collect();
            Err(Error::Status {
                status: status.as_u16(),
                url: url.to_owned(),
                body,
            })
        }
    }
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:7878`, `https://keel.example`),
    /// sending `key` as a bearer token (`None`: only the unauthenticated routes work).
    ///
    /// # Errors
    /// [`Error::Config`] for a URL that is not `http://` or `https://`, a key that is not a
    /// valid header value, or a CA file that does not parse.
    pub fn new(base_url: &str, key: Option<&str>) -> Result<Self, Error> {
        Self::with_options(base_url, key, &ClientOptions::default())
    }

    /// As [`Client::new`], with options.
    ///
    /// # Errors
    /// As [`Client::new`].
    pub fn with_options(
        base_url: &str,
        key: Option<&str>,
        options: &ClientOptions,
    ) -> Result<Self, Error> {
        let base = base_url.trim().trim_end_matches('/').to_owned();
        let rest = base
            .strip_prefix("http://")
            .or_else(|| base.strip_prefix("https://"))
            .ok_or_else(|| {
                Error::Config(format!(
                    "server URL {base_url:?} must start with http:// or https:// (e.g. http://127.0.0.1:7878)"
                ))
            })?;
        if rest.is_empty() || rest.starts_with('/') {
            return Err(Error::Config(format!(
                "server URL {base_url:?} has no host"
            )));
        }
        if let Some(k) = key
            && (k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(Error::Config(
                "the API key is empty or holds spaces or non-ASCII characters".into(),
            ));
        }
        // reqwest's rustls backend takes the process-wide provider; ring is the one the
        // server uses too. Installing twice is harmless (the first one stays).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(Duration::from_secs(10));
        if let Some(pem) = &options.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::Config(format!("the CA certificate does not parse: {e}")))?;
            builder = builder.tls_certs_only(certs);
        }
        let http = builder
            .build()
            .map_err(|e| Error::Config(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Self {
            base,
            key: key.map(str::to_owned),
            http,
            timeout: options.timeout.unwrap_or(Duration::from_secs(60)),
        })
    }

    /// The server's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn segment(&self, s: &str) -> String {
        encode_segment(s)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        path: &str,
        req: reqwest::RequestBuilder,
        what: &'static str,
    ) -> Result<T, Error> {
        let url = self.url(path);
        let resp = req
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        let resp = check(&url, resp).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            url,
            what,
            detail: e.to_string(),
        })
    }

    /// `GET path?query` as `T` (the query's names and values are percent-encoded here).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, Error> {
        let mut full = path.to_owned();
        for (i, (k, v)) in query.iter().enumerate() {
            full.push(if i == 0 { '?' } else { '&' });
            full.push_str(&encode_segment(k));
            full.push('=');
            full.push_str(&encode_segment(v));
        }
        let req = self.request(reqwest::Method::GET, &full);
        self.send(&full, req, std::any::type_name::<T>()).await
    }

    /// `POST path` with a JSON body, as `T`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn post_json<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, Error> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::Config(format!("cannot encode the request body: {e}")))?;
        let req = self
            .request(reqwest::Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
        self.send(path, req, std::any::type_name::<T>()).await
    }

    /// Every item of a cursor-paginated list at `path`, following `next_cursor` to the end.
    /// `query` is sent with each page (with `cursor` added).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn all<P: Page>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<P::Item>, Error> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q: Vec<(&str, String)> = query.to_vec();
            if let Some(c) = cursor.take() {
                q.push(("cursor", c));
            }
            let page: P = self.get_json(path, &q).await?;
            let (mut page_items, next) = page.into_parts();
            items.append(&mut page_items);
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok(items),
            }
        }
    }

    /// `POST /v1/releases`: stores a release (the same definition returns the same id).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a key that is not an admin's.
    pub async fn create_release(&self, body: &CreateReleaseRequest) -> Result<ReleaseBody, Error> {
        self.post_json("/v1/releases", body).await
    }

    /// `GET /v1/releases/{release_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_release(&self, release: &str) -> Result<ReleaseBody, Error> {
        let path = format!("/v1/releases/{}", encode_segment(release));
        self.get_json(&path, &[]).await
    }

    /// `POST /v1/sessions`.
    ///
    /// # Errors
    /// See [`Error`]; 403 naming `workspace_roots`, `max_permission_mode` or `allow_sandbox_off`.
    pub async fn create_session(&self, body: &CreateSessionRequest) -> Result<SessionBody, Error> {
        self.post_json("/v1/sessions", body).await
    }

    /// `GET /v1/sessions/{session_id}`.
    ///
    /// # Errors
    /// See [`Error`]; 404 for an unknown session.
    pub async fn get_session(&self, session: &str) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}", encode_segment(session));
        self.get_json(&path, &[]).await
    }

    /// Every session (optionally in one `status`), oldest first.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_sessions(&self, status: Option<&str>) -> Result<Vec<SessionBody>, Error> {
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(s) = status {
            q.push(("status", s.to_owned()));
        }
        self.all::<SessionPage>("/v1/sessions", &q).await
    }

    /// `GET /v1/sessions/{session_id}/state`: the session folded from its journal.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn session_state(&self, session: &str) -> Result<StateBody, Error> {
        self.session_state_at(session, None).await
    }

    /// `GET /v1/sessions/{session_id}/state?at=SEQ`: the session folded from its journal up to
    /// seq `at` (`None`: all of it).
    ///
    /// # Errors
    /// See [`Error`]; 404 for an unknown session.
    pub async fn session_state_at(
        &self,
        session: &str,
        at: Option<u64>,
    ) -> Result<StateBody, Error> {
        let path = format!("/v1/sessions/{}/state", encode_segment(session));
        let q: Vec<(&str, String)> = at.map(|a| ("at", a.to_string())).into_iter().collect();
        self.get_json(&path, &q).await
    }

    /// `POST /v1/sessions/{session_id}/turns` (the session's multitask setting applies).
    ///
    /// # Errors
    /// See [`Error`]; 409 for a closed session or a refused second input.
    pub async fn submit_turn(&self, session: &str, input: &str) -> Result<TurnBody, Error> {
        self.submit_turn_with(session, input, None, None).await
    }

    /// `POST /v1/sessions/{session_id}/turns` with this request's `multitask` strategy (`None`:
    /// the session's setting) and `priority` (-100..=100, higher first; `None`: 0).
    ///
    /// # Errors
    /// See [`Error`]; 409 for a closed session or a second input refused (`reject`), 422 for a
    /// priority out of range.
    pub async fn submit_turn_with(
        &self,
        session: &str,
        input: &str,
        multitask: Option<keel_api::MultitaskParam>,
        priority: Option<i32>,
    ) -> Result<TurnBody, Error> {
        let path = format!("/v1/sessions/{}/turns", encode_segment(session));
        let body = SubmitTurnRequest {
            input: input.to_owned(),
            multitask,
            priority,
        };
        self.post_json(&path, &body).await
    }

    /// `POST /v1/sessions/{session_id}/turns` for input that may be a slash command: the
    /// server's input pipeline answers a command itself ([`keel_api::InputOutcome::Command`]:
    /// `/help`, `/cost`, `/status`, `/permissions`, `/compact [focus]`, `/model NAME`, `/clear`
    /// with the new session's id) or queues a turn ([`keel_api::InputOutcome::Turn`]; `@path`
    /// mentions attach workspace files).
    ///
    /// # Errors
    /// See [`Error`]; 422 naming `input` for an unknown command, `/resume` (terminal only) or
    /// an `@path` that is missing, outside the workspace or denied; as [`Client::submit_turn`].
    pub async fn submit_input(
        &self,
        session: &str,
        input: &str,
    ) -> Result<keel_api::InputOutcome, Error> {
        let path = format!("/v1/sessions/{}/turns", encode_segment(session));
        let body = SubmitTurnRequest {
            input: input.to_owned(),
            multitask: None,
            priority: None,
        };
        self.post_json(&path, &body).await
    }

    /// `GET /v1/sessions/{session_id}/turns/{turn_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_turn(&self, session: &str, turn: &str) -> Result<TurnBody, Error> {
        let path = format!(
            "/v1/sessions/{}/turns/{}",
            encode_segment(session),
            encode_segment(turn)
        );
        self.get_json(&path, &[]).await
    }

    /// One page of a session's journal: events with `seq > after`, at most `limit` (1 to 1000).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn events_page(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<EventPage, Error> {
        let path = format!("/v1/sessions/{}/events", encode_segment(session));
        self.get_json(
            &path,
            &[("after", after.to_string()), ("limit", limit.to_string())],
        )
        .await
    }

    /// A session's whole journal from `seq > after`, page by page.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn events(&self, session: &str, after: u64) -> Result<Vec<serde_json::Value>, Error> {
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let page = self.events_page(session, after, 1000).await?;
            out.extend(page.items);
            if !page.has_more || page.next_after == after {
                return Ok(out);
            }
            after = page.next_after;
        }
    }

    /// The live event stream of `session` after seq `after`, reconnecting per `policy`.
    ///
    /// # Errors
    /// As the first connection: see [`EventStream::open`].
    pub async fn stream_events(
        &self,
        session: &str,
        after: u64,
        policy: Reconnect,
    ) -> Result<EventStream, Error> {
        EventStream::open(self.clone(), session, after, policy).await
    }

    /// A session's approvals (optionally in one `status`), oldest first.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn session_approvals(
        &self,
        session: &str,
        status: Option<&str>,
    ) -> Result<Vec<ApprovalBody>, Error> {
        let path = format!("/v1/sessions/{}/approvals", encode_segment(session));
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(s) = status {
            q.push(("status", s.to_owned()));
        }
        self.all::<ApprovalPage>(&path, &q).await
    }

    /// `GET /v1/approvals/{approval_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_approval(&self, approval: &str) -> Result<ApprovalBody, Error> {
        let path = format!("/v1/approvals/{}", encode_segment(approval));
        self.get_json(&path, &[]).await
    }

    /// Decides an approval, bound to the `args_hash` the decider saw.
    ///
    /// # Errors
    /// See [`Error`]; 409 when it was decided otherwise or expired.
    pub async fn decide_approval(
        &self,
        approval: &str,
        decision: ApprovalDecisionParam,
        args_hash: &str,
        reason: Option<&str>,
    ) -> Result<ApprovalBody, Error> {
        let path = format!("/v1/approvals/{}/decision", encode_segment(approval));
        let body = DecideApprovalRequest {
            decision,
            args_hash: args_hash.to_owned(),
            reason: reason.map(str::to_owned),
        };
        self.post_json(&path, &body).await
    }

    /// A session's effects, optionally in one `status` (`outcome_unknown`).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_effects(
        &self,
        session: &str,
        status: Option<&str>,
    ) -> Result<Vec<keel_api::EffectBody>, Error> {
        let path = format!("/v1/sessions/{}/effects", encode_segment(session));
        let q: Vec<(&str, String)> = status
            .map(|s| ("status", s.to_owned()))
            .into_iter()
            .collect();
        self.all::<keel_api::EffectPage>(&path, &q).await
    }

    /// Says what an `outcome_unknown` effect did.
    ///
    /// # Errors
    /// See [`Error`]; 409 when the effect is not waiting for a decision.
    pub async fn decide_effect(
        &self,
        session: &str,
        operation_key: &str,
        decision: EffectDecisionParam,
        reason: Option<&str>,
    ) -> Result<EffectDecidedBody, Error> {
        let path = format!(
            "/v1/sessions/{}/effects/{}/decision",
            encode_segment(session),
            encode_segment(operation_key)
        );
        let body = DecideEffectRequest {
            decision,
            reason: reason.map(str::to_owned),
        };
        self.post_json(&path, &body).await
    }

    /// `POST /v1/sessions/{session_id}/close` with `If-Match: "version"` (the session's ETag as
    /// [`SessionBody::version`] gives it): closes the session for good. Closing a closed session
    /// succeeds.
    ///
    /// # Errors
    /// See [`Error`]; 409 while a turn is open, 412 when the session's version is no longer
    /// `version` (read it again and retry).
    pub async fn close_session(&self, session: &str, version: u64) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}/close", encode_segment(session));
        let req = self
            .request(reqwest::Method::POST, &path)
            .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body("{}");
        self.send(&path, req, std::any::type_name::<SessionBody>())
            .await
    }

    /// `PATCH /v1/sessions/{session_id}` with `If-Match: "version"` (the session's ETag as
    /// [`SessionBody::version`] gives it): changes the settings `body` names, between turns,
    /// journaled as `session.config_changed`; absent fields stay. With `body.release_id`, also
    /// re-pins the session to that release of the tenant (`session.release_pinned` naming the
    /// old and the new release, in the same commit as the settings change): its next turn runs
    /// that release's model route, tools and policy.
    ///
    /// # Errors
    /// See [`Error`]; 403 for a viewer's key or a setting beyond the server's limits, 404 for an
    /// unknown release (problem `field` `release_id`), 409 while a turn runs (to re-pin: while
    /// one is active at all) or when the session is closed, 412 when the session's version is no
    /// longer `version` (read it again and retry), 422 for an invalid value. Nothing changes on
    /// an error.
    pub async fn update_session(
        &self,
        session: &str,
        version: u64,
        body: &keel_api::UpdateSessionRequest,
    ) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}", encode_segment(session));
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::Config(format!("cannot encode the request body: {e}")))?;
        let req = self
            .request(reqwest::Method::PATCH, &path)
            .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
        self.send(&path, req, std::any::type_name::<SessionBody>())
            .await
    }

    /// `POST /v1/sessions/{session_id}/cancel`: cancels the running (or oldest queued) turn.
    ///
    /// # Errors
    /// See [`Error`]; 409 when no turn is running or queued.
    pub async fn cancel_turn(&self, session: &str) -> Result<CancelledBody, Error> {
        let path = format!("/v1/sessions/{}/cancel", encode_segment(session));
        self.post_json(&path, &keel_api::CancelRequest {}).await
    }

    /// A request with a JSON body (or none) and an optional `If-Match: "version"`, as `T`
    /// (`None` for a 204).
    async fn send_body<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        if_match: Option<u64>,
        body: Option<&impl Serialize>,
    ) -> Result<Option<T>, Error> {
        let url = self.url(path);
        let mut req = self.request(method, path).timeout(self.timeout);
        if let Some(v) = if_match {
            req = req.header(reqwest::header::IF_MATCH, format!("\"{v}\""));
        }
        if let Some(b) = body {
            let bytes = serde_json::to_vec(b)
                .map_err(|e| Error::Config(format!("cannot encode the request body: {e}")))?;
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        let resp = check(&url, resp).await?;
        if resp.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Decode {
                url,
                what: std::any::type_name::<T>(),
                detail: e.to_string(),
            })
    }

    /// `GET /healthz`: the process is up (needs no key).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn healthz(&self) -> Result<keel_api::HealthBody, Error> {
        self.get_json("/healthz", &[]).await
    }

    /// `GET /readyz`: the store is reachable and migrated and the node is not draining (needs no
    /// key).
    ///
    /// # Errors
    /// See [`Error`]; 503 when not ready.
    pub async fn readyz(&self) -> Result<keel_api::HealthBody, Error> {
        self.get_json("/readyz", &[]).await
    }

    /// `GET /openapi.json`: the OpenAPI 3.1 document (needs no key).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn openapi(&self) -> Result<serde_json::Value, Error> {
        self.get_json("/openapi.json", &[]).await
    }

    /// Every release of the tenant (`GET /v1/releases`, followed to the last page).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_releases(&self) -> Result<Vec<ReleaseBody>, Error> {
        self.all::<keel_api::ReleasePage>("/v1/releases", &[("limit", "1000".to_owned())])
            .await
    }

    /// `DELETE /v1/sessions/{session_id}` with `If-Match: "version"`: deletes the session and
    /// everything it owns.
    ///
    /// # Errors
    /// See [`Error`]; 409 while a turn is active or queued, 412 for a stale `version`.
    pub async fn delete_session(&self, session: &str, version: u64) -> Result<(), Error> {
        let path = format!("/v1/sessions/{}", encode_segment(session));
        self.send_body::<serde_json::Value>(
            reqwest::Method::DELETE,
            &path,
            Some(version),
            None::<&()>,
        )
        .await
        .map(drop)
    }

    /// Every turn of a session in the order they were queued.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_turns(&self, session: &str) -> Result<Vec<TurnBody>, Error> {
        let path = format!("/v1/sessions/{}/turns", encode_segment(session));
        self.all::<keel_api::TurnPage>(&path, &[("limit", "1000".to_owned())])
            .await
    }

    /// `POST /v1/sessions/{session_id}/tool_calls/{tool_call_id}/cancel`: the running call gets
    /// a `cancelled` result and the turn goes on.
    ///
    /// # Errors
    /// See [`Error`]; 409 when the call is not running.
    pub async fn cancel_tool_call(
        &self,
        session: &str,
        tool_call: &str,
    ) -> Result<CancelledBody, Error> {
        let path = format!(
            "/v1/sessions/{}/tool_calls/{}/cancel",
            encode_segment(session),
            encode_segment(tool_call)
        );
        self.post_json(&path, &keel_api::CancelRequest {}).await
    }

    /// `GET /v1/events`: the tenant's live stream of session status changes.
    ///
    /// # Errors
    /// See [`StatusStream::open`].
    pub async fn tenant_events(&self) -> Result<StatusStream, Error> {
        StatusStream::open(self).await
    }

    /// Every artifact of a session (without its bytes).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_artifacts(
        &self,
        session: &str,
    ) -> Result<Vec<keel_api::ArtifactInfoBody>, Error> {
        let path = format!("/v1/sessions/{}/artifacts", encode_segment(session));
        self.all::<keel_api::ArtifactPage>(&path, &[("limit", "1000".to_owned())])
            .await
    }

    /// One chunk of an artifact's text from byte `offset`, at most `limit` bytes (`None`: the
    /// server's default, 64 KiB); follow `next_offset` for the rest.
    ///
    /// # Errors
    /// See [`Error`]; 400 for an offset beyond the end.
    pub async fn get_artifact(
        &self,
        artifact: &str,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<keel_api::ArtifactChunkBody, Error> {
        let path = format!("/v1/artifacts/{}", encode_segment(artifact));
        let mut q = vec![("offset", offset.to_string())];
        if let Some(l) = limit {
            q.push(("limit", l.to_string()));
        }
        self.get_json(&path, &q).await
    }

    /// `GET /v1/usage`: the tenant's usage and cost by day and model, days `from..=to`
    /// (`YYYY-MM-DD`; `None`: the server's default range).
    ///
    /// # Errors
    /// See [`Error`]; 400 when `from` is after `to`.
    pub async fn get_usage(
        &self,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<keel_api::UsageReport, Error> {
        let mut q = Vec::new();
        if let Some(f) = from {
            q.push(("from", f.to_owned()));
        }
        if let Some(t) = to {
            q.push(("to", t.to_owned()));
        }
        self.get_json("/v1/usage", &q).await
    }

    /// Every memory entry of `namespace` by key, or with `q` those the full-text search finds
    /// (every word of `q` as a word or the start of one in the key or value), best match first.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_memory(
        &self,
        namespace: &str,
        q: Option<&str>,
    ) -> Result<Vec<keel_api::MemoryBody>, Error> {
        let path = format!("/v1/memory/{}", encode_segment(namespace));
        let mut query = vec![("limit", "1000".to_owned())];
        if let Some(q) = q {
            query.push(("q", q.to_owned()));
        }
        self.all::<keel_api::MemoryPage>(&path, &query).await
    }

    /// `GET /v1/memory/{namespace}/{key}`.
    ///
    /// # Errors
    /// See [`Error`]; 404 for a missing key.
    pub async fn get_memory(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<keel_api::MemoryBody, Error> {
        let path = format!(
            "/v1/memory/{}/{}",
            encode_segment(namespace),
            encode_segment(key)
        );
        self.get_json(&path, &[]).await
    }

    /// `PUT /v1/memory/{namespace}/{key}`: stores `value` (replacing what was there).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a viewer's key.
    pub async fn put_memory(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
    ) -> Result<keel_api::MemoryBody, Error> {
        let path = format!(
            "/v1/memory/{}/{}",
            encode_segment(namespace),
            encode_segment(key)
        );
        let body = keel_api::PutMemoryRequest { value };
        self.send_body(reqwest::Method::PUT, &path, None, Some(&body))
            .await?
            .ok_or_else(|| Error::Decode {
                url: self.url(&path),
                what: "a memory entry",
                detail: "the server answered 204 with no body".into(),
            })
    }

    /// `DELETE /v1/memory/{namespace}/{key}` (idempotent: a missing entry is no error).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a viewer's key.
    pub async fn delete_memory(&self, namespace: &str, key: &str) -> Result<(), Error> {
        let path = format!(
            "/v1/memory/{}/{}",
            encode_segment(namespace),
            encode_segment(key)
        );
        self.send_body::<serde_json::Value>(reqwest::Method::DELETE, &path, None, None::<&()>)
            .await
            .map(drop)
    }

    /// Every approval of the tenant, optionally in one `status` (`pending`: what waits on a
    /// human).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_approvals(&self, status: Option<&str>) -> Result<Vec<ApprovalBody>, Error> {
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(s) = status {
            q.push(("status", s.to_owned()));
        }
        self.all::<ApprovalPage>("/v1/approvals", &q).await
    }

    /// `POST /v1/tenants` (a system key).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a tenant's key.
    pub async fn create_tenant(&self, name: &str) -> Result<keel_api::TenantBody, Error> {
        let body = keel_api::CreateTenantRequest {
            name: name.to_owned(),
        };
        self.post_json("/v1/tenants", &body).await
    }

    /// Every tenant (a system key).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a tenant's key.
    pub async fn list_tenants(&self) -> Result<Vec<keel_api::TenantBody>, Error> {
        self.all::<keel_api::TenantPage>("/v1/tenants", &[("limit", "1000".to_owned())])
            .await
    }

    /// `GET /v1/tenants/{tenant_id}` (a system key).
    ///
    /// # Errors
    /// See [`Error`]; 404 for an unknown tenant.
    pub async fn get_tenant(&self, tenant: &str) -> Result<keel_api::TenantBody, Error> {
        let path = format!("/v1/tenants/{}", encode_segment(tenant));
        self.get_json(&path, &[]).await
    }

    /// `POST /v1/tenants/{tenant_id}/keys` (a system key): a key of that tenant, shown only in
    /// this answer.
    ///
    /// # Errors
    /// See [`Error`]; 422 for an `expires_at` in the past.
    pub async fn create_tenant_key(
        &self,
        tenant: &str,
        body: &keel_api::CreateKeyRequest,
    ) -> Result<keel_api::CreatedKeyBody, Error> {
        let path = format!("/v1/tenants/{}/keys", encode_segment(tenant));
        self.post_json(&path, body).await
    }

    /// `POST /v1/keys` (a tenant admin): a key of the caller's tenant, shown only in this
    /// answer.
    ///
    /// # Errors
    /// See [`Error`]; 403 for a key that is not an admin's, 422 for an `expires_at` in the past.
    pub async fn create_key(
        &self,
        body: &keel_api::CreateKeyRequest,
    ) -> Result<keel_api::CreatedKeyBody, Error> {
        self.post_json("/v1/keys", body).await
    }

    /// Every key of the caller's tenant (hashes never leave the server; `prefix` names a key).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_keys(&self) -> Result<Vec<keel_api::KeyBody>, Error> {
        self.all::<keel_api::KeyPage>("/v1/keys", &[("limit", "1000".to_owned())])
            .await
    }

    /// `POST /v1/keys/{key_id}/revoke`: revokes a key for good (twice is fine).
    ///
    /// # Errors
    /// See [`Error`]; 404 for another tenant's key.
    pub async fn revoke_key(&self, key: &str) -> Result<keel_api::KeyBody, Error> {
        let path = format!("/v1/keys/{}/revoke", encode_segment(key));
        self.send_body(reqwest::Method::POST, &path, None, None::<&()>)
            .await?
            .ok_or_else(|| Error::Decode {
                url: self.url(&path),
                what: "a key",
                detail: "the server answered 204 with no body".into(),
            })
    }
}
