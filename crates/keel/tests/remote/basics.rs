//! The first commands over `--server`: run, approve, resume, sessions list|show|events and
//! cancel with nothing running, compared with local runs; the server's refusals (a bad key, a
//! missing `--workspace`, a workspace outside the roots, an unknown session, no server).

use std::process::Output;

use super::{ASK, Options, norm, remote, result_line, serve, serve_with, types};
use crate::common::{Env, stderr, stdout};

#[test]
fn run_approve_resume_and_sessions_over_the_server_match_local_runs() {
    run_approve_resume_and_sessions_match_local_runs(None);
}

/// The server on `store` (default: its environment's SQLite file); the local runs on SQLite.
pub(super) fn run_approve_resume_and_sessions_match_local_runs(store: Option<&str>) {
    let local = Env::new();
    local.write("script.jsonl", ASK);
    let far = Env::new();
    far.write("script.jsonl", ASK);
    let s = serve_with(
        &far,
        &Options {
            store,
            ..Options::default()
        },
    );
    let ws = far.ws().display().to_string();

    // run: waits on the approval, exit 3, the same events and result line.
    let l = local.run(&[
        "run",
        "--workspace",
        "ws",
        "--model",
        "script:script.jsonl",
        "--output",
        "jsonl",
        "hello",
    ]);
    let r = remote(
        &far,
        &s,
        &[
            "run",
            "--workspace",
            &ws,
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "hello",
        ],
    );
    assert_eq!(l.status.code(), Some(3), "{}", stderr(&l));
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    assert_eq!(types(&l), types(&r));
    let (lr, rr) = (result_line(&l), result_line(&r));
    assert_eq!(
        norm(&local, &lr.to_string()),
        norm(&far, &rr.to_string()),
        "result lines"
    );
    let session_l = lr["session_id"].as_str().unwrap().to_owned();
    let session_r = rr["session_id"].as_str().unwrap().to_owned();
    let approval_l = lr["pending"][0]["approval_id"].as_str().unwrap().to_owned();
    let approval_r = rr["pending"][0]["approval_id"].as_str().unwrap().to_owned();
    if let Some(store) = store {
        // The server journals in that store's schema.
        let (base, schema) = store.rsplit_once("keel_schema=").unwrap();
        let base = base.trim_end_matches(['?', '&']);
        let q =
            format!("SELECT count(*) FROM {schema}.events WHERE session_id::text = '{session_r}'");
        let o = std::process::Command::new("psql")
            .args([base, "-Atc", &q])
            .output()
            .unwrap();
        let n: u64 = stdout(&o).trim().parse().unwrap_or(0);
        assert!(
            n > 0,
            "no events of {session_r} in {schema}: {}",
            stderr(&o)
        );
    }

    // sessions list and show (text).
    for args in [vec!["sessions", "list"], vec!["sessions", "show", "S"]] {
        let la: Vec<&str> = args
            .iter()
            .map(|a| if *a == "S" { session_l.as_str() } else { a })
            .collect();
        let ra: Vec<&str> = args
            .iter()
            .map(|a| if *a == "S" { session_r.as_str() } else { a })
            .collect();
        let (lo, ro) = (local.run(&la), remote(&far, &s, &ra));
        assert_eq!(lo.status.code(), Some(0), "{}", stderr(&lo));
        assert_eq!(ro.status.code(), Some(0), "{}", stderr(&ro));
        let keep = |o: &Output, env: &Env| -> Vec<String> {
            norm(env, &stdout(o))
                .lines()
                // Creation times differ; the server's timeouts are its own.
                .map(|l| {
                    l.split(' ')
                        .map(|w| {
                            let shape: String = w
                                .chars()
                                .map(|c| if c.is_ascii_digit() { '9' } else { c })
                                .collect();
                            if shape == "9999-99-99" || shape == "99:99:99" {
                                "<t>"
                            } else {
                                w
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .filter(|l| !l.starts_with("timeouts") && !l.starts_with("  <id>  "))
                .collect()
        };
        let (lk, rk) = (keep(&lo, &local), keep(&ro, &far));
        for line in [
            "session ",
            "status ",
            "turns",
            "pending approvals",
            "SESSION",
        ] {
            assert_eq!(
                lk.iter().any(|l| l.starts_with(line)),
                rk.iter().any(|l| l.starts_with(line)),
                "{line}: local {lk:#?} remote {rk:#?}"
            );
        }
        let pick = |v: &[String]| -> Vec<String> {
            v.iter()
                .filter(|l| {
                    l.starts_with("status") || l.starts_with("totals") || l.starts_with("<id>  ")
                })
                .cloned()
                .collect()
        };
        assert_eq!(pick(&lk), pick(&rk));
    }

    // approve: the same line, exit 0.
    let (lo, ro) = (
        local.run(&["approve", &approval_l]),
        remote(&far, &s, &["approve", &approval_r]),
    );
    assert_eq!(lo.status.code(), Some(0), "{}", stderr(&lo));
    assert_eq!(ro.status.code(), Some(0), "{}", stderr(&ro));
    assert_eq!(norm(&local, &stdout(&lo)), norm(&far, &stdout(&ro)));

    // resume: the turn completes, exit 0, the same result.
    let (lo, ro) = (
        local.run(&["resume", &session_l, "--output", "jsonl"]),
        remote(&far, &s, &["resume", &session_r, "--output", "jsonl"]),
    );
    assert_eq!(lo.status.code(), Some(0), "{}", stderr(&lo));
    assert_eq!(ro.status.code(), Some(0), "{}", stderr(&ro));
    assert_eq!(types(&lo), types(&ro));
    assert_eq!(
        norm(&local, &result_line(&lo).to_string()),
        norm(&far, &result_line(&ro).to_string())
    );

    // sessions events: the whole journal, the same types.
    let (lo, ro) = (
        local.run(&["sessions", "events", &session_l]),
        remote(&far, &s, &["sessions", "events", &session_r]),
    );
    assert_eq!(ro.status.code(), Some(0), "{}", stderr(&ro));
    assert_eq!(types(&lo), types(&ro));

    // cancel with nothing running: refused by both, exit 1.
    let (lo, ro) = (
        local.run(&["cancel", &session_l]),
        remote(&far, &s, &["cancel", &session_r]),
    );
    assert_eq!(lo.status.code(), Some(1));
    assert_eq!(ro.status.code(), Some(1), "{}", stderr(&ro));
    assert!(
        stderr(&ro).contains("cannot cancel session"),
        "{}",
        stderr(&ro)
    );
}

#[test]
fn a_bad_key_a_missing_workspace_and_no_server_say_so() {
    let far = Env::new();
    far.write("script.jsonl", ASK);
    let s = serve(&far);
    let ws = far.ws().display().to_string();

    let o = far
        .keel()
        .env("KEEL_SERVER", &s.url)
        .env("KEEL_API_KEY", "keel_wrong")
        .args(["sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("refused the API key (401)"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("KEEL_API_KEY"), "{}", stderr(&o));

    let o = far
        .keel()
        .env("KEEL_API_KEY", "keel_wrong")
        .args([
            "--server",
            &s.url,
            "run",
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--workspace is required with --server"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty(), "no result line for a usage error");

    // A bad key on run: a failed result line, exit 1.
    let o = far
        .keel()
        .env("KEEL_API_KEY", "keel_wrong")
        .args([
            "--server",
            &s.url,
            "run",
            "--workspace",
            &ws,
            "--model",
            "script:script.jsonl",
            "--output",
            "jsonl",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(result_line(&o)["terminal_reason"], "failed");

    // A workspace outside the server's roots: 403 naming the limit.
    let o = remote(
        &far,
        &s,
        &[
            "run",
            "--workspace",
            "/",
            "--model",
            "script:script.jsonl",
            "x",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("workspace_roots"), "{}", stderr(&o));

    // An unknown session: 404 in the local wording.
    let o = remote(
        &far,
        &s,
        &["sessions", "show", "0190a0a0-0000-7000-8000-000000000000"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no session 0190a0a0"), "{}", stderr(&o));

    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = far
        .keel()
        .env("KEEL_API_KEY", &s.key)
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "sessions",
            "list",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("connection refused"), "{}", stderr(&o));
    // A local --store with a server is a usage error, never silently ignored.
    let o = far
        .keel()
        .env("KEEL_API_KEY", &s.key)
        .args(["--server", &format!("http://127.0.0.1:{port}")])
        .args(["--store", "sqlite:///tmp/elsewhere.db", "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--store") && stderr(&o).contains("drop one"),
        "{}",
        stderr(&o)
    );
}
