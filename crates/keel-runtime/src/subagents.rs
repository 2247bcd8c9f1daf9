//! Sub-agents: the `spawn_agent {agent, prompt}` tool, which hands a task to a child session
//! and gives its parent one tool result — the child's final text, or why it stopped.
//!
//! - **Which agents.** A release's `agents` (keel-core `AgentDefinition::agents`) are the
//!   agents it may spawn; `spawn_agent` is offered only to a release that defines some (see
//!   `crate::pinned::tool_enabled`). The child's release is that definition, with the parent's
//!   model route when it names none and the parent's `agents` (so a child may spawn from the
//!   same set).
//! - **One child per call, found again.** The child's id is derived from the parent session,
//!   step and call ([`SessionId::for_child`]). The call is `read_only` (the child's own calls
//!   are authorized in the child), so after a crash of the parent's worker recovery runs it
//!   again, and the re-run finds the child, re-attaches and reconciles from the child's state:
//!   never a second child, never `outcome_unknown`.
//! - **Never looser.** The child's settings are the parent's — permission mode, sandbox and
//!   its network, `ask`/`deny` rules, secrets, timeouts — plus the parent release's `ask` and
//!   `deny` rules as settings, so whatever the parent may not do, the child may not either.
//!   The parent release's `allow` rules (the user's) are added to the child's release, so
//!   what runs without asking in the parent does in the child too.
//! - **Shared budgets.** The child's turn and session budgets are what the parent's turn and
//!   session have left when it starts; children running at once, and theirs, draw on one pool
//!   of that remainder ([`crate::spend`]); the tenant's daily budget is shared through the
//!   usage table. `agent.finished` adds the child turn's usage, cost, steps and tool calls to
//!   the parent's turn (usage and cost per serving model also to the session), so the parent's
//!   next step sees them against its limits and its `turn.finished` reports them.
//! - **Bounds.** A session at depth [`crate::SubagentOptions::max_depth`] gets its
//!   `spawn_agent` calls refused; at most [`crate::SubagentOptions::max_concurrent`] children
//!   of one session run at once (more calls wait for a slot), and at most
//!   [`crate::SubagentOptions::max_descendants`] below one top-level session (a call past it is
//!   refused with a tool error, not queued). A prompt longer than
//!   [`crate::config::MAX_SPAWN_PROMPT_BYTES`] is refused. Several calls of one step run in
//!   parallel (the tool is parallel-safe).
//! - **Cancellation** flows down: the call's token (the parent's turn, the call's time limit)
//!   cancels the child's turn (`turn.cancel_requested` in the child, journaled).
//! - **Humans.** A child that waits on a human (`requires_action`: an approval, an unknown
//!   effect) is reported on the parent's stream as a `tool_progress` status naming the child
//!   session and what it waits for, and the call tells the parent's driver
//!   (`Active::waiting_in_child`, the planner's `Facts::waiting_in_child`). Once nothing else
//!   of the parent's step can move, the driver detaches the call — no result, not cancelled,
//!   not `outcome_unknown`: it stays `running` in the journal — and the parent's run ends
//!   `requires_action` with the child's pending actions in `RunOutcome::pending`, labelled
//!   with the child ([`crate::PendingSubagent`]). A decision (by approval id, from any host)
//!   then a new run of the parent re-runs the call, which re-attaches the child and drives it
//!   on. A child that finishes while its parent waits and nobody runs it makes the parent due
//!   ([`wake_parent`]). A decision that comes while the parent still runs lets the child go
//!   on in the same call.
//! - **Events.** `agent.spawned` and `agent.finished` in the parent's journal (correlation: the
//!   call); every event of the child carries `parent_session_id`, and its `session.created`
//!   also the parent's `tool_call_id`.

use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;
use keel_core::{
    AgentDefinition, ApprovalStatus, Budget, Correlation, EventBody, Release, SessionId,
    SessionStatus, TerminalReason, ToolCallId,
};
use keel_store::StoreError;
use keel_tools::tool::{CallScope, EffectClass, Tool, ToolContext, ToolOutput, ToolProgress};
use serde_json::{Value, json};

use crate::config::{MAX_SPAWN_PROMPT_BYTES, SessionConfig, SubagentLink};
use crate::error::{Result, RuntimeError};
use crate::runtime::{PendingAction, Runtime};
use crate::shared::Inner;

