//! FIFOs, sockets and devices in the workspace (issue 11 item 7): `read_file` on a FIFO blocked
//! forever and on a `/dev/zero`-like device read until memory ran out. Each test first shows
//! what a plain open-and-read by name does (blocks, or reads without end), then that the tools
//! refuse promptly with a message naming what the path is. The deadlines are correctness
//! deadlines with a wide margin (a refusal takes milliseconds), never a measurement.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use keel_tools::artifact::{ArtifactSink, FsArtifactSink};
use keel_tools::tool::{ToolResult, ToolResultStatus};
use rustix::fs::{CWD, FileType, Mode, OFlags};
use serde_json::{Value, json};

use crate::common::Fixture;

/// How long a refusal may take: a correctness deadline (it takes milliseconds), 10x and more
/// above anything a loaded CI machine needs.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long a naive read must still be blocked to count as "blocks": it blocks until a writer
/// comes, so a slow machine can only make this more true.
const STILL_BLOCKED_AFTER: Duration = Duration::from_millis(300);

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(CWD, path, FileType::Fifo, Mode::from_raw_mode(0o644), 0).unwrap();
}

/// Creates a character device with `/dev/zero`'s numbers (1, 5) at `path`; `false` when this
/// process may not (not root): then no model can put one in the workspace either.
fn mknod_zero(path: &Path) -> bool {
    match rustix::fs::mknodat(
        CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 5),
    ) {
        Ok(()) => true,
        Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => false,
        Err(e) => panic!("mknod of a char device failed as root: {e}"),
    }
}

