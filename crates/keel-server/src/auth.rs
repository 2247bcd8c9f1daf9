//! API keys and who a request acts for.
//!
//! A key is `keel_` followed by 64 hex digits (32 bytes from the OS's random source); the store
//! keeps only `sha256:<hex>` of the whole text and its first 12 characters. 256 random bits make
//! a slow password hash pointless: nobody can guess a key from its SHA-256, and every request
//! can be checked with one hash. A request names its key as `Authorization: Bearer <key>`; the
//! middleware ([`authenticate`]) finds the key by its hash, refuses revoked and expired ones
//! (401) and hands the handler a [`Caller`].
//!
//! Roles: `viewer` reads; `operator` also acts on sessions (create, settings, turns, approvals,
//! effects, cancellation, close, delete, memory); `admin` also manages the tenant's keys and
//! releases. `system` keys belong to no tenant: they manage tenants (and give a tenant its
//! first keys) and nothing inside a tenant (403).
//!
//! The inspector ([`crate::inspector`]) signs a browser in with a key and then authenticates it
//! by an opaque session cookie instead; that session keeps the key's hash, and every request
//! checks the key again, so the cookie never carries more than the key allows.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use chrono::Utc;
use keel_core::{PrincipalId, TenantId};
use keel_store::{ApiKeyRecord, NewApiKey, Role, Store};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::Shared;

/// Who a request acts for: the key's principal, tenant and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The principal (recorded in the journal as the actor of every change).
    pub principal_id: PrincipalId,
    /// The tenant; `None` for a system key.
    pub tenant: Option<TenantId>,
    /// The role.
    pub role: Role,
    /// The key used.
    pub key_id: String,
}

fn rank(r: Role) -> u8 {
    match r {
        Role::Viewer => 1,
        Role::Operator => 2,
        Role::Admin => 3,
        Role::System => 0,
    }
}

impl Caller {
    /// The caller's tenant, if its role is at least `min` (`viewer`, `operator` or `admin`).
    ///
    /// # Errors
    /// 403 for a system key or a lesser role, naming what is needed.
    pub fn tenant_as(&self, min: Role) -> Result<TenantId, ApiError> {
        let Some(t) = self.tenant else {
            return Err(ApiError::forbidden(
                "system keys manage tenants and nothing inside one; use a key of the tenant",
            ));
        };
        if rank(self.role) < rank(min) {
            return Err(ApiError::forbidden(format!(
                "this operation needs the {min} role or above; this key's principal is {}",
                self.role
            )));
        }
        Ok(t)
    }

    /// Passes for a system key.
    ///
    /// # Errors
    /// 403 for a tenant key.
    pub fn system(&self) -> Result<(), ApiError> {
        if self.role == Role::System {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                "only system keys manage tenants (keel keys create --system)",
            ))
        }
    }

    /// The idempotency scope: the tenant id, or `system`.
    pub fn scope(&self) -> String {
        self.tenant
            .map_or_else(|| "system".to_owned(), |t| t.to_string())
    }
}

/// `sha256:<hex>` of a key's text: what the store keeps.
pub fn key_hash(key: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// A new key's text: `keel_` and 64 hex digits from the OS's random source.
///
/// # Errors
/// The OS gave no randomness.
pub fn generate_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("keel_{}", hex::encode(bytes)))
}

/// A key to create: who it is for.
#[derive(Debug, Clone)]
pub struct KeySpec {
    /// Its tenant (`None`: a system key).
    pub tenant: Option<TenantId>,
    /// The new principal's name.
    pub name: String,
    /// Its role (`System` exactly when `tenant` is `None`).
    pub role: Role,
    /// Expiry.
    pub expires_at: Option<chrono::DateTime<Utc>>,
}

/// Creates a key: generates its text, stores its hash with a new principal, returns the text
/// (shown once) and the stored record.
///
/// # Errors
/// Store errors (`NotFound` tenant, `InvalidInput` role/tenant mismatch or name); no
/// randomness (`InvalidInput`).
pub async fn create_key(
    store: &dyn Store,
    spec: &KeySpec,
) -> Result<(String, ApiKeyRecord), keel_store::StoreError> {
    let key = generate_key()
        .map_err(|e| keel_store::StoreError::InvalidInput(format!("no randomness: {e}")))?;
    let record = store
        .create_api_key(&NewApiKey {
            tenant_id: spec.tenant,
            principal_id: None,
            principal_name: spec.name.clone(),
            role: spec.role,
            key_hash: key_hash(&key),
            prefix: key.chars().take(12).collect(),
            expires_at: spec.expires_at,
        })
        .await?;
    Ok((key, record))
}

