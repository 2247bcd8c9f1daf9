//! Replays every committed fuzz input through its target's entry function: the corpora
//! (`fuzz/corpus/<target>/*`, seeds and what the fuzzer kept, minimized) and every crash
//! reproducer (`fuzz/regressions/<target>/*`), so `cargo test` covers them without cargo-fuzz.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

use std::path::PathBuf;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted (none when the folder is missing).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

fn replay(kind: &str, target: &str) -> usize {
    let (_, run) = keel_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap();
    let files = inputs(kind, target);
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "{} failed its target {target}",
            file.display()
        );
    }
    files.len()
}

macro_rules! replay_tests {
    ($($target:ident,)*) => {
        mod corpus {$(
            /// Every corpus file of the target passes (and there are seeds to pass).
            #[test]
            fn $target() {
                let n = super::replay("corpus", stringify!($target));
                assert!(n > 0, "fuzz/corpus/{} has no inputs", stringify!($target));
            }
        )*}
        mod regressions {$(
            /// Every crash reproducer of the target passes now.
            #[test]
            fn $target() {
                super::replay("regressions", stringify!($target));
            }
        )*}
    };
}

replay_tests! {
    sse_openai_chat,
    sse_openai_responses,
    sse_anthropic,
    tool_arguments,
    policy_rule,
    shell_analysis,
    event_fold,
    api_request,
}

/// Each target has a replay test above and a cargo-fuzz target in `fuzz/fuzz_targets/`.
#[test]
fn every_target_is_replayed_and_fuzzed() {
    assert_eq!(
        keel_fuzz::TARGETS.len(),
        8,
        "add the new target to replay_tests!"
    );
    for (name, _) in keel_fuzz::TARGETS {
        let file = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        assert!(file.is_file(), "no cargo-fuzz target {}", file.display());
    }
}
