//! `keel acp`: Keel as an Agent Client Protocol agent over stdio, for editors (Zed, JetBrains,
//! Neovim's CodeCompanion, Emacs' agent-shell).
//!
//! ## Layout
//! - [`wire`] — standard input checked as JSON-RPC 2.0 (protocol error codes for malformed
//!   messages), standard output carrying only protocol messages.
//! - [`agent`] — the ACP methods: `initialize` (capabilities, `authMethods`), `session/new`
//!   (a Keel session in the client's `cwd`, with its MCP servers; `auth_required` naming the
//!   variable when a provider key is missing), `session/load` (history replayed as updates),
//!   `session/set_mode` (permission modes), `session/cancel`.
//! - [`fs`] — `read_file`, `edit_file`, `write_file` through the client's `fs/*` when offered.
//! - [`mcp`] — the MCP servers the client passes (`session/new`, `session/load`).
//! - [`turn`] — `session/prompt`: a turn through the input pipeline, streamed, with
//!   permission requests as durable approvals.
//! - [`updates`] — events → `session/update`s (text, reasoning, tool calls with kinds,
//!   locations and diffs) and terminal reasons → stop reasons.
//!
//! Logs go to standard error (`KEEL_LOG`), never to standard output.

pub mod agent;
pub mod fs;
pub mod mcp;
pub mod turn;
pub mod updates;
pub mod wire;

use std::process::ExitCode;
use std::rc::Rc;

use agent_client_protocol as acp;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use crate::cli::{GlobalArgs, RunArgs};

/// Runs the agent until the client closes standard input: then the running turns are
/// cancelled (a turn waiting on a permission request keeps its approval pending), every open
/// request is answered, and `keel acp` exits 0.
///
/// # Errors
/// The async runtime failing to start.
pub fn serve(global: &GlobalArgs, args: &RunArgs) -> anyhow::Result<ExitCode> {
    // Each ACP session runs in the cwd its client names, and stdout carries only protocol
    // messages: these flags would be silently ignored, so they are refused.
    let ignored = [
        (
            global.workspace.is_some(),
            "--workspace (each session runs in the cwd the editor sends)",
        ),
        (
            args.output.is_some(),
            "--output (stdout carries only ACP messages)",
        ),
        (
            global.server.is_some(),
            "--server (its sessions live in the local store; a Keel server is not served over ACP yet)",
        ),
        (
            std::env::var_os(crate::remote::SERVER_ENV).is_some_and(|v| !v.is_empty()),
            "$KEEL_SERVER (its sessions live in the local store; a Keel server is not served over ACP yet): unset it in the environment the editor starts keel acp with",
        ),
    ];
    if let Some((_, flag)) = ignored.iter().find(|(given, _)| *given) {
        return Err(anyhow::Error::new(crate::exit::UsageError(format!(
            "keel acp does not take {flag}"
        ))));
    }
    let rt = crate::cli::tokio_runtime()?;
    rt.block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let pipes = wire::stdio();
                let (fs_tx, fs_rx) = tokio::sync::mpsc::channel(16);
                let agent = Rc::new(agent::KeelAgent::new(global.clone(), args.clone(), fs_tx));
                let slot = agent.conn.clone();
                let mut eof = pipes.eof;
                let watching = agent.clone();
                tokio::task::spawn_local(async move {
                    if eof.wait_for(|ended| *ended).await.is_ok() {
                        watching.disconnected().await;
                    }
                });
                let (conn, io) = acp::AgentSideConnection::new(
                    agent,
                    pipes.outgoing.compat_write(),
                    pipes.incoming.compat(),
                    |fut| {
                        tokio::task::spawn_local(fut);
                    },
                );
                let conn = Rc::new(conn);
                *slot.borrow_mut() = Some(conn.clone());
                tokio::task::spawn_local(fs::serve(conn, fs_rx));
                if let Err(e) = io.await {
                    tracing::warn!("acp: connection: {e}");
                }
            })
            .await;
        crate::mcp::shutdown_all().await;
    });
    Ok(ExitCode::SUCCESS)
}
