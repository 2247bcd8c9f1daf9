//! The inspector: a web page at `/` of `keel serve` to watch sessions live, decide approvals
//! and effects, read the journal (with time travel) and see usage.
//!
//! **What it serves.** Hand-written HTML, CSS and plain JavaScript embedded in the binary
//! ([`ASSETS`]: no build step, no CDN, works offline), and three routes outside `/v1` for
//! signing in ([`signin`] holds the design): `POST /inspector/sign-in` (`{"key": "keel_…"}` →
//! a session cookie and its CSRF token, the only answer that ever holds the token),
//! `GET /inspector/session` (who is signed in; needs the token like every cookie request) and
//! `POST /inspector/sign-out` (`?all=1`: every session of the key). Everything else the page shows
//! or does goes through the `/v1` API with the cookie ([`caller_by_cookie`]), so it is exactly
//! what the key's role and tenant allow, and every decision is journaled with its principal.
//!
//! **Headers.** Every response of the server ([`headers`], errors and 404/405 fallbacks
//! included) carries a strict `Content-Security-Policy` (scripts,
//! styles and connections from this origin only, no inline script, `frame-ancestors 'none'`),
//! `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`
//! and `Cache-Control: no-store` (unless the handler chose its own caching).

pub mod signin;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_store::Role;
use serde::{Deserialize, Serialize};

use crate::auth::{Caller, caller_by_hash, key_hash};
use crate::error::ApiError;
use crate::state::Shared;

/// One embedded file: its path under `/`, media type and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The path it is served at.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

/// The inspector's files. The page at `/` loads all of them (one page; the views are routes
/// of its `#` fragment), so their sum is the page's weight: at most [`MAX_PAGE_BYTES`].
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("assets/index.html"),
    },
    Asset {
        path: "/inspector/app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("assets/app.css"),
    },
    Asset {
        path: "/inspector/app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/app.js"),
    },
    Asset {
        path: "/inspector/pages.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/pages.js"),
    },
    Asset {
        path: "/inspector/session.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/session.js"),
    },
    Asset {
        path: "/inspector/journal.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/journal.js"),
    },
    Asset {
        path: "/inspector/icon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("assets/icon.svg"),
    },
];

/// The most a page of the inspector may weigh with all its assets, bytes.
pub const MAX_PAGE_BYTES: usize = 300 * 1024;

/// The inspector's `Content-Security-Policy`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The routes of the inspector (the page, its files, sign-in, session, sign-out).
pub fn router() -> Router<Shared> {
    let mut r = Router::new();
    for a in ASSETS {
        let asset = *a;
        r = r.route(
            asset.path,
            get(move || async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static(asset.content_type),
                    )],
                    asset.bytes,
                )
            }),
        );
    }
    r.route("/inspector/sign-in", post(sign_in))
        .route("/inspector/session", get(session))
        .route("/inspector/sign-out", post(sign_out))
}

/// Middleware, on the whole server (the `/v1` answers the page reads can be opened by URL too,
/// and the 404/405 fallbacks echo the path): the security headers of every response, and
/// `Cache-Control: no-store` where a handler set no caching of its own.
pub async fn headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

/// Whether the cookie is `Secure` and `__Host-` (TLS here, or an `https` `public_url`).
fn tls(state: &Shared) -> bool {
    state.config.secure_cookies()
}

/// The browser-side origin check of `headers` ([`signin::same_origin`]) with this server's
/// settings.
fn same_origin(state: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    signin::same_origin(headers, tls(state), state.config.public_origin().as_deref())
}

/// Who a request with the inspector's cookie acts for: the key its session was signed in with,
/// checked again now (revoked or expired: 401, and every session of that key ends). Every
/// method, GET included, must pass [`signin::same_origin`] and carry the session's CSRF token
/// ([`signin::check_token`]): the cookie reaches any server of this host, the token does not.
///
/// # Errors
/// 401 for an unknown or ended session (sign in again) or a key no longer valid; 403 for a
/// failed CSRF check; store errors.
pub async fn caller_by_cookie(
    state: &Shared,
    id: &str,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let signed = state.inspector.lookup(id).ok_or_else(ended)?;
    same_origin(state, headers)?;
    signin::check_token(headers, &signed.csrf)?;
    checked_key(state, &signed.key_hash).await
}

