//! The interactive terminal, driven through a pseudo-terminal: prompt and follow-up in one
//! session, approval prompts (allow once, allow for the session, deny with a reason), Ctrl-C
//! cancelling the running turn while the session stays resumable, a second Ctrl-C exiting.

use rexpect::session::{PtySession, spawn_command};

use crate::common::{Env, check_stream, jsonl_lines};

const TIMEOUT_MS: u64 = 30_000;

/// rexpect reads the terminal byte by byte as Latin-1: a UTF-8 needle must be spelled the same way.
pub(crate) fn l1(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

/// Starts `keel run` on a pseudo-terminal with the scripted model `script` and `flags`.
pub(crate) fn start(env: &Env, script: &str, flags: &[&str]) -> PtySession {
    env.write("script.jsonl", script);
    let mut cmd = env.keel_tty();
    cmd.args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .args(flags);
    spawn_command(cmd, Some(TIMEOUT_MS)).unwrap()
}

/// Waits for the process to exit; returns its exit code.
pub(crate) fn exit_code(p: &mut PtySession) -> Option<i32> {
    p.exp_eof().unwrap();
    match p.process.wait().unwrap() {
        rexpect::process::wait::WaitStatus::Exited(_, code) => Some(code),
        _ => None,
    }
}

fn session_in(text: &str) -> String {
    let i = text.rfind("session ").unwrap() + "session ".len();
    text[i..i + 36].to_owned()
}

#[test]
fn prompt_approval_and_follow_up_in_one_session() {
    let env = Env::new();
    let script = concat!(
        "{\"text\":\"I will write the file.\",\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"one\"}}]}\n",
        "{\"text\":\"Wrote a.txt.\"}\n",
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"b.txt\",\"content\":\"two\"}}]}\n",
        "{\"text\":\"Not writing b.txt then.\"}\n",
    );
    let mut p = start(&env, script, &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("write a.txt").unwrap();
    p.exp_string("I will write the file.").unwrap();
    p.exp_string("write_file").unwrap();
    p.exp_string("needs approval").unwrap();
    p.exp_string("[y] allow once").unwrap();
    p.send_line("y").unwrap();
    p.exp_string("Wrote a.txt.").unwrap();
    let summary = p.exp_string(&l1("── completed")).unwrap();
    let _ = summary;
    let tail = p.exp_string(&l1("› ")).unwrap();
    let session = session_in(&tail);
    assert_eq!(
        std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
        "one"
    );
    // A follow-up continues the same session; this time the call is denied with a reason.
    p.send_line("now b.txt").unwrap();
    p.exp_string("needs approval").unwrap();
    p.exp_string("[n] deny").unwrap();
    p.send_line("n").unwrap();
    p.exp_string("reason").unwrap();
    p.send_line("b.txt is generated").unwrap();
    p.exp_string("Not writing b.txt then.").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
    assert!(!env.ws().join("b.txt").exists());
    // Both turns are in the one session; the model saw the reason.
    let out = env.run(&["sessions", "events", &session]);
    let events = jsonl_lines(&out.stdout);
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "turn.finished")
            .count(),
        2
    );
    let rejected = events
        .iter()
        .filter(|e| e["type"] == "tool_call.finished")
        .find(|e| e["payload"]["status"] == "rejected")
        .unwrap();
    assert!(
        rejected["payload"]["output"]
            .as_str()
            .unwrap()
            .contains("b.txt is generated")
    );
}

#[test]
fn allow_for_session_stops_asking_for_the_same_call() {
    let env = Env::new();
    let call = "{\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"echo hi\"}}]}\n";
    let script = format!("{call}{call}{{\"text\":\"done twice\"}}\n");
    let mut p = start(&env, &script, &["--sandbox", "off"]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("say hi twice").unwrap();
    p.exp_string("needs approval").unwrap();
    p.exp_string("[a] allow for this session").unwrap();
    p.send_line("a").unwrap();
    let between = p.exp_string("done twice").unwrap();
    assert!(
        !between.contains("needs approval"),
        "asked again: {between}"
    );
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&l1("› ")).unwrap();
    p.send_control('d').unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
}

