//! Fault injection for keel-runtime's own crash tests, compiled only with the `crash-injection`
//! feature (which only this crate's dev-dependency on itself enables: `cargo build` and `cargo
//! build --release` of any host leave it out, so a shipped binary ignores the variables).
//!
//! With the feature, after each committed journal append: `KEEL_CRASH_AT=<n>` kills the
//! process (`kill -9`: no destructors, no flushing, no lease release) right after its n-th
//! commit; `KEEL_CRASH_LOG=<file>` appends `<n> <site>` for every commit (the sites are the
//! names `Journal::commit` is given). Without it, [`after_commit`] does nothing.

/// Whether this build has the hook (`crash-injection` feature). Tests of hosts check it to
/// tell which build they run.
pub const CRASH_INJECTION: bool = cfg!(feature = "crash-injection");

/// Fault injection after a committed append at `site` (see the module docs).
#[cfg(feature = "crash-injection")]
pub(crate) fn after_commit(site: &'static str) {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct CrashConfig {
        at: Option<u64>,
        log: Option<String>,
    }
    static APPENDS: AtomicU64 = AtomicU64::new(0);
    static CONFIG: OnceLock<CrashConfig> = OnceLock::new();
    let cfg = CONFIG.get_or_init(|| CrashConfig {
        at: std::env::var("KEEL_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok()),
        log: std::env::var("KEEL_CRASH_LOG")
            .ok()
            .filter(|v| !v.is_empty()),
    });
    if cfg.at.is_none() && cfg.log.is_none() {
        return;
    }
    let n = APPENDS.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(path) = &cfg.log
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{n} {site}");
        let _ = f.sync_all();
    }
    if cfg.at == Some(n) {
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        std::process::abort();
    }
}

/// Without the `crash-injection` feature: nothing.
#[cfg(not(feature = "crash-injection"))]
#[inline(always)]
pub(crate) fn after_commit(_site: &'static str) {}
