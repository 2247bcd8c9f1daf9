//! The hooks phase: running the hooks the planner asked for ([`keel_core::Next::RunHooks`]) and
//! the ones that ride along a tool call's result and a compaction, journaling each run as
//! `hook.ran` (its name, event, duration, decision) before its decision takes effect.
//!
//! What the decisions do:
//! - `session_start` (before the session's first turn samples) and `user_prompt_submit`
//!   (before each turn samples): `context` is added to the model's context after the input;
//!   `deny`/`block` (or exit status 2) from a `user_prompt_submit` hook ends the turn `aborted`
//!   before any model call, naming the hook and its reason. The chain stops at a block.
//! - `pre_tool_use` (before a call is validated and authorized; the call cannot run before the
//!   decision commits, so a slow hook that denies always wins over a fast tool): hooks of a call
//!   run in order, each seeing the input as the ones before left it. `deny` stops the chain and
//!   the call gets a rejected result with the hook's reason; `ask` asks a human even where the
//!   policy allows; `allow` skips a policy `ask` (never a policy `deny`); `rewrite` replaces the
//!   call's input — journaled in the `hook.ran` (redacted; sealed exact when redaction changed
//!   it), validated again against the tool's schema, decided by the policy, hashed by its
//!   approval, and run.
//! - `permission_request` (a call waits on its approval; the approval row is committed first,
//!   so a human may decide meanwhile): the first hook answering `allow` or `deny` decides the
//!   approval — `approval.decided` names the hook (`hook`), and the approvals row is decided
//!   to match; `none` leaves it to the next hook, then to a human.
//! - `post_tool_use` (a call has its result): `context` is appended to the result the model
//!   sees; journaled with the result.
//! - `pre_compact` (before older context is summarized): observes only; compaction, which
//!   keeps the turn within its context window, goes on whatever the hook answers.
//! - `stop` (a response without calls would complete the turn): `continue` (or exit status 2)
//!   gives the model the hook's reason and samples another step — at most
//!   `max_stop_continues` times per turn (default 3); once more ends the turn
//!   `loop_detected`, naming the hook.

use std::sync::Arc;

use keel_core::plan::{CallFacts, HookFacts, Verdict};
use keel_core::state::ToolCallState;
use keel_core::{
    Correlation, EventBody, HookDecision, HookEvent, StepId, ToolCallId, ToolCallStatus, TurnId,
};
use serde_json::{Value, json};

use super::{Hook, HookInput, HookRun};
use crate::driver::{Items, Runner};
use crate::error::Result;

impl Runner {
    /// The planner's facts about hooks, for the session in `state`.
    pub(crate) fn hook_facts(&self, state: &keel_core::SessionState) -> HookFacts {
        let hooks = &self.rt.options.hooks;
        let permission_request = if hooks.has(HookEvent::PermissionRequest) {
            state
                .open_tool_calls()
                .filter(|c| c.status == ToolCallStatus::AwaitingApproval)
                .filter(|c| {
                    !hooks
                        .matching(HookEvent::PermissionRequest, Some(&c.name))
                        .is_empty()
                })
                .map(|c| c.id.clone())
                .collect()
        } else {
            std::collections::BTreeSet::new()
        };
        HookFacts {
            session_start: hooks.has(HookEvent::SessionStart),
            user_prompt_submit: hooks.has(HookEvent::UserPromptSubmit),
            permission_request,
            stop: hooks.has(HookEvent::Stop),
            max_stop_continues: hooks.max_stop_continues(),
        }
    }

    /// Whether `pre_tool_use` hooks must decide about calls to `tool` before anything else.
    pub(crate) fn hooks_gate(&self, tool: &str) -> bool {
        !self
            .rt
            .options
            .hooks
            .matching(HookEvent::PreToolUse, Some(tool))
            .is_empty()
    }

    /// Whether `call` waits on its `pre_tool_use` hooks: hooks match it, none has decided, and
    /// it is not authorized yet.
    pub(crate) fn awaits_hook(&self, call: &ToolCallState) -> bool {
        call.hook.is_none()
            && matches!(
                call.status,
                ToolCallStatus::Proposed | ToolCallStatus::Validating
            )
            && self.hooks_gate(&call.name)
    }

