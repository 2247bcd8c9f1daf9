//! A small MCP server (stdio, on rmcp's server side) for keel's tests: behaviour the real
//! servers cannot show on demand.
//!
//! Usage: `keel-mcp-test-server [--legacy] [--hang] [--marker PATH]`
//! - `--legacy`: speak only the session-based revision (answers `server/discover` with
//!   "method not found", as servers before 2026-07-28 do); tool-list changes go out as plain
//!   `notifications/tools/list_changed`. Without it: the sessionless revision, changes over
//!   `subscriptions/listen`.
//! - `--hang`: never answer anything (not even the handshake).
//! - `--marker PATH`: where `wait_cancel` writes `cancelled` when the client cancels it.
//!
//! Tools: `echo {text}`, `progress {steps}` (reports progress, then answers), `die` (exits
//! mid-call), `hang` (never answers), `wait_cancel` (answers only when cancelled), `add_tool`
//! (adds `extra` and announces the change), `roots` (asks the client for its roots), `sample`
//! (asks the client to sample), `elicit` (asks the client for input), `peek` (`readOnlyHint`),
//! `fail` (`isError: true`).

// The test server asks for roots and sampling (deprecated by 2026-07-28, SEP-2577) to show
// how keel answers servers of the session-based revision.
#![allow(deprecated)]

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content, ErrorData,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ServerConfig as ServerInfo, SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext, SubscriptionSink};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct TestServer {
    legacy: bool,
    marker: Option<PathBuf>,
    extra: Arc<AtomicBool>,
    sinks: Arc<Mutex<Vec<SubscriptionSink>>>,
}

fn tool(name: &str, description: &str, properties: Value, annotations: Value) -> Option<Tool> {
    serde_json::from_value(json!({
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
        "annotations": annotations,
    }))
    .ok()
}

fn text(t: impl Into<String>) -> CallToolResponse {
    CallToolResponse::Complete(CallToolResult::success(vec![Content::text(t.into())]))
}

