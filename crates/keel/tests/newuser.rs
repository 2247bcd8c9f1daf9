//! The new-user report (notes/newuser-report.md): each test runs the binary the way the report
//! did and proves the behaviour the README promises now. Items 4 and 5 (the terminal) are in
//! `interactive.rs`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Env, Running, check_stream, jsonl_lines, run_script, stderr, stdout};
use crate::sse::{ChatServer, Part, Reply, chunk, text_reply, usage_and_done};

fn show_json(env: &Env, session: &str) -> Value {
    serde_json::from_str(&stdout(&env.run(&["sessions", "show", session, "--json"]))).unwrap()
}

/// The session id at the end of a text result line (`… · session ID`).
fn session_in_text(text: &str) -> String {
    let i = text.rfind("session ").unwrap() + "session ".len();
    text[i..i + 36].to_owned()
}

/// Item 6. A read-only call the model proposes mid-stream runs at once, so the journal can
/// hold its `tool_call.finished` before its step's `step.completed` (whose text the model wrote
/// first). Piped text output printed the call's `✓` line first. Here the server pauses after
/// the call, so that order is certain, not a race.
#[test]
fn piped_text_prints_a_step_s_text_before_its_calls_that_finished_first() {
    let env = Env::new();
    let mut first = vec![
        chunk(
            json!({"role": "assistant", "content": "Listing the files."}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "list_dir", "arguments": "{\"path\":\".\"}"}}]}),
            None,
        ),
        // The call is complete at `finish_reason`; the stream ends later.
        chunk(json!({}), Some("tool_calls")),
        Part::Pause(Duration::from_millis(1500)),
    ];
    first.extend(usage_and_done(10, 5));
    let server = ChatServer::start(vec![Reply::Stream(first), text_reply("All done.", 10, 5)]);
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        &server.base_url(),
        "list the files",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text} {}", stderr(&out));
    // The journal really has the call finished before the step completed…
    let session = session_in_text(&text);
    let events = jsonl_lines(&env.run(&["sessions", "events", &session]).stdout);
    let seq_of = |t: &str| {
        events
            .iter()
            .find(|e| e["type"] == t)
            .map(|e| e["seq"].as_u64().unwrap())
            .unwrap()
    };
    assert!(
        seq_of("tool_call.finished") < seq_of("step.completed"),
        "the scenario: {events:#?}"
    );
    // …and the text still reads in the order things happened.
    let said = text.find("Listing the files.").expect(&text);
    let ran = text.find("✓ list_dir").expect(&text);
    assert!(said < ran, "the step's text comes first:\n{text}");
    assert!(text.find("All done.").unwrap() > ran, "{text}");
}

