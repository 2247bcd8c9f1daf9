//! `keel --server URL`: the session commands against a started `keel serve`, compared with the
//! same commands run locally on the same scripted model — exit codes, the JSONL stream's event
//! types and result line, and the lines people read (ids, times and paths normalised).

use std::process::{Child, Command, Output};

use crate::common::{Env, jsonl_lines, spawn_serve_metrics, stdout};

mod basics;
mod cancel;
mod close;
mod decisions;
mod follow;
mod interactive;
mod mcp;
mod memory;
mod postgres;
mod resume;
mod tls;

/// `write_file` asks in the default mode: the run waits on a human, then finishes. (Not
/// `shell`: its output ends with its duration in ms, so the next step's input — and the token
/// counts compared here — would vary with the timing.)
pub(super) const ASK: &str = r#"{"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]}
{"text": "done"}
"#;

/// A started `keel serve` and the admin key of its tenant `acme`; killed on drop.
pub(super) struct Served {
    child: Child,
    /// The API's base URL.
    pub(super) url: String,
    /// An admin key of tenant `acme`.
    pub(super) key: String,
    /// The `HOST:PORT` of its `/metrics`.
    pub(super) metrics: String,
}

impl Served {
    /// Sends a signal (`TERM`, `INT`, …) to the server.
    pub(super) fn signal(&self, name: &str) {
        crate::common::signal(&self.child, name);
    }

    /// Whether the server process is still running.
    pub(super) fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (≤ `secs`) for the server to exit; its exit code (`None`: killed by a signal).
    pub(super) fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "keel serve did not exit within {secs} s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts `keel serve ARGS` again on `env` (same store, settings and key) after it
    /// stopped; `url` names its new address.
    pub(super) fn restart(&mut self, env: &Env, args: &[&str]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, addr, metrics) = spawn_serve_metrics(env, args);
        self.child = child;
        self.url = format!("http://{addr}");
        self.metrics = metrics;
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How [`serve_with`] starts the server.
#[derive(Default)]
pub(super) struct Options<'a> {
    /// The store (`store =` in the user's keel.toml, so `tenants` and `keys` use it too);
    /// default: `env`'s SQLite file.
    pub(super) store: Option<&'a str>,
    /// More `[server]` lines.
    pub(super) server_toml: &'a str,
    /// More `keel serve` arguments (`--tls-cert …`).
    pub(super) args: &'a [&'a str],
    /// The host in the URL (default `127.0.0.1`; `localhost` for a certificate naming it).
    pub(super) host: Option<&'a str>,
}

/// A `keel serve` on a free port of `env`'s store, with `env`'s root as its workspace root and
/// script models allowed, and an admin key of tenant `acme`.
pub(super) fn serve(env: &Env) -> Served {
    serve_with(env, &Options::default())
}

/// As [`serve`], with options.
pub(super) fn serve_with(env: &Env, o: &Options) -> Served {
    env.write(
        "config/keel/server.toml",
        &format!(
            "[server]\nworkspace_roots = [\"{}\"]\nallow_script_models = true\n{}\n",
            env.dir.path().display(),
            o.server_toml
        ),
    );
    if let Some(store) = o.store {
        env.write("config/keel/keel.toml", &format!("store = {store:?}\n"));
    }
    let o_tenant = env.run(&["tenants", "create", "acme"]);
    assert!(
        o_tenant.status.success(),
        "{}",
        crate::common::stderr(&o_tenant)
    );
    let key = stdout(&env.run(&[
        "keys", "create", "--tenant", "acme", "--name", "alice", "--role", "admin",
    ]))
    .trim()
    .to_owned();
    let (child, addr, metrics) = spawn_serve_metrics(env, o.args);
    let scheme = if o.args.contains(&"--tls-cert") {
        "https"
    } else {
        "http"
    };
    let addr = match o.host {
        Some(host) => format!("{host}:{}", addr.rsplit(':').next().unwrap()),
        None => addr,
    };
    Served {
        child,
        url: format!("{scheme}://{addr}"),
        key,
        metrics,
    }
}

/// `keel` in `env` pointed at the server with its key (`KEEL_SERVER`, `KEEL_API_KEY`),
/// standard input closed.
pub(super) fn remote_cmd(env: &Env, s: &Served) -> Command {
    let mut c = env.keel();
    c.env("KEEL_SERVER", &s.url).env("KEEL_API_KEY", &s.key);
    c
}

/// Runs `keel --server URL ARGS` in `env` with the served key.
pub(super) fn remote<A: AsRef<std::ffi::OsStr>>(env: &Env, s: &Served, args: &[A]) -> Output {
    remote_cmd(env, s).args(args).output().unwrap()
}

/// The session id of a JSONL line.
pub(super) fn session_of(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}

