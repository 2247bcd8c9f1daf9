//! Taking a session's lease (`keel_runtime::lease::acquire`, issue 13): a holder that is a dead
//! process of this host and PID namespace is taken over at once; a holder in another PID
//! namespace on a host of the same name (another container) is waited out, whatever its
//! process id looks like here.

use std::time::Duration;

use keel_runtime::RuntimeError;
use keel_runtime::lease::{self, LeaseOwner};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(a_worker_in_another_pid_namespace_keeps_its_lease_while_a_dead_local_one_loses_it);

/// A process id that no process of this PID namespace has: beyond the kernel's `pid_max`.
const NO_SUCH_PID: u32 = 4_194_303;

/// The session's lease is held (TTL 60 s) by a worker of this host whose process id does not
/// exist here. In another PID namespace (its owner string says so), it may be alive: `acquire`
/// waits and reports the session busy, and the lease stays the holder's at the same epoch. In
/// this PID namespace it is dead: `acquire` takes the lease over at once.
async fn a_worker_in_another_pid_namespace_keeps_its_lease_while_a_dead_local_one_loses_it(
    b: Backend,
) {
    let f = fixture(b, &[json!({"text": "hi"})], |_| {}).await;
    let store = f.db.store.clone();
    let here = lease::pid_namespace().expect("Linux has /proc/self/ns/pid");
    let ttl = Duration::from_secs(60);
    // `holder` takes the lease, then this process (worker "me") asks for it, waiting 300 ms.
    let take_from = |holder: LeaseOwner| {
        let store = store.clone();
        async move {
            let held = store
                .acquire_lease(f.tenant, f.session, &holder.to_string(), ttl)
                .await
                .unwrap();
            let me = lease::owner_string("me");
            let got = lease::acquire(
                &store,
                f.tenant,
                f.session,
                &me,
                ttl,
                Duration::from_millis(300),
            )
            .await;
            (held, got)
        }
    };

    let elsewhere = LeaseOwner {
        pid: NO_SUCH_PID,
        pid_ns: Some(here + 1),
        ..LeaseOwner::this_process("worker")
    };
    let (held, got) = take_from(elsewhere.clone()).await;
    let e = got.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::SessionBusy { owner, .. } if *owner == elsewhere.to_string()),
        "{e}"
    );
    let rec = store.get_session(f.tenant, f.session).await.unwrap();
    assert_eq!(rec.lease.map(|l| l.owner), Some(elsewhere.to_string()));
    assert_eq!(rec.lease_epoch, held.epoch, "nobody took it");
    store.release_lease(f.tenant, &held).await.unwrap();

    let dead_here = LeaseOwner {
        pid: NO_SUCH_PID,
        ..LeaseOwner::this_process("worker")
    };
    let (_, got) = take_from(dead_here).await;
    assert_eq!(got.unwrap().owner, lease::owner_string("me"));
}
