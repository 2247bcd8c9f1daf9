//! The inspector's server-side sign-in sessions, its cookie and its CSRF checks.
//!
//! **Where sessions live: in this process's memory.** A session is a short-lived cache of one
//! key check (the key's hash, a CSRF token, two deadlines): nothing in it is worth a schema
//! change in both stores, and memory keeps the cookie's id out of any database backup. The
//! price: a restart (or another node behind a balancer without sticky sessions) does not know
//! the cookie, so the page gets 401 and asks for the key again. A session ends
//! [`SESSION_TTL`] after sign-in, or [`IDLE_TTL`] after its last request, or at sign-out; the
//! key's revocation or expiry ends it at the next request (every request checks the key), and
//! ends its open event streams within [`crate::api::events::RECHECK`] (at once when this
//! process ends the session or revokes the key: [`SignIns::changed`]).
//!
//! **Several cookies of the name.** Another server of this host can set a cookie of the same
//! name on a longer path (`Path=/v1`), which the browser sends first: the live session among
//! them is used ([`SignIns::session_cookie`]), never merely the first.
//!
//! **The cookie** (`keel_inspector_<port>`, `__Host-keel_inspector_<port>` with TLS) holds only
//! the session id: 32 bytes from the OS's random source, hex. The map is keyed by the id's
//! SHA-256, so a lookup's timing says nothing about the ids it holds. `HttpOnly;
//! SameSite=Strict; Path=/`, and `Secure` when the server speaks TLS. The port in the name keeps
//! two servers of one host from overwriting each other's cookie; it does not keep the cookie
//! from them (browsers send a host's cookies to every port of it).
//!
//! **The cookie alone is not a session.** Any other server on this host (a dev server the
//! agent started, say) receives the cookie when the browser visits it. So every request with
//! the cookie, GET included, must also carry the session's token in `X-Keel-CSRF` (compared in
//! constant time): a second secret that only the sign-in answer holds (the page keeps it in
//! `sessionStorage`, which another origin cannot read) and no request with the cookie returns.
//! An `Origin` (or `Sec-Fetch-Site`) header, when the browser sends one, must name this server.
//! Sign-in itself is checked for the origin too (no login CSRF).
//!
//! **Failed sign-ins** are limited per client address ([`MAX_FAILURES`] per
//! [`FAILURE_WINDOW`]), and only failures count: a valid key is never refused because someone
//! else sent wrong ones. **Sessions per key** are capped at [`MAX_SESSIONS_PER_KEY`]: a further
//! sign-in ends that key's oldest session, never another key's.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The cookie's name without its port suffix (see [`cookie_name`]).
pub const COOKIE: &str = "keel_inspector";
/// The header that carries the CSRF token.
pub const CSRF_HEADER: &str = "x-keel-csrf";
/// How long a session lasts after sign-in at most.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// How long a session lasts without a request.
pub const IDLE_TTL: Duration = Duration::from_secs(3600);
/// Sessions one process keeps at most (a sign-in beyond is refused with 503 until some end).
pub const MAX_SESSIONS: usize = 10_000;
/// Live sessions one key keeps at most; a further sign-in with it ends its oldest.
pub const MAX_SESSIONS_PER_KEY: usize = 20;
/// Failed sign-ins one client address may make per [`FAILURE_WINDOW`]; its further wrong keys
/// are refused with 429 (a valid key still signs in). Keys are 256 random bits, so this is not
/// what keeps them from being guessed: it keeps a flood of wrong keys from costing a store read
/// each.
pub const MAX_FAILURES: usize = 20;
/// Client addresses whose failures are remembered at most (the oldest are forgotten beyond).
const MAX_FAILING_CLIENTS: usize = 10_000;
/// The window of [`MAX_FAILURES`].
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// One signed-in browser.
#[derive(Debug, Clone)]
struct Entry {
    key_hash: String,
    csrf: String,
    created: Instant,
    last_seen: Instant,
}

/// What a live session gives a request: the key's hash to authenticate with, and the token its
/// state-changing requests must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// `sha256:<hex>` of the key signed in with.
    pub key_hash: String,
    /// The session's CSRF token (64 hex digits).
    pub csrf: String,
    /// Seconds until the session ends at the latest.
    pub expires_in_s: u64,
}

/// The sessions of this process, and the recent failed sign-ins.
#[derive(Debug, Default)]
pub struct SignIns {
    sessions: Mutex<HashMap<String, Entry>>,
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
    ended: Ended,
}

