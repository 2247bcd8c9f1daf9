//! `keel sessions list|show|events`: read-only views of the store, safe to run from another
//! terminal while a session runs.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keel_core::{
    ApprovalStatus, EffectStatus, Event, EventBody, SessionId, SessionState, SessionStatus,
    ToolCallStatus,
};
use keel_store::{SessionQuery, Store};
use serde_json::{Value, json};

use crate::store::local_tenant;

/// Parses a session id with an actionable error.
///
/// # Errors
/// When `text` is not a session id.
pub fn parse_session(text: &str) -> anyhow::Result<SessionId> {
    text.trim().parse().map_err(|_| {
        anyhow::anyhow!("{text:?} is not a session id (see `keel sessions list` for the ids)")
    })
}

/// Reads a session's row; an unknown id says how to find the right one.
///
/// # Errors
/// Unknown session; store errors.
pub async fn get_session(
    store: &Arc<dyn Store>,
    session: SessionId,
) -> anyhow::Result<keel_store::SessionRecord> {
    match store.get_session(local_tenant(), session).await {
        Ok(r) => Ok(r),
        Err(keel_store::StoreError::NotFound { .. }) => Err(anyhow::anyhow!(
            "no session {session} in this store (see `keel sessions list`, or pass the --store it was run with)"
        )),
        Err(e) => Err(e.into()),
    }
}

/// The pending approvals whose call still waits on them (a call whose turn ended, e.g.
/// cancelled, no longer waits, whatever its approval row says).
///
/// # Errors
/// Store errors.
pub async fn waiting_approvals(
    store: &Arc<dyn Store>,
    session: SessionId,
    state: &SessionState,
) -> anyhow::Result<Vec<keel_core::ApprovalRecord>> {
    Ok(store
        .list_approvals(local_tenant(), session, Some(ApprovalStatus::Pending))
        .await?
        .into_iter()
        .filter(|a| {
            state
                .tool_calls
                .get(&a.tool_call_id)
                .is_some_and(|c| c.status == ToolCallStatus::AwaitingApproval)
        })
        .collect())
}

/// Reads a session's whole journal and folds it.
///
/// # Errors
/// Store errors; a journal that does not fold.
pub async fn load_state(
    store: &Arc<dyn Store>,
    session: SessionId,
) -> anyhow::Result<(Vec<Event>, SessionState)> {
    let events = store
        .read(local_tenant(), session, 1, None)
        .await
        .with_context(|| format!("cannot read session {session}"))?;
    let state = SessionState::replay(&events)
        .with_context(|| format!("the journal of session {session} does not replay"))?;
    Ok((events, state))
}

/// The first line of the most recent user input of a session, shortened for a table.
fn last_input(state: &SessionState) -> String {
    let input = state
        .turn_order
        .last()
        .and_then(|t| state.turns.get(t))
        .map(|t| t.input.as_str())
        .unwrap_or_default();
    let line = input.lines().next().unwrap_or_default();
    if line.chars().count() > 60 {
        format!("{}…", line.chars().take(59).collect::<String>())
    } else {
        line.to_owned()
    }
}

fn status_name(status: SessionStatus) -> String {
    match serde_json::to_value(status) {
        Ok(Value::String(s)) => s,
        _ => format!("{status:?}"),
    }
}

/// `keel sessions list`.
///
/// # Errors
/// Store errors.
pub async fn list(
    store: &Arc<dyn Store>,
    status: Option<SessionStatus>,
    limit: u32,
    json_out: bool,
) -> anyhow::Result<()> {
    let query = SessionQuery {
        status,
        limit: Some(limit),
        ..SessionQuery::default()
    };
    let sessions = store.list_sessions(local_tenant(), &query).await?;
    let mut out: Box<dyn Write> = if json_out {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(crate::output::Visible(std::io::stdout().lock()))
    };
    if !json_out {
        writeln!(
            out,
            "{:<36}  {:<15}  {:<20}  {:>5}  LAST INPUT",
            "SESSION", "STATUS", "CREATED", "TURNS"
        )?;
    }
    for record in sessions {
        let (_, state) = load_state(store, record.session_id).await?;
        let created = record.created_at.format("%Y-%m-%d %H:%M:%S").to_string();
        if json_out {
            let line = json!({
                "session_id": record.session_id,
                "status": record.status,
                "created_at": record.created_at,
                "updated_at": record.updated_at,
                "turns": state.turn_order.len(),
                "workspace": record.metadata.get("workspace"),
                "last_input": last_input(&state),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:<36}  {:<15}  {:<20}  {:>5}  {}",
                record.session_id,
                status_name(record.status),
                created,
                state.turn_order.len(),
                last_input(&state)
            )?;
        }
    }
    Ok(())
}

