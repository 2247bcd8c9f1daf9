//! `keel --server URL sessions list|show|events [--follow]|close`: the local commands' output
//! from the server's sessions and journals.

use std::io::Write;
use std::process::ExitCode;

use keel_client::{Client, Reconnect, StreamItem};
use keel_core::{Event, SessionId, SessionStatus, StateMachine};
use serde_json::{Value, json};

use super::{
    Server, explain, find_session, journal, known_session, load_state, waiting_approvals,
    with_client,
};

/// `keel --server URL sessions list`.
///
/// # Errors
/// Server errors.
pub fn list(
    server: &Server,
    status: Option<SessionStatus>,
    limit: Option<u32>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    with_client(server, |client| async move {
        let status = status.map(|s| s.as_str().to_owned());
        let all = client
            .list_sessions(status.as_deref())
            .await
            .map_err(|e| explain(&client, e))?;
        let keep = limit.map_or(all.len(), |l| usize::try_from(l).unwrap_or(usize::MAX));
        let left_out = all.len().saturating_sub(keep);
        let mut rows = Vec::new();
        for s in all.into_iter().skip(left_out).rev() {
            let (_, state) = load_state(&client, &s.session_id).await?;
            rows.push(crate::sessions::ListRow {
                session_id: s.session_id.clone(),
                status: s.status.clone(),
                created_at: s.created_at,
                updated_at: s.updated_at,
                workspace: s.workspace.map(Value::String),
                state,
            });
        }
        crate::sessions::print_list(rows, u64::try_from(left_out).unwrap_or(u64::MAX), json_out)
    })
}

/// `keel --server URL sessions show`.
///
/// # Errors
/// Unknown session, server errors.
pub fn show(server: &Server, session: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let session = session.to_owned();
    with_client(server, |client| async move {
        let (id, record) = find_session(&client, &session).await?;
        let sid = id.to_string();
        let (events, state) = load_state(&client, &sid).await?;
        let release_id = state
            .release_id
            .as_ref()
            .map_or(record.release_id.clone(), |r| r.0.clone());
        let route = client
            .get_release(&release_id)
            .await
            .ok()
            .map(|r| r.model_route);
        let approvals: Vec<Value> = waiting_approvals(&client, &sid, &state)
            .await?
            .into_iter()
            .map(|a| {
                json!({
                    "approval_id": a.approval_id,
                    "tool_call_id": a.tool_call_id,
                    "tool_name": a.tool_name,
                    "arguments": a.arguments,
                    "expires_at": a.expires_at,
                })
            })
            .collect();
        let status: SessionStatus =
            serde_json::from_value(Value::String(record.status.clone())).unwrap_or(state.status);
        let s = crate::sessions::summary_of(&crate::sessions::SummaryParts {
            session: id,
            status,
            // The server runs its sessions: a running one has a live worker.
            live_worker: status == SessionStatus::Running,
            release_id,
            model_route: route,
            version: record.version,
            created_at: record.created_at,
            metadata: json!({"workspace": record.workspace}),
            lease_owner: None,
            events: &events,
            state: &state,
            approvals,
        });
        crate::sessions::print_summary(&s, json_out)
    })
}

/// `keel --server URL sessions events [--follow]`: the journal as JSON lines from `from`;
/// with `follow`, the SSE stream until the session closes (reconnecting after a dropped
/// connection without repeating or losing an event) or Ctrl-C.
///
/// # Errors
/// Unknown session, server errors, a closed standard output.
pub fn events(server: &Server, session: &str, from: u64, follow: bool) -> anyhow::Result<ExitCode> {
    let session = session.to_owned();
    with_client(server, |client| async move {
        let id = known_session(&client, &session).await?;
        let sid = id.to_string();
        let after = from.max(1) - 1;
        if !follow {
            let mut out = std::io::stdout().lock();
            for event in journal(&client, &sid, after).await? {
                writeln!(out, "{}", serde_json::to_string(&event)?)?;
            }
            out.flush()?;
            return Ok(());
        }
        crate::signals::install();
        let mut stream = client
            .stream_events(&sid, after, Reconnect::default())
            .await
            .map_err(|e| explain(&client, e))?;
        loop {
            let item = tokio::select! {
                item = stream.recv() => item,
                () = crate::signals::next() => return Ok(()),
            };
            match item {
                None => return Ok(()),
                Some(Err(e)) => return Err(explain(&client, e)),
                Some(Ok(StreamItem::Event { data, .. })) => {
                    let event = Event::decode_value(data)?;
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{}", serde_json::to_string(&event)?)?;
                    out.flush()?;
                }
                Some(Ok(_)) => {}
            }
        }
    })
}

/// `keel --server URL sessions close SESSION`: as locally — closing a closed session succeeds
/// and says so; a session with an open turn is refused (409). The close is bound to the
/// session's version (`If-Match` with the ETag just read); when the session moved in between
/// (412), it is read again and the close retried once with the fresh version.
///
/// # Errors
/// Unknown session, an open turn, a session that moved twice (412 again), server errors.
pub fn close(server: &Server, session: &str) -> anyhow::Result<ExitCode> {
    let session = session.to_owned();
    with_client(server, |client| async move {
        let (id, record) = find_session(&client, &session).await?;
        if record.status == SessionStatus::Closed.as_str() {
            println!("session {id} is already closed");
            return Ok(());
        }
        close_at(&client, id, record.version).await?;
        println!("closed session {id}; it takes no more input");
        Ok(())
    })
}

/// Closes `session` bound to `version`, its ETag when it was read; on 412 (it moved since)
/// reads it again and retries once with the fresh version.
///
/// # Errors
/// 409 while a turn is open; a second 412 (the session keeps changing: it is being run),
/// named as such; other server errors.
pub async fn close_at(client: &Client, session: SessionId, version: u64) -> anyhow::Result<()> {
    let sid = session.to_string();
    let refused = |e| explain(client, e).context(format!("cannot close session {session}"));
    match client.close_session(&sid, version).await {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(412) => {
            let fresh = client
                .get_session(&sid)
                .await
                .map_err(|e| explain(client, e))?;
            tracing::debug!(
                "session {session} moved from version {version} to {} before the close; retrying once",
                fresh.version
            );
            match client.close_session(&sid, fresh.version).await {
                Ok(_) => Ok(()),
                Err(e) if e.status() == Some(412) => anyhow::bail!(
                    "cannot close session {session}: it changed again while closing (version {version}, then {}, then newer: 412 twice); it is still being run — close it once it is idle",
                    fresh.version
                ),
                Err(e) => Err(refused(e)),
            }
        }
        Err(e) => Err(refused(e)),
    }
}
