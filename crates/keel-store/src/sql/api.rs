//! What the HTTP API keeps besides sessions: tenants, principals and API keys (hashes only),
//! idempotency records, and the paged lists the API serves. Same SQL on both backends.

use std::time::Duration;

use chrono::{DateTime, Utc};
use keel_core::mechanisms::{Mechanism, is_off};
use keel_core::{ApprovalRecord, PrincipalId, Release, ReleaseId, SessionId, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{
    APPROVAL_COLS, Commit, SqlStore, approval_from_row, corrupt, expires_ms, memory_from_row,
    migrations, non_negative, not_found, parse_id, parse_json, time_col, ttl_ms, uuid_v7_text,
};
use crate::error::{Result, StoreError};
use crate::types::{
    ApiKeyRecord, ApprovalQuery, ArtifactInfo, IdempotencyBegin, IdempotencyKey, KeyScope,
    MemoryEntry, NewApiKey, ReleaseRecord, Role, StoredResponse, TenantRecord,
};

const KEY_SELECT: &str = "SELECT k.key_id, k.principal_id, p.name AS principal_name, k.tenant_id, \
    p.role, k.prefix, k.created_at, k.expires_at, k.revoked_at \
    FROM api_keys k JOIN principals p ON p.principal_id = k.principal_id";

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds an idempotency key's four columns (scope, principal, route, key) in that order.
fn bind_key<'q>(q: AnyQuery<'q>, key: &IdempotencyKey) -> AnyQuery<'q> {
    q.bind(key.scope.clone())
        .bind(key.principal_id.to_string())
        .bind(key.route.clone())
        .bind(key.key.clone())
}

/// Page sizes: default 100, at most 1000.
fn page(limit: u32) -> i64 {
    i64::from(limit.clamp(1, 1000))
}

fn tenant_from_row(row: &AnyRow) -> Result<TenantRecord> {
    let id: String = row.try_get("tenant_id")?;
    Ok(TenantRecord {
        tenant_id: parse_id("tenants", &id)?,
        name: row.try_get("name")?,
        created_at: time_col("tenants", &id, "created_at", row.try_get("created_at")?)?,
    })
}

fn key_from_row(row: &AnyRow) -> Result<ApiKeyRecord> {
    let id: String = row.try_get("key_id")?;
    let tenant: Option<String> = row.try_get("tenant_id")?;
    let role: String = row.try_get("role")?;
    let expires_at: Option<i64> = row.try_get("expires_at")?;
    let revoked_at: Option<i64> = row.try_get("revoked_at")?;
    Ok(ApiKeyRecord {
        principal_id: parse_id("api_keys", &row.try_get::<String, _>("principal_id")?)?,
        principal_name: row.try_get("principal_name")?,
        tenant_id: tenant
            .as_deref()
            .map(|t| parse_id("api_keys", t))
            .transpose()?,
        role: role
            .parse::<Role>()
            .map_err(|e| corrupt("principals", &id, e))?,
        prefix: row.try_get("prefix")?,
        created_at: time_col("api_keys", &id, "created_at", row.try_get("created_at")?)?,
        expires_at: expires_at
            .map(|t| time_col("api_keys", &id, "expires_at", t))
            .transpose()?,
        revoked_at: revoked_at
            .map(|t| time_col("api_keys", &id, "revoked_at", t))
            .transpose()?,
        key_id: id,
    })
}

/// `AND <tenant condition>` for a key scope, and whether it binds the tenant.
fn scope_sql(scope: KeyScope, column: &str) -> (String, Option<String>) {
    match scope {
        KeyScope::All => (String::new(), None),
        KeyScope::System => (format!(" AND {column} IS NULL"), None),
        KeyScope::Tenant(t) => (format!(" AND {column} = ?"), Some(t.to_string())),
    }
}