/// A counter bumped whenever sessions end here or a key is revoked through this process, so
/// open streams check their credential at once ([`SignIns::changes`]).
#[derive(Debug)]
struct Ended(tokio::sync::watch::Sender<u64>);

impl Default for Ended {
    fn default() -> Self {
        Self(tokio::sync::watch::channel(0).0)
    }
}

fn random_hex() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(&e))?;
    Ok(hex::encode(bytes))
}

fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        now.duration_since(self.created) < SESSION_TTL
            && now.duration_since(self.last_seen) < IDLE_TTL
    }
}

impl SignIns {
    /// Starts a session for the key with hash `key_hash`: its id (the cookie's value) and what
    /// it gives requests.
    ///
    /// # Errors
    /// 503 when [`MAX_SESSIONS`] live sessions exist; 500 without randomness.
    pub fn create(&self, key_hash: &str) -> Result<(String, Signed), ApiError> {
        let now = Instant::now();
        let id = random_hex()?;
        let csrf = random_hex()?;
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, e| e.live(now));
        let mut own: Vec<(Instant, String)> = map
            .iter()
            .filter(|(_, e)| e.key_hash == key_hash)
            .map(|(k, e)| (e.created, k.clone()))
            .collect();
        if own.len() >= MAX_SESSIONS_PER_KEY {
            own.sort();
            for (_, k) in own.iter().take(own.len() + 1 - MAX_SESSIONS_PER_KEY) {
                map.remove(k);
            }
            self.changed();
        }
        if map.len() >= MAX_SESSIONS {
            return Err(ApiError::unavailable(format!(
                "this server holds {MAX_SESSIONS} inspector sessions already; try again later"
            )));
        }
        map.insert(
            id_hash(&id),
            Entry {
                key_hash: key_hash.to_owned(),
                csrf: csrf.clone(),
                created: now,
                last_seen: now,
            },
        );
        Ok((
            id,
            Signed {
                key_hash: key_hash.to_owned(),
                csrf,
                expires_in_s: SESSION_TTL.as_secs(),
            },
        ))
    }

    /// The live session of cookie value `id` (its idle deadline moves on), or `None` for an
    /// unknown, ended or expired one (forgotten then).
    pub fn lookup(&self, id: &str) -> Option<Signed> {
        self.lookup_at(id, Instant::now())
    }

    fn lookup_at(&self, id: &str, now: Instant) -> Option<Signed> {
        let key = id_hash(id);
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.get_mut(&key)?;
        if !entry.live(now) {
            map.remove(&key);
            return None;
        }
        entry.last_seen = now;
        let left = SESSION_TTL.saturating_sub(now.duration_since(entry.created));
        Some(Signed {
            key_hash: entry.key_hash.clone(),
            csrf: entry.csrf.clone(),
            expires_in_s: left.as_secs(),
        })
    }

    /// The live session of cookie value `id`, without moving its idle deadline (what an open
    /// stream checks, and what picks among cookies of one name: neither is a request), or
    /// `None` for an unknown, ended or expired one.
    pub fn peek(&self, id: &str) -> Option<Signed> {
        self.peek_at(id, Instant::now())
    }

    fn peek_at(&self, id: &str, now: Instant) -> Option<Signed> {
        let map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&id_hash(id))
            .filter(|e| e.live(now))
            .map(|e| Signed {
                key_hash: e.key_hash.clone(),
                csrf: e.csrf.clone(),
                expires_in_s: SESSION_TTL
                    .saturating_sub(now.duration_since(e.created))
                    .as_secs(),
            })
    }

    /// Ends the session of cookie value `id`; whether there was one.
    pub fn remove(&self, id: &str) -> bool {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let found = map.remove(&id_hash(id)).is_some();
        drop(map);
        self.changed();
        found
    }

    /// Ends every session signed in with the key of hash `key_hash` (its revocation, or "sign
    /// out everywhere"); how many there were.
    pub fn remove_key(&self, key_hash: &str) -> usize {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let before = map.len();
        map.retain(|_, e| e.key_hash != key_hash);
        let ended = before - map.len();
        drop(map);
        self.changed();
        ended
    }

    /// Tells open streams that a session ended or a key was revoked in this process: each
    /// checks its credential again at once (a revocation by another process, `keel keys
    /// revoke` say, is found by their periodic check).
    pub fn changed(&self) {
        self.ended.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that wakes at each [`SignIns::changed`].
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ended.0.subscribe()
    }

    /// Live sessions now.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        let map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        map.values().filter(|e| e.live(now)).count()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Passes while client `client` (its address) failed fewer than [`MAX_FAILURES`] sign-ins
    /// in the last [`FAILURE_WINDOW`]. Asked only after a key failed: a valid key is never
    /// refused.
    ///
    /// # Errors
    /// 429 with the seconds until the client's oldest failure leaves the window.
    pub fn check_rate(&self, client: &str) -> Result<(), ApiError> {
        let now = Instant::now();
        let mut all = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = all.get_mut(client) else {
            return Ok(());
        };
        while f
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            f.pop_front();
        }
        match f.front() {
            Some(oldest) if f.len() >= MAX_FAILURES => {
                let left = FAILURE_WINDOW.saturating_sub(now.duration_since(*oldest));
                Err(ApiError::sign_in_limited(left.as_secs().max(1)))
            }
            _ => Ok(()),
        }
    }

    /// Counts a failed sign-in of client `client`.
    pub fn failed(&self, client: &str) {
        let now = Instant::now();
        let mut all = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_FAILING_CLIENTS && !all.contains_key(client) {
            all.retain(|_, f| {
                f.back()
                    .is_some_and(|t| now.duration_since(*t) < FAILURE_WINDOW)
            });
            if all.len() >= MAX_FAILING_CLIENTS {
                let oldest = all
                    .iter()
                    .min_by_key(|(_, f)| f.back().copied())
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    all.remove(&k);
                }
            }
        }
        let f = all.entry(client.to_owned()).or_default();
        f.push_back(now);
        while f.len() > MAX_FAILURES {
            f.pop_front();
        }
    }
}