/// Runs `work` on a thread and shows it is still blocked on the FIFO at `fifo` after
/// [`STILL_BLOCKED_AFTER`]; then opens the other end (non-blocking, repeatedly) until `work`
/// finishes, so the test never hangs.
fn show_it_blocks(fifo: &Path, work: impl FnOnce() + Send + 'static) {
    let handle: JoinHandle<()> = std::thread::spawn(work);
    std::thread::sleep(STILL_BLOCKED_AFTER);
    assert!(
        !handle.is_finished(),
        "a plain open of the FIFO did not block: the test would prove nothing"
    );
    let mut other_ends: Vec<OwnedFd> = Vec::new();
    while !handle.is_finished() {
        for flags in [OFlags::RDONLY, OFlags::WRONLY] {
            if let Ok(fd) = rustix::fs::open(fifo, flags | OFlags::NONBLOCK, Mode::empty()) {
                other_ends.push(fd);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
        // Closing write ends gives a blocked reader its end of file.
        other_ends
            .retain(|fd| rustix::fs::fcntl_getfl(fd).is_ok_and(|f| !f.contains(OFlags::WRONLY)));
    }
    handle.join().unwrap();
}

async fn call_within_deadline(f: &Fixture, tool: &str, args: Value) -> ToolResult {
    tokio::time::timeout(DEADLINE, f.call(tool, args.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {args} did not return within {DEADLINE:?}"))
}

fn assert_refused(r: &ToolResult, needle: &str) {
    assert_eq!(r.status, ToolResultStatus::Failed, "{}", r.content);
    assert!(r.content.contains(needle), "{}", r.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_refuses_a_fifo_promptly_instead_of_blocking_forever() {
    let f = Fixture::new();
    let fifo = f.path("pipe");
    mkfifo(&fifo);
    let path = fifo.clone();
    show_it_blocks(&fifo, move || {
        let _ = std::fs::read(path);
    });

    let r = call_within_deadline(&f, "read_file", json!({"path": "pipe"})).await;
    assert_refused(&r, "`pipe` is a FIFO, not a regular file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_and_edit_file_refuse_a_fifo_without_blocking_or_writing() {
    let f = Fixture::new();
    let fifo = f.path("pipe");
    mkfifo(&fifo);
    let path = fifo.clone();
    show_it_blocks(&fifo, move || {
        let _ = std::fs::write(path, "x");
    });

    let w = call_within_deadline(&f, "write_file", json!({"path": "pipe", "content": "x"})).await;
    assert_refused(&w, "`pipe` is a FIFO, not a regular file");
    assert!(w.not_performed, "{}", w.content);
    let e = call_within_deadline(
        &f,
        "edit_file",
        json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert_refused(&e, "`pipe` is a FIFO, not a regular file");

    // With a reader waiting on the other end, nothing reaches it either.
    let reader = rustix::fs::open(&fifo, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).unwrap();
    let w =
        call_within_deadline(&f, "write_file", json!({"path": "pipe", "content": "leak"})).await;
    assert_refused(&w, "is a FIFO");
    // What the refused call would have written never reaches the reader. (Only the tool's
    // bytes are asserted: one byte, not "leak", was once read here in CI; its source — the
    // helper writer of `show_it_blocks` or the first refused `write_file` of "x" — is open.)
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&reader, &mut buf).unwrap_or(0);
    assert!(
        !buf[..n].windows(4).any(|w| w == b"leak"),
        "the refused write reached the FIFO: {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_refuses_a_character_device_without_reading_it() {
    let f = Fixture::new();
    let zero = f.path("zero");
    if !mknod_zero(&zero) {
        // Not root: mknod is refused, so a model cannot plant a device here either.
        return;
    }
    // Read by name, it never ends: the first MiB is all there is to show here.
    let mut first = Vec::new();
    std::fs::File::open(&zero)
        .unwrap()
        .take(1 << 20)
        .read_to_end(&mut first)
        .unwrap();
    assert_eq!(first.len(), 1 << 20, "the device reads without end");

    let r = call_within_deadline(&f, "read_file", json!({"path": "zero"})).await;
    assert_refused(&r, "`zero` is a character device, not a regular file");
    let w = call_within_deadline(&f, "write_file", json!({"path": "zero", "content": "x"})).await;
    assert_refused(&w, "`zero` is a character device, not a regular file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_names_a_socket_and_a_directory_for_what_they_are() {
    let f = Fixture::new();
    let _listener = std::os::unix::net::UnixListener::bind(f.path("sock")).unwrap();
    std::fs::create_dir(f.path("dir")).unwrap();
    let r = call_within_deadline(&f, "read_file", json!({"path": "sock"})).await;
    assert_refused(&r, "`sock` is a socket, not a regular file");
    let w = call_within_deadline(&f, "write_file", json!({"path": "sock", "content": "x"})).await;
    assert_refused(&w, "`sock` is a socket, not a regular file");
    let r = call_within_deadline(&f, "read_file", json!({"path": "dir"})).await;
    assert_refused(&r, "`dir` is a directory; use list_dir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_and_glob_skip_fifos_and_devices_and_never_block_on_a_fifo_gitignore() {
    let f = Fixture::new();
    f.write("a.txt", "needle\n");
    let gitignore = f.path(".gitignore");
    mkfifo(&gitignore);
    mkfifo(&f.path("pipe.txt"));
    let has_device = mknod_zero(&f.path("zero.txt"));
    // The walker glob and grep used before blocks reading the FIFO `.gitignore`.
    let root = f.path(".");
    show_it_blocks(&gitignore, move || {
        let _ = ignore::WalkBuilder::new(&root)
            .hidden(false)
            .require_git(false)
            .build()
            .count();
    });

    let g = call_within_deadline(&f, "grep", json!({"pattern": "needle"})).await;
    assert_eq!(g.status, ToolResultStatus::Succeeded, "{}", g.content);
    assert_eq!(g.content, "a.txt:1:needle\n");
    let l = call_within_deadline(&f, "glob", json!({"pattern": "*.txt"})).await;
    assert_eq!(l.content, "a.txt\n", "only the regular file is a match");
    let p = call_within_deadline(&f, "grep", json!({"pattern": "x", "path": "pipe.txt"})).await;
    assert_refused(&p, "`pipe.txt` is a FIFO, not a regular file");
    let d = call_within_deadline(&f, "list_dir", json!({"path": "."})).await;
    assert!(d.content.contains("pipe.txt"), "{}", d.content);
    assert_eq!(has_device, d.content.contains("zero.txt"), "{}", d.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_read_back_refuses_a_fifo_or_a_symlink_in_the_artifact_dir() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FsArtifactSink::new(dir.path());
    std::fs::create_dir_all(dir.path()).unwrap();
    let fifo: PathBuf = dir.path().join("call_1.out");
    mkfifo(&fifo);
    let path = fifo.clone();
    show_it_blocks(&fifo, move || {
        let _ = std::fs::read(path);
    });
    let err = tokio::time::timeout(DEADLINE, sink.get("call_1.out"))
        .await
        .expect("artifact read-back returned")
        .unwrap_err();
    assert!(
        err.to_string().contains("is a FIFO, not a regular file"),
        "{err}"
    );
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("call_2.out"))
        .unwrap();
    let err = sink.get("call_2.out").await.unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
}

/// The probe a write records before it runs (the file's hash, issue 10 item 7) and the
/// reconcile after a crash read the file the same way: a FIFO at the path blocks neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_probes_and_reconcile_do_not_block_on_a_fifo() {
    use keel_tools::Tool;
    use keel_tools::builtin::{EditFile, WriteFile};
    use keel_tools::tool::ReconcileOutcome;
    let f = Fixture::new();
    mkfifo(&f.path("pipe"));
    let args = json!({"path": "pipe", "content": "x"});
    let probe = tokio::time::timeout(DEADLINE, WriteFile.prepare(&args, &f.ctx))
        .await
        .expect("prepare returned")
        .expect("a probe");
    assert_eq!(probe["before"], Value::Null, "{probe}");
    let outcome = tokio::time::timeout(
        DEADLINE,
        WriteFile.reconcile_call("k", &args, Some(&probe), &f.ctx),
    )
    .await
    .expect("reconcile returned");
    assert!(
        matches!(outcome, ReconcileOutcome::NotHappened { .. }),
        "nothing was written: it may run again; got {outcome:?}"
    );
    let edit = json!({"path": "pipe", "old_string": "a", "new_string": "b"});
    let probe = tokio::time::timeout(DEADLINE, EditFile.prepare(&edit, &f.ctx))
        .await
        .expect("prepare returned");
    assert_eq!(probe, None, "an edit of a FIFO would fail: no probe");
}
