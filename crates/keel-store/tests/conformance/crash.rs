//! Crash tests: a child process appends batches in a loop and is killed with SIGKILL at arbitrary
//! points; afterwards the journal holds every batch the child saw committed and no partial batch.
//!
//! The child is this test binary itself, re-run with `--exact conformance::crash::child_appender
//! --ignored` and the store location in the environment.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use keel_core::*;

use super::harness::{Harness, events, session};

const BATCH: u64 = 5;

pub async fn kill_appender_and_check(h: &Harness) {
    let t = TenantId::new();
    let f = session(&h.store, t).await;
    let mut seen_committed = 1;
    for (round, kill_after) in [7u64, 13, 3, 21].into_iter().enumerate() {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "conformance::crash::child_appender",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KEEL_CRASH_LOCATION", h.location.open_string())
            .env("KEEL_CRASH_TENANT", t.to_string())
            .env("KEEL_CRASH_SESSION", f.session.to_string())
            .env("KEEL_CRASH_EPOCH", f.lease.epoch.0.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read "committed N" lines on a thread and report once enough were seen; keep draining
        // afterwards so the child never dies of a closed pipe: it must die by SIGKILL, mid-append.
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            let mut count = 0u64;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(v) = line.strip_prefix("committed ") {
                    last = v.trim().parse().unwrap();
                    count += 1;
                    if count == kill_after {
                        let _ = tx.send((last, true));
                    }
                }
            }
            let _ = tx.send((last, false));
        });
        let (last_seen, reached) = tokio::task::spawn_blocking(move || rx.recv().unwrap())
            .await
            .unwrap();
        assert!(
            reached,
            "round {round}: the child stopped before committing {kill_after} batches"
        );
        // The child is still appending: kill -9 lands at an arbitrary point of its next append.
        std::thread::sleep(Duration::from_micros(300 * round as u64));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "round {round}: the child must die by SIGKILL, not exit on its own"
        );
        reader.join().unwrap();
        seen_committed = seen_committed.max(last_seen);

        // Reopen (a fresh store, as after a restart) and check the journal.
        let store = h.reopen().await.unwrap();
        let rec = store.get_session(t, f.session).await.unwrap();
        let all = store.read(t, f.session, 0, None).await.unwrap();
        assert_eq!(all.len() as u64, rec.version, "version and journal agree");
        assert!(
            rec.version >= seen_committed,
            "round {round}: committed version {seen_committed} lost (now {})",
            rec.version
        );
        assert_eq!(
            (rec.version - 1) % BATCH,
            0,
            "round {round}: a partial batch was written (version {})",
            rec.version
        );
        assert!(all.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1));
        SessionState::replay(&all).unwrap();
        seen_committed = rec.version;
    }
}

/// The child side: appends batches until killed. Does nothing unless run by the crash test.
#[test]
#[ignore = "run as a child process by crash_mid_append_keeps_every_committed_event"]
fn child_appender() {
    let Ok(location) = std::env::var("KEEL_CRASH_LOCATION") else {
        return;
    };
    let tenant: TenantId = std::env::var("KEEL_CRASH_TENANT").unwrap().parse().unwrap();
    let session: SessionId = std::env::var("KEEL_CRASH_SESSION")
        .unwrap()
        .parse()
        .unwrap();
    let epoch = LeaseEpoch(std::env::var("KEEL_CRASH_EPOCH").unwrap().parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = keel_store::open(&location).await.unwrap();
        let mut version = store.get_session(tenant, session).await.unwrap().version;
        loop {
            version = store
                .append(
                    tenant,
                    session,
                    version,
                    epoch,
                    &events(session, version, BATCH as usize),
                )
                .await
                .unwrap();
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "committed {version}").unwrap();
            out.flush().unwrap();
        }
    });
}