impl SqlStore {
    pub(super) async fn api_ready(&self) -> Result<()> {
        let row = sqlx::query("SELECT MAX(version) AS v FROM keel_migrations")
            .fetch_one(&self.inner.pool)
            .await?;
        let found: Option<i64> = row.try_get("v")?;
        let latest = migrations::MIGRATIONS.last().map_or(0, |m| m.version);
        match found {
            Some(v) if v == latest => Ok(()),
            Some(v) if v > latest && is_off(Mechanism::SchemaVersionCheck) => Ok(()),
            Some(v) if v > latest => Err(StoreError::SchemaTooNew {
                found: v,
                supported: latest,
            }),
            other => Err(StoreError::MigrationMismatch {
                version: other.unwrap_or(0),
                name: "keel_migrations".into(),
                reason: format!("the store is at migration {other:?}, this build needs {latest}"),
            }),
        }
    }

    pub(super) async fn api_claim_workspace(&self, tenant: TenantId, path: &str) -> Result<()> {
        if !path.starts_with('/') {
            return Err(StoreError::InvalidInput(format!(
                "workspace {path:?} is not an absolute path"
            )));
        }
        let path = if path.len() > 1 {
            path.trim_end_matches('/')
        } else {
            path
        };
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if self.inner.dialect == super::Dialect::Postgres {
            // One lock for every claim: nested paths have no common row to lock.
            sqlx::query("SELECT pg_advisory_xact_lock(7465012)")
                .execute(&mut *tx)
                .await?;
        }
        // Another tenant's claim on the path, above it or below it.
        let taken = sqlx::query(&self.sql(
            "SELECT path FROM workspace_claims WHERE tenant_id <> ? AND (path = ? \
             OR substr(?, 1, length(path) + 1) = path || '/' \
             OR substr(path, 1, length(?) + 1) = ? || '/') LIMIT 1",
        ))
        .bind(tenant.to_string())
        .bind(path.to_owned())
        .bind(path.to_owned())
        .bind(path.to_owned())
        .bind(path.to_owned())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = taken {
            let other: String = row.try_get("path")?;
            let relation = if other == path {
                "it"
            } else if path.starts_with(&format!("{other}/")) {
                "a directory above it"
            } else {
                "a directory below it"
            };
            return Err(StoreError::Conflict(format!(
                "workspace {path:?} is not this tenant's: another tenant works in {relation}"
            )));
        }
        sqlx::query(&self.sql(
            "INSERT INTO workspace_claims (path, tenant_id, created_at) VALUES (?, ?, ?) \
             ON CONFLICT DO NOTHING",
        ))
        .bind(path.to_owned())
        .bind(tenant.to_string())
        .bind(super::now_ms())
        .execute(&mut *tx)
        .await
        .map_err(|e| self.located(e.into()))?;
        tx.commit().await.map_err(|e| self.located(e.into()))?;
        drop(conn);
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn api_create_tenant(&self, name: &str) -> Result<TenantRecord> {
        let name = name.trim();
        if let Some(problem) = keel_core::text::name_problem(name) {
            return Err(StoreError::InvalidInput(format!(
                "tenant name {name:?}: {problem}"
            )));
        }
        let id = TenantId::new();
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "INSERT INTO tenants (tenant_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(id.to_string())
        .bind(name.to_owned())
        .bind(super::now_ms())
        .execute(&mut *conn)
        .await
        .map_err(|e| self.located(e.into()))?;
        drop(conn);
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "a tenant named {name:?} exists"
            )));
        }
        self.committed(Commit::Tables);
        self.api_get_tenant(id).await
    }

    pub(super) async fn api_get_tenant(&self, tenant: TenantId) -> Result<TenantRecord> {
        let row = sqlx::query(
            &self.sql("SELECT tenant_id, name, created_at FROM tenants WHERE tenant_id = ?"),
        )
        .bind(tenant.to_string())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("tenant", tenant))?;
        tenant_from_row(&row)
    }

    pub(super) async fn api_list_tenants(
        &self,
        after: Option<TenantId>,
        limit: u32,
    ) -> Result<Vec<TenantRecord>> {
        let mut sql = String::from("SELECT tenant_id, name, created_at FROM tenants");
        if after.is_some() {
            sql.push_str(
                " WHERE (created_at, tenant_id) > \
                 (SELECT created_at, tenant_id FROM tenants WHERE tenant_id = ?)",
            );
        }
        sql.push_str(" ORDER BY created_at, tenant_id LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql);
        if let Some(a) = after {
            q = q.bind(a.to_string());
        }
        q.bind(page(limit))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(tenant_from_row)
            .collect()
    }

    pub(super) async fn api_create_key(&self, new: &NewApiKey) -> Result<ApiKeyRecord> {
        let key_id = uuid_v7_text();
        let now = super::now_ms();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if let Some(t) = new.tenant_id {
            let exists = sqlx::query(&self.sql("SELECT 1 AS one FROM tenants WHERE tenant_id = ?"))
                .bind(t.to_string())
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Err(not_found("tenant", t));
            }
        }
        let (scope, bind) = scope_sql(
            new.tenant_id.map_or(KeyScope::System, KeyScope::Tenant),
            "tenant_id",
        );
        let principal = match new.principal_id {
            Some(p) => {
                let sql =
                    format!("SELECT principal_id FROM principals WHERE principal_id = ?{scope}");
                let sql = self.inner.dialect.sql(&sql);
                let mut q = sqlx::query(&sql).bind(p.to_string());
                if let Some(b) = bind {
                    q = q.bind(b);
                }
                let found = q.fetch_optional(&mut *tx).await?;
                if found.is_none() {
                    return Err(not_found("principal", p));
                }
                p
            }
            None => {
                let name = new.principal_name.trim();
                if let Some(problem) = keel_core::text::name_problem(name) {
                    return Err(StoreError::InvalidInput(format!(
                        "principal name {name:?}: {problem}"
                    )));
                }
                if (new.role == Role::System) != new.tenant_id.is_none() {
                    return Err(StoreError::InvalidInput(format!(
                        "a {} principal {}: system principals belong to no tenant, every other role to one",
                        new.role,
                        if new.tenant_id.is_some() {
                            "cannot belong to a tenant"
                        } else {
                            "needs a tenant"
                        }
                    )));
                }
                let p = PrincipalId::new();
                sqlx::query(&self.sql(
                    "INSERT INTO principals (principal_id, tenant_id, name, role, created_at) VALUES (?, ?, ?, ?, ?)",
                ))
                .bind(p.to_string())
                .bind(new.tenant_id.map(|t| t.to_string()))
                .bind(name.to_owned())
                .bind(new.role.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await?;
                p
            }
        };
        let done = sqlx::query(&self.sql(
            "INSERT INTO api_keys (key_id, principal_id, tenant_id, key_hash, prefix, created_at, expires_at, revoked_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT DO NOTHING",
        ))
        .bind(key_id.clone())
        .bind(principal.to_string())
        .bind(new.tenant_id.map(|t| t.to_string()))
        .bind(new.key_hash.clone())
        .bind(new.prefix.clone())
        .bind(now)
        .bind(new.expires_at.map(|t| t.timestamp_millis()))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(
                "an API key with this hash exists".into(),
            ));
        }
        tx.commit().await.map_err(|e| self.located(e.into()))?;
        drop(conn);
        self.committed(Commit::Tables);
        self.api_get_key(&key_id).await
    }

    async fn api_get_key(&self, key_id: &str) -> Result<ApiKeyRecord> {
        let sql = format!("{KEY_SELECT} WHERE k.key_id = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(key_id.to_owned())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("api key", key_id))?;
        key_from_row(&row)
    }

    pub(super) async fn api_key_by_hash_q(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>> {
        let sql = format!("{KEY_SELECT} WHERE k.key_hash = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(key_hash.to_owned())
            .fetch_optional(&self.inner.pool)
            .await?;
        row.as_ref().map(key_from_row).transpose()
    }

    pub(super) async fn api_list_keys(
        &self,
        scope: KeyScope,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>> {
        let (cond, bind) = scope_sql(scope, "k.tenant_id");
        let mut sql = format!("{KEY_SELECT} WHERE 1 = 1{cond}");
        if after.is_some() {
            sql.push_str(
                " AND (k.created_at, k.key_id) > (SELECT created_at, key_id FROM api_keys WHERE key_id = ?)",
            );
        }
        sql.push_str(" ORDER BY k.created_at, k.key_id LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql);
        if let Some(b) = bind {
            q = q.bind(b);
        }
        if let Some(a) = after {
            q = q.bind(a.to_owned());
        }
        q.bind(page(limit))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(key_from_row)
            .collect()
    }

    pub(super) async fn api_revoke_key(
        &self,
        scope: KeyScope,
        key_id: &str,
        now: DateTime<Utc>,
    ) -> Result<ApiKeyRecord> {
        let (cond, bind) = scope_sql(scope, "tenant_id");
        let sql = format!(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?{cond}"
        );
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql)
            .bind(now.timestamp_millis())
            .bind(key_id.to_owned());
        if let Some(b) = bind {
            q = q.bind(b);
        }
        let mut conn = self.write_conn().await?;
        let done = q
            .execute(&mut *conn)
            .await
            .map_err(|e| self.located(e.into()))?;
        drop(conn);
        if done.rows_affected() == 0 {
            return Err(not_found("api key", key_id));
        }
        self.committed(Commit::Tables);
        self.api_get_key(key_id).await
    }

    pub(super) async fn api_idem_begin(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        now: DateTime<Utc>,
        ttl: Duration,
        stale_after: Duration,
    ) -> Result<IdempotencyBegin> {
        const WHERE: &str = "scope = ? AND principal_id = ? AND route = ? AND idem_key = ?";
        let now_ms = now.timestamp_millis();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        let del = format!("DELETE FROM idempotency WHERE {WHERE} AND expires_at <= ?");
        let del = self.inner.dialect.sql(&del);
        bind_key(sqlx::query(&del), key)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(&self.sql(
            "INSERT INTO idempotency (scope, principal_id, route, idem_key, request_hash, state, \
             status_code, response, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, 'in_flight', NULL, NULL, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(key.scope.clone())
        .bind(key.principal_id.to_string())
        .bind(key.route.clone())
        .bind(key.key.clone())
        .bind(request_hash.to_owned())
        .bind(now_ms)
        .bind(expires_ms(now_ms, ttl))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            tx.commit().await.map_err(|e| self.located(e.into()))?;
            drop(conn);
            self.committed(Commit::Tables);
            return Ok(IdempotencyBegin::Started);
        }
        let sel = format!(
            "SELECT request_hash, state, status_code, response, created_at FROM idempotency WHERE {WHERE}"
        );
        let sel = self.inner.dialect.sql(&sel);
        let row = bind_key(sqlx::query(&sel), key)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "idempotency key {:?} changed while being read; send the request again",
                    key.key
                ))
            })?;
        let hash: String = row.try_get("request_hash")?;
        let state: String = row.try_get("state")?;
        let created_at: i64 = row.try_get("created_at")?;
        let outcome = if hash != request_hash {
            IdempotencyBegin::Mismatch
        } else if state == "in_flight" {
            if created_at <= now_ms.saturating_sub(ttl_ms(stale_after)) {
                let upd = format!(
                    "UPDATE idempotency SET created_at = ? WHERE {WHERE} AND state = 'in_flight' AND created_at = ?"
                );
                let upd = self.inner.dialect.sql(&upd);
                let taken = sqlx::query(&upd)
                    .bind(now_ms)
                    .bind(key.scope.clone())
                    .bind(key.principal_id.to_string())
                    .bind(key.route.clone())
                    .bind(key.key.clone())
                    .bind(created_at)
                    .execute(&mut *tx)
                    .await?;
                if taken.rows_affected() == 1 {
                    IdempotencyBegin::Started
                } else {
                    IdempotencyBegin::InFlight
                }
            } else {
                IdempotencyBegin::InFlight
            }
        } else {
            let status: Option<i64> = row.try_get("status_code")?;
            let response: Option<String> = row.try_get("response")?;
            let id = format!("{}/{}", key.route, key.key);
            let stored = parse_json("idempotency", &id, response.as_deref().unwrap_or("null"))?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| corrupt("idempotency", &id, "no status code"))?;
            let headers = stored
                .get("headers")
                .and_then(serde_json::Value::as_array)
                .map(|hs| {
                    hs.iter()
                        .filter_map(|h| {
                            Some((
                                h.get(0)?.as_str()?.to_owned(),
                                h.get(1)?.as_str()?.to_owned(),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let body = stored
                .get("body")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            IdempotencyBegin::Done(StoredResponse {
                status,
                headers,
                body,
            })
        };
        tx.commit().await.map_err(|e| self.located(e.into()))?;
        drop(conn);
        self.committed(Commit::Tables);
        Ok(outcome)
    }

    pub(super) async fn api_idem_finish(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        response: &StoredResponse,
    ) -> Result<()> {
        let stored = serde_json::json!({
            "headers": response.headers.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>(),
            "body": response.body,
        });
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE idempotency SET state = 'done', status_code = ?, response = ? \
             WHERE scope = ? AND principal_id = ? AND route = ? AND idem_key = ? \
             AND request_hash = ? AND state = 'in_flight'",
        ))
        .bind(i64::from(response.status))
        .bind(stored.to_string())
        .bind(key.scope.clone())
        .bind(key.principal_id.to_string())
        .bind(key.route.clone())
        .bind(key.key.clone())
        .bind(request_hash.to_owned())
        .execute(&mut *conn)
        .await
        .map_err(|e| self.located(e.into()))?;
        drop(conn);
        if done.rows_affected() == 0 {
            return Err(not_found("idempotency record", &key.key));
        }
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn api_idem_abandon(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "DELETE FROM idempotency WHERE scope = ? AND principal_id = ? AND route = ? \
             AND idem_key = ? AND request_hash = ? AND state = 'in_flight'",
        ))
        .bind(key.scope.clone())
        .bind(key.principal_id.to_string())
        .bind(key.route.clone())
        .bind(key.key.clone())
        .bind(request_hash.to_owned())
        .execute(&mut *conn)
        .await?;
        drop(conn);
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn api_idem_cleanup(&self, now: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql("DELETE FROM idempotency WHERE expires_at <= ?"))
            .bind(now.timestamp_millis())
            .execute(&mut *conn)
            .await?;
        drop(conn);
        self.committed(Commit::Tables);
        Ok(done.rows_affected())
    }

    pub(super) async fn api_list_approvals(
        &self,
        tenant: TenantId,
        query: &ApprovalQuery,
    ) -> Result<Vec<ApprovalRecord>> {
        let mut sql = format!("SELECT {APPROVAL_COLS} FROM approvals WHERE tenant_id = ?");
        if query.session_id.is_some() {
            sql.push_str(" AND session_id = ?");
        }
        if query.status.is_some() {
            sql.push_str(" AND status = ?");
        }
        if query.after.is_some() {
            sql.push_str(
                " AND (created_at, approval_id) > \
                 (SELECT created_at, approval_id FROM approvals WHERE tenant_id = ? AND approval_id = ?)",
            );
        }
        sql.push_str(" ORDER BY created_at, approval_id LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql).bind(tenant.to_string());
        if let Some(s) = query.session_id {
            q = q.bind(s.to_string());
        }
        if let Some(s) = query.status {
            q = q.bind(keel_core::StateMachine::as_str(s));
        }
        if let Some(a) = query.after {
            q = q.bind(tenant.to_string()).bind(a.to_string());
        }
        q.bind(page(query.limit.unwrap_or(100)))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(approval_from_row)
            .collect()
    }

    pub(super) async fn api_list_artifacts(
        &self,
        tenant: TenantId,
        session: SessionId,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>> {
        self.require_session(tenant, session).await?;
        let mut sql = String::from(
            "SELECT artifact_id, session_id, name, content_type, size, created_at FROM artifacts \
             WHERE tenant_id = ? AND session_id = ?",
        );
        if after.is_some() {
            sql.push_str(
                " AND (created_at, artifact_id) > \
                 (SELECT created_at, artifact_id FROM artifacts WHERE tenant_id = ? AND artifact_id = ?)",
            );
        }
        sql.push_str(" ORDER BY created_at, artifact_id LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql)
            .bind(tenant.to_string())
            .bind(session.to_string());
        if let Some(a) = after {
            q = q.bind(tenant.to_string()).bind(a.to_owned());
        }
        q.bind(page(limit))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(|r| {
                let id: String = r.try_get("artifact_id")?;
                Ok(ArtifactInfo {
                    session_id: parse_id("artifacts", &r.try_get::<String, _>("session_id")?)?,
                    name: r.try_get("name")?,
                    content_type: r.try_get("content_type")?,
                    size: non_negative("artifacts", &id, "size", r.try_get("size")?)?,
                    created_at: time_col("artifacts", &id, "created_at", r.try_get("created_at")?)?,
                    artifact_id: id,
                })
            })
            .collect()
    }

    pub(super) async fn api_memory_list(
        &self,
        tenant: TenantId,
        namespace: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>> {
        let mut sql = String::from(
            "SELECT namespace, key, value, updated_at FROM memory WHERE tenant_id = ? AND namespace = ?",
        );
        if after.is_some() {
            sql.push_str(" AND key > ?");
        }
        sql.push_str(" ORDER BY key LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql)
            .bind(tenant.to_string())
            .bind(namespace.to_owned());
        if let Some(a) = after {
            q = q.bind(a.to_owned());
        }
        q.bind(page(limit))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(memory_from_row)
            .collect()
    }

    pub(super) async fn api_memory_namespaces(
        &self,
        tenant: TenantId,
    ) -> Result<Vec<(String, u64)>> {
        let sql = self.inner.dialect.sql(
            "SELECT namespace, COUNT(*) AS entries FROM memory WHERE tenant_id = ? \
             GROUP BY namespace LIMIT ?",
        );
        let rows = sqlx::query(&sql)
            .bind(tenant.to_string())
            .bind(i64::from(crate::MAX_MEMORY_NAMESPACES))
            .fetch_all(&self.inner.pool)
            .await?;
        let mut out = rows
            .iter()
            .map(|row| {
                let namespace: String = row.try_get("namespace")?;
                let entries: i64 = row.try_get("entries")?;
                let entries = non_negative("memory", &namespace, "entries", entries)?;
                Ok((namespace, entries))
            })
            .collect::<Result<Vec<_>>>()?;
        // Byte-wise, whatever the database's collation.
        out.sort();
        Ok(out)
    }

    pub(super) async fn api_list_releases(
        &self,
        tenant: TenantId,
        after: Option<&ReleaseId>,
        limit: u32,
    ) -> Result<Vec<ReleaseRecord>> {
        let mut sql = String::from(
            "SELECT release_id, definition, created_at FROM releases WHERE tenant_id = ?",
        );
        if after.is_some() {
            sql.push_str(
                " AND (created_at, release_id) > \
                 (SELECT created_at, release_id FROM releases WHERE tenant_id = ? AND release_id = ?)",
            );
        }
        sql.push_str(" ORDER BY created_at, release_id LIMIT ?");
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql).bind(tenant.to_string());
        if let Some(a) = after {
            q = q.bind(tenant.to_string()).bind(a.0.clone());
        }
        q.bind(page(limit))
            .fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(release_from_row)
            .collect()
    }

    pub(super) async fn api_get_release_record(
        &self,
        tenant: TenantId,
        id: &ReleaseId,
    ) -> Result<ReleaseRecord> {
        let row = sqlx::query(&self.sql(
            "SELECT release_id, definition, created_at FROM releases WHERE tenant_id = ? AND release_id = ?",
        ))
        .bind(tenant.to_string())
        .bind(id.0.clone())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("release", id))?;
        release_from_row(&row)
    }
}

/// A `releases` row (`release_id`, `definition`, `created_at`), its definition checked against
/// its id.
fn release_from_row(r: &AnyRow) -> Result<ReleaseRecord> {
    let id = ReleaseId(r.try_get("release_id")?);
    let text: String = r.try_get("definition")?;
    let definition = serde_json::from_str(&text).map_err(|e| corrupt("releases", &id, e))?;
    let release = Release {
        id: id.clone(),
        definition,
    };
    if !release.verify() {
        return Err(corrupt(
            "releases",
            &id,
            "definition does not hash to its id",
        ));
    }
    Ok(ReleaseRecord {
        created_at: time_col("releases", &id, "created_at", r.try_get("created_at")?)?,
        release,
    })
}
