//! The scheduler's queries ([`crate::scheduling`]) for both dialects: one SQL text each, with
//! PostgreSQL's `FOR UPDATE SKIP LOCKED` on the claim (of up to `k` sessions at once) and its per-tenant advisory lock as the
//! only differences.
//!
//! A claim's candidates are the union of three small sets, each read through an index: sessions
//! marked runnable (`sessions_runnable`), due wake-up times (`sessions_by_wake`) and sessions
//! with intents (the intents' primary key); the lease, deferral and schema conditions filter
//! those. The claim then takes the picked sessions' leases with [`super::leases::ACQUIRE_LEASES`] (the
//! rule of `acquire_lease`) over their ids, one statement per [`CLAIM_CHUNK`], in the same
//! transaction: the same fencing rule (epoch + 1, also for the same owner). A claim with a
//! tenant limit first counts the tenant's live leases in that transaction, after taking the
//! tenant's advisory lock on PostgreSQL ([`TENANT_CLAIM_LOCK`]; SQLite's `BEGIN IMMEDIATE`
//! already excludes other writers), so the count and the claim are one step for every claimer
//! of the tenant.

use std::time::Duration;

use chrono::{DateTime, Utc};
use keel_core::mechanisms::{Mechanism, is_off};
use keel_core::{LeaseEpoch, SessionStatus, TenantId};
use sqlx::Row;

use super::leases::{ACQUIRE_LEASES, acquire_binds_of};
use super::{
    Commit, Dialect, SqlStore, batch, corrupt, ms_to_time, non_negative, now_ms, parse_id, to_i64,
};
use crate::error::{Result, StoreError};
use crate::scheduling::{Claim, TenantBacklog, TokenWindow};
use crate::types::Lease;

/// Most leases one statement of a claim takes (the IN list's width; SQLite allows 32,766
/// parameters): a claim of more takes them in several statements, same transaction.
const CLAIM_CHUNK: usize = 1024;

/// Sessions (`s`) with work at a time: the candidates of every tenant (binds: now).
const CANDIDATES: &str = "(s.tenant_id, s.session_id) IN (\
     SELECT tenant_id, session_id FROM sessions WHERE runnable = 1 \
     UNION ALL SELECT tenant_id, session_id FROM sessions WHERE wake_at IS NOT NULL AND wake_at <= ? \
     UNION ALL SELECT tenant_id, session_id FROM intents)";

/// Sessions (`s`) of one tenant with work at a time (binds: tenant, tenant, now, tenant; `s`
/// is of that tenant too).
const TENANT_CANDIDATES: &str = "s.session_id IN (\
     SELECT session_id FROM sessions WHERE tenant_id = ? AND runnable = 1 \
     UNION ALL SELECT session_id FROM sessions WHERE tenant_id = ? AND wake_at IS NOT NULL AND wake_at <= ? \
     UNION ALL SELECT session_id FROM intents WHERE tenant_id = ?)";

/// A session (`s`) a worker may claim now, given it has work (binds: now, now, max schema
/// version): its lease free or expired, not deferred, written by a schema the worker reads.
const FREE: &str = "(s.lease_owner IS NULL OR s.lease_expires_at IS NULL OR s.lease_expires_at <= ?) \
     AND (s.claim_after IS NULL OR s.claim_after <= ?) AND s.schema_version <= ?";

/// A session (`s`) whose lease is not the claimer's own, expired less than a lease TTL ago
/// (binds: the claimer, now − TTL): the claimer's own runs renew their leases, an expired one
/// included ([`crate::Store::renew_leases`]), so a worker whose heartbeat ran late does not
/// take over its own sessions under runs still in flight (bumping the epoch fences that run
/// off and restarts its work). A lease of its own that stayed expired for a whole TTL more is
/// claimable again (its run is gone, say the give-back failed).
const NOT_OWN_RECENT: &str = "(s.lease_owner IS NULL OR s.lease_owner <> ? \
     OR s.lease_expires_at IS NULL OR s.lease_expires_at <= ?)";

/// The claim order: priority, then runnable sessions by how long they have been, then due
/// timers and intents (earliest wake-up first, then the oldest session).
const CLAIM_ORDER: &str = "s.priority DESC, s.runnable DESC, s.runnable_since, \
     CASE WHEN s.wake_at IS NULL THEN 1 ELSE 0 END, s.wake_at, s.created_at, s.session_id";

/// PostgreSQL: takes the transaction-scoped advisory lock of one tenant's claims (bind: the
/// tenant id), in a key space of its own (the two-key form, class 7465013), keyed by schema
/// too so stores in other schemas of the database do not wait on each other.
const TENANT_CLAIM_LOCK: &str =
    "SELECT pg_advisory_xact_lock(7465013, hashtext(current_schema() || ':' || $1))";

