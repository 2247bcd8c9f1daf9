//! `keel acp` driven as a subprocess by a real ACP client written by others: the client side
//! of the official TypeScript SDK (`@agentclientprotocol/sdk`, installed by `.ci/run` into
//! `KEEL_ACP_CLIENT_DIR`) in `tests/acp/client.mjs`, over a scripted model.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common::Env;

fn sdk_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_ACP_CLIENT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel-ci/acp")
        });
    let sdk = dir.join("node_modules/@agentclientprotocol/sdk/package.json");
    assert!(
        sdk.exists(),
        "{} is not installed: run .ci/run (it installs @agentclientprotocol/sdk into $KEEL_ACP_CLIENT_DIR)",
        sdk.display()
    );
    dir
}

/// Runs the test client's `scenario` against `keel acp ARGS` in `env`; `vars` are the
/// client's settings (ACP_*). Returns its transcript.
pub(crate) fn client(env: &Env, scenario: &str, args: &[&str], vars: &[(&str, String)]) -> Value {
    let keel = env.keel();
    let mut c = Command::new("node");
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acp/client.mjs"))
        .arg(scenario)
        .current_dir(env.path(""))
        .env("KEEL_ACP_CLIENT_DIR", sdk_dir())
        .env("KEEL_BIN", env!("CARGO_BIN_EXE_keel"))
        .env("KEEL_ARGS", serde_json::to_string(args).unwrap())
        .env("ACP_CWD", env.ws());
    for (k, v) in keel.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c.stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "client {scenario} failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("client {scenario} printed no transcript ({e}): {text}"))
}

pub(crate) fn updates<'a>(t: &'a Value, kind: &str) -> Vec<&'a Value> {
    t["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == kind)
        .collect()
}

pub(crate) fn text_of(t: &Value, kind: &str) -> String {
    updates(t, kind)
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

/// `ws/a.txt` holding `line one`, and a scripted model whose first step edits it to `line two`
/// and whose next steps are `then`.
pub(crate) fn edit_a_txt(env: &Env, then: &[Value]) -> String {
    env.write("ws/a.txt", "line one\n");
    let mut lines = vec![
        json!({"tool_calls": [{"name": "edit_file", "arguments": {"path": "a.txt", "old_string": "one", "new_string": "two"}}]}),
    ];
    lines.extend_from_slice(then);
    script(env, &lines)
}

pub(crate) fn script(env: &Env, lines: &[Value]) -> String {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    env.write("script.jsonl", &text);
    format!("script:{}", env.path("script.jsonl").display())
}

#[test]
fn acp_prompt_reads_calls_mcp_edits_with_permission_and_load_replays_it() {
    let env = Env::new();
    env.write("ws/a.txt", "line one\n");
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}),
            json!({"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "hello from acp"}}]}),
            json!({"text": "Now the edit.", "tool_calls": [{"name": "edit_file", "arguments": {"path": "a.txt", "old_string": "one", "new_string": "two"}}]}),
            json!({"text": "done editing"}),
        ],
    );
    let mcp =
        json!({"name": "everything", "command": crate::mcp::everything(), "args": [], "env": []});
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "change one to two in a.txt".into()),
            ("ACP_MCP", mcp.to_string()),
            ("ACP_PERMISSION", "allow_once".into()),
        ],
    );
    let init = &t["responses"]["initialize"];
    assert_eq!(init["protocolVersion"], 1, "{t}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    assert_eq!(init["authMethods"][0]["id"], "provider_key_env");
    assert_eq!(t["responses"]["new"]["modes"]["currentModeId"], "default");
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    // The read: kind and location.
    let calls = updates(&t, "tool_call");
    assert_eq!(calls.len(), 3, "{t}");
    assert_eq!(calls[0]["kind"], "read");
    assert_eq!(
        calls[0]["locations"][0]["path"],
        env.ws().join("a.txt").to_string_lossy().as_ref()
    );
    // The MCP server passed in session/new ran the call (after the editor allowed it).
    assert_eq!(calls[1]["title"], "mcp__everything__echo");
    let finished: Vec<_> = updates(&t, "tool_call_update")
        .into_iter()
        .filter(|u| u["status"] == "completed")
        .collect();
    assert_eq!(finished.len(), 3, "{t}");
    assert!(
        finished[1]["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("hello from acp"),
        "{t}"
    );
    // The edit: a diff, asked about with the three options, then applied.
    assert_eq!(calls[2]["kind"], "edit");
    assert_eq!(calls[2]["content"][0]["type"], "diff");
    assert_eq!(calls[2]["content"][0]["newText"], "two");
    let asks = t["permissions"].as_array().unwrap();
    assert_eq!(asks.len(), 2, "{t}");
    assert_eq!(asks[1]["toolCall"]["toolCallId"], calls[2]["toolCallId"]);
    let kinds: Vec<_> = asks[1]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"]);
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line two\n"
    );
    // Streaming: the model's text arrives as message chunks.
    let said = text_of(&t, "agent_message_chunk");
    assert!(
        said.contains("Now the edit.") && said.ends_with("done editing"),
        "{said}"
    );

    // A new connection loads the finished session: its history comes back as updates.
    let session = t["sessionId"].as_str().unwrap().to_owned();
    let l = client(
        &env,
        "load",
        &["--model", &model],
        &[("ACP_SESSION", session)],
    );
    assert!(l["errors"].as_object().unwrap().is_empty(), "{l}");
    // Live, the model's text after the edit came after the edit's result.
    let order: Vec<&str> = t["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| {
            (u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed")
                .then_some("done")
                .or((u["content"]["text"] == "done editing").then_some("text"))
        })
        .collect();
    assert_eq!(order, ["done", "done", "done", "text"], "{t}");
    assert_eq!(
        text_of(&l, "user_message_chunk"),
        "change one to two in a.txt"
    );
    assert_eq!(
        text_of(&l, "agent_message_chunk"),
        "Now the edit.done editing"
    );
    let replayed: Vec<_> = updates(&l, "tool_call")
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or("other").to_owned())
        .collect();
    assert_eq!(replayed, ["read", "other", "edit"]);
}

