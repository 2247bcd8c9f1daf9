//! Long-term memory from the command line (issue 15, item 3): `[memory]` in the user config
//! gives runs the memory tools, what one session writes another reads, and `keel memory
//! list|get|rm` shows and forgets it; a repository's `[memory]` applies only when the
//! workspace is trusted.

use serde_json::Value;

use crate::common::{Env, run_script, stderr, stdout, trusted_line};

const WRITE: &str = "{\"tool_calls\":[{\"name\":\"memory_write\",\"arguments\":{\"key\":\"build\",\"value\":\"run cargo nextest, not cargo test\"}}]}\n{\"tool_calls\":[{\"name\":\"memory_write\",\"arguments\":{\"namespace\":\"people\",\"key\":\"owner\",\"value\":{\"name\":\"Ada\"}}}]}\n{\"text\":\"noted\"}\n";
const READ: &str = "{\"tool_calls\":[{\"name\":\"memory_read\",\"arguments\":{\"key\":\"build\"}}]}\n{\"text\":\"ok\"}\n";

/// The outputs of the run's `tool_call.finished` lines.
fn outputs(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .map(|l| l["payload"]["output"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn memory_written_in_one_run_is_read_in_the_next_and_keel_memory_lists_gets_and_forgets_it() {
    let env = Env::new();
    env.write(
        "config/keel/keel.toml",
        "[memory]\nenabled = true\n[policy]\nallow = [\"memory_write\"]\n",
    );
    let (exit, lines) = run_script(&env, WRITE, &[]);
    assert_eq!(exit, Some(0), "{lines:#?}");
    let out = outputs(&lines);
    assert!(out[0].starts_with("Remembered \"build\""), "{out:?}");
    let (exit, lines) = run_script(&env, READ, &[]);
    assert_eq!(exit, Some(0));
    assert!(
        outputs(&lines)[0].contains("run cargo nextest, not cargo test"),
        "another session reads it: {lines:#?}"
    );

    let list = env.run(&["memory", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.starts_with("build  ") && text.contains("\"run cargo nextest, not cargo test\""),
        "{text}"
    );
    // The model's sub-namespace is named, with how many entries it holds.
    assert!(
        text.contains(
            "sub-namespaces (keel memory list --namespace NAME):\n  agent:keel/people  1 entry\n"
        ),
        "{text}"
    );
    let people = env.run(&[
        "memory",
        "list",
        "--namespace",
        "agent:keel/people",
        "--json",
    ]);
    let row: Value = serde_json::from_str(stdout(&people).trim()).unwrap();
    assert_eq!(row["key"], "owner");
    assert_eq!(row["value"]["name"], "Ada");
    let found = env.run(&["memory", "list", "--search", "NEXTEST cargo"]);
    assert!(stdout(&found).starts_with("build  "), "{}", stdout(&found));
    let none = env.run(&["memory", "list", "--search", "python"]);
    assert_eq!(stdout(&none).trim(), "(no entries in agent:keel)");

    let get = env.run(&["memory", "get", "build"]);
    assert_eq!(stdout(&get), "run cargo nextest, not cargo test\n");
    let rm = env.run(&["memory", "rm", "build"]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    assert_eq!(stdout(&rm).trim(), "forgot \"build\" in agent:keel");
    let again = env.run(&["memory", "get", "build"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("no memory entry \"build\" in namespace agent:keel"),
        "{}",
        stderr(&again)
    );
    let (_, lines) = run_script(&env, READ, &[]);
    assert!(outputs(&lines)[0].contains("No memory entry \"build\""));
}

#[test]
fn memory_is_off_by_default_and_a_workspaces_memory_section_needs_trust() {
    let env = Env::new();
    // Off by default: the model has no memory tools.
    let (_, lines) = run_script(&env, READ, &[]);
    let out = outputs(&lines);
    assert!(out[0].contains("memory_read"), "{out:?}");
    assert!(!out[0].contains("No memory entry"), "{out:?}");

    // An untrusted repository's [memory] is dropped with a notice.
    env.write(
        "ws/keel.toml",
        "[memory]\nenabled = true\nnamespace = \"shared\"\n",
    );
    env.write("script.jsonl", READ);
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "go"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(
        err.contains("ws/keel.toml sets `memory`; ignored") && err.contains("keel trust"),
        "{err}"
    );
    assert!(!outputs(&crate::common::jsonl_lines(&out.stdout))[0].contains("No memory entry"));

    // Trusted, it applies (namespace shared).
    env.write("config/keel/keel.toml", &trusted_line(&env));
    let (_, lines) = run_script(&env, READ, &[]);
    assert!(
        outputs(&lines)[0].contains("No memory entry \"build\""),
        "{lines:#?}"
    );

    // A bad value names the field.
    env.write(
        "config/keel/keel.toml",
        "[memory]\nenabled = true\nnamespace = \"team\"\n",
    );
    let out = env.run(&["memory", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("memory.namespace") && stderr(&out).contains("agent, user or shared"),
        "{}",
        stderr(&out)
    );
}
