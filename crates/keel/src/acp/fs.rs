//! File access through the editor: when the client offers `fs/read_text_file` and
//! `fs/write_text_file`, `read_file`, `edit_file` and `write_file` read and write through it
//! (the editor's unsaved buffers are what the agent sees and changes). They keep the built-in
//! tools' names, schemas, effect classes and policy subjects, so policy, approvals and the
//! effect journal treat them exactly as the built-ins; paths still resolve inside the workspace
//! first (nothing outside it, nor a protected path, is asked for).
//!
//! The connection lives on the ACP task (not `Send`); the tools run on the runtime's tasks, so
//! each request crosses a channel to [`serve`], which sends it to the client.

use std::rc::Rc;
use std::sync::Arc;

use agent_client_protocol::{self as acp, Client as _};
use keel_tools::policy::Subject;
use keel_tools::tool::{Tool, ToolContext, ToolOutput};
use keel_tools::{EffectClass, ToolRegistry};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// One file request for the client.
#[derive(Debug)]
pub enum FsCall {
    /// `fs/read_text_file`: the file's text (from `line`, 1-based, at most `limit` lines).
    Read {
        /// The ACP session.
        session: String,
        /// Absolute path.
        path: std::path::PathBuf,
        /// First line, 1-based.
        line: Option<u32>,
        /// Most lines.
        limit: Option<u32>,
        /// The text, or the client's error.
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// `fs/write_text_file`.
    Write {
        /// The ACP session.
        session: String,
        /// Absolute path.
        path: std::path::PathBuf,
        /// The whole new text.
        content: String,
        /// Done, or the client's error.
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// Sends each request to the client until the channel closes (runs on the ACP task). The
/// requests go out concurrently — one the editor leaves unanswered holds up no other, in any
/// session — and a request whose tool call is gone (cancelled, timed out: its reply receiver
/// dropped) is no longer waited on; its late answer is ignored.
pub async fn serve(conn: Rc<acp::AgentSideConnection>, mut rx: mpsc::Receiver<FsCall>) {
    while let Some(call) = rx.recv().await {
        tokio::task::spawn_local(one(conn.clone(), call));
    }
}

/// `fut`'s result to `reply`, unless `reply`'s receiver goes away first.
async fn answer<T>(
    mut reply: oneshot::Sender<Result<T, String>>,
    fut: impl std::future::Future<Output = Result<T, String>>,
) {
    tokio::select! {
        r = fut => { let _ = reply.send(r); }
        () = reply.closed() => {}
    }
}

async fn one(conn: Rc<acp::AgentSideConnection>, call: FsCall) {
    match call {
        FsCall::Read {
            session,
            path,
            line,
            limit,
            reply,
        } => {
            let req = serde_json::from_value::<acp::ReadTextFileRequest>(
                json!({"sessionId": session, "path": path, "line": line, "limit": limit}),
            );
            answer(reply, async {
                conn.read_text_file(req.map_err(|e| e.to_string())?)
                    .await
                    .map(|r| r.content)
                    .map_err(|e| e.to_string())
            })
            .await;
        }
        FsCall::Write {
            session,
            path,
            content,
            reply,
        } => {
            let req = serde_json::from_value::<acp::WriteTextFileRequest>(
                json!({"sessionId": session, "path": path, "content": content}),
            );
            answer(reply, async {
                conn.write_text_file(req.map_err(|e| e.to_string())?)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .await;
        }
    }
}

/// The built-in tools, with `read_file` (when `read`) and `edit_file` / `write_file` (when
/// `write` and `read`) going through the client.
///
/// # Errors
/// A built-in schema failing to compile (never in practice).
pub fn registry(
    tx: &mpsc::Sender<FsCall>,
    read: bool,
    write: bool,
) -> Result<ToolRegistry, keel_tools::ToolsError> {
    let mut tools = ToolRegistry::new();
    for tool in keel_tools::builtin::builtin_tools() {
        let through = match tool.name() {
            "read_file" => read,
            "write_file" | "edit_file" => read && write,
            _ => false,
        };
        if through {
            tools.register(Arc::new(ClientFsTool {
                inner: tool,
                tx: tx.clone(),
            }))?;
        } else {
            tools.register(tool)?;
        }
    }
    Ok(tools)
}

/// A built-in file tool whose I/O goes to the client.
struct ClientFsTool {
    inner: Arc<dyn Tool>,
    tx: mpsc::Sender<FsCall>,
}

impl ClientFsTool {
    async fn read(&self, session: &str, path: &std::path::Path) -> Result<String, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(FsCall::Read {
                session: session.to_owned(),
                path: path.to_owned(),
                line: None,
                limit: None,
                reply,
            })
            .await
            .map_err(|_| "the editor is gone".to_owned())?;
        rx.await.map_err(|_| "the editor is gone".to_owned())?
    }

    async fn write(
        &self,
        session: &str,
        path: &std::path::Path,
        content: String,
    ) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(FsCall::Write {
                session: session.to_owned(),
                path: path.to_owned(),
                content,
                reply,
            })
            .await
            .map_err(|_| "the editor is gone".to_owned())?;
        rx.await.map_err(|_| "the editor is gone".to_owned())?
    }

    async fn run(&self, args: &Value, ctx: &ToolContext) -> Result<String, String> {
        let session = ctx
            .scope
            .map(|s| s.session_id.to_string())
            .ok_or("no session")?;
        let arg = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default();
        let resolved = ctx
            .workspace
            .resolve(arg("path"))
            .map_err(|e| e.to_string())?;
        let shown = resolved.relative.clone();
        match self.inner.name() {
            "read_file" => {
                let text = self.read(&session, &resolved.absolute).await?;
                let offset = args
                    .get("offset")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1);
                let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(2000);
                let first = usize::try_from(offset - 1).unwrap_or(usize::MAX);
                let most = usize::try_from(limit).unwrap_or(usize::MAX);
                Ok(text
                    .lines()
                    .enumerate()
                    .skip(first)
                    .take(most)
                    .map(|(i, l)| format!("{:>6}\t{l}\n", i + 1))
                    .collect())
            }
            "write_file" => {
                let content = arg("content").to_owned();
                let n = content.len();
                self.write(&session, &resolved.absolute, content).await?;
                Ok(format!("Wrote `{shown}` ({n} bytes) in the editor"))
            }
            _ => {
                let (old, new) = (arg("old_string"), arg("new_string"));
                let all = args
                    .get("replace_all")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let text = self.read(&session, &resolved.absolute).await?;
                let count = if old.is_empty() {
                    0
                } else {
                    text.matches(old).count()
                };
                if count == 0 {
                    return Err(format!("old_string not found in `{shown}`"));
                }
                if count > 1 && !all {
                    return Err(format!(
                        "old_string occurs {count} times in `{shown}`: give more context or replace_all"
                    ));
                }
                let edited = if all {
                    text.replace(old, new)
                } else {
                    text.replacen(old, new, 1)
                };
                self.write(&session, &resolved.absolute, edited).await?;
                Ok(format!(
                    "Edited `{shown}` in the editor: replaced {} occurrence{}",
                    if all { count } else { 1 },
                    if all && count > 1 { "s" } else { "" }
                ))
            }
        }
    }
}

#[async_trait::async_trait]
impl Tool for ClientFsTool {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn input_schema(&self) -> Value {
        self.inner.input_schema()
    }
    fn effect(&self) -> EffectClass {
        self.inner.effect()
    }
    fn parallel_safe(&self) -> bool {
        self.inner.parallel_safe()
    }
    fn subject(&self, args: &Value) -> Subject {
        self.inner.subject(args)
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        if ctx.scope.is_none() {
            // Not a model's call: an `@path` mention or a `resource_link` the input pipeline
            // attaches before the turn exists, read by the local tool (from disk, under the
            // same workspace and policy checks); the editor's buffers serve the turn's calls.
            return self.inner.call(args, ctx).await;
        }
        match self.run(&args, ctx).await {
            Ok(text) => ToolOutput::success(text),
            Err(e) => ToolOutput::error(e),
        }
    }
}