#[test]
fn acp_rejected_edit_is_not_applied_and_the_model_is_told() {
    let env = Env::new();
    let model = edit_a_txt(&env, &[json!({"text": "leaving it"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "edit a.txt".into()),
            ("ACP_PERMISSION", "reject_once".into()),
        ],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    assert_eq!(t["permissions"].as_array().unwrap().len(), 1);
    let failed: Vec<_> = updates(&t, "tool_call_update")
        .into_iter()
        .filter(|u| u["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{t}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n"
    );
}

#[test]
fn acp_cancel_mid_turn_stops_with_cancelled() {
    let env = Env::new();
    let model = script(&env, &[json!({"delay_ms": 60000, "text": "too late"})]);
    let t = client(
        &env,
        "cancel",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "take your time".into()),
            ("ACP_CANCEL_AFTER_MS", "1500".into()),
        ],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "cancelled", "{t}");
    assert!(!text_of(&t, "agent_message_chunk").contains("too late"));
}

#[test]
fn acp_missing_provider_key_is_auth_required_naming_the_variable() {
    let env = Env::new();
    let t = client(&env, "prompt", &["--model", "openai:gpt-5"], &[]);
    let e = &t["errors"]["new"];
    assert_eq!(e["code"], -32000, "{t}");
    assert_eq!(e["data"]["env_var"], "OPENAI_API_KEY", "{t}");
}

#[test]
fn acp_disconnect_leaves_the_approval_pending_for_keel_approve_and_load_resumes() {
    let env = Env::new();
    let model = edit_a_txt(
        &env,
        &[json!({"text": "edited"}), json!({"text": "second answer"})],
    );
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "edit a.txt".into()),
            ("ACP_PERMISSION", "disconnect".into()),
        ],
    );
    let session = t["permissions"][0]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let show = env.run(&["sessions", "show", &session, "--json"]);
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    let pending = shown["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{shown}");
    let id = pending[0]["approval_id"].as_str().unwrap();
    let approve = env.run(&["approve", id]);
    assert!(approve.status.success(), "{approve:?}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n"
    );
    // After session/load, the next prompt first finishes the waiting turn; a marker naming
    // the new input separates the two answers.
    let l = client(
        &env,
        "load",
        &["--model", &model],
        &[("ACP_SESSION", session), ("ACP_PROMPT", "and now?".into())],
    );
    assert_eq!(l["responses"]["prompt"]["stopReason"], "end_turn", "{l}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line two\n"
    );
    assert!(
        text_of(&l, "agent_message_chunk")
            .ends_with("edited\n\n(keel: the earlier turn ended; now: and now?)\n\nsecond answer"),
        "{l}"
    );
}

