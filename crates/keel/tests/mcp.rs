//! MCP tools in a run: a scripted model calls a tool of `@modelcontextprotocol/server-everything`
//! (npm, installed by `.ci/run` into `KEEL_MCP_SERVERS_DIR`) through the same policy as every
//! tool: it runs in `bypass`, and in `default` it waits for a human although the server hints
//! it read-only.

use crate::common::{Env, run_script};

pub(crate) fn everything() -> String {
    let dir = std::env::var_os("KEEL_MCP_SERVERS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/keel-ci/mcp")
        });
    let path = dir.join("node_modules/.bin/mcp-server-everything");
    assert!(
        path.exists(),
        "{} is not installed: run .ci/run (or the README's \"MCP test servers\" commands)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

pub(crate) const SCRIPT: &str = concat!(
    r#"{"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "hi from the model"}}]}"#,
    "\n",
    r#"{"text": "done"}"#,
    "\n"
);

#[test]
fn a_run_calls_an_mcp_tool_through_the_same_policy() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        &format!("[mcp_servers.everything]\ncommand = {:?}\n", everything()),
    );
    std::fs::create_dir_all(env.ws()).unwrap();
    let (code, lines) = run_script(&env, SCRIPT, &["--permission-mode", "bypass"]);
    let text: String = lines.iter().map(|l| l.to_string()).collect();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("Echo: hi from the model"), "{text}");

    let (code, lines) = run_script(&env, SCRIPT, &["--permission-mode", "default"]);
    let text: String = lines.iter().map(|l| l.to_string()).collect();
    assert_eq!(code, Some(3), "requires_action: {text}");
    let result = lines.last().unwrap();
    assert_eq!(
        result["pending"][0]["tool_name"], "mcp__everything__echo",
        "{text}"
    );
    assert!(!text.contains("Echo: hi from the model"), "{text}");
}
