//! [`Client`] operations: Health, the OpenAPI document, listings, artifacts, usage, memory, tenants and keys.

use super::*;

impl Client {
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
