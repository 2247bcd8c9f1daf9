//! `keel config show`: layers merge in order (user file, workspace file, flags) and every secret
//! is masked.

use crate::common::{Env, stderr, stdout};

#[test]
fn config_show_merges_layers_and_masks_secrets() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        r#"
model = "openai:gpt-5"
instructions = "user instructions"
permission_mode = "accept_edits"
store = "postgres://keel:hunter2@db.local/keel"
[providers.openai]
api_key = "sk-user-file-secret"
[providers.anthropic]
api_key_env = "MY_ANTHROPIC_KEY"
[budget]
max_steps = 10
max_tokens = 5000
[env]
GITHUB_TOKEN = "ghp_workspace_secret"
DATABASE_URL = { value = "mysql://app@db/plain-looking-but-marked", secret = true }
PLAIN = "visible-value"
"#,
    );
    // (`store` and `[env]` are the user's to set: a workspace file may not.)
    env.write(
        "ws/keel.toml",
        r#"
[budget]
max_cost_usd = 1.5
[policy]
deny = ["read_file(./secrets/**)"]
client_password = "pw-nested-secret"
"#,
    );
    // An unknown key inside [policy] is refused with the file named; drop it and continue.
    let out = env.run(&["config", "show", "--workspace", "ws"]);
    assert!(!out.status.success());
    let err = crate::common::stderr(&out);
    assert!(
        err.contains("ws/keel.toml") && err.contains("client_password"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let text = std::fs::read_to_string(env.path("ws/keel.toml"))
        .unwrap()
        .replace("client_password = \"pw-nested-secret\"\n", "");
    env.write("ws/keel.toml", &text);

    let out = env
        .keel()
        .args(["config", "show", "--workspace", "ws", "--max-steps", "3"])
        .args([
            "--sandbox",
            "read-only",
            "--model",
            "anthropic:claude-sonnet-4-5",
        ])
        .env("OPENAI_API_KEY", "sk-env-secret")
        .env("MY_ANTHROPIC_KEY", "sk-ant-env-secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let shown = stdout(&out);
    for secret in [
        "sk-user-file-secret",
        "hunter2",
        "ghp_workspace_secret",
        "plain-looking-but-marked",
        "sk-env-secret",
        "sk-ant-env-secret",
    ] {
        assert!(!shown.contains(secret), "{secret} leaked:\n{shown}");
    }
    let table: toml::Table = shown.parse().unwrap();
    // Flags win over files, the workspace file over the user file, tables merge key by key.
    assert_eq!(table["model"].as_str(), Some("anthropic:claude-sonnet-4-5"));
    assert_eq!(table["sandbox"].as_str(), Some("read_only"));
    assert_eq!(table["permission_mode"].as_str(), Some("accept_edits"));
    assert_eq!(table["instructions"].as_str(), Some("user instructions"));
    assert_eq!(table["budget"]["max_steps"].as_integer(), Some(3));
    assert_eq!(
        table["budget"]["max_tokens"].as_integer(),
        Some(5000),
        "counts are not secrets"
    );
    assert_eq!(table["budget"]["max_cost_usd"].as_float(), Some(1.5));
    assert_eq!(table["env"]["PLAIN"].as_str(), Some("visible-value"));
    assert_eq!(table["env"]["GITHUB_TOKEN"].as_str(), Some("********"));
    assert_eq!(table["env"]["DATABASE_URL"].as_str(), Some("********"));
    assert_eq!(
        table["providers"]["openai"]["api_key"].as_str(),
        Some("********")
    );
    assert_eq!(
        table["providers"]["anthropic"]["api_key_env"].as_str(),
        Some("MY_ANTHROPIC_KEY"),
        "the name of a variable is not a secret"
    );
    assert!(
        table["providers"]["anthropic"]["api_key"]
            .as_str()
            .unwrap()
            .contains("$MY_ANTHROPIC_KEY"),
        "says where the key comes from"
    );
    assert_eq!(
        table["store"].as_str(),
        Some("postgres://keel:********@db.local/keel")
    );
    assert!(shown.starts_with("# effective configuration; merged from: defaults, "));

    // JSON output masks the same way.
    let out = env
        .keel()
        .args(["config", "show", "--json", "--workspace", "ws"])
        .env("OPENAI_API_KEY", "sk-env-secret")
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["env"]["GITHUB_TOKEN"], "********");
    assert!(!stdout(&out).contains("hunter2"));
}

#[test]
fn config_show_defaults_to_sqlite_in_the_user_data_dir() {
    let env = Env::new();
    let out = env.run(&["config", "show", "--workspace", "ws"]);
    assert!(out.status.success());
    let table: toml::Table = stdout(&out).parse().unwrap();
    assert_eq!(table["store"].as_str().unwrap(), env.store());
    assert_eq!(table["permission_mode"].as_str(), Some("default"));
    assert_eq!(table["sandbox"].as_str(), Some("workspace_write"));
    assert_eq!(table["keep_reasoning"].as_bool(), Some(false));
    let ws = std::fs::canonicalize(env.ws()).unwrap();
    assert_eq!(table["workspace"].as_str().unwrap(), ws.to_str().unwrap());
}

#[test]
fn invalid_values_are_named() {
    let env = Env::new();
    env.write("ws/keel.toml", "permission_mode = \"yolo\"\n");
    let out = env.run(&["config", "show", "--workspace", "ws"]);
    assert_eq!(out.status.code(), Some(1));
    let err = crate::common::stderr(&out);
    assert!(
        err.contains("permission_mode") && err.contains("yolo") && err.contains("bypass"),
        "{err}"
    );
    env.write("ws/keel.toml", "model = [\n");
    let err = crate::common::stderr(&env.run(&["config", "show", "--workspace", "ws"]));
    assert!(err.contains("keel.toml is not valid TOML"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn help_documents_every_exit_code() {
    let env = Env::new();
    let help = stdout(&env.run(&["--help"]));
    for (code, reason) in [
        (0, "completed"),
        (1, "failed"),
        (3, "requires_action"),
        (4, "aborted"),
        (5, "budget_exhausted"),
        (6, "loop_detected"),
        (7, "prompt_too_long"),
    ] {
        assert!(help.contains(&format!("  {code}  {reason}")), "{help}");
    }
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    for reason in [
        "completed",
        "failed",
        "requires_action",
        "aborted",
        "budget_exhausted",
    ] {
        assert!(
            readme.contains(&format!("| `{reason}` |")),
            "README documents {reason}"
        );
    }
}

#[test]
fn the_readme_keel_toml_example_is_valid() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    let start = readme.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + readme[start..].find("```").unwrap();
    let env = Env::new();
    // As the user config: a workspace's keel.toml may not loosen permission_mode.
    env.write("config/keel/keel.toml", &readme[start..end]);
    let out = env.run(&["config", "show", "--workspace", "ws"]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let table: toml::Table = stdout(&out).parse().unwrap();
    assert_eq!(table["env"]["DATABASE_URL"].as_str(), Some("********"));
}

#[test]
fn keel_toml_route_and_instructions_become_a_pinned_content_hashed_release() {
    let env = Env::new();
    // keel-model's route counts every failed attempt as a consumed response, the primary's too,
    // so the fallback's position is past the retries: give it the same answer on every line.
    env.write(
        "ws/fallback.jsonl",
        &"{\"text\":\"from the fallback\"}\n".repeat(10),
    );
    env.write(
        "config/keel/keel.toml",
        "base_url = \"http://127.0.0.1:9/v1\"\n",
    );
    let toml = "model = \"openai:nowhere\"\nfallback_models = [\"script:fallback.jsonl\"]\ninstructions = \"Be brief.\"\n";
    env.write("ws/keel.toml", toml);
    // A scripted fallback is the repository's own answers: only a trusted workspace names one.
    let trust = || assert!(env.run(&["trust", "ws"]).status.success());
    trust();
    let run = || {
        let out = env.run(&["run", "--workspace", "ws", "--output", "jsonl", "hi"]);
        let lines = crate::common::jsonl_lines(&out.stdout);
        let result = crate::common::check_stream(&lines);
        let release = lines[0]["payload"]["release_id"]
            .as_str()
            .unwrap()
            .to_owned();
        (result, release, lines)
    };
    // The primary is unreachable: retried, then the route falls back to the script.
    let (result, first, lines) = run();
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(result["final_text"], "from the fallback");
    assert!(lines.iter().any(|l| l["type"] == "step.attempt_failed"));
    let session = result["session_id"].as_str().unwrap();
    let show = stdout(&env.run(&["sessions", "show", session, "--json"]));
    let show: serde_json::Value = serde_json::from_str(&show).unwrap();
    let route = show["model_route"].as_array().unwrap();
    assert_eq!(route[0], "openai:nowhere");
    assert_eq!(
        show["config"]["host"]["base_url"], "http://127.0.0.1:9/v1",
        "base URL pinned in the config's host slot"
    );
    assert!(route[1].as_str().unwrap().ends_with("/ws/fallback.jsonl"));
    // Same configuration, same release; another instruction, another release.
    let (_, second, _) = run();
    assert_eq!(first, second);
    env.write("ws/keel.toml", &toml.replace("Be brief.", "Be thorough."));
    trust();
    let (_, third, _) = run();
    assert_ne!(first, third);
}

/// `context_window` in keel.toml is pinned as the session's `context_window_tokens` (the
/// override compaction uses instead of the model's known window); without it the session
/// takes the model's; 0 is refused naming the field. Before, keel.toml had no such key (an
/// unknown field) and every session pinned 200,000 tokens whatever the model.
#[test]
fn keel_toml_context_window_is_pinned_with_the_session() {
    let env = Env::new();
    env.write("script.jsonl", "{\"text\":\"ok\"}\n");
    let window_of = |env: &Env| {
        let out = env.run(&[
            "run",
            "--workspace",
            "ws",
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "hi",
        ]);
        let result = crate::common::check_stream(&crate::common::jsonl_lines(&out.stdout));
        let session = result["session_id"].as_str().unwrap().to_owned();
        let show = stdout(&env.run(&["sessions", "show", &session, "--json"]));
        let show: serde_json::Value = serde_json::from_str(&show).unwrap();
        show["config"]["context_window_tokens"].clone()
    };
    assert_eq!(
        window_of(&env),
        serde_json::Value::Null,
        "the model's window"
    );
    env.write("ws/keel.toml", "context_window = 64000\n");
    assert_eq!(window_of(&env), 64000);
    env.write("ws/keel.toml", "context_window = 0\n");
    let out = env.run(&["config", "show", "--workspace", "ws"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("context_window"), "{}", stderr(&out));
}