#[test]
fn acp_malformed_json_rpc_gets_protocol_errors_and_stdout_stays_protocol() {
    let env = Env::new();
    let mut child = env
        .keel()
        .args(["acp", "--model", "script:none.jsonl"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in [
        "{not json",
        "[1, 2]",
        r#"{"id": 3, "method": "initialize"}"#,
        r#"{"jsonrpc": "2.0", "id": 4, "method": "no/such_method", "params": {}}"#,
        r#"{"jsonrpc": "2.0", "id": 5, "method": "session/prompt", "params": {"nope": 1}}"#,
        r#"{"jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {"protocolVersion": "x"}}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut codes = Vec::new();
    for _ in 0..6 {
        let line = lines.next().unwrap().unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
        // README "Editors (ACP)": the useful text as `message`, not the code's generic name,
        // and `data` `{"reason", "message", ...}` with the same text.
        let e = &v["error"];
        let message = e["message"].as_str().unwrap_or_default();
        assert!(
            ![
                "Parse error",
                "Invalid Request",
                "Method not found",
                "Invalid params"
            ]
            .contains(&message),
            "{line}"
        );
        assert_eq!(e["data"]["message"], message, "{line}");
        assert!(e["data"]["reason"].as_str().is_some(), "{line}");
        if v["id"] == json!(6) {
            assert_eq!(e["data"]["reason"], "invalid_params", "{line}");
            assert_eq!(e["data"]["field"], "protocolVersion", "{line}");
        }
        codes.push((v["id"].clone(), e["code"].as_i64().unwrap()));
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    codes.sort_by_key(|(id, c)| (*c, id.to_string()));
    assert_eq!(
        codes,
        [
            (Value::Null, -32700),
            (json!(5), -32602),
            (json!(6), -32602),
            (json!(4), -32601),
            (json!(3), -32600),
            (Value::Null, -32600),
        ]
    );
}

#[test]
fn acp_file_tools_go_through_the_editor_buffers_when_offered() {
    let env = Env::new();
    env.write("ws/a.txt", "line one\n");
    let path = env.ws().join("a.txt").to_string_lossy().into_owned();
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}),
            json!({"tool_calls": [{"name": "edit_file", "arguments": {"path": "a.txt", "old_string": "one", "new_string": "two"}}]}),
            json!({"text": "edited the buffer"}),
        ],
    );
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "edit a.txt".into()),
            ("ACP_PERMISSION", "allow_once".into()),
            (
                "ACP_FS",
                json!({ path.clone(): "unsaved one\n" }).to_string(),
            ),
        ],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    // The read saw the editor's unsaved text; the edit (asked about, journaled as an effect)
    // went to the editor, not to the disk.
    let done: Vec<_> = updates(&t, "tool_call_update")
        .into_iter()
        .filter(|u| u["status"] == "completed")
        .collect();
    assert!(
        done[0]["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("unsaved one"),
        "{t}"
    );
    assert_eq!(t["permissions"].as_array().unwrap().len(), 1, "{t}");
    assert_eq!(t["fsWrites"][0]["path"], path.as_str());
    assert_eq!(t["fsWrites"][0]["content"], "unsaved two\n");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n"
    );
    let session = t["sessionId"].as_str().unwrap();
    let events = env.run(&["sessions", "events", session]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("effect.committed"), "{events}");
}

