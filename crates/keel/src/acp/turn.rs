//! `session/prompt`: one Keel turn driven the way `keel run` drives it. The prompt's content
//! goes through the input pipeline ([`crate::input::submit`]: `@path` attachments, slash
//! commands); the session's event subscription streams as `session/update`s while
//! [`keel_runtime::Runtime::run`] runs; a call the policy asks about becomes
//! `session/request_permission` (allow once / allow always / reject), whose answer is the
//! durable approval decision bound to the call's argument hash. If the client goes away while
//! a request is open, the approval stays pending in the store (`keel approve` decides it, and
//! the next `session/prompt` after `session/load` first resumes the waiting turn and asks again).

use std::path::Path;
use std::rc::Rc;

use agent_client_protocol::{self as acp, Client as _};
use keel_core::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, SessionStatus, StateMachine as _, TurnId,
};
use keel_runtime::PendingAction;
use keel_runtime::input::Command;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::agent::{Hosted, Interrupt, KeelAgent, failure, internal, invalid, wire};
use super::updates::{Ending, Mapper, chunk, content, ending, locations, title, tool_kind};

/// The prompt's content blocks as Keel input text: text as is, a resource link to a file in
/// the workspace as an `@path` attachment (read under policy), an embedded text resource
/// fenced with its URI.
pub fn input_text(workspace: &Path, blocks: &[acp::ContentBlock]) -> String {
    let mut parts = Vec::new();
    for block in blocks {
        let v = serde_json::to_value(block).unwrap_or(Value::Null);
        match v.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(v["text"].as_str().unwrap_or_default().to_owned()),
            Some("resource_link") => {
                let uri = v["uri"].as_str().unwrap_or_default();
                let path = file_uri_path(uri);
                match path.as_deref().and_then(|p| p.strip_prefix(workspace).ok()) {
                    Some(rel) => parts.push(mention(&rel.to_string_lossy())),
                    None => parts.push(uri.to_owned()),
                }
            }
            Some("resource") => {
                let r = &v["resource"];
                if let Some(text) = r["text"].as_str() {
                    let uri = r["uri"].as_str().unwrap_or_default();
                    parts.push(format!("{uri}:\n```\n{text}\n```"));
                }
            }
            _ => {}
        }
    }
    parts.join("\n")
}

/// The path a `file:` URI names (RFC 8089): `file:///p` or `file://localhost/p`, its
/// percent-escapes decoded (`%20` is a space); `None` for another scheme or host, or escapes
/// that do not decode to UTF-8.
pub fn file_uri_path(uri: &str) -> Option<std::path::PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(std::path::PathBuf::from)
}

/// The `@path` mention of a workspace path: quoted (`@"a b.txt"`) when it has whitespace.
fn mention(rel: &str) -> String {
    if rel.chars().any(char::is_whitespace) && !rel.contains('"') {
        format!("@\"{rel}\"")
    } else {
        format!("@{rel}")
    }
}

