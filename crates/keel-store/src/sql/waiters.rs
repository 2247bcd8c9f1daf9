//! In-process wake-ups for `wait_for_version`, one `Notify` per watched session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_core::SessionId;
use tokio::sync::Notify;

/// Sessions somebody is waiting on, with how many waiters each.
#[derive(Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<SessionId, (Arc<Notify>, usize)>>,
}

/// Deregisters on drop.
pub(crate) struct Registration<'a> {
    waiters: &'a Waiters,
    session: SessionId,
    pub notify: Arc<Notify>,
}

impl Waiters {
    /// Registers interest in `session`.
    pub fn register(&self, session: SessionId) -> Registration<'_> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map
            .entry(session)
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Registration {
            waiters: self,
            session,
            notify: entry.0.clone(),
        }
    }

    /// Wakes every waiter of `session`.
    pub fn notify(&self, session: SessionId) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((n, _)) = map.get(&session) {
            n.notify_waiters();
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(&self.session) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.session);
            }
        }
    }
}