/// The port a request was sent to, from its `Host` header (443 or 80 by scheme when it names
/// none).
fn port_of(headers: &HeaderMap, tls: bool) -> u16 {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(if tls { 443 } else { 80 })
}

/// The cookie's name for a request: `keel_inspector_<port>`, with the `__Host-` prefix when the
/// server speaks TLS (no `Domain`, `Secure`, `Path=/`: a sibling subdomain cannot set it).
pub fn cookie_name(headers: &HeaderMap, tls: bool) -> String {
    format!(
        "{}{COOKIE}_{}",
        if tls { "__Host-" } else { "" },
        port_of(headers, tls)
    )
}

/// Every value a request's `Cookie` headers carry under [`cookie_name`], in the order sent
/// (empty ones left out). There may be several: another server of this host can set a cookie
/// of the same name on a longer path, which the browser sends first.
pub fn cookie_values(headers: &HeaderMap, tls: bool) -> Vec<String> {
    let name = cookie_name(headers, tls);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, value)| value.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

impl SignIns {
    /// The inspector session id of a request: of its cookies named [`cookie_name`]
    /// ([`cookie_values`]), the live session whose token the request carries in
    /// `X-Keel-CSRF`, else the first live one, else the first value (which then fails as an
    /// ended session), or `None` without such a cookie. A cookie planted by another server
    /// cannot hide the real one; the token check still decides.
    pub fn session_cookie(&self, headers: &HeaderMap, tls: bool) -> Option<String> {
        let values = cookie_values(headers, tls);
        let token = headers.get(CSRF_HEADER).map(|t| t.as_bytes().to_vec());
        let live: Vec<(&String, Signed)> = values
            .iter()
            .filter_map(|v| self.peek(v).map(|s| (v, s)))
            .collect();
        live.iter()
            .find(|(_, s)| {
                token
                    .as_deref()
                    .is_some_and(|t| constant_time_eq(t, s.csrf.as_bytes()))
            })
            .or_else(|| live.first())
            .map(|(v, _)| (*v).clone())
            .or_else(|| values.into_iter().next())
    }
}

