//! `keel --server URL sessions close`: the same lines and exit codes as locally (closing,
//! closing again, a closed session refusing input, an open turn refusing the close, an unknown
//! session); the close is bound to the session's ETag and retried once when it is stale; and
//! `resume --model`, which the API cannot do, is a usage error that says what to do instead.

use super::{ASK, Options, Pair, both_say, remote, run_args, serve};
use crate::common::{Env, jsonl_lines, stderr, stdout};

const TWO: &str = "{\"text\":\"first\"}\n{\"text\":\"second\"}\n";

/// Runs `script` on one side to its end (`code`); returns the session.
fn session(p: &Pair, remote: bool, code: i32) -> String {
    let args = p.run_args(remote, &["--output", "jsonl"], "hello");
    let o = p.cmd(remote).args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(code), "{}", stderr(&o));
    jsonl_lines(&o.stdout).pop().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn sessions_close_over_the_server_answers_like_locally() {
    let p = Pair::new(TWO, &Options::default());
    let (sl, sr) = (session(&p, false, 0), session(&p, true, 0));
    let closed = p.same(
        &p.both(&["sessions", "close", &sl], &["sessions", "close", &sr]),
        0,
    );
    assert_eq!(closed, "closed session <id>; it takes no more input\n");
    let again = p.same(
        &p.both(&["sessions", "close", &sl], &["sessions", "close", &sr]),
        0,
    );
    assert_eq!(again, "session <id> is already closed\n");
    // Shown as closed, and a closed session takes no more input.
    let o = p.both(
        &["sessions", "show", &sl, "--json"],
        &["sessions", "show", &sr, "--json"],
    );
    for side in [&o.0, &o.1] {
        let v: serde_json::Value = serde_json::from_slice(&side.stdout).unwrap();
        assert_eq!(v["status"], "closed", "{v}");
    }
    let o = p.both(
        &["resume", &sl, "more", "--output", "jsonl"],
        &["resume", &sr, "more", "--output", "jsonl"],
    );
    assert_eq!(o.0.status.code(), Some(1));
    assert_eq!(o.1.status.code(), Some(1), "{}", stderr(&o.1));
    both_say(&o, "is closed");
    // An unknown session.
    let unknown = "0190a0a0-0000-7000-8000-000000000000";
    let o = p.both(
        &["sessions", "close", unknown],
        &["sessions", "close", unknown],
    );
    p.same(&o, 1);
    both_say(&o, &format!("no session {unknown}"));
}

#[test]
fn a_session_waiting_on_a_human_is_not_closed_over_the_server_either() {
    let p = Pair::new(ASK, &Options::default());
    let (sl, sr) = (session(&p, false, 3), session(&p, true, 3));
    let o = p.both(&["sessions", "close", &sl], &["sessions", "close", &sr]);
    p.same(&o, 1);
    both_say(&o, "cannot close session");
    assert!(stderr(&o.1).contains("409"), "{}", stderr(&o.1));
    let o = p.both(&["sessions", "show", &sl], &["sessions", "show", &sr]);
    for side in [&o.0, &o.1] {
        assert!(stdout(side).contains("requires_action"), "{}", stdout(side));
    }
}

/// The close sends the version it read as `If-Match`; when the session has moved on since
/// (here: a version long gone), the server answers 412 and the close reads the session again
/// and succeeds with the fresh ETag.
#[test]
fn a_stale_etag_is_read_again_and_the_close_retried_once() {
    let far = Env::new();
    far.write("script.jsonl", TWO);
    let s = serve(&far);
    let o = remote(&far, &s, &run_args(&far, &["--output", "jsonl"], "hello"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let session: keel_core::SessionId = jsonl_lines(&o.stdout).pop().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let client = keel_client::Client::new(&s.url, Some(&s.key)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stale = 1;
        let e = client
            .close_session(&session.to_string(), stale)
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(412), "{e}");
        keel_cli::remote::sessions::close_at(&client, session, stale)
            .await
            .unwrap();
        let record = client.get_session(&session.to_string()).await.unwrap();
        assert_eq!(record.status, "closed");
    });
}

#[test]
fn resume_with_another_model_over_the_server_is_a_usage_error_saying_what_to_do() {
    let far = Env::new();
    far.write("script.jsonl", TWO);
    let s = serve(&far);
    for output in [&[][..], &["--output", "jsonl"][..]] {
        let mut args = vec![
            "resume",
            "0190a0a0-0000-7000-8000-000000000000",
            "--model",
            "script:script.jsonl",
        ];
        args.extend_from_slice(output);
        let o = remote(&far, &s, &args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("--model with --server")
                && err.contains("not available over the API")
                && err.contains("start a new session with keel run --model"),
            "{err}"
        );
        assert!(o.stdout.is_empty(), "no result line for a usage error");
    }
}
