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
            "no session {session} in this store (see `keel sessions list`, or pass the --store it was run with; a session made through `keel serve` belongs to a tenant: use `keel --server URL`)"
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

/// The approvals the sub-agents of `session` wait on (its `spawn_agent` children, theirs, …):
/// as a session's own, plus the child's `session_id` and its `agent`. `keel approve ID`
/// decides them like the session's own; the child, then the parent, continue.
///
/// # Errors
/// Store errors.
pub async fn sub_agent_approvals(
    store: &Arc<dyn Store>,
    session: SessionId,
) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (child, agent) in
        keel_runtime::subagents::descendants(store.as_ref(), local_tenant(), session).await?
    {
        let (_, state) = load_state(store, child).await?;
        for a in waiting_approvals(store, child, &state).await? {
            out.push(json!({
                "approval_id": a.approval_id,
                "tool_call_id": a.tool_call_id,
                "tool_name": a.tool_name,
                "arguments": a.arguments,
                "expires_at": a.expires_at,
                "session_id": child,
                "agent": agent,
            }));
        }
    }
    Ok(out)
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

/// Sessions of the store matching `status`, oldest first, read a page at a time; keeps the
/// newest `limit` (all with `None`) and returns them with how many older ones matched too.
pub(crate) async fn newest_sessions(
    store: &Arc<dyn Store>,
    status: Option<SessionStatus>,
    limit: Option<u32>,
) -> anyhow::Result<(Vec<keel_store::SessionRecord>, u64)> {
    const PAGE: u32 = 1000;
    let keep = limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut kept = std::collections::VecDeque::new();
    let mut left_out = 0u64;
    let mut after = None;
    loop {
        let query = SessionQuery {
            status,
            after,
            limit: Some(PAGE),
            ..SessionQuery::default()
        };
        let page = store.list_sessions(local_tenant(), &query).await?;
        let full = page.len() == PAGE as usize;
        after = page.last().map(|r| r.session_id);
        for record in page {
            kept.push_back(record);
            if keep.is_some_and(|k| kept.len() > k) {
                kept.pop_front();
                left_out += 1;
            }
        }
        if !full {
            break;
        }
    }
    Ok((kept.into_iter().rev().collect(), left_out))
}

/// `keel sessions list`: the newest `limit` sessions (all with `None`), newest first; when it
/// leaves older ones out it says how many on standard error, with the flags that show them.
///
/// # Errors
/// Store errors.
pub async fn list(
    store: &Arc<dyn Store>,
    status: Option<SessionStatus>,
    limit: Option<u32>,
    json_out: bool,
) -> anyhow::Result<()> {
    let (sessions, left_out) = newest_sessions(store, status, limit).await?;
    let mut rows = Vec::with_capacity(sessions.len());
    for record in sessions {
        let (_, state) = load_state(store, record.session_id).await?;
        rows.push(ListRow {
            session_id: record.session_id.to_string(),
            status: status_name(record.status),
            created_at: record.created_at,
            updated_at: record.updated_at,
            workspace: record.metadata.get("workspace").cloned(),
            state,
        });
    }
    print_list(rows, left_out, json_out)
}

/// One session of `sessions list`, wherever it was read from (the store, or a server).
#[derive(Debug)]
pub struct ListRow {
    /// Its id.
    pub session_id: String,
    /// Its status (`idle`, …).
    pub status: String,
    /// Creation time.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Last change of its row.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Its workspace, when known.
    pub workspace: Option<Value>,
    /// Its journal folded.
    pub state: SessionState,
}

