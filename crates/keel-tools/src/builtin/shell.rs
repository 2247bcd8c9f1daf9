use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{parse_args, resolve};
use crate::policy::Subject;
use crate::sandbox::Invocation;
use crate::tool::{EffectClass, Tool, ToolContext, ToolOutput, ToolProgress};

/// After the command ends, how long to keep collecting output still held open by a process that
/// left the process group (ms).
const DRAIN_GRACE_MS: u64 = 2_000;

/// `shell {command, timeout_ms?, workdir?}`: runs `bash -c command` in `workdir` (relative to the
/// workspace, default its root) in its own process group with stdin closed, under the sandbox.
/// stdout and stderr are merged in order. The timeout (default 120,000 ms; a `timeout_ms` above
/// [`crate::tool::ToolLimits::shell_max_timeout_ms`] is lowered to it) and cancellation kill
/// the whole process group, grandchildren included; so does the end of the command (background
/// processes do not outlive the call). Output shown to the model is capped (head and tail kept,
/// with a marker saying how much was cut); when cut, the full output is stored as an artifact.
/// The result states exit code, duration and whether it timed out.
#[derive(Debug, Default, Clone, Copy)]
pub struct Shell;

#[derive(Deserialize)]
struct Args {
    command: String,
    timeout_ms: Option<u64>,
    workdir: Option<String>,
}

#[async_trait]
impl Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn description(&self) -> &str {
        "Run a bash command in the workspace (stdin is closed; stdout and stderr are merged). \
         Optional timeout_ms (default 120000) and workdir relative to the workspace root. \
         Long output is cut in the middle; the full output can be read back with read_file."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command line to run."},
                "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill the command after this many milliseconds (default 120000)."},
                "workdir": {"type": "string", "description": "Working directory relative to the workspace root (default \".\")."}
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }

    fn subject(&self, args: &Value) -> Subject {
        Subject::command(
            args.get("command")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            args.get("workdir").and_then(Value::as_str).unwrap_or("."),
        )
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let args: Args = match parse_args(self.name(), args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        if args.command.trim().is_empty() {
            return ToolOutput::not_performed(
                "shell failed: command is empty; give the bash command line to run",
            );
        }
        // The model's timeout_ms is a wish: the configured maximum (the session's tool
        // timeout) wins, and the result says so.
        let asked = args
            .timeout_ms
            .unwrap_or(ctx.limits.shell_default_timeout_ms);
        let timeout_ms = asked.min(ctx.limits.shell_max_timeout_ms);
        let clamped = (asked > timeout_ms).then_some(asked);
        let workdir = match resolve("shell", ctx, args.workdir.as_deref().unwrap_or(".")) {
            Ok(r) => r,
            Err(out) => return out,
        };
        if !workdir.exists || !workdir.absolute.is_dir() {
            return ToolOutput::not_performed(format!(
                "shell failed: workdir `{}` is not an existing directory; give a directory relative to the workspace root, or leave workdir out to run in the root",
                workdir.relative
            ));
        }
        let mut out = run(&args.command, &workdir.absolute, timeout_ms, ctx).await;
        if let Some(asked) = clamped {
            out.content.push_str(&format!(
                "\n[timeout_ms {asked} was lowered to the {timeout_ms} ms limit for tool calls]"
            ));
        }
        out
    }
}

/// Output collected from the pipe: head and tail for the model, everything (bounded) for the artifact.
struct Capture {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    half_cap: usize,
    total: u64,
    full: Vec<u8>,
    full_cap: usize,
}

impl Capture {
    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.full_cap.saturating_sub(self.full.len());
        self.full.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let mut rest = chunk;
        if self.head.len() < self.half_cap {
            let take = rest.len().min(self.half_cap - self.head.len());
            self.head.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        self.tail.extend(rest.iter().copied());
        while self.tail.len() > self.half_cap {
            self.tail.pop_front();
        }
    }

    fn cut_bytes(&self) -> u64 {
        self.total - self.head.len() as u64 - self.tail.len() as u64
    }
}

