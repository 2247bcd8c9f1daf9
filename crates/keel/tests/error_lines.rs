//! Error lines: each cause once, no Rust debug formatting, and a closed standard output
//! (`keel … | head -1`) is a quiet success.

use crate::common::{Env, run_script, stderr};

#[test]
fn a_cause_is_printed_once() {
    let env = Env::new();
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:missing.jsonl",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    let out = env.run(&["resolve", "nonexistent", "--as", "committed"]);
    let err = stderr(&out);
    assert!(!err.contains("OperationKey("), "{err}");
    assert!(
        err.contains("\"nonexistent\" is not an operation key"),
        "{err}"
    );
}

#[test]
fn a_closed_stdout_ends_sessions_events_quietly() {
    let env = Env::new();
    let (code, lines) = run_script(&env, "{\"text\":\"done\"}\n", &[]);
    assert_eq!(code, Some(0));
    let session = lines[0]["session_id"].as_str().unwrap().to_owned();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = env
        .keel()
        .args(["sessions", "events", &session])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[test]
fn a_missing_key_names_the_configured_variable() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "[providers.anthropic]\napi_key_env = \"MY_ANTHROPIC_KEY\"\n",
    );
    let out = env.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "anthropic:claude-sonnet-4-5",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("$MY_ANTHROPIC_KEY"), "{err}");
    assert!(!err.contains("ANTHROPIC_API_KEY"), "{err}");
}

/// Diagnostics reach standard error (before, every `tracing` event was discarded): `KEEL_LOG`
/// chooses what, `--log-format json` writes one JSON object per line, standard output stays the
/// event stream, and by default (warn) an info event is not written.
#[test]
fn log_lines_go_to_stderr_in_the_chosen_format() {
    let env = crate::common::Env::new();
    env.write("script.jsonl", "{\"text\":\"done\"}\n");
    let run = |log: Option<&str>, format: &str| {
        let mut c = env.keel();
        c.env_remove("RUST_LOG").env_remove("KEEL_LOG");
        if let Some(l) = log {
            c.env("KEEL_LOG", l);
        }
        c.args(["--log-format", format, "run", "--workspace", "ws"])
            .args(["--model", "script:script.jsonl", "--output", "jsonl", "hi"])
            .output()
            .unwrap()
    };
    let out = run(Some("keel_runtime=info"), "json");
    assert_eq!(out.status.code(), Some(0));
    crate::common::check_stream(&crate::common::jsonl_lines(&out.stdout));
    let logs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let finished = logs
        .iter()
        .find(|l| l["fields"]["message"] == "turn finished")
        .unwrap_or_else(|| panic!("{logs:#?}"));
    assert_eq!(finished["level"], "INFO");
    assert_eq!(finished["fields"]["terminal_reason"], "completed");
    let text = run(Some("keel_runtime=info"), "text");
    let err = crate::common::stderr(&text);
    assert!(
        err.contains("INFO") && err.contains("turn finished"),
        "{err}"
    );
    let quiet = run(None, "text");
    assert!(!crate::common::stderr(&quiet).contains("turn finished"));
    let bad = env
        .keel()
        .args(["--log-format", "xml", "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
