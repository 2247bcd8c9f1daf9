//! Leases: who may write a session's journal.
//!
//! The owner string is `<worker>@<host>:<pid>/pidns:<inode>` ([`LeaseOwner`]): the worker's
//! name, its host's name, its process id and the inode of its PID namespace
//! (`/proc/self/ns/pid`). A worker that finds the lease held by a process of *this host and this
//! PID namespace* that no longer exists (`/proc/<pid>` is gone) takes it over at once
//! ([`keel_store::Store::take_over_lease`]); any other holder is waited out, bounded by the lease
//! TTL (default 10 s, renewed every third of it by the runtime's [`LeaseKeeper`], one store
//! call for all the leases it holds). The namespace matters: containers
//! sharing a host name see each other's process ids only within their own PID namespace, so a
//! live worker in another one would look dead. An owner without the namespace (written before
//! it was recorded, or by a process that could not read it) is never taken for dead.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use keel_core::{SessionId, TenantId};
use keel_store::{Lease, Store, StoreError};

use crate::error::{Result, RuntimeError};

mod keeper;
pub use keeper::{Kept, LeaseKeeper};

/// This host's name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, else `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The inode of this process's PID namespace (`/proc/self/ns/pid`, as in `pid:[<inode>]`), or
/// `None` where it cannot be read (no procfs). Read once per process.
pub fn pid_namespace() -> Option<u64> {
    static NS: OnceLock<Option<u64>> = OnceLock::new();
    *NS.get_or_init(|| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
    })
}

/// A lease owner string, parsed: `<worker>@<host>:<pid>/pidns:<inode>`, or the older
/// `<worker>@<host>:<pid>` (no namespace). The worker name may contain anything; the host
/// name contains no `@`, `:` or `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner {
    /// The worker's name within its process (`worker`, `serve-1`, …).
    pub worker: String,
    /// Its host's name ([`hostname`]).
    pub host: String,
    /// Its process id, as seen in its own PID namespace.
    pub pid: u32,
    /// The inode of its PID namespace ([`pid_namespace`]); `None` when not recorded.
    pub pid_ns: Option<u64>,
}

impl LeaseOwner {
    /// Worker `worker` of this process.
    pub fn this_process(worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            host: hostname(),
            pid: std::process::id(),
            pid_ns: pid_namespace(),
        }
    }

    /// Parses an owner string; `None` when it is not one (an owner set by hand, say).
    pub fn parse(owner: &str) -> Option<Self> {
        let (worker, rest) = owner.rsplit_once('@')?;
        let (hostpid, pid_ns) = match rest.split_once("/pidns:") {
            Some((hostpid, ns)) => (hostpid, Some(ns.parse::<u64>().ok()?)),
            None => (rest, None),
        };
        let (host, pid) = hostpid.rsplit_once(':')?;
        if host.is_empty() || host.contains('/') {
            return None;
        }
        Some(Self {
            worker: worker.to_owned(),
            host: host.to_owned(),
            pid: pid.parse().ok()?,
            pid_ns,
        })
    }

    /// Whether this owner is process `pid` of this host, in this process's PID namespace (a
    /// process this one can see as `/proc/<pid>`).
    pub fn is_local_process(&self, pid: u32) -> bool {
        self.pid == pid && self.is_local_namespace()
    }

    /// Whether this owner ran on this host in this process's PID namespace (both known).
    fn is_local_namespace(&self) -> bool {
        self.host == hostname() && self.pid_ns.is_some() && self.pid_ns == pid_namespace()
    }

    /// Whether this owner is a process of this host and PID namespace that has exited (not
    /// this process). An owner of another PID namespace, or without one, is never dead here:
    /// its process ids are not this namespace's.
    pub fn is_dead_local_process(&self) -> bool {
        if !self.is_local_namespace() || self.pid == std::process::id() {
            return false;
        }
        let proc_dir = std::path::Path::new("/proc");
        proc_dir.is_dir() && !proc_dir.join(self.pid.to_string()).exists()
    }
}