/// Kills the process group on drop unless disarmed (covers the call future being dropped).
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            kill_group(pgid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(unix)]
fn kill_group(pgid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        // ESRCH (already gone) is fine.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

async fn run(
    command: &str,
    workdir: &std::path::Path,
    timeout_ms: u64,
    ctx: &ToolContext,
) -> ToolOutput {
    let started = Instant::now();
    let (reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => {
            return ToolOutput::not_performed(format!(
                "shell failed: cannot create an output pipe: {e}"
            ));
        }
    };
    // The read end is read on the runtime (non-blocking, epoll), not by a thread per call.
    let reader = match tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into()) {
        Ok(r) => r,
        Err(e) => {
            return ToolOutput::not_performed(format!(
                "shell failed: cannot watch the output pipe: {e}"
            ));
        }
    };
    let writer_err = match writer.try_clone() {
        Ok(w) => w,
        Err(e) => {
            return ToolOutput::not_performed(format!(
                "shell failed: cannot duplicate the output pipe: {e}"
            ));
        }
    };
    let invocation = Invocation {
        program: "bash".into(),
        args: vec!["-c".into(), command.to_owned()],
        workdir: workdir.to_path_buf(),
        stdout: writer.into(),
        stderr: writer_err.into(),
    };
    // The process leads its own process group; stdin is /dev/null. Starting it counts against
    // the call's time limit and stops at its cancellation (a stuck sandbox launcher must not
    // hold the call for the launcher's own setup limit): a start given up on closes the
    // launcher's lifeline, which ends whatever it started.
    let spawned = tokio::select! {
        spawned = ctx.sandbox.spawn(invocation, ctx.workspace.root()) => spawned,
        () = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {
            return ToolOutput::error(format!(
                "shell failed: timed out after {timeout_ms} ms while the sandbox was starting the \
                 command; it was stopped before it could run to the end"
            ))
            .with_details(json!({"sandbox": ctx.sandbox.mode().as_str(), "spawned": false, "timed_out": true}));
        }
        () = ctx.cancel.cancelled() => {
            return ToolOutput::cancelled("shell cancelled while the sandbox was starting the command")
                .with_details(json!({"sandbox": ctx.sandbox.mode().as_str(), "spawned": false, "cancelled": true}));
        }
    };
    // The invocation (and with it the parent's copies of the pipe's write end) is gone now.
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return ToolOutput::not_performed(format!(
                "shell failed: {e}; the command was not run"
            ))
            .with_details(json!({"sandbox": ctx.sandbox.mode().as_str(), "spawned": false}));
        }
    };
    let guard = GroupGuard(child.id().and_then(|id| i32::try_from(id).ok()));

    let capture = Arc::new(Mutex::new(Capture {
        head: Vec::new(),
        tail: std::collections::VecDeque::new(),
        half_cap: ctx.limits.shell_output_cap_bytes / 2,
        total: 0,
        full: Vec::new(),
        full_cap: ctx.limits.artifact_max_bytes,
    }));
    let mut done_rx = {
        let capture = Arc::clone(&capture);
        let progress = Arc::clone(&ctx.progress);
        let call_id = ctx.call_id.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            let mut reader = reader;
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => {
                        if let Ok(mut c) = capture.lock() {
                            c.push(&buf[..n]);
                        }
                        progress.report(
                            &call_id,
                            ToolProgress::Output {
                                text: String::from_utf8_lossy(&buf[..n]).into_owned(),
                            },
                        );
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        })
    };

    let mut timed_out = false;
    let mut cancelled = false;
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        () = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {
            timed_out = true;
            None
        }
        () = ctx.cancel.cancelled() => {
            cancelled = true;
            None
        }
    };
    // Kill whatever is left of the group: on timeout or cancel the command itself, otherwise any
    // background processes it started. A launcher the session's holder forked is not in a
    // group of keel's: it is ended through its lifeline (and ends everything of the command's).
    guard.kill();
    if timed_out || cancelled {
        let _ = child.start_kill();
    }
    let status = match status {
        Some(s) => Some(s),
        None => child.wait().await.ok(),
    };
    let duration_ms = started.elapsed().as_millis() as u64;
    let drained = tokio::time::timeout(Duration::from_millis(DRAIN_GRACE_MS), &mut done_rx)
        .await
        .is_ok();
    // A reader still waiting (a process outside the group holds the pipe open) stops here.
    done_rx.abort();

    let (shown, total, cut, full) = match capture.lock() {
        Ok(c) => {
            let cut = c.cut_bytes();
            let tail: Vec<u8> = c.tail.iter().copied().collect();
            let full = if cut > 0 { Some(c.full.clone()) } else { None };
            let truncated_full = c.total > c.full.len() as u64;
            (
                (
                    String::from_utf8_lossy(&c.head).into_owned(),
                    String::from_utf8_lossy(&tail).into_owned(),
                ),
                c.total,
                cut,
                full.map(|f| (f, truncated_full)),
            )
        }
        Err(_) => ((String::new(), String::new()), 0, 0, None),
    };
    let mut artifact = None;
    let mut content = shown.0;
    if cut > 0 {
        let pointer = match full {
            Some((bytes, artifact_truncated)) => {
                match ctx.artifacts.put(&ctx.call_id, "shell-output", bytes).await {
                    Ok(r) => {
                        let note = if artifact_truncated {
                            format!(" (only its first {} bytes were kept)", r.size_bytes)
                        } else {
                            String::new()
                        };
                        let text = format!(
                            "the full output is saved{note}: read it with read_file {{\"path\": \"{}\"}}",
                            r.uri()
                        );
                        artifact = Some(r);
                        text
                    }
                    Err(e) => format!("the full output could not be saved: {e}"),
                }
            }
            None => "the full output was not kept".to_owned(),
        };
        content.push_str(&format!(
            "\n… [{cut} bytes of output cut out of {total}; {pointer}] …\n"
        ));
    }
    content.push_str(&shown.1);
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    let exit_code = status.and_then(|s| s.code());
    #[cfg(unix)]
    let signal = status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s));
    #[cfg(not(unix))]
    let signal: Option<i32> = None;
    let summary = if timed_out {
        format!(
            "[timed out after {timeout_ms} ms; the process group was killed; ran {duration_ms} ms]"
        )
    } else if cancelled {
        format!("[cancelled; the process group was killed after {duration_ms} ms]")
    } else if let Some(code) = exit_code {
        format!("[exit code {code}; {duration_ms} ms]")
    } else {
        format!(
            "[killed by signal {}; {duration_ms} ms]",
            signal.unwrap_or_default()
        )
    };
    if content.is_empty() {
        content.push_str("(no output)\n");
    }
    content.push_str(&summary);
    if !drained {
        content.push_str("\n[output collection stopped: a process outside the process group kept the output open]");
    }
    let status = if cancelled {
        crate::tool::ToolResultStatus::Cancelled
    } else if timed_out || exit_code != Some(0) {
        crate::tool::ToolResultStatus::Failed
    } else {
        crate::tool::ToolResultStatus::Succeeded
    };
    ToolOutput {
        status,
        content,
        details: json!({
            "exit_code": exit_code,
            "signal": signal,
            "duration_ms": duration_ms,
            "timed_out": timed_out,
            "cancelled": cancelled,
            "output_bytes": total,
            "output_cut_bytes": cut,
            "sandbox": ctx.sandbox.mode().as_str(),
        }),
        artifact,
        // The command ran: whatever its exit status, it may have acted.
        not_performed: false,
    }
}