#[test]
fn ctrl_c_cancels_the_turn_and_the_session_resumes() {
    let env = Env::new();
    let script = concat!(
        "{\"text\":\"Running a long command.\",\"tool_calls\":[{\"name\":\"shell\",\"arguments\":{\"command\":\"sleep 30\"}}]}\n",
        "{\"text\":\"Finished after the interruption.\"}\n",
    );
    let mut p = start(
        &env,
        script,
        &["--permission-mode", "bypass", "--sandbox", "off"],
    );
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("run the long command").unwrap();
    p.exp_string("Running a long command.").unwrap();
    p.exp_string("sleep 30").unwrap(); // the spinner's label
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_control('c').unwrap();
    p.exp_string(&l1("── aborted")).unwrap();
    let tail = p.exp_string(&l1("› ")).unwrap();
    let session = session_in(&tail);
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(4), "aborted");
    // A bare resume (headless here) continues and completes.
    let out = env.run(&["resume", &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(result["final_text"], "Finished after the interruption.");
}

#[test]
fn a_second_ctrl_c_exits_at_once() {
    let env = Env::new();
    // The model itself is slow: the first Ctrl-C cancels, the second exits without waiting.
    let script = "{\"delay_ms\":30000,\"text\":\"late\"}\n";
    let mut p = start(&env, script, &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("wait").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    p.send_control('c').unwrap();
    p.exp_string("Ctrl-C again").unwrap();
    p.send_control('c').unwrap();
    let started = std::time::Instant::now();
    let code = exit_code(&mut p);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(code, Some(4));
}

#[test]
fn an_approval_decided_from_another_terminal_continues_the_session() {
    let env = Env::new();
    let script = concat!(
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"c.txt\",\"content\":\"from afar\"}}]}\n",
        "{\"text\":\"Approved elsewhere.\"}\n",
    );
    let mut p = start(&env, script, &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("write c.txt").unwrap();
    p.exp_string("keel approve|deny ").unwrap();
    let rest = p.exp_string(")").unwrap();
    let approval = rest.trim().to_owned();
    p.exp_string("[y] allow once").unwrap();
    let out = env.run(&["approve", &approval]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    p.exp_string("decided from another terminal").unwrap();
    p.exp_string("Approved elsewhere.").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
    assert_eq!(
        std::fs::read_to_string(env.ws().join("c.txt")).unwrap(),
        "from afar"
    );
}

#[test]
fn exit_or_an_empty_line_at_the_first_prompt_leaves_with_0_and_no_session() {
    let env = Env::new();
    for answer in ["exit", ""] {
        let mut p = start(&env, "{\"text\":\"should not run\"}\n", &[]);
        p.exp_string(&l1("› ")).unwrap();
        p.send_line(answer).unwrap();
        assert_eq!(exit_code(&mut p), Some(0), "{answer:?}");
    }
    let mut p = start(&env, "{\"text\":\"should not run\"}\n", &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_control('d').unwrap();
    assert_eq!(exit_code(&mut p), Some(0), "Ctrl-D");
    let out = env.run(&["sessions", "list", "--json"]);
    assert_eq!(crate::common::stdout(&out).trim(), "", "no session");
}

/// Item 4 of the new-user report: on a terminal every piece of model text was printed twice
/// (`hi\r\nhi\r\n`): the step's events arrive after its live text, and `step.started` cleared
/// what had been shown. Now the text appears once.
#[test]
fn model_text_appears_once_on_a_terminal() {
    let env = Env::new();
    env.write("hi.jsonl", "{\"text\":\"hi there\"}\n");
    let mut cmd = env.keel_tty();
    cmd.args(["run", "--model", "script:hi.jsonl", "hello"]);
    let mut p = spawn_command(cmd, Some(TIMEOUT_MS)).unwrap();
    let before = p.exp_string(&l1("── completed")).unwrap();
    assert_eq!(before.matches("hi there").count(), 1, "{before:?}");
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
}

/// Item 5 of the new-user report: an empty line at the follow-up prompt leaves, as the README
/// says (before, keel showed `› ` again).
#[test]
fn an_empty_line_at_the_follow_up_prompt_leaves() {
    let env = Env::new();
    let mut p = start(&env, "{\"text\":\"first answer\"}\n", &[]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("a task").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
}

/// What a human approves is what they were shown: the whole command, not its first 160
/// characters (a tail past them ran unseen), and bidi overrides shown as escapes, not applied
/// (U+202E made the text read differently from what runs).
#[test]
fn an_approval_prompt_shows_the_whole_command_and_escapes_bidi_overrides() {
    let env = Env::new();
    let padding = "x".repeat(300);
    let command = format!("echo {padding} ; touch EVIL-TAIL-MARKER ; echo \u{202e}gnp.exe");
    let call =
        serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]});
    let script = format!("{call}\n{{\"text\":\"ok\"}}\n");
    let mut p = start(&env, &script, &["--permission-mode", "default"]);
    p.exp_string(&l1("› ")).unwrap();
    p.send_line("go").unwrap();
    let shown = p.exp_string("[y] allow once").unwrap();
    assert!(
        shown.contains("EVIL-TAIL-MARKER"),
        "the tail was not shown: {shown}"
    );
    assert!(shown.contains("\\u{202e}"), "{shown}");
    assert!(!shown.contains(&l1("\u{202e}")), "{shown}");
    p.send_line("n").unwrap();
}

/// The input pipeline at the prompt (issue 15): every slash command, a user-defined command and
/// `@path` attachments — one outside the workspace refused — in one terminal session; local
/// commands and refused input ask no model (the script has a line per turn only).
#[test]
fn slash_commands_user_commands_and_at_paths_at_the_prompt() {
    let env = Env::new();
    env.write("ws/notes.txt", "the notes say hello\n");
    env.write("outside.txt", "not yours\n");
    env.write(
        "config/keel/commands/review.md",
        "---\ndescription: review a file\n---\nReview $ARGUMENTS carefully.\n",
    );
    // The session's scripted position carries over a re-pin: the third model call reads line 3.
    env.write(
        "ws/other.jsonl",
        "{\"text\":\"unused\"}\n{\"text\":\"unused\"}\n{\"text\":\"Other model here.\"}\n",
    );
    let script = "{\"text\":\"Read the notes.\"}\n{\"text\":\"Reviewed.\"}\n";
    let mut p = start(&env, script, &[]);
    let prompt = l1("› ");
    p.exp_string(&prompt).unwrap();
    // Refused at the first prompt too: said, and asked again.
    p.send_line("/nosuch").unwrap();
    p.exp_string("unknown command /nosuch").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/help").unwrap();
    p.exp_string("Commands:").unwrap();
    p.exp_string("review a file").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("summarize @notes.txt").unwrap();
    p.exp_string("Read the notes.").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/cost").unwrap();
    p.exp_string("over 1 steps").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/status").unwrap();
    p.exp_string("turns 1").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/permissions").unwrap();
    p.exp_string("permission mode default").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/nosuch").unwrap();
    p.exp_string("unknown command /nosuch").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("look at @../outside.txt").unwrap();
    p.exp_string("@../outside.txt").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/review notes.txt").unwrap();
    p.exp_string("Reviewed.").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/compact keep the notes").unwrap();
    p.exp_string("compacted the conversation").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/model script:other.jsonl").unwrap();
    p.exp_string("now runs model").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("who are you").unwrap();
    p.exp_string("Other model here.").unwrap();
    p.exp_string(&l1("── completed")).unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/clear").unwrap();
    p.exp_string("new session").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("/resume").unwrap();
    p.exp_string("[1]").unwrap();
    p.exp_string("resume which?").unwrap();
    p.send_line("1").unwrap();
    p.exp_string("resumed session").unwrap();
    p.exp_string(&prompt).unwrap();
    // A refused command ran nothing: the exit code stays that of the last turn.
    p.send_line("/model foo:bar").unwrap();
    p.exp_string("keel: ").unwrap();
    p.exp_string(&prompt).unwrap();
    p.send_line("exit").unwrap();
    assert_eq!(exit_code(&mut p), Some(0));
    // The first session has the three turns (local commands and refusals made none), the
    // attachment and the user command journaled with them, the compaction and the re-pin.
    let list = crate::common::stdout(&env.run(&["sessions", "list", "--json"]));
    let sessions: Vec<serde_json::Value> = list
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The session /clear started is kept (the terminal named it) though it had no turn.
    assert_eq!(sessions.len(), 2, "{list}");
    let first = sessions.iter().find(|s| s["turns"] == 3).expect(&list);
    let out = env.run(&["sessions", "events", first["session_id"].as_str().unwrap()]);
    let events = jsonl_lines(&out.stdout);
    let queued: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "turn.queued")
        .collect();
    assert_eq!(queued.len(), 3);
    assert_eq!(
        queued[0]["payload"]["compiled"]["attachments"][0]["path"],
        "notes.txt"
    );
    assert!(
        queued[0]["payload"]["input"]
            .as_str()
            .unwrap()
            .contains("the notes say hello")
    );
    assert_eq!(queued[1]["payload"]["compiled"]["command"], "review");
    assert_eq!(queued[1]["payload"]["input"], "Review notes.txt carefully.");
    for ty in ["context.compacted", "session.release_pinned"] {
        assert_eq!(events.iter().filter(|e| e["type"] == ty).count(), 1, "{ty}");
    }
}
