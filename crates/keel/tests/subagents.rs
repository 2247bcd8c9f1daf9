//! Sub-agents from the command line: `[agents.NAME]` in keel.toml (and `.keel/agents/*.md`)
//! are the agents `spawn_agent` starts; the child's answer is the call's result, and a parent
//! in read-only mode gets no write through a child.

use crate::common::{Env, check_stream, jsonl_lines, stderr};

const PARENT: &str = r#"{"tool_calls":[{"name":"spawn_agent","arguments":{"agent":"helper","prompt":"Write a.txt, then answer."}}]}
{"text":"parent done"}
"#;

const HELPER: &str = r#"{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"from the child"}}]}
{"text":"helper finished"}
"#;

fn run(env: &Env, mode: &str) -> (Option<i32>, Vec<serde_json::Value>, String) {
    env.write("script.jsonl", PARENT);
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", mode])
        .arg("delegate")
        .output()
        .unwrap();
    (out.status.code(), jsonl_lines(&out.stdout), stderr(&out))
}

fn call_results(lines: &[serde_json::Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .map(|l| {
            (
                l["payload"]["status"].as_str().unwrap_or("").to_owned(),
                l["payload"]["output"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// An environment whose user config defines `[agents.helper]` (the `HELPER` script, may write).
fn with_helper() -> Env {
    let env = Env::new();
    env.write("helper.jsonl", HELPER);
    let helper = env.path("helper.jsonl");
    env.write(
        "config/keel/keel.toml",
        &format!(
            "[agents.helper]\nmodel = \"script:{}\"\ninstructions = \"You help.\"\ntools = [\"write_file\"]\n",
            helper.display()
        ),
    );
    env
}

#[test]
fn an_agent_from_keel_toml_answers_a_spawn_agent_call_and_inherits_read_only() {
    let env = with_helper();
    // Bypass: the child writes, and its answer is the call's result.
    let (code, lines, err) = run(&env, "bypass");
    assert_eq!(code, Some(0), "{err}");
    let result = check_stream(&lines);
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(
        call_results(&lines),
        vec![("succeeded".to_owned(), "helper finished".to_owned())]
    );
    assert!(lines.iter().any(|l| l["type"] == "agent.spawned"));
    assert!(lines.iter().any(|l| l["type"] == "agent.finished"));
    assert_eq!(
        std::fs::read_to_string(env.path("ws/a.txt")).unwrap(),
        "from the child"
    );
    // Read-only: the same child's write is refused in the child.
    std::fs::remove_file(env.path("ws/a.txt")).unwrap();
    let (code, lines, err) = run(&env, "read-only");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(check_stream(&lines)["terminal_reason"], "completed");
    assert_eq!(
        call_results(&lines),
        vec![("succeeded".to_owned(), "helper finished".to_owned())]
    );
    assert!(!env.path("ws/a.txt").exists());
}

#[test]
fn an_agent_file_of_a_trusted_workspace_is_an_agent() {
    let env = Env::new();
    env.write("helper.jsonl", HELPER);
    env.write(
        "ws/.keel/agents/helper.md",
        &format!(
            "---\nmodel: script:{}\ntools: [write_file]\n---\nYou help.\n",
            env.path("helper.jsonl").display()
        ),
    );
    // Untrusted: the file is ignored, so there is no agent to spawn.
    env.write("config/keel/keel.toml", "");
    let (code, lines, err) = run(&env, "bypass");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(".keel/agents") && err.contains("keel trust"),
        "{err}"
    );
    let results = call_results(&lines);
    assert_eq!(results[0].0, "rejected", "{results:?}");
    assert!(!env.path("ws/a.txt").exists());
    // Trusted: it is.
    env.write("config/keel/keel.toml", &crate::common::trusted_line(&env));
    let (code, lines, err) = run(&env, "bypass");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        call_results(&lines),
        vec![("succeeded".to_owned(), "helper finished".to_owned())]
    );
    assert!(env.path("ws/a.txt").exists());
}

/// A child that needs an approval while its parent runs headless: the parent's run does not
/// hang — `keel run` exits 3 and prints the child's approval like its own (labelled with the
/// agent and the child session, with the `keel approve` hint); `keel sessions show PARENT`
/// lists it; `keel approve` decides it and `keel resume PARENT` finishes child and parent.
#[test]
fn a_childs_approval_is_listed_on_the_parent_and_decided_with_keel_approve() {
    let env = with_helper();
    env.write("script.jsonl", PARENT);
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .arg("delegate")
        .output()
        .unwrap();
    let printed = format!("{}{}", crate::common::stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(3), "{printed}");
    assert!(
        printed.contains("needs approval: write_file (agent `helper`, session "),
        "{printed}"
    );
    assert!(printed.contains("keel approve "), "{printed}");
    // One JSON object a line; the parent is the session whose view lists an agent's approval
    // (the child's own view lists it unlabelled).
    let list = crate::common::stdout(&env.run(&["sessions", "list", "--json"]));
    let ids: Vec<String> = list
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|s| s["session_id"].as_str().map(str::to_owned))
        .collect();
    let (parent, approval) = ids
        .into_iter()
        .find_map(|id| {
            let show: serde_json::Value = serde_json::from_str(&crate::common::stdout(
                &env.run(&["sessions", "show", &id, "--json"]),
            ))
            .unwrap_or_default();
            let a = show["pending_approvals"]
                .as_array()?
                .iter()
                .find(|a| a["agent"].is_string())?
                .clone();
            Some((id, a))
        })
        .expect("the parent lists its child's approval");
    assert_eq!(approval["agent"], "helper", "{approval}");
    assert_eq!(approval["tool_name"], "write_file", "{approval}");
    assert_ne!(approval["session_id"], parent.as_str(), "{approval}");
    let id = approval["approval_id"].as_str().unwrap();
    assert!(printed.contains(&format!("keel approve {id}")), "{printed}");
    let text = crate::common::stdout(&env.run(&["sessions", "show", &parent]));
    assert!(text.contains("(agent helper, session "), "{text}");
    // Input to the child session is refused (its answer belongs to the parent's call): exit 2,
    // naming the parent to resume; nothing is queued in the child.
    let child = approval["session_id"].as_str().unwrap();
    let out = env.run(&["resume", child, "more please"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("keel resume {parent}")),
        "{}",
        stderr(&out)
    );
    let show: serde_json::Value = serde_json::from_str(&crate::common::stdout(
        &env.run(&["sessions", "show", child, "--json"]),
    ))
    .unwrap();
    assert!(!show.to_string().contains("more please"), "{show}");
    let out = env.run(&["approve", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The line names the session to resume: the parent, not the child.
    assert!(
        crate::common::stdout(&out).contains(&format!("keel resume {parent}")),
        "{}",
        crate::common::stdout(&out)
    );
    let out = env
        .keel()
        .args(["resume", &parent, "--output", "jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = jsonl_lines(&out.stdout);
    assert_eq!(check_stream(&lines)["terminal_reason"], "completed");
    assert_eq!(
        std::fs::read_to_string(env.path("ws/a.txt")).unwrap(),
        "from the child"
    );
    assert_eq!(
        call_results(&lines),
        vec![("succeeded".to_owned(), "helper finished".to_owned())]
    );
}

/// The interactive terminal asks for a child's approval like for the parent's own (labelled
/// with the agent and the child session); the answer decides it and the turn finishes.
#[test]
fn the_interactive_terminal_asks_for_a_childs_approval() {
    use crate::interactive::{exit_code, l1, start};
    let env = with_helper();
    let mut p = start(&env, PARENT, &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("delegate").unwrap();
    p.exp_string("write_file (agent `helper`, session ")
        .unwrap();
    p.exp_string("needs approval").unwrap();
    p.exp_string(&l1("[n] deny › ")).unwrap();
    // While the question is open the parent's spawn_agent spinner is not redrawn (it ticks
    // every 100 ms and would erase the question and what is typed): wait well past a tick,
    // then give an answer that asks again; nothing but the echo comes before the re-ask.
    std::thread::sleep(std::time::Duration::from_millis(600));
    p.send_line("x").unwrap();
    let between = p.exp_string("answer y, a or n").unwrap();
    assert!(!between.contains("spawn_agent"), "{between:?}");
    assert!(!between.contains("\x1b[2K"), "{between:?}");
    p.exp_string(&l1("[n] deny › ")).unwrap();
    p.send_line("y").unwrap();
    p.exp_string("parent done").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
    assert_eq!(
        std::fs::read_to_string(env.path("ws/a.txt")).unwrap(),
        "from the child"
    );
}
