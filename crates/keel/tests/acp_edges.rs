//! `keel acp` findings of the attack and new-user reviews of issue 17, driven with the official
//! TypeScript SDK's client (`tests/acp/client.mjs`, see `acp.rs`).

use serde_json::{Value, json};

use crate::acp::{client, edit_a_txt, script, text_of, updates};
use crate::common::Env;

/// Every file of the environment's store (the SQLite database, its WAL), as bytes.
fn store_bytes(env: &Env) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(env.path("data/keel")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            out.extend(std::fs::read(path).unwrap());
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The `env` values an editor passes for an MCP server never reach the store in clear: the
/// release holds placeholders, the server gets the value (its own output is redacted), and
/// `session/load` in a new process takes the value the editor passes again — the release
/// stays the same (no re-pin).
#[test]
fn acp_mcp_env_values_never_reach_the_store_and_the_server_still_gets_them() {
    let env = Env::new();
    let secret = "tok-acp-editor-secret-0123456789";
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "mcp__everything__get-env", "arguments": {}}]}),
            json!({"text": "printed"}),
            json!({"tool_calls": [{"name": "mcp__everything__get-env", "arguments": {}}]}),
            json!({"text": "printed again"}),
        ],
    );
    let mcp = json!({"name": "everything", "command": crate::mcp::everything(), "args": [],
                     "env": [{"name": "ACP_TEST_TOKEN", "value": secret}]});
    let vars = |session: Option<String>| {
        let mut v = vec![
            ("ACP_MCP", mcp.to_string()),
            ("ACP_PROMPT", "print the environment".into()),
            ("ACP_PERMISSION", "allow_once".into()),
        ];
        v.extend(session.map(|s| ("ACP_SESSION", s)));
        v
    };
    let t = client(&env, "prompt", &["--model", &model], &vars(None));
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    let output = |t: &Value| {
        updates(t, "tool_call_update")
            .into_iter()
            .find(|u| u["status"] == "completed")
            .map(|u| {
                u["content"][0]["content"]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .unwrap_or_else(|| panic!("no completed call: {t}"))
    };
    // The server's environment has the variable, with a value that is neither the
    // placeholder nor, in anything that was journaled, the value itself.
    let printed = output(&t);
    assert!(printed.contains("ACP_TEST_TOKEN"), "{printed}");
    assert!(!printed.contains("keel-acp:withheld"), "{printed}");
    assert!(!printed.contains(secret), "{printed}");
    assert!(!contains(&store_bytes(&env), secret));

    let session = t["sessionId"].as_str().unwrap().to_owned();
    let l = client(
        &env,
        "load",
        &["--model", &model],
        &vars(Some(session.clone())),
    );
    assert_eq!(l["responses"]["prompt"]["stopReason"], "end_turn", "{l}");
    let printed = output(&l);
    assert!(printed.contains("ACP_TEST_TOKEN"), "{printed}");
    assert!(!printed.contains("keel-acp:withheld"), "{printed}");
    assert!(!contains(&store_bytes(&env), secret));
    let events = env.run(&["sessions", "events", &session]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(!events.contains("session.release_pinned"), "{events}");
}

/// `session/cancel` while a permission request is open cancels the turn at once: the client
/// has not answered (and never does here), the prompt still ends `cancelled`.
#[test]
fn acp_cancel_does_not_wait_for_an_open_permission_request() {
    let env = Env::new();
    let model = edit_a_txt(&env, &[json!({"text": "never"})]);
    let t = client(
        &env,
        "cancel",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "edit a.txt".into()),
            ("ACP_PERMISSION", "hang".into()),
            ("ACP_CANCEL_AFTER_MS", "2000".into()),
        ],
    );
    assert_eq!(t["permissions"].as_array().unwrap().len(), 1, "{t}");
    assert_eq!(t["responses"]["prompt"]["stopReason"], "cancelled", "{t}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n"
    );
}

