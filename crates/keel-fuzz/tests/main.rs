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
    api_body_schema,
}

/// Each target has a replay test above and a cargo-fuzz target in `fuzz/fuzz_targets/`.
#[test]
fn every_target_is_replayed_and_fuzzed() {
    assert_eq!(
        keel_fuzz::TARGETS.len(),
        9,
        "add the new target to replay_tests!"
    );
    for (name, _) in keel_fuzz::TARGETS {
        let file = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        assert!(file.is_file(), "no cargo-fuzz target {}", file.display());
    }
}

/// `api_body_schema` runs the server's schema check, not serde alone: bodies serde would take
/// but the document refuses (a struct as a JSON array, an unknown field) are 422 naming the
/// field, a body of the right shape passes, and the sign-in body's key is trimmed or refused.
#[test]
fn api_body_schema_holds_bodies_to_the_documents_schemas() {
    use keel_api::{CreateSessionRequest, SubmitTurnRequest};
    use keel_server::http::BodySchemas;
    let doc = keel_server::api::document().unwrap();
    let schemas = BodySchemas::default();
    let ok: SubmitTurnRequest = schemas
        .decode(&doc, br#"{"input": "fix the tests", "priority": 3}"#)
        .unwrap();
    assert_eq!(ok.input, "fix the tests");
    let e = schemas
        .decode::<SubmitTurnRequest>(&doc, br#"{"input": "x", "nope": 1}"#)
        .unwrap_err();
    assert_eq!(
        (e.status.as_u16(), e.problem.field.as_deref()),
        (422, Some("nope"))
    );
    // Fuzz finding (2026-12-05): a field given twice was read as its last value.
    let e = schemas
        .decode::<keel_api::DecideApprovalRequest>(
            &doc,
            br#"{"decision": "deny", "args_hash": "sha256:00", "decision": "allow_once"}"#,
        )
        .unwrap_err();
    assert_eq!(e.status.as_u16(), 422, "{}", e.problem.detail);
    let e = schemas
        .decode::<CreateSessionRequest>(&doc, b"[]")
        .unwrap_err();
    assert_eq!(e.status.as_u16(), 422, "{}", e.problem.detail);
    let e = schemas
        .decode::<SubmitTurnRequest>(&doc, b"{\"input\"")
        .unwrap_err();
    assert_eq!(e.status.as_u16(), 400);

    use keel_server::inspector::sign_in_key;
    assert_eq!(sign_in_key(br#"{"key": " keel_x \t"}"#).unwrap(), "keel_x");
    let e = sign_in_key(br#"{"key": "   "}"#).unwrap_err();
    assert_eq!(
        (e.status.as_u16(), e.problem.field.as_deref()),
        (422, Some("key"))
    );
    assert_eq!(sign_in_key(b"not json").unwrap_err().status.as_u16(), 400);
    assert_eq!(
        sign_in_key(br#"{"key": "k", "other": 1}"#)
            .unwrap_err()
            .status
            .as_u16(),
        422
    );
    // Every input of its corpus passes through the target (replayed above) and each kind is
    // seeded: the eleven request types and sign-in.
    let picks: std::collections::BTreeSet<u8> = inputs("corpus", "api_body_schema")
        .iter()
        .filter_map(|f| std::fs::read(f).unwrap().first().map(|p| p % 12))
        .collect();
    assert_eq!(picks.len(), 12, "seeds cover every body kind: {picks:?}");
}