/// A session's summary as JSON: status, the release it runs now (with its re-pins) and that
/// release's model route, turns, pending approvals, unresolved effects, totals.
///
/// # Errors
/// Store errors.
pub async fn summary(store: &Arc<dyn Store>, session: SessionId) -> anyhow::Result<Value> {
    let tenant = local_tenant();
    let record = get_session(store, session).await?;
    let (events, state) = load_state(store, session).await?;
    // The release it runs now: the journal's (the session row follows it).
    let release_id = state
        .release_id
        .clone()
        .unwrap_or(record.release_id.clone());
    let re_pins: Vec<Value> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::SessionReleasePinned {
                from_release_id,
                to_release_id,
            } => Some(json!({
                "seq": e.seq,
                "from_release_id": from_release_id,
                "to_release_id": to_release_id,
            })),
            _ => None,
        })
        .collect();
    let turns: Vec<Value> = state
        .turn_order
        .iter()
        .filter_map(|id| state.turns.get(id))
        .map(|t| {
            json!({
                "turn_id": t.id,
                "status": t.status,
                "terminal_reason": t.terminal_reason,
                "input": t.input,
                "steps": t.steps.len(),
                "usage": t.usage,
                "cost_usd": t.cost_usd,
                "usage_by_model": t.usage_by_model,
            })
        })
        .collect();
    let approvals: Vec<Value> = waiting_approvals(store, session, &state)
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
    let effects: Vec<Value> = state
        .effects
        .values()
        .filter(|e| e.status == EffectStatus::OutcomeUnknown && e.decision.is_none())
        .map(|e| {
            json!({
                "operation_key": e.key,
                "tool_call_id": e.tool_call_id,
                "tool_name": state.tool_calls.get(&e.tool_call_id).map(|c| c.name.clone()),
                "attempts": e.attempts,
            })
        })
        .collect();
    Ok(json!({
        "session_id": session,
        "status": record.status,
        "release_id": release_id,
        "re_pins": re_pins,
        "model_route": store
            .get_release(tenant, &release_id)
            .await
            .ok()
            .map(|r| r.definition.model_route),
        "version": record.version,
        "created_at": record.created_at,
        "metadata": record.metadata,
        "config": state.config,
        "lease_owner": record.lease.as_ref().map(|l| l.owner.clone()),
        "turns": turns,
        "pending_approvals": approvals,
        "unresolved_effects": effects,
        "usage": state.usage,
        "cost_usd": state.cost_usd,
        "usage_by_model": state.usage_by_model,
        "num_steps": state.num_steps,
    }))
}

/// The limits of a session's effective turn budget for `sessions show`, e.g. `max_steps 1,
/// timeout 30000 ms`; empty when none is set.
fn turn_limits(budget: &Value) -> String {
    [
        ("max_steps", "max_steps", ""),
        ("max_tokens", "max_tokens", ""),
        ("max_cost_usd", "max_cost_usd", ""),
        ("max_tool_calls", "max_tool_calls", ""),
        ("max_wall_time_ms", "timeout", " ms"),
    ]
    .iter()
    .filter_map(|(key, label, unit)| budget.get(*key).map(|v| format!("{label} {v}{unit}")))
    .collect::<Vec<_>>()
    .join(", ")
}

