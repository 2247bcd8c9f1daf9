//! The tools phase: running calls the planner said to run.
//!
//! Owns rejections, the parallel batch of read-only calls (spawned tasks), sequential
//! dispatches, re-runs after a crash, and one call's execution with its time limit,
//! cancellation and one result. What the policy says of a call is [`crate::authorize`]'s.

use keel_core::mechanisms::{Mechanism, is_off};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use keel_core::{
    Correlation, EffectClass, EffectStatus, EventBody, OperationKey, StateMachine, StepId,
    ToolCallId, ToolCallStatus, TurnId, canonical::canonical_json,
};
use keel_store::StoreError;
use keel_tools::policy::Policy;
use keel_tools::tool::{StepSnapshot, ToolLimits};
use keel_tools::{ToolCallRequest, ToolContext, ToolResult, ToolResultStatus, ValidatedCall};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::authorize::{SEALED_UNAVAILABLE, map_status};
use crate::background::{finished_item, lock};
use crate::driver::{Items, Runner};
use crate::error::{Result, RuntimeError};
use crate::shared::LiveGuard;

impl Runner {
    /// The validated form of an open call — with exactly the arguments the model proposed,
    /// never redacted ones — and the policy of its step.
    async fn validated(&self, call: &ToolCallId) -> Result<Option<(ValidatedCall, Policy)>> {
        let j = self.active.journal.lock().await;
        let (Some(c), Some(arguments)) = (j.state.tool_calls.get(call), j.exact_arguments(call))
        else {
            return Ok(None);
        };
        let req = ToolCallRequest {
            call_id: c.id.to_string(),
            name: c.name.clone(),
            arguments,
        };
        let Ok(v) = self.tools().validate(&req) else {
            return Ok(None);
        };
        let policy = self.policy_for(&j, c.step_id)?;
        Ok(Some((v, policy)))
    }

    /// The limits tools run under: a `shell` call's `timeout_ms` (asked or default) is capped
    /// at the session's tool timeout, so the shell's own timer never outlasts the runtime's.
    pub(crate) fn tool_limits(&self) -> ToolLimits {
        let mut limits = ToolLimits::default();
        if let Some(ms) = self.config.tool_timeout_ms {
            limits.shell_max_timeout_ms = ms;
            limits.shell_default_timeout_ms = limits.shell_default_timeout_ms.min(ms);
        }
        limits
    }

    /// A call the planner said to run that no longer validates (its tool left the registry):
    /// it gets a failed result instead of running.
    async fn unrunnable(&self, turn: TurnId, step: StepId, call: &ToolCallId) -> Result<()> {
        let (status, sealed) = self
            .read(|j| {
                let c = j.state.tool_calls.get(call);
                (c.map(|c| c.status), c.is_some_and(|c| c.sealed))
            })
            .await;
        let text = if sealed {
            SEALED_UNAVAILABLE
        } else {
            "Error: the call could not be validated any more and was not run."
        };
        let mut items = Vec::new();
        let result = match status {
            Some(ToolCallStatus::Proposed) => {
                items.push((
                    Correlation::tool_call(turn, step, call.clone()),
                    EventBody::ToolCallValidating {},
                ));
                ToolCallStatus::Rejected
            }
            Some(ToolCallStatus::Validating | ToolCallStatus::AwaitingApproval) => {
                ToolCallStatus::Rejected
            }
            Some(ToolCallStatus::Running) => ToolCallStatus::Failed,
            Some(
                ToolCallStatus::Succeeded
                | ToolCallStatus::Failed
                | ToolCallStatus::Cancelled
                | ToolCallStatus::Rejected
                | ToolCallStatus::Interrupted,
            )
            | None => return Ok(()),
        };
        items.push(finished_item(turn, step, call, result, text.into(), true));
        self.stage(items).await?;
        Ok(())
    }

