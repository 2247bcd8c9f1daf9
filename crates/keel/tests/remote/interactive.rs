//! A remote `run` on a terminal (a pseudo-terminal here): the prompt asked at `› `, an approval
//! asked and answered `y`, then in a follow-up `n` with a reason — on the server, with the same
//! questions, files and journal as the same conversation held locally.

use rexpect::session::{PtySession, spawn_command};

use super::{Options, Pair, norm};
use crate::common::{Env, jsonl_lines};

const TIMEOUT_MS: u64 = 30_000;

/// rexpect reads the terminal byte by byte as Latin-1: a UTF-8 needle must be spelled the same way.
pub(super) fn l1(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

const SCRIPT: &str = concat!(
    "{\"text\":\"I will write the file.\",\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"a.txt\",\"content\":\"one\"}}]}\n",
    "{\"text\":\"Wrote a.txt.\"}\n",
    "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"b.txt\",\"content\":\"two\"}}]}\n",
    "{\"text\":\"Not writing b.txt then.\"}\n",
);

/// Holds the conversation on one side; returns the exit code, the session and what the
/// terminal showed up to each answer.
fn converse(p: &Pair, remote: bool) -> (Option<i32>, String, String) {
    let env: &Env = if remote { &p.far } else { &p.local };
    let mut cmd = env.keel_tty();
    if remote {
        cmd.env("KEEL_SERVER", &p.s.url)
            .env("KEEL_API_KEY", &p.s.key);
    }
    let mut args = p.run_args(remote, &[], "");
    args.pop(); // no prompt: asked on the terminal
    cmd.args(&args);
    let mut t: PtySession = spawn_command(cmd, Some(TIMEOUT_MS)).unwrap();
    // Everything the terminal showed, in order.
    let mut shown = String::new();
    let mut expect = |t: &mut PtySession, needle: &str| {
        let needle = l1(needle);
        let before = t.exp_string(&needle).unwrap();
        shown.push_str(&before);
        shown.push_str(&needle);
        before
    };
    expect(&mut t, "› ");
    t.send_line("write a.txt").unwrap();
    expect(&mut t, "[y] allow once");
    t.send_line("y").unwrap();
    expect(&mut t, "Wrote a.txt.");
    expect(&mut t, "── completed");
    let tail = expect(&mut t, "› ");
    let i = tail.rfind("session ").unwrap() + "session ".len();
    let session = tail[i..i + 36].to_owned();
    // A follow-up in the same session; this call is denied with a reason.
    t.send_line("now b.txt").unwrap();
    expect(&mut t, "[n] deny");
    t.send_line("n").unwrap();
    expect(&mut t, "reason");
    t.send_line("b.txt is generated").unwrap();
    expect(&mut t, "Not writing b.txt then.");
    expect(&mut t, "── completed");
    expect(&mut t, "› ");
    t.send_line("exit").unwrap();
    shown.push_str(&t.exp_eof().unwrap());
    let code = match t.process.wait().unwrap() {
        rexpect::process::wait::WaitStatus::Exited(_, code) => Some(code),
        _ => None,
    };
    (code, session, shown)
}

/// What rexpect read (bytes as Latin-1 characters) as the UTF-8 text the terminal got.
fn utf8(text: &str) -> String {
    let bytes: Vec<u8> = text
        .chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The lines a terminal ends up showing: each line as it is left after its last clear-line
/// (`ESC[2K`, a spinner's frames), durations (`0.2s`, `(0.0s)`) as `<t>`.
fn screen(text: &str) -> Vec<String> {
    text.split('\n')
        .map(|line| {
            let line = line.trim_end_matches('\r');
            let line = line.rsplit("\u{1b}[2K").next().unwrap_or(line);
            line.split(' ')
                .map(|w| {
                    let bare = w.trim_start_matches('(').trim_end_matches(')');
                    let digits = bare.strip_suffix('s').unwrap_or("x");
                    if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
                    {
                        w.replace(bare, "<t>")
                    } else {
                        w.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn approvals_answered_on_a_terminal_over_the_server_behave_like_local_ones() {
    let p = Pair::new(SCRIPT, &Options::default());
    let (lc, ls, lshown) = converse(&p, false);
    let (rc, rs, rshown) = converse(&p, true);
    assert_eq!((lc, rc), (Some(0), Some(0)));
    for env in [&p.local, &p.far] {
        assert_eq!(
            std::fs::read_to_string(env.ws().join("a.txt")).unwrap(),
            "one"
        );
        assert!(!env.ws().join("b.txt").exists());
    }
    // The same screen: questions, answers, tool lines, model text and summaries in the same
    // order (ids, durations and cleared spinner frames aside).
    let (ls_, rs_) = (
        screen(&norm(&p.local, &utf8(&lshown))),
        screen(&norm(&p.far, &utf8(&rshown))),
    );
    assert_eq!(ls_, rs_, "the terminal, local vs remote");
    for needle in [
        "? write_file needs approval",
        "✓ write_file {\"content\":\"one\",\"path\":\"a.txt\"} (<t>)",
        "Wrote a.txt.",
        "⊘ write_file {\"content\":\"two\",\"path\":\"b.txt\"} [rejected]",
        "Not writing b.txt then.",
    ] {
        assert!(
            rs_.iter().any(|l| l.contains(needle)),
            "{needle:?} in {rs_:#?}"
        );
    }
    // The same journal: two turns, the second call rejected with the reason the model saw.
    let (lo, ro) = p.both(&["sessions", "events", &ls], &["sessions", "events", &rs]);
    let (le, re) = (jsonl_lines(&lo.stdout), jsonl_lines(&ro.stdout));
    let kinds = |v: &[serde_json::Value]| -> Vec<String> {
        v.iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(kinds(&le), kinds(&re));
    for events in [&le, &re] {
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
}

/// Follow-ups on a terminal over the server go through the server's input pipeline: a slash
/// command is answered with no turn, an unknown one refused (422) and the prompt asked again.
#[test]
fn slash_commands_at_a_remote_prompt_are_answered_by_the_server() {
    let p = Pair::new("{\"text\":\"Hello there.\"}\n", &Options::default());
    let mut cmd = p.far.keel_tty();
    cmd.env("KEEL_SERVER", &p.s.url)
        .env("KEEL_API_KEY", &p.s.key);
    let mut args = p.run_args(true, &[], "");
    args.pop(); // no prompt: asked on the terminal
    cmd.args(&args);
    let mut t: PtySession = spawn_command(cmd, Some(TIMEOUT_MS)).unwrap();
    let prompt = l1("› ");
    t.exp_string(&prompt).unwrap();
    t.send_line("hello").unwrap();
    t.exp_string("Hello there.").unwrap();
    t.exp_string(&l1("── completed")).unwrap();
    t.exp_string(&prompt).unwrap();
    t.send_line("/cost").unwrap();
    t.exp_string("over 1 steps").unwrap();
    t.exp_string(&prompt).unwrap();
    t.send_line("/nosuch").unwrap();
    t.exp_string("unknown command /nosuch").unwrap();
    t.exp_string(&prompt).unwrap();
    t.send_line("exit").unwrap();
    t.exp_eof().unwrap();
    let code = match t.process.wait().unwrap() {
        rexpect::process::wait::WaitStatus::Exited(_, code) => Some(code),
        _ => None,
    };
    assert_eq!(code, Some(0));
}
