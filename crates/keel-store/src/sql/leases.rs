//! Leases: taking one (free or expired), taking one over from a dead holder, renewing one or
//! many, releasing one, and the wake-up of workers a release may owe.
//!
//! Batched renewal ([`crate::Store::renew_leases`]): one `UPDATE` per
//! [`crate::RENEW_BATCH`] leases, matching each lease by `(session_id, lease_epoch,
//! lease_owner)` against a `VALUES` list (a row-value `IN` whose right side is a subquery, as
//! SQLite requires; PostgreSQL runs the same text). The fencing rule is
//! [`crate::Store::renew_lease`]'s: only the holder at its epoch renews, expired or not. On
//! PostgreSQL the renewals run on a connection of their own, not in the pool's queue.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

/// The binds of [`ACQUIRE_LEASE`]: `owner` takes the lease for `ttl` from `now` (Unix ms).
pub(super) fn acquire_binds(
    owner: &str,
    ttl: Duration,
    now: i64,
    tenant: TenantId,
    session: SessionId,
) -> Vec<Bind> {
    acquire_binds_of(owner, ttl, now, tenant, &[session])
}

/// The binds of [`ACQUIRE_LEASE`] (one session) or [`ACQUIRE_LEASES`] (the `IN` list's).
pub(super) fn acquire_binds_of(
    owner: &str,
    ttl: Duration,
    now: i64,
    tenant: TenantId,
    sessions: &[SessionId],
) -> Vec<Bind> {
    let mut binds = vec![
        Bind::Text(owner.to_owned()),
        Bind::Int(expires_ms(now, ttl)),
        Bind::Int(now_ms()),
        Bind::Int(now),
        Bind::Text(tenant.to_string()),
    ];
    binds.extend(sessions.iter().map(|s| Bind::Text(s.to_string())));
    binds
}

/// The one acquisition rule of [`Store::acquire_lease`] and [`Store::claim_sessions`]: takes
/// free or expired leases of a tenant's sessions, bumping each epoch (binds: owner, expires_at,
/// updated_at, now, tenant); the statements below add which sessions.
macro_rules! acquire_leases {
    () => {
        "UPDATE sessions SET lease_owner = ?, lease_epoch = lease_epoch + 1, \
         lease_expires_at = ?, updated_at = ? \
         WHERE (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?) \
         AND tenant_id = ?"
    };
}

/// Takes one session's lease ([`acquire_leases`]; binds: those and the session).
pub(super) const ACQUIRE_LEASE: &str = concat!(
    acquire_leases!(),
    " AND session_id = ? RETURNING lease_epoch, lease_expires_at"
);

/// Takes several sessions' leases in one statement ([`acquire_leases`]): followed by
/// ` AND session_id IN (?, …) RETURNING session_id, lease_epoch, lease_expires_at`.
pub(super) const ACQUIRE_LEASES: &str = acquire_leases!();

/// Attempts of `acquire_lease` at a lease seen free after a refused attempt.
pub(super) const ACQUIRE_ATTEMPTS: usize = 8;

/// Whether the `sessions` row has work at a time (one bind: Unix ms): marked runnable, a due
/// wake-up time, or a posted intent ([`crate::scheduling`]).
pub(super) const HAS_WORK: &str = "(sessions.runnable = 1 \
     OR (sessions.wake_at IS NOT NULL AND sessions.wake_at <= ?) \
     OR EXISTS (SELECT 1 FROM intents WHERE intents.tenant_id = sessions.tenant_id \
     AND intents.session_id = sessions.session_id))";

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

