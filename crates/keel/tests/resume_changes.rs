//! `keel resume` with settings flags: they change the session's config (journaled as
//! `session.config_changed`) for this and every later turn.

use serde_json::Value;

use crate::common::{Env, check_stream, jsonl_lines, run_script, stderr, stdout};

/// `keel run` headless with the scripted model's `script` and extra flags; returns the session.
fn start(env: &Env, script: &str, flags: &[&str]) -> (Option<i32>, String) {
    let (code, lines) = run_script(env, script, flags);
    let result = check_stream(&lines);
    (code, result["session_id"].as_str().unwrap().to_owned())
}

fn resume(env: &Env, session: &str, args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let out = env
        .keel()
        .args(["resume", session, "--output", "jsonl"])
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), jsonl_lines(&out.stdout), stderr(&out))
}

fn show_json(env: &Env, session: &str) -> Value {
    serde_json::from_str(&stdout(&env.run(&["sessions", "show", session, "--json"]))).unwrap()
}

const WRITE_TWICE: &str = r#"{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"first"}}]}
{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"second"}}]}
{"text":"wrote it"}
"#;

#[test]
fn resume_with_permission_mode_bypass_lets_a_call_that_needed_approval_run() {
    let env = Env::new();
    let (code, session) = start(&env, WRITE_TWICE, &[]);
    assert_eq!(code, Some(3), "the write waits on an approval");
    let out = env.run(&["cancel", &session]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, lines, err) = resume(
        &env,
        &session,
        &["write it again", "--permission-mode", "bypass"],
    );
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{result} {err}");
    assert_eq!(code, Some(0));
    assert!(
        !lines.iter().any(|l| l["type"] == "approval.requested"),
        "no approval asked under bypass"
    );
    assert!(
        lines.iter().any(|l| l["type"] == "session.config_changed"
            && l["payload"]["changes"]["permission_mode"] == "bypass"),
        "the change is journaled"
    );
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "second"
    );
    assert!(!err.contains("pinned"), "no notice any more: {err}");
    // The change holds for later turns: a bare resume with a prompt still runs without asking.
    assert_eq!(
        show_json(&env, &session)["config"]["permission_mode"],
        "bypass"
    );
}

#[test]
fn resume_with_max_steps_1_ends_with_budget_exhausted_and_show_reflects_the_settings() {
    let env = Env::new();
    let script = "{\"text\":\"first\"}\n{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"text\":\"done\"}\n";
    let (code, session) = start(&env, script, &["--max-steps", "5"]);
    assert_eq!(code, Some(0));
    let (code, lines, err) = resume(
        &env,
        &session,
        &[
            "list twice",
            "--max-steps",
            "1",
            "--max-cost-usd",
            "2.5",
            "--timeout",
            "10m",
            "--sandbox",
            "read-only",
        ],
    );
    let result = check_stream(&lines);
    assert_eq!(
        result["terminal_reason"], "budget_exhausted",
        "{result} {err}"
    );
    assert_eq!(result["limit"], "steps");
    assert_eq!(code, Some(5));
    let show = show_json(&env, &session);
    let config = &show["config"];
    assert_eq!(config["turn_budget"]["max_steps"], 1);
    assert_eq!(config["turn_budget"]["max_cost_usd"], 2.5);
    assert_eq!(config["turn_budget"]["max_wall_time_ms"], 600_000);
    assert_eq!(config["sandbox"], "read_only");
    let text = stdout(&env.run(&["sessions", "show", &session]));
    assert!(
        text.contains("max_steps 1") && text.contains("timeout 10m"),
        "{text}"
    );
    assert!(text.contains("sandbox read_only"), "{text}");
}

#[test]
fn an_invalid_setting_on_resume_is_refused_and_changes_nothing() {
    let env = Env::new();
    let (code, session) = start(&env, "{\"text\":\"first\"}\n", &[]);
    assert_eq!(code, Some(0));
    let before = show_json(&env, &session);
    // A usage error (exit 2), refused before the store is touched.
    let (code, _, err) = resume(&env, &session, &["more", "--max-cost-usd=-1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--max-cost-usd"), "{err}");
    let after = show_json(&env, &session);
    assert_eq!(before["version"], after["version"], "nothing written");
}