/// `session/load` from another directory than the session's workspace is refused, naming
/// `cwd` (the editor would show files of one project and edit another's).
#[test]
fn acp_load_from_another_cwd_is_invalid_params_naming_cwd() {
    let env = Env::new();
    let model = script(&env, &[json!({"text": "hi"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[("ACP_PROMPT", "hello".into())],
    );
    let session = t["sessionId"].as_str().unwrap().to_owned();
    std::fs::create_dir_all(env.path("other")).unwrap();
    let l = client(
        &env,
        "load",
        &["--model", &model],
        &[
            ("ACP_SESSION", session),
            ("ACP_CWD", env.path("other").to_string_lossy().into_owned()),
        ],
    );
    assert_eq!(l["errors"]["load"]["code"], -32602, "{l}");
    assert_eq!(l["errors"]["load"]["data"]["field"], "cwd", "{l}");
    assert!(updates(&l, "user_message_chunk").is_empty(), "{l}");
}

/// What loading the workspace's keel.toml noticed (an untrusted file's ignored sections)
/// reaches the editor as an agent message, once.
#[test]
fn acp_config_notices_reach_the_editor_once_per_session() {
    let env = Env::new();
    env.write(
        "ws/keel.toml",
        "[mcp_servers.x]\ncommand = \"definitely-not-run\"\n",
    );
    let model = script(&env, &[json!({"text": "answer"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[("ACP_PROMPT", "hello".into())],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    let said = text_of(&t, "agent_message_chunk");
    assert_eq!(
        said.matches("sets `mcp_servers`; ignored").count(),
        1,
        "{said}"
    );
    assert!(said.ends_with("answer"), "{said}");
}

/// Updates arrive in the order things happened: each call's `tool_call` before its
/// `tool_call_update`s (in_progress before completed), the model's text in order around
/// them; and a tool's control characters never reach the editor.
#[test]
fn acp_updates_come_in_order_and_tool_output_has_no_control_characters() {
    let env = Env::new();
    env.write("ws/a.txt", "line one\n");
    let model = script(
        &env,
        &[
            json!({"text": "first ", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}),
            json!({"text": "second ", "tool_calls": [{"name": "shell", "arguments": {"command": "printf 'a\\033[2J\\rb\\tc\\n'"}}]}),
            json!({"text": "third"}),
        ],
    );
    let t = client(
        &env,
        "prompt",
        &["--model", &model, "--permission-mode", "bypass"],
        &[("ACP_PROMPT", "go".into())],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    let mut seen: Vec<String> = Vec::new();
    let mut text = String::new();
    let mut trace = Vec::new();
    for u in t["updates"].as_array().unwrap() {
        match u["sessionUpdate"].as_str().unwrap() {
            "tool_call" => {
                seen.push(u["toolCallId"].as_str().unwrap().to_owned());
                trace.push(format!("call{}", seen.len()));
            }
            "tool_call_update" => {
                let id = u["toolCallId"].as_str().unwrap();
                let n = seen
                    .iter()
                    .position(|s| s == id)
                    .unwrap_or_else(|| panic!("tool_call_update before its tool_call: {t}"));
                trace.push(format!("{}{}", u["status"].as_str().unwrap(), n + 1));
            }
            "agent_message_chunk" => {
                let chunk = u["content"]["text"].as_str().unwrap();
                text.push_str(chunk);
                match trace.last_mut() {
                    Some(last) if last.starts_with("text:") => last.push_str(chunk),
                    _ => trace.push(format!("text:{chunk}")),
                }
            }
            _ => {}
        }
    }
    let trace: Vec<&str> = trace.iter().map(|s| s.trim()).collect();
    assert_eq!(
        trace,
        [
            "text:first",
            "call1",
            "in_progress1",
            "completed1",
            "text:second",
            "call2",
            "in_progress2",
            "completed2",
            "text:third",
        ],
        "{t}"
    );
    assert_eq!(text, "first second third");
    let shell = updates(&t, "tool_call_update")
        .into_iter()
        .rfind(|u| u["status"] == "completed")
        .unwrap()["content"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(shell.contains("a\u{FFFD}[2J\u{FFFD}b\tc\n"), "{shell:?}");
    assert!(
        !shell
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
    );
}
