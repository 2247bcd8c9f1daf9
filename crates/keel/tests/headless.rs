//! `keel run --output jsonl` and `keel resume`: the stream always ends with one `result` line,
//! each terminal reason has its own exit code, and sessions survive Ctrl-C and `kill -9`.

use serde_json::Value;

use crate::common::{
    Env, Running, check_stream, jsonl_lines, parse_lines, run_script, stderr, stdout,
};

const ASK_WRITE: &str = r#"{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"hello"}}]}
{"text":"wrote it"}
"#;

#[test]
fn each_terminal_reason_has_its_exit_code_and_one_result_line() {
    let env = Env::new();
    let cases: &[(&str, &str, &[&str], i32)] = &[
        ("completed", "{\"text\":\"done\"}\n", &[], 0),
        (
            "failed",
            "{\"error\":{\"kind\":\"invalid_request\"}}\n",
            &[],
            1,
        ),
        ("requires_action", ASK_WRITE, &[], 3),
        (
            "budget_exhausted",
            "{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"text\":\"done\"}\n",
            &["--max-steps", "1"],
            5,
        ),
        (
            "loop_detected",
            &"{\"tool_calls\":[{\"name\":\"read_file\",\"arguments\":{\"path\":\"missing.txt\"}}]}\n".repeat(4),
            &[],
            6,
        ),
        (
            "prompt_too_long",
            &"{\"error\":{\"kind\":\"context_overflow\"}}\n".repeat(4),
            &[],
            7,
        ),
    ];
    for (reason, script, flags, code) in cases {
        let (exit, lines) = run_script(&env, script, flags);
        let result = check_stream(&lines);
        assert_eq!(result["terminal_reason"], *reason, "{result}");
        assert_eq!(exit, Some(*code), "{reason}: {result}");
        assert_eq!(result["session_id"], lines[0]["session_id"]);
        assert_eq!(lines[0]["type"], "session.created");
        if *reason == "budget_exhausted" {
            assert_eq!(result["limit"], "steps");
        }
        if *reason == "requires_action" {
            assert_eq!(result["pending"][0]["kind"], "approval");
            assert_eq!(result["pending"][0]["tool_name"], "write_file");
        }
    }
}

#[test]
fn tool_results_appear_as_the_model_sees_them() {
    let env = Env::new();
    env.write("ws/big.txt", &"0123456789\n".repeat(20_000));
    let (exit, lines) = run_script(
        &env,
        "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"cat big.txt\"}}]}\n{\"text\":\"ok\"}\n",
        &["--permission-mode", "bypass", "--sandbox", "off"],
    );
    assert_eq!(exit, Some(0));
    check_stream(&lines);
    let finished: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .collect();
    assert_eq!(finished.len(), 1);
    let output = finished[0]["payload"]["output"].as_str().unwrap();
    assert!(
        output.len() < 220_000 / 2,
        "the stream carries the truncated result, {} bytes",
        output.len()
    );
    assert!(output.contains("0123456789"));
}

