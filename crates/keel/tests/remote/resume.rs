//! `keel --server URL resume` against the local `keel resume`: a bare resume after a turn
//! cancelled while it waited continues it with a new turn; a resume of a session waiting on a
//! human, without a terminal, answers at once; the settings flags are journaled through the API
//! (or refused when it has no field for them); Ctrl-C at the approval question leaves the
//! session waiting; and `run`'s own usage errors read as locally.

use std::process::Stdio;

use rexpect::session::spawn_command;

use super::{ASK, Options, Pair, both_say, comparable, norm, remote, result_line};
use crate::common::{Running, jsonl_lines, parse_lines, stderr, stdout};

/// Runs [`ASK`] on one side until it waits on the approval (exit 3); returns the session and
/// the approval.
fn waiting(p: &Pair, remote: bool) -> (String, String) {
    let args = p.run_args(remote, &["--output", "jsonl"], "write it");
    let o = p.cmd(remote).args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let r = jsonl_lines(&o.stdout).pop().unwrap();
    (
        r["session_id"].as_str().unwrap().to_owned(),
        r["pending"][0]["approval_id"].as_str().unwrap().to_owned(),
    )
}

/// The event types of `session`'s journal on one side.
fn journal_types(p: &Pair, remote: bool, session: &str) -> Vec<String> {
    let o = p
        .cmd(remote)
        .args(["sessions", "events", session])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    jsonl_lines(&o.stdout)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// The `session.config_changed` events of `session` on one side.
fn config_changes(p: &Pair, remote: bool, session: &str) -> Vec<serde_json::Value> {
    let o = p
        .cmd(remote)
        .args(["sessions", "events", session])
        .output()
        .unwrap();
    jsonl_lines(&o.stdout)
        .into_iter()
        .filter(|e| e["type"] == "session.config_changed")
        .collect()
}

/// Waits until `session`'s journal on one side holds `ty` (within 60 s).
fn await_event(p: &Pair, remote: bool, session: &str, ty: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !journal_types(p, remote, session).iter().any(|t| t == ty) {
        assert!(std::time::Instant::now() < deadline, "no {ty} in {session}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_bare_resume_after_a_turn_cancelled_while_it_waited_continues_like_locally() {
    let p = Pair::new(ASK, &Options::default());
    let (sl, _) = waiting(&p, false);
    let (sr, ar) = waiting(&p, true);
    // Cancelled while it waits on the approval; on the server the cancel lands once the
    // approval is decided and the turn runs again.
    let o = p.both(&["cancel", &sl], &["cancel", &sr]);
    assert_eq!(o.0.status.code(), Some(0), "local: {}", stderr(&o.0));
    assert_eq!(o.1.status.code(), Some(0), "remote: {}", stderr(&o.1));
    let _ = remote(&p.far, &p.s, &["approve", &ar]);
    await_event(&p, true, &sr, "turn.finished");
    let (lo, ro) = p.both(
        &["resume", &sl, "--output", "jsonl"],
        &["resume", &sr, "--output", "jsonl"],
    );
    for (side, o) in [("local", &lo), ("remote", &ro)] {
        assert_eq!(o.status.code(), Some(0), "{side}: {}", stderr(o));
        let r = result_line(o);
        assert_eq!(r["terminal_reason"], "completed", "{side}: {r}");
        assert_eq!(r["final_text"], "done", "{side}: {r}");
        // A new turn, asked to continue the cancelled one.
        let queued: Vec<_> = jsonl_lines(&o.stdout)
            .into_iter()
            .filter(|e| e["type"] == "turn.queued")
            .collect();
        assert_eq!(queued.len(), 1, "{side}: {queued:?}");
        assert!(
            queued[0]["payload"]["input"]
                .as_str()
                .is_some_and(|i| i.starts_with("The previous turn was interrupted")),
            "{side}: {}",
            queued[0]
        );
    }
    // Once continued, a bare resume has nothing left to do, on both sides.
    let o = p.both(
        &["resume", &sl, "--output", "jsonl"],
        &["resume", &sr, "--output", "jsonl"],
    );
    assert_eq!(o.0.status.code(), Some(0), "{}", stderr(&o.0));
    assert_eq!(o.1.status.code(), Some(0), "{}", stderr(&o.1));
    assert_eq!(result_line(&o.1)["continued"], false, "{}", stdout(&o.1));
}

#[test]
fn resume_of_a_waiting_session_without_a_terminal_answers_at_once_like_locally() {
    let p = Pair::new(ASK, &Options::default());
    let (sl, _) = waiting(&p, false);
    let (sr, _) = waiting(&p, true);
    let mut results = Vec::new();
    for (remote, session) in [(false, &sl), (true, &sr)] {
        let mut cmd = p.cmd(remote);
        // A settings flag too: a session waiting on a human takes the change, as locally.
        cmd.args(["resume", "--output", "jsonl", "--max-steps", "5", session])
            .stdin(Stdio::null());
        let started = std::time::Instant::now();
        // It returns in well under a second; it used to wait until decided elsewhere.
        let (code, lines) = Running::start(cmd).finish(20);
        eprintln!("remote={remote}: answered in {:?}", started.elapsed());
        assert_eq!(code, Some(3), "remote={remote}: {lines:?}");
        let last = parse_lines(&lines).pop().unwrap();
        assert_eq!(last["terminal_reason"], "requires_action", "{last}");
        assert_eq!(last["pending"].as_array().map(Vec::len), Some(1), "{last}");
        results.push(comparable(last));
    }
    assert_eq!(
        norm(&p.local, &results[0].to_string()),
        norm(&p.far, &results[1].to_string())
    );
    let changes: Vec<_> = [(false, &sl), (true, &sr)]
        .into_iter()
        .map(|(remote, s)| config_changes(&p, remote, s))
        .collect();
    assert_eq!(changes[0].len(), 1, "{changes:?}");
    assert_eq!(
        changes[0][0]["payload"], changes[1][0]["payload"],
        "local vs remote"
    );
}

#[test]
fn settings_flags_on_resume_are_journaled_through_the_api_like_locally() {
    let p = Pair::new(
        "{\"text\":\"first\"}\n{\"text\":\"second\"}\n",
        &Options::default(),
    );
    let run = |remote: bool| {
        let args = p.run_args(
            remote,
            &["--output", "jsonl", "--max-cost-usd", "2"],
            "hello",
        );
        let o = p.cmd(remote).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        jsonl_lines(&o.stdout).pop().unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (sl, sr) = (run(false), run(true));
    let flags = [
        "--max-steps",
        "7",
        "--permission-mode",
        "read-only",
        "--timeout",
        "90s",
        "--tool-timeout",
        "30s",
        "--output",
        "jsonl",
    ];
    let args = |s: &str| {
        let mut a = vec!["resume", s];
        a.extend(flags);
        a.push("more");
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let (al, ar) = (args(&sl), args(&sr));
    let al: Vec<&str> = al.iter().map(String::as_str).collect();
    let ar: Vec<&str> = ar.iter().map(String::as_str).collect();
    let o = p.both(&al, &ar);
    assert_eq!(o.0.status.code(), Some(0), "local: {}", stderr(&o.0));
    assert_eq!(o.1.status.code(), Some(0), "remote: {}", stderr(&o.1));
    assert_eq!(result_line(&o.1)["final_text"], "second");
    let mut seen = Vec::new();
    for (side, remote, session) in [("local", false, &sl), ("remote", true, &sr)] {
        let changes = config_changes(&p, remote, session);
        assert_eq!(changes.len(), 1, "{side}: {changes:?}");
        let c = changes[0]["payload"]["changes"].clone();
        let text = c.to_string();
        let budget = &c["turn_budget"];
        assert_eq!(budget["max_steps"], 7, "{side}: {text}");
        assert_eq!(budget["max_wall_time_ms"], 90_000, "{side}: {text}");
        // The limit set at run stays.
        assert!(
            budget.get("max_cost_usd").is_none_or(|v| *v == 2.0),
            "{side}: {text}"
        );
        assert_eq!(c["permission_mode"], "read_only", "{side}: {text}");
        assert_eq!(c["tool_timeout_ms"], 30_000, "{side}: {text}");
        seen.push(c);
    }
    assert_eq!(seen[0], seen[1], "the change journaled, local vs remote");
    // A setting the API has no field for is refused, not dropped.
    let o = remote(
        &p.far,
        &p.s,
        &[
            "resume",
            &sr,
            "--sandbox-network",
            "more",
            "--output",
            "jsonl",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--sandbox-network is not available with --server"));
    assert_eq!(config_changes(&p, true, &sr).len(), 1);
}

#[test]
fn ctrl_c_at_the_approval_question_leaves_the_session_waiting_like_locally() {
    let p = Pair::new(ASK, &Options::default());
    let mut shown = Vec::new();
    for remote in [false, true] {
        let env = if remote { &p.far } else { &p.local };
        let mut cmd = env.keel_tty();
        if remote {
            cmd.env("KEEL_SERVER", &p.s.url)
                .env("KEEL_API_KEY", &p.s.key);
        }
        cmd.args(p.run_args(remote, &[], "write it"));
        let mut t = spawn_command(cmd, Some(30_000)).unwrap();
        t.exp_string("[y] allow once").unwrap();
        t.send_control('c').unwrap();
        // The result, then the follow-up prompt, left with `exit`.
        let mut tail = t.exp_string("requires_action").unwrap();
        tail.push_str(&t.exp_string("then: keel resume").unwrap());
        t.exp_string(&super::interactive::l1("› ")).unwrap();
        t.send_line("exit").unwrap();
        tail.push_str(&t.exp_eof().unwrap());
        let code = match t.process.wait().unwrap() {
            rexpect::process::wait::WaitStatus::Exited(_, code) => Some(code),
            other => panic!("{other:?}"),
        };
        assert_eq!(code, Some(3), "remote={remote}: {tail}");
        assert!(
            tail.contains("needs approval: write_file"),
            "remote={remote}: {tail}"
        );
        shown.push(tail);
    }
    // Nothing was cancelled: the session still waits, on both sides.
    for remote in [false, true] {
        let o = p
            .cmd(remote)
            .args(["sessions", "list", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let s = v.as_array().and_then(|a| a.first()).cloned().unwrap_or(v);
        let session = s["session_id"].as_str().unwrap_or_default().to_owned();
        let types = journal_types(&p, remote, &session);
        assert!(
            !types.iter().any(|t| t == "turn.cancel_requested"),
            "remote={remote}: {types:?}"
        );
        let show = p
            .cmd(remote)
            .args(["sessions", "show", &session, "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
        assert_eq!(v["status"], "requires_action", "remote={remote}: {v}");
    }
}

#[test]
fn run_usage_errors_over_the_server_read_like_locally() {
    let p = Pair::new(ASK, &Options::default());
    // --base-url: a usage error on both sides (locally: the script model takes none).
    let o = p.both(
        &p.run_args(false, &["--base-url", "http://x/v1"], "hi")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &p.run_args(true, &["--base-url", "http://x/v1"], "hi")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(o.0.status.code(), Some(2), "{}", stderr(&o.0));
    assert_eq!(o.1.status.code(), Some(2), "{}", stderr(&o.1));
    both_say(&o, "--base-url");
    // No model at all: the local message, not the server's schema error.
    let ws = p.far.ws().display().to_string();
    let o = p.both(&["run", "hi"], &["run", "--workspace", &ws, "hi"]);
    assert_eq!(o.1.status.code(), o.0.status.code(), "{}", stderr(&o.1));
    both_say(&o, "no model configured: pass --model");
    // An operator key: run stores a release, which needs an admin key.
    let key = stdout(&p.far.run(&[
        "keys", "create", "--tenant", "acme", "--name", "olga", "--role", "operator",
    ]))
    .trim()
    .to_owned();
    let o = super::remote_cmd(&p.far, &p.s)
        .env("KEEL_API_KEY", &key)
        .args(p.run_args(true, &[], "hi"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("stores a release"), "{err}");
    assert!(err.contains("needs an admin key"), "{err}");
    assert!(err.contains("403"), "{err}");
}

/// Newuser review 15 #7: with `--server URL` given as a flag, the hints of a run left waiting
/// (`approve`/`deny`/`resume`) name the server, so copying them reaches the same session; with
/// `KEEL_SERVER` exported they stay as they were (the variable goes with the shell).
#[test]
fn hints_carry_the_server_flag() {
    let p = Pair::new(ASK, &Options::default());
    let args = p.run_args(true, &[], "write it");
    let o = crate::common::Env::keel(&p.far)
        .env("KEEL_API_KEY", &p.s.key)
        .args(["--server", &p.s.url])
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let out = stdout(&o);
    let k = format!("keel --server {}", p.s.url);
    for hint in ["approve", "deny", "resume"] {
        assert!(out.contains(&format!("{k} {hint} ")), "{hint}: {out}");
    }
    let o = p.cmd(true).args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stdout(&o).contains("  keel approve "), "{}", stdout(&o));
}