impl TestServer {
    fn tools(&self) -> Vec<Tool> {
        let none = json!({});
        let mut tools = vec![
            tool(
                "echo",
                "Echoes its text.",
                json!({"text": {"type": "string"}}),
                none.clone(),
            ),
            tool(
                "progress",
                "Reports progress, then answers.",
                json!({"steps": {"type": "integer", "minimum": 1}}),
                none.clone(),
            ),
            tool("die", "Exits while the call runs.", json!({}), none.clone()),
            tool("hang", "Never answers.", json!({}), none.clone()),
            tool(
                "wait_cancel",
                "Answers only when cancelled.",
                json!({}),
                none.clone(),
            ),
            tool(
                "add_tool",
                "Adds tool `extra` and announces the change.",
                json!({}),
                none.clone(),
            ),
            tool(
                "roots",
                "Asks the client for its roots.",
                json!({}),
                none.clone(),
            ),
            tool(
                "sample",
                "Asks the client to sample its model.",
                json!({}),
                none.clone(),
            ),
            tool(
                "elicit",
                "Asks the client for user input.",
                json!({}),
                none.clone(),
            ),
            tool(
                "peek",
                "Claims to be read-only.",
                json!({}),
                json!({"readOnlyHint": true}),
            ),
            tool("fail", "Answers with isError.", json!({}), none.clone()),
        ];
        if self.extra.load(Ordering::SeqCst) {
            tools.push(tool("extra", "Added at run time.", json!({}), none));
        }
        tools.into_iter().flatten().collect()
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerInfo {
        serde_json::from_value(json!({
            "protocolVersion": if self.legacy { ProtocolVersion::LATEST_WITH_INITIALIZE } else { ProtocolVersion::LATEST },
            "capabilities": {"tools": {"listChanged": true}},
            "serverInfo": {"name": "keel-mcp-test-server", "version": env!("CARGO_PKG_VERSION")},
        }))
        .unwrap_or_else(|_| ServerInfo::new(Default::default()))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.legacy {
            Cow::Owned(vec![
                ProtocolVersion::V_2025_11_25,
                ProtocolVersion::V_2025_06_18,
                ProtocolVersion::V_2025_03_26,
                ProtocolVersion::V_2024_11_05,
            ])
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.sinks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(context.sink().clone());
        context.cancelled().await;
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        match request.name.as_ref() {
            "echo" => Ok(text(
                args.get("text").and_then(Value::as_str).unwrap_or_default(),
            )),
            "progress" => {
                let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(3);
                if let Some(token) = context.meta.get_progress_token() {
                    for step in 1..=steps {
                        let _ = context
                            .peer
                            .notify_progress(
                                serde_json::from_value::<ProgressNotificationParam>(json!({
                                    "progressToken": token,
                                    "progress": step,
                                    "total": steps,
                                    "message": format!("step {step}"),
                                }))
                                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?,
                            )
                            .await;
                    }
                }
                Ok(text(format!("did {steps} steps")))
            }
            "die" => {
                eprintln!("keel-mcp-test-server: dying on purpose");
                std::process::exit(3);
            }
            "hang" => std::future::pending().await,
            "wait_cancel" => {
                context.ct.cancelled().await;
                if let Some(marker) = &self.marker {
                    let _ = std::fs::write(marker, "cancelled");
                }
                Ok(text("cancelled"))
            }
            "add_tool" => {
                self.extra.store(true, Ordering::SeqCst);
                if self.legacy {
                    let _ = context.peer.notify_tool_list_changed().await;
                } else {
                    // rmcp acknowledges a subscription before it calls `listen`, so a client
                    // may call this before the sink is recorded: wait for it (up to 10 s).
                    for _ in 0..1000 {
                        if !self
                            .sinks
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .is_empty()
                        {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                    let sinks = self
                        .sinks
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    for sink in sinks {
                        let _ = sink.notify_tool_list_changed().await;
                    }
                }
                Ok(text("added `extra`"))
            }
            "roots" => match context.peer.list_roots().await {
                Ok(roots) => Ok(text(serde_json::to_string(&roots).unwrap_or_default())),
                Err(e) => Ok(text(format!("roots/list failed: {e}"))),
            },
            "sample" => {
                let params = serde_json::from_value(json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                    "maxTokens": 10,
                }))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                match context.peer.create_message(params).await {
                    Ok(_) => Ok(text("sampled")),
                    Err(e) => Ok(text(format!("sampling refused: {e}"))),
                }
            }
            "elicit" => {
                let params = serde_json::from_value(json!({
                    "message": "name?",
                    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
                }))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                match context.peer.create_elicitation(params).await {
                    Ok(result) => Ok(text(format!(
                        "elicitation answered: {}",
                        serde_json::to_string(&result).unwrap_or_default()
                    ))),
                    Err(e) => Ok(text(format!("elicitation refused: {e}"))),
                }
            }
            "peek" => Ok(text("peeked")),
            "extra" => Ok(text("extra ran")),
            "fail" => Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                Content::text("it failed on purpose"),
            ]))),
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut server = TestServer::default();
    let mut hang = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--legacy" => server.legacy = true,
            "--hang" => hang = true,
            "--marker" => server.marker = args.next().map(PathBuf::from),
            other => {
                eprintln!("keel-mcp-test-server: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if hang {
        std::future::pending::<()>().await;
    }
    let served = if server.legacy {
        server.serve((legacy_stdin(), tokio::io::stdout())).await
    } else {
        server.serve(rmcp::transport::stdio()).await
    };
    match served {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => {
            eprintln!("keel-mcp-test-server: {e}");
            std::process::exit(1);
        }
    }
}

/// Standard input as a server of the session-based revision sees it: a `server/discover` probe
/// (which rmcp's server side would answer) is answered here with "method not found", as a
/// server that predates 2026-07-28 does, and never reaches rmcp. The probe is the client's
/// first message, so nothing else is being written to standard output yet.
fn legacy_stdin() -> tokio::io::DuplexStream {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (mut ours, theirs) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let message: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if message["method"] == "server/discover" {
                let answer = json!({
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32601, "message": "Method not found"},
                });
                let mut out = tokio::io::stdout();
                let _ = out.write_all(format!("{answer}\n").as_bytes()).await;
                let _ = out.flush().await;
                continue;
            }
            if ours
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    });
    theirs
}
