//! MCP servers in a release made over the API: `keel run --server` sends the configured
//! `[mcp_servers]` in the release, the server runs them (a stdio one only where
//! `[server] release_mcp_stdio` allows) and the call goes through the same policy as locally.

use super::{Options, remote, result_line, serve_with};
use crate::common::{Env, stderr, stdout};
use crate::mcp::{SCRIPT, everything};

fn run(env: &Env, s: &super::Served, mode: &str) -> std::process::Output {
    let ws = env.ws().display().to_string();
    remote(
        env,
        s,
        &[
            "run",
            "--workspace",
            &ws,
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "--permission-mode",
            mode,
            "do the task",
        ],
    )
}

#[test]
fn a_release_s_stdio_server_runs_only_where_the_server_allows_it() {
    let env = Env::new();
    env.write("script.jsonl", SCRIPT);
    std::fs::create_dir_all(env.ws()).unwrap();
    env.write(
        "config/keel/keel.toml",
        &format!("[mcp_servers.everything]\ncommand = {:?}\n", everything()),
    );

    // Default: the server refuses the release, naming the field; nothing runs.
    let mut s = serve_with(&env, &Options::default());
    let o = run(&env, &s, "default");
    assert_eq!(o.status.code(), Some(1), "{}\n{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("mcp_servers") && err.contains("release_mcp_stdio"),
        "{err}"
    );

    // Allowed: the call asks in `default` like any MCP tool (a server cannot declare itself
    // safe), and runs in `bypass`.
    env.write(
        "config/keel/server.toml",
        &format!(
            "[server]\nworkspace_roots = [{:?}]\nallow_script_models = true\nrelease_mcp_stdio = true\nmax_permission_mode = \"bypass\"\n",
            env.dir.path().display().to_string()
        ),
    );
    s.signal("TERM");
    s.wait_exit(30);
    s.restart(&env, &[]);
    let o = run(&env, &s, "default");
    assert_eq!(o.status.code(), Some(3), "{}\n{}", stdout(&o), stderr(&o));
    let result = result_line(&o);
    assert_eq!(
        result["pending"][0]["tool_name"], "mcp__everything__echo",
        "{result}"
    );
    let o = run(&env, &s, "bypass");
    assert_eq!(o.status.code(), Some(0), "{}\n{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Echo: hi from the model"),
        "{}",
        stdout(&o)
    );
}
