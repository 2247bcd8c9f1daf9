//! Artifacts (content-addressed blobs a session produced) and releases (the pinned agent
//! definitions sessions run). Same SQL on both backends.

use keel_core::{Release, SessionId, TenantId};
use sqlx::Row;

use super::{Commit, SqlStore, ms_to_time, not_found, now_ms, parse_id, uuid_v7_text};
use crate::error::{Result, StoreError};
use crate::types::Artifact;

impl SqlStore {
    pub(super) async fn artifact_put(
        &self,
        tenant: TenantId,
        session: SessionId,
        name: &str,
        content_type: &str,
        data: &[u8],
    ) -> Result<String> {
        let id = uuid_v7_text();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        sqlx::query(&self.sql(
            "INSERT INTO artifacts (tenant_id, artifact_id, session_id, name, content_type, size, data, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ))
        .bind(tenant.to_string())
        .bind(id.clone())
        .bind(session.to_string())
        .bind(name.to_owned())
        .bind(content_type.to_owned())
        .bind(i64::try_from(data.len()).unwrap_or(i64::MAX))
        .bind(data.to_vec())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(id)
    }

    pub(super) async fn artifact_get(
        &self,
        tenant: TenantId,
        artifact_id: &str,
    ) -> Result<Artifact> {
        let row = sqlx::query(&self.sql(
            "SELECT artifact_id, session_id, name, content_type, data, created_at FROM artifacts \
             WHERE tenant_id = ? AND artifact_id = ?",
        ))
        .bind(tenant.to_string())
        .bind(artifact_id.to_owned())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("artifact", artifact_id))?;
        Ok(Artifact {
            artifact_id: row.try_get("artifact_id")?,
            session_id: parse_id("artifacts", &row.try_get::<String, _>("session_id")?)?,
            name: row.try_get("name")?,
            content_type: row.try_get("content_type")?,
            data: row.try_get("data")?,
            created_at: ms_to_time(row.try_get("created_at")?),
        })
    }

    pub(super) async fn release_put(&self, tenant: TenantId, release: &Release) -> Result<()> {
        if !release.verify() {
            return Err(StoreError::InvalidInput(format!(
                "release {} does not match the hash of its definition",
                release.id
            )));
        }
        let definition = serde_json::to_string(&release.definition)
            .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "INSERT INTO releases (tenant_id, release_id, definition, created_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(release.id.0.clone())
        .bind(definition)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(())
    }
}
