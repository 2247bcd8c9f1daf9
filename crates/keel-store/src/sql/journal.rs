//! The journal: appends (validated, encoded and checked, then group-committed on SQLite or one
//! statement on PostgreSQL), reads and waiting for a session's next version.

use super::*;

impl SqlStore {
    /// [`Store::append_with`].
    pub(super) async fn append_events(
        &self,
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        lease_epoch: LeaseEpoch,
        events: &[Event],
        extras: &AppendExtras,
    ) -> Result<u64> {
        validate_batch(tenant, session, expected_version, events)?;
        let req = AppendRequest::new(
            tenant,
            session,
            expected_version,
            lease_epoch,
            events,
            extras,
        )?;
        let row_columns = !req.keeps_row_columns();
        let outcome = match (&self.inner.writer, &self.inner.thread) {
            (Some(writer), Some(thread)) => {
                self.inner
                    .group
                    .submit(
                        req,
                        writer.clone(),
                        &self.inner.pool,
                        thread,
                        self.inner.waiters.clone(),
                    )
                    .await
            }
            _ => {
                group_commit::append_postgres(
                    &self.inner.pool,
                    &self.inner.channel,
                    &self.inner.work_channel,
                    &req,
                )
                .await?
            }
        };
        match outcome {
            Ok(v) => {
                self.committed(Commit::Journal);
                if row_columns {
                    let c = &self.inner.commits.journal_row_columns;
                    c.fetch_add(1, Ordering::Relaxed);
                }
                Ok(v)
            }
            Err(group_commit::CasFailure::Missing) => Err(not_found("session", session)),
            Err(group_commit::CasFailure::Stale { actual }) => Err(StoreError::StaleVersion {
                session,
                expected: expected_version,
                actual,
            }),
            Err(group_commit::CasFailure::Lease { current, owner }) => Err(StoreError::LeaseLost {
                session,
                held: lease_epoch,
                current,
                owner,
            }),
            Err(group_commit::CasFailure::Store(e)) => Err(self.located(e)),
        }
    }

    /// [`Store::read`].
    pub(super) async fn read_events(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
        limit: Option<u32>,
    ) -> Result<Vec<Event>> {
        let rows = sqlx::query(&self.sql(
            "SELECT seq, type, body FROM events WHERE tenant_id = ? AND session_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(to_i64(from_seq)?)
        .bind(limit.map(i64::from).unwrap_or(i64::MAX))
        .fetch_all(&self.inner.pool)
        .await?;
        if rows.is_empty() {
            self.require_session(tenant, session).await?;
        }
        rows.iter().map(|r| event_from_row(session, r)).collect()
    }

    /// [`Store::wait_for_version`].
    pub(super) async fn wait_version(
        &self,
        tenant: TenantId,
        session: SessionId,
        after_version: u64,
        timeout: Duration,
    ) -> Result<u64> {
        let version = std::sync::atomic::AtomicU64::new(0);
        let seen = &version;
        let waiters = &self.inner.waiters.versions;
        self.wait_until(
            waiters,
            self.inner.poll,
            session,
            timeout,
            // The waiters of one session share their reads (`Watched::version`): 1,000 SSE
            // subscribers of a session polling every 50 ms made 20,000 queries a second.
            move |watched| async move {
                let v = watched
                    .version(tenant, self.inner.poll, || {
                        self.current_version(tenant, session)
                    })
                    .await?;
                seen.store(v, std::sync::atomic::Ordering::Relaxed);
                Ok(v > after_version)
            },
        )
        .await?;
        Ok(version.into_inner())
    }
}