impl std::fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}:{}", self.worker, self.host, self.pid)?;
        match self.pid_ns {
            Some(ns) => write!(f, "/pidns:{ns}"),
            None => Ok(()),
        }
    }
}

/// The lease owner string of worker `name` in this process ([`LeaseOwner::this_process`]).
pub fn owner_string(name: &str) -> String {
    LeaseOwner::this_process(name).to_string()
}

/// Whether `owner` names a process of this host and PID namespace that has exited (see
/// [`LeaseOwner::is_dead_local_process`]); `false` for a string that is no owner.
pub fn owner_is_dead_local_process(owner: &str) -> bool {
    LeaseOwner::parse(owner).is_some_and(|o| o.is_dead_local_process())
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
    acquire_as(store, tenant, session, owner, ttl, wait, Takeover::Now).await
}

/// How [`acquire_as`] treats a lease that has expired while its holder may still be alive
/// (not a dead process of this host, not this process's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Taken at once, as any expired lease ([`acquire`]).
    Now,
    /// Taken only once it has stayed as it is — same holder, epoch and expiry — for the TTL and
    /// a tenth, watched on this process's monotonic clock (whatever `wait` says): a holder
    /// that is alive and reaches the store renews it meanwhile (whatever its clock: the
    /// session is then busy), and one cut off from the store has fenced itself by then, its
    /// tools killed (see [`LeaseKeeper`], "The fence"). Nothing is written while watching, so
    /// a watcher that dies leaves nothing behind, and whoever takes the session after the
    /// taker (which may release it at once: a short hold) owes the old holder no wait. For
    /// `Runtime::run` (`keel resume`) and every short hold (submits, settings, decisions,
    /// cancels, closes).
    Observed,
}

/// As [`acquire`], with what to do about an expired lease whose holder may be alive
/// (`takeover`); reads the session's row first when that is not [`Takeover::Now`].
///
/// # Errors
/// As [`acquire`].
pub async fn acquire_as(
    store: &Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
    owner: &str,
    ttl: Duration,
    wait: Duration,
    takeover: Takeover,
) -> Result<Lease> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if takeover != Takeover::Now {
            let rec = store.get_session(tenant, session).await?;
            if let Some(l) = rec.lease
                && l.owner != owner
                && l.expires_at <= lease_clock()
                && !owner_is_dead_local_process(&l.owner)
            {
                let seen = (l.owner.clone(), l.expires_at, rec.lease_epoch);
                tracing::warn!(
                    %session,
                    holder = %l.owner,
                    wait_ms = (ttl + ttl / 10).as_millis() as u64,
                    "the session's lease expired but its holder may still be running a tool: watching it for a lease TTL before taking it over"
                );
                match watch(store, tenant, session, &seen, ttl + ttl / 10).await? {
                    Watched::Unchanged => {}
                    // Released, or its holder gone: take it now.
                    Watched::Free => continue,
                    Watched::Moved => {
                        // Renewed (alive) or taken: look again, within the wait.
                        if tokio::time::Instant::now() >= deadline {
                            return Err(RuntimeError::SessionBusy {
                                session,
                                owner: seen.0,
                            });
                        }
                        continue;
                    }
                }
            }
        }
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
                let until_expiry = (expires_at - lease_clock())
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

/// What [`watch`] saw of a lease.
enum Watched {
    /// The same holder, epoch and expiry all along.
    Unchanged,
    /// Released, or held by a dead process of this host now.
    Free,
    /// Renewed or taken by another: its holder (or another) is alive.
    Moved,
}

