//! Batched lease renewal ([`crate::Store::renew_leases`]): one `UPDATE` per
//! [`crate::RENEW_BATCH`] leases, matching each lease by `(session_id, lease_epoch,
//! lease_owner)` against a `VALUES` list (a row-value `IN` whose right side is a subquery, as
//! SQLite requires; PostgreSQL runs the same text). The fencing rule is
//! [`crate::Store::renew_lease`]'s: only the holder at its epoch renews, expired or not. On
//! PostgreSQL the renewals run on a connection of their own, not in the pool's queue.

use std::collections::HashMap;
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use sqlx::Row;

use super::{Commit, SqlStore, expires_ms, ms_to_time, now_ms, parse_id, to_i64};
use crate::error::Result;
use crate::types::Lease;

impl SqlStore {
    pub(crate) async fn renew_many(
        &self,
        tenant: TenantId,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<Lease>> {
        let mut renewed = Vec::with_capacity(leases.len());
        for batch in leases.chunks(crate::RENEW_BATCH) {
            let rows = vec!["(?, ?, ?)"; batch.len()].join(", ");
            let sql = format!(
                "UPDATE sessions SET lease_expires_at = ?, updated_at = ? \
                 WHERE tenant_id = ? AND (session_id, lease_epoch, lease_owner) IN (VALUES {rows}) \
                 RETURNING session_id, lease_epoch, lease_expires_at"
            );
            let sql = self.sql(&sql);
            let now = now_ms();
            let mut q = sqlx::query(&sql)
                .bind(expires_ms(now, ttl))
                .bind(now)
                .bind(tenant.to_string());
            for l in batch {
                q = q
                    .bind(l.session_id.to_string())
                    .bind(to_i64(l.epoch.0)?)
                    .bind(l.owner.clone());
            }
            let mut conn = match &self.inner.renewals {
                Some(own) => super::WriteConn::Pooled(own.acquire().await?),
                None => self.write_conn().await?,
            };
            // `fetch_all`: the autocommit statement's own commit runs after its rows.
            let rows = q
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| self.located(e.into()))?;
            drop(conn);
            if rows.is_empty() {
                continue;
            }
            self.committed(Commit::Leases);
            let asked: HashMap<(SessionId, u64), &Lease> = batch
                .iter()
                .map(|l| ((l.session_id, l.epoch.0), l))
                .collect();
            for r in &rows {
                let id: String = r.try_get("session_id")?;
                let epoch: i64 = r.try_get("lease_epoch")?;
                let expires: i64 = r.try_get("lease_expires_at")?;
                let session: SessionId = parse_id("sessions", &id)?;
                let epoch = super::non_negative("sessions", &id, "lease_epoch", epoch)?;
                if let Some(l) = asked.get(&(session, epoch)) {
                    renewed.push(Lease {
                        expires_at: ms_to_time(expires),
                        ..(*l).clone()
                    });
                }
            }
        }
        Ok(renewed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use keel_core::{ReleaseId, SessionId, TenantId};
    use serde_json::json;
    use sqlx::Executor;

    use crate::store::Store;
    use crate::types::NewSession;

    /// PostgreSQL: a renewal goes through while every connection of the store's pool is held
    /// (by runs starting at once, say): renewals have a connection of their own. Without it the
    /// renewal waits for the pool's acquire timeout and fails.
    #[tokio::test]
    async fn a_renewal_goes_through_while_the_pool_is_exhausted() {
        let url = std::env::var("KEEL_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!(
            "keel_unit_renewals_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let store = super::SqlStore::connect_postgres(&url, Some(&schema))
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} (set KEEL_TEST_DATABASE_URL): {e}"));
        let tenant = TenantId::new();
        let session = SessionId::new();
        store
            .create_session(
                tenant,
                NewSession {
                    session_id: session,
                    release_id: ReleaseId::from("sha256:test"),
                    parent_session_id: None,
                    metadata: json!({}),
                },
            )
            .await
            .unwrap();
        let ttl = Duration::from_secs(30);
        let lease = store
            .acquire_lease(tenant, session, "worker-a", ttl)
            .await
            .unwrap();
        let mut held = Vec::new();
        while held.len() < store.inner.pool.options().get_max_connections() as usize {
            held.push(store.inner.pool.acquire().await.unwrap());
        }
        let renewed = store
            .renew_leases(tenant, std::slice::from_ref(&lease), ttl)
            .await;
        let mut conn = held.pop().unwrap();
        conn.execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
            .await
            .unwrap();
        let renewed = renewed.unwrap();
        assert_eq!(renewed.len(), 1, "the lease is renewed: {renewed:?}");
        assert_eq!(renewed[0].epoch, lease.epoch);
    }
}
