//! The crash-injection hook (`KEEL_CRASH_AT=<n>`: `kill -9` after the n-th journal commit) is
//! compiled only with keel-runtime's `crash-injection` feature, which only keel-runtime's own
//! tests enable (a dev-dependency on itself). Before, every build had it: `KEEL_CRASH_AT=1`
//! in the environment of a shipped `keel` killed it after its first commit.
//!
//! What this proves, honestly: the `keel` binary this test runs is the one Cargo built in the
//! same invocation as this test, against the same keel-runtime (one feature set per package
//! per build). `cargo test -p keel` and `cargo build [--release]` (no dev-dependencies of
//! keel-runtime) build it without the feature: then the variable must be ignored. A
//! workspace-wide test build (`cargo test --workspace`) also builds keel-runtime's tests,
//! whose dev-dependency unifies the feature into that build's keel binary: then the test
//! checks the opposite (the hook is there and fires), so it still tells the two apart and
//! never passes vacuously.

use crate::common::Env;

#[test]
fn a_keel_built_without_the_crash_injection_feature_ignores_keel_crash_at() {
    let env = Env::new();
    env.write("script.jsonl", "{\"text\":\"done\"}\n");
    let log = env.path("crash.log");
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "do the task"])
        .env("KEEL_CRASH_AT", "1")
        .env("KEEL_CRASH_LOG", &log)
        .output()
        .unwrap();
    if keel_runtime::CRASH_INJECTION {
        eprintln!("this build unified keel-runtime's crash-injection feature into keel");
        assert_eq!(
            out.status.code(),
            None,
            "killed by the hook after its first commit"
        );
        assert!(log.exists());
    } else {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!log.exists(), "no crash log is written either");
    }
}
