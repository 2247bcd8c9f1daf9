//! Symlink-swap races against the file tools (issue 11 item 6). A background thread swaps a real
//! workspace directory (or file) with a symlink to outside using `renameat2(RENAME_EXCHANGE)`, as
//! fast as it can, while a tool uses the path. Each test first shows the race escapes through
//! what the tools did before — check the path with `Workspace::resolve`, then reopen it by name
//! — so it cannot pass because the race never happened; then runs the tool a fixed number of
//! rounds and asserts that nothing outside was written, read or listed.
//!
//! Bounded rounds, no timing assertions: the naive side stops at its first escape (it is given
//! up to `NAIVE_ROUNDS` tries), the Keel side runs `ROUNDS` calls.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use keel_tools::tool::ToolResultStatus;
use keel_tools::workspace::Workspace;
use rustix::fs::{CWD, Mode, OFlags, RenameFlags};
use serde_json::json;

use crate::common::Fixture;

/// Tool calls per tool under the race.
const ROUNDS: usize = 200;
/// Most tries the naive check-then-reopen gets to show the race escapes.
const NAIVE_ROUNDS: usize = 200_000;

/// The race tests run one at a time: each keeps a core busy swapping.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Swaps two paths with `renameat2(RENAME_EXCHANGE)` in a loop until dropped.
struct Swapper {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Swapper {
    fn start(a: PathBuf, b: PathBuf) -> Self {
        // One exchange up front: fails loudly where renameat2 is missing, instead of racing
        // nothing.
        rustix::fs::renameat_with(CWD, &a, CWD, &b, RenameFlags::EXCHANGE)
            .expect("renameat2(RENAME_EXCHANGE) must work here for the race to be real");
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(1));
        let thread = {
            let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if rustix::fs::renameat_with(CWD, &a, CWD, &b, RenameFlags::EXCHANGE).is_ok() {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        Self {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    /// Whether to make call number `round` (from 0) of a loop that began when the swapper had
    /// made `before` swaps: `ROUNDS` calls, then on until the swapper made `ROUNDS` swaps since
    /// (a scheduler can starve it for a while), at most `100 * ROUNDS` calls.
    fn keep_going(&self, round: usize, before: u64) -> bool {
        round < ROUNDS || (self.swaps() < before + ROUNDS as u64 && round < 100 * ROUNDS)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A workspace with a real directory `d` holding `f` (content `inside`), a symlink `l` to an
/// outside directory holding `f` (content `outside`), and a handle on the real directory (it
/// keeps naming it whichever name it has).
struct DirSwap {
    f: Fixture,
    outside: tempfile::TempDir,
    real: OwnedFd,
}

impl DirSwap {
    fn new(inside: &str, outside_content: &str) -> Self {
        let f = Fixture::new();
        let outside = tempfile::tempdir().unwrap();
        f.write("d/f", inside);
        std::fs::write(outside.path().join("f"), outside_content).unwrap();
        std::os::unix::fs::symlink(outside.path(), f.path("l")).unwrap();
        let real = rustix::fs::open(
            f.path("d"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        Self { f, outside, real }
    }

    fn swapper(&self) -> Swapper {
        Swapper::start(self.f.path("d"), self.f.path("l"))
    }

    fn outside_file(&self) -> PathBuf {
        self.outside.path().join("f")
    }

    /// Resets the inside file through the handle (never by name: the names are being swapped).
    fn reset_inside(&self, content: &str) {
        let fd = rustix::fs::openat(
            &self.real,
            "f",
            OFlags::WRONLY | OFlags::TRUNC | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        rustix::io::write(&fd, content.as_bytes()).unwrap();
    }
}

/// What the file tools did before: check the path, then (after a `stat` and a hop to a
/// blocking thread, as `tokio::fs` does) reopen it by its absolute name.
fn naive_resolve(ws: &Workspace, path: &str) -> Option<PathBuf> {
    let absolute = ws.resolve(path).ok()?.absolute;
    let _ = std::fs::metadata(&absolute);
    std::thread::yield_now();
    Some(absolute)
}

/// Runs `attempt` until it reports an escape or `NAIVE_ROUNDS` pass; how many tries it took.
fn naive_escapes(mut attempt: impl FnMut() -> bool) -> Option<usize> {
    (1..=NAIVE_ROUNDS).find(|_| attempt())
}

/// After a swapper stopped: puts the real directory (or file) back under `real` (`link` is then
/// the symlink again).
fn settle(real: &Path, link: &Path) {
    if std::fs::symlink_metadata(real).unwrap().is_symlink() {
        rustix::fs::renameat_with(CWD, real, CWD, link, RenameFlags::EXCHANGE).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_never_writes_outside_while_a_directory_is_swapped_for_a_symlink() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = DirSwap::new("inside", "outside");
    let ws = s.f.ctx.workspace.clone();
    {
        let _swap = s.swapper();
        let took = naive_escapes(|| {
            if let Some(path) = naive_resolve(&ws, "d/f") {
                let _ = std::fs::write(path, "naive");
            }
            std::fs::read_to_string(s.outside_file()).unwrap() != "outside"
        });
        assert!(
            took.is_some(),
            "the race never made check-then-reopen write outside in {NAIVE_ROUNDS} tries; the test would prove nothing"
        );
    }
    std::fs::write(s.outside_file(), "outside").unwrap();

    let swap = s.swapper();
    let before = swap.swaps();
    let mut refused = 0;
    let mut round = 0;
    while swap.keep_going(round, before) {
        round += 1;
        let r =
            s.f.call(
                "write_file",
                json!({"path": "d/f", "content": format!("round {round}")}),
            )
            .await;
        if r.status != ToolResultStatus::Succeeded {
            refused += 1;
            assert!(
                r.content.contains("refused") && r.not_performed,
                "{}",
                r.content
            );
        }
    }
    assert!(
        swap.swaps() > before,
        "the swapper never ran during the calls"
    );
    drop(swap);
    assert_eq!(
        std::fs::read_to_string(s.outside_file()).unwrap(),
        "outside",
        "write_file wrote outside the workspace ({refused} of {round} calls refused)"
    );
    settle(&s.f.path("d"), &s.f.path("l"));
    let r =
        s.f.call("write_file", json!({"path": "d/f", "content": "settled"}))
            .await;
    assert_eq!(r.status, ToolResultStatus::Succeeded, "{}", r.content);
    assert_eq!(std::fs::read_to_string(s.f.path("d/f")).unwrap(), "settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_never_follows_a_final_symlink_swapped_in_for_the_file() {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("target");
    std::fs::write(&target, "outside").unwrap();
    f.write("t", "inside");
    std::os::unix::fs::symlink(&target, f.path("u")).unwrap();
    let ws = f.ctx.workspace.clone();
    {
        let _swap = Swapper::start(f.path("t"), f.path("u"));
        let took = naive_escapes(|| {
            if let Some(path) = naive_resolve(&ws, "t") {
                let _ = std::fs::write(path, "naive");
            }
            std::fs::read_to_string(&target).unwrap() != "outside"
        });
        assert!(
            took.is_some(),
            "check-then-reopen never followed the swapped-in symlink in {NAIVE_ROUNDS} tries"
        );
    }
    std::fs::write(&target, "outside").unwrap();

    let swap = Swapper::start(f.path("t"), f.path("u"));
    let before = swap.swaps();
    let mut round = 0;
    while swap.keep_going(round, before) {
        round += 1;
        f.call(
            "write_file",
            json!({"path": "t", "content": format!("round {round}")}),
        )
        .await;
    }
    assert!(
        swap.swaps() > before,
        "the swapper never ran during the calls"
    );
    drop(swap);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "outside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_never_returns_outside_content_while_a_directory_is_swapped() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = DirSwap::new("inside", "TOP-SECRET");
    let ws = s.f.ctx.workspace.clone();
    {
        let _swap = s.swapper();
        let took = naive_escapes(|| {
            naive_resolve(&ws, "d/f")
                .and_then(|path| std::fs::read_to_string(path).ok())
                .is_some_and(|text| text.contains("TOP-SECRET"))
        });
        assert!(
            took.is_some(),
            "check-then-reopen never read the outside secret in {NAIVE_ROUNDS} tries"
        );
    }

    let swap = s.swapper();
    let before = swap.swaps();
    let mut round = 0;
    while swap.keep_going(round, before) {
        round += 1;
        let r = s.f.call("read_file", json!({"path": "d/f"})).await;
        assert!(
            !r.content.contains("TOP-SECRET"),
            "read_file returned outside content: {}",
            r.content
        );
        if r.status == ToolResultStatus::Succeeded {
            assert!(r.content.contains("inside"), "{}", r.content);
        }
    }
    assert!(
        swap.swaps() > before,
        "the swapper never ran during the calls"
    );
    drop(swap);
    // Still works once the path holds still (a tool refusing everything would pass the above).
    settle(&s.f.path("d"), &s.f.path("l"));
    let r = s.f.call("read_file", json!({"path": "d/f"})).await;
    assert_eq!(r.status, ToolResultStatus::Succeeded, "{}", r.content);
    assert!(r.content.contains("inside"), "{}", r.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_file_never_edits_outside_while_a_directory_is_swapped() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = DirSwap::new("value = 1\n", "value = 1\n");
    let ws = s.f.ctx.workspace.clone();
    {
        let _swap = s.swapper();
        let took = naive_escapes(|| {
            // The old edit_file: check, read by name, replace, write by name.
            s.reset_inside("value = 1\n");
            if let Some(path) = naive_resolve(&ws, "d/f")
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                let _ = std::fs::write(&path, text.replace("value = 1", "value = 2"));
            }
            std::fs::read_to_string(s.outside_file()).unwrap() != "value = 1\n"
        });
        assert!(
            took.is_some(),
            "check-then-reopen never edited outside in {NAIVE_ROUNDS} tries"
        );
    }
    std::fs::write(s.outside_file(), "value = 1\n").unwrap();

    let swap = s.swapper();
    let before = swap.swaps();
    let mut round = 0;
    while swap.keep_going(round, before) {
        round += 1;
        s.reset_inside("value = 1\n");
        s.f.call(
            "edit_file",
            json!({"path": "d/f", "old_string": "value = 1", "new_string": "value = 2"}),
        )
        .await;
    }
    assert!(
        swap.swaps() > before,
        "the swapper never ran during the calls"
    );
    drop(swap);
    assert_eq!(
        std::fs::read_to_string(s.outside_file()).unwrap(),
        "value = 1\n",
        "edit_file edited a file outside the workspace"
    );
}

/// `d/in.txt` inside, `l` → outside directory with `out.txt`; both files contain `needle`.
fn walk_race() -> (Fixture, tempfile::TempDir) {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    f.write("d/in.txt", "needle inside\n");
    std::fs::write(outside.path().join("out.txt"), "needle TOP-SECRET\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), f.path("l")).unwrap();
    (f, outside)
}

/// What glob and grep did before: the `ignore` crate's walker, files read by name.
fn naive_walk_escapes(root: &Path) -> bool {
    ignore::WalkBuilder::new(root)
        .hidden(false)
        .require_git(false)
        .build()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .any(|e| {
            e.path().ends_with("out.txt")
                || std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("TOP-SECRET"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_glob_and_list_dir_never_list_or_read_outside_during_a_swap() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (f, _outside) = walk_race();
    {
        let _swap = Swapper::start(f.path("d"), f.path("l"));
        let root = f.ctx.workspace.root().to_path_buf();
        let took = naive_escapes(|| naive_walk_escapes(&root));
        assert!(
            took.is_some(),
            "the old walk never wandered outside in {NAIVE_ROUNDS} tries"
        );
        let ws = f.ctx.workspace.clone();
        let took = naive_escapes(|| {
            naive_resolve(&ws, "d")
                .and_then(|p| std::fs::read_dir(p).ok())
                .is_some_and(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .any(|e| e.file_name() == "out.txt")
                })
        });
        assert!(
            took.is_some(),
            "check-then-read_dir never listed outside in {NAIVE_ROUNDS} tries"
        );
    }

    let swap = Swapper::start(f.path("d"), f.path("l"));
    let before = swap.swaps();
    let mut round = 0;
    while swap.keep_going(round, before) {
        round += 1;
        let g = f.call("grep", json!({"pattern": "needle"})).await;
        assert!(
            !g.content.contains("TOP-SECRET") && !g.content.contains("out.txt"),
            "grep read outside: {}",
            g.content
        );
        let l = f.call("glob", json!({"pattern": "**/*.txt"})).await;
        assert!(
            !l.content.contains("out.txt"),
            "glob listed outside: {}",
            l.content
        );
        let d = f.call("list_dir", json!({"path": "d"})).await;
        assert!(
            !d.content.contains("out.txt"),
            "list_dir listed outside: {}",
            d.content
        );
    }
    assert!(
        swap.swaps() > before,
        "the swapper never ran during the calls"
    );
    drop(swap);
    settle(&f.path("d"), &f.path("l"));
    let g = f.call("grep", json!({"pattern": "needle"})).await;
    assert_eq!(g.content, "d/in.txt:1:needle inside\n");
    let l = f.call("list_dir", json!({"path": "d"})).await;
    assert_eq!(l.content, "in.txt\n");
}