/// The tool's name.
pub const SPAWN_AGENT: &str = "spawn_agent";

/// How often a call whose child waits on a human looks whether it was decided.
const DECISION_POLL: Duration = Duration::from_millis(200);

/// The `spawn_agent` tool of one runtime (registered by [`Runtime::new`]).
pub(crate) struct SpawnAgent {
    rt: Weak<Inner>,
}

impl SpawnAgent {
    /// The tool, running children on the runtime `rt` points to.
    pub(crate) fn new(rt: Weak<Inner>) -> Self {
        Self { rt }
    }
}

#[async_trait]
impl Tool for SpawnAgent {
    fn name(&self) -> &str {
        SPAWN_AGENT
    }

    fn description(&self) -> &str {
        "Hands a self-contained task to another agent, which works in its own session with its \
         own context and returns its final answer as this call's result. `agent` is the name of \
         one of the agents you may spawn; `prompt` is everything it needs to know (it does not \
         see this conversation). Several calls in one response run in parallel."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "description": "Name of the agent to start."},
                "prompt": {"type": "string", "description": "The task, complete in itself."}
            },
            "required": ["agent", "prompt"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        // The call itself changes nothing: the child's calls are authorized in the child,
        // under the parent's mode and rules. Read-only also makes a re-run after a crash
        // re-attach the child instead of leaving an unknown outcome.
        EffectClass::ReadOnly
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let agent = args.get("agent").and_then(Value::as_str).unwrap_or("");
        let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("");
        if prompt.trim().is_empty() {
            return ToolOutput::not_performed("`prompt` is empty; give the agent its task.");
        }
        if prompt.len() > MAX_SPAWN_PROMPT_BYTES {
            return ToolOutput::not_performed(format!(
                "`prompt` is {} bytes; the most a `spawn_agent` prompt may hold is {MAX_SPAWN_PROMPT_BYTES} bytes. \
                 Describe the task and name the files; the agent can read them itself.",
                prompt.len()
            ));
        }
        let Some(inner) = self.rt.upgrade() else {
            return ToolOutput::not_performed(
                "The runtime is shutting down; no agent was started.",
            );
        };
        let Some(scope) = ctx.scope else {
            return ToolOutput::not_performed("`spawn_agent` runs only inside a session.");
        };
        let rt = Runtime { inner, actor: None };
        match run_child(&rt, scope, ctx, agent, prompt).await {
            Ok(out) => out,
            Err(e) => ToolOutput::error(format!("Error: agent `{agent}`: {e}")),
        }
    }
}

/// The sub-agent sessions of `session` — the children its `spawn_agent` calls started, theirs,
/// and so on (at most 1000) — each with its agent's name (its release's). Hosts list their
/// pending approvals with the session's own, so the parent's host can decide them.
///
/// # Errors
/// Store errors.
pub async fn descendants(
    store: &dyn keel_store::Store,
    tenant: keel_core::TenantId,
    session: SessionId,
) -> std::result::Result<Vec<(SessionId, String)>, StoreError> {
    let mut out: Vec<(SessionId, String)> = Vec::new();
    let mut parents = vec![session];
    while let Some(parent) = parents.pop() {
        let children = store
            .list_sessions(
                tenant,
                &keel_store::SessionQuery {
                    parent_session_id: Some(parent),
                    ..keel_store::SessionQuery::default()
                },
            )
            .await?;
        for c in children {
            if out.len() >= 1000 {
                return Ok(out);
            }
            let agent = store
                .get_release(tenant, &c.release_id)
                .await
                .map(|r| r.definition.name)
                .unwrap_or_default();
            parents.push(c.session_id);
            out.push((c.session_id, agent));
        }
    }
    Ok(out)
}

/// What the parent's journal says about the call's child when the call starts.
struct ParentView {
    config: SessionConfig,
    release: Release,
    /// The child's terminal reason, when its `agent.finished` is journaled.
    finished: Option<Option<String>>,
    /// What the parent's turn and session have left (the tighter of the two, limit by limit;
    /// [`keel_core::plan::budget_left`]).
    left: Budget,
}

