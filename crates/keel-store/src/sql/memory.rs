//! The transcript (a session's conversation rows, shared by the journal's appends) and the
//! tenant's long-term memory (namespaced key/value entries with a word search). Same SQL on
//! both backends.

use keel_core::{SessionId, TenantId};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{
    Commit, Dialect, SqlStore, extras, ms_to_time, non_negative, not_found, now_ms, parse_id,
    parse_json, to_i64,
};
use crate::error::Result;
use crate::types::{MemoryEntry, TranscriptItem};

/// The most words a memory search uses; later ones are ignored.
const MAX_SEARCH_WORDS: usize = 32;

pub(super) fn memory_from_row(row: &AnyRow) -> Result<MemoryEntry> {
    let key: String = row.try_get("key")?;
    let value: String = row.try_get("value")?;
    Ok(MemoryEntry {
        namespace: row.try_get("namespace")?,
        value: parse_json("memory", &key, &value)?,
        key,
        updated_at: ms_to_time(row.try_get("updated_at")?),
    })
}

/// The words of a memory search (issue 15): runs of letters and digits, lower-cased, at most
/// [`MAX_SEARCH_WORDS`] — what both backends' full-text indexes are built from (see migration
/// 0010). Everything else separates words, so no query text reaches FTS5's or `to_tsquery`'s
/// syntax.
pub(super) fn search_words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_SEARCH_WORDS)
        .map(str::to_lowercase)
        .collect()
}

impl SqlStore {
    pub(super) async fn transcript_append(
        &self,
        tenant: TenantId,
        session: SessionId,
        items: &[TranscriptItem],
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        let rows = items
            .iter()
            .map(extras::TranscriptRow::of)
            .collect::<Result<Vec<_>>>()?;
        extras::write_transcript(
            &mut tx,
            self.dialect(),
            &tenant.to_string(),
            &session.to_string(),
            &rows,
            now_ms(),
        )
        .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn transcript_read(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_index: u64,
    ) -> Result<Vec<TranscriptItem>> {
        let rows = sqlx::query(&self.sql(
            "SELECT idx, turn_id, role, content FROM transcript \
             WHERE tenant_id = ? AND session_id = ? AND idx >= ? ORDER BY idx",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(to_i64(from_index)?)
        .fetch_all(&self.inner.pool)
        .await?;
        if rows.is_empty() {
            self.require_session(tenant, session).await?;
        }
        rows.iter()
            .map(|r| {
                let idx: i64 = r.try_get("idx")?;
                let turn: Option<String> = r.try_get("turn_id")?;
                Ok(TranscriptItem {
                    index: non_negative("transcript", idx, "idx", idx)?,
                    turn_id: turn
                        .as_deref()
                        .map(|t| parse_id("transcript", t))
                        .transpose()?,
                    role: r.try_get("role")?,
                    content: parse_json("transcript", idx, &r.try_get::<String, _>("content")?)?,
                })
            })
            .collect()
    }

    pub(super) async fn memory_put_row(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
        value: &Value,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "INSERT INTO memory (tenant_id, namespace, key, value, updated_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (tenant_id, namespace, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        ))
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .bind(value.to_string())
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    pub(super) async fn memory_get_row(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
    ) -> Result<Option<MemoryEntry>> {
        let row = sqlx::query(&self.sql(
            "SELECT namespace, key, value, updated_at FROM memory WHERE tenant_id = ? AND namespace = ? AND key = ?",
        ))
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .fetch_optional(&self.inner.pool)
        .await?;
        row.as_ref().map(memory_from_row).transpose()
    }

    pub(super) async fn memory_search_rows(
        &self,
        tenant: TenantId,
        namespace: Option<&str>,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>> {
        let words = search_words(query);
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let ns_filter = if namespace.is_some() {
            " AND m.namespace = ?"
        } else {
            ""
        };
        let (sql, expr) = match self.inner.dialect {
            // BM25 is lower for better matches; `rank` is the FTS5 table's BM25 by default.
            Dialect::Sqlite => (
                format!(
                    "SELECT m.namespace, m.key, m.value, m.updated_at FROM memory_fts \
                     JOIN memory m ON m.id = memory_fts.rowid \
                     WHERE memory_fts MATCH ? AND m.tenant_id = ?{ns_filter} \
                     ORDER BY memory_fts.rank, m.updated_at DESC, m.key LIMIT ?"
                ),
                words
                    .iter()
                    .map(|w| format!("\"{w}\"*"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            Dialect::Postgres => (
                format!(
                    "SELECT m.namespace, m.key, m.value, m.updated_at \
                     FROM memory m, to_tsquery('simple', ?) q \
                     WHERE m.search @@ q AND m.tenant_id = ?{ns_filter} \
                     ORDER BY ts_rank(m.search, q) DESC, m.updated_at DESC, m.key LIMIT ?"
                ),
                words
                    .iter()
                    .map(|w| format!("{w}:*"))
                    .collect::<Vec<_>>()
                    .join(" & "),
            ),
        };
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).bind(expr).bind(tenant.to_string());
        if let Some(ns) = namespace {
            q = q.bind(ns.to_owned());
        }
        let rows = q.bind(i64::from(limit)).fetch_all(&self.inner.pool).await?;
        rows.iter().map(memory_from_row).collect()
    }

    pub(super) async fn memory_delete_row(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
    ) -> Result<bool> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(
            &self.sql("DELETE FROM memory WHERE tenant_id = ? AND namespace = ? AND key = ?"),
        )
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(done.rows_affected() > 0)
    }
}
