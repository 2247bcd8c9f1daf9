//! Tenant budget reservations ([`Store::reserve_usage`](crate::Store::reserve_usage)): one
//! transaction per request, the same SQL on both backends.
//!
//! Concurrent reservers of one tenant and day serialize on their `usage_reservation_locks` row
//! (the upsert that opens the transaction takes its row lock on PostgreSQL; SQLite has one writer
//! under `BEGIN IMMEDIATE`). Under it the request drops the tenant's reservations that no longer
//! count (their session's lease was released, expired or taken over since) and the session's
//! own, reads the day's usage and the live reservations in one statement (one snapshot, so a step
//! settling meanwhile — its usage in, its reservation out, one commit — is seen entirely or not
//! at all), decides, and inserts the grant.

use keel_core::{BudgetLimit, LeaseEpoch, SessionId, TenantId};
use sqlx::Row;

use super::{Commit, SqlStore, extras::check_day, non_negative, not_found, now_ms, to_i64};
use crate::error::{Result, StoreError};
use crate::types::{Reservation, ReservationRow, UsageAmount, UsageReservation};

/// Whether a reservation row counts: its session's lease is held at its epoch, unexpired.
const LIVE: &str = "EXISTS (SELECT 1 FROM sessions s WHERE s.tenant_id = usage_reservations.tenant_id \
     AND s.session_id = usage_reservations.session_id AND s.lease_epoch = usage_reservations.lease_epoch \
     AND s.lease_owner IS NOT NULL AND s.lease_expires_at > ?)";

/// Checks a request before anything is written.
fn check(r: &UsageReservation) -> Result<()> {
    check_day(&r.day)?;
    to_i64(r.tokens)?;
    if let Some(m) = r.max_tokens {
        to_i64(m)?;
    }
    let bad = |what: &str, v: f64| {
        StoreError::InvalidInput(format!(
            "reservation {what} {v} for session {} must be finite and not negative",
            r.session_id
        ))
    };
    if !r.cost_usd.is_finite() || r.cost_usd < 0.0 {
        return Err(bad("cost_usd", r.cost_usd));
    }
    if let Some(m) = r.max_cost_usd
        && (!m.is_finite() || m < 0.0)
    {
        return Err(bad("max_cost_usd", m));
    }
    Ok(())
}

/// The decision for `r` given the day's `used` and the other sessions' live `reserved`.
fn decide(r: &UsageReservation, used: UsageAmount, reserved: UsageAmount) -> Reservation {
    let mut tokens = r.tokens;
    let mut cost_usd = r.cost_usd;
    if keel_core::mechanisms::is_off(keel_core::mechanisms::Mechanism::BudgetCheck) {
        return Reservation::Granted {
            tokens,
            cost_usd,
            used,
            reserved,
        };
    }
    if let Some(max) = r.max_tokens {
        if used.tokens >= max {
            return Reservation::Exhausted {
                limit: BudgetLimit::Tokens,
                used,
            };
        }
        let left = max.saturating_sub(used.tokens.saturating_add(reserved.tokens));
        if left == 0 {
            return Reservation::Busy {
                limit: BudgetLimit::Tokens,
                used,
                reserved,
            };
        }
        tokens = tokens.min(left);
    }
    if let Some(max) = r.max_cost_usd {
        if used.cost_usd >= max {
            return Reservation::Exhausted {
                limit: BudgetLimit::Cost,
                used,
            };
        }
        let left = max - used.cost_usd - reserved.cost_usd;
        if left <= 0.0 {
            return Reservation::Busy {
                limit: BudgetLimit::Cost,
                used,
                reserved,
            };
        }
        cost_usd = cost_usd.min(left);
    }
    Reservation::Granted {
        tokens,
        cost_usd,
        used,
        reserved,
    }
}