/// Prints `sessions list` (newest first) and, on standard error, how many older ones
/// `left_out` leaves out.
///
/// # Errors
/// A closed standard output.
pub fn print_list(rows: Vec<ListRow>, left_out: u64, json_out: bool) -> anyhow::Result<()> {
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
    let shown = rows.len();
    for row in rows {
        let state = &row.state;
        let created = row.created_at.format("%Y-%m-%d %H:%M:%S").to_string();
        if json_out {
            let line = json!({
                "session_id": row.session_id,
                "status": row.status,
                "created_at": row.created_at,
                "updated_at": row.updated_at,
                "turns": state.turn_order.len(),
                "workspace": row.workspace,
                "last_input": last_input(state),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:<36}  {:<15}  {:<20}  {:>5}  {}",
                row.session_id,
                row.status,
                created,
                state.turn_order.len(),
                last_input(state)
            )?;
        }
    }
    out.flush()?;
    if left_out > 0 {
        eprintln!(
            "… and {left_out} older session{} not shown (--limit {} or --all lists them)",
            if left_out == 1 { "" } else { "s" },
            u64::try_from(shown).unwrap_or(u64::MAX) + left_out
        );
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
    let mut approvals: Vec<Value> = waiting_approvals(store, session, &state)
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
    approvals.extend(sub_agent_approvals(store, session).await?);
    // Whether a live process holds the session (a `running` session nobody holds was left by a
    // crash or kill: `keel resume` continues it).
    let live_worker = record.lease.as_ref().is_some_and(|l| {
        l.expires_at > chrono::Utc::now()
            && !keel_runtime::lease::owner_is_dead_local_process(&l.owner)
    });
    let model_route = store
        .get_release(tenant, &release_id)
        .await
        .ok()
        .map(|r| r.definition.model_route);
    Ok(summary_of(&SummaryParts {
        session,
        status: record.status,
        live_worker,
        release_id: release_id.0.clone(),
        model_route,
        version: record.version,
        created_at: record.created_at,
        metadata: record.metadata.clone(),
        lease_owner: record.lease.as_ref().map(|l| l.owner.clone()),
        events: &events,
        state: &state,
        approvals,
    }))
}

/// What a session's summary is made of, wherever it was read from (the store, or a server).
#[derive(Debug)]
pub struct SummaryParts<'a> {
    /// The session.
    pub session: SessionId,
    /// Its row's status.
    pub status: SessionStatus,
    /// Whether a live worker holds it.
    pub live_worker: bool,
    /// The release it runs now.
    pub release_id: String,
    /// That release's model route, when it could be read.
    pub model_route: Option<Vec<String>>,
    /// The journal's version.
    pub version: u64,
    /// Creation time.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The row's metadata (`workspace`, …).
    pub metadata: Value,
    /// The lease holder, if any.
    pub lease_owner: Option<String>,
    /// The journal.
    pub events: &'a [Event],
    /// The journal folded.
    pub state: &'a SessionState,
    /// The approvals still waited on (`approval_id`, `tool_call_id`, `tool_name`,
    /// `arguments`, `expires_at`).
    pub approvals: Vec<Value>,
}

/// A session's summary as JSON (see [`summary`]).
pub fn summary_of(p: &SummaryParts<'_>) -> Value {
    let state = p.state;
    let re_pins: Vec<Value> = p
        .events
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
    json!({
        "session_id": p.session,
        "status": p.status,
        "live_worker": p.live_worker,
        "release_id": p.release_id,
        "re_pins": re_pins,
        "model_route": p.model_route,
        "version": p.version,
        "created_at": p.created_at,
        "metadata": p.metadata,
        "config": state.config,
        "lease_owner": p.lease_owner,
        "turns": turns,
        "pending_approvals": p.approvals,
        "unresolved_effects": effects,
        "usage": state.usage,
        "cost_usd": state.cost_usd,
        "usage_by_model": state.usage_by_model,
        "num_steps": state.num_steps,
    })
}

/// The limits of a session's effective turn budget for `sessions show`, e.g. `max_steps 1,
/// timeout 30s`; `none` when none is set.
fn turn_limits(budget: &Value) -> String {
    let limits: Vec<String> = [
        ("max_steps", "max_steps"),
        ("max_tokens", "max_tokens"),
        ("max_cost_usd", "max_cost_usd"),
        ("max_tool_calls", "max_tool_calls"),
        ("max_wall_time_ms", "timeout"),
    ]
    .iter()
    .filter_map(|(key, label)| {
        let v = budget.get(*key)?;
        Some(match (key, v.as_u64()) {
            (&"max_wall_time_ms", Some(ms)) => {
                format!("{label} {}", crate::config::format_duration_ms(ms))
            }
            _ => format!("{label} {v}"),
        })
    })
    .collect();
    if limits.is_empty() {
        "none".into()
    } else {
        limits.join(", ")
    }
}

/// A duration setting in ms for `sessions show`: `5s`, or `none`.
fn duration_setting(v: &Value) -> String {
    v.as_u64()
        .map_or_else(|| "none".into(), crate::config::format_duration_ms)
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
    print_summary(&s, json_out)
}