    /// A side-effecting call whose effect could not be prepared — its probe ([`Tool::prepare`])
    /// outlasted the call's time limit (`timed_out`) or the turn was cancelled — gets its result
    /// without running: nothing was dispatched, so nothing happened. A call waiting on its
    /// approval passes through `running` (the only way from an approval to a failure).
    ///
    /// [`Tool::prepare`]: keel_tools::tool::Tool::prepare
    async fn unprepared(
        &self,
        turn: TurnId,
        step: StepId,
        call: &ToolCallId,
        name: &str,
        status: Option<ToolCallStatus>,
        timed_out: bool,
    ) -> Result<()> {
        let corr = Correlation::tool_call(turn, step, call.clone());
        let mut items = Vec::new();
        if status == Some(ToolCallStatus::Proposed) {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
        }
        let (result, text) = if timed_out {
            (
                ToolCallStatus::Failed,
                format!(
                    "Error: `{name}` timed out after {} ms while recording the state it needs to \
                     check its effect after a crash; it was not run and changed nothing.",
                    self.config.tool_timeout_ms.unwrap_or(0)
                ),
            )
        } else {
            (
                ToolCallStatus::Cancelled,
                format!("`{name}` was cancelled before it ran; it changed nothing."),
            )
        };
        if result == ToolCallStatus::Failed && status == Some(ToolCallStatus::AwaitingApproval) {
            items.push((corr, EventBody::ToolCallStarted {}));
        }
        items.push(finished_item(turn, step, call, result, text, true));
        let still_open = self
            .read(|j| {
                j.state
                    .tool_calls
                    .get(call)
                    .is_some_and(|c| !c.status.is_terminal())
            })
            .await;
        if still_open {
            self.stage(items).await?;
        }
        Ok(())
    }

    /// Gives each call its result without running it.
    pub(crate) async fn reject(
        &self,
        turn: TurnId,
        step: StepId,
        calls: Vec<(ToolCallId, ToolCallStatus, String)>,
    ) -> Result<()> {
        let statuses: HashMap<ToolCallId, ToolCallStatus> = self
            .read(|j| {
                calls
                    .iter()
                    .filter_map(|(c, _, _)| {
                        j.state.tool_calls.get(c).map(|s| (c.clone(), s.status))
                    })
                    .collect()
            })
            .await;
        let mut items = Vec::new();
        for (call, status, output) in calls {
            if statuses.get(&call) == Some(&ToolCallStatus::Proposed) {
                items.push((
                    Correlation::tool_call(turn, step, call.clone()),
                    EventBody::ToolCallValidating {},
                ));
            }
            items.push(finished_item(turn, step, &call, status, output, true));
        }
        self.stage(items).await?;
        Ok(())
    }