/// Runs [`ASK_WRITE`] until it waits on its approval, decides it with `keel DECISION…` from
/// another process, resumes, and returns the resumed stream.
fn decide_then_resume(env: &Env, decision: &[&str]) -> Vec<Value> {
    let (exit, lines) = run_script(env, ASK_WRITE, &[]);
    assert_eq!(exit, Some(3));
    let result = check_stream(&lines);
    let session = result["session_id"].as_str().unwrap().to_owned();
    let approval = result["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let show = env.run(&["sessions", "show", &session]);
    assert!(
        crate::common::stdout(&show).contains(&approval),
        "show lists the pending approval"
    );
    let out = env.run(&[&[decision[0], approval.as_str()], &decision[1..]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    // Deciding again differently is refused, on one line.
    let other = if decision[0] == "approve" {
        "deny"
    } else {
        "approve"
    };
    let out = env.run(&[other, &approval]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let lines = jsonl_lines(&out.stdout);
    assert_eq!(check_stream(&lines)["terminal_reason"], "completed");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        lines.iter().all(|l| l["type"] != "session.created"),
        "resume prints only new events"
    );
    lines
}

#[test]
fn approve_from_another_process_then_resume_runs_the_call() {
    let env = Env::new();
    decide_then_resume(&env, &["approve"]);
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "hello"
    );
}

#[test]
fn deny_from_another_process_then_resume_gives_the_model_the_reason() {
    let env = Env::new();
    let lines = decide_then_resume(&env, &["deny", "--reason", "not in this repo"]);
    let rejected = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished")
        .unwrap();
    assert_eq!(rejected["payload"]["status"], "rejected");
    assert!(
        rejected["payload"]["output"]
            .as_str()
            .unwrap()
            .contains("not in this repo")
    );
    assert!(!env.ws().join("a.txt").exists());
}

fn slow_shell_script(secs: u32) -> String {
    format!(
        "{{\"tool_calls\":[{{\"name\":\"shell\",\"arguments\":{{\"command\":\"sleep {secs}\"}}}}]}}\n{{\"text\":\"done\"}}\n"
    )
}

fn start_run(env: &Env, script: &str, flags: &[&str]) -> Running {
    env.write("script.jsonl", script);
    let mut cmd = env.keel();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args([
            "--output",
            "jsonl",
            "--permission-mode",
            "bypass",
            "--sandbox",
            "off",
        ])
        .args(flags)
        .arg("do the task");
    Running::start(cmd)
}

fn session_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}

#[test]
fn ctrl_c_aborts_the_turn_and_a_bare_resume_completes() {
    let env = Env::new();
    let mut run = start_run(&env, &slow_shell_script(30), &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("tool_call.started", 30);
    run.signal("INT");
    let (code, lines) = run.finish(30);
    let result = check_stream(&parse_lines(&lines));
    assert_eq!(result["terminal_reason"], "aborted", "{result}");
    assert_eq!(code, Some(4));
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(result["final_text"], "done");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn cancel_from_another_process_aborts_the_running_turn() {
    let env = Env::new();
    let mut run = start_run(&env, &slow_shell_script(30), &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("tool_call.started", 30);
    let out = env.run(&["cancel", &session]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, lines) = run.finish(30);
    let lines = parse_lines(&lines);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "aborted", "{result}");
    assert_eq!(code, Some(4));
    assert!(lines.iter().any(|l| l["type"] == "turn.cancel_requested"));
    let finished = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished")
        .expect("the cancelled call got its one result");
    assert_eq!(finished["payload"]["status"], "cancelled");
}

#[test]
fn kill_9_mid_turn_then_a_bare_resume_completes() {
    let env = Env::new();
    // The model is slow to answer; the process dies while the step streams.
    let script = "{\"delay_ms\":1500,\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"text\":\"done\"}\n";
    let mut run = start_run(&env, script, &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("step.started", 30);
    run.signal("KILL");
    let (code, _) = run.finish(30);
    assert_eq!(code, None, "killed by a signal");
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(result["final_text"], "done");
}

/// After `kill -9` no process runs the session, so a resume with settings flags applies them
/// (journaled) and continues the turn. Before, it was refused: "turn … is running".
#[test]
fn kill_9_mid_turn_then_a_resume_with_settings_flags_applies_them() {
    let env = Env::new();
    let script = "{\"delay_ms\":1500,\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n{\"text\":\"done\"}\n";
    let mut run = start_run(&env, script, &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("step.started", 30);
    run.signal("KILL");
    let (code, _) = run.finish(30);
    assert_eq!(code, None, "killed by a signal");
    let out = env.run(&["resume", &session, "--max-steps", "5", "--output", "jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    let changed = lines
        .iter()
        .find(|l| l["type"] == "session.config_changed")
        .expect("the change is journaled");
    assert_eq!(
        changed["payload"]["changes"]["turn_budget"]["max_steps"], 5,
        "{changed}"
    );
}

#[test]
fn kill_9_during_a_side_effect_is_resolved_from_another_process() {
    let env = Env::new();
    let mut run = start_run(&env, &slow_shell_script(30), &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("effect.dispatched", 30);
    run.signal("KILL");
    run.finish(30);
    // The shell command may or may not have run: a human must say.
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "requires_action", "{result}");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(result["pending"][0]["kind"], "effect");
    let key = result["pending"][0]["operation_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&["resolve", &key, "--as", "committed"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The same decision again succeeds quietly (idempotent, like a second approve).
    let out = env.run(&["resolve", &key, "--as", "committed"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(crate::common::stdout(&out).contains("already"));
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert!(lines.iter().any(|l| l["type"] == "effect.committed"));
    // Resolving twice is refused.
    let out = env.run(&["resolve", &key, "--as", "failed"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn events_follow_from_another_process_sees_the_whole_turn() {
    let env = Env::new();
    let mut run = start_run(&env, &slow_shell_script(1), &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    let mut follow = {
        let mut cmd = env.keel();
        cmd.args(["sessions", "events", &session, "--follow"]);
        Running::start(cmd)
    };
    follow.wait_for("tool_call.started", 30);
    follow.wait_for("turn.finished", 30);
    follow.wait_for("\"idle\"", 30);
    let (code, run_lines) = run.finish(30);
    assert_eq!(code, Some(0));
    // The follower printed the same durable events as the run, in order.
    let run_events: Vec<String> = run_lines
        .iter()
        .filter(|l| !l.contains("\"type\":\"result\""))
        .cloned()
        .collect();
    assert_eq!(
        follow.seen.len(),
        run_events.len(),
        "follower:\n{}\nrun:\n{}",
        follow.seen.join("\n"),
        run_events.join("\n")
    );
    assert_eq!(follow.seen, run_events);
    follow.signal("INT");
}

#[test]
fn resume_with_a_prompt_continues_the_same_session() {
    let env = Env::new();
    let (exit, lines) = run_script(&env, "{\"text\":\"first\"}\n{\"text\":\"second\"}\n", &[]);
    assert_eq!(exit, Some(0));
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&["resume", &session, "and now this", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "second", "the next script line");
    assert_eq!(result["session_id"], session.as_str());
    let list = crate::common::stdout(&env.run(&["sessions", "list", "--json"]));
    let sessions: Vec<Value> = list
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["turns"], 2);
}

#[test]
fn resume_restores_the_pinned_workspace_permission_mode_and_model() {
    let env = Env::new();
    let script = "{\"text\":\"first\"}\n{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"b.txt\",\"content\":\"pinned\"}}]}\n{\"text\":\"wrote\"}\n";
    let (exit, lines) = run_script(&env, script, &["--permission-mode", "bypass"]);
    assert_eq!(exit, Some(0));
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // From another directory, with no flags: same workspace, same model, still bypass (a write
    // would ask under the default mode).
    std::fs::create_dir_all(env.path("elsewhere")).unwrap();
    let out = env
        .keel()
        .current_dir(env.path("elsewhere"))
        .args(["resume", &session, "write b.txt", "--output", "jsonl"])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("b.txt")).unwrap(),
        "pinned"
    );
}

#[test]
fn timeout_and_cost_flags_are_budgets() {
    let env = Env::new();
    let (exit, lines) = run_script(
        &env,
        &slow_shell_script(2),
        &[
            "--permission-mode",
            "bypass",
            "--sandbox",
            "off",
            "--timeout",
            "1s",
        ],
    );
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "budget_exhausted", "{result}");
    assert_eq!(result["limit"], "wall_time");
    assert_eq!(exit, Some(5));
    let session = result["session_id"].as_str().unwrap();
    let show = crate::common::stdout(&env.run(&["sessions", "show", session, "--json"]));
    let show: Value = serde_json::from_str(&show).unwrap();
    assert_eq!(show["config"]["turn_budget"]["max_wall_time_ms"], 1000);
    let (_, lines) = run_script(&env, "{\"text\":\"ok\"}\n", &["--max-cost-usd", "0.5"]);
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let show = crate::common::stdout(&env.run(&["sessions", "show", &session, "--json"]));
    let show: Value = serde_json::from_str(&show).unwrap();
    assert_eq!(show["config"]["turn_budget"]["max_cost_usd"], 0.5);
}

#[test]
fn a_second_interrupt_still_ends_the_stream_with_its_result() {
    let env = Env::new();
    // The model never answers in time: the first SIGTERM cancels, the second exits at once.
    let mut run = start_run(&env, "{\"delay_ms\":60000,\"text\":\"late\"}\n", &[]);
    run.wait_for("step.started", 30);
    run.signal("TERM");
    std::thread::sleep(std::time::Duration::from_millis(200));
    run.signal("INT");
    let (code, lines) = run.finish(20);
    let result = check_stream(&parse_lines(&lines));
    assert_eq!(result["terminal_reason"], "aborted", "{result}");
    assert_eq!(code, Some(4));
}

#[test]
fn resume_with_a_prompt_while_another_process_runs_the_session_follows_it() {
    let env = Env::new();
    let script = "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"sleep 2\"}}]}\n{\"text\":\"first done\"}\n{\"text\":\"second done\"}\n";
    let mut run = start_run(&env, script, &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("tool_call.started", 30);
    // A second terminal adds a turn: the running process takes it as a durable input, and
    // this one follows the session until that turn ends.
    let out = env.run(&["resume", &session, "and then this", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(
        result["terminal_reason"],
        "completed",
        "{result} {}",
        stderr(&out)
    );
    assert_eq!(result["final_text"], "second done");
    assert_eq!(out.status.code(), Some(0));
    let (code, lines) = run.finish(30);
    assert_eq!(code, Some(0));
    assert_eq!(
        check_stream(&parse_lines(&lines))["final_text"],
        "first done"
    );
}

/// A bare `keel resume` (no prompt, text output) of a session another process runs says it
/// follows that process, once, and ends with the turn like it.
#[test]
fn a_bare_resume_of_a_session_another_process_runs_says_it_follows_it() {
    let env = Env::new();
    let script = "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"sleep 2\"}}]}\n{\"text\":\"first done\"}\n";
    let mut run = start_run(&env, script, &[]);
    let session = session_of(&run.wait_for("session.created", 30));
    run.wait_for("tool_call.started", 30);
    let out = env.run(&["resume", &session, "--output", "text"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    let note = format!("session {session} is running in another keel process");
    assert_eq!(all.matches(&note).count(), 1, "{all}");
    assert!(all.contains("first done"), "{all}");
    assert_eq!(out.status.code(), Some(0), "{all}");
    let (code, _) = run.finish(30);
    assert_eq!(code, Some(0));
}

/// A dead primary (`openai:gpt-4o-mini` at a closed port) and a scripted fallback: the step
/// events name the fallback, and the result line breaks the turn's usage down by it, at its
/// price (the scripted model has none: $0). Before, every `step.*` event named the route
/// (`gpt-4o-mini -> scripted:script.jsonl`), whose label the price table matched as `gpt-4o`,
/// so the fallback's tokens cost the primary family's price, and the result line had no
/// breakdown.
#[test]
fn a_dead_primary_s_fallback_is_named_and_priced_in_the_stream_and_the_result_line() {
    let env = Env::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.write(
        "ws/keel.toml",
        "model = \"openai:gpt-4o-mini\"\nfallback_models = [\"script:script.jsonl\"]\n",
    );
    env.write(
        "config/keel/keel.toml",
        &format!("base_url = \"http://127.0.0.1:{port}/v1\"\n"),
    );
    env.write(
        "ws/script.jsonl",
        "{\"text\":\"done\",\"usage\":{\"input_tokens\":100000,\"output_tokens\":10000}}\n",
    );
    // A scripted fallback in keel.toml: only a trusted workspace names one.
    assert!(env.run(&["trust", "ws"]).status.success());
    let out = env
        .keel()
        .env("OPENAI_API_KEY", "k")
        .args(["run", "--workspace", "ws", "--output", "jsonl", "hi"])
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&out));
    let models: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["type"].as_str().is_some_and(|t| t.starts_with("step.")))
        .filter_map(|l| Some((l["type"].as_str()?, l["payload"]["model"].as_str()?)))
        .collect();
    let fallback = format!("scripted:{}", env.ws().join("script.jsonl").display());
    let fallback = fallback.as_str();
    assert_eq!(
        models.first(),
        Some(&("step.started", "gpt-4o-mini")),
        "{models:?}"
    );
    assert_eq!(
        models.last(),
        Some(&("step.completed", fallback)),
        "{models:?}"
    );
    assert!(
        models.iter().all(|(_, m)| !m.contains("->")),
        "never the route's label: {models:?}"
    );
    assert_eq!(result["cost_usd"], 0.0, "{result}");
    let by = result["usage_by_model"].as_object().unwrap();
    assert_eq!(by.keys().collect::<Vec<_>>(), [fallback], "{result}");
    assert_eq!(by[fallback]["usage"]["input_tokens"], 100000);
    assert_eq!(by[fallback]["steps"], 1);
    let finished = lines.iter().find(|l| l["type"] == "turn.finished").unwrap();
    assert_eq!(
        finished["payload"]["usage_by_model"],
        result["usage_by_model"]
    );
}

/// Calls of one response keep the model's order where one could see another's effect: a read
/// proposed after a write reads what it wrote, and a write proposed after a read does not change
/// what that read returns. (The attack pass of 2026-12-07 found a `read_file` after a
/// `write_file` of the same response answering "does not exist": read-only calls ran as a
/// batch ahead of the write.)
#[test]
fn calls_of_one_response_see_each_others_effects_in_the_models_order() {
    let env = Env::new();
    env.write("ws/old.txt", "before");
    let call = |name: &str, args: &str| format!(r#"{{"name":"{name}","arguments":{args}}}"#);
    let calls = [
        call("read_file", r#"{"path":"old.txt"}"#),
        call("write_file", r#"{"path":"old.txt","content":"after"}"#),
        call("read_file", r#"{"path":"old.txt"}"#),
        call("write_file", r#"{"path":"new.txt","content":"fresh"}"#),
        call("read_file", r#"{"path":"new.txt"}"#),
        call("list_dir", r#"{"path":"."}"#),
    ];
    let script = format!(
        "{{\"tool_calls\":[{}]}}\n{{\"text\":\"done\"}}\n",
        calls.join(",")
    );
    let (exit, lines) = run_script(&env, &script, &["--permission-mode", "bypass"]);
    check_stream(&lines);
    assert_eq!(exit, Some(0));
    let started: Vec<&str> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.started")
        .filter_map(|l| l["tool_call_id"].as_str())
        .collect();
    let output = |i: usize| -> String {
        let id = lines
            .iter()
            .filter(|l| l["type"] == "tool_call.proposed")
            .filter_map(|l| l["tool_call_id"].as_str())
            .nth(i)
            .unwrap();
        lines
            .iter()
            .find(|l| l["type"] == "tool_call.finished" && l["tool_call_id"] == id)
            .map(|l| l["payload"]["output"].to_string())
            .unwrap()
    };
    assert!(output(0).contains("before"), "{}", output(0));
    assert!(output(2).contains("after"), "{}", output(2));
    assert!(output(4).contains("fresh"), "{}", output(4));
    assert!(output(5).contains("new.txt"), "{}", output(5));
    assert_eq!(started.len(), 6, "{started:?}");
}

/// The same id, name and arguments twice in one response are two calls (a re-sampled attempt
/// proposing a call again is one): the second gets its own id and runs in the model's order.
#[test]
fn a_call_repeated_in_one_response_runs_again_in_its_place() {
    let env = Env::new();
    let script = r#"{"tool_calls":[{"id":"X","name":"write_file","arguments":{"path":"a.txt","content":"one"}},{"id":"Y","name":"write_file","arguments":{"path":"a.txt","content":"two"}},{"id":"X","name":"write_file","arguments":{"path":"a.txt","content":"one"}},{"id":"R","name":"read_file","arguments":{"path":"a.txt"}}]}
{"text":"done"}
"#;
    let (exit, lines) = run_script(&env, script, &["--permission-mode", "bypass"]);
    check_stream(&lines);
    assert_eq!(exit, Some(0));
    let proposed: Vec<&str> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.proposed")
        .filter_map(|l| l["tool_call_id"].as_str())
        .collect();
    assert_eq!(proposed.len(), 4, "{proposed:?}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "one"
    );
    let read = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished" && l["tool_call_id"] == "R")
        .unwrap();
    assert!(
        read["payload"]["output"].as_str().unwrap().contains("one"),
        "{read}"
    );
}

/// A call allowed while it waits behind an earlier one that still waits on a human is not
/// listed as pending: only the undecided approval is.
#[test]
fn an_approval_decided_behind_an_undecided_one_is_not_pending() {
    let env = Env::new();
    let script = r#"{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"one"}},{"name":"write_file","arguments":{"path":"b.txt","content":"two"}}]}
{"text":"done"}
"#;
    let (exit, lines) = run_script(&env, script, &[]);
    assert_eq!(exit, Some(3));
    let result = check_stream(&lines);
    let pending = result["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 2, "{result}");
    let session = result["session_id"].as_str().unwrap().to_owned();
    let second = pending[1]["approval_id"].as_str().unwrap().to_owned();
    let out = env.run(&["approve", &second]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    assert_eq!(out.status.code(), Some(3));
    let result = check_stream(&jsonl_lines(&out.stdout));
    let pending = result["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{result}");
    assert_eq!(pending[0]["approval_id"], lines_first_approval(&lines));
}

fn lines_first_approval(lines: &[Value]) -> Value {
    check_stream(lines)["pending"][0]["approval_id"].clone()
}