/// `keel sessions show`.
///
/// # Errors
/// Store errors.
pub async fn show(
    store: &Arc<dyn Store>,
    session: SessionId,
    json_out: bool,
) -> anyhow::Result<()> {
    let s = summary(store, session).await?;
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&s)?)?;
        return Ok(());
    }
    // Stored prompts and tool names are untrusted: keep them data on a terminal.
    let mut out = crate::output::Visible(out);
    let str_of = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    writeln!(out, "session    {}", str_of(&s["session_id"]))?;
    writeln!(out, "status     {}", str_of(&s["status"]))?;
    writeln!(out, "release    {}", str_of(&s["release_id"]))?;
    if let Some(pins) = s["re_pins"].as_array().filter(|p| !p.is_empty()) {
        writeln!(
            out,
            "           re-pinned {} time{}, first from {}",
            pins.len(),
            if pins.len() == 1 { "" } else { "s" },
            str_of(&pins[0]["from_release_id"])
        )?;
    }
    if let Some(w) = s["config"].get("workspace") {
        writeln!(out, "workspace  {}", str_of(w))?;
    }
    if let Some(route) = s["model_route"].as_array() {
        let route: Vec<String> = route.iter().map(str_of).collect();
        writeln!(out, "model      {}", route.join(" -> "))?;
    }
    if let Some(mode) = s["config"].get("permission_mode") {
        writeln!(
            out,
            "mode       {} (sandbox {})",
            str_of(mode),
            str_of(&s["config"]["sandbox"])
        )?;
    }
    let limits = turn_limits(&s["config"]["turn_budget"]);
    if !limits.is_empty() {
        writeln!(out, "limits     {limits} per turn")?;
    }
    if let Some(url) = s["config"]["host"]
        .get(crate::run::HOST_BASE_URL)
        .and_then(Value::as_str)
    {
        writeln!(out, "base url   {url}")?;
    }
    writeln!(
        out,
        "totals     {} steps, {} input + {} output tokens, ${:.4}",
        s["num_steps"],
        s["usage"]["input_tokens"],
        s["usage"]["output_tokens"],
        s["cost_usd"].as_f64().unwrap_or(0.0)
    )?;
    for (model, t) in s["usage_by_model"].as_object().into_iter().flatten() {
        writeln!(
            out,
            "  {model}  {} steps, {} input + {} output tokens, ${:.4}",
            t["steps"],
            t["usage"]["input_tokens"],
            t["usage"]["output_tokens"],
            t["cost_usd"].as_f64().unwrap_or(0.0)
        )?;
    }
    writeln!(out, "turns")?;
    for t in s["turns"].as_array().into_iter().flatten() {
        let reason = match &t["terminal_reason"] {
            Value::Null => str_of(&t["status"]),
            r => str_of(r),
        };
        let input = str_of(&t["input"]);
        let first = input.lines().next().unwrap_or_default();
        writeln!(
            out,
            "  {}  {:<16}  {} steps  {}",
            str_of(&t["turn_id"]),
            reason,
            t["steps"],
            first
        )?;
    }
    let approvals = s["pending_approvals"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !approvals.is_empty() {
        writeln!(
            out,
            "pending approvals (keel approve ID | keel deny ID --reason TEXT)"
        )?;
        for a in approvals {
            writeln!(
                out,
                "  {}  {} {}",
                str_of(&a["approval_id"]),
                str_of(&a["tool_name"]),
                a["arguments"]
            )?;
        }
    }
    let effects = s["unresolved_effects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !effects.is_empty() {
        writeln!(
            out,
            "effects with unknown outcome (keel resolve KEY --as committed|failed|retry)"
        )?;
        for e in effects {
            writeln!(
                out,
                "  {}  {}",
                str_of(&e["operation_key"]),
                str_of(&e["tool_name"])
            )?;
        }
    }
    Ok(())
}

/// `keel sessions events`: the journal as JSON lines from `from_seq`; with `follow`, keeps
/// printing new events as they are appended until the session is closed (or the process is
/// interrupted).
///
/// # Errors
/// Store errors; a closed standard output.
pub async fn events(
    store: &Arc<dyn Store>,
    session: SessionId,
    from_seq: u64,
    follow: bool,
) -> anyhow::Result<()> {
    let tenant = local_tenant();
    get_session(store, session).await?;
    let mut next = from_seq.max(1);
    loop {
        let batch = store.read(tenant, session, next, Some(500)).await?;
        let mut closed = false;
        {
            let mut out = std::io::stdout().lock();
            for event in &batch {
                writeln!(out, "{}", serde_json::to_string(event)?)?;
                next = event.seq + 1;
                closed |= matches!(
                    event.body,
                    EventBody::SessionStatusChanged {
                        status: SessionStatus::Closed,
                        ..
                    }
                );
            }
            out.flush()?;
        }
        if batch.len() == 500 {
            continue;
        }
        if !follow || closed {
            return Ok(());
        }
        store
            .wait_for_version(tenant, session, next - 1, Duration::from_secs(5))
            .await?;
    }
}