/// An `@path` mention attaches the file when the editor offers its file system too (Zed does):
/// the input pipeline reads it before the turn exists, with the local tool under the same
/// checks — it failed with "no session" (new-user review of issue 17).
#[test]
fn acp_an_at_mention_attaches_the_file_when_the_editor_offers_fs() {
    let env = Env::new();
    env.write("ws/notes.txt", "the note on disk\n");
    let path = env.ws().join("notes.txt").to_string_lossy().into_owned();
    let model = script(&env, &[json!({"text": "read it"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_PROMPT", "summarize @notes.txt".into()),
            ("ACP_FS", json!({ path: "unsaved\n" }).to_string()),
        ],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "end_turn", "{t}");
    let session = t["sessionId"].as_str().unwrap();
    let events = env.run(&["sessions", "events", session]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("the note on disk"), "{events}");
}

#[test]
fn acp_load_adds_the_clients_mcp_servers_by_re_pinning() {
    let env = Env::new();
    let model = script(
        &env,
        &[
            json!({"text": "first answer"}),
            json!({"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "after load"}}]}),
            json!({"text": "echoed"}),
        ],
    );
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[("ACP_PROMPT", "hello".into())],
    );
    let session = t["sessionId"].as_str().unwrap().to_owned();
    let mcp =
        json!({"name": "everything", "command": crate::mcp::everything(), "args": [], "env": []});
    let l = client(
        &env,
        "load",
        &["--model", &model],
        &[
            ("ACP_SESSION", session.clone()),
            ("ACP_MCP", mcp.to_string()),
            ("ACP_PROMPT", "echo something".into()),
            ("ACP_PERMISSION", "allow_once".into()),
        ],
    );
    assert_eq!(l["responses"]["prompt"]["stopReason"], "end_turn", "{l}");
    let echoed = updates(&l, "tool_call_update")
        .into_iter()
        .any(|u| u["status"] == "completed" && u.to_string().contains("after load"));
    assert!(echoed, "{l}");
    let events = env.run(&["sessions", "events", &session]);
    assert!(String::from_utf8_lossy(&events.stdout).contains("session.release_pinned"));
}

#[test]
fn acp_set_mode_accept_edits_lets_the_edit_run_without_asking() {
    let env = Env::new();
    let model = edit_a_txt(&env, &[json!({"text": "done"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[
            ("ACP_MODE", "accept_edits".into()),
            ("ACP_PROMPT", "edit a.txt".into()),
        ],
    );
    assert!(t["errors"].as_object().unwrap().is_empty(), "{t}");
    assert_eq!(
        updates(&t, "current_mode_update")[0]["currentModeId"],
        "accept_edits"
    );
    assert!(t["permissions"].as_array().unwrap().is_empty(), "{t}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line two\n"
    );
    let commands: Vec<_> = updates(&t, "available_commands_update")[0]["availableCommands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        commands,
        ["help", "cost", "status", "permissions", "compact"]
    );
}

#[test]
fn acp_stop_reasons_follow_the_readme_table() {
    // Each case is a new session over its own script (the script's position is the session's).
    let case = |lines: &[Value], extra: &[&str]| {
        let env = Env::new();
        let model = script(&env, lines);
        let mut args = vec!["--model", model.as_str()];
        args.extend_from_slice(extra);
        client(&env, "prompt", &args, &[("ACP_PROMPT", "go".into())])
    };
    // failed → a JSON-RPC error carrying Keel's reason, after a message that says why.
    let t = case(&[json!({"error": {"kind": "invalid_request"}})], &[]);
    assert_eq!(t["errors"]["prompt"]["code"], -32603, "{t}");
    assert_eq!(t["errors"]["prompt"]["data"]["terminal_reason"], "failed");
    assert!(
        text_of(&t, "agent_message_chunk").contains("the turn failed"),
        "{t}"
    );
    // A provider's content filter → refusal.
    let t = case(&[json!({"error": {"kind": "content_filter"}})], &[]);
    assert_eq!(t["responses"]["prompt"]["stopReason"], "refusal", "{t}");
    // budget_exhausted (steps) → max_turn_requests.
    let t = case(
        &[
            json!({"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}),
            json!({"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}),
            json!({"text": "never"}),
        ],
        &["--max-steps", "1"],
    );
    assert_eq!(
        t["responses"]["prompt"]["stopReason"], "max_turn_requests",
        "{t}"
    );
    assert!(
        text_of(&t, "agent_message_chunk").contains("steps budget"),
        "{t}"
    );
}

#[test]
fn acp_cancel_during_a_tool_call_gives_the_call_a_result() {
    let env = Env::new();
    let model = script(
        &env,
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}),
            json!({"text": "never"}),
        ],
    );
    let t = client(
        &env,
        "cancel",
        &["--model", &model, "--permission-mode", "bypass"],
        &[
            ("ACP_PROMPT", "wait a minute".into()),
            ("ACP_CANCEL_AFTER_MS", "2000".into()),
        ],
    );
    assert_eq!(t["responses"]["prompt"]["stopReason"], "cancelled", "{t}");
    let call = updates(&t, "tool_call")[0]["toolCallId"].clone();
    assert_eq!(updates(&t, "tool_call")[0]["kind"], "execute");
    let last = updates(&t, "tool_call_update")
        .into_iter()
        .rfind(|u| u["toolCallId"] == call)
        .cloned()
        .unwrap();
    assert_eq!(last["status"], "failed", "{t}");
    assert_eq!(last["rawOutput"]["status"], "cancelled", "{t}");
}

/// Flags `keel acp` cannot honour are a usage error (exit 2), not silently ignored.
#[test]
fn acp_refuses_flags_it_would_ignore() {
    let env = Env::new();
    for args in [
        &["acp", "--workspace", "/tmp"][..],
        &["acp", "--output", "jsonl"][..],
    ] {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("keel acp does not take"),
            "{out:?}"
        );
        assert!(out.stdout.is_empty());
    }
}

/// `keel acp --permission-mode M` is a ceiling: only modes at most as permissive are offered,
/// `session/set_mode` to a looser one is refused (invalid params), and a session loaded from a
/// looser saved mode is brought down to M — an editor could switch a `read_only` agent to
/// `bypass` (attack review of issue 17).
#[test]
fn acp_permission_mode_flag_is_a_ceiling_for_set_mode_and_load() {
    let env = Env::new();
    env.write("ws/a.txt", "line one\n");
    let edit = json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "pwned\n"}}]});
    let model = script(&env, &[edit.clone(), json!({"text": "done"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model, "--permission-mode", "read-only"],
        &[
            ("ACP_MODE", "bypass".into()),
            ("ACP_PROMPT", "write a.txt".into()),
        ],
    );
    let offered: Vec<&str> = t["responses"]["new"]["modes"]["availableModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["read_only"], "{t}");
    assert_eq!(t["errors"]["setMode"]["code"], -32602, "{t}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n"
    );

    // A session saved in bypass, loaded under --permission-mode read-only: its write is denied.
    let model = script(&env, &[edit, json!({"text": "done"})]);
    let t = client(
        &env,
        "prompt",
        &["--model", &model],
        &[("ACP_MODE", "bypass".into())],
    );
    let session = t["sessionId"].as_str().unwrap().to_owned();
    let t = client(
        &env,
        "load",
        &["--model", &model, "--permission-mode", "read-only"],
        &[
            ("ACP_SESSION", session),
            ("ACP_CWD", env.ws().to_string_lossy().into_owned()),
            ("ACP_PROMPT", "write a.txt".into()),
        ],
    );
    assert_eq!(
        t["responses"]["load"]["modes"]["currentModeId"], "read_only",
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "line one\n",
        "{t}"
    );
}
