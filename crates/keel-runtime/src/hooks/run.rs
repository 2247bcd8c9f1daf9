//! Running one hook: a command (`sh -c`, JSON on standard input) or an HTTP POST, under its
//! time limit and the turn's cancellation, and reading its answer.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use keel_core::{HookDecision, HookEvent};
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::{Action, Hook, HookAnswer};

/// The most of a hook's standard output or response body read (1 MiB); its standard error:
/// 16 KiB.
const MAX_ANSWER_BYTES: usize = 1 << 20;
const MAX_STDERR_BYTES: usize = 16 << 10;

/// What a hook is given: one JSON object on standard input, or as the POST body. Fields that do
/// not apply to the event are absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HookInput {
    /// The event (`pre_tool_use`, …).
    pub hook_event: String,
    /// The hook's name.
    pub hook: String,
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// The workspace (the command's working directory).
    pub cwd: String,
    /// The session's permission mode.
    pub permission_mode: String,
    /// `user_prompt_submit`, `session_start`: the turn's input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Tool events: the tool's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Tool events: the call's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Tool events: the exact arguments the call would run with (after earlier rewrites).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_input: Option<Value>,
    /// `post_tool_use`: `{"status", "output", "is_error"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_result: Option<Value>,
    /// `permission_request`: the pending approval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// `stop`: the model's last text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_message: Option<String>,
    /// `stop`: how many times stop hooks already made this turn continue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_continues: Option<u32>,
    /// `pre_compact`: `threshold` (the context reached the compaction threshold) or
    /// `overflow` (the provider refused the context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

