//! `keel tenants`, `keel keys` and `keel serve` as a user runs them: keys shown once and
//! stored only as hashes, a served API that takes them, and the TLS rule for non-loopback
//! addresses.

use std::io::{Read, Write};

use crate::common::{Env, spawn_serve, stdout};

/// `GET PATH` at `addr` (`HOST:PORT`) with an optional bearer key: the whole response.
pub(crate) fn http_get(addr: &str, path: &str, key: Option<&str>) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn keys_are_shown_once_and_bootstrap_a_tenant() {
    let env = Env::new();
    let o = env.run(&["tenants", "create", "acme"]);
    assert!(o.status.success(), "{o:?}");
    let tenant = stdout(&o).trim().to_owned();
    assert_eq!(tenant.len(), 36, "{tenant}");
    let o = env.run(&["keys", "create", "--system", "--name", "root"]);
    assert!(o.status.success(), "{o:?}");
    let system = stdout(&o).trim().to_owned();
    assert!(system.starts_with("keel_"), "{system}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("shown only now"));
    let o = env.run(&[
        "keys",
        "create",
        "--tenant",
        "acme",
        "--name",
        "alice",
        "--role",
        "admin",
        "--expires-in",
        "30d",
    ]);
    assert!(o.status.success(), "{o:?}");
    let admin = stdout(&o).trim().to_owned();
    let o = env.run(&["keys", "list", "--json"]);
    let listed = stdout(&o);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(
        !listed.contains(&system[5..]) && !listed.contains(&admin[5..]),
        "keys never listed"
    );
    assert!(listed.contains(&tenant) && listed.contains("\"system\""));
    // Only the key's hash is stored.
    let db = std::fs::read(env.path("data/keel/keel.db")).unwrap();
    let text = String::from_utf8_lossy(&db);
    assert!(
        !text.contains(&admin[5..]),
        "the key text is in the store file"
    );
    // Revoke by id.
    let id = listed
        .lines()
        .find(|l| l.contains("alice"))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(env.run(&["keys", "revoke", &id]).status.success());
    let o = env.run(&["keys", "list", "--tenant", "acme"]);
    assert!(stdout(&o).contains("revoked"), "{}", stdout(&o));
    // Refusals name the problem.
    let o = env.run(&["keys", "create", "--tenant", "nope", "--name", "x"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no tenant named"));
    let o = env.run(&[
        "keys", "create", "--tenant", "acme", "--name", "x", "--role", "system",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--system"));
}

#[test]
fn keel_serve_answers_with_the_keys_it_was_given_and_refuses_plain_http_beyond_loopback() {
    let env = Env::new();
    env.write(
        "config/keel/server.toml",
        &format!("[server]\nworkspace_roots = [\"{}\"]\n", env.ws().display()),
    );
    assert!(env.run(&["tenants", "create", "acme"]).status.success());
    let admin = stdout(&env.run(&[
        "keys", "create", "--tenant", "acme", "--name", "alice", "--role", "admin",
    ]))
    .trim()
    .to_owned();
    let o = env.run(&["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--tls-cert"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (mut child, addr) = spawn_serve(&env);
    assert!(http_get(&addr, "/healthz", None).starts_with("HTTP/1.1 200"));
    assert!(http_get(&addr, "/readyz", None).starts_with("HTTP/1.1 200"));
    assert!(http_get(&addr, "/v1/sessions", None).starts_with("HTTP/1.1 401"));
    let listed = http_get(&addr, "/v1/sessions", Some(&admin));
    assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Runs `keel ARGS` expecting it to exit by itself within 20 s (killed otherwise: a node
/// that started despite a bad setting), and returns its exit code and standard error.
fn exits_by_itself(env: &Env, args: &[&str]) -> (Option<i32>, String) {
    let mut child = env
        .keel()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `[scheduler]` values no worker can run with stop `keel worker` and `keel serve` at start with
/// the key named — not a worker that panics at its first claim (a semaphore of 2⁶³ permits, a
/// lease expiry that overflows) while the process runs on doing nothing, nor turns accepted
/// that never run (`tenant_max_sessions = 0`).
#[test]
fn nodes_refuse_scheduler_values_they_cannot_run_with() {
    let env = Env::new();
    for (value, key) in [
        (
            "concurrency = 9223372036854775807",
            "[scheduler] concurrency",
        ),
        (
            "lease_ttl_ms = 9223372036854775807",
            "[scheduler] lease_ttl_ms",
        ),
        ("tenant_max_sessions = 0", "[scheduler] tenant_max_sessions"),
        ("workers = 100000000", "[scheduler] workers"),
    ] {
        env.write(
            "server.toml",
            &format!(
                "[server]\nworkspace_roots = [\"{}\"]\n[scheduler]\n{value}\n",
                env.ws().display()
            ),
        );
        for cmd in ["worker", "serve"] {
            let (code, err) = exits_by_itself(
                &env,
                &[
                    cmd,
                    "--config",
                    "server.toml",
                    "--metrics-listen",
                    "127.0.0.1:0",
                ],
            );
            assert_eq!(code, Some(1), "keel {cmd} with {value}: {err}");
            assert!(err.contains(key), "keel {cmd} with {value}: {err}");
            assert!(!err.contains("panicked"), "keel {cmd} with {value}: {err}");
        }
    }
}

/// SIGTERM while a node's store does not answer yet (a hung server, a proxy whose backend is
/// gone) stops the node at once with exit 0: the signal is not held until the connection
/// attempt gives up (30 s).
#[test]
fn a_node_stops_on_sigterm_while_its_store_does_not_answer() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepted connections are kept open and never written to.
    std::thread::spawn(move || silent.incoming().filter_map(Result::ok).collect::<Vec<_>>());
    let env = Env::new();
    env.write(
        "server.toml",
        &format!("[server]\nworkspace_roots = [\"{}\"]\n", env.ws().display()),
    );
    let store = format!("postgres://postgres@127.0.0.1:{port}/test");
    for cmd in ["worker", "serve"] {
        let mut child = env
            .keel()
            .args([
                cmd,
                "--store",
                &store,
                "--config",
                "server.toml",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert!(
            child.try_wait().unwrap().is_none(),
            "keel {cmd} exited before the signal"
        );
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("keel {cmd} did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "keel {cmd}: {err}");
        assert!(
            err.contains("stopped before the store answered"),
            "keel {cmd}: {err}"
        );
    }
}

/// SIGTERM while an event stream is open: the stream ends cleanly — its chunked body closed
/// with the last chunk, not cut when the server gave up waiting on it — and `keel serve`
/// exits 0. (Before, graceful shutdown waited on the stream, which never ends by itself,
/// until its 5 s limit and then dropped the connection.)
#[test]
fn an_open_event_stream_ends_cleanly_when_keel_serve_stops() {
    let env = Env::new();
    assert!(env.run(&["tenants", "create", "acme"]).status.success());
    let key = stdout(&env.run(&[
        "keys", "create", "--tenant", "acme", "--name", "alice", "--role", "admin",
    ]))
    .trim()
    .to_owned();
    let (mut child, addr) = spawn_serve(&env);
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Accept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    // The response head arrives: the stream is open.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "closed before the response head"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    crate::common::signal(&child, "TERM");
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .expect("the stream ends (EOF), not a read error or time-out");
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.ends_with("0\r\n\r\n"),
        "the chunked body is closed with its last chunk, not cut: {rest:?}"
    );
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
