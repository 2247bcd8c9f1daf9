//! Holding a session's journal outside a run: from this process's running session, under the
//! lease this process keeps for the session between its operations ([`Parked`]), or under a
//! short lease of its own (released by `unhold`).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use keel_store::Lease;
use tokio_util::sync::CancellationToken;

use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::lease;
use crate::redact::Redactor;
use crate::shared::Inner;

/// The journal of a session, held either by a run in this process, under the lease this
/// process keeps for it ([`Parked`]: not released by `unhold`), or under a short lease (and, in
/// the last two, this process's gate of the session, see [`Gates`]).
pub(crate) enum Held {
    Local(tokio::sync::OwnedMutexGuard<Journal>),
    Leased(Box<Journal>, Lease, Gate),
    Parked(Box<Journal>, Lease, Gate),
}

impl Held {
    pub(crate) fn journal(&mut self) -> &mut Journal {
        match self {
            Held::Local(g) => g,
            Held::Leased(j, ..) | Held::Parked(j, ..) => j,
        }
    }
}

/// The leases this process keeps for sessions between its own operations on them
/// ([`crate::Runtime::create_session_held`]): a CLI run creates its session, queues the first
/// turn and runs it under one lease instead of taking and giving back the session's lease
/// three times (each a durable commit). Renewed by the runtime's [`crate::lease::LeaseKeeper`]
/// while parked; [`crate::Runtime::run`] takes the parked lease over (and releases it when the
/// run ends, as the lease it takes itself), [`crate::Runtime::release_held`] gives it back. A
/// parked lease found lost (another worker took the session over after it expired) is dropped
/// and the next hold takes the lease anew.
#[derive(Default)]
pub(crate) struct Parked(std::sync::Mutex<HashMap<SessionId, ParkedLease>>);

struct ParkedLease {
    lease: Lease,
    lost: CancellationToken,
    kept: crate::lease::Kept,
}

impl Parked {
    /// The parked lease of `session`, if any and not lost (a lost one is dropped).
    fn get(&self, session: SessionId) -> Option<Lease> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(&session) {
            Some(p) if !p.lost.is_cancelled() => Some(p.current()),
            Some(_) => {
                map.remove(&session);
                None
            }
            None => None,
        }
    }
    /// Removes `session`'s parked lease and returns it if it was not lost.
    fn take(&self, session: SessionId) -> Option<Lease> {
        let p = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&session)?;
        (!p.lost.is_cancelled()).then(|| p.current())
    }
}

impl ParkedLease {
    /// The lease with the expiry its last renewal gave it (what a run keeping it next reckons
    /// its validity from: the copy parked at first would make it look about to lapse).
    fn current(&self) -> Lease {
        self.kept.lease().unwrap_or_else(|| self.lease.clone())
    }
}

/// A session's turn at its store lease among this process's short holds.
pub(crate) type Gate = tokio::sync::OwnedMutexGuard<()>;

/// One first-come-first-served queue per session for this process's short holds (submits,
/// decisions, settings): only the head of the queue asks the store for the session's lease,
/// and the others wait their turn instead of polling the store against each other — polling
/// left some of 30 concurrent submits to one session waiting past `lease_wait` while others
/// took the lease again and again.
#[derive(Default)]
pub(crate) struct Gates(std::sync::Mutex<HashMap<SessionId, Weak<tokio::sync::Mutex<()>>>>);

impl Gates {
    /// Waits (at most `wait`) for `session`'s gate; `None` when the wait ran out.
    async fn enter(&self, session: SessionId, wait: Duration) -> Option<Gate> {
        let gate = {
            let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(g) = map.get(&session).and_then(Weak::upgrade) {
                g
            } else {
                map.retain(|_, g| g.strong_count() > 0);
                let g = Arc::new(tokio::sync::Mutex::new(()));
                map.insert(session, Arc::downgrade(&g));
                g
            }
        };
        tokio::time::timeout(wait, gate.lock_owned()).await.ok()
    }
}

