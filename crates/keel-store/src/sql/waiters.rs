//! In-process wake-ups: for `wait_for_version` and for `wait_for_intent`, one `Notify` per
//! watched session each (an append wakes version waiters only, a posted intent intent waiters
//! only); for `wait_for_work`, one [`WorkSignal`] per store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::SessionId;
use tokio::sync::Notify;

/// Sessions somebody is waiting on — for a new version, for an intent — and the store's work
/// signal.
#[derive(Default)]
pub(crate) struct Waiters {
    /// `wait_for_version` (woken by appends).
    pub versions: SessionNotifies,
    /// `wait_for_intent` (woken by posted intents only, not by appends).
    pub intents: SessionNotifies,
    /// Wakes `wait_for_work` callers.
    pub work: WorkSignal,
}

/// One `Notify` per watched session, with how many waiters each.
#[derive(Default)]
pub(crate) struct SessionNotifies {
    map: Mutex<HashMap<SessionId, (Arc<Notify>, usize)>>,
}

/// "A session may have become claimable" ([`crate::Store::wait_for_work`]).
///
/// A signal wakes every caller waiting at that moment; a signal that finds nobody waiting is
/// kept, and the next wait returns at once (then it is spent): a signal that arrives while a
/// worker is between two waits (busy claiming) is not lost. Signals do not accumulate beyond
/// that one: a worker woken once claims until nothing is left, whatever woke it.
#[derive(Default)]
pub(crate) struct WorkSignal {
    /// Signals sent so far.
    sent: AtomicU64,
    /// Signals some wait has returned for (or seen pending) so far.
    seen: AtomicU64,
    notify: Notify,
}

impl WorkSignal {
    /// Wakes the waiters (or the next wait).
    pub fn signal(&self) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Waits for a signal sent since the last wait returned, at most `timeout`; returns whether
    /// one came.
    pub async fn wait(&self, timeout: Duration) -> bool {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before the check: a signal sent after it wakes this wait.
        notified.as_mut().enable();
        let sent = self.sent.load(Ordering::SeqCst);
        if self.seen.fetch_max(sent, Ordering::SeqCst) < sent {
            return true;
        }
        let start = tokio::time::Instant::now();
        // A timeout too large to represent waits "forever" (about 34 years).
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + Duration::from_secs(1 << 30));
        tokio::select! {
            _ = &mut notified => {
                self.seen
                    .fetch_max(self.sent.load(Ordering::SeqCst), Ordering::SeqCst);
                true
            }
            _ = tokio::time::sleep_until(deadline) => false,
        }
    }
}

/// Deregisters on drop.
pub(crate) struct Registration<'a> {
    notifies: &'a SessionNotifies,
    session: SessionId,
    pub notify: Arc<Notify>,
}

impl SessionNotifies {
    /// Registers interest in `session`.
    pub fn register(&self, session: SessionId) -> Registration<'_> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map
            .entry(session)
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Registration {
            notifies: self,
            session,
            notify: entry.0.clone(),
        }
    }

    /// Whether nobody waits on any session.
    pub fn is_empty(&self) -> bool {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    /// Wakes every waiter of `session`.
    pub fn notify(&self, session: SessionId) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((n, _)) = map.get(&session) {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter of every session.
    fn notify_every(&self) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for (n, _) in map.values() {
            n.notify_waiters();
        }
    }
}

impl Waiters {
    /// Wakes every waiter of every session, for versions and intents, and of work
    /// (notifications may have been lost: the PostgreSQL listener reconnected).
    pub fn notify_all(&self) {
        self.versions.notify_every();
        self.intents.notify_every();
        self.work.signal();
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut map = self.notifies.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(&self.session) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal sent while nobody waits is kept for the next wait, once; a signal wakes every
    /// current waiter; without one a wait times out.
    #[tokio::test]
    async fn a_signal_between_waits_is_kept_once_and_wakes_every_waiter() {
        let w = Arc::new(WorkSignal::default());
        assert!(
            !w.wait(Duration::from_millis(20)).await,
            "no signal: timeout"
        );
        w.signal();
        w.signal();
        assert!(
            w.wait(Duration::from_secs(10)).await,
            "kept for the next wait"
        );
        assert!(
            !w.wait(Duration::from_millis(20)).await,
            "spent by the first wait, not accumulated"
        );
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let w = w.clone();
                tokio::spawn(async move { w.wait(Duration::from_secs(10)).await })
            })
            .collect();
        // One thread: the three spawned waits run (and register) before this sleep ends.
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.signal();
        for t in waiters {
            assert!(t.await.unwrap(), "every waiter woken by one signal");
        }
    }
}
