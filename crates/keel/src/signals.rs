//! Interrupts (Ctrl-C / SIGINT, and SIGTERM) as one queue for the whole process: each signal is
//! delivered to exactly one waiter, and a signal that arrives while nobody waits is kept for the
//! next one (so a quick second Ctrl-C is never lost between the end of a turn and the prompt).

use std::sync::{Arc, OnceLock};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, mpsc};

type Queue = Arc<Mutex<mpsc::UnboundedReceiver<()>>>;

static QUEUE: OnceLock<Queue> = OnceLock::new();

fn queue() -> Queue {
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            for kind in [SignalKind::interrupt(), SignalKind::terminate()] {
                let tx = tx.clone();
                if let Ok(mut s) = signal(kind) {
                    tokio::spawn(async move {
                        while s.recv().await.is_some() {
                            if tx.send(()).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
            Arc::new(Mutex::new(rx))
        })
        .clone()
}

/// Starts listening (call early, inside the tokio runtime, so no signal is missed).
pub fn install() {
    let _ = queue();
}

/// Resolves on the next interrupt not yet taken by another waiter.
pub async fn next() {
    let q = queue();
    let mut rx = q.lock().await;
    if rx.recv().await.is_none() {
        std::future::pending::<()>().await;
    }
}