/// The caller of a signed-in key, checked now; a key no longer valid ends all its sessions.
async fn checked_key(state: &Shared, key_hash: &str) -> Result<Caller, ApiError> {
    let found = caller_by_hash(state.store.as_ref(), key_hash).await;
    if found
        .as_ref()
        .is_err_and(|e| e.status == StatusCode::UNAUTHORIZED)
    {
        state.inspector.remove_key(key_hash);
    }
    found
}

fn ended() -> ApiError {
    ApiError::unauthorized(
        "the inspector session has ended (signed out, expired, or the server restarted): sign in again",
    )
}

/// `POST /inspector/sign-in`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignInRequest {
    /// The API key (`keel_…`).
    pub key: String,
}

/// The API key a sign-in body carries ([`SignInRequest`]), trimmed.
///
/// # Errors
/// 400 for a body that is not JSON; 422 (`key`) for one that does not fit [`SignInRequest`]
/// or carries a blank key.
pub fn sign_in_key(body: &[u8]) -> Result<String, ApiError> {
    let req: SignInRequest = crate::http::parse_json(body)?;
    let key = req.key.trim();
    if key.is_empty() {
        return Err(ApiError::invalid("key", "paste an API key (keel_…)"));
    }
    Ok(key.to_owned())
}

/// Who is signed in: the answer of sign-in and of `GET /inspector/session`.
#[derive(Debug, Serialize)]
pub struct SignedInBody {
    /// The key's role: `viewer`, `operator` or `admin`.
    pub role: String,
    /// The key's tenant.
    pub tenant_id: String,
    /// The key's principal (the journal names it for every change made here).
    pub principal_id: String,
    /// The token every request with the cookie must carry in `X-Keel-CSRF`: in the sign-in
    /// answer only (absent from `GET /inspector/session`, so the cookie cannot recover it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csrf_token: Option<String>,
    /// Seconds until the session ends at the latest.
    pub expires_in_s: u64,
}

fn body_of(caller: &Caller, signed: &signin::Signed, with_token: bool) -> SignedInBody {
    SignedInBody {
        role: caller.role.as_str().to_owned(),
        tenant_id: caller.tenant.map(|t| t.to_string()).unwrap_or_default(),
        principal_id: caller.principal_id.to_string(),
        csrf_token: with_token.then(|| signed.csrf.clone()),
        expires_in_s: signed.expires_in_s,
    }
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
        .into_response()
}