/// Runs one `session/prompt`.
///
/// # Errors
/// Input the pipeline refuses (invalid params); a turn that ended `failed` or
/// `prompt_too_long` (internal error with Keel's reason); the runtime failing.
pub async fn prompt(
    agent: &KeelAgent,
    hosted: &Rc<Hosted>,
    req: acp::PromptRequest,
) -> Result<acp::PromptResponse, acp::Error> {
    let ticket = hosted.accept();
    let _busy = hosted.busy.lock().await;
    // Cancelled (or the client gone) while it waited for the prompt before it: no turn.
    if hosted.withdrawn(ticket) {
        return Ok(acp::PromptResponse::new(acp::StopReason::Cancelled));
    }
    hosted.interrupt.send_replace(Interrupt::None);
    let p = &hosted.p;
    let text = input_text(&hosted.workspace, &req.prompt);
    let before = p
        .runtime
        .view(p.tenant, p.session)
        .await
        .map_err(|e| internal(&e.into()))?
        .state
        .version;
    let turn = match crate::input::submit(p, &text, &hosted.input).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(command)) => return command_answer(agent, hosted, &req.session_id, &command).await,
        Err(e) => {
            return Err(invalid(None, crate::report::describe(&e)));
        }
    };
    // A `session/cancel` (or the end of input) that came while the turn was being queued found
    // no turn to cancel: it is cancelled now, before it runs.
    if hosted.withdrawn(ticket) {
        hosted.interrupt.send_replace(if hosted.gone.get() {
            Interrupt::Disconnected
        } else {
            Interrupt::Cancel
        });
        match p.runtime.cancel_turn(p.tenant, p.session).await {
            Ok(_) | Err(keel_runtime::RuntimeError::NoActiveTurn { .. }) => {}
            Err(e) => return Err(internal(&e.into())),
        }
    }
    // The updates start after the prompt's own `turn.queued` (the editor shows what it sent).
    let sub = p
        .runtime
        .subscribe(p.tenant, p.session, before + 2)
        .await
        .map_err(|e| internal(&e.into()))?;
    let (stop_tx, stop_rx) = watch::channel(None);
    let conn = agent.connection()?;
    let pump = tokio::task::spawn_local(pump(
        sub,
        conn.clone(),
        req.session_id.clone(),
        Mapper::new(hosted.workspace.clone(), false).after(before + 1),
        (turn, text.clone()),
        stop_rx,
    ));
    let driven = drive(hosted, &conn, &req.session_id).await;
    let version = p
        .runtime
        .view(p.tenant, p.session)
        .await
        .map(|v| v.state.version)
        .unwrap_or(0);
    let _ = stop_tx.send(Some(version));
    let _ = tokio::time::timeout(std::time::Duration::from_secs(120), pump).await;
    driven?;
    let end = turn_ending(hosted, turn).await?;
    match end {
        Ending::Stop(stop, message) => {
            if let Some(m) = message.and_then(|m| chunk("agent_message_chunk", &m)) {
                agent.notify(&req.session_id, m).await;
            }
            Ok(acp::PromptResponse::new(stop))
        }
        Ending::Error(message) => {
            if let Some(m) = chunk("agent_message_chunk", &format!("\n\n(keel: {message})")) {
                agent.notify(&req.session_id, m).await;
            }
            let reason = match turn_reason(hosted, turn).await {
                Some(r) => r.as_str().to_owned(),
                None => "failed".to_owned(),
            };
            Err(failure(
                acp::Error::internal_error(),
                "turn_ended",
                message,
                json!({"terminal_reason": reason, "session_id": p.session}),
            ))
        }
    }
}

/// The built-in commands that answer over ACP (the others need a terminal or a new session).
pub const OVER_ACP: &[&str] = &["help", "cost", "status", "permissions", "compact"];

/// The answer of a built-in command given as the prompt (`/help`, `/cost`, `/status`,
/// `/permissions`, `/compact`), as agent text.
async fn command_answer(
    agent: &KeelAgent,
    hosted: &Hosted,
    session: &acp::SessionId,
    command: &Command,
) -> Result<acp::PromptResponse, acp::Error> {
    let p = &hosted.p;
    let text = match command {
        Command::Help | Command::Cost | Command::Status | Command::Permissions => p
            .runtime
            .answer(p.tenant, p.session, command, &hosted.input)
            .await
            .map_err(|e| internal(&e.into()))?,
        Command::Compact { focus } => {
            // Nothing to compact (or compaction refused) is an answer, as in the terminal.
            match p
                .runtime
                .compact_now(p.tenant, p.session, focus.as_deref())
                .await
            {
                Ok(c) => format!(
                    "compacted the conversation: ~{} → ~{} tokens",
                    c.tokens_before, c.tokens_after
                ),
                Err(e) => format!("/compact: {e}"),
            }
        }
        other => format!(
            "/{} is not available over ACP (start a new session in the editor instead)",
            other.name()
        ),
    };
    if let Some(u) = chunk("agent_message_chunk", &text) {
        agent.notify(session, u).await;
    }
    Ok(acp::PromptResponse::new(acp::StopReason::EndTurn))
}

