//! `keel --server URL deny` and `resolve`: the same lines and exit codes as locally — the
//! first decision, a repeated one (a deny with the same and with another reason), a contrary
//! one, an unknown approval or effect, a malformed id; `resolve` decides the effect a cancel
//! left `outcome_unknown` (see [`super::cancel`]), after which the session resumes.

use super::cancel::{cancel_running, slow_pair};
use super::{ASK, Options, Pair, both_say, norm, result_line, without_input_tokens};
use crate::common::stderr;

/// Runs [`ASK`] on both sides until it waits (exit 3); returns the two approval ids.
fn waiting(p: &Pair) -> (String, String) {
    let run = |remote: bool| {
        let args = p.run_args(remote, &["--output", "jsonl"], "hello");
        let o = p.cmd(remote).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        result_line(&o)["pending"][0]["approval_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    (run(false), run(true))
}

/// The deny comparison on a server on `store` (default: SQLite).
pub(super) fn deny_matches_local(store: Option<&str>) {
    let p = Pair::new(
        ASK,
        &Options {
            store,
            ..Options::default()
        },
    );
    let (al, ar) = waiting(&p);

    let first = p.same(
        &p.both(
            &["deny", &al, "--reason", "not now"],
            &["deny", &ar, "--reason", "not now"],
        ),
        0,
    );
    assert!(first.contains("denied;"), "{first}");
    assert!(!first.contains("already"), "{first}");
    // Again, with the same reason and with another one: it already was; the first reason stands.
    let again = p.same(
        &p.both(
            &["deny", &al, "--reason", "not now"],
            &["deny", &ar, "--reason", "not now"],
        ),
        0,
    );
    assert!(again.contains("(it already was)"), "{again}");
    let other = p.same(
        &p.both(
            &["deny", &al, "--reason", "never"],
            &["deny", &ar, "--reason", "never"],
        ),
        0,
    );
    assert!(other.contains("\"not now\", which stands"), "{other}");
    // A contrary decision is refused by both.
    let o = p.both(&["approve", &al], &["approve", &ar]);
    p.same(&o, 1);
    both_say(&o, "cannot decide approval ");
    // An approval that does not exist, and a word that is no approval id.
    let unknown = "0190a0a0-0000-7000-8000-000000000000";
    let o = p.both(&["deny", unknown], &["deny", unknown]);
    p.same(&o, 1);
    both_say(&o, &format!("no approval {unknown}"));
    let o = p.both(&["deny", "nope"], &["deny", "nope"]);
    p.same(&o, 1);
    assert_eq!(stderr(&o.0), stderr(&o.1));
    assert!(
        stderr(&o.0).contains("is not an approval id"),
        "{}",
        stderr(&o.0)
    );
}

#[test]
fn deny_over_the_server_answers_like_deny_locally() {
    deny_matches_local(None);
}

#[test]
fn resolve_over_the_server_answers_like_resolve_locally() {
    let p = slow_pair();
    let l = cancel_running(&p, false);
    let r = cancel_running(&p, true);
    let (kl, kr) = (l.key.as_str(), r.key.as_str());

    // The shell command may or may not have run: the human says it did.
    let first = p.same(
        &p.both(
            &["resolve", kl, "--as", "committed"],
            &["resolve", kr, "--as", "committed"],
        ),
        0,
    );
    assert!(first.contains("marked committed;"), "{first}");
    let again = p.same(
        &p.both(
            &["resolve", kl, "--as", "committed"],
            &["resolve", kr, "--as", "committed"],
        ),
        0,
    );
    assert!(again.contains("(it already was)"), "{again}");
    // A contrary decision is refused by both.
    let o = p.both(
        &["resolve", kl, "--as", "failed"],
        &["resolve", kr, "--as", "failed"],
    );
    p.same(&o, 1);
    both_say(&o, "cannot resolve effect");
    // An effect the session does not have, and a word that is no operation key.
    let (ul, ur) = (
        format!("{}/nothing/call_9_9", l.session),
        format!("{}/nothing/call_9_9", r.session),
    );
    let o = p.both(
        &["resolve", &ul, "--as", "committed"],
        &["resolve", &ur, "--as", "committed"],
    );
    p.same(&o, 1);
    assert_eq!(
        norm(&p.local, &stderr(&o.0)),
        norm(&p.far, &stderr(&o.1)),
        "unknown effect"
    );
    assert!(stderr(&o.1).contains("has no effect"), "{}", stderr(&o.1));
    let o = p.both(
        &["resolve", "nonexistent", "--as", "committed"],
        &["resolve", "nonexistent", "--as", "committed"],
    );
    p.same(&o, 1);
    assert_eq!(stderr(&o.0), stderr(&o.1));
    // The session goes on: a bare resume continues the cancelled turn to its end.
    let (lo, ro) = p.both(
        &["resume", &l.session, "--output", "jsonl"],
        &["resume", &r.session, "--output", "jsonl"],
    );
    assert_eq!(lo.status.code(), Some(0), "{}", stderr(&lo));
    assert_eq!(ro.status.code(), Some(0), "{}", stderr(&ro));
    // The cancelled call's output names how long it ran: the input tokens may differ by that.
    let (lr, rr) = (
        without_input_tokens(result_line(&lo)),
        without_input_tokens(result_line(&ro)),
    );
    assert_eq!(rr["final_text"], "finished after the cancel", "{rr}");
    assert_eq!(
        norm(&p.local, &lr.to_string()),
        norm(&p.far, &rr.to_string())
    );
}
