//! Errors a person can act on: one line on standard error naming what to fix, no backtrace
//! unless `-v`; with `--output jsonl` the stream still ends with one `failed` result line.

use crate::common::{Env, check_stream, jsonl_lines, stderr};

fn one_line(err: &str) -> &str {
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("stack backtrace"), "{err}");
    err.trim()
}

#[test]
fn a_missing_api_key_names_the_variable_to_set() {
    let env = Env::new();
    let out = env.run(&["run", "--workspace", "ws", "--model", "openai:gpt-5", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(one_line(&err).contains("OPENAI_API_KEY"), "{err}");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "anthropic:claude-sonnet-4-5",
        "hi",
    ]);
    assert!(
        stderr(&out).contains("ANTHROPIC_API_KEY"),
        "{}",
        stderr(&out)
    );
    // Headless: the stream is still one result line.
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "openai:gpt-5",
        "--output",
        "jsonl",
        "hi",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "failed");
    assert!(result["session_id"].is_null());
    assert!(result["error"].as_str().unwrap().contains("OPENAI_API_KEY"));
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn no_model_says_how_to_give_one() {
    let env = Env::new();
    let out = env.run(&["run", "--workspace", "ws", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line(&stderr(&out)).contains("--model"));
}

#[test]
fn an_unreachable_base_url_is_named() {
    let env = Env::new();
    // Port 9 (discard) on loopback: nothing listens there.
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "openai:local-model",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--output",
        "jsonl",
        "hi",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "failed");
    assert_eq!(out.status.code(), Some(1));
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("cannot reach the model server at http://127.0.0.1:9/v1"),
        "{error}"
    );
    assert!(error.contains("--base-url"), "{error}");
}

#[test]
fn a_script_that_ends_early_names_the_file_and_its_length() {
    let env = Env::new();
    env.write(
        "short.jsonl",
        "{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n",
    );
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:short.jsonl",
        "--output",
        "jsonl",
        "hi",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "failed");
    let error = result["error"].as_str().unwrap();
    assert!(error.starts_with("the script ended early: "), "{error}");
    assert!(error.contains("short.jsonl has 1 lines"), "{error}");
    // A malformed line is refused before anything runs, with its file and line number.
    env.write("bad.jsonl", "{\"text\":\"ok\"}\n{\"txet\":\"typo\"}\n");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:bad.jsonl",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(one_line(&err).contains("bad.jsonl line 2"), "{err}");
}

/// Asking past the script's end takes no line: after two such failures, lines appended to the
/// script answer from the first new one (the k-th response the session completed came from
/// line k).
#[test]
fn a_request_past_the_scripts_end_takes_no_line() {
    let env = Env::new();
    let script = env.path("grow.jsonl");
    env.write(
        "grow.jsonl",
        "{\"tool_calls\":[{\"name\":\"list_dir\",\"arguments\":{\"path\":\".\"}}]}\n",
    );
    let model = format!("script:{}", script.display());
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        &model,
        "--output",
        "jsonl",
        "hi",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "failed");
    let session = result["session_id"].as_str().unwrap().to_owned();
    // A bare resume asks for the same response again, not the next.
    let again = env.run(&["resume", &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&again.stdout));
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("model response 2 was requested"), "{result}");
    let mut text = std::fs::read_to_string(&script).unwrap();
    text.push_str("{\"text\":\"line two\"}\n{\"text\":\"line three\"}\n");
    std::fs::write(&script, text).unwrap();
    let done = env.run(&["resume", &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&done.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(result["final_text"], "line two", "{result}");
}

#[test]
fn a_missing_workspace_is_named() {
    let env = Env::new();
    let out = env.run(&[
        "run",
        "--workspace",
        "/nonexistent/ws",
        "--model",
        "script:x",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        one_line(&err).contains("workspace /nonexistent/ws does not exist"),
        "{err}"
    );
}

/// An environment whose default store holds one session; returns the SQLite file.
fn env_with_a_store() -> (Env, std::path::PathBuf) {
    let env = Env::new();
    env.write("s.jsonl", "{\"text\":\"ok\"}\n");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:s.jsonl",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let db = env.path("data/keel/keel.db");
    (env, db)
}

#[test]
fn a_store_from_a_newer_keel_is_refused() {
    let (env, db) = env_with_a_store();
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"INSERT INTO keel_migrations VALUES (9999, 'future', 'x', 0)\"); c.commit()")
        .arg(&db)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let out = env.run(&["sessions", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        one_line(&err).contains("newer than this keel supports"),
        "{err}"
    );
    assert!(err.contains("upgrade keel"), "{err}");
}

#[test]
fn a_locked_store_says_so() {
    let (env, db) = env_with_a_store();
    // Another process holds the write lock for longer than keel's busy timeout.
    let mut holder = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30)")
        .arg(&db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:s.jsonl",
        "hi",
    ]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        one_line(&err).contains("is locked by another process"),
        "{err}"
    );
}

#[test]
fn verbose_shows_the_cause_chain() {
    let env = Env::new();
    let out = env.run(&["-v", "sessions", "show", "not-an-id"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not a session id"));
    let out = env.run(&["sessions", "show", "01a22a64-5c61-7467-9c9b-abbed5bec89d"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line(&stderr(&out)).contains("no session 01a22a64-5c61-7467-9c9b-abbed5bec89d"));
}
