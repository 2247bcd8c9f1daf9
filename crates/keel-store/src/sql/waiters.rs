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

/// One [`Watched`] per watched session, with how many waiters each; and the versions this
/// process committed lately, for the waits that start after them.
#[derive(Default)]
pub(crate) struct SessionNotifies {
    map: Mutex<HashMap<SessionId, (Arc<Watched>, usize)>>,
    /// The version an append of this process last committed per session, with its tenant and
    /// when: a [`Watched`] made for a new wait starts from it, so a subscriber that waits for
    /// the next version right after taking the last one (each step of `keel run`'s printer)
    /// does not read what this process just wrote. At most [`RECENT_COMMITS`] sessions; past
    /// that, those older than [`RECENT_KEPT`] go (and all, if that is not enough).
    recent: Mutex<HashMap<SessionId, Committed>>,
}

/// A version committed by this process: (tenant, when, version).
type Committed = (keel_core::TenantId, tokio::time::Instant, u64);

/// Sessions whose last committed version [`SessionNotifies`] keeps for the next wait.
const RECENT_COMMITS: usize = 4096;
/// How long a kept version may serve a new wait at most (its waiters read past their `fresh`,
/// the store's poll interval, anyway: 50 ms on SQLite).
const RECENT_KEPT: Duration = Duration::from_secs(1);

/// What the waiters of one session share: the wake-up, and the session's version as last read
/// for them, so that many waiters of one session (1,000 SSE subscribers) make one read per poll
/// interval or wake-up between them, not one each.
#[derive(Default)]
pub(crate) struct Watched {
    /// Woken by an append of the session in this process or a PostgreSQL notification.
    pub notify: Notify,
    /// Bumped at every such wake-up: a read made before it is stale.
    woken: AtomicU64,
    /// The last read: (tenant, when, `woken` then, version).
    last_read: tokio::sync::Mutex<Option<(keel_core::TenantId, tokio::time::Instant, u64, u64)>>,
}

impl Watched {
    /// The session's version for `tenant`: the last read's, when it was made for the same
    /// tenant less than `fresh` ago and no wake-up came since; else `read()`'s (one caller
    /// reads while the others wait for its answer). An error is not kept.
    ///
    /// # Errors
    /// `read`'s.
    pub async fn version<F, Fut>(
        &self,
        tenant: keel_core::TenantId,
        fresh: Duration,
        read: F,
    ) -> crate::error::Result<u64>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = crate::error::Result<u64>>,
    {
        let mut last = self.last_read.lock().await;
        let woken = self.woken.load(Ordering::SeqCst);
        if let Some((t, at, w, v)) = *last
            && t == tenant
            && w == woken
            && at.elapsed() < fresh
        {
            return Ok(v);
        }
        let v = read().await?;
        *last = Some((tenant, tokio::time::Instant::now(), woken, v));
        Ok(v)
    }

    /// A [`Watched`] whose last read is `committed` (a version this process committed), when
    /// there is one.
    fn starting_from(committed: Option<&Committed>) -> Self {
        Self {
            last_read: tokio::sync::Mutex::new(
                committed.map(|&(tenant, at, version)| (tenant, at, 0, version)),
            ),
            ..Self::default()
        }
    }