    /// `facts` (validation and the policy's verdict) with the call's `pre_tool_use` decision
    /// applied: a hook's `deny` refuses, `ask` asks, `allow` answers a policy `ask`; a policy
    /// `deny` stands.
    pub(crate) fn with_hook_decision(call: &ToolCallState, facts: CallFacts) -> CallFacts {
        let Some(hook) = &call.hook else {
            return facts;
        };
        match facts {
            CallFacts::Valid {
                effect,
                parallel_safe,
                can_reconcile,
                verdict,
            } => {
                let verdict = match (hook.decision, verdict) {
                    (HookDecision::Deny, _) => Verdict::Deny {
                        reason: format!(
                            "the pre_tool_use hook `{}` denied it: {}",
                            hook.hook,
                            hook.reason.as_deref().unwrap_or("no reason given")
                        ),
                    },
                    (_, deny @ Verdict::Deny { .. }) => deny,
                    (HookDecision::Ask, _) => Verdict::Ask,
                    (HookDecision::Allow, Verdict::Ask) => Verdict::Allow,
                    (_, v) => v,
                };
                CallFacts::Valid {
                    effect,
                    parallel_safe,
                    can_reconcile,
                    verdict,
                }
            }
            CallFacts::Invalid { status, output } => CallFacts::Invalid {
                status,
                output: match &hook.rewritten_by {
                    Some(h) => format!(
                        "{output}\n(The input was rewritten by the pre_tool_use hook `{h}`.)"
                    ),
                    None => output,
                },
            },
            CallFacts::AwaitingHook => CallFacts::AwaitingHook,
        }
    }

