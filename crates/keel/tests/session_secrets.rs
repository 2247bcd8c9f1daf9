//! Secrets a session knew stay redacted, whatever the process that continues it knows; every
//! redactor keel builds knows every secret; escaped spellings are secrets too (attack report on
//! issue 10, items C, D, E and J). Each on SQLite and PostgreSQL, reading the store itself (the
//! SQLite file's bytes, a `pg_dump` of the schema): what keel prints is redacted again on the
//! way out, so only the store shows what was written.
//!
//! - D: a provider key in a sealed call's arguments went to the journal and stdout in clear once
//!   the session was resumed without the variable (the session pinned secret *names* only).
//! - E: a provider key read through an `api_key_env` added after the session was created was
//!   not redacted (the error echoing it landed in events and on stdout).
//! - C: `keel deny --reason` stored an `[env]` literal secret in the approvals row (decide built
//!   its own redactor without the configuration's secret values).
//! - J: a truncated tool call's raw arguments text kept `\/`- and `\uXXXX`-escaped secrets.

use crate::common::{Env, check_stream, jsonl_lines, stderr, stdout};
use crate::sse::{ChatServer, Reply, chunk, text_reply, usage_and_done};

/// Where a test's store is.
enum Store {
    /// The environment's default SQLite store.
    Sqlite,
    /// A fresh schema of `KEEL_TEST_DATABASE_URL`, dropped afterwards.
    Postgres { base: String, schema: String },
}

impl Store {
    fn sqlite() -> Self {
        Store::Sqlite
    }

