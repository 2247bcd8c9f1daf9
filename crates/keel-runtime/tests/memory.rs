//! Tool output kept in memory is bounded (issue 10, review item K): a shell command printing
//! 400 MB made keel keep all of it, because the live stream's redactor kept everything it had
//! already passed on (`head -c 400000000 /dev/zero` → 612 MB peak RSS). What stays in memory is
//! the artifact (capped at 32 MB, with its copies on the way to the store), the head and tail
//! shown to the model, and the redactor's look-back window: nothing that grows with the output.

use std::sync::Arc;

use keel_runtime::Redactor;
use keel_runtime::redact::StreamRedactor;
use serde_json::json;

use crate::common::*;

/// Output of the big run, bytes (the review's size).
const BIG: u64 = 400 * 1024 * 1024;

/// Output of the reference run, bytes: over the 32 MB artifact cap, so both runs keep a full
/// artifact and differ only in how much went through the live stream.
const SMALL: u64 = 40 * 1024 * 1024;

/// How much more the big run may peak at than the reference run, KiB. Expected: about 0 (what
/// is kept does not depend on the output's size past the artifact cap; allocator noise is a few
/// MB). Before, the big run kept 360 MB more (all of the extra output).
const GROWTH_BOUND_KB: u64 = 64 * 1024;

/// The bound on the big run's peak, KiB: under the output it printed. Expected ~230 MB: the
/// test process (~40 MB) and the 32 MB artifact with its copies on the way to the store (the
/// capture, the redacted text, the row being written).
const PEAK_BOUND_KB: u64 = 384 * 1024;

/// The redactor of a stream keeps a bounded window, whatever went through it, and still
/// redacts a secret split across chunks anywhere in the stream.
#[test]
fn a_stream_redactor_keeps_a_bounded_window_of_a_long_stream() {
    let r = Arc::new(Redactor::new(&["tok_[0-9]{4}".into()], &[]).unwrap());
    let mut s = StreamRedactor::new(r);
    let chunk = "x".repeat(16 * 1024);
    let mut out_len = 0usize;
    let mut most = 0usize;
    for i in 0..2_000 {
        let mut piece = chunk.clone();
        if i == 1_500 {
            piece.push_str("tok_12");
        }
        if i == 1_501 {
            piece.insert_str(0, "34");
        }
        let shown = s.push(&piece);
        assert!(!shown.contains("tok_12"), "chunk {i}");
        out_len += shown.len();
        most = most.max(s.buffered_bytes());
    }
    let rest = s.finish();
    assert!(rest.is_empty() || !rest.contains("tok_"));
    out_len += rest.len();
    assert_eq!(
        out_len,
        2_000 * 16 * 1024 + "[REDACTED]".len(),
        "everything shown once, `tok_1234` redacted"
    );
    assert!(
        most < 256 * 1024,
        "kept {most} bytes of a 32 MB stream at most"
    );
}

/// The child process's test: runs one session whose shell command prints
/// `KEEL_MEMORY_PROBE_BYTES` bytes, then reports its own peak resident memory. A no-op unless
/// `KEEL_MEMORY_PROBE` names a backend.
#[test]
#[ignore = "entry point of the memory test's child process"]
fn memory_probe_process() {
    let Ok(backend) = std::env::var("KEEL_MEMORY_PROBE") else {
        return;
    };
    let bytes: u64 = std::env::var("KEEL_MEMORY_PROBE_BYTES")
        .unwrap()
        .parse()
        .unwrap();
    let backend = if backend == "postgres" {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let lines = [
            json!({"tool_calls": [call("shell", json!({"command": format!("head -c {bytes} /dev/zero")}))]}),
            json!({"text": "printed"}),
        ];
        let f = fixture(backend, &lines, |_| {}).await;
        f.rt.submit(f.tenant, f.session, "print").await.unwrap();
        let out = f.rt.run(f.tenant, f.session).await.unwrap();
        assert_eq!(
            out.turns[0].terminal_reason,
            keel_core::TerminalReason::Completed
        );
        let evs = f.events().await;
        assert!(
            evs.iter().any(|e| matches!(&e.body,
                keel_core::EventBody::ToolCallFinished { output, .. } if output.contains("bytes"))),
            "the shell printed and was cut"
        );
    });
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .to_owned();
    println!("KEEL_VMHWM_KB={hwm}");
}

/// The peak resident memory (KiB) of a process that runs a command printing `bytes` bytes.
fn peak_kb(backend: &str, bytes: u64) -> u64 {
    // At the lowest priority: 400 MB through a debug build's pipeline takes a core for a while,
    // and the tests running beside it should not notice.
    let out = std::process::Command::new("nice")
        .args(["-n", "19"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "memory::memory_probe_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KEEL_MEMORY_PROBE", backend)
        .env("KEEL_MEMORY_PROBE_BYTES", bytes.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = stdout
        .find("KEEL_VMHWM_KB=")
        .unwrap_or_else(|| panic!("the child reported no peak: {stdout}"));
    stdout[at + "KEEL_VMHWM_KB=".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A shell command printing 400 MB peaks no higher than one printing 40 MB (each run in a
/// process of its own, so its peak is the run's): past the artifact cap, nothing kept grows
/// with the output. On SQLite and on PostgreSQL.
#[test]
fn a_command_printing_400_mb_keeps_no_more_in_memory_than_one_printing_40_mb() {
    for backend in ["sqlite", "postgres"] {
        let small = peak_kb(backend, SMALL);
        let big = peak_kb(backend, BIG);
        eprintln!(
            "{backend}: peak {} MB for 40 MB of output, {} MB for 400 MB",
            small / 1024,
            big / 1024
        );
        assert!(
            big < small + GROWTH_BOUND_KB,
            "{backend}: 360 MB more output raised the peak from {} MB to {} MB (bound: +{} MB)",
            small / 1024,
            big / 1024,
            GROWTH_BOUND_KB / 1024
        );
        assert!(
            big < PEAK_BOUND_KB,
            "{backend}: peak {} MB (bound {} MB)",
            big / 1024,
            PEAK_BOUND_KB / 1024
        );
    }
}
