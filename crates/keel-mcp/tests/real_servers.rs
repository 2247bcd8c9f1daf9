//! Against the reference servers, installed from npm and PyPI (pinned in `.ci/run`):
//! `@modelcontextprotocol/server-everything` (stdio and streamable HTTP),
//! `@modelcontextprotocol/server-filesystem` and `mcp-server-git`. Every assertion is derived
//! from the server's own `tools/list` (fetched here by a plain JSON-RPC exchange, not through
//! keel), not from tool names written in this file.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use keel_mcp::McpServerConfig;
use keel_mcp::naming::tool_name;
use keel_mcp::tool::{effect_of, strict_schema};
use keel_tools::ToolResultStatus;
use keel_tools::policy::{PermissionMode, Policy, Verdict};
use keel_tools::registry::ToolCallRequest;
use serde_json::{Value, json};

use crate::common::{Fixture, assert_result, eventually, installed, stdio};

/// The server's `tools/list`, by a session-based handshake written out by hand, declaring
/// what keel declares (`roots`: some servers list tools only for clients that have it).
fn raw_tools(command: &str, args: &[&str]) -> Vec<Value> {
    let mut child = Command::new(command)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |m: Value| writeln!(stdin, "{m}").unwrap();
    let mut recv = |id: u64| loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "{command} closed its output"
        );
        let m: Value = serde_json::from_str(&line).unwrap();
        if m["id"] == id {
            return m;
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": false}},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    recv(1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let tools = recv(2)["result"]["tools"].as_array().unwrap().clone();
    let _ = child.kill();
    let _ = child.wait();
    tools
}

