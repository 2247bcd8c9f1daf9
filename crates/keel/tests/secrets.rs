//! Secrets never reach the store or a tool that does not need them (issue 10 item 2): before,
//! the key of a provider keel read (`ANTHROPIC_API_KEY` while running another model) went in
//! plaintext to the journal and to the model, full tool outputs were stored unredacted, and
//! `keel.db` was created 0644.

use crate::common::{Env, check_stream, jsonl_lines, stderr};

const ANTHROPIC: &str = "anthropic-plain-key-0042";
const CUSTOM: &str = "custom-openai-key-77";
const DB_PASS: &str = "hunter2-db-pass";

fn store_bytes(env: &Env) -> Vec<u8> {
    let mut all = Vec::new();
    for f in ["keel.db", "keel.db-wal"] {
        if let Ok(b) = std::fs::read(env.path("data/keel").join(f)) {
            all.extend(b);
        }
    }
    assert!(!all.is_empty());
    all
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn provider_keys_and_secret_values_reach_neither_tools_nor_the_store() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        &format!(
            "[providers.openai]\napi_key_env = \"MY_OPENAI_KEY\"\n\n[env]\nDB_PASSWORD = {{ value = \"{DB_PASS}\", secret = true }}\n"
        ),
    );
    // The model knows the key (it is in its context somehow) and the secret value, asks for
    // the environment's keys, writes the secret to a file and prints a long output with the key.
    let shell = |cmd: &str| {
        serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]})
            .to_string()
    };
    let script = [
        shell("printf 'A=%s O=%s\\n' \"$ANTHROPIC_API_KEY\" \"$MY_OPENAI_KEY\""),
        serde_json::json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "db.txt", "content": DB_PASS}}]}).to_string(),
        shell(&format!("yes {ANTHROPIC} | head -c 300000")),
        serde_json::json!({"text": format!("done {CUSTOM}")}).to_string(),
    ]
    .join("\n");
    env.write("script.jsonl", &script);
    let out = env
        .keel()
        .env("ANTHROPIC_API_KEY", ANTHROPIC)
        .env("MY_OPENAI_KEY", CUSTOM)
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass"])
        .arg("go")
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&out));
    let stream = String::from_utf8_lossy(&out.stdout);
    for secret in [ANTHROPIC, CUSTOM, DB_PASS] {
        assert!(!stream.contains(secret), "{secret} in the event stream");
    }
    // The tool did not get the keys.
    let first = lines
        .iter()
        .find(|l| l["type"] == "tool_call.finished")
        .unwrap();
    assert!(
        first["payload"]["output"]
            .as_str()
            .unwrap()
            .contains("A= O=\n"),
        "{first}"
    );
    // The write ran with the exact value; the long output was cut and stored as an artifact.
    assert_eq!(
        std::fs::read_to_string(env.ws().join("db.txt")).unwrap(),
        DB_PASS
    );
    assert!(stream.contains("artifact://"), "the output was not cut");
    let bytes = store_bytes(&env);
    for secret in [ANTHROPIC, CUSTOM, DB_PASS] {
        assert!(!contains(&bytes, secret), "{secret} in the store files");
    }
    assert!(contains(&bytes, "[REDACTED]"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |p: std::path::PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(env.path("data/keel")), 0o700);
        assert_eq!(mode(env.path("data/keel/keel.db")), 0o600);
        // SQLite removes the WAL when the last connection closes cleanly; while it exists it
        // has the database file's mode.
        if env.path("data/keel/keel.db-wal").exists() {
            assert_eq!(mode(env.path("data/keel/keel.db-wal")), 0o600);
        }
        assert_eq!(mode(env.path("data/keel/seal.key")), 0o600);
    }
}

#[test]
fn a_file_that_is_not_a_sqlite_database_is_refused_at_once() {
    let env = Env::new();
    env.write("notes.txt", "just some notes, not a database\n");
    env.write("script.jsonl", "{\"text\":\"hi\"}\n");
    let started = std::time::Instant::now();
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--store", "notes.txt", "hi"])
        .output()
        .unwrap();
    // Before: a 30 s wait and "pool timed out". A 10x margin over the expected instant refusal.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("is not a SQLite database"), "{err}");
    assert!(err.contains("notes.txt"), "{err}");
    assert_eq!(
        std::fs::read_to_string(env.path("notes.txt")).unwrap(),
        "just some notes, not a database\n"
    );
}
