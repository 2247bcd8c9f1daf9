//! SQLite's one intent poll per store: intents posted by another process on the same file
//! reach this process only by reading the `intents` table. Rather than every watched session
//! querying for its own intents (at [`super::SQLITE_INTENT_POLL`] that was two queries a
//! second per running session — with 1,000 sessions waiting on a model, the bulk of the
//! process's CPU), one task lists the sessions that have intents, once per interval and only
//! while somebody waits, and wakes those sessions' waiters (which then read their own). An
//! intent posted in this process wakes its waiters at once, without this poll.

use std::sync::Arc;

use keel_core::SessionId;
use sqlx::{AnyPool, Row};
use tokio::task::JoinHandle;

use super::SQLITE_INTENT_POLL;
use super::waiters::Waiters;

/// Starts the poll on `pool` (the store's readers) for `waiters`; the store aborts it when
/// it is dropped.
pub(super) fn spawn(pool: AnyPool, waiters: Arc<Waiters>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SQLITE_INTENT_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if waiters.intents.is_empty() {
                continue;
            }
            // Internal wake-up only (no rows are returned to anyone): the woken waiter reads
            // its own session's intents under its tenant.
            let rows = match sqlx::query("SELECT DISTINCT session_id FROM intents")
                .fetch_all(&pool)
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!("intent poll: {e}");
                    continue;
                }
            };
            for row in rows {
                if let Some(session) = row
                    .try_get::<String, _>("session_id")
                    .ok()
                    .and_then(|s| s.parse::<SessionId>().ok())
                {
                    waiters.intents.notify(session);
                }
            }
        }
    })
}
