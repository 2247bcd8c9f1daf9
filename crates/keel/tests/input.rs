//! The input pipeline headless (`keel run` / `keel resume` with a prompt): every slash command
//! answered or carried out without a model call, user-defined commands (a repository's only
//! when the workspace is trusted), `@path` attachments — and an `@path` outside the workspace
//! refused before anything runs. (The same through a pseudo-terminal: `interactive.rs`.)

use serde_json::Value;

use crate::common::{Env, check_stream, jsonl_lines, run_script, stderr, stdout};

/// A session with one completed turn (script line 1); the script has `more` lines after it.
fn session_with_one_turn(env: &Env, more: &str) -> String {
    let (exit, lines) = run_script(env, &format!("{{\"text\":\"first answer\"}}\n{more}"), &[]);
    assert_eq!(exit, Some(0), "{lines:?}");
    check_stream(&lines)["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn events(env: &Env, session: &str) -> Vec<Value> {
    jsonl_lines(&env.run(&["sessions", "events", session]).stdout)
}

fn count(events: &[Value], ty: &str) -> usize {
    events.iter().filter(|e| e["type"] == ty).count()
}

#[test]
fn local_commands_answer_without_a_model_call() {
    let env = Env::new();
    // The script has no line for a second model call: one would fail the run.
    let session = session_with_one_turn(&env, "");
    for (command, expect) in [
        ("/help", "/compact"),
        ("/cost", "input +"),
        ("/status", "turns 1"),
        ("/permissions", "permission mode default"),
    ] {
        let out = env.run(&["resume", &session, command]);
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
        assert!(stdout(&out).contains(expect), "{command}: {}", stdout(&out));
    }
    // JSONL: one `command` line naming the session.
    let out = env.run(&["resume", &session, "/cost", "--output", "jsonl"]);
    let lines = jsonl_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["type"], "command");
    assert_eq!(lines[0]["command"], "cost");
    assert_eq!(lines[0]["session_id"], session.as_str());
    let evs = events(&env, &session);
    assert_eq!(count(&evs, "turn.queued"), 1, "no command became a turn");
    assert_eq!(count(&evs, "step.started"), 1, "no model call");
    // A new run whose prompt a command answers locally leaves no empty session behind —
    // `/clear` included: a new session is already clear (it stored two empty ones).
    for command in ["/help", "/status", "/cost", "/permissions", "/clear"] {
        let out = env.run(&[
            "run",
            "--workspace",
            "ws",
            "--model",
            "script:script.jsonl",
            command,
        ]);
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
        if command == "/clear" {
            assert!(
                stdout(&out).contains("nothing to clear"),
                "{}",
                stdout(&out)
            );
        }
    }
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    assert_eq!(
        list.lines().count(),
        1,
        "only the session with a turn: {list}"
    );
}