/// Item 7. `sessions list` shows the newest first and says how many it left out (runs 101 and
/// 102 of 102 were missing, with no hint; here with --limit 3 of 5).
#[test]
fn sessions_list_shows_the_newest_first_and_says_how_many_it_left_out() {
    let env = Env::new();
    env.write("script.jsonl", "{\"text\":\"ok\"}\n");
    let mut ids = Vec::new();
    for i in 1..=5 {
        let out = env.run(&[
            "run",
            "--workspace",
            "ws",
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            &format!("run {i}"),
        ]);
        let result = check_stream(&jsonl_lines(&out.stdout));
        ids.push(result["session_id"].as_str().unwrap().to_owned());
    }
    let out = env.run(&["sessions", "list", "--limit", "3", "--json"]);
    let listed: Vec<String> = jsonl_lines(&out.stdout)
        .iter()
        .map(|l| l["session_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        listed,
        [ids[4].clone(), ids[3].clone(), ids[2].clone()],
        "the newest three, newest first"
    );
    let err = stderr(&out);
    assert!(
        err.contains("2 older sessions not shown") && err.contains("--limit 5"),
        "{err}"
    );
    let all = env.run(&["sessions", "list", "--all"]);
    let table = stdout(&all);
    assert_eq!(
        table.lines().count(),
        6,
        "a header and every session: {table}"
    );
    assert!(table.find(&ids[4]).unwrap() < table.find(&ids[0]).unwrap());
    assert!(stderr(&all).is_empty(), "{}", stderr(&all));
}

/// Item 8. `approve --for-session` says exactly what it grants: this command, nothing wider.
#[test]
fn approve_for_session_says_exactly_what_it_grants() {
    let env = Env::new();
    let script = "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"echo one\"}}]}\n{\"text\":\"done\"}\n";
    let (code, lines) = run_script(&env, script, &["--sandbox", "off"]);
    assert_eq!(code, Some(3));
    let approval = lines.last().unwrap()["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&["approve", &approval, "--for-session"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("shell(echo one)") && said.contains("any other call still asks"),
        "{said}"
    );
}

/// A chat reply with `reasoning_content` (DeepSeek, vLLM) holding a key, then the answer.
fn reasoning_reply() -> Reply {
    let mut parts = vec![
        chunk(
            json!({"role": "assistant", "reasoning_content": "The key is sk-proj-abcdefghijklmnopqrstuvwxyz0123 "}),
            None,
        ),
        chunk(json!({"reasoning_content": "so I answer."}), None),
        chunk(json!({"content": "Answer."}), Some("stop")),
    ];
    parts.extend(usage_and_done(10, 5));
    Reply::Stream(parts)
}

/// Item 9. An OpenAI-compatible Chat server's `reasoning_content` is journaled, redacted, with
/// `--keep-reasoning`, and counted without it. Before, nothing was journaled, not even a count.
#[test]
fn keep_reasoning_journals_a_chat_server_s_reasoning_content() {
    let env = Env::new();
    let server = ChatServer::start(vec![reasoning_reply()]);
    let completed = |keep: bool| {
        let mut cmd = env.keel();
        cmd.args([
            "run",
            "--workspace",
            "ws",
            "--model",
            "openai:deepseek-reasoner",
        ])
        .args(["--base-url", &server.base_url(), "--output", "jsonl"]);
        if keep {
            cmd.arg("--keep-reasoning");
        }
        let out = cmd.arg("think").output().unwrap();
        let lines = jsonl_lines(&out.stdout);
        assert_eq!(
            check_stream(&lines)["terminal_reason"],
            "completed",
            "{}",
            stderr(&out)
        );
        lines
            .into_iter()
            .find(|l| l["type"] == "step.completed")
            .unwrap()
    };
    let kept = completed(true);
    let reasoning = kept["payload"]["reasoning"].to_string();
    assert!(reasoning.contains("so I answer."), "{kept}");
    assert!(
        reasoning.contains("[REDACTED]") && !reasoning.contains("sk-proj-abc"),
        "{kept}"
    );
    let counted = completed(false);
    assert_eq!(counted["payload"]["reasoning_sealed"], 1, "{counted}");
    assert!(!counted.to_string().contains("so I answer."), "{counted}");
}

/// Item 11. `sessions show` lists every effective setting, `--tool-timeout` and
/// `--keep-reasoning` given to resume included.
#[test]
fn sessions_show_lists_every_effective_setting_after_a_resume_changes_them() {
    let env = Env::new();
    let (_, lines) = run_script(&env, "{\"text\":\"one\"}\n{\"text\":\"two\"}\n", &[]);
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&[
        "resume",
        &session,
        "again",
        "--tool-timeout",
        "5s",
        "--keep-reasoning",
        "--output",
        "jsonl",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&env.run(&["sessions", "show", &session]));
    for setting in [
        "timeouts   tool 5s",
        "stream idle 1m",
        "model first token none",
        "reasoning  kept in the journal",
        "context    the model's window",
        "limits     none per turn",
        "mode       default (sandbox workspace_write)",
    ] {
        assert!(text.contains(setting), "{setting:?} in:\n{text}");
    }
}

/// Item 12. A flag value out of its domain is a usage error (exit 2, no result line) for
/// `--store` as for `--base-url`.
#[test]
fn a_bad_store_url_is_a_usage_error_like_a_bad_base_url() {
    let env = Env::new();
    for flag in [["--store", "mysql://x"], ["--base-url", "notaurl"]] {
        let out = env.run(&[
            "run",
            "--model",
            "script:s.jsonl",
            "--output",
            "jsonl",
            flag[0],
            flag[1],
            "hi",
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "no result line: {}", stdout(&out));
    }
}

/// Item 12. No prompt (none given and nothing on standard input) and an empty prompt are
/// usage errors that create nothing; before, exit 1 and an empty session left `created`.
#[test]
fn a_missing_or_empty_prompt_is_a_usage_error_that_creates_no_session() {
    let env = Env::new();
    env.write("s.jsonl", "{\"text\":\"hi\"}\n");
    for prompt in [None, Some(""), Some("  \n")] {
        let mut cmd = env.keel();
        cmd.args(["run", "--model", "script:s.jsonl", "--output", "jsonl"]);
        cmd.args(prompt);
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{prompt:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{}", stdout(&out));
        assert!(stderr(&out).contains("no prompt"), "{}", stderr(&out));
    }
    let listed = env.run(&["sessions", "list", "--json"]);
    assert_eq!(stdout(&listed).trim(), "", "no session was created");
}

/// Item 12. Zero steps is refused, on the command line (usage, exit 2) and in keel.toml
/// (naming the file and key), instead of a turn that ends at once with exit 5.
#[test]
fn zero_max_steps_is_refused_on_the_command_line_and_in_keel_toml() {
    let env = Env::new();
    env.write("s.jsonl", "{\"text\":\"hi\"}\n");
    let out = env.run(&["run", "--model", "script:s.jsonl", "--max-steps", "0", "hi"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    env.write("config/keel/keel.toml", "[budget]\nmax_steps = 0\n");
    let out = env.run(&["run", "--model", "script:s.jsonl", "hi"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("config/keel/keel.toml") && err.contains("budget.max_steps"),
        "{err}"
    );
}

/// Item 12. `resume --base-url` for a session whose route has no OpenAI-compatible model is
/// the usage error `run` gives for the same combination (exit 2, nothing journaled).
#[test]
fn resume_base_url_is_refused_for_a_scripted_session_like_run_and_applies_to_an_openai_one() {
    let env = Env::new();
    let (_, lines) = run_script(&env, "{\"text\":\"one\"}\n{\"text\":\"two\"}\n", &[]);
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = show_json(&env, &session)["version"].clone();
    let out = env.run(&[
        "resume",
        &session,
        "again",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--output",
        "jsonl",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).contains("--base-url applies to openai:"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        show_json(&env, &session)["version"],
        before,
        "nothing journaled"
    );
    // A session on an OpenAI-compatible model takes a new server: journaled, used, shown.
    let (old, new) = (
        ChatServer::start(vec![text_reply("one", 10, 5)]),
        ChatServer::start(vec![text_reply("two", 10, 5)]),
    );
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        &old.base_url(),
        "--output",
        "jsonl",
        "hi",
    ]);
    let openai = check_stream(&jsonl_lines(&out.stdout))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&[
        "resume",
        &openai,
        "again",
        "--base-url",
        &new.base_url(),
        "--output",
        "jsonl",
    ]);
    assert_eq!(
        check_stream(&jsonl_lines(&out.stdout))["final_text"],
        "two",
        "{}",
        stderr(&out)
    );
    assert_eq!((old.requests(), new.requests()), (1, 1));
    let shown = stdout(&env.run(&["sessions", "show", &openai]));
    assert!(
        shown.contains(&format!("base url   {}", new.base_url())),
        "{shown}"
    );
    // And `run` with a keel.toml model that takes no base URL.
    env.write("ws/keel.toml", "model = \"script:../script.jsonl\"\n");
    // (A scripted model only from a trusted workspace's keel.toml.)
    assert!(env.run(&["trust", "ws"]).status.success());
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Item 12. A resume that cannot run (closed or unknown session) names the session it was
/// given in its result line; before, `"session_id": null`.
#[test]
fn a_failed_resume_names_its_session_in_the_result_line() {
    let env = Env::new();
    let (_, lines) = run_script(&env, "{\"text\":\"one\"}\n", &[]);
    let session = check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(env.run(&["sessions", "close", &session]).status.success());
    let unknown = "0192f5d4-0000-7000-8000-000000000000";
    for id in [session.as_str(), unknown] {
        let out = env.run(&["resume", id, "more", "--output", "jsonl"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let result = check_stream(&jsonl_lines(&out.stdout));
        assert_eq!(result["session_id"], id, "{result}");
        assert_eq!(result["terminal_reason"], "failed");
    }
}

/// Item 13. Limits are checked before each step, so the step that crosses the cost limit
/// finishes; when it ends the turn, the turn is `completed` and the result says it ended over
/// the limit (it did not say so).
#[test]
fn a_turn_that_ends_over_its_cost_limit_says_so() {
    let env = Env::new();
    // gpt-4o-mini: 100 input and 50 output tokens cost $0.000045, over the $0.00003 limit.
    let server = ChatServer::start(vec![text_reply("Done.", 100, 50)]);
    let base = server.base_url();
    let args = [
        "run",
        "--workspace",
        "ws",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        &base,
        "--max-cost-usd",
        "0.00003",
    ];
    let out = env
        .keel()
        .args(args)
        .args(["--output", "jsonl", "hi"])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(result["over_limits"], json!(["cost"]), "{result}");
    assert_eq!(out.status.code(), Some(0));
    let out = env.keel().args(args).arg("hi").output().unwrap();
    let text = stdout(&out);
    assert!(text.contains("over the turn's cost limit"), "{text}");
}

/// Item 14. A bare resume of a session with nothing unfinished runs nothing and says so; its
/// result line has this invocation's numbers and `continued: false`. Before, it reprinted the
/// last turn's result line with its old duration. Settings given with it are kept for the next
/// turn.
#[test]
fn a_bare_resume_with_nothing_unfinished_says_so_and_runs_nothing() {
    let env = Env::new();
    let (_, lines) = run_script(&env, "{\"text\":\"one\"}\n{\"text\":\"two\"}\n", &[]);
    let first = check_stream(&lines);
    let session = first["session_id"].as_str().unwrap().to_owned();
    let out = env.run(&["resume", &session, "--output", "jsonl", "--max-steps", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["continued"], false, "{result}");
    assert_eq!(
        result["terminal_reason"], "completed",
        "the last turn's reason"
    );
    assert_eq!(result["num_steps"], 0, "{result}");
    assert!(result.get("final_text").is_none(), "{result}");
    assert!(
        !lines.iter().any(|l| l["type"] == "turn.started"),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l["type"] == "session.config_changed"));
    let text = stdout(&env.run(&["resume", &session]));
    assert!(text.contains("nothing to continue"), "{text}");
    assert!(!text.contains("──"), "no result of an earlier turn: {text}");
    assert_eq!(
        show_json(&env, &session)["config"]["turn_budget"]["max_steps"],
        4
    );
}

/// Item 15. With `first_token = "2s"`, a server that answers 429 with `retry-after: 5` gets a
/// retry in 5 s from the route, after the step's first-token limit: it could never happen, so
/// the step fails at once and no retry is announced. Before, `! model rate_limited…, retrying in
/// 5000 ms` came, then `failed` at the 2 s limit. (The report's case, a silent server whose
/// attempt timed out at the same 2 s, is checked too: it races the step's own deadline, and
/// either way no retry is announced now.)
#[test]
fn no_retry_is_announced_that_the_first_token_limit_leaves_no_time_for() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "[timeouts]\nfirst_token = \"2s\"\n",
    );
    let run = |server: &ChatServer| {
        let out = env.run(&[
            "run",
            "--workspace",
            "ws",
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
            &server.base_url(),
            "--output",
            "jsonl",
            "hi",
        ]);
        let lines = jsonl_lines(&out.stdout);
        let result = check_stream(&lines);
        assert_eq!(result["terminal_reason"], "failed", "{result}");
        let announced: Vec<&Value> = lines
            .iter()
            .filter(|l| {
                l["type"] == "step.attempt_failed" && !l["payload"]["retry_in_ms"].is_null()
            })
            .collect();
        assert!(
            announced.is_empty(),
            "a retry that never happened: {announced:#?}"
        );
        assert_eq!(server.requests(), 1, "no second attempt");
        result["error"].as_str().unwrap().to_owned()
    };
    let limited = ChatServer::start(vec![Reply::Error(
        429,
        vec!["retry-after: 5".into()],
        r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#.into(),
    )]);
    let error = run(&limited);
    assert!(
        error.contains("no time left to retry after rate_limited"),
        "{error}"
    );
    let silent = ChatServer::start(vec![Reply::Silent]);
    let error = run(&silent);
    assert!(error.contains("time limit"), "{error}");
}

/// Item 16. An invalid fallback model is reported with the file and key, by `config show` too
/// (which printed it with exit 0).
#[test]
fn an_invalid_fallback_model_names_the_file_and_the_key() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "model = \"script:s.jsonl\"\nfallback_models = [\"foo:bar\"]\n",
    );
    for args in [&["config", "show"][..], &["run", "hi"][..]] {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("config/keel/keel.toml")
                && err.contains("fallback_models")
                && err.contains("\"foo:bar\""),
            "{args:?}: {err}"
        );
    }
}

/// Item 18. The result line says "1 step"; `sessions show` names the scripted model as the
/// route does (`script:…`, not `scripted:…`).
#[test]
fn one_step_is_singular_and_show_names_models_as_the_route_does() {
    let env = Env::new();
    env.write("s.jsonl", "{\"text\":\"hi\"}\n");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:s.jsonl",
        "hello",
    ]);
    let text = stdout(&out);
    assert!(text.contains("· 1 step ·"), "{text}");
    let session = session_in_text(&text);
    let show = stdout(&env.run(&["sessions", "show", &session]));
    assert!(!show.contains("scripted:"), "{show}");
    let script = env.path("s.jsonl").display().to_string();
    assert!(
        show.contains(&format!("model      script:{script}")),
        "{show}"
    );
    assert!(
        show.contains(&format!("  script:{script}  1 step,")),
        "{show}"
    );
}