    /// Starts each read-only, parallel-safe call as its own task.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        turn: TurnId,
        step: StepId,
        calls: Vec<ToolCallId>,
    ) -> Result<()> {
        for call in calls {
            self.spawn_call(turn, step, call);
        }
        Ok(())
    }

    /// Runs one call alone and waits for it.
    pub(crate) async fn dispatch(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
    ) -> Result<()> {
        let Some((v, policy)) = self.validated(&call).await? else {
            return self.unrunnable(turn, step, &call).await;
        };
        lock(&self.active.live_calls).insert(call.clone());
        let r = self
            .clone()
            .run_traced(turn, step, call.clone(), v, policy)
            .await;
        lock(&self.active.live_calls).remove(&call);
        self.active.call_done.notify_waiters();
        r
    }

    /// Runs again a read-only call a worker that is gone left `running`.
    pub(crate) async fn rerun(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        sequential: bool,
    ) -> Result<()> {
        if sequential {
            self.dispatch(turn, step, call).await
        } else {
            self.spawn_call(turn, step, call);
            Ok(())
        }
    }

    /// Runs `call` as a task of its own (it is live from now until its result is staged).
    pub(crate) fn spawn_call(self: &Arc<Self>, turn: TurnId, step: StepId, call: ToolCallId) {
        lock(&self.active.live_calls).insert(call.clone());
        let this = self.clone();
        let handle = tokio::spawn(async move {
            let id = call.clone();
            // However the task ends (a panic included), the call is no longer running here.
            let _live = LiveGuard(this.active.clone(), id.clone());
            let r = match this.validated(&call).await {
                Ok(Some((v, policy))) => this.clone().run_traced(turn, step, call, v, policy).await,
                Ok(None) => this.unrunnable(turn, step, &call).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                tracing::warn!(session = %this.session, call = %id, "tool execution: {e}");
            }
        });
        lock(&self.inflight).push(handle);
    }

    /// Waits for every call task of this run.
    pub(crate) async fn join_inflight(&self) {
        loop {
            let handles: Vec<_> = std::mem::take(&mut *lock(&self.inflight));
            if handles.is_empty() {
                return;
            }
            for h in handles {
                let _ = h.await;
            }
        }
    }

    /// Intent before effect: stages a dispatch's `items` and commits them, with everything
    /// staged before, under one hold of the journal lock — unless the turn's `token` is
    /// cancelled, checked under that lock: the lock the intent handler holds while it
    /// journals `turn.cancel_requested` and cancels the turn's token, so a dispatch is
    /// journaled before a cancellation or not at all (turned off, always staging, by the
    /// test-only switch `cancel_before_dispatch`, `keel_core::mechanisms`). When the
    /// store refuses the commit because its effects table records a dispatch of `key` that
    /// this journal lacks ([`StoreError::EffectClaimed`]: written by something else), the
    /// effect is settled `outcome_unknown` in the same commit instead, and it must not run.
    ///
    /// # Errors
    /// Store errors of the commit.
    async fn commit_intent(
        &self,
        token: &CancellationToken,
        key: &OperationKey,
        items: Items,
    ) -> Result<Intent> {
        if self.lost.is_cancelled() {
            return Err(self.lease_lost());
        }
        let mut j = self.active.journal.lock().await;
        if token.is_cancelled() && !is_off(Mechanism::CancelBeforeDispatch) {
            return Ok(Intent::Cancelled);
        }
        j.stage(items).await?;
        match self.commit_locked(&mut j, "tool.dispatched").await {
            Ok(_) => Ok(Intent::Committed),
            Err(RuntimeError::Store(StoreError::EffectClaimed { .. })) => {
                tracing::warn!(session = %self.session, %key, "refused a second dispatch of an operation key: the effects table records a dispatch this journal lacks (or the key is another session's)");
                j.drop_staged_probe(key);
                j.stage(vec![(
                    Correlation::default().with_operation(key.clone()),
                    EventBody::EffectOutcomeUnknown {},
                )])
                .await?;
                self.commit_locked(&mut j, "effect.duplicate").await?;
                Ok(Intent::Claimed)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs one call: stages its start — for a side-effecting call or an idempotent write also
    /// its intent (`effect.prepared` on the first attempt, `effect.dispatched`), committed before
    /// the effect starts — executes it under its own cancellation token and time limit, and
    /// stages its one result (a side effect's outcome is committed before anything else
    /// happens; see the driver).
    pub(crate) async fn run_call(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        v: ValidatedCall,
        policy: Policy,
    ) -> Result<()> {
        let corr = Correlation::tool_call(turn, step, call.clone());
        let side_effecting = v.effect != EffectClass::ReadOnly;
        let key = OperationKey::for_call(self.session, step, &call);
        let (status, effect, approved_hash) = self
            .read(|j| {
                let c = j.state.tool_calls.get(&call);
                (
                    c.map(|c| c.status),
                    j.state.effects.get(&key).map(|e| (e.status, e.attempts)),
                    c.and_then(|c| c.approval_id)
                        .and_then(|a| j.state.approvals.get(&a))
                        .map(|a| a.args_hash.clone()),
                )
            })
            .await;
        // An approved call runs only with exactly the arguments the approval was for: checked
        // again here, at execution, not only when the decision was taken.
        if let Some(hash) = approved_hash
            && keel_core::args_hash(&v.arguments) != hash
            && !is_off(Mechanism::DispatchHash)
        {
            let text = format!(
                "The `{}` call was not run: its arguments differ from the ones that were approved.",
                v.name
            );
            let mut items = Vec::new();
            if status == Some(ToolCallStatus::Running) {
                items.push(finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Failed,
                    text,
                    true,
                ));
            } else {
                items.push(finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Rejected,
                    text,
                    true,
                ));
            }
            self.stage(items).await?;
            return Ok(());
        }
        let token = self.turn_token().child_token();
        // The call's time limit runs from here: preparing the effect (the tool's probe) is part
        // of the call, under the same limit and cancellation as running it.
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let deadline = self.config.tool_timeout_ms.map_or(far, |ms| {
            tokio::time::Instant::now() + Duration::from_millis(ms)
        });
        let ctx = ToolContext {
            call_id: call.to_string(),
            cancel: token.clone(),
            progress: self.progress.clone(),
            workspace: self.workspace.clone(),
            sandbox: self.sandbox.clone(),
            artifacts: self.artifacts.clone(),
            snapshot: Arc::new(StepSnapshot {
                step_id: step.to_string(),
                policy,
            }),
            limits: self.tool_limits(),
            hash_key: self.rt.options.seal_key.hash_key().clone(),
            scope: Some(keel_tools::tool::CallScope {
                tenant_id: self.tenant,
                session_id: self.session,
                turn_id: turn,
                step_id: step,
            }),
            session: Some(self.scope.clone()),
        };
        let mut items = Vec::new();
        if status == Some(ToolCallStatus::Proposed) {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
        }
        if side_effecting {
            match effect {
                None => {
                    // Keyed: the journal keeps it, and the arguments may hold a secret that
                    // their journaled form redacts (see `keel_tools::keyed_hash`).
                    let request_hash = self.rt.options.seal_key.hash_key().hash(
                        canonical_json(&json!({"tool": v.name, "arguments": v.arguments}))
                            .as_bytes(),
                    );
                    // What the tool's reconcile will need after a crash (file hashes, …):
                    // under the call's time limit and the turn's cancellation. A probe that
                    // does not finish in time ends the call before it runs (nothing happened).
                    let probe = match self.tools().get(&v.name) {
                        Some(tool) => {
                            let prepare = tool.prepare(&v.arguments, &ctx);
                            tokio::select! {
                                p = prepare => p,
                                () = tokio::time::sleep_until(deadline) => {
                                    return self.unprepared(turn, step, &call, &v.name, status, true).await;
                                }
                                () = token.cancelled() => {
                                    return self.unprepared(turn, step, &call, &v.name, status, false).await;
                                }
                            }
                        }
                        None => None,
                    };
                    items.push((
                        corr.clone().with_operation(key.clone()),
                        EventBody::EffectPrepared {
                            request_hash,
                            probe,
                        },
                    ));
                    items.push((
                        Correlation::default()
                            .with_operation(key.clone())
                            .with_attempt(1),
                        EventBody::EffectDispatched {},
                    ));
                }
                Some((EffectStatus::OutcomeUnknown, attempts)) => items.push((
                    Correlation::default()
                        .with_operation(key.clone())
                        .with_attempt(attempts + 1),
                    EventBody::EffectDispatched {},
                )),
                Some((other, _)) => {
                    // The planner never dispatches a key again but after outcome_unknown.
                    tracing::warn!(session = %self.session, %key, status = %other.as_str(), "refused a second dispatch of an operation key");
                    return Ok(());
                }
            }
        }
        items.push((corr.clone(), EventBody::ToolCallStarted {}));
        if side_effecting {
            // The cancel check before dispatch: a turn cancelled since the call was planned
            // (its cancellation journaled, its token cancelled, under the journal lock) never
            // journals the dispatch; the call gets its result unrun (nothing happened).
            match self.commit_intent(&token, &key, items).await? {
                Intent::Committed => {}
                Intent::Cancelled => {
                    return self
                        .unprepared(turn, step, &call, &v.name, status, false)
                        .await;
                }
                Intent::Claimed => return Ok(()),
            }
            // The commit may have come back after the lease lapsed (the store was unreachable
            // past the TTL and answered late): another worker may take the session over at
            // any moment now and find this effect `outcome_unknown`. It must not start.
            if self.lost.is_cancelled() {
                return Err(self.lease_lost());
            }
        } else {
            self.stage(items).await?;
        }

        self.active
            .tool_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(call.to_string(), token.clone());
        let tools = self.tools();
        let fut = tools.execute(&v, &ctx);
        tokio::pin!(fut);
        let grace = Duration::from_millis(self.rt.options.cancel_grace_ms);
        let mut timed_out = false;
        // A tool stopped gets `grace` to end on its own — unless the lease is lost or lapsed:
        // then it is dropped (killed) at once, before another worker can take the session over.
        let result: Option<ToolResult> = tokio::select! {
            r = &mut fut => Some(r),
            () = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                token.cancel();
                settle(fut.as_mut(), grace, &self.lost).await
            }
            () = token.cancelled() => settle(fut.as_mut(), grace, &self.lost).await,
        };
        self.active
            .tool_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call.as_str());
        self.hub_progress.finish(call.as_str());
        let interrupted = token.is_cancelled();
        let (status, output) = match (&result, timed_out) {
            (_, true) => (
                ToolCallStatus::Failed,
                format!(
                    "Error: `{}` timed out after {} ms and was stopped.{}",
                    v.name,
                    self.config.tool_timeout_ms.unwrap_or(0),
                    result
                        .as_ref()
                        .map(|r| format!(" Output so far:\n{}", r.content))
                        .unwrap_or_default()
                ),
            ),
            (Some(r), false) if interrupted => (
                ToolCallStatus::Cancelled,
                if r.content.is_empty() {
                    format!("`{}` was cancelled.", v.name)
                } else {
                    r.content.clone()
                },
            ),
            (None, false) => (
                ToolCallStatus::Cancelled,
                format!("`{}` was cancelled.", v.name),
            ),
            // The call had started: a tool that refuses its arguments only now (its own checks
            // in `call`) failed without acting — `rejected` is a state for calls that never
            // started, and asking the machine for `running -> rejected` is illegal.
            (Some(r), false) if r.status == ToolResultStatus::Rejected => {
                (ToolCallStatus::Failed, r.content.clone())
            }
            (Some(r), false) => (map_status(r.status), r.content.clone()),
        };
        if self.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        if self.active.take_detached(&call) {
            // Its child waits on a human and the run stopped for it: no result; the call stays
            // `running` and the next run re-runs it (a `spawn_agent` call re-attaches its child).
            return Ok(());
        }
        let mut items = Vec::new();
        let ecorr = Correlation::default().with_operation(key.clone());
        if side_effecting {
            if interrupted || result.as_ref().is_some_and(|r| r.panicked) {
                // Stopped mid-flight (or the tool broke): what happened is unknown — never
                // recorded as failed.
                items.push((ecorr, EventBody::EffectOutcomeUnknown {}));
            } else if let Some(r) = &result {
                // `committed` when the action happened, whatever its result for the model (a
                // command that ran and exited non-zero); `failed` only when it provably did
                // not; a tool that gave up on its own is unknown.
                match r.status {
                    ToolResultStatus::Rejected => items.push((
                        ecorr,
                        EventBody::EffectFailed {
                            error: r.content.clone(),
                        },
                    )),
                    ToolResultStatus::Failed if r.not_performed => items.push((
                        ecorr,
                        EventBody::EffectFailed {
                            error: r.content.clone(),
                        },
                    )),
                    ToolResultStatus::Succeeded | ToolResultStatus::Failed => items.push((
                        ecorr,
                        EventBody::EffectCommitted {
                            outcome: json!({
                                "content": r.content,
                                "details": r.details,
                                "is_error": r.status != ToolResultStatus::Succeeded,
                            }),
                        },
                    )),
                    ToolResultStatus::Cancelled => {
                        items.push((ecorr, EventBody::EffectOutcomeUnknown {}));
                    }
                }
            }
        }
        let is_error = status != ToolCallStatus::Succeeded;
        // The post_tool_use hooks see the result and may add to what the model reads.
        let (output, hook_items) = self
            .post_tool_hooks(turn, step, &call, &v.name, &v.arguments, status, output)
            .await;
        items.extend(hook_items);
        let canceller = self.active.take_canceller(call.as_str());
        let mut finished = finished_item(turn, step, &call, status, output, is_error);
        if status == ToolCallStatus::Cancelled {
            finished.0.principal_id = canceller;
        }
        items.push(finished);
        let still_open = self
            .read(|j| {
                j.state
                    .tool_calls
                    .get(&call)
                    .is_some_and(|c| !c.status.is_terminal())
            })
            .await;
        if still_open {
            self.stage(items).await?;
            if side_effecting {
                self.pending_outcome.store(true, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// What a stopped tool's future gives within `grace`; `None` when it did not end in time, or
/// at once when `lost` is cancelled (the lease is lost or lapsed: the caller drops — kills —
/// the tool without waiting).
async fn settle<F: std::future::Future>(
    fut: std::pin::Pin<&mut F>,
    grace: Duration,
    lost: &CancellationToken,
) -> Option<F::Output> {
    tokio::select! {
        r = tokio::time::timeout(grace, fut) => r.ok(),
        () = lost.cancelled() => None,
    }
}

/// What [`Runner::commit_intent`] did.
enum Intent {
    /// The intent is durable: the effect may start.
    Committed,
    /// The turn was cancelled first: nothing was staged.
    Cancelled,
    /// Something else dispatched the effect already: it is settled `outcome_unknown`.
    Claimed,
}