/// Finds the caller of a request by its bearer key (its `Authorization` header).
///
/// # Errors
/// 401 (no key, a malformed header, an unknown, revoked or expired key); store errors.
pub async fn caller_of(
    store: &dyn Store,
    authorization: Option<&axum::http::HeaderValue>,
) -> Result<Caller, ApiError> {
    let Some(value) = authorization else {
        return Err(no_key());
    };
    caller_by_hash(store, &bearer_hash(value)?).await
}

fn no_key() -> ApiError {
    ApiError::unauthorized("this operation needs an API key: Authorization: Bearer <key>")
}

/// The [`key_hash`] of the key an `Authorization: Bearer <key>` header names.
///
/// # Errors
/// 401 for a header that is not `Bearer <key>`.
fn bearer_hash(value: &axum::http::HeaderValue) -> Result<String, ApiError> {
    let text = value.to_str().unwrap_or_default();
    let key = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be Bearer <key>"))?;
    Ok(key_hash(key))
}

/// How a request proved who it is, kept (as a request extension, next to the [`Caller`]) so
/// that what outlives the request, an SSE stream, can check it again ([`still_valid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bearer key, by its [`key_hash`].
    Key(String),
    /// An inspector session, by its cookie's value.
    Session(String),
}

/// The last check of each key for open streams, shared by every stream of that key: 1,000
/// streams of one key, each rechecking every [`crate::api::events::RECHECK`], make one store
/// read per key per [`StreamChecks::FRESH`] instead of 1,000 reads at once (which exhausted the
/// store's pool and failed other requests with 500; `cargo bench -p keel --bench fanout`,
/// 2026-12-06). Concurrent checks of one key wait for the first one's read (single flight).
#[derive(Debug, Default)]
pub struct StreamChecks {
    by_key: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<KeyCheck>>>>>,
}

/// One key's last check.
#[derive(Debug, Clone, Copy)]
struct KeyCheck {
    at: std::time::Instant,
    /// [`crate::inspector::signin::SignIns::changes`]'s value when it was made: a revocation
    /// or sign-out in this process since makes it stale at once.
    generation: u64,
    valid: bool,
}

impl StreamChecks {
    /// How long a check answers for every stream of its key: less than the recheck period, so
    /// each periodic recheck of a stream sees a check made after its previous one.
    pub const FRESH: std::time::Duration = std::time::Duration::from_millis(900);

