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

/// `keel approve` with no process running the session: `keel sessions show` no longer lists
/// the approval, and says the session needs only a `keel resume` (it said `requires_action`
/// with nothing to act on; found by the README-only pass).
#[test]
fn a_session_decided_while_nothing_ran_says_resume_continues_it() {
    let env = Env::new();
    let (session, approval) = pending(&env);
    let shown = stdout(&env.run(&["sessions", "show", &session]));
    assert!(shown.contains("pending approvals"), "{shown}");
    assert!(!shown.contains("every decision"), "{shown}");
    assert!(env.run(&["approve", &approval]).status.success());
    let shown = stdout(&env.run(&["sessions", "show", &session]));
    assert!(!shown.contains("pending approvals"), "{shown}");
    assert!(
        shown.contains(&format!(
            "requires_action (every decision it waited on is made; keel resume {session} continues)"
        )),
        "{shown}"
    );
}

/// A decided row whose arguments' hash is not the journal's (a store changed under keel) is
/// not journaled as the call's decision when the turn is cancelled: the approval expires, as
/// the planner would deny it (found by the attack pass: `--for-session` then granted a
/// session rule for the journal's arguments).
#[test]
fn a_decision_for_other_arguments_is_not_journaled_at_the_cancel() {
    let env = Env::new();
    let (session, approval) = pending(&env);
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE approvals SET args_hash='sha256:00' WHERE approval_id=?\", (sys.argv[2],)); c.commit()")
        .arg(env.path("data/keel/keel.db"))
        .arg(&approval)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    assert!(
        env.run(&["approve", &approval, "--for-session"])
            .status
            .success()
    );
    assert!(env.run(&["cancel", &session]).status.success());
    let events = stdout(&env.run(&["sessions", "events", &session]));
    assert!(!events.contains("\"approval.decided\""), "{events}");
    assert!(events.contains("\"approval.expired\""), "{events}");
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

/// Several `keel resume` of one session at once after its approval was decided: one runs it,
/// the others follow it, and every one reports the turn's real end (`completed`, exit 0).
/// Before, a follower that looked while the session still said `requires_action` (decided, but
/// its runner had not yet journaled `running`) exited 3 with nothing pending.
#[test]
fn racing_resumes_all_report_the_turns_real_end() {
    for round in 0..3 {
        let env = Env::new();
        let slow = "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"x\"}}]}\n{\"delay_ms\":700,\"text\":\"done\"}\n";
        let (code, lines) = run_script(&env, slow, &[]);
        assert_eq!(code, Some(3));
        let result = lines.last().unwrap();
        let session = result["session_id"].as_str().unwrap().to_owned();
        let approval = result["pending"][0]["approval_id"].as_str().unwrap();
        assert!(env.run(&["approve", approval]).status.success());
        let racers: Vec<_> = (0..4)
            .map(|_| {
                env.keel()
                    .args(["resume", &session, "--output", "jsonl"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for r in racers {
            let out = r.wait_with_output().unwrap();
            let lines = crate::common::jsonl_lines(&out.stdout);
            let result = crate::common::check_stream(&lines);
            assert_eq!(
                (out.status.code(), result["terminal_reason"].as_str()),
                (Some(0), Some("completed")),
                "round {round}: {result}\n{}",
                stderr(&out)
            );
        }
        assert_eq!(
            std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
            "x"
        );
    }
}

/// A call that needs approval is a normal run: nothing on standard error. Before, every
/// approval logged `WARN … reading an approval: approval … does not exist` (the planner's facts
/// read the row before the driver had requested it), in the middle of a terminal's output.
#[test]
fn asking_for_an_approval_logs_no_warning() {
    let env = Env::new();
    env.write("script.jsonl", ASK);
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "do the task"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));
}

/// A shell line keel cannot prove (a computed command name) is never run on the strength of a
/// pattern: headless and with no rule it waits on a human (exit 3); with a `shell` deny rule
/// in the user config it is denied, and the model is told why.
#[test]
fn an_unprovable_shell_line_waits_on_a_human_headless_or_is_denied_by_a_deny_rule() {
    let script = "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"a=rm; $a v\"}}]}\n{\"text\":\"done\"}\n";
    let env = Env::new();
    env.write("ws/v", "keep me");
    env.write(
        "config/keel/keel.toml",
        "[policy]\nallow = [\"shell(rm *)\", \"shell(a=rm)\"]\n",
    );
    let (code, lines) = run_script(&env, script, &[]);
    assert_eq!(code, Some(3), "{lines:?}");
    let result = lines.last().unwrap();
    assert_eq!(result["terminal_reason"], "requires_action", "{result}");
    assert_eq!(result["pending"][0]["kind"], "approval", "{result}");
    assert!(env.ws().join("v").exists());

    let env = Env::new();
    env.write("ws/v", "keep me");
    env.write(
        "config/keel/keel.toml",
        "[policy]\ndeny = [\"shell(rm *)\"]\n",
    );
    let (code, lines) = run_script(&env, script, &["--permission-mode", "bypass"]);
    assert_eq!(code, Some(0), "{lines:?}");
    let finished = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished")
        .unwrap();
    assert_eq!(finished["payload"]["status"], "rejected", "{finished}");
    let output = finished["payload"]["output"].as_str().unwrap();
    assert!(
        output.contains("`$a` is computed") && output.contains("deny shell(rm *)"),
        "{output}"
    );
    assert!(env.ws().join("v").exists());
}