/// `keel resume S --model script:other.jsonl` re-pins the session: the re-pin is printed on
/// standard error, the next step samples the new route, a later bare `keel resume S` keeps it,
/// and `keel sessions show` names the new release. Before: `--model` overrode the route for that
/// one invocation, silently, and the next resume went back to the pinned route.
#[test]
fn resume_with_model_re_pins_the_session_and_later_resumes_keep_the_new_route() {
    let env = Env::new();
    let (code, session) = start(
        &env,
        "{\"text\":\"from the first script\"}\n{\"text\":\"first script again\"}\n{\"text\":\"first script, third\"}\n",
        &[],
    );
    assert_eq!(code, Some(0));
    let old = show_json(&env, &session);
    let old_release = old["release_id"].as_str().unwrap().to_owned();
    // Position 1 was used by the first turn: the other script answers from its line 2 on.
    env.write(
        "other.jsonl",
        "{\"text\":\"never used\"}\n{\"text\":\"from the other script\"}\n{\"text\":\"other script again\"}\n",
    );
    let out = env
        .keel()
        .args(["resume", &session, "next", "--model", "script:other.jsonl"])
        .output()
        .unwrap();
    let (err, text) = (stderr(&out), stdout(&out));
    assert_eq!(out.status.code(), Some(0), "{err}\n{text}");
    let shown = show_json(&env, &session);
    let new_release = shown["release_id"].as_str().unwrap().to_owned();
    assert_ne!(new_release, old_release);
    let other = env.path("other.jsonl").display().to_string();
    assert!(
        err.contains(&format!(
            "re-pinned session {session} from release {old_release} to {new_release} (model route script:"
        )) && err.contains(&format!("-> script:{other})")),
        "{err}"
    );
    assert!(text.contains("from the other script"), "{text}");
    assert_eq!(
        shown["model_route"],
        serde_json::json!([format!("script:{other}")])
    );
    assert_eq!(shown["re_pins"][0]["from_release_id"], old_release.as_str());
    assert_eq!(shown["re_pins"][0]["to_release_id"], new_release.as_str());
    let show = stdout(&env.run(&["sessions", "show", &session]));
    assert!(
        show.contains(&format!("release    {new_release}")) && show.contains("re-pinned 1 time"),
        "{show}"
    );

    // A bare resume keeps the new route.
    let (code, lines, err) = resume(&env, &session, &["and again"]);
    let result = check_stream(&lines);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(result["final_text"], "other script again", "{result}");
    assert!(!lines.iter().any(|l| l["type"] == "session.release_pinned"));
    assert_eq!(
        show_json(&env, &session)["release_id"],
        new_release.as_str()
    );

    // In JSONL the re-pin is the event; the same route again re-pins nothing.
    env.write(
        "third.jsonl",
        "{\"text\":\"x\"}\n{\"text\":\"x\"}\n{\"text\":\"x\"}\n{\"text\":\"from the third\"}\n",
    );
    let (code, lines, err) = resume(&env, &session, &["third", "--model", "script:third.jsonl"]);
    assert_eq!(code, Some(0), "{err}");
    let pin = lines
        .iter()
        .find(|l| l["type"] == "session.release_pinned")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(pin["payload"]["from_release_id"], new_release.as_str());
    assert!(
        !err.contains("re-pinned"),
        "stderr stays quiet in JSONL: {err}"
    );
    let (code, lines, _) = resume(&env, &session, &["fourth", "--model", "script:third.jsonl"]);
    assert_ne!(code, None);
    assert!(!lines.iter().any(|l| l["type"] == "session.release_pinned"));
}

/// `--model` on resume while a turn waits on an approval is refused and re-pins nothing: a
/// turn runs one release from start to end.
#[test]
fn resume_with_model_during_a_pending_approval_is_refused() {
    let env = Env::new();
    let (code, session) = start(&env, WRITE_TWICE, &[]);
    assert_eq!(code, Some(3), "the write waits on an approval");
    let before = show_json(&env, &session);
    env.write("other.jsonl", "{\"text\":\"x\"}\n");
    let (code, _, err) = resume(&env, &session, &["--model", "script:other.jsonl"]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("re-pin") && err.contains("between turns"),
        "{err}"
    );
    let after = show_json(&env, &session);
    assert_eq!(before["release_id"], after["release_id"]);
    assert_eq!(before["version"], after["version"], "nothing written");
}
