//! Intents: posted (and notified) in one transaction with the session's existence check,
//! listed, waited for and deleted.

use super::*;

impl SqlStore {
    /// [`Store::post_intent`].
    pub(super) async fn post(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: &str,
        payload: &Value,
    ) -> Result<Intent> {
        let intent = Intent {
            intent_id: uuid_v7_text(),
            session_id: session,
            kind: kind.to_owned(),
            payload: payload.clone(),
            created_at: ms_to_time(now_ms()),
        };
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        sqlx::query(&self.sql(
            "INSERT INTO intents (tenant_id, session_id, intent_id, kind, payload, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(intent.intent_id.clone())
        .bind(intent.kind.clone())
        .bind(intent.payload.to_string())
        .bind(intent.created_at.timestamp_millis())
        .execute(&mut *tx)
        .await?;
        if self.inner.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)::text")
                .bind(self.inner.channel.clone())
                .bind(format!("{INTENT_PREFIX}{session}"))
                .execute(&mut *tx)
                .await?;
        }
        // An intent is work for whichever worker claims the session.
        self.note_work(&mut tx, tenant, session).await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        self.inner.waiters.intents.notify(session);
        self.woke_locally();
        Ok(intent)
    }

    /// [`Store::wait_for_intent`].
    pub(super) async fn wait_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        timeout: Duration,
    ) -> Result<bool> {
        // PostgreSQL notifies intents (a lost notification is covered by the listener waking
        // every waiter when it reconnects); on SQLite intents of this process wake their
        // waiters, and another process's wake them through the store's one intent poll
        // (`intent_poll`). So this waiter's own poll is only a long fallback on both.
        let poll = POSTGRES_INTENT_POLL;
        let waiters = &self.inner.waiters.intents;
        self.wait_until(waiters, poll, session, timeout, |_| async {
            let row = sqlx::query(&self.sql(
                "SELECT (SELECT count(*) FROM intents WHERE tenant_id = ? AND session_id = ?) AS n, \
                 (SELECT count(*) FROM sessions WHERE tenant_id = ? AND session_id = ?) AS s",
            ))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_one(&self.inner.pool)
            .await?;
            if row.try_get::<i64, _>("s")? == 0 {
                return Err(not_found("session", session));
            }
            Ok(row.try_get::<i64, _>("n")? > 0)
        })
        .await
    }

    /// [`Store::list_intents`].
    pub(super) async fn intents_of(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<Vec<Intent>> {
        let rows = sqlx::query(&self.sql(
            "SELECT intent_id, kind, payload, created_at FROM intents \
             WHERE tenant_id = ? AND session_id = ? ORDER BY created_at, intent_id",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("intent_id")?;
                Ok(Intent {
                    payload: parse_json("intents", &id, &r.try_get::<String, _>("payload")?)?,
                    intent_id: id,
                    session_id: session,
                    kind: r.try_get("kind")?,
                    created_at: ms_to_time(r.try_get("created_at")?),
                })
            })
            .collect()
    }

    /// [`Store::delete_intent`].
    pub(super) async fn remove_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        intent_id: &str,
    ) -> Result<bool> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(extras::DELETE_INTENT))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .bind(intent_id.to_owned())
            .execute(&mut *conn)
            .await?;
        self.committed(Commit::Tables);
        Ok(done.rows_affected() > 0)
    }
}