/// Starts (or finds again) the child of the call in `scope`, runs it to its end, and gives the
/// call's output.
async fn run_child(
    rt: &Runtime,
    scope: CallScope,
    ctx: &ToolContext,
    agent: &str,
    prompt: &str,
) -> Result<ToolOutput> {
    let inner = &rt.inner;
    let (tenant, parent) = (scope.tenant_id, scope.session_id);
    let call = ToolCallId::from(ctx.call_id.as_str());
    let child = SessionId::for_child(parent, scope.step_id, &call);
    let Some(active) = inner.active(parent) else {
        return Ok(ToolOutput::not_performed(format!(
            "The session {parent} is not running in this process; no agent was started."
        )));
    };
    let view = parent_view(rt, &active, scope, child).await?;
    if view.finished.is_some() {
        // The call ran to its end before a crash: its result is the child's.
        return result_of(rt, scope, child, agent, false).await;
    }
    let existing = match inner.store.get_session(tenant, child).await {
        Ok(rec) => Some(rec.release_id),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    if existing.is_none() {
        let defs = &view.release.definition.agents;
        if !defs.contains_key(agent) {
            let names: Vec<&str> = defs.keys().map(String::as_str).collect();
            return Ok(ToolOutput::not_performed(format!(
                "There is no agent named `{agent}`; the agents you may spawn are: {}.",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            )));
        }
        let depth = view.config.subagent.as_ref().map_or(1, |l| l.depth + 1);
        let max = inner.options.subagents.max_depth;
        if depth > max {
            return Ok(ToolOutput::not_performed(format!(
                "Agent `{agent}` was not started: it would run at depth {depth}, and agents nest \
                 at most {max} deep ([subagents] max_depth). Do the task yourself."
            )));
        }
    }
    // A slot among the tree's live descendants: refused, not awaited (a parent waiting on its
    // own descendants' slots could wait forever). A re-attached child holds none.
    let root = view
        .config
        .subagent
        .as_ref()
        .map_or(parent, |l| l.root_session_id.unwrap_or(l.parent_session_id));
    let _tree_permit = if existing.is_none() {
        match inner.descendant_slots(root).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let max = inner.options.subagents.max_descendants;
                return Ok(ToolOutput::not_performed(format!(
                    "Agent `{agent}` was not started: session {root} already has {max} agents running \
                     below it, the most it may ([subagents] max_descendants). Wait for running \
                     agents to finish, or do the task yourself."
                )));
            }
        }
    } else {
        None
    };
    // A slot among the parent's running children, before anything starts.
    let slots = inner.child_slots(parent);
    let permit = tokio::select! {
        p = slots.acquire_owned() => p.ok(),
        () = ctx.cancel.cancelled() => {
            return Ok(ToolOutput::cancelled(format!(
                "`spawn_agent` was cancelled while waiting for a free agent slot; agent `{agent}` was not started."
            )));
        }
    };
    // The tree's shared budget: this child draws on what the parent had left when the step's
    // first child started (crate::spend).
    let _member = inner.spend.join(parent, scope.step_id, child, || view.left);
    let release_id = match existing {
        Some(id) => id,
        None => {
            let Some(def) = view.release.definition.agents.get(agent) else {
                return Err(RuntimeError::InvalidInput(format!("unknown agent {agent}")));
            };
            let release = child_release(&view.release, def, agent);
            let config = child_config(&view, parent, &call, agent);
            match rt
                .create_session_with_id(tenant, child, &release, config, false)
                .await
            {
                Ok(_) | Err(RuntimeError::Store(StoreError::Conflict(_))) => {}
                Err(e) => return Err(e),
            }
            release.id
        }
    };
    {
        let mut j = active.journal.lock().await;
        if !j.state.children.contains_key(&child) {
            j.stage(vec![(
                Correlation::tool_call(scope.turn_id, scope.step_id, call.clone()),
                EventBody::AgentSpawned {
                    agent: agent.to_owned(),
                    child_session_id: child,
                    release_id,
                },
            )])
            .await?;
            // Committed before the child runs: the parent's journal names the child before
            // anything of the child (an approval it asks for) is visible (a host listing the
            // child's approval looks its session up by `agent.spawned`).
            let v = j.commit("agent.spawned").await?;
            active.version.store(v, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let state = rt.view(tenant, child).await?.state;
    if state.turn_order.is_empty() {
        rt.submit_child(tenant, child, prompt).await?;
    }
    let Some(cancelled) = drive(rt, ctx, &active, &call, tenant, child, agent).await? else {
        // The parent's run stopped without a cancellation (its lease was lost, its worker is
        // going away, or it stopped for a human the child waits on): the child is left as it
        // is, and the call's re-run re-attaches it. (This output is not recorded.)
        return Ok(ToolOutput::error(format!(
            "The run of session {parent} stopped; agent `{agent}` (session {child}) is re-attached when the session continues."
        )));
    };
    drop(permit);
    result_of(rt, scope, child, agent, cancelled).await
}

/// Runs the child until its turn ends; cancels its turn when the call is cancelled. Returns
/// whether the call was cancelled, or `None` when the call is left without a result: the
/// parent's run stopped (`lost`: lease lost, future dropped), or the child waits on a human
/// and the parent's driver detached the call to stop its own run for that human
/// ([`crate::shared::Active::detach_waiting`]). Either way the child is not cancelled, only
/// left, and the call's re-run re-attaches it.
async fn drive(
    rt: &Runtime,
    ctx: &ToolContext,
    active: &crate::shared::Active,
    call: &ToolCallId,
    tenant: keel_core::TenantId,
    child: SessionId,
    agent: &str,
) -> Result<Option<bool>> {
    let lost = &active.lost;
    let mut cancelled = false;
    loop {
        let run = rt.run(tenant, child);
        tokio::pin!(run);
        let outcome = tokio::select! {
            o = &mut run => o?,
            () = ctx.cancel.cancelled(), if !cancelled => {
                // `lost` is cancelled before the turn's token (its child): checked first.
                if lost.is_cancelled() {
                    return Ok(None);
                }
                cancelled = true;
                cancel_child(rt, tenant, child).await;
                run.await?
            }
        };
        if outcome.status != SessionStatus::RequiresAction {
            return Ok(Some(cancelled));
        }
        if cancelled {
            // Cancelled while it waited on a human: the cancellation ends its turn.
            cancel_child(rt, tenant, child).await;
            return Ok(Some(true));
        }
        for p in &outcome.pending {
            ctx.progress.report(
                &ctx.call_id,
                ToolProgress::Status {
                    text: waiting_text(agent, child, p),
                },
            );
        }
        // The parent's driver learns that this call waits on a human: once nothing else of the
        // parent's step can move, it detaches the call and its own run ends `requires_action`
        // with the child's pending actions. Until then a decision lets the child go on here.
        let detach = tokio_util::sync::CancellationToken::new();
        let pending = outcome
            .pending
            .iter()
            .cloned()
            .map(|p| p.in_subagent(child, agent))
            .collect();
        crate::background::lock(&active.waiting_in_child).insert(
            call.clone(),
            crate::shared::ChildWait {
                pending,
                detach: detach.clone(),
            },
        );
        active.call_done.notify_waiters();
        let version = outcome.version;
        loop {
            tokio::select! {
                () = tokio::time::sleep(DECISION_POLL) => {}
                () = detach.cancelled() => return Ok(None),
                () = ctx.cancel.cancelled() => {
                    let detached =
                        crate::background::lock(&active.waiting_in_child).remove(call).is_none();
                    if lost.is_cancelled() || detached {
                        return Ok(None);
                    }
                    cancel_child(rt, tenant, child).await;
                    return Ok(Some(true));
                }
            }
            if decided(rt, tenant, child, version, &outcome.pending).await? {
                // Taken back unless the driver detached it first (then the call ends here).
                if crate::background::lock(&active.waiting_in_child)
                    .remove(call)
                    .is_none()
                {
                    return Ok(None);
                }
                break;
            }
        }
    }
}

/// A child whose run ended without waiting on a human, while its parent is not run in this
/// process: a parent that waits on a human — it stopped for this child, its `spawn_agent`
/// call detached — is made due now, so a worker runs it again and the call re-attaches the
/// child and takes its result (over the API: a child's approval decided through the parent).
pub(crate) async fn wake_parent(inner: &Inner, tenant: keel_core::TenantId, parent: SessionId) {
    if inner.active(parent).is_some() {
        return;
    }
    match inner.store.get_session(tenant, parent).await {
        Ok(rec) if rec.status == SessionStatus::RequiresAction => {
            if let Err(e) = inner
                .store
                .set_wake_at(tenant, parent, Some(chrono::Utc::now()))
                .await
            {
                tracing::debug!(%parent, "waking the parent of a sub-agent: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(%parent, "waking the parent of a sub-agent: {e}"),
    }
}

/// Asks the child's active turn to stop (journaled in the child); a turn already ended is no
/// error.
async fn cancel_child(rt: &Runtime, tenant: keel_core::TenantId, child: SessionId) {
    if let Err(e) = rt.cancel_turn(tenant, child).await {
        tracing::debug!(%child, "cancelling the child's turn: {e}");
    }
}

/// Whether something happened to a child that waits on a human: a pending approval was
/// decided or expired, its journal moved, or an intent (input, cancellation) waits for it.
async fn decided(
    rt: &Runtime,
    tenant: keel_core::TenantId,
    child: SessionId,
    version: u64,
    pending: &[PendingAction],
) -> Result<bool> {
    let store = &rt.inner.store;
    let now = chrono::Utc::now();
    for p in pending {
        if let PendingAction::Approval {
            approval_id,
            expires_at,
            ..
        } = p
        {
            if *expires_at <= now {
                return Ok(true);
            }
            if store.get_approval(tenant, *approval_id).await?.status != ApprovalStatus::Pending {
                return Ok(true);
            }
        }
    }
    if store.get_session(tenant, child).await?.version != version {
        return Ok(true);
    }
    Ok(!store.list_intents(tenant, child).await?.is_empty())
}

/// The status line a parent's host shows while its child waits on a human.
fn waiting_text(agent: &str, child: SessionId, pending: &PendingAction) -> String {
    match pending {
        PendingAction::Approval {
            approval_id,
            tool_name,
            ..
        } => format!(
            "agent `{agent}` (session {child}) waits for approval {approval_id} of its `{tool_name}` call; decide it on session {child}"
        ),
        PendingAction::Effect {
            operation_key,
            tool_name,
            ..
        } => format!(
            "agent `{agent}` (session {child}) waits for a decision on the unknown outcome of its `{tool_name}` call ({operation_key}); decide it on session {child}"
        ),
    }
}

/// Reads what the parent's journal says for the call.
async fn parent_view(
    rt: &Runtime,
    active: &crate::shared::Active,
    scope: CallScope,
    child: SessionId,
) -> Result<ParentView> {
    let (config, release_id, finished) = {
        let j = active.journal.lock().await;
        (
            j.config()?,
            j.state.release_id.clone(),
            j.state.children.get(&child).map(|c| c.finished.clone()),
        )
    };
    let release_id = release_id.ok_or(RuntimeError::Config {
        session: scope.session_id,
        reason: "the journal has no session.created".into(),
    })?;
    let release = rt
        .inner
        .store
        .get_release(scope.tenant_id, &release_id)
        .await?;
    let limits = keel_core::plan::Limits {
        turn_budget: config.turn_budget.tighter(&release.definition.budget),
        session_budget: config.session_budget,
        ..keel_core::plan::Limits::default()
    };
    let left = {
        let j = active.journal.lock().await;
        j.state
            .turns
            .get(&scope.turn_id)
            .map_or(limits.turn_budget, |t| {
                keel_core::plan::budget_left(&j.state, t, &limits, chrono::Utc::now())
            })
    };
    Ok(ParentView {
        config,
        release,
        finished: finished.filter(Option::is_some),
        left,
    })
}

/// The child's release: `def`, with the parent's route when it names none, and the parent's
/// agents.
fn child_release(parent: &Release, def: &AgentDefinition, agent: &str) -> Release {
    let mut d = def.clone();
    if d.name.is_empty() {
        agent.clone_into(&mut d.name);
    }
    if d.model_route.is_empty() {
        d.model_route.clone_from(&parent.definition.model_route);
    }
    d.agents.clone_from(&parent.definition.agents);
    // The parent's `allow` rules (the user's, from keel.toml or `/permissions`, pinned in its
    // release) hold in the child too: as loose as the parent, never looser — its `ask` and
    // `deny` rules come with the settings, and they win over any allow.
    if let Some(allow) = parent
        .definition
        .policy
        .get("allow")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
    {
        if !d.policy.is_object() {
            d.policy = json!({});
        }
        if let Some(policy) = d.policy.as_object_mut() {
            let own = policy.entry("allow").or_insert_with(|| json!([]));
            if let Some(own) = own.as_array_mut() {
                for rule in allow {
                    if !own.contains(rule) {
                        own.push(rule.clone());
                    }
                }
            }
        }
    }
    Release::new(d)
}

/// The child's settings: the parent's (mode, sandbox, rules, secrets, timeouts), the parent
/// release's `ask`/`deny` rules added, budgets within what the parent has left.
fn child_config(
    view: &ParentView,
    parent: SessionId,
    call: &ToolCallId,
    agent: &str,
) -> SessionConfig {
    let mut c = view.config.clone();
    let rules = |key: &str| -> Vec<String> {
        view.release
            .definition
            .policy
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    for r in rules("deny") {
        if !c.deny.contains(&r) {
            c.deny.push(r);
        }
    }
    for r in rules("ask") {
        if !c.ask.contains(&r) {
            c.ask.push(r);
        }
    }
    c.turn_budget = c.turn_budget.tighter(&view.left);
    c.session_budget = c.session_budget.tighter(&view.left);
    c.multitask = crate::config::MultitaskStrategy::Enqueue;
    c.subagent = Some(SubagentLink {
        parent_session_id: parent,
        tool_call_id: call.clone(),
        agent: agent.to_owned(),
        depth: view.config.subagent.as_ref().map_or(1, |l| l.depth + 1),
        root_session_id: Some(
            view.config
                .subagent
                .as_ref()
                .map_or(parent, |l| l.root_session_id.unwrap_or(l.parent_session_id)),
        ),
    });
    c
}

/// The call's output from the child's state; journals `agent.finished` in the parent (once).
async fn result_of(
    rt: &Runtime,
    scope: CallScope,
    child: SessionId,
    agent: &str,
    cancelled: bool,
) -> Result<ToolOutput> {
    let view = rt.view(scope.tenant_id, child).await?;
    let Some(turn) = view.turns.last() else {
        return Ok(ToolOutput::error(format!(
            "Error: agent `{agent}` (session {child}) stopped before its turn ended."
        )));
    };
    let own_turn = view.state.turns.get(&turn.turn_id);
    if let Some(active) = rt.inner.active(scope.session_id) {
        let mut j = active.journal.lock().await;
        if j.state
            .children
            .get(&child)
            .is_some_and(|c| c.finished.is_none())
        {
            let call = j
                .state
                .children
                .get(&child)
                .and_then(|c| c.tool_call_id.clone());
            if let Some(call) = call {
                j.stage(vec![(
                    Correlation::tool_call(scope.turn_id, scope.step_id, call),
                    EventBody::AgentFinished {
                        child_session_id: child,
                        reason: turn.terminal_reason.as_str().to_owned(),
                        usage: turn.usage,
                        cost_usd: turn.cost_usd,
                        usage_by_model: turn.usage_by_model.clone(),
                        tool_calls: own_turn.map_or(0, |t| {
                            t.tool_calls_run.saturating_add(t.subagents.tool_calls)
                        }),
                    },
                )])
                .await?;
            }
        }
    }
    let details = json!({
        "agent": agent,
        "child_session_id": child,
        "terminal_reason": turn.terminal_reason.as_str(),
        "usage": turn.usage,
        "cost_usd": turn.cost_usd,
    });
    let out = match turn.terminal_reason {
        TerminalReason::Completed => ToolOutput::success(if turn.final_text.is_empty() {
            format!("(agent `{agent}` finished without a text answer)")
        } else {
            turn.final_text.clone()
        }),
        TerminalReason::Aborted if cancelled => ToolOutput::cancelled(format!(
            "Agent `{agent}` (session {child}) was cancelled with this call."
        )),
        reason => {
            let mut text = format!(
                "Agent `{agent}` (session {child}) stopped: {}",
                reason.as_str()
            );
            if let Some(limit) = turn.limit {
                text.push_str(&format!(
                    " ({})",
                    serde_json::to_value(limit)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ));
            }
            if let Some(e) = &turn.error {
                text.push_str(&format!(": {e}"));
            }
            if !turn.final_text.is_empty() {
                text.push_str(&format!("\nIts last text:\n{}", turn.final_text));
            }
            ToolOutput::error(text)
        }
    };
    Ok(out.with_details(details))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Runtime::new` registers the tool without compiling its schema
    /// (`ToolRegistry::register_constant`): the schema must compile.
    #[test]
    fn the_tools_input_schema_compiles() {
        let mut tools = keel_tools::ToolRegistry::new();
        let registered = tools.register(std::sync::Arc::new(SpawnAgent::new(Weak::new())));
        assert!(registered.is_ok(), "{registered:?}");
    }
}
