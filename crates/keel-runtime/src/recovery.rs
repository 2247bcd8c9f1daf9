//! Recovery of calls a worker that is gone left `running`, from what the journal knows of
//! their effects (ARCHITECTURE rule 1): a recorded outcome is reused, an intent never
//! dispatched is closed, an `outcome_unknown` effect is settled by a human's decision or by the
//! tool's `reconcile` — never blindly re-run, never faked as failed. (Re-running read-only calls
//! and re-dispatching idempotent writes or decided retries is the tools phase's.)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_core::plan::Settle;
use keel_core::{
    Correlation, EffectDecision, EventBody, OperationKey, StepId, ToolCallId, ToolCallStatus,
    TurnId,
};
use keel_tools::ToolContext;
use keel_tools::tool::{ReconcileOutcome, StepSnapshot};
use serde_json::{Value, json};

use crate::background::{finished_item, lock};
use crate::driver::Runner;
use crate::error::Result;

impl Runner {
    /// Settles a call left `running` from its effect's journaled status (see [`Settle`]).
    pub(crate) async fn settle(
        &self,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        key: OperationKey,
        how: Settle,
    ) -> Result<()> {
        let ecorr = Correlation::default().with_operation(key);
        let items = match how {
            Settle::NeverDispatched => vec![
                (
                    ecorr,
                    EventBody::EffectFailed {
                        error: "never dispatched".into(),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Interrupted,
                    "The call was interrupted before it started.".into(),
                    true,
                ),
            ],
            Settle::Recorded { committed } => vec![finished_item(
                turn,
                step,
                &call,
                if committed {
                    ToolCallStatus::Succeeded
                } else {
                    ToolCallStatus::Failed
                },
                "The call's outcome was recorded before a crash.".into(),
                !committed,
            )],
            Settle::Decided(EffectDecision::Committed { outcome }) => {
                let text = match &outcome {
                    Value::String(s) => s.clone(),
                    Value::Null => "The operation was confirmed as done.".into(),
                    other => other
                        .get("content")
                        .and_then(Value::as_str)
                        .map_or_else(|| other.to_string(), str::to_owned),
                };
                vec![
                    (ecorr, EventBody::EffectCommitted { outcome }),
                    finished_item(turn, step, &call, ToolCallStatus::Succeeded, text, false),
                ]
            }
            Settle::Decided(EffectDecision::Failed { error }) => vec![
                (
                    ecorr,
                    EventBody::EffectFailed {
                        error: error.clone(),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Failed,
                    format!("Error: the operation did not happen: {error}"),
                    true,
                ),
            ],
            // A retry is a new dispatch (the tools phase), never a settlement.
            Settle::Decided(EffectDecision::Retry) => Vec::new(),
        };
        self.stage(items).await?;
        self.pending_outcome.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Asks the call's tool whether its `outcome_unknown` effect took place.
    pub(crate) async fn reconcile(
        self: &Arc<Self>,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        key: OperationKey,
    ) -> Result<()> {
        let (name, arguments, probe) = self
            .read(|j| {
                let c = j.state.tool_calls.get(&call);
                (
                    c.map(|c| c.name.clone()).unwrap_or_default(),
                    j.exact_arguments(&call),
                    j.state.effects.get(&key).and_then(|e| e.probe.clone()),
                )
            })
            .await;
        // Never reconciled against redacted arguments: without the exact ones, a human decides.
        let (Some(tool), Some(arguments)) = (self.tools().get(&name).cloned(), arguments) else {
            lock(&self.unreconciled).insert(key);
            return Ok(());
        };
        let ctx = ToolContext {
            call_id: call.to_string(),
            cancel: self.turn_token().child_token(),
            progress: self.progress.clone(),
            workspace: self.workspace.clone(),
            sandbox: self.sandbox.clone(),
            artifacts: self.artifacts.clone(),
            snapshot: Arc::new(StepSnapshot::default()),
            limits: self.tool_limits(),
            hash_key: self.rt.options.seal_key.hash_key().clone(),
            scope: None,
            session: Some(self.scope.clone()),
        };
        let ecorr = Correlation::default().with_operation(key.clone());
        // Under the tool time limit and the turn's cancellation, like the call: a check that
        // does not answer in time cannot tell (a human decides).
        let check = tool.reconcile_call(key.as_str(), &arguments, probe.as_ref(), &ctx);
        let limit = self
            .config
            .tool_timeout_ms
            .map_or(Duration::from_secs(365 * 24 * 3600), Duration::from_millis);
        let outcome = tokio::select! {
            o = check => o,
            () = tokio::time::sleep(limit) => {
                tracing::warn!(session = %self.session, operation = %key, "reconcile did not answer within the tool time limit; a human decides");
                ReconcileOutcome::Unknown
            }
            () = ctx.cancel.cancelled() => ReconcileOutcome::Unknown,
        };
        let items = match outcome {
            ReconcileOutcome::Committed { output } => vec![
                (
                    ecorr,
                    EventBody::EffectCommitted {
                        outcome: json!({"content": output.content, "details": output.details, "reconciled": true}),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Succeeded,
                    output.content,
                    false,
                ),
            ],
            ReconcileOutcome::Failed { reason } => vec![
                (
                    ecorr,
                    EventBody::EffectFailed {
                        error: reason.clone(),
                    },
                ),
                finished_item(
                    turn,
                    step,
                    &call,
                    ToolCallStatus::Failed,
                    format!(
                        "Error: the operation did not happen (checked after a crash): {reason}"
                    ),
                    true,
                ),
            ],
            // Provably not done: dispatch it again (the planner sees the decision).
            ReconcileOutcome::NotHappened { reason } => {
                tracing::info!(session = %self.session, operation = %key, %reason, "reconcile: the effect did not happen; running the call again");
                vec![(
                    ecorr,
                    EventBody::EffectDecided {
                        decision: EffectDecision::Retry,
                        reconciled: true,
                    },
                )]
            }
            ReconcileOutcome::Unknown => {
                lock(&self.unreconciled).insert(key);
                return Ok(());
            }
        };
        self.stage(items).await?;
        self.pending_outcome.store(true, Ordering::SeqCst);
        Ok(())
    }
}