/// How long token windows are kept after they start (ms): two minutes.
const WINDOW_RETENTION_MS: i64 = 120_000;

/// A `u32` as an SQL integer.
/// The newest event schema a worker claims: `max`, or any with `schema_version_check` turned off
/// (test builds, `keel_core::mechanisms`).
fn readable(max: u32) -> i64 {
    if is_off(Mechanism::SchemaVersionCheck) {
        i64::MAX
    } else {
        int(max)
    }
}

fn int(v: u32) -> i64 {
    i64::from(v)
}

impl SqlStore {
    pub(crate) async fn sched_runnable_tenants(
        &self,
        now: DateTime<Utc>,
        max_schema_version: u32,
        limit: u32,
    ) -> Result<Vec<TenantBacklog>> {
        let now = now.timestamp_millis();
        // Tenants whose claimable work waited longest come first, so none is left out for good
        // when there are more than `limit`.
        let sql = format!(
            "SELECT c.tenant_id, c.claimable, \
             (SELECT count(*) FROM sessions l WHERE l.tenant_id = c.tenant_id \
              AND l.lease_owner IS NOT NULL AND l.lease_expires_at > ?) AS leased \
             FROM (SELECT s.tenant_id, count(*) AS claimable, \
                   MIN(COALESCE(s.runnable_since, s.wake_at, s.updated_at)) AS oldest \
                   FROM sessions s WHERE {CANDIDATES} AND {FREE} GROUP BY s.tenant_id) c \
             ORDER BY c.oldest, c.tenant_id LIMIT ?"
        );
        let rows = sqlx::query(&self.sql(&sql))
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(readable(max_schema_version))
            .bind(int(limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let tenant: String = r.try_get("tenant_id")?;
                Ok(TenantBacklog {
                    tenant_id: parse_id("sessions", &tenant)?,
                    claimable: non_negative(
                        "sessions",
                        &tenant,
                        "claimable",
                        r.try_get("claimable")?,
                    )?,
                    leased: non_negative("sessions", &tenant, "leased", r.try_get("leased")?)?,
                })
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn sched_claim_sessions(
        &self,
        tenant: TenantId,
        owner: &str,
        ttl: Duration,
        now: DateTime<Utc>,
        max_schema_version: u32,
        max_leased: u64,
        limit: u32,
    ) -> Result<Vec<Claim>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // `now` is the caller's clock when it called. The time spent here waiting for a
        // connection, and on the statements before each lease, is added to it (monotonic
        // time, so a caller's clock skew is kept): a claim that waited seconds on a busy pool
        // must not take leases that are already expired, which the next claim round (this
        // worker's own) would take over again at once.
        let called = std::time::Instant::now();
        let base = now.timestamp_millis();
        let at = move || {
            base.saturating_add(i64::try_from(called.elapsed().as_millis()).unwrap_or(i64::MAX))
        };
        let t = tenant.to_string();
        let lock = match self.inner.dialect {
            Dialect::Postgres => " FOR UPDATE OF s SKIP LOCKED",
            // BEGIN IMMEDIATE on the one writer: nobody else claims meanwhile.
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "SELECT s.session_id, s.lease_owner, s.runnable, s.runnable_since FROM sessions s \
             WHERE s.tenant_id = ? AND {TENANT_CANDIDATES} AND {FREE} AND {NOT_OWN_RECENT} \
             ORDER BY {CLAIM_ORDER} LIMIT ?{lock}"
        );
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        let now = at();
        let mut take = u64::from(limit);
        if max_leased < u64::MAX {
            if self.inner.dialect == Dialect::Postgres {
                // The tenant's claims take turns from here to the commit, so the count below
                // sees every claim committed before this one (read committed: each statement
                // sees what committed before it began). Keyed by schema and tenant.
                sqlx::query(TENANT_CLAIM_LOCK)
                    .bind(t.clone())
                    .execute(&mut *tx)
                    .await?;
            }
            let leased = sqlx::query(&self.sql(
                "SELECT count(*) AS n FROM sessions \
                 WHERE tenant_id = ? AND lease_owner IS NOT NULL AND lease_expires_at > ?",
            ))
            .bind(t.clone())
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            let leased = non_negative("sessions", &t, "leased", leased.try_get("n")?)?;
            // Every claim here is of a session without a live lease: each adds one.
            take = take.min(max_leased.saturating_sub(leased));
            if take == 0 {
                tx.rollback().await?;
                return Ok(Vec::new());
            }
        }
        let picked = sqlx::query(&self.sql(&sql))
            .bind(t.clone())
            .bind(t.clone())
            .bind(t.clone())
            .bind(now)
            .bind(t.clone())
            .bind(now)
            .bind(now)
            .bind(readable(max_schema_version))
            .bind(owner.to_owned())
            .bind(now.saturating_sub(super::ttl_ms(ttl)))
            .bind(to_i64(take)?)
            .fetch_all(&mut *tx)
            .await?;
        if picked.is_empty() {
            tx.rollback().await?;
            return Ok(Vec::new());
        }
        // The picked sessions' leases in one statement per CLAIM_CHUNK (a round trip for the
        // round, not one a session: a worker resuming 1,000 sessions made 1,000).
        let mut rows = Vec::with_capacity(picked.len());
        let mut sessions = Vec::with_capacity(picked.len());
        for row in &picked {
            let id: String = row.try_get("session_id")?;
            sessions.push(parse_id("sessions", &id)?);
            rows.push((
                id,
                row.try_get::<Option<String>, _>("lease_owner")?,
                row.try_get::<i64, _>("runnable")?,
                row.try_get::<Option<i64>, _>("runnable_since")?,
            ));
        }
        // Not earlier than `now`: FREE's condition implies the acquisition's.
        let now = at().max(now);
        let mut taken = std::collections::HashMap::with_capacity(sessions.len());
        for chunk in sessions.chunks(CLAIM_CHUNK) {
            // The IN list padded to a power of two with the chunk's last id (a repeat matches
            // nothing more): a few statement texts for the prepared-statement cache, not one
            // per round size.
            let width = chunk.len().next_power_of_two().min(CLAIM_CHUNK);
            let marks = vec!["?"; width].join(", ");
            let sql = format!(
                "{ACQUIRE_LEASES} AND session_id IN ({marks}) \
                 RETURNING session_id, lease_epoch, lease_expires_at"
            );
            let sql = self.sql(&sql);
            let mut ids = chunk.to_vec();
            ids.resize(width, chunk[chunk.len() - 1]);
            let binds = acquire_binds_of(owner, ttl, now, tenant, &ids);
            let rows = batch::bind_all(sqlx::query(&sql), binds)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.located(e.into()))?;
            for r in rows {
                let id: String = r.try_get("session_id")?;
                let lease: (i64, i64) = (r.try_get("lease_epoch")?, r.try_get("lease_expires_at")?);
                taken.insert(id, lease);
            }
        }
        let mut claims = Vec::with_capacity(picked.len());
        for (session, (id, previous, runnable, since)) in sessions.into_iter().zip(rows) {
            let Some((epoch, expires)) = taken.remove(&id) else {
                // The rows are locked (PostgreSQL) or the writer is ours (SQLite), and FREE
                // implies the acquisition's condition: this cannot happen.
                return Err(StoreError::Conflict(format!(
                    "lease of session {session} changed during its claim"
                )));
            };
            claims.push(Claim {
                tenant_id: tenant,
                lease: Lease {
                    session_id: session,
                    owner: owner.to_owned(),
                    epoch: LeaseEpoch(non_negative("sessions", &id, "lease_epoch", epoch)?),
                    expires_at: ms_to_time(expires),
                },
                took_over: previous,
                runnable_since: match (runnable, since) {
                    (1, Some(ms)) => Some(ms_to_time(ms)),
                    _ => None,
                },
            });
        }
        tx.commit().await.map_err(|e| self.located(e.into()))?;
        self.committed(Commit::Leases);
        Ok(claims)
    }

    pub(crate) async fn sched_release_claim(
        &self,
        tenant: TenantId,
        lease: &Lease,
        defer_until: Option<DateTime<Utc>>,
        clear_wake_before: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.release_with(
            tenant,
            lease,
            Some((
                defer_until.map(|t| t.timestamp_millis()),
                clear_wake_before.map(|t| t.timestamp_millis()),
            )),
        )
        .await
    }

    pub(crate) async fn sched_wait_for_work(&self, timeout: Duration) -> Result<bool> {
        Ok(self.inner.waiters.work.wait(timeout).await)
    }

    pub(crate) async fn sched_queue_depth(&self, tenant: TenantId) -> Result<(u64, u64)> {
        let row = sqlx::query(&self.sql(
            "SELECT CAST(COALESCE(SUM(CASE WHEN tenant_id = ? THEN queued_turns ELSE 0 END), 0) AS BIGINT) AS mine, \
             CAST(COALESCE(SUM(queued_turns), 0) AS BIGINT) AS total \
             FROM sessions WHERE queued_turns > 0",
        ))
        .bind(tenant.to_string())
        .fetch_one(&self.inner.pool)
        .await?;
        Ok((
            non_negative("sessions", tenant, "queued_turns", row.try_get("mine")?)?,
            non_negative("sessions", "*", "queued_turns", row.try_get("total")?)?,
        ))
    }

    pub(crate) async fn sched_queue_depths(&self) -> Result<Vec<(TenantId, u64)>> {
        let rows = sqlx::query(
            "SELECT tenant_id, CAST(SUM(queued_turns) AS BIGINT) AS queued FROM sessions \
             WHERE queued_turns > 0 GROUP BY tenant_id ORDER BY tenant_id",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let tenant: String = r.try_get("tenant_id")?;
                Ok((
                    parse_id("sessions", &tenant)?,
                    non_negative("sessions", &tenant, "queued_turns", r.try_get("queued")?)?,
                ))
            })
            .collect()
    }

