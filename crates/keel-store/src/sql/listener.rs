//! PostgreSQL's `LISTEN` connection: one connection per store, subscribed to the events
//! channel (`<schema>_keel_events`) and the work channel (`<schema>_keel_work`), waking the
//! in-process [`Waiters`]; it reconnects after a lost connection (waiters poll meanwhile).

use std::sync::Arc;
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use tokio::task::JoinHandle;

use super::INTENT_PREFIX;
use super::waiters::Waiters;
use crate::error::Result;

/// A NOTIFY channel of the store in `schema`: prefixed by the schema, as its notifications are
/// about that schema's sessions; at most 63 bytes (PostgreSQL's identifier length). The
/// listener tells the two channels' notifications apart by their payload, so a long schema
/// whose two names truncate alike still works.
pub(super) fn channel_name(schema: Option<&str>, suffix: &str) -> String {
    let mut c = format!("{}{suffix}", schema.unwrap_or("public"));
    c.truncate(63);
    c
}

/// The payload of a work notification about `session`.
pub(super) fn work_payload(tenant: TenantId, session: SessionId) -> String {
    format!("{tenant}:{session}")
}

/// LISTENs on `channels` on one connection: a session id wakes that session's version waiters,
/// `intent:<session>` its intent waiters, a work payload (`<tenant>:<session>`) wakes
/// `wait_for_work`. A lost connection is re-established
/// (by `PgListener::try_recv`) and wakes every waiter, as notifications sent meanwhile are lost.
pub(super) async fn start_listener(
    url: &str,
    channels: [&str; 2],
    waiters: Arc<Waiters>,
) -> Result<JoinHandle<()>> {
    let mut listener = sqlx::postgres::PgListener::connect(url).await?;
    listener.listen_all(channels).await?;
    Ok(tokio::spawn(async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    let payload = n.payload();
                    if let Some(session) = payload.strip_prefix(INTENT_PREFIX) {
                        if let Ok(session) = session.parse::<SessionId>() {
                            waiters.intents.notify(session);
                        }
                    } else if payload.contains(':') {
                        waiters.work.signal();
                    } else if let Ok(session) = payload.parse::<SessionId>() {
                        waiters.versions.notify(session);
                    }
                }
                Ok(None) => {
                    tracing::warn!("store notification listener reconnected");
                    waiters.notify_all();
                }
                // Reconnected on the next try_recv; the poll fallbacks cover the gap.
                Err(e) => {
                    tracing::warn!(error = %e, "store notification listener error");
                    waiters.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }))
}
