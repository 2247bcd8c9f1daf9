//! `keel --server URL memory list|get|rm` (issue 15, item 3): what a server-run agent
//! remembered, read and forgotten through the API (`/v1/memory/…`).

use super::{remote, serve};
use crate::common::{Env, stderr, stdout};

#[test]
fn memory_a_server_run_wrote_is_listed_read_and_forgotten_over_the_server() {
    let env = Env::new();
    // The server's configuration (keel serve reads the user config): memory on, writes allowed.
    env.write(
        "config/keel/keel.toml",
        "[memory]\nenabled = true\n[policy]\nallow = [\"memory_write\"]\n",
    );
    env.write(
        "script.jsonl",
        "{\"tool_calls\":[{\"name\":\"memory_write\",\"arguments\":{\"key\":\"style\",\"value\":\"tabs, never spaces\"}}]}\n{\"text\":\"noted\"}\n",
    );
    let s = serve(&env);
    let ws = env.ws().display().to_string();
    let script = env.path("script.jsonl").display().to_string();
    let run = remote(
        &env,
        &s,
        &[
            "run",
            "--workspace",
            &ws,
            "--model",
            &format!("script:{script}"),
            "--output",
            "jsonl",
            "go",
        ],
    );
    assert!(run.status.success(), "{}\n{}", stdout(&run), stderr(&run));

    let list = remote(&env, &s, &["memory", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(stdout(&list).starts_with("style  "), "{}", stdout(&list));
    let found = remote(&env, &s, &["memory", "list", "--search", "never", "--json"]);
    let row: serde_json::Value = serde_json::from_str(stdout(&found).trim()).unwrap();
    assert_eq!(row["namespace"], "agent:keel");
    assert_eq!(row["value"], "tabs, never spaces");
    let get = remote(&env, &s, &["memory", "get", "style"]);
    assert_eq!(stdout(&get), "tabs, never spaces\n");
    let rm = remote(&env, &s, &["memory", "rm", "style"]);
    assert_eq!(stdout(&rm).trim(), "forgot \"style\" in agent:keel");
    let again = remote(&env, &s, &["memory", "rm", "style"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("no memory entry \"style\""),
        "{}",
        stderr(&again)
    );
    // The local store (another tenant, the CLI's) never saw it.
    let local = env.run(&["memory", "list"]);
    assert_eq!(stdout(&local).trim(), "(no entries in agent:keel)");
}