    fn wake(&self) {
        self.woken.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Wakes the waiters with the version an append of this process just committed for
    /// `tenant`'s session: it becomes the last read (as fresh as a read made now), so the woken
    /// waiters need no read to learn it. When a read is under way (its lock is held) the
    /// version is not recorded; that read is stale by the wake-up and the next caller reads.
    fn wake_with(&self, tenant: keel_core::TenantId, version: u64) {
        let woken = self.woken.fetch_add(1, Ordering::SeqCst) + 1;
        if let Ok(mut last) = self.last_read.try_lock() {
            // Versions only grow: an older wake-up's version never replaces a newer one.
            let newer = match *last {
                Some((t, _, _, v)) if t == tenant => version >= v,
                _ => true,
            };
            if newer {
                *last = Some((tenant, tokio::time::Instant::now(), woken, version));
            }
        }
        self.notify.notify_waiters();
    }
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
    pub watched: Arc<Watched>,
}

impl SessionNotifies {
    /// Registers interest in `session`.
    pub fn register(&self, session: SessionId) -> Registration<'_> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(session).or_insert_with(|| {
            let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            (Arc::new(Watched::starting_from(recent.get(&session))), 0)
        });
        entry.1 += 1;
        Registration {
            notifies: self,
            session,
            watched: entry.0.clone(),
        }
    }

    /// Whether nobody waits on any session.
    pub fn is_empty(&self) -> bool {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    /// Wakes every waiter of `session`; the version kept for later waits is forgotten (the
    /// session changed in a way this process was not told the version of).
    pub fn notify(&self, session: SessionId) {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&session);
        self.with_watched(session, Watched::wake);
    }

    /// Wakes every waiter of `session`, telling them `tenant`'s session is at `version` (an
    /// append of this process committed it), so they need not read it.
    /// The version is also kept (see `recent`) for a wait that starts later.
    pub fn notify_committed(&self, session: SessionId, tenant: keel_core::TenantId, version: u64) {
        {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() >= RECENT_COMMITS && !recent.contains_key(&session) {
                recent.retain(|_, (_, at, _)| at.elapsed() < RECENT_KEPT);
                if recent.len() >= RECENT_COMMITS {
                    recent.clear();
                }
            }
            let now = tokio::time::Instant::now();
            let kept = recent.entry(session).or_insert((tenant, now, version));
            // Versions only grow: an older commit's version never replaces a newer one.
            if kept.0 != tenant || version >= kept.2 {
                *kept = (tenant, now, version);
            }
        }
        self.with_watched(session, |w| w.wake_with(tenant, version));
    }

    /// Runs `f` on `session`'s [`Watched`] when somebody waits on it.
    fn with_watched(&self, session: SessionId, f: impl FnOnce(&Watched)) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((w, _)) = map.get(&session) {
            f(w);
        }
    }

    /// Wakes every waiter of every session.
    fn notify_every(&self) {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for (w, _) in map.values() {
            w.wake();
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

impl super::SqlStore {
    /// Re-evaluates `ready` whenever the session's waiters in `notifies` are woken (an append,
    /// or an intent, in this process or by a PostgreSQL notification) and at least every
    /// `poll`, until it holds or `timeout` passes; returns whether it held.
    pub(super) async fn wait_until<F, Fut>(
        &self,
        notifies: &SessionNotifies,
        poll: Duration,
        session: SessionId,
        timeout: Duration,
        mut ready: F,
    ) -> crate::error::Result<bool>
    where
        F: FnMut(Arc<Watched>) -> Fut,
        Fut: std::future::Future<Output = crate::error::Result<bool>>,
    {
        let start = tokio::time::Instant::now();
        // A timeout too large to represent waits "forever" (about 34 years).
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + Duration::from_secs(1 << 30));
        let reg = notifies.register(session);
        loop {
            let notified = reg.watched.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(reg.watched.clone()).await? {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let nap = (deadline - now).min(poll);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A committed version told with the wake-up is what the woken waiters get, with no read,
    /// and what a wait that starts after it starts from; for another tenant, after a plain
    /// wake-up, or once it is older than `fresh`, they read.
    #[tokio::test]
    async fn a_version_told_with_the_wake_up_needs_no_read() {
        let notifies = SessionNotifies::default();
        let session = SessionId::new();
        let (tenant, other) = (keel_core::TenantId::new(), keel_core::TenantId::new());
        let reg = notifies.register(session);
        let fresh = Duration::from_secs(60);
        let reads = AtomicU64::new(0);
        let read = |v: u64| {
            reads.fetch_add(1, Ordering::SeqCst);
            async move { Ok(v) }
        };
        // What a waiter gets for `tenant` with `fresh`, when a read would answer `answer`, and
        // how many reads were made so far: through `held` (registered before the commits), or
        // through a wait that registers after them.
        let ask = async |held: Option<&Registration<'_>>, tenant, fresh, answer| {
            let anew;
            let reg = match held {
                Some(reg) => reg,
                None => {
                    anew = notifies.register(session);
                    &anew
                }
            };
            let v = reg.watched.version(tenant, fresh, || read(answer)).await;
            (v.unwrap(), reads.load(Ordering::SeqCst))
        };
        for (n, held) in [Some(&reg), None].into_iter().enumerate() {
            let n = n as u64;
            notifies.notify_committed(session, tenant, 100 * n + 7);
            assert_eq!(
                ask(held, tenant, fresh, 1).await,
                (100 * n + 7, 3 * n),
                "told, not read"
            );
            assert_eq!(
                ask(held, other, fresh, 2).await,
                (2, 3 * n + 1),
                "another tenant reads"
            );
            notifies.notify_committed(session, tenant, 100 * n + 9);
            notifies.notify(session);
            let after_wake = ask(held, tenant, fresh, 10).await;
            assert_eq!(
                after_wake,
                (10, 3 * n + 2),
                "a plain wake-up after it: read"
            );
            notifies.notify_committed(session, tenant, 100 * n + 11);
            let stale = ask(held, tenant, Duration::ZERO, 12).await;
            assert_eq!(stale, (12, 3 * n + 3), "older than `fresh`: read");
        }
        // Nobody waits now: no waiter is kept (the version is, for the next wait).
        drop(reg);
        notifies.notify_committed(session, tenant, 13);
        assert!(notifies.is_empty());
    }

    /// The versions kept for later waits stay within [`RECENT_COMMITS`] sessions.
    #[tokio::test]
    async fn the_versions_kept_for_later_waits_are_bounded() {
        let notifies = SessionNotifies::default();
        let tenant = keel_core::TenantId::new();
        for v in 0..(RECENT_COMMITS as u64 * 3) {
            notifies.notify_committed(SessionId::new(), tenant, v);
        }
        let kept = notifies.recent.lock().unwrap().len();
        assert!(kept <= RECENT_COMMITS, "{kept}");
    }

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