/// One hook's run, as `hook.ran` journals it.
#[derive(Debug, Clone, PartialEq)]
pub struct HookRun {
    /// The hook.
    pub hook: String,
    /// Milliseconds it ran.
    pub duration_ms: u64,
    /// What it decided (a failure: [`Hook::failure_decision`]).
    pub decision: HookDecision,
    /// Its reason.
    pub reason: Option<String>,
    /// A rewrite's input.
    pub input: Option<Value>,
    /// Context for the model.
    pub context: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

/// How a run ended before it had an answer.
enum Raw {
    /// A command's exit status (code, `None` when killed by a signal), its output and errors.
    Exit {
        code: Option<i32>,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// An HTTP status and body.
    Http { status: u16, body: Vec<u8> },
    /// It could not run or answer.
    Failed(String),
}

impl Hook {
    /// Runs the hook on `input` in `workspace` with environment `env`; `None` when `cancel`
    /// fired first (nothing is journaled then: the turn is ending).
    pub(crate) async fn run(
        &self,
        input: &HookInput,
        workspace: &Path,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        client: Option<&reqwest::Client>,
        cancel: &CancellationToken,
    ) -> Option<HookRun> {
        let started = Instant::now();
        let body = serde_json::to_vec(input).unwrap_or_default();
        let raw = match &self.action {
            Action::Command(command) => {
                run_command(command, &body, workspace, env, self.timeout, cancel).await?
            }
            Action::Http { url, headers } => match client {
                None => Raw::Failed("no HTTP client".into()),
                Some(client) => {
                    let send = client
                        .post(url.clone())
                        .headers(headers.clone())
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .timeout(self.timeout)
                        .body(body)
                        .send();
                    tokio::select! {
                        r = send => match r {
                            Ok(resp) => {
                                let status = resp.status().as_u16();
                                match read_body(resp).await {
                                    Ok(body) => Raw::Http { status, body },
                                    Err(e) => Raw::Failed(e),
                                }
                            }
                            Err(e) if e.is_timeout() => Raw::Failed(format!(
                                "timed out after {} ms",
                                self.timeout.as_millis()
                            )),
                            Err(e) => Raw::Failed(format!("the request failed: {e}")),
                        },
                        () = cancel.cancelled() => return None,
                    }
                }
            },
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Some(self.interpret(raw, duration_ms))
    }

    /// What a run's exit status (or HTTP status) and answer decide.
    fn interpret(&self, raw: Raw, duration_ms: u64) -> HookRun {
        let mut run = HookRun {
            hook: self.name.clone(),
            duration_ms,
            decision: HookDecision::None,
            reason: None,
            input: None,
            context: None,
            error: None,
        };
        let answer = match raw {
            Raw::Exit {
                code: Some(0),
                stdout,
                ..
            }
            | Raw::Http {
                status: 200..=299,
                body: stdout,
            } => stdout,
            Raw::Exit {
                code: Some(2),
                stderr,
                ..
            } => {
                // The blocking answer: standard error is the reason.
                let reason = String::from_utf8_lossy(&stderr).trim().to_owned();
                let reason = (!reason.is_empty()).then_some(reason);
                match self.event {
                    HookEvent::PreToolUse
                    | HookEvent::PermissionRequest
                    | HookEvent::UserPromptSubmit => {
                        run.decision = HookDecision::Deny;
                        run.reason = reason;
                    }
                    HookEvent::Stop => {
                        run.decision = HookDecision::Continue;
                        run.reason = reason;
                    }
                    HookEvent::SessionStart | HookEvent::PostToolUse | HookEvent::PreCompact => {
                        run.context = reason;
                    }
                }
                return run;
            }
            Raw::Exit { code, stderr, .. } => {
                let stderr = String::from_utf8_lossy(&stderr).trim().to_owned();
                let how = code.map_or_else(
                    || "was killed by a signal".to_owned(),
                    |c| format!("exited with status {c}"),
                );
                return self.failed(
                    run,
                    if stderr.is_empty() {
                        how
                    } else {
                        format!("{how}: {stderr}")
                    },
                );
            }
            Raw::Http { status, body } => {
                let text = String::from_utf8_lossy(&body);
                let text = text.trim();
                let short: String = text.chars().take(200).collect();
                return self.failed(
                    run,
                    format!("answered HTTP {status} {short}").trim().to_owned(),
                );
            }
            Raw::Failed(e) => return self.failed(run, e),
        };
        let text = String::from_utf8_lossy(&answer);
        if text.trim().is_empty() {
            return run;
        }
        let parsed: HookAnswer = match serde_json::from_str(text.trim()) {
            Ok(a) => a,
            Err(e) => {
                return self.failed(
                    run,
                    format!("answered something that is not the hook JSON: {e}"),
                );
            }
        };
        match parsed.decision(self.event) {
            Ok(d) => {
                run.decision = d;
                run.reason = parsed.reason.filter(|r| !r.trim().is_empty());
                run.context = parsed.context.filter(|c| !c.trim().is_empty());
                if d == HookDecision::Rewrite {
                    run.input = parsed.input;
                }
                run
            }
            Err(e) => self.failed(run, e),
        }
    }

    fn failed(&self, mut run: HookRun, error: String) -> HookRun {
        run.decision = self.failure_decision();
        if run.decision == HookDecision::Deny {
            run.reason = Some(format!(
                "the hook `{}` failed and fails closed ({error})",
                self.name
            ));
        }
        run.error = Some(error);
        run
    }
}

/// Runs `sh -c command` with `input` on standard input; `None` when cancelled (the process
/// group is killed).
async fn run_command(
    command: &str,
    input: &[u8],
    workspace: &Path,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    timeout: Duration,
    cancel: &CancellationToken,
) -> Option<Raw> {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(workspace)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Some(Raw::Failed(format!("could not start `sh`: {e}"))),
    };
    let pid = child.id();
    let kill_group = || {
        if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let input = input.to_vec();
    let work = async {
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A hook that does not read its input is no error.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, out, err, status) = tokio::join!(
            write,
            read_bounded(stdout, MAX_ANSWER_BYTES),
            read_bounded(stderr, MAX_STDERR_BYTES),
            child.wait()
        );
        match status {
            Ok(s) => Raw::Exit {
                code: s.code(),
                stdout: out,
                stderr: err,
            },
            Err(e) => Raw::Failed(format!("waiting for the command: {e}")),
        }
    };
    tokio::select! {
        raw = work => {
            // Whatever it left behind in its group goes with it.
            kill_group();
            Some(raw)
        }
        () = tokio::time::sleep(timeout) => {
            kill_group();
            Some(Raw::Failed(format!("timed out after {} ms", timeout.as_millis())))
        }
        () = cancel.cancelled() => {
            kill_group();
            None
        }
    }
}

/// Reads up to `max` bytes and drains the rest (so the writer never blocks on a full pipe).
async fn read_bounded(pipe: Option<impl AsyncRead + Unpin>, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(mut pipe) = pipe else {
        return out;
    };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = max.saturating_sub(out.len());
                out.extend_from_slice(buf.get(..n.min(room)).unwrap_or_default());
            }
        }
    }
}

/// Reads a response body up to [`MAX_ANSWER_BYTES`].
async fn read_body(mut resp: reqwest::Response) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if out.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(format!("answered more than {MAX_ANSWER_BYTES} bytes"));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
}