/// A command's answer written to a reader that went away (`keel run /help | head -1`): keel
/// neither panics (`println!` did on the closed pipe, exit 101 with a backtrace) nor leaves the
/// run's session behind, and its lease is not left held.
#[test]
fn a_commands_answer_to_a_closed_pipe_neither_panics_nor_leaves_a_session() {
    let env = Env::new();
    env.write("ws/script.jsonl", "{\"text\":\"done\"}\n");
    for command in ["/help", "/status"] {
        let mut child = env
            .keel()
            .args([
                "run",
                "--workspace",
                "ws",
                "--model",
                "script:script.jsonl",
                command,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{command}: {err}");
        assert_ne!(out.status.code(), Some(101), "{command}: {err}");
    }
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    assert_eq!(list.lines().count(), 0, "no session left: {list}");
}

#[test]
fn unknown_and_terminal_only_commands_are_refused_before_anything_runs() {
    let env = Env::new();
    let session = session_with_one_turn(&env, "");
    let out = env.run(&["resume", &session, "/nosuch thing"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown command /nosuch"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["resume", &session, "/resume"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("terminal-only"), "{}", stderr(&out));
    assert_eq!(count(&events(&env, &session), "turn.queued"), 1);
    // A new run whose prompt is an unknown command asks no model (the script is empty).
    env.write("empty.jsonl", "");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:empty.jsonl",
        "/nosuch",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("unknown command /nosuch"));
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    assert_eq!(
        list.lines().count(),
        1,
        "the refused run left no session: {list}"
    );
}

#[test]
fn compact_with_a_focus_journals_a_compaction_between_turns() {
    let env = Env::new();
    let session = session_with_one_turn(&env, "{\"text\":\"after the summary\"}\n");
    let out = env.run(&["resume", &session, "/compact keep the API notes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("compacted"), "{}", stdout(&out));
    let evs = events(&env, &session);
    let compacted: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "context.compacted")
        .collect();
    assert_eq!(compacted.len(), 1);
    assert!(compacted[0]["turn_id"].is_null(), "{}", compacted[0]);
    assert_eq!(count(&evs, "turn.queued"), 1);
    // The next turn runs on (and takes the next script line: the summary took none).
    let out = env.run(&["resume", &session, "go on", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "after the summary");
    // The turn after the summary can be compacted again.
    let out = env.run(&["resume", &session, "/compact"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn model_re_pins_and_clear_starts_a_new_session() {
    let env = Env::new();
    let session = session_with_one_turn(&env, "");
    // The scripted position is the session's: its next model call reads line 2.
    env.write(
        "ws/other.jsonl",
        "{\"text\":\"unused\"}\n{\"text\":\"from the other model\"}\n",
    );
    let out = env.run(&["resume", &session, "/model script:other.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("now runs model"), "{}", stdout(&out));
    assert_eq!(count(&events(&env, &session), "session.release_pinned"), 1);
    let out = env.run(&["resume", &session, "who are you", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "from the other model", "{result}");

    let out = env.run(&["resume", &session, "/clear"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("new session"), "{text}");
    let list = stdout(&env.run(&["sessions", "list", "--json"]));
    assert_eq!(list.lines().count(), 2, "{list}");
    let new = list
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|s| s["session_id"] != session.as_str())
        .unwrap();
    assert!(text.contains(new["session_id"].as_str().unwrap()), "{text}");
    assert_eq!(new["turns"], 0);
}

#[test]
fn user_commands_expand_arguments_and_a_repositorys_need_trust() {
    let env = Env::new();
    env.write(
        "config/keel/commands/review.md",
        "---\ndescription: review a file\n---\nReview $ARGUMENTS carefully.\n",
    );
    env.write(".keep", "");
    env.write("ws/.keel/commands/ship.md", "Ship it: $ARGUMENTS\n");
    env.write("ws/keel.toml", "");
    let session = session_with_one_turn(&env, "{\"text\":\"reviewed\"}\n{\"text\":\"shipped\"}\n");
    let out = env.run(&["resume", &session, "/help"]);
    assert!(stdout(&out).contains("review a file"), "{}", stdout(&out));
    let out = env.run(&["resume", &session, "/review src/a.rs", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "reviewed");
    let queued: Vec<Value> = events(&env, &session)
        .into_iter()
        .filter(|e| e["type"] == "turn.queued")
        .collect();
    let last = &queued.last().unwrap()["payload"];
    assert_eq!(last["input"], "Review src/a.rs carefully.");
    assert_eq!(last["compiled"]["raw"], "/review src/a.rs");
    assert_eq!(last["compiled"]["command"], "review");
    // The repository's command: not used while the workspace is not trusted, and it says so.
    let out = env.run(&["resume", &session, "/ship now"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("ship.md exists, but this workspace is not trusted"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["trust", "ws"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["resume", &session, "/ship now", "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "shipped", "{}", stderr(&out));
}

#[test]
fn at_path_attaches_a_workspace_file_and_refuses_one_outside() {
    let env = Env::new();
    env.write("ws/notes.txt", "the notes say hello\n");
    env.write("outside.txt", "not yours\n");
    env.write("script.jsonl", "{\"text\":\"read them\"}\n");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:script.jsonl",
        "--output",
        "jsonl",
        "summarize @notes.txt please",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["final_text"], "read them");
    let session = result["session_id"].as_str().unwrap().to_owned();
    let evs = events(&env, &session);
    let queued = &evs.iter().find(|e| e["type"] == "turn.queued").unwrap()["payload"];
    let input = queued["input"].as_str().unwrap();
    assert!(input.starts_with("summarize @notes.txt please"), "{input}");
    assert!(input.contains("the notes say hello"), "{input}");
    assert_eq!(queued["compiled"]["attachments"][0]["path"], "notes.txt");
    // Outside the workspace, and missing: refused, no model call, no turn.
    for (prompt, what) in [
        ("look at @../outside.txt", "@../outside.txt"),
        ("look at @missing.txt", "@missing.txt"),
    ] {
        let out = env.run(&["resume", &session, prompt]);
        assert_eq!(out.status.code(), Some(2), "{prompt}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{}", stderr(&out));
        assert!(!stderr(&out).contains("not yours"));
    }
    assert_eq!(count(&events(&env, &session), "turn.queued"), 1);
}
