//! Holding a session's journal outside a run: from this process's running session, or under
//! a short lease of its own (released by `unhold`).

use std::sync::Arc;
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use keel_store::Lease;

use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::lease;
use crate::redact::Redactor;
use crate::shared::Inner;

/// The journal of a session, held either by a run in this process or under a short lease.
pub(crate) enum Held {
    Local(tokio::sync::OwnedMutexGuard<Journal>),
    Leased(Box<Journal>, Lease),
}

impl Held {
    pub(crate) fn journal(&mut self) -> &mut Journal {
        match self {
            Held::Local(g) => g,
            Held::Leased(j, _) => j,
        }
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
        self.install_secrets(&mut j, None).await?;
        j.unseal(self.options.seal_key.clone()).await?;
        Ok(j)
    }
    /// Holds the session now if this process runs it or its lease is free (or a dead local
    /// worker's); otherwise returns the live holder's owner string.
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
        let lease = match lease::acquire(
            &self.store,
            tenant,
            session,
            &self.owner,
            self.options.lease_ttl,
            Duration::ZERO,
        )
        .await
        {
            Ok(l) => l,
            Err(RuntimeError::SessionBusy { owner, .. }) => return Ok(Err(owner)),
            Err(e) => return Err(e),
        };
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Ok(Held::Leased(Box::new(j), lease))),
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
        let lease = lease::acquire(
            &self.store,
            tenant,
            session,
            &self.owner,
            opts.lease_ttl,
            opts.lease_wait,
        )
        .await?;
        match self.load(tenant, session, &lease).await {
            Ok(j) => Ok(Held::Leased(Box::new(j), lease)),
            Err(e) => {
                let _ = self.store.release_lease(tenant, &lease).await;
                Err(e)
            }
        }
    }
    pub(crate) async fn unhold(&self, tenant: TenantId, held: Held) {
        if let Held::Leased(_, lease) = held
            && let Err(e) = self.store.release_lease(tenant, &lease).await
        {
            tracing::debug!(session = %lease.session_id, "lease release: {e}");
        }
    }
}