/// Watches `session`'s lease, seen as `seen` (holder, expiry, epoch), for `span`: a read every
/// 200 ms, ending at the first change.
async fn watch(
    store: &Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
    seen: &(String, chrono::DateTime<chrono::Utc>, keel_core::LeaseEpoch),
    span: Duration,
) -> Result<Watched> {
    let end = tokio::time::Instant::now() + span;
    loop {
        let now = tokio::time::Instant::now();
        if now >= end {
            return Ok(Watched::Unchanged);
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(200))).await;
        let rec = store.get_session(tenant, session).await?;
        match rec.lease {
            None => return Ok(Watched::Free),
            Some(l) if owner_is_dead_local_process(&l.owner) => return Ok(Watched::Free),
            Some(l)
                if (l.owner.as_str(), l.expires_at, rec.lease_epoch)
                    != (seen.0.as_str(), seen.1, seen.2) =>
            {
                return Ok(Watched::Moved);
            }
            Some(_) => {}
        }
    }
}

/// The wall time leases are reckoned in (the store's clock): `Utc::now()`, shifted in test
/// builds by `KEEL_CLOCK_SKEW_MS` (`keel_core::mechanisms::clock_skew_ms`; 0 otherwise) to play
/// a worker whose clock is wrong.
pub(crate) fn lease_clock() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::milliseconds(keel_core::mechanisms::clock_skew_ms())
}

/// How long until `lease` (of `ttl`) is `period` old: its grant time is `expires_at - ttl`
/// (the store's clock; a skew between hosts only moves the renewal earlier or later by it).
/// Zero when that moment has passed.
fn renewal_due_in(lease: &Lease, ttl: Duration, period: Duration) -> Duration {
    let left = (lease.expires_at - lease_clock())
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
        let here = LeaseOwner::this_process("me");
        assert!(!owner_is_dead_local_process(&here.to_string()));
        assert!(!owner_is_dead_local_process("w@some-other-host:1/pidns:1"));
        assert!(!owner_is_dead_local_process("garbage"));
        // pid 1 exists in every PID namespace.
        let init = LeaseOwner {
            pid: 1,
            ..here.clone()
        };
        assert!(!init.is_dead_local_process());
        // Beyond pid_max: no such process here.
        let gone = LeaseOwner {
            pid: 4_194_303,
            ..here
        };
        assert!(gone.is_dead_local_process(), "{gone}");
        assert!(owner_is_dead_local_process(&gone.to_string()));
    }

    #[test]
    fn a_missing_pid_of_another_pid_namespace_is_not_dead() {
        let ns = pid_namespace().expect("Linux has /proc/self/ns/pid");
        let here = LeaseOwner {
            pid: 4_194_303,
            ..LeaseOwner::this_process("w")
        };
        assert!(here.is_dead_local_process());
        // The same host name and a pid not alive here, in another PID namespace (another
        // container on this host): it may well be alive there.
        let other = LeaseOwner {
            pid_ns: Some(ns + 1),
            ..here.clone()
        };
        assert!(!other.is_dead_local_process(), "{other}");
        assert!(!owner_is_dead_local_process(&other.to_string()));
        // Nor is an owner that does not say its namespace.
        let unknown = format!("w@{}:4194303", hostname());
        assert!(!owner_is_dead_local_process(&unknown));
    }

    #[test]
    fn owner_strings_parse_back() {
        let here = LeaseOwner::this_process("serve@x:1");
        let s = here.to_string();
        assert_eq!(
            s,
            format!(
                "serve@x:1@{}:{}/pidns:{}",
                hostname(),
                std::process::id(),
                pid_namespace().unwrap()
            )
        );
        assert_eq!(LeaseOwner::parse(&s), Some(here.clone()));
        assert!(here.is_local_process(std::process::id()));
        assert!(!here.is_local_process(std::process::id() + 1));
        assert_eq!(
            LeaseOwner::parse("w@h:12"),
            Some(LeaseOwner {
                worker: "w".into(),
                host: "h".into(),
                pid: 12,
                pid_ns: None
            })
        );
        for bad in [
            "w@h",
            "w@h:x",
            "w@:1",
            "w@h:1/pidns:",
            "w@h:1/pidns:x",
            "h:1",
            "w@h/x:1",
        ] {
            assert_eq!(LeaseOwner::parse(bad), None, "{bad}");
        }
    }
}