/// `text` with ids, times, durations and `env`'s root made comparable.
pub(super) fn norm(env: &Env, text: &str) -> String {
    let root = std::fs::canonicalize(env.dir.path()).unwrap();
    let mut t = text
        .replace(&root.display().to_string(), "<root>")
        .replace(&env.dir.path().display().to_string(), "<root>");
    let mut out = String::new();
    // UUIDs (8-4-4-4-12 hex) → <id>.
    let b = t.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let is_uuid = t.get(i..i + 36).is_some_and(|w| {
            w.char_indices().all(|(k, c)| {
                if [8, 13, 18, 23].contains(&k) {
                    c == '-'
                } else {
                    c.is_ascii_hexdigit()
                }
            })
        });
        if is_uuid {
            out.push_str("<id>");
            i += 36;
        } else {
            let c = t[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    t = out;
    t
}

/// The last line of a JSONL stream, the result line, made comparable (duration and expiry
/// times zeroed).
pub(super) fn result_line(o: &Output) -> serde_json::Value {
    comparable(jsonl_lines(&o.stdout).pop().unwrap())
}

/// A result line with its duration and the expiry times of its pending approvals zeroed.
pub(super) fn comparable(mut r: serde_json::Value) -> serde_json::Value {
    r["duration_ms"] = 0.into();
    if let Some(pending) = r["pending"].as_array_mut() {
        for p in pending {
            p["expires_at"] = "<ts>".into();
        }
    }
    r
}

/// A comparable result line without its input token counts: for runs whose tool output holds
/// a duration (`shell`'s `[… 312 ms]`), which the next step's input carries.
pub(super) fn without_input_tokens(mut r: serde_json::Value) -> serde_json::Value {
    r["usage"]["input_tokens"] = 0.into();
    if let Some(models) = r["usage_by_model"].as_object_mut() {
        for m in models.values_mut() {
            m["usage"]["input_tokens"] = 0.into();
        }
    }
    r
}

/// The event types of a JSONL stream, the result line left out.
pub(super) fn types(o: &Output) -> Vec<String> {
    jsonl_lines(&o.stdout)
        .iter()
        .filter(|l| l["type"] != "result")
        .map(|l| l["type"].as_str().unwrap().to_owned())
        .collect()
}

/// `run --workspace WS --model script:script.jsonl FLAGS… PROMPT` for a server of `env`: its
/// workspace by its path.
pub(super) fn run_args(env: &Env, flags: &[&str], prompt: &str) -> Vec<String> {
    run_args_in(&env.ws().display().to_string(), flags, prompt)
}

fn run_args_in(ws: &str, flags: &[&str], prompt: &str) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--workspace", ws, "--model", "script:script.jsonl"]
        .map(str::to_owned)
        .to_vec();
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    args.push(prompt.to_owned());
    args
}

/// Asserts both answers' standard error say `needle`.
pub(super) fn both_say((l, r): &(Output, Output), needle: &str) {
    for (side, o) in [("local", l), ("remote", r)] {
        let err = crate::common::stderr(o);
        assert!(err.contains(needle), "{side}: {needle:?} not in {err}");
    }
}

/// The same script run locally (`local`) and against a server (`far`, served by `s`), so each
/// command can be run on both sides and the answers compared.
pub(super) struct Pair {
    pub(super) local: Env,
    pub(super) far: Env,
    pub(super) s: Served,
}

impl Pair {
    /// Two environments with `script` as `script.jsonl`, the far one served with `o`.
    pub(super) fn new(script: &str, o: &Options) -> Self {
        let local = Env::new();
        local.write("script.jsonl", script);
        let far = Env::new();
        far.write("script.jsonl", script);
        let s = serve_with(&far, o);
        Pair { local, far, s }
    }

    /// [`run_args`] on one side (the far workspace named by its path on the server).
    pub(super) fn run_args(&self, remote: bool, flags: &[&str], prompt: &str) -> Vec<String> {
        if remote {
            run_args(&self.far, flags, prompt)
        } else {
            run_args_in("ws", flags, prompt)
        }
    }

    /// A `keel` command on one side: local, or pointed at the server.
    pub(super) fn cmd(&self, remote: bool) -> Command {
        if remote {
            remote_cmd(&self.far, &self.s)
        } else {
            self.local.keel()
        }
    }

    /// Runs `keel LOCAL_ARGS` locally and `keel --server URL REMOTE_ARGS` remotely.
    pub(super) fn both(&self, local_args: &[&str], remote_args: &[&str]) -> (Output, Output) {
        (
            self.local.run(local_args),
            remote(&self.far, &self.s, remote_args),
        )
    }

    /// Asserts the two answers have exit code `code` and the same standard output, ids, times
    /// and roots normalised; returns the normalised output.
    pub(super) fn same(&self, (l, r): &(Output, Output), code: i32) -> String {
        let err = |o: &Output| crate::common::stderr(o);
        assert_eq!(l.status.code(), Some(code), "local: {}", err(l));
        assert_eq!(r.status.code(), Some(code), "remote: {}", err(r));
        let (lo, ro) = (norm(&self.local, &stdout(l)), norm(&self.far, &stdout(r)));
        assert_eq!(lo, ro, "standard output, local vs remote");
        lo
    }
}