    fn postgres() -> Self {
        let base = std::env::var("KEEL_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let schema = format!("keel_secrets_{}", uuid::Uuid::now_v7().simple());
        Store::Postgres { base, schema }
    }

    /// `--store URL` for PostgreSQL; nothing for the default store.
    fn args(&self) -> Vec<String> {
        match self {
            Store::Sqlite => Vec::new(),
            Store::Postgres { base, schema } => {
                let sep = if base.contains('?') { '&' } else { '?' };
                vec!["--store".into(), format!("{base}{sep}keel_schema={schema}")]
            }
        }
    }

    /// Everything the store holds, as bytes.
    fn dump(&self, env: &Env) -> Vec<u8> {
        match self {
            Store::Sqlite => {
                let mut all = Vec::new();
                for f in ["keel.db", "keel.db-wal"] {
                    if let Ok(b) = std::fs::read(env.path("data/keel").join(f)) {
                        all.extend(b);
                    }
                }
                all
            }
            Store::Postgres { base, schema } => {
                let out = std::process::Command::new("pg_dump")
                    .args(["--data-only", "--schema", schema, "--dbname", base])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                out.stdout
            }
        }
    }

    /// Asserts the store holds none of `secrets` (and holds the session: not vacuous).
    fn assert_clean(&self, env: &Env, session: &str, secrets: &[&str]) {
        let dump = self.dump(env);
        assert!(contains(&dump, session), "the dump holds the session");
        for s in secrets {
            assert!(!contains(&dump, s), "{s:?} is in the store");
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Postgres { base, schema } = self {
            let _ = std::process::Command::new("psql")
                .arg(base.as_str())
                .arg("-qc")
                .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .output();
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// `keel ARGS` with the store's arguments after the subcommand.
fn keel(env: &Env, store: &Store, args: &[&str]) -> std::process::Command {
    let mut c = env.keel();
    c.arg(args[0]).args(store.args()).args(&args[1..]);
    c
}

/// Generates `<name>::sqlite` and `<name>::postgres` from `fn <name>(Store)`.
macro_rules! on_both {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name(super::Store::sqlite())
                }
                #[test]
                fn postgres() {
                    super::$name(super::Store::postgres())
                }
            }
        )+
    };
}

on_both!(
    a_secret_the_session_knew_stays_redacted_when_resumed_without_it,
    a_provider_key_read_through_an_api_key_env_added_later_is_redacted,
    a_deny_reason_holding_a_configured_secret_value_is_redacted,
    a_secret_in_truncated_raw_arguments_is_redacted_in_every_escaped_spelling,
    sessions_events_redacts_a_secret_learned_after_it_was_journaled,
);

/// F. The model says a value no process knew to be secret yet; then the user config makes it
/// a secret `[env]` value. `keel sessions events` prints the journal redacted by what is
/// secret now (it printed the stored events as they were).
fn sessions_events_redacts_a_secret_learned_after_it_was_journaled(store: Store) {
    const LATER: &str = "later-secret-value-0123456789";
    let env = Env::new();
    env.write(
        "script.jsonl",
        &serde_json::json!({"text": format!("the value is {LATER}")}).to_string(),
    );
    let run = keel(&env, &store, &["run"])
        .args(["--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "say it"])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&run.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&run));
    let session = result["session_id"].as_str().unwrap().to_owned();
    let before = keel(&env, &store, &["sessions", "events", &session])
        .output()
        .unwrap();
    assert!(before.status.success(), "{}", stderr(&before));
    assert!(stdout(&before).contains(LATER), "not a secret yet");
    env.write(
        "config/keel/keel.toml",
        &format!("[env]\nLATER = {{ value = \"{LATER}\", secret = true }}\n"),
    );
    let after = keel(&env, &store, &["sessions", "events", &session])
        .output()
        .unwrap();
    assert!(after.status.success(), "{}", stderr(&after));
    let shown = stdout(&after);
    assert!(!shown.contains(LATER), "{shown}");
    assert!(shown.contains("the value is [REDACTED]"), "{shown}");
}

/// D. `ANTHROPIC_API_KEY` is set for the run, whose write (waiting on approval) names a file
/// after it; the approval and the resume run without it. The exact arguments run, and neither
/// the resume's output nor the store has the key.
fn a_secret_the_session_knew_stays_redacted_when_resumed_without_it(store: Store) {
    const KEY: &str = "anthkey-0000111122223333";
    let env = Env::new();
    env.write(
        "script.jsonl",
        &[
            serde_json::json!({"tool_calls": [{"name": "write_file", "arguments": {"path": format!("a-{KEY}.txt"), "content": "k"}}]}).to_string(),
            serde_json::json!({"text": format!("wrote a-{KEY}.txt")}).to_string(),
        ]
        .join("\n"),
    );
    let run = keel(&env, &store, &["run"])
        .env("ANTHROPIC_API_KEY", KEY)
        .args(["--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "write"])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&run.stdout));
    assert_eq!(
        result["terminal_reason"],
        "requires_action",
        "{}",
        stderr(&run)
    );
    assert!(!stdout(&run).contains(KEY));
    let session = result["session_id"].as_str().unwrap().to_owned();
    let approval = result["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = keel(&env, &store, &["approve", &approval])
        .output()
        .unwrap();
    assert!(approve.status.success(), "{}", stderr(&approve));
    let resume = keel(&env, &store, &["resume", &session, "--output", "jsonl"])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&resume.stdout));
    assert_eq!(
        result["terminal_reason"],
        "completed",
        "{}",
        stderr(&resume)
    );
    assert!(
        env.ws().join(format!("a-{KEY}.txt")).exists(),
        "the call ran with its exact arguments"
    );
    let shown = format!("{}{}", stdout(&resume), stderr(&resume));
    assert!(!shown.contains(KEY), "the resume printed the key: {shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
    store.assert_clean(&env, &session, &[KEY]);
}

/// E. The session is created with no `api_key_env`; then the user config names `MY_OAI` and the
/// resume reads the key from it. The server's error echoes the key: it is redacted in the
/// output and the store.
fn a_provider_key_read_through_an_api_key_env_added_later_is_redacted(store: Store) {
    const KEY: &str = "myoaikey-0123456789";
    let env = Env::new();
    let server = ChatServer::start(vec![
        text_reply("hi", 10, 5),
        Reply::Error(
            400,
            Vec::new(),
            serde_json::json!({"error": {"message": format!("Incorrect API key provided: {KEY}"), "type": "invalid_request_error"}}).to_string(),
        ),
    ]);
    let config = format!("base_url = \"{}\"\n", server.base_url());
    env.write("config/keel/keel.toml", &config);
    let run = keel(&env, &store, &["run"])
        .args([
            "--workspace",
            "ws",
            "--model",
            "openai:gpt-4o",
            "--output",
            "jsonl",
            "x",
        ])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&run.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{}", stderr(&run));
    let session = result["session_id"].as_str().unwrap().to_owned();
    env.write(
        "config/keel/keel.toml",
        &format!("{config}\n[providers.openai]\napi_key_env = \"MY_OAI\"\n"),
    );
    let resume = keel(
        &env,
        &store,
        &["resume", &session, "again", "--output", "jsonl"],
    )
    .env("MY_OAI", KEY)
    .output()
    .unwrap();
    let lines = jsonl_lines(&resume.stdout);
    check_stream(&lines);
    assert_eq!(server.requests(), 2, "the resume reached the server");
    let shown = format!("{}{}", stdout(&resume), stderr(&resume));
    assert!(!shown.contains(KEY), "the resume printed the key: {shown}");
    assert!(shown.contains("Incorrect API key provided"), "{shown}");
    store.assert_clean(&env, &session, &[KEY]);
}

/// C. A deny reason holding an `[env]` literal secret and a `[providers]` key written in the
/// user config: the approvals row (and the journal) keep neither.
fn a_deny_reason_holding_a_configured_secret_value_is_redacted(store: Store) {
    const DB_PASS: &str = "hunter2-literal-secret";
    const CONFIG_KEY: &str = "config-written-key-4242";
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        &format!(
            "[env]\nDB_PASS = {{ value = \"{DB_PASS}\", secret = true }}\n\n[providers.anthropic]\napi_key = \"{CONFIG_KEY}\"\n"
        ),
    );
    env.write(
        "script.jsonl",
        &[
            serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]}).to_string(),
            serde_json::json!({"text": "ok"}).to_string(),
        ]
        .join("\n"),
    );
    let run = keel(&env, &store, &["run"])
        .args([
            "--workspace",
            "ws",
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "x",
        ])
        .output()
        .unwrap();
    let result = check_stream(&jsonl_lines(&run.stdout));
    assert_eq!(
        result["terminal_reason"],
        "requires_action",
        "{}",
        stderr(&run)
    );
    let session = result["session_id"].as_str().unwrap().to_owned();
    let approval = result["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let reason = format!("use {DB_PASS} with {CONFIG_KEY} instead");
    let deny = keel(&env, &store, &["deny", &approval, "--reason", &reason])
        .output()
        .unwrap();
    assert!(deny.status.success(), "{}", stderr(&deny));
    let resume = keel(&env, &store, &["resume", &session, "--output", "jsonl"])
        .output()
        .unwrap();
    check_stream(&jsonl_lines(&resume.stdout));
    assert!(!stdout(&resume).contains(DB_PASS));
    store.assert_clean(&env, &session, &[DB_PASS, CONFIG_KEY]);
}

/// J. The model's tool call is cut off (`finish_reason: length`) inside a string whose secrets
/// are spelled with `\/`, `\u0037` and a surrogate pair. The raw text is kept as the call's
/// arguments: redacted in every spelling, in the output and the store.
fn a_secret_in_truncated_raw_arguments_is_redacted_in_every_escaped_spelling(store: Store) {
    let env = Env::new();
    let server_args = r#"{"path":"a.txt","content":"postgres:\/\/u:pw@h\/db key-123456\u0037 pass\ud83d\ude00word"#;
    let mut first = vec![
        chunk(
            serde_json::json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "write_file", "arguments": server_args}}]}),
            None,
        ),
        chunk(serde_json::json!({}), Some("length")),
    ];
    first.extend(usage_and_done(10, 4096));
    let server = ChatServer::start(vec![Reply::Stream(first), text_reply("ok", 10, 5)]);
    env.write(
        "config/keel/keel.toml",
        &format!(
            "base_url = \"{}\"\n\n[env]\nDBURL = {{ secret = true, value = \"postgres://u:pw@h/db\" }}\nKEY = {{ secret = true, value = \"key-1234567\" }}\nEMOJI = {{ secret = true, value = \"pass\u{1F600}word\" }}\n",
            server.base_url()
        ),
    );
    let run = keel(&env, &store, &["run"])
        .args([
            "--workspace",
            "ws",
            "--model",
            "openai:gpt-4o",
            "--output",
            "jsonl",
            "x",
        ])
        .output()
        .unwrap();
    let lines = jsonl_lines(&run.stdout);
    let result = check_stream(&lines);
    let session = result["session_id"].as_str().unwrap().to_owned();
    let proposed = lines
        .iter()
        .find(|l| l["type"] == "tool_call.proposed")
        .unwrap_or_else(|| panic!("no proposal: {lines:#?} {}", stderr(&run)));
    assert_eq!(
        proposed["payload"]["arguments"],
        r#"{"path":"a.txt","content":"[REDACTED] [REDACTED] [REDACTED]"#,
        "the raw text, each secret redacted"
    );
    // Each secret in any spelling: plain fragments, and the escaped ones.
    let fragments = [
        "u:pw@h",
        "key-123456",
        "ude00word",
        "\u{1F600}word",
        "pass\\ud83d",
    ];
    let shown = format!("{}{}", stdout(&run), stderr(&run));
    for f in fragments {
        assert!(!shown.contains(f), "{f:?} printed: {shown}");
    }
    store.assert_clean(&env, &session, &fragments);
}