    /// What every hook is given.
    fn hook_input(&self, event: HookEvent, hook: &Hook, turn: TurnId) -> HookInput {
        HookInput {
            hook_event: event.as_str().to_owned(),
            hook: hook.name.clone(),
            session_id: self.session.to_string(),
            turn_id: turn.to_string(),
            cwd: self.workspace.root().display().to_string(),
            permission_mode: serde_json::to_value(self.config.permission_mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            ..HookInput::default()
        }
    }

    /// Runs `hook` on `input`; `None` when the turn was cancelled first.
    async fn run_hook(&self, hook: &Hook, input: &HookInput) -> Option<HookRun> {
        let env = self.sandbox.tool_env(std::env::vars_os());
        let run = hook
            .run(
                input,
                self.workspace.root(),
                &env,
                self.rt.options.hooks.client(),
                &self.turn_token(),
            )
            .await?;
        tracing::info!(
            session = %self.session, hook = %run.hook, event = %input.hook_event,
            decision = %run.decision.as_str(), duration_ms = run.duration_ms,
            error = run.error.as_deref().unwrap_or(""),
            "hook ran"
        );
        Some(run)
    }

    /// Runs the hooks of `event` the planner asked for and commits their `hook.ran` events
    /// (see the module docs). A cancelled turn journals nothing: the planner ends it next.
    pub(crate) async fn run_hooks(
        self: &Arc<Self>,
        turn: TurnId,
        event: HookEvent,
        calls: Vec<ToolCallId>,
    ) -> Result<()> {
        let items = match event {
            HookEvent::PreToolUse | HookEvent::PermissionRequest => {
                if event == HookEvent::PermissionRequest {
                    // The approval rows are durable before anyone, hook or human, decides.
                    self.commit("approval.requested").await?;
                }
                let runs = calls
                    .into_iter()
                    .map(|call| self.call_hooks(turn, event, call));
                let mut items = Vec::new();
                for r in futures_util::future::join_all(runs).await {
                    match r? {
                        Some(mut more) => items.append(&mut more),
                        None => return Ok(()),
                    }
                }
                items
            }
            HookEvent::SessionStart | HookEvent::UserPromptSubmit | HookEvent::Stop => {
                match self.turn_hooks(turn, event).await {
                    Some(items) => items,
                    None => return Ok(()),
                }
            }
            HookEvent::PostToolUse | HookEvent::PreCompact => {
                // These ride along their phase (a call's result, a compaction).
                Vec::new()
            }
        };
        self.append("hook.ran", items).await?;
        Ok(())
    }

    /// The hooks of a turn event, in order (a `user_prompt_submit` block stops the chain).
    async fn turn_hooks(&self, turn: TurnId, event: HookEvent) -> Option<Items> {
        let (prompt, last_message, continues) = self
            .read(|j| {
                let t = j.state.turns.get(&turn);
                (
                    t.map(|t| t.input.clone()),
                    j.proj.last_text.get(&turn).cloned(),
                    t.map_or(0, |t| t.stop_continues),
                )
            })
            .await;
        let mut items = Vec::new();
        for hook in self.rt.options.hooks.matching(event, None) {
            let mut input = self.hook_input(event, hook, turn);
            match event {
                HookEvent::SessionStart | HookEvent::UserPromptSubmit => {
                    input.prompt.clone_from(&prompt);
                }
                HookEvent::Stop => {
                    input.last_message.clone_from(&last_message);
                    input.stop_continues = Some(continues);
                }
                HookEvent::PreToolUse
                | HookEvent::PermissionRequest
                | HookEvent::PostToolUse
                | HookEvent::PreCompact => {}
            }
            let run = self.run_hook(hook, &input).await?;
            let blocked =
                event == HookEvent::UserPromptSubmit && run.decision == HookDecision::Deny;
            items.push((Correlation::turn(turn), ran(event, run)));
            if blocked {
                break;
            }
        }
        Some(items)
    }

    /// The `pre_tool_use` or `permission_request` hooks of one call, in order: each sees the
    /// input earlier rewrites left; a `deny` (or, for an approval, any decision) ends the chain.
    async fn call_hooks(
        &self,
        turn: TurnId,
        event: HookEvent,
        call: ToolCallId,
    ) -> Result<Option<Items>> {
        let found = self
            .read(|j| {
                let c = j.state.tool_calls.get(&call)?;
                Some((
                    c.step_id,
                    c.name.clone(),
                    j.exact_arguments(&call),
                    c.approval_id,
                ))
            })
            .await;
        let Some((step, name, Some(mut arguments), approval)) = found else {
            // Unknown, or its exact arguments are gone: validation rejects it next.
            return Ok(Some(Vec::new()));
        };
        let mut corr = Correlation::tool_call(turn, step, call.clone());
        if event == HookEvent::PermissionRequest {
            let Some(a) = approval else {
                return Ok(Some(Vec::new()));
            };
            corr = corr.with_approval(a);
        }
        let mut items = Vec::new();
        for hook in self.rt.options.hooks.matching(event, Some(&name)) {
            let mut input = self.hook_input(event, hook, turn);
            input.tool_name = Some(name.clone());
            input.tool_call_id = Some(call.to_string());
            input.tool_input = Some(arguments.clone());
            input.approval_id = approval.map(|a| a.to_string());
            let Some(run) = self.run_hook(hook, &input).await else {
                return Ok(None);
            };
            if let Some(new) = &run.input {
                arguments = new.clone();
            }
            let stop = match event {
                HookEvent::PreToolUse => run.decision == HookDecision::Deny,
                _ => matches!(run.decision, HookDecision::Allow | HookDecision::Deny),
            };
            items.push((corr.clone(), ran(event, run)));
            if stop {
                break;
            }
        }
        Ok(Some(items))
    }

    /// Runs the `post_tool_use` hooks of a finished call: their `hook.ran` events (to stage
    /// with the result) and the result with their context appended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn post_tool_hooks(
        &self,
        turn: TurnId,
        step: StepId,
        call: &ToolCallId,
        name: &str,
        arguments: &Value,
        status: ToolCallStatus,
        mut output: String,
    ) -> (String, Items) {
        let hooks = self
            .rt
            .options
            .hooks
            .matching(HookEvent::PostToolUse, Some(name));
        let mut items = Vec::new();
        for hook in hooks {
            let mut input = self.hook_input(HookEvent::PostToolUse, hook, turn);
            input.tool_name = Some(name.to_owned());
            input.tool_call_id = Some(call.to_string());
            input.tool_input = Some(arguments.clone());
            input.tool_result = Some(json!({
                "status": status,
                "output": output,
                "is_error": status != ToolCallStatus::Succeeded,
            }));
            let Some(run) = self.run_hook(hook, &input).await else {
                break;
            };
            if let Some(context) = &run.context {
                output.push_str(&format!(
                    "\n\n[post_tool_use hook `{}`] {context}",
                    run.hook
                ));
            }
            items.push((
                Correlation::tool_call(turn, step, call.clone()),
                ran(HookEvent::PostToolUse, run),
            ));
        }
        (output, items)
    }

    /// Runs the `pre_compact` hooks before a compaction: their `hook.ran` events, to stage with
    /// it.
    pub(crate) async fn pre_compact_hooks(&self, turn: TurnId, aggressive: bool) -> Items {
        let mut items = Vec::new();
        for hook in self.rt.options.hooks.matching(HookEvent::PreCompact, None) {
            let mut input = self.hook_input(HookEvent::PreCompact, hook, turn);
            input.trigger = Some(if aggressive { "overflow" } else { "threshold" }.into());
            let Some(run) = self.run_hook(hook, &input).await else {
                break;
            };
            items.push((Correlation::turn(turn), ran(HookEvent::PreCompact, run)));
        }
        items
    }
}

/// The `hook.ran` event of `run`.
fn ran(event: HookEvent, run: HookRun) -> EventBody {
    EventBody::HookRan {
        hook: run.hook,
        event,
        duration_ms: run.duration_ms,
        decision: run.decision,
        reason: run.reason,
        arguments: run.input,
        sealed: false,
        context: run.context,
        error: run.error,
    }
}