/// Item 18. A second deny with a new reason says which reason stands (the first, which the
/// model sees).
#[test]
fn a_second_deny_with_a_new_reason_names_the_reason_that_stands() {
    let env = Env::new();
    let script = "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"x\"}}]}\n{\"text\":\"done\"}\n";
    let (_, lines) = run_script(&env, script, &[]);
    let approval = lines.last().unwrap()["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        env.run(&["deny", &approval, "--reason", "use b.txt"])
            .status
            .success()
    );
    let out = env.run(&["deny", &approval, "--reason", "something else"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("\"use b.txt\"") && said.contains("stands"),
        "{said}"
    );
}

/// Item 18. `keel model parse` redacts keys like everything keel prints.
#[test]
fn model_parse_redacts_keys() {
    let env = Env::new();
    env.write(
        "rec.sse",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"key sk-proj-abcdefghijklmnopqrstuvwxyz0123\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    let out = env.run(&["model", "parse", "--wire", "openai-chat", "rec.sse"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(
        printed.contains("[REDACTED]") && !printed.contains("sk-proj-abc"),
        "{printed}"
    );
}

/// Item 18. After `kill -9`, `sessions show` says no live process holds the `running`
/// session, and how to continue it.
#[test]
fn sessions_show_says_a_killed_running_session_has_no_live_worker() {
    let env = Env::new();
    env.write(
        "script.jsonl",
        "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"sleep 30\"}}]}\n{\"text\":\"done\"}\n",
    );
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
        .arg("sleep");
    let mut run = Running::start(cmd);
    let line: Value = serde_json::from_str(&run.wait_for("session.created", 30)).unwrap();
    let session = line["session_id"].as_str().unwrap().to_owned();
    run.wait_for("tool_call.started", 30);
    let live = stdout(&env.run(&["sessions", "show", &session]));
    assert!(live.contains("status     running\n"), "{live}");
    run.signal("KILL");
    let (code, _) = run.finish(30);
    assert_eq!(code, None);
    let show = stdout(&env.run(&["sessions", "show", &session]));
    assert!(
        show.contains(&format!(
            "running (no live worker; keel resume {session} continues)"
        )),
        "{show}"
    );
    assert_eq!(show_json(&env, &session)["live_worker"], false);
}

/// README: an existing store directory keel owns (the user data directory's `keel/`) is
/// narrowed to 0700, like the store file to 0600; before, a 0755 one was used as it was.
#[test]
fn an_existing_keel_data_directory_is_narrowed_to_0700() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let dir = env.path("data/keel");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = env.run(&["sessions", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
    assert!(stderr(&out).contains("0700"), "says so: {}", stderr(&out));
}