    fn slot(&self, hash: &str) -> Arc<tokio::sync::Mutex<Option<KeyCheck>>> {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        // Keys whose streams are all gone are dropped (no other holder of the slot).
        if map.len() > 64 {
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        map.entry(hash.to_owned()).or_default().clone()
    }
}

/// Whether `credential` still authenticates: its key is known, not revoked, not expired, and
/// for an inspector session the session is live (not signed out, not past its age or idle
/// deadline; the check does not move the idle deadline). A store error counts as valid for now
/// (the next check decides): a database blip does not end every stream at once. The key's
/// part is answered by a check of the same key made less than [`StreamChecks::FRESH`] ago
/// with no revocation or sign-out in this process since, else read from the store once for
/// every stream waiting on it.
pub async fn still_valid(state: &Shared, credential: &Credential) -> bool {
    let hash = match credential {
        Credential::Key(hash) => hash.clone(),
        Credential::Session(id) => match state.inspector.peek(id) {
            Some(signed) => signed.key_hash,
            None => return false,
        },
    };
    let slot = state.stream_checks.slot(&hash);
    let mut last = slot.lock().await;
    let generation = *state.inspector.changes().borrow();
    if let Some(check) = *last
        && check.generation == generation
        && check.at.elapsed() < StreamChecks::FRESH
    {
        return check.valid || signed_out(state, credential, &hash);
    }
    state.metrics.stream_credential_checked();
    let valid = key_still_valid(state, &hash).await;
    *last = Some(KeyCheck {
        at: std::time::Instant::now(),
        generation,
        valid,
    });
    valid || signed_out(state, credential, &hash)
}

/// For an inspector session whose key is no longer valid: signs every session of that key out
/// (they could do nothing more). Returns `false`, the stream's answer.
fn signed_out(state: &Shared, credential: &Credential, hash: &str) -> bool {
    if matches!(credential, Credential::Session(_)) {
        state.inspector.remove_key(hash);
    }
    false
}

/// [`still_valid`]'s store read for the key `hash`.
async fn key_still_valid(state: &Shared, hash: &str) -> bool {
    match caller_by_hash(state.store.as_ref(), hash).await {
        Ok(_) => true,
        Err(e) if e.status == axum::http::StatusCode::UNAUTHORIZED => false,
        Err(e) => {
            tracing::warn!("checking an open stream's key: {}", e.problem.detail);
            true
        }
    }
}

/// Finds the caller whose key has hash `hash` ([`key_hash`]): what a bearer key and an
/// inspector session (which keeps the hash, never the key) both come down to, so a key revoked
/// or expired after sign-in stops working at once either way.
///
/// # Errors
/// 401 for an unknown, revoked or expired key; store errors.
pub async fn caller_by_hash(store: &dyn Store, hash: &str) -> Result<Caller, ApiError> {
    let invalid =
        || ApiError::unauthorized("the API key is not valid (unknown, revoked or expired)");
    let record = store.api_key_by_hash(hash).await?.ok_or_else(invalid)?;
    if !record.is_usable(Utc::now()) {
        return Err(invalid());
    }
    Ok(Caller {
        principal_id: record.principal_id,
        tenant: record.tenant_id,
        role: record.role,
        key_id: record.key_id,
    })
}

/// Middleware: authenticates the request and stores its [`Caller`] as an extension. A request
/// without `Authorization` that carries the inspector's session cookie acts for the key that
/// session was signed in with ([`crate::inspector::caller_by_cookie`]: the session's token is
/// checked for every method); its response, error or not, is marked `Cache-Control: no-store`.
pub async fn authenticate(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let authorization = req.headers().get(header::AUTHORIZATION).cloned();
    let cookie = match &authorization {
        None => state
            .inspector
            .session_cookie(req.headers(), state.config.secure_cookies()),
        Some(_) => None,
    };
    let found = match &cookie {
        Some(id) => crate::inspector::caller_by_cookie(&state, id, req.headers())
            .await
            .map(|c| (c, Credential::Session(id.clone()))),
        None => match authorization.as_ref().map(bearer_hash) {
            Some(Ok(hash)) => caller_by_hash(state.store.as_ref(), &hash)
                .await
                .map(|c| (c, Credential::Key(hash))),
            Some(Err(e)) => Err(e),
            None => Err(no_key()),
        },
    };
    match found {
        Ok((caller, credential)) => {
            // A viewer changes nothing: refused before its body is read, so a viewer's bad
            // body gets the same 403 as a good one (the handler would say the same).
            if caller.role == Role::Viewer
                && !matches!(*req.method(), Method::GET | Method::HEAD)
                && let Err(e) = caller.tenant_as(Role::Operator)
            {
                return axum::response::IntoResponse::into_response(e);
            }
            req.extensions_mut().insert(caller);
            req.extensions_mut().insert(credential);
            let mut res = next.run(req).await;
            if cookie.is_some() {
                res.headers_mut().insert(
                    header::CACHE_CONTROL,
                    axum::http::HeaderValue::from_static("no-store"),
                );
            }
            res
        }
        Err(e) => {
            let mut res = axum::response::IntoResponse::into_response(e);
            if cookie.is_some() {
                res.headers_mut().insert(
                    header::CACHE_CONTROL,
                    axum::http::HeaderValue::from_static("no-store"),
                );
            }
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_only_their_hash_is_derived() {
        let a = generate_key().unwrap();
        let b = generate_key().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("keel_") && a.len() == 5 + 64, "{a}");
        assert_eq!(key_hash(&a), key_hash(&a));
        assert!(key_hash(&a).starts_with("sha256:"));
        assert!(!key_hash(&a).contains(&a[5..]));
    }

    #[test]
    fn roles_nest_and_system_keys_stay_out_of_tenants() {
        let t = TenantId::new();
        let c = |role, tenant| Caller {
            principal_id: PrincipalId::new(),
            tenant,
            role,
            key_id: "k".into(),
        };
        assert!(c(Role::Admin, Some(t)).tenant_as(Role::Operator).is_ok());
        assert!(c(Role::Operator, Some(t)).tenant_as(Role::Admin).is_err());
        assert!(c(Role::Viewer, Some(t)).tenant_as(Role::Viewer).is_ok());
        assert!(c(Role::Viewer, Some(t)).tenant_as(Role::Operator).is_err());
        assert!(c(Role::System, None).tenant_as(Role::Viewer).is_err());
        assert!(c(Role::System, None).system().is_ok());
        assert!(c(Role::Admin, Some(t)).system().is_err());
    }
}