/// Signs in with an API key: checks it (401 for a key that is not valid, 403 for a system key,
/// 429 after too many failures), starts a server-side session and sets its cookie.
async fn sign_in(
    State(state): State<Shared>,
    extensions: Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let client = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default();
    match do_sign_in(&state, &client, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn do_sign_in(
    state: &Shared,
    client: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    same_origin(state, headers)?;
    let key = sign_in_key(body)?;
    let hash = key_hash(&key);
    let caller = match caller_by_hash(state.store.as_ref(), &hash).await {
        Ok(c) => c,
        Err(e) => {
            if e.status == StatusCode::UNAUTHORIZED {
                // Only a wrong key is limited, and only for the client that sent it.
                state.inspector.check_rate(client)?;
                state.inspector.failed(client);
            }
            return Err(e.field("key"));
        }
    };
    if caller.role == Role::System {
        return Err(ApiError::forbidden(
            "a system key manages tenants and sees nothing inside one: sign in with a key of a tenant",
        )
        .field("key"));
    }
    let (id, signed) = state.inspector.create(&hash)?;
    let mut res = json_response(StatusCode::OK, &body_of(&caller, &signed, true));
    let name = signin::cookie_name(headers, tls(state));
    if let Ok(v) = HeaderValue::from_str(&signin::set_cookie(&name, &id, tls(state))) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(res)
}

/// Who is signed in with this request's cookie and token (401 when nobody; 403 without the
/// token). The answer never holds the token.
async fn session(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let run = async {
        let id = state
            .inspector
            .session_cookie(&headers, tls(&state))
            .ok_or_else(ended)?;
        let signed = state.inspector.lookup(&id).ok_or_else(ended)?;
        same_origin(&state, &headers)?;
        signin::check_token(&headers, &signed.csrf)?;
        let caller = checked_key(&state, &signed.key_hash).await?;
        Ok::<_, ApiError>(json_response(
            StatusCode::OK,
            &body_of(&caller, &signed, false),
        ))
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Ends this request's session (CSRF-checked) and clears the cookie: 204. With `?all=1`, ends
/// every session of the same key too ("sign out everywhere": a cookie that leaked stops
/// working without revoking the key).
async fn sign_out(
    State(state): State<Shared>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let id = state
            .inspector
            .session_cookie(&headers, tls(&state))
            .ok_or_else(ended)?;
        let signed = state.inspector.lookup(&id).ok_or_else(ended)?;
        same_origin(&state, &headers)?;
        signin::check_token(&headers, &signed.csrf)?;
        state.inspector.remove(&id);
        if uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "all=1"))
        {
            state.inspector.remove_key(&signed.key_hash);
        }
        let mut res = StatusCode::NO_CONTENT.into_response();
        let name = signin::cookie_name(&headers, tls(&state));
        if let Ok(v) = HeaderValue::from_str(&signin::clear_cookie(&name, tls(&state))) {
            res.headers_mut().insert(header::SET_COOKIE, v);
        }
        Ok::<_, ApiError>(res)
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_assets_fit_the_budget() {
        let total: usize = ASSETS.iter().map(|a| a.bytes.len()).sum();
        assert!(total <= MAX_PAGE_BYTES, "{total} bytes");
        let html = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        for a in &ASSETS[1..] {
            assert!(html.contains(a.path), "index.html does not load {}", a.path);
        }
        // No inline script or style: the policy would refuse it.
        assert!(!html.contains("<script>") && !html.contains("style="));
        assert!(!html.contains("<style"));
    }

    /// The `--name: #rrggbb` colours of the first `:root` block after `from` in the stylesheet.
    fn palette(css: &str, from: &str) -> std::collections::HashMap<String, [f64; 3]> {
        let at = css.find(from).unwrap();
        let block = &css[at..];
        let block = &block[block.find(":root").unwrap()..];
        let block = &block[block.find('{').unwrap() + 1..];
        let block = &block[..block.find('}').unwrap()];
        block
            .split(';')
            .filter_map(|d| d.trim().split_once(':'))
            .filter_map(|(k, v)| {
                let hex = v.trim().strip_prefix('#')?;
                let c = |i: usize| f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap());
                Some((k.trim().to_owned(), [c(0), c(2), c(4)]))
            })
            .collect()
    }

    /// WCAG 2.x contrast ratio of two sRGB colours (0..=255 channels).
    fn contrast(a: [f64; 3], b: [f64; 3]) -> f64 {
        let lum = |c: [f64; 3]| {
            let lin = |v: f64| {
                let v = v / 255.0;
                if v <= 0.03928 {
                    v / 12.92
                } else {
                    ((v + 0.055) / 1.055).powf(2.4)
                }
            };
            0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2])
        };
        let (x, y) = (lum(a), lum(b));
        (x.max(y) + 0.05) / (x.min(y) + 0.05)
    }

    /// Review item 5: buttons, links, badges and muted text reach WCAG AA (4.5:1) in light and
    /// in dark.
    #[test]
    fn text_and_buttons_reach_wcag_aa_in_light_and_dark() {
        let css = std::str::from_utf8(
            ASSETS
                .iter()
                .find(|a| a.path.ends_with(".css"))
                .unwrap()
                .bytes,
        )
        .unwrap();
        assert!((contrast([0.0; 3], [255.0; 3]) - 21.0).abs() < 0.01);
        for (mode, from) in [("light", "/* Keel"), ("dark", "prefers-color-scheme: dark")] {
            let p = palette(css, from);
            for (fg, bg) in [
                ("--on-accent", "--accent"),
                ("--fail", "--panel"),
                ("--fg", "--panel"),
                ("--fg", "--bg"),
                ("--muted", "--bg"),
                ("--muted", "--panel"),
                ("--accent", "--bg"),
                ("--accent", "--panel"),
                ("--ok", "--bg"),
                ("--fail", "--bg"),
                ("--wait", "--bg"),
                ("--run", "--bg"),
                ("--off", "--bg"),
            ] {
                let (a, b) = (p.get(fg), p.get(bg));
                let (Some(a), Some(b)) = (a, b) else {
                    panic!("{mode}: {fg} or {bg} is not in the palette")
                };
                let r = contrast(*a, *b);
                assert!(r >= 4.5, "{mode}: {fg} on {bg} is {r:.2}:1");
            }
        }
    }
}