impl Inner {
    pub(crate) async fn load(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: &Lease,
    ) -> Result<Journal> {
        let mut j = Journal::load(
            self.store.clone(),
            tenant,
            session,
            lease.epoch,
            Arc::new(Redactor::with_values(&[], &[])?),
        )
        .await?;
        j.publish_to(self.hub.sender(session));
        self.install_secrets(&mut j, None).await?;
        j.unseal(self.options.seal_key.clone()).await?;
        Ok(j)
    }
    /// Holds the session now if this process runs it or its lease is free (or a dead local
    /// worker's, or expired and watched unchanged for the TTL and a tenth: see
    /// [`lease::Takeover::Observed`]), after the short holds of this process queued before
    /// (see [`Gates`]); otherwise returns the live holder's owner string.
    pub(crate) async fn hold_now(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<std::result::Result<Held, String>> {
        if let Some(a) = self.active(session) {
            let g = a.journal.clone().lock_owned().await;
            if !g.closed {
                return Ok(Ok(Held::Local(g)));
            }
        }
        // Another short hold of this process is ahead: it ends soon (holds are single
        // commits), so wait in line — bounded like a lease wait — rather than hand the caller
        // a busy session it would poll for against the others.
        let Some(gate) = self.gates.enter(session, self.options.lease_wait).await else {
            return Ok(Err(self.owner.clone()));
        };
        if let Some(lease) = self.parked.get(session) {
            return self.hold_parked(tenant, session, lease, gate).await.map(Ok);
        }
        let lease = match lease::acquire_as(
            &self.store,
            tenant,
            session,
            &self.owner,
            self.options.lease_ttl,
            Duration::ZERO,
            lease::Takeover::Observed,
        )
        .await
        {
            Ok(l) => l,
            Err(RuntimeError::SessionBusy { owner, .. }) => return Ok(Err(owner)),
            Err(e) => return Err(e),
        };
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Ok(Held::Leased(Box::new(j), lease, gate))),
            Err(e) => {
                let _ = self.store.release_lease(tenant, &lease).await;
                Err(e)
            }
        }
    }
    pub(crate) async fn hold(&self, tenant: TenantId, session: SessionId) -> Result<Held> {
        if let Some(a) = self.active(session) {
            let g = a.journal.clone().lock_owned().await;
            if !g.closed {
                return Ok(Held::Local(g));
            }
        }
        let opts = &self.options;
        // The queue of this process's holds first (bounded like the lease wait), then the
        // store's lease, which another process may hold.
        let Some(gate) = self.gates.enter(session, opts.lease_wait).await else {
            return Err(RuntimeError::SessionBusy {
                session,
                owner: self.owner.clone(),
            });
        };
        if let Some(lease) = self.parked.get(session) {
            return self.hold_parked(tenant, session, lease, gate).await;
        }
        let lease = lease::acquire_as(
            &self.store,
            tenant,
            session,
            &self.owner,
            opts.lease_ttl,
            opts.lease_wait,
            lease::Takeover::Observed,
        )
        .await?;
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Held::Leased(Box::new(j), lease, gate)),
            Err(e) => {
                let _ = self.store.release_lease(tenant, &lease).await;
                Err(e)
            }
        }
    }
    /// Holds `session` under `lease`, which this process has just taken (a new session's):
    /// after this process's holds queued before (none, for a new session). The lease is
    /// released by `unhold`, also when loading the journal fails.
    pub(crate) async fn hold_leased(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: Lease,
    ) -> Result<Held> {
        let gate = self.gates.enter(session, self.options.lease_wait).await;
        let loaded = match gate {
            Some(gate) => self
                .load(tenant, session, &lease)
                .await
                .map(|j| Held::Leased(Box::new(j), lease.clone(), gate)),
            None => Err(RuntimeError::SessionBusy {
                session,
                owner: self.owner.clone(),
            }),
        };
        if loaded.is_err() {
            let _ = self.store.release_lease(tenant, &lease).await;
        }
        loaded
    }
    /// Holds `session` under its parked lease (`gate` entered).
    async fn hold_parked(
        &self,
        tenant: TenantId,
        session: SessionId,
        lease: Lease,
        gate: Gate,
    ) -> Result<Held> {
        let j = self.load(tenant, session, &lease).await?;
        Ok(Held::Parked(Box::new(j), lease, gate))
    }
    /// Parks `lease` (of `session`, this process's): kept and renewed until taken by a run
    /// ([`Inner::unpark`]) or released ([`Inner::release_parked`]).
    pub(crate) fn park(&self, tenant: TenantId, lease: Lease) {
        let lost = CancellationToken::new();
        let kept = self.leases.keep(tenant, lease.clone(), lost.clone());
        let session = lease.session_id;
        self.parked
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session, ParkedLease { lease, lost, kept });
    }
    /// Takes `session`'s parked lease for a run, after the holds of this process that use it
    /// (their gate); `Ok(None)` when none is parked (or it was lost).
    ///
    /// # Errors
    /// [`RuntimeError::SessionBusy`] (this process) when a hold using the parked lease outlasts
    /// the lease wait: the lease stays parked, and the hold goes on under it undisturbed.
    pub(crate) async fn unpark(&self, session: SessionId) -> Result<Option<Lease>> {
        if self.parked.get(session).is_none() {
            return Ok(None);
        }
        let Some(_gate) = self.gates.enter(session, self.options.lease_wait).await else {
            return Err(RuntimeError::SessionBusy {
                session,
                owner: self.owner.clone(),
            });
        };
        Ok(self.parked.take(session))
    }
    /// Releases `session`'s parked lease, if any (after the holds of this process that use it;
    /// one that outlasts the lease wait keeps it, which is then logged and left to them).
    pub(crate) async fn release_parked(&self, tenant: TenantId, session: SessionId) {
        match self.unpark(session).await {
            Ok(Some(lease)) => {
                if let Err(e) = self.store.release_lease(tenant, &lease).await {
                    tracing::debug!(%session, "lease release: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(%session, "held lease not released: {e}"),
        }
    }
    pub(crate) async fn unhold(&self, tenant: TenantId, held: Held) {
        if let Held::Leased(_, lease, _gate) = held
            && let Err(e) = self.store.release_lease(tenant, &lease).await
        {
            tracing::debug!(session = %lease.session_id, "lease release: {e}");
        }
    }
}
