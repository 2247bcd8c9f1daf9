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
//! - [`Client`] (here: construction and the transport) — one method per operation the CLI
//!   uses, plus [`Client::get_json`] / [`Client::post_json`] for the rest. Start reading here.
//!   The operations are in `runs` (releases, sessions, turns, state, events), `decisions`
//!   (approvals, effects, a session's lifecycle) and `admin` (health, listings, artifacts, usage,
//!   memory, tenants, keys).
//! - [`error`] — [`Error`]; [`sse`] — [`EventStream`], [`StreamItem`], [`Reconnect`].
//!
//! TLS is rustls with the ring provider (the server's); `https://` URLs are verified against
//! the platform's roots, or against [`ClientOptions::ca_pem`] when given.

mod admin;
mod decisions;
pub mod error;
mod runs;
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
}
