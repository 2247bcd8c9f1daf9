//! Repeated decisions succeed quietly; a decision on an approval whose turn ended says so.

use crate::common::{Env, run_script, stderr, stdout};

const ASK: &str = "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"x\"}}]}\n{\"text\":\"done\"}\n";

fn pending(env: &Env) -> (String, String) {
    let (code, lines) = run_script(env, ASK, &[]);
    assert_eq!(code, Some(3));
    let result = lines.last().unwrap();
    (
        result["session_id"].as_str().unwrap().to_owned(),
        result["pending"][0]["approval_id"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

#[test]
fn a_second_deny_succeeds_like_a_second_approve() {
    let env = Env::new();
    let (_, approval) = pending(&env);
    let out = env.run(&["deny", &approval, "--reason", "no"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for reason in ["no", "still no"] {
        let out = env.run(&["deny", &approval, "--reason", reason]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).contains("already"), "{}", stdout(&out));
    }
    // A contrary decision is still refused.
    let out = env.run(&["approve", &approval]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn approving_after_the_turn_was_cancelled_says_it_is_no_longer_pending() {
    let env = Env::new();
    let (session, approval) = pending(&env);
    let out = env.run(&["cancel", &session]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["approve", &approval]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("no longer pending"), "{err}");
    assert!(!stdout(&out).contains("allowed"), "{}", stdout(&out));
}