fn required(tool: &Value) -> Vec<String> {
    tool["inputSchema"]["required"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn read_only(tool: &Value) -> bool {
    tool["annotations"]["readOnlyHint"] == true
}

/// What every server must show: the same tools under `mcp__<server>__…`, their schemas (made
/// strict), their hints as effect classes, and no tool that runs without asking in `default`
/// or `accept_edits` mode.
fn assert_mirrors(f: &Fixture, server: &str, raw: &[Value]) {
    let expected: BTreeSet<String> = raw
        .iter()
        .map(|t| tool_name(server, t["name"].as_str().unwrap()))
        .collect();
    let shown: BTreeSet<String> = f
        .names()
        .into_iter()
        .filter(|n| n.starts_with(&format!("mcp__{server}__")))
        .collect();
    assert_eq!(
        shown, expected,
        "{server}: the model sees exactly the listed tools"
    );
    for t in raw {
        let name = tool_name(server, t["name"].as_str().unwrap());
        let spec = f
            .registry
            .specs()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap();
        let listed: rmcp::model::Tool = serde_json::from_value(t.clone()).unwrap();
        assert_eq!(
            spec.input_schema,
            strict_schema(&listed.input_schema),
            "{name}"
        );
        assert_eq!(spec.effect, effect_of(&listed), "{name}");
        let args = json!({});
        let call = ToolCallRequest {
            call_id: "c".into(),
            name: name.clone(),
            arguments: args,
        };
        if let Ok(valid) = f.registry.validate(&call) {
            for mode in [PermissionMode::Default, PermissionMode::AcceptEdits] {
                let (decision, _) =
                    f.registry
                        .authorize(&valid, &f.ctx.workspace, &Policy::new(mode));
                assert_eq!(
                    decision.verdict,
                    Verdict::Ask,
                    "{name} in {mode:?}: {}",
                    decision.reason
                );
            }
        }
    }
}

fn everything() -> String {
    installed("node_modules/.bin/mcp-server-everything")
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let command = everything();
    let raw = raw_tools(&command, &[]);
    assert!(!raw.is_empty());
    let f = Fixture::start(|_| {
        let mut config = stdio(&command, &[]);
        config
            .env
            .insert("KEEL_MCP_MARKER".into(), "set-by-config".into());
        vec![("everything", config)]
    })
    .await;
    assert!(f.notices.is_empty(), "{:?}", f.notices);
    assert_mirrors(&f, "everything", &raw);

    // A tool that takes one required string: it gets our text and answers with it.
    let one_string = raw
        .iter()
        .find(|t| {
            required(t).len() == 1
                && t["inputSchema"]["properties"][&required(t)[0]]["type"] == "string"
                && t["inputSchema"]["properties"].as_object().unwrap().len() == 1
        })
        .expect("a tool with one string argument");
    let name = tool_name("everything", one_string["name"].as_str().unwrap());
    let arg = required(one_string)[0].clone();
    let result = f.call(&name, json!({ arg: "hello from keel" })).await;
    assert_result(&result, ToolResultStatus::Succeeded, "hello from keel");

    // Tools that need no argument and claim to be read-only: together they show an image
    // (mapped to a placeholder line), the server's environment (scrubbed, plus ours) and the
    // roots keel answered (the workspace).
    let mut texts = String::new();
    for t in raw
        .iter()
        .filter(|t| required(t).is_empty() && read_only(t))
    {
        let name = tool_name("everything", t["name"].as_str().unwrap());
        let result = f.call(&name, json!({})).await;
        texts.push_str(&result.content);
        texts.push('\n');
    }
    assert!(texts.contains("[image: image/png"), "{texts}");
    assert!(
        texts.contains("set-by-config"),
        "the configured env var reaches the server: {texts}"
    );
    let root = f.dir.path().canonicalize().unwrap();
    assert!(
        texts.contains(&format!("file://{}", root.display())),
        "roots: {texts}"
    );
    for (var, _) in std::env::vars() {
        if keel_tools::sandbox::is_secret_env_name(&var) {
            assert!(
                !texts.contains(&format!("\"{var}\"")),
                "{var} leaked to the server"
            );
        }
    }

    // A tool that reports progress (it has `steps` and `duration`): progress reaches the sink.
    if let Some(t) = raw.iter().find(|t| {
        let p = &t["inputSchema"]["properties"];
        p.get("steps").is_some() && p.get("duration").is_some()
    }) {
        let name = tool_name("everything", t["name"].as_str().unwrap());
        let result = f.call(&name, json!({"duration": 1, "steps": 2})).await;
        assert_eq!(
            result.status,
            ToolResultStatus::Succeeded,
            "{}",
            result.content
        );
        eventually("a progress notification", || async {
            !f.progress.0.lock().unwrap().is_empty()
        })
        .await;
    }
    f.manager.shutdown().await;
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let command = everything();
    let raw = raw_tools(&command, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new(&command)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually("server-everything listening", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let f = Fixture::start(|_| {
        vec![(
            "web",
            McpServerConfig {
                url: Some(url),
                headers: [(
                    "X-Keel-Test".to_owned(),
                    keel_mcp::config::HeaderValueSpec::FromEnv {
                        env: "HOME".into(),
                        prefix: Some("home=".into()),
                    },
                )]
                .into(),
                ..McpServerConfig::default()
            },
        )]
    })
    .await;
    assert!(f.notices.is_empty(), "{:?}", f.notices);
    assert_mirrors(&f, "web", &raw);
    let echo = raw
        .iter()
        .find(|t| {
            required(t).len() == 1 && t["inputSchema"]["properties"].as_object().unwrap().len() == 1
        })
        .unwrap();
    let arg = required(echo)[0].clone();
    let name = tool_name("web", echo["name"].as_str().unwrap());
    let result = f.call(&name, json!({ arg: "over http" })).await;
    assert_result(&result, ToolResultStatus::Succeeded, "over http");
    f.manager.shutdown().await;
    let _ = server.kill().await;
}

#[tokio::test]
async fn server_filesystem_reads_inside_its_root_and_refuses_outside() {
    let command = installed("node_modules/.bin/mcp-server-filesystem");
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    let root_arg = root_path.to_string_lossy().into_owned();
    let raw = raw_tools(&command, &[&root_arg]);
    let f = Fixture::start(|ws| {
        std::fs::write(ws.join("hello.txt"), "hello from keel's workspace").unwrap();
        vec![("fs", stdio(&command, &[&ws.to_string_lossy()]))]
    })
    .await;
    assert!(f.notices.is_empty(), "{:?}", f.notices);
    assert_mirrors(&f, "fs", &raw);
    let file = f.dir.path().canonicalize().unwrap().join("hello.txt");
    let path_tools: Vec<&Value> = raw
        .iter()
        .filter(|t| read_only(t) && required(t) == ["path"])
        .collect();
    assert!(!path_tools.is_empty());
    let mut read = false;
    for t in &path_tools {
        let name = tool_name("fs", t["name"].as_str().unwrap());
        let result = f.call(&name, json!({"path": file})).await;
        read |= result.content.contains("hello from keel's workspace");
        let outside = f.call(&name, json!({"path": "/etc/passwd"})).await;
        assert_eq!(
            outside.status,
            ToolResultStatus::Failed,
            "{name}: {}",
            outside.content
        );
    }
    assert!(read, "no read-only path tool returned the file's text");
    f.manager.shutdown().await;
}

#[tokio::test]
async fn mcp_server_git_shows_the_workspace_history() {
    let command = installed("venv/bin/mcp-server-git");
    let probe = tempfile::tempdir().unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        let status = Command::new("git")
            .args([
                "-c",
                "user.name=keel",
                "-c",
                "user.email=keel@example.invalid",
            ])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(probe.path(), &["init", "-q"]);
    let probe_arg = probe.path().to_string_lossy().into_owned();
    let raw = raw_tools(&command, &["--repository", &probe_arg]);
    let f = Fixture::start(|ws| {
        git(ws, &["init", "-q"]);
        std::fs::write(ws.join("a.txt"), "a").unwrap();
        git(ws, &["add", "a.txt"]);
        git(ws, &["commit", "-q", "-m", "the first commit keel sees"]);
        vec![(
            "git",
            stdio(&command, &["--repository", &ws.to_string_lossy()]),
        )]
    })
    .await;
    assert!(f.notices.is_empty(), "{:?}", f.notices);
    assert_mirrors(&f, "git", &raw);
    let repo = f.dir.path().canonicalize().unwrap();
    let mut seen = false;
    for t in raw
        .iter()
        .filter(|t| read_only(t) && required(t) == ["repo_path"])
    {
        let name = tool_name("git", t["name"].as_str().unwrap());
        let result = f.call(&name, json!({"repo_path": repo})).await;
        assert_eq!(
            result.status,
            ToolResultStatus::Succeeded,
            "{name}: {}",
            result.content
        );
        seen |= result.content.contains("the first commit keel sees");
    }
    assert!(seen, "no read-only repo tool showed the commit");
    f.manager.shutdown().await;
}
