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
    let run = run_script(&env, &s, &["--output", "jsonl", "go"]);
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

/// `[memory] namespace = "user"`: on a server the user is the principal of whoever created the
/// session, which the CLI cannot derive from its key: `keel --server URL memory list` says to
/// name it with `--namespace` (exit 2, usage), and works with it.
#[test]
fn user_memory_over_a_server_needs_the_namespace_flag_and_says_so() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "[memory]\nenabled = true\nnamespace = \"user\"\n",
    );
    let s = serve(&env);
    let list = remote(&env, &s, &["memory", "list"]);
    assert_eq!(list.status.code(), Some(2), "{}", stderr(&list));
    assert!(stderr(&list).contains("--namespace"), "{}", stderr(&list));
    let named = remote(&env, &s, &["memory", "list", "--namespace", "user:someone"]);
    assert!(named.status.success(), "{}", stderr(&named));
    assert_eq!(stdout(&named).trim(), "(no entries in user:someone)");
}

/// A slash command as the first prompt of a headless run on a server is answered locally by the
/// server's input pipeline: its answer is printed and the run exits 0.
#[test]
fn a_headless_slash_command_on_a_server_prints_its_answer_and_exits_0() {
    let env = Env::new();
    env.write("script.jsonl", "{\"text\":\"never sampled\"}\n");
    let s = serve(&env);
    let run = run_script(&env, &s, &["/help"]);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&run),
        stderr(&run)
    );
    assert!(stdout(&run).contains("/cost"), "{}", stdout(&run));
    assert!(
        !stderr(&run).contains("nothing to continue"),
        "{}",
        stderr(&run)
    );
    // As locally: with `--output jsonl` the answer is one `command` line, and the session the
    // command ran in (it never had a turn) is not kept; nor does `/clear` make another.
    for command in ["/status", "/clear"] {
        let run = run_script(&env, &s, &["--output", "jsonl", command]);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        let out = stdout(&run);
        let line: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{command}: not one JSON line ({e}): {out}"));
        assert_eq!(line["type"], "command", "{out}");
        assert_eq!(line["command"], &command[1..], "{out}");
    }
    let listed = remote(&env, &s, &["sessions", "list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(stdout(&listed).trim(), "", "no session kept");
}

/// `keel --server URL run --workspace WS --model script:script.jsonl ARGS…`.
fn run_script(env: &Env, s: &super::Served, args: &[&str]) -> std::process::Output {
    let ws = env.ws().display().to_string();
    let model = format!("script:{}", env.path("script.jsonl").display());
    let mut all = vec!["run", "--workspace", &ws, "--model", &model];
    all.extend_from_slice(args);
    remote(env, s, &all)
}