impl SqlStore {
    /// Runs a lease `UPDATE … RETURNING lease_epoch, lease_expires_at[, …]` with `binds` on
    /// `conn` (in the caller's transaction, or as its own); the row when one matched.
    pub(super) async fn lease_stmt(
        &self,
        conn: &mut AnyConnection,
        sql: &str,
        binds: Vec<Bind>,
    ) -> Result<Option<AnyRow>> {
        let q = self.sql(sql);
        let query = batch::bind_all(sqlx::query(&q), binds);
        // `fetch_all`, not `fetch_optional`: an autocommit statement's own commit (where a full
        // disk fails it) runs after its RETURNING row; stopping at the first row would report a
        // lease the database never kept.
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.located(e.into()))?;
        Ok(rows.into_iter().next())
    }

    /// Runs a lease statement ([`SqlStore::lease_stmt`]) as its own commit on the writer and
    /// counts it; `(lease_epoch, lease_expires_at, row)` when a row matched.
    pub(super) async fn lease_write(
        &self,
        sql: &str,
        binds: Vec<Bind>,
    ) -> Result<Option<(i64, i64, AnyRow)>> {
        let mut conn = self.write_conn().await?;
        match self.lease_stmt(&mut conn, sql, binds).await? {
            Some(r) => {
                self.committed(Commit::Leases);
                Ok(Some((
                    r.try_get("lease_epoch")?,
                    r.try_get("lease_expires_at")?,
                    r,
                )))
            }
            None => Ok(None),
        }
    }

    /// Releases `lease` (fenced by owner and epoch). With `claim = Some((defer_until,
    /// clear_wake_before))` (Unix ms) it also sets `claim_after` and clears a wake-up time at or
    /// before `clear_wake_before` ([`Store::release_claim`]); otherwise both stay
    /// ([`Store::release_lease`]). Either way it wakes the workers when the session still has
    /// work ([`HAS_WORK`]) and is not deferred past now: a turn queued under a lease held for
    /// it (an API call) becomes claimable only here.
    ///
    /// # Errors
    /// `LeaseLost` (nothing written), `NotFound`.
    pub(super) async fn release_with(
        &self,
        tenant: TenantId,
        lease: &Lease,
        claim: Option<(Option<i64>, Option<i64>)>,
    ) -> Result<()> {
        let now = now_ms();
        let mut binds = vec![Bind::Int(now)];
        let claim_set = match claim {
            Some((defer, clear_before)) => {
                binds.push(Bind::OptInt(defer));
                binds.push(Bind::OptInt(clear_before));
                ", claim_after = ?, wake_at = CASE WHEN wake_at IS NOT NULL AND wake_at <= ? \
                 THEN NULL ELSE wake_at END"
            }
            None => "",
        };
        binds.extend([
            Bind::Text(lease.owner.clone()),
            Bind::Int(i64::try_from(lease.epoch.0).unwrap_or(i64::MAX)),
            Bind::Text(tenant.to_string()),
            Bind::Text(lease.session_id.to_string()),
            Bind::Int(now),
        ]);
        let sql = format!(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ?{claim_set} \
             WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
             RETURNING lease_epoch, 0 AS lease_expires_at, CASE WHEN {HAS_WORK} THEN 1 ELSE 0 END AS has_work"
        );
        let Some((_, _, row)) = self.lease_write(&sql, binds).await? else {
            return Err(self.lease_lost(tenant, lease.session_id, lease.epoch).await);
        };
        let deferred = claim.and_then(|(defer, _)| defer).is_some_and(|d| d > now);
        if row.try_get::<i64, _>("has_work")? == 1 && !deferred {
            self.wake_workers(tenant, lease.session_id).await?;
        }
        Ok(())
    }

    /// Wakes `wait_for_work` callers about `session` after a commit: a NOTIFY on PostgreSQL
    /// (every store listening on the schema, this one included), in-process on SQLite.
    pub(super) async fn wake_workers(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        match self.inner.dialect {
            Dialect::Postgres => {
                let mut conn = self.inner.pool.acquire().await?;
                self.note_work(&mut conn, tenant, session).await
            }
            Dialect::Sqlite => {
                self.inner.waiters.work.signal();
                Ok(())
            }
        }
    }

    /// PostgreSQL: queues the work notification about `session` on `conn` (delivered when its
    /// transaction commits). SQLite: nothing; the caller calls [`SqlStore::woke_locally`] after
    /// its commit.
    pub(super) async fn note_work(
        &self,
        conn: &mut AnyConnection,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<()> {
        if self.inner.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)::text")
                .bind(self.inner.work_channel.clone())
                .bind(work_payload(tenant, session))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// SQLite: wakes this process's `wait_for_work` callers after a commit that
    /// [`SqlStore::note_work`] noted (PostgreSQL's notification arrives through the listener).
    pub(super) fn woke_locally(&self) {
        if self.inner.dialect == Dialect::Sqlite {
            self.inner.waiters.work.signal();
        }
    }

    pub(super) async fn lease_lost(
        &self,
        tenant: TenantId,
        session: SessionId,
        held: LeaseEpoch,
    ) -> StoreError {
        match self.get_session(tenant, session).await {
            Ok(rec) => StoreError::LeaseLost {
                session,
                held,
                current: rec.lease_epoch,
                owner: rec.lease.map(|l| l.owner),
            },
            Err(e) => e,
        }
    }

    /// [`Store::acquire_lease`].
    pub(super) async fn take_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        // The lease may be given back between a refused attempt and the look at its holder
        // (callers contending for one session's short lease: concurrent submits): then it is
        // free, and the attempt is made again rather than failing the caller.
        for _ in 0..ACQUIRE_ATTEMPTS {
            let now = now_ms();
            let row = self
                .lease_write(
                    ACQUIRE_LEASE,
                    acquire_binds(owner, ttl, now, tenant, session),
                )
                .await?;
            if let Some((epoch, exp, _)) = row {
                return Ok(Lease {
                    session_id: session,
                    owner: owner.to_owned(),
                    epoch: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
                    expires_at: ms_to_time(exp),
                });
            }
            let rec = self.get_session(tenant, session).await?;
            if let Some(l) = rec.lease
                && l.expires_at.timestamp_millis() > now_ms()
            {
                return Err(StoreError::LeaseHeld {
                    session,
                    owner: l.owner,
                    expires_at: l.expires_at,
                });
            }
        }
        Err(StoreError::Conflict(format!(
            "lease of session {session} changed hands {ACQUIRE_ATTEMPTS} times during acquisition"
        )))
    }

    /// [`Store::take_over_lease`].
    pub(super) async fn take_over(
        &self,
        tenant: TenantId,
        session: SessionId,
        dead_owner: &str,
        dead_epoch: LeaseEpoch,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        let now = now_ms();
        let row = self
            .lease_write(
                "UPDATE sessions SET lease_owner = ?, lease_epoch = lease_epoch + 1, lease_expires_at = ?, updated_at = ? \
                 WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
                 RETURNING lease_epoch, lease_expires_at",
                vec![
                    Bind::Text(owner.to_owned()),
                    Bind::Int(expires_ms(now, ttl)),
                    Bind::Int(now),
                    Bind::Text(dead_owner.to_owned()),
                    Bind::Int(i64::try_from(dead_epoch.0).unwrap_or(i64::MAX)),
                    Bind::Text(tenant.to_string()),
                    Bind::Text(session.to_string()),
                ],
            )
            .await?;
        match row {
            Some((epoch, exp, _)) => Ok(Lease {
                session_id: session,
                owner: owner.to_owned(),
                epoch: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
                expires_at: ms_to_time(exp),
            }),
            None => Err(self.lease_lost(tenant, session, dead_epoch).await),
        }
    }

    /// [`Store::renew_lease`].
    pub(super) async fn renew_one(
        &self,
        tenant: TenantId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease> {
        let now = now_ms();
        let row = self
            .lease_write(
                "UPDATE sessions SET lease_expires_at = ?, updated_at = ? \
                 WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
                 RETURNING lease_epoch, lease_expires_at",
                vec![
                    Bind::Int(expires_ms(now, ttl)),
                    Bind::Int(now),
                    Bind::Text(lease.owner.clone()),
                    Bind::Int(i64::try_from(lease.epoch.0).unwrap_or(i64::MAX)),
                    Bind::Text(tenant.to_string()),
                    Bind::Text(lease.session_id.to_string()),
                ],
            )
            .await?;
        match row {
            Some((_, exp, _)) => Ok(Lease {
                expires_at: ms_to_time(exp),
                ..lease.clone()
            }),
            None => Err(self.lease_lost(tenant, lease.session_id, lease.epoch).await),
        }
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