/// Streams the subscription as updates until told the version to stop after. `prompted` is
/// the prompt's turn and input: when another turn's updates came first (a turn that waited on
/// a decision, finished by this prompt after `session/load`), a marker with the input separates
/// the two answers.
async fn pump(
    mut sub: keel_runtime::Subscription,
    conn: Rc<acp::AgentSideConnection>,
    session: acp::SessionId,
    mut mapper: Mapper,
    prompted: (TurnId, String),
    mut stop: watch::Receiver<Option<u64>>,
) {
    let mut seen = sub.next_seq().saturating_sub(1);
    // Whether another turn's updates were shown, and the marker not yet.
    let mut other_shown = false;
    loop {
        if stop.borrow().is_some_and(|v| seen >= v) {
            return;
        }
        tokio::select! {
            item = sub.next() => match item {
                Ok(item) => {
                    let updates = mapper.item(&item);
                    if let keel_runtime::SubscriptionItem::Event { event } = &item {
                        seen = event.seq;
                        match event.correlation.turn_id {
                            Some(t) if t == prompted.0 && other_shown => {
                                other_shown = false;
                                let input: String = prompted.1.lines().next().unwrap_or_default().chars().take(80).collect();
                                let marker = format!("\n\n(keel: the earlier turn ended; now: {input})\n\n");
                                if let Some(u) = chunk("agent_message_chunk", &marker) {
                                    let _ = conn
                                        .session_notification(acp::SessionNotification::new(session.clone(), u))
                                        .await;
                                }
                            }
                            Some(t) if t != prompted.0 => other_shown |= !updates.is_empty(),
                            _ => {}
                        }
                    }
                    for u in updates {
                        let _ = conn
                            .session_notification(acp::SessionNotification::new(session.clone(), u))
                            .await;
                    }
                }
                Err(e) => {
                    tracing::warn!("acp: event subscription: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            changed = stop.changed() => if changed.is_err() { return },
        }
    }
}

/// Waits until the prompt is interrupted ([`Interrupt`]).
async fn interrupted(rx: &mut watch::Receiver<Interrupt>) {
    loop {
        if *rx.borrow_and_update() != Interrupt::None {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs the session until it is idle, asking the client about each approval it waits on.
async fn drive(
    hosted: &Hosted,
    conn: &acp::AgentSideConnection,
    session: &acp::SessionId,
) -> Result<(), acp::Error> {
    let p = &hosted.p;
    let mut interrupt = hosted.interrupt.subscribe();
    loop {
        let outcome = p
            .runtime
            .run(p.tenant, p.session)
            .await
            .map_err(|e| internal(&e.into()))?;
        if outcome.status != SessionStatus::RequiresAction {
            return Ok(());
        }
        let approvals: Vec<_> = outcome
            .pending
            .iter()
            .filter(|a| matches!(a, PendingAction::Approval { .. }))
            .collect();
        if approvals.is_empty() {
            // Only effects whose outcome is unknown: `keel resolve` decides them.
            return Ok(());
        }
        for action in approvals {
            let PendingAction::Approval {
                approval_id,
                tool_call_id,
                tool_name,
                arguments,
                args_hash,
                ..
            } = action
            else {
                continue;
            };
            let request: acp::RequestPermissionRequest = wire(json!({
                "sessionId": session,
                "toolCall": {
                    "toolCallId": tool_call_id.as_str(),
                    "title": format!("{}{}", title(tool_name, arguments), crate::output::subagent_label(action)),
                    "kind": tool_kind(tool_name),
                    "status": "pending",
                    "locations": locations(&hosted.workspace, arguments),
                    "content": content(&hosted.workspace, tool_name, arguments),
                    "rawInput": arguments,
                },
                "options": [
                    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                    {"optionId": "allow_always", "name": "Allow for this session", "kind": "allow_always"},
                    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
                ],
            }))?;
            // An error here is the client gone (or refusing): the approval stays pending.
            // `session/cancel` does not wait for the client's answer (it answers `cancelled`),
            // nor does the end of standard input.
            interrupt.mark_unchanged();
            hosted.asking.set(true);
            let answered = tokio::select! {
                answer = conn.request_permission(request) => Some(answer),
                () = interrupted(&mut interrupt) => None,
                record = decided_elsewhere(hosted, *approval_id) => {
                    // `keel approve` (or another host) decided it while the editor was asked:
                    // that decision stands, the editor's late answer is ignored.
                    hosted.asking.set(false);
                    let text = elsewhere_text(&title(tool_name, arguments), &record);
                    if let Some(u) = chunk("agent_message_chunk", &text) {
                        let _ = conn
                            .session_notification(acp::SessionNotification::new(session.clone(), u))
                            .await;
                    }
                    continue;
                }
            };
            hosted.asking.set(false);
            let outcome = match answered {
                Some(answer) => answer?.outcome,
                None if *interrupt.borrow() == Interrupt::Disconnected => {
                    return Err(internal(&anyhow::anyhow!(
                        "the client went away while asked about a call: its approval stays pending (keel approve, or session/load and prompt again)"
                    )));
                }
                None => acp::RequestPermissionOutcome::Cancelled,
            };
            let decision = match outcome {
                acp::RequestPermissionOutcome::Selected(s) => match &*s.option_id.0 {
                    "allow_once" => ApprovalDecision::AllowOnce,
                    "allow_always" => ApprovalDecision::AllowForSession,
                    _ => ApprovalDecision::Deny {
                        reason: "rejected in the editor".into(),
                    },
                },
                _ => {
                    // Cancelled: the client cancels the turn (session/cancel); make sure.
                    match p.runtime.cancel_turn(p.tenant, p.session).await {
                        Ok(_) | Err(keel_runtime::RuntimeError::NoActiveTurn { .. }) => {}
                        Err(e) => return Err(internal(&e.into())),
                    }
                    break;
                }
            };
            if let Err(e) = p
                .runtime
                .decide_approval(p.tenant, *approval_id, decision, args_hash)
                .await
            {
                // Decided elsewhere meanwhile (`keel approve`), or expired: the run says.
                tracing::warn!("acp: approval {approval_id}: {e}");
            }
        }
    }
}

/// How often the durable status of an approval the editor is asked about is read.
const ELSEWHERE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Resolves once the approval is no longer pending in the store (decided by `keel approve`,
/// the HTTP API or another editor, or expired), with its record; never while it is pending.
async fn decided_elsewhere(hosted: &Hosted, approval: keel_core::ApprovalId) -> ApprovalRecord {
    let p = &hosted.p;
    loop {
        tokio::time::sleep(ELSEWHERE_POLL).await;
        match p.runtime.store().get_approval(p.tenant, approval).await {
            Ok(r) if r.status != ApprovalStatus::Pending => return r,
            Ok(_) => {}
            Err(e) => tracing::warn!("acp: approval {approval}: {e}"),
        }
    }
}

/// The agent text telling the editor that the approval of the call titled `call` was decided
/// elsewhere, how, and by whom (the principal when an authenticated host decided).
pub fn elsewhere_text(call: &str, record: &ApprovalRecord) -> String {
    let how = match (record.status, &record.decision) {
        (_, Some(ApprovalDecision::AllowOnce)) => "allowed once".to_owned(),
        (_, Some(ApprovalDecision::AllowForSession)) => "allowed for this session".to_owned(),
        (_, Some(ApprovalDecision::Deny { reason })) => format!("rejected ({reason})"),
        (status, None) => status.as_str().to_owned(),
    };
    let by = match &record.decided_by {
        Some(principal) => format!("by principal {principal}"),
        None => "outside the editor (keel approve, or another host)".to_owned(),
    };
    format!(
        "\n(keel: {call}: the approval was decided {by}: {how}; the editor's answer to it is ignored)\n"
    )
}

async fn turn_reason(hosted: &Hosted, turn: TurnId) -> Option<keel_core::TerminalReason> {
    let p = &hosted.p;
    let view = p.runtime.view(p.tenant, p.session).await.ok()?;
    view.state.turns.get(&turn).and_then(|t| t.terminal_reason)
}

/// How the turn ended, for the editor.
async fn turn_ending(hosted: &Hosted, turn: TurnId) -> Result<Ending, acp::Error> {
    let p = &hosted.p;
    let view = p
        .runtime
        .view(p.tenant, p.session)
        .await
        .map_err(|e| internal(&e.into()))?;
    let state = &view.state;
    let Some(t) = state.turns.get(&turn) else {
        return Ok(Ending::Stop(acp::StopReason::EndTurn, None));
    };
    let Some(reason) = t.terminal_reason else {
        // Still waiting on a human (an effect whose outcome is unknown).
        return Ok(ending(
            keel_core::TerminalReason::RequiresAction,
            None,
            None,
            None,
            None,
        ));
    };
    let outcome = view.turns.iter().find(|o| o.turn_id == turn);
    let last = t.steps.last().and_then(|s| state.steps.get(s));
    Ok(ending(
        reason,
        outcome.and_then(|o| o.limit),
        last.and_then(|s| s.stop_reason.as_deref()),
        last.and_then(|s| s.failure.as_ref().map(|(kind, _)| kind.as_str())),
        outcome.and_then(|o| o.error.as_deref()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Editors percent-encode file URIs and may name the host `localhost` (attack review of
    /// issue 17: `a%20b.txt` attached `a`, or nothing).
    #[test]
    fn file_uris_are_decoded() {
        let p = |u: &str| file_uri_path(u).map(|p| p.display().to_string());
        assert_eq!(p("file:///ws/a%20b.txt").as_deref(), Some("/ws/a b.txt"));
        assert_eq!(
            p("file://localhost/ws/n%41me.txt").as_deref(),
            Some("/ws/nAme.txt")
        );
        assert_eq!(p("file:///ws/plain.txt").as_deref(), Some("/ws/plain.txt"));
        assert_eq!(p("file://evil.example/ws/x"), None);
        assert_eq!(p("file:///ws/%zz"), None);
        assert_eq!(p("file:///ws/%ff"), None);
        assert_eq!(p("https://x/y"), None);
        let blocks: Vec<acp::ContentBlock> = serde_json::from_value(json!([
            {"type": "text", "text": "read"},
            {"type": "resource_link", "uri": "file:///ws/a%20b.txt", "name": "a b.txt"},
        ]))
        .unwrap();
        assert_eq!(input_text(Path::new("/ws"), &blocks), "read\n@\"a b.txt\"");
    }
}