/// The `Set-Cookie` value that holds session `id` under cookie `name` (`Secure` when `tls`).
pub fn set_cookie(name: &str, id: &str, tls: bool) -> String {
    format!(
        "{name}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if tls { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that removes cookie `name`.
pub fn clear_cookie(name: &str, tls: bool) -> String {
    format!(
        "{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if tls { "; Secure" } else { "" }
    )
}

/// Equality that takes the same time wherever the strings differ (lengths are public: tokens
/// have one length).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a request a browser made for another site: an `Origin` that is not this server's,
/// or a `Sec-Fetch-Site` other than `same-origin` or `none`. With `public` (the server's
/// `public_url` as an origin, for a proxy that ends TLS and may rewrite `Host`) the `Origin`
/// must be exactly it, scheme included. Without it, the `Origin`'s host and port must be the
/// request's `Host`, and the scheme is not compared (the page may be `https://` at a proxy
/// that forwards `Host`; with `tls`, an `http://` origin is refused all the same). A request
/// without either header (not a browser's, or an old one) passes: the CSRF token is what a
/// forged request cannot have.
///
/// # Errors
/// 403 naming the header.
pub fn same_origin(headers: &HeaderMap, tls: bool, public: Option<&str>) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if site != "same-origin" && site != "none" {
            return Err(ApiError::csrf(format!(
                "a request from another site (Sec-Fetch-Site: {site}) may not use the inspector's session"
            )));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let lower = origin.to_ascii_lowercase();
        if let Some(public) = public {
            if lower == public {
                return Ok(());
            }
            return Err(ApiError::csrf(format!(
                "a request from origin {origin} may not use the inspector's session of {public}"
            )));
        }
        let authority = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://").filter(|_| !tls));
        if host.is_empty() || authority != Some(host.to_ascii_lowercase().as_str()) {
            return Err(ApiError::csrf(format!(
                "a request from origin {origin} may not use the inspector's session of {host}"
            )));
        }
    }
    Ok(())
}

/// Checks the CSRF token of a state-changing request against the session's.
///
/// # Errors
/// 403 without the header or with another token.
pub fn check_token(headers: &HeaderMap, expected: &str) -> Result<(), ApiError> {
    let Some(given) = headers.get(CSRF_HEADER) else {
        return Err(ApiError::csrf(
            "a request with the inspector's cookie needs the session's token in X-Keel-CSRF (the cookie alone is not a session)",
        ));
    };
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::csrf(
            "the X-Keel-CSRF token is not this session's",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn sessions_are_opaque_and_end_by_sign_out_idle_or_age() {
        let s = SignIns::default();
        let (id, signed) = s.create("sha256:k").unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("sha256"));
        assert_eq!(s.lookup(&id).unwrap().csrf, signed.csrf);
        let (other, _) = s.create("sha256:k").unwrap();
        assert_ne!(id, other);
        assert!(s.lookup("nope").is_none());
        let now = Instant::now();
        assert!(
            s.lookup_at(&id, now + IDLE_TTL + Duration::from_secs(1))
                .is_none()
        );
        assert!(s.lookup(&id).is_none(), "an idle session is forgotten");
        assert!(s.remove(&other));
        assert!(s.lookup(&other).is_none());
        assert!(!s.remove(&other));
        // A stream's check finds the same, and does not keep a session from idling.
        let (third, _) = s.create("sha256:k").unwrap();
        let changes = s.changes();
        assert_eq!(s.peek(&third).unwrap().key_hash, "sha256:k");
        assert!(
            s.peek_at(&third, now + IDLE_TTL + Duration::from_secs(1))
                .is_none()
        );
        assert!(s.peek_at(&third, now + SESSION_TTL).is_none());
        assert!(!changes.has_changed().unwrap());
        assert!(s.remove(&third));
        assert!(changes.has_changed().unwrap(), "open streams are told");
        assert!(s.peek(&third).is_none());
        assert!(s.is_empty());
    }

    #[test]
    fn a_session_ends_at_its_age_even_when_used() {
        let s = SignIns::default();
        let (id, _) = s.create("sha256:k").unwrap();
        let start = Instant::now();
        let mut t = start;
        while t < start + SESSION_TTL - IDLE_TTL {
            t += IDLE_TTL / 2;
            assert!(s.lookup_at(&id, t).is_some());
        }
        assert!(
            s.lookup_at(&id, start + SESSION_TTL + Duration::from_secs(1))
                .is_none()
        );
    }

    #[test]
    fn failed_sign_ins_are_limited() {
        let s = SignIns::default();
        for _ in 0..MAX_FAILURES {
            assert!(s.check_rate("10.0.0.1").is_ok());
            s.failed("10.0.0.1");
        }
        let e = s.check_rate("10.0.0.1").unwrap_err();
        assert_eq!(e.status.as_u16(), 429);
        assert!(e.retry_after_s.unwrap() >= 1);
        assert!(s.check_rate("10.0.0.2").is_ok(), "per client");
    }

    #[test]
    fn a_key_keeps_a_bounded_number_of_sessions_and_revocation_ends_them() {
        let s = SignIns::default();
        let (first, _) = s.create("sha256:k").unwrap();
        let (other_key, _) = s.create("sha256:o").unwrap();
        for _ in 1..MAX_SESSIONS_PER_KEY {
            s.create("sha256:k").unwrap();
        }
        assert!(s.lookup(&first).is_some());
        s.create("sha256:k").unwrap();
        assert!(s.lookup(&first).is_none(), "the key's oldest session ended");
        assert!(s.lookup(&other_key).is_some(), "another key's did not");
        assert_eq!(s.len(), MAX_SESSIONS_PER_KEY + 1);
        assert_eq!(s.remove_key("sha256:k"), MAX_SESSIONS_PER_KEY);
        assert_eq!(s.len(), 1);
    }

    /// Attacker review 19-3: a cookie of the same name planted by another server of this host
    /// (on a longer path, so sent first) does not hide the live session's.
    #[test]
    fn a_planted_cookie_of_the_same_name_does_not_hide_the_session() {
        let s = SignIns::default();
        let (id, signed) = s.create("sha256:k").unwrap();
        let (other, _) = s.create("sha256:k").unwrap();
        let mut h = HeaderMap::new();
        let both = format!("keel_inspector_80=0000; keel_inspector_80={id}");
        h.insert(header::COOKIE, HeaderValue::from_str(&both).unwrap());
        assert_eq!(cookie_values(&h, false), ["0000", id.as_str()]);
        assert_eq!(s.session_cookie(&h, false), Some(id.clone()));
        // Two live ones: the one whose token the request carries.
        let three =
            format!("keel_inspector_80=0000; keel_inspector_80={other}; keel_inspector_80={id}");
        h.insert(header::COOKIE, HeaderValue::from_str(&three).unwrap());
        h.insert(CSRF_HEADER, HeaderValue::from_str(&signed.csrf).unwrap());
        assert_eq!(s.session_cookie(&h, false), Some(id.clone()));
        // None live: the first, which fails as an ended session.
        s.remove(&id);
        s.remove(&other);
        assert_eq!(s.session_cookie(&h, false).as_deref(), Some("0000"));
        h.remove(header::COOKIE);
        assert_eq!(s.session_cookie(&h, false), None);
    }

    #[test]
    fn cookies_tokens_and_origins() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; keel_inspector_80=abc ; keel_inspector_81=x"),
        );
        assert_eq!(cookie_values(&h, false), ["abc"]);
        assert_eq!(cookie_name(&h, true), "__Host-keel_inspector_443");
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:81"));
        assert_eq!(cookie_values(&h, false), ["x"]);
        h.remove(header::HOST);
        assert!(set_cookie("n", "abc", true).ends_with("; Secure"));
        assert!(set_cookie("n", "abc", false).contains("HttpOnly; SameSite=Strict"));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert_eq!(
            check_token(&h, "t").unwrap_err().problem.field.as_deref(),
            Some(CSRF_HEADER)
        );
        h.insert(CSRF_HEADER, HeaderValue::from_static("t"));
        assert!(check_token(&h, "t").is_ok());
        assert!(check_token(&h, "u").is_err());
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&h, false, None).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h, false, None).is_ok());
        assert!(
            same_origin(&h, true, None).is_err(),
            "http:// to a TLS server"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://127.0.0.1:8080"),
        );
        assert!(same_origin(&h, true, None).is_ok());
        assert!(same_origin(&h, false, None).is_ok(), "TLS ended by a proxy");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8081"),
        );
        assert!(
            same_origin(&h, false, None).is_err(),
            "another port is another origin"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(same_origin(&h, false, None).is_err());
        // Behind a proxy with public_url: only that origin, scheme included, whatever Host says.
        let public = Some("https://keel.example.com");
        assert!(same_origin(&h, false, public).is_err());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://keel.example.com"),
        );
        assert!(
            same_origin(&h, false, public).is_ok(),
            "Host is the proxy's"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://keel.example.com"),
        );
        assert!(same_origin(&h, false, public).is_err(), "not https");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(
            same_origin(&h, false, public).is_err(),
            "the Host's origin is not the public one"
        );
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&h, false, None).is_err());
    }
}