impl SqlStore {
    pub(super) async fn reserve_usage_tx(
        &self,
        tenant: TenantId,
        r: &UsageReservation,
    ) -> Result<Reservation> {
        check(r)?;
        let (t, s) = (tenant.to_string(), r.session_id.to_string());
        let now = now_ms();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        sqlx::query(&self.sql(
            "INSERT INTO usage_reservation_locks (tenant_id, day, requests) VALUES (?, ?, 1) \
             ON CONFLICT (tenant_id, day) DO UPDATE SET requests = usage_reservation_locks.requests + 1",
        ))
        .bind(t.clone())
        .bind(r.day.clone())
        .execute(&mut *tx)
        .await?;
        let lease = sqlx::query(&self.sql(
            "SELECT lease_epoch, lease_owner FROM sessions WHERE tenant_id = ? AND session_id = ?",
        ))
        .bind(t.clone())
        .bind(s.clone())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(lease) = lease else {
            return Err(not_found("session", r.session_id));
        };
        let epoch: i64 = lease.try_get("lease_epoch")?;
        let owner: Option<String> = lease.try_get("lease_owner")?;
        let current = LeaseEpoch(u64::try_from(epoch).unwrap_or(0));
        if owner.is_none() || current != r.lease_epoch {
            return Err(StoreError::LeaseLost {
                session: r.session_id,
                held: r.lease_epoch,
                current,
                owner,
            });
        }
        // Lapsed reservations of the tenant, and the session's own (replaced or refused).
        sqlx::query(&self.sql(&format!(
            "DELETE FROM usage_reservations WHERE tenant_id = ? AND (session_id = ? OR NOT {LIVE})"
        )))
        .bind(t.clone())
        .bind(s.clone())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let sums = sqlx::query(&self.sql(
            "SELECT \
             (SELECT CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) FROM usage \
              WHERE tenant_id = ? AND day = ?) AS used_tokens, \
             (SELECT CAST(COALESCE(SUM(cost_usd), 0) AS DOUBLE PRECISION) FROM usage \
              WHERE tenant_id = ? AND day = ?) AS used_cost, \
             (SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM usage_reservations \
              WHERE tenant_id = ? AND day = ?) AS reserved_tokens, \
             (SELECT CAST(COALESCE(SUM(cost_usd), 0) AS DOUBLE PRECISION) FROM usage_reservations \
              WHERE tenant_id = ? AND day = ?) AS reserved_cost",
        ))
        .bind(t.clone())
        .bind(r.day.clone())
        .bind(t.clone())
        .bind(r.day.clone())
        .bind(t.clone())
        .bind(r.day.clone())
        .bind(t.clone())
        .bind(r.day.clone())
        .fetch_one(&mut *tx)
        .await?;
        let id = format!("{}/{}", r.day, r.session_id);
        let count = |column: &str| -> Result<u64> {
            non_negative("usage", &id, column, sums.try_get(column)?)
        };
        let used = UsageAmount {
            tokens: count("used_tokens")?,
            cost_usd: sums.try_get("used_cost")?,
        };
        let reserved = UsageAmount {
            tokens: count("reserved_tokens")?,
            cost_usd: sums.try_get("reserved_cost")?,
        };
        let decision = decide(r, used, reserved);
        if let Reservation::Granted {
            tokens, cost_usd, ..
        } = decision
        {
            sqlx::query(&self.sql(
                "INSERT INTO usage_reservations (tenant_id, session_id, day, lease_epoch, tokens, \
                 cost_usd, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            ))
            .bind(t)
            .bind(s)
            .bind(r.day.clone())
            .bind(to_i64(r.lease_epoch.0)?)
            .bind(to_i64(tokens)?)
            .bind(cost_usd)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(decision)
    }

    pub(super) async fn live_reservations(
        &self,
        tenant: TenantId,
        day: &str,
    ) -> Result<Vec<ReservationRow>> {
        check_day(day)?;
        let rows = sqlx::query(&self.sql(&format!(
            "SELECT session_id, day, lease_epoch, tokens, cost_usd FROM usage_reservations \
             WHERE tenant_id = ? AND day = ? AND {LIVE} ORDER BY session_id"
        )))
        .bind(tenant.to_string())
        .bind(day.to_owned())
        .bind(now_ms())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let session: String = row.try_get("session_id")?;
                let id = format!("{day}/{session}");
                let count = |column: &str| -> Result<u64> {
                    non_negative("usage_reservations", &id, column, row.try_get(column)?)
                };
                Ok(ReservationRow {
                    session_id: super::parse_id::<SessionId>("usage_reservations", &session)?,
                    day: row.try_get("day")?,
                    lease_epoch: LeaseEpoch(count("lease_epoch")?),
                    amount: UsageAmount {
                        tokens: count("tokens")?,
                        cost_usd: row.try_get("cost_usd")?,
                    },
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(
        tokens: u64,
        max_tokens: Option<u64>,
        cost: f64,
        max_cost: Option<f64>,
    ) -> UsageReservation {
        UsageReservation {
            session_id: SessionId::new(),
            lease_epoch: LeaseEpoch(1),
            day: "2026-01-01".into(),
            tokens,
            cost_usd: cost,
            max_tokens,
            max_cost_usd: max_cost,
        }
    }

    fn amount(tokens: u64, cost_usd: f64) -> UsageAmount {
        UsageAmount { tokens, cost_usd }
    }

    #[test]
    fn grants_are_capped_at_what_the_limit_leaves_and_refusals_name_the_limit() {
        let r = ask(500, Some(1000), 0.0, None);
        assert!(matches!(
            decide(&r, amount(200, 0.0), amount(100, 0.0)),
            Reservation::Granted { tokens: 500, .. }
        ));
        assert!(matches!(
            decide(&r, amount(200, 0.0), amount(600, 0.0)),
            Reservation::Granted { tokens: 200, .. }
        ));
        assert!(matches!(
            decide(&r, amount(400, 0.0), amount(600, 0.0)),
            Reservation::Busy {
                limit: BudgetLimit::Tokens,
                ..
            }
        ));
        assert!(matches!(
            decide(&r, amount(1000, 0.0), amount(0, 0.0)),
            Reservation::Exhausted {
                limit: BudgetLimit::Tokens,
                ..
            }
        ));
        let c = ask(10, None, 2.0, Some(3.0));
        assert!(matches!(
            decide(&c, amount(0, 2.5), amount(0, 0.0)),
            Reservation::Granted { tokens: 10, cost_usd, .. } if (cost_usd - 0.5).abs() < 1e-12
        ));
        assert!(matches!(
            decide(&c, amount(0, 1.0), amount(0, 2.0)),
            Reservation::Busy {
                limit: BudgetLimit::Cost,
                ..
            }
        ));
        assert!(matches!(
            decide(&c, amount(0, 3.0), amount(0, 0.0)),
            Reservation::Exhausted {
                limit: BudgetLimit::Cost,
                ..
            }
        ));
        // No limit: the ask as it is.
        assert!(matches!(
            decide(
                &ask(7, None, 0.5, None),
                amount(1 << 40, 1e9),
                amount(0, 0.0)
            ),
            Reservation::Granted { tokens: 7, .. }
        ));
    }
}
