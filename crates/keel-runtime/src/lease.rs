//! Leases: who may write a session's journal.
//!
//! The owner string is `<worker>@<host>:<pid>`. A worker that finds the lease held by a process
//! of *this host* that no longer exists (`/proc/<pid>` is gone) takes it over at once
//! ([`keel_store::Store::take_over_lease`]); any other holder is waited out, bounded by the lease
//! TTL (default 10 s, renewed by heartbeats every third of it).

use std::sync::Arc;
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use keel_store::{Lease, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::error::{Result, RuntimeError};

/// This host's name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, else `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The lease owner string of worker `name` in this process.
pub fn owner_string(name: &str) -> String {
    format!("{name}@{}:{}", hostname(), std::process::id())
}

/// Whether `owner` names a process of this host that has exited.
pub fn owner_is_dead_local_process(owner: &str) -> bool {
    let Some((_, hostpid)) = owner.rsplit_once('@') else {
        return false;
    };
    let Some((host, pid)) = hostpid.rsplit_once(':') else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if host != hostname() || pid == std::process::id() {
        return false;
    }
    let proc_dir = std::path::Path::new("/proc");
    proc_dir.is_dir() && !proc_dir.join(pid.to_string()).exists()
}

/// Takes the session's lease: free, expired, or held by a dead process on this host (taken over
/// at once); otherwise waits up to `wait` for it.
///
/// # Errors
/// [`RuntimeError::SessionBusy`] naming the holder after `wait`; store errors.
pub async fn acquire(
    store: &Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Lease> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match store.acquire_lease(tenant, session, owner, ttl).await {
            Ok(lease) => return Ok(lease),
            Err(StoreError::LeaseHeld {
                owner: holder,
                expires_at,
                ..
            }) => {
                if owner_is_dead_local_process(&holder) {
                    let rec = store.get_session(tenant, session).await?;
                    match store
                        .take_over_lease(tenant, session, &holder, rec.lease_epoch, owner, ttl)
                        .await
                    {
                        Ok(lease) => {
                            tracing::info!(%session, dead = %holder, "took over the lease of a dead worker");
                            return Ok(lease);
                        }
                        Err(StoreError::LeaseLost { .. } | StoreError::LeaseHeld { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Err(RuntimeError::SessionBusy {
                        session,
                        owner: holder,
                    });
                }
                let until_expiry = (expires_at - chrono::Utc::now())
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                let nap = until_expiry
                    .clamp(Duration::from_millis(20), Duration::from_millis(200))
                    .min(deadline - now);
                tokio::time::sleep(nap).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Renews `lease` whenever a third of `ttl` has passed since it was granted or last renewed
/// (reckoned from its `expires_at`, not from when this task started: a run whose setup took
/// most of the TTL renews at once instead of a third of a TTL later, after the lease lapsed),
/// until `stop` is cancelled; on loss cancels `lost`. A renewal that fails for another reason
/// (the store is slow or briefly unreachable) is retried after a twelfth of the TTL, while
/// the lease may still be live.
pub fn heartbeat(
    store: Arc<dyn Store>,
    tenant: TenantId,
    lease: Lease,
    ttl: Duration,
    stop: CancellationToken,
    lost: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lease = lease;
        let period = (ttl / 3).max(Duration::from_millis(10));
        let retry = (ttl / 12).max(Duration::from_millis(10));
        let mut wait = renewal_due_in(&lease, ttl, period);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            match store.renew_lease(tenant, &lease, ttl).await {
                Ok(l) => {
                    lease = l;
                    wait = renewal_due_in(&lease, ttl, period);
                }
                Err(StoreError::LeaseLost { .. }) => {
                    tracing::warn!(session = %lease.session_id, "lease lost; stopping the session here");
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(session = %lease.session_id, "lease renewal failed: {e}");
                    wait = retry;
                }
            }
        }
    })
}

/// How long until `lease` (of `ttl`) is `period` old: its grant time is `expires_at - ttl`
/// (the store's clock; a skew between hosts only moves the renewal earlier or later by it).
/// Zero when that moment has passed.
fn renewal_due_in(lease: &Lease, ttl: Duration, period: Duration) -> Duration {
    let left = (lease.expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    left.saturating_sub(ttl.saturating_sub(period))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_expiring_in(ms: i64) -> Lease {
        Lease {
            session_id: SessionId::new(),
            owner: "w".into(),
            epoch: keel_core::LeaseEpoch(1),
            expires_at: chrono::Utc::now() + chrono::Duration::milliseconds(ms),
        }
    }

    /// A fresh lease is renewed a third of its TTL from now; one whose holder spent most of
    /// the TTL before the heartbeat started (or one already lapsed) is renewed at once.
    #[test]
    fn renewal_is_reckoned_from_the_lease_not_from_the_heartbeat() {
        let ttl = Duration::from_secs(3);
        let period = ttl / 3;
        let fresh = renewal_due_in(&lease_expiring_in(3000), ttl, period);
        assert!(
            fresh > Duration::from_millis(900) && fresh <= period,
            "{fresh:?}"
        );
        assert_eq!(
            renewal_due_in(&lease_expiring_in(1500), ttl, period),
            Duration::ZERO
        );
        assert_eq!(
            renewal_due_in(&lease_expiring_in(-10), ttl, period),
            Duration::ZERO
        );
    }

    #[test]
    fn a_live_or_foreign_owner_is_not_dead() {
        assert!(!owner_is_dead_local_process(&owner_string("me")));
        assert!(!owner_is_dead_local_process("w@some-other-host:1"));
        assert!(!owner_is_dead_local_process("garbage"));
        // pid 1 exists on Linux.
        assert!(!owner_is_dead_local_process(&format!("w@{}:1", hostname())));
        assert!(owner_is_dead_local_process(&format!(
            "w@{}:4194303",
            hostname()
        )));
    }
}