    pub(crate) async fn sched_session_counts(&self) -> Result<Vec<(SessionStatus, u64)>> {
        let rows = sqlx::query(
            "SELECT status, count(*) AS n FROM sessions GROUP BY status ORDER BY status",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let status: String = r.try_get("status")?;
                Ok((
                    status
                        .parse::<SessionStatus>()
                        .map_err(|e| corrupt("sessions", &status, e))?,
                    non_negative("sessions", &status, "count", r.try_get("n")?)?,
                ))
            })
            .collect()
    }

    pub(crate) async fn sched_newer_schema_sessions(&self, max: u32) -> Result<u64> {
        let sql = format!(
            "SELECT count(*) AS n FROM sessions s WHERE {CANDIDATES} AND s.schema_version > ?"
        );
        let row = sqlx::query(&self.sql(&sql))
            .bind(now_ms())
            .bind(int(max))
            .fetch_one(&self.inner.pool)
            .await?;
        non_negative("sessions", "*", "count", row.try_get("n")?)
    }

    pub(crate) async fn sched_reserve_tokens(
        &self,
        tenant: TenantId,
        window_start: i64,
        tokens: u64,
        limit: u64,
    ) -> Result<TokenWindow> {
        let (tokens, limit) = (to_i64(tokens)?, to_i64(limit)?);
        let t = tenant.to_string();
        let mut conn = self.write_conn().await?;
        self.forget_windows(&mut conn, &t, window_start).await?;
        // One statement, atomic on both dialects: concurrent upserts of one window take turns
        // on its row (PostgreSQL re-checks the condition on the row it waited for). A new or
        // empty window admits any amount: a request larger than the limit runs, alone.
        let admitted = sqlx::query(&self.sql(
            "INSERT INTO token_windows (tenant_id, window_start, tokens) VALUES (?, ?, ?) \
             ON CONFLICT (tenant_id, window_start) DO UPDATE \
             SET tokens = token_windows.tokens + excluded.tokens \
             WHERE token_windows.tokens = 0 OR token_windows.tokens + excluded.tokens <= ? \
             RETURNING tokens",
        ))
        .bind(t.clone())
        .bind(window_start)
        .bind(tokens)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| self.located(e.into()))?;
        if let Some(row) = admitted.first() {
            self.committed(Commit::Tables);
            return Ok(TokenWindow {
                admitted: true,
                used: non_negative("token_windows", &t, "tokens", row.try_get("tokens")?)?,
            });
        }
        let row = sqlx::query(
            &self.sql("SELECT tokens FROM token_windows WHERE tenant_id = ? AND window_start = ?"),
        )
        .bind(t.clone())
        .bind(window_start)
        .fetch_optional(&mut *conn)
        .await?;
        let used = match row {
            Some(r) => non_negative("token_windows", &t, "tokens", r.try_get("tokens")?)?,
            None => 0,
        };
        Ok(TokenWindow {
            admitted: false,
            used,
        })
    }

    pub(crate) async fn sched_settle_tokens(
        &self,
        tenant: TenantId,
        window_start: i64,
        delta: i64,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "INSERT INTO token_windows (tenant_id, window_start, tokens) VALUES (?, ?, ?) \
             ON CONFLICT (tenant_id, window_start) DO UPDATE \
             SET tokens = CASE WHEN token_windows.tokens + ? < 0 THEN 0 \
             ELSE token_windows.tokens + ? END",
        ))
        .bind(tenant.to_string())
        .bind(window_start)
        .bind(delta.max(0))
        .bind(delta)
        .bind(delta)
        .execute(&mut *conn)
        .await
        .map_err(|e| self.located(e.into()))?;
        self.committed(Commit::Tables);
        Ok(())
    }

    /// Deletes the tenant's token windows that started more than two minutes before
    /// `window_start` (their own statement: never holding other rows while a window's row is
    /// locked).
    async fn forget_windows(
        &self,
        conn: &mut sqlx::AnyConnection,
        tenant: &str,
        window_start: i64,
    ) -> Result<()> {
        sqlx::query(
            &self.sql("DELETE FROM token_windows WHERE tenant_id = ? AND window_start < ?"),
        )
        .bind(tenant.to_owned())
        .bind(window_start.saturating_sub(WINDOW_RETENTION_MS))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}