/// Prints a session's summary (as [`summary`] makes it) as text, or as JSON.
///
/// # Errors
/// A closed standard output.
pub fn print_summary(s: &Value, json_out: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(s)?)?;
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
    let status = str_of(&s["status"]);
    if status == "running" && s["live_worker"] == false {
        writeln!(
            out,
            "status     running (no live worker; keel resume {} continues)",
            str_of(&s["session_id"])
        )?;
    } else if status == "requires_action"
        && s["live_worker"] != true
        && [&s["pending_approvals"], &s["unresolved_effects"]]
            .iter()
            .all(|l| l.as_array().is_none_or(Vec::is_empty))
    {
        // Decided while no process ran it (`keel approve`, `keel resolve`): nothing is left
        // to act on, and nothing runs it until it is resumed.
        writeln!(
            out,
            "status     requires_action (every decision it waited on is made; keel resume {} continues)",
            str_of(&s["session_id"])
        )?;
    } else {
        writeln!(out, "status     {status}")?;
    }
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
    let config = &s["config"];
    if let Some(mode) = config.get("permission_mode") {
        let network = if config["sandbox_network"].as_bool() == Some(true) {
            ", with network"
        } else {
            ""
        };
        writeln!(
            out,
            "mode       {} (sandbox {}{network})",
            str_of(mode),
            str_of(&config["sandbox"])
        )?;
    }
    writeln!(
        out,
        "limits     {} per turn",
        turn_limits(&config["turn_budget"])
    )?;
    writeln!(
        out,
        "timeouts   tool {}, model first token {}, model total {}, stream idle {}",
        duration_setting(&config["tool_timeout_ms"]),
        duration_setting(&config["model_first_token_timeout_ms"]),
        duration_setting(&config["model_total_timeout_ms"]),
        duration_setting(&config["stream_idle_timeout_ms"]),
    )?;
    writeln!(
        out,
        "reasoning  {}",
        if config["keep_reasoning"] == true {
            "kept in the journal, redacted (keep_reasoning)"
        } else {
            "not kept: only counted in the journal (keep_reasoning off)"
        }
    )?;
    writeln!(
        out,
        "context    {}",
        config["context_window_tokens"]
            .as_u64()
            .map_or_else(|| "the model's window".into(), |t| format!("{t} tokens"))
    )?;
    for (key, label) in [("ask", "ask rules "), ("deny", "deny rules")] {
        if let Some(rules) = config[key].as_array().filter(|r| !r.is_empty()) {
            let rules: Vec<String> = rules.iter().map(str_of).collect();
            writeln!(out, "{label} {}", rules.join(", "))?;
        }
    }
    if let Some(url) = config["host"]
        .get(crate::run::HOST_BASE_URL)
        .and_then(Value::as_str)
    {
        writeln!(out, "base url   {url}")?;
    }
    let steps = |v: &Value| crate::output::count(v.as_u64().unwrap_or(0), "step");
    writeln!(
        out,
        "totals     {}, {} input + {} output tokens, ${:.4}",
        steps(&s["num_steps"]),
        s["usage"]["input_tokens"],
        s["usage"]["output_tokens"],
        s["cost_usd"].as_f64().unwrap_or(0.0)
    )?;
    for (model, t) in s["usage_by_model"].as_object().into_iter().flatten() {
        writeln!(
            out,
            "  {}  {}, {} input + {} output tokens, ${:.4}",
            crate::output::model_label(model),
            steps(&t["steps"]),
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
            "  {}  {:<16}  {}  {}",
            str_of(&t["turn_id"]),
            reason,
            steps(&t["steps"]),
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
            // A sub-agent's: which agent, in which child session.
            let of = match a["agent"].as_str() {
                Some(agent) => format!("  (agent {agent}, session {})", str_of(&a["session_id"])),
                None => String::new(),
            };
            writeln!(
                out,
                "  {}  {} {}{of}",
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

/// `keel sessions events`: the journal as JSON lines from `from_seq`, each event redacted by
/// `redactor` (the session's: see `Runtime::redactor`); with `follow`, keeps printing new
/// events as they are appended until the session is closed (or the process is interrupted).
///
/// # Errors
/// Store errors; a closed standard output.
pub async fn events(
    store: &Arc<dyn Store>,
    session: SessionId,
    from_seq: u64,
    follow: bool,
    redactor: &keel_runtime::Redactor,
) -> anyhow::Result<()> {
    let tenant = local_tenant();
    get_session(store, session).await?;
    let mut next = from_seq.max(1);
    loop {
        let batch = store.read(tenant, session, next, Some(500)).await?;
        let mut closed = false;
        {
            let mut out = std::io::stdout().lock();
            for event in batch.iter().cloned() {
                let event = redactor.redact_typed(event);
                writeln!(out, "{}", serde_json::to_string(&event)?)?;
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
