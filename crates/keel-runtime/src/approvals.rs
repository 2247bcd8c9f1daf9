//! The approvals phase: asking humans, applying their decisions, waiting for them.
//!
//! An approval is a row (the approvals table, where humans decide from any process) and events
//! (`approval.requested`, `approval.decided` / `approval.expired`). The row commits with
//! `approval.requested` in one transaction; a decision is journaled when the planner sees it in
//! the table — allowed only for the exact argument hash the approval was requested for. Waiting
//! on a human is `session.status_changed(requires_action)` with the session's wake-up time at
//! the earliest pending expiry, committed together.

use std::sync::atomic::Ordering;

use chrono::Utc;
use keel_core::plan::ApprovalOutcome;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Correlation, EventBody,
    HookDecision, SessionStatus, StepId, ToolCallId, ToolCallStatus, TurnId,
};
use keel_tools::ToolCallRequest;

use crate::background::{finished_item, status_item};
use crate::driver::Runner;
use crate::error::Result;

impl Runner {
    /// Requests an approval for each call: the row and the events stage together.
    pub(crate) async fn request_approvals(
        &self,
        turn: TurnId,
        step: StepId,
        calls: Vec<ToolCallId>,
    ) -> Result<()> {
        let now = Utc::now();
        let mut j = self.active.journal.lock().await;
        let mut items = Vec::new();
        let mut rows = Vec::new();
        for id in calls {
            let (Some(call), Some(arguments)) =
                (j.state.tool_calls.get(&id), j.exact_arguments(&id))
            else {
                continue;
            };
            // The hash is of the exact arguments (what will run); the row shows them redacted.
            let req = ToolCallRequest {
                call_id: id.to_string(),
                name: call.name.clone(),
                arguments,
            };
            let Ok(v) = self.tools().validate(&req) else {
                continue;
            };
            let corr = Correlation::tool_call(turn, step, id.clone());
            if call.status == ToolCallStatus::Proposed {
                items.push((corr.clone(), EventBody::ToolCallValidating {}));
            }
            let mut rec = self.approvals.new_request(self.session, turn, &v, now);
            self.redactor.redact_value(&mut rec.arguments);
            let acorr = corr.with_approval(rec.approval_id);
            items.push((
                acorr.clone(),
                EventBody::ApprovalRequested {
                    args_hash: rec.args_hash.clone(),
                    expires_at: rec.expires_at,
                },
            ));
            items.push((acorr, EventBody::ToolCallAwaitingApproval {}));
            rows.push(rec);
        }
        j.stage(items).await?;
        j.extras.approvals.extend(rows);
        Ok(())
    }

    /// Journals a decision the approvals table holds (or the approval's expiry).
    pub(crate) async fn apply_approval(
        &self,
        turn: TurnId,
        step: StepId,
        call: ToolCallId,
        approval: ApprovalId,
        outcome: ApprovalOutcome,
    ) -> Result<()> {
        let name = self
            .read(|j| j.state.tool_calls.get(&call).map(|c| c.name.clone()))
            .await
            .unwrap_or_default();
        // A decision names who made it (the approvals row's `decided_by`, set by an
        // authenticated host); an expiry or a refusal by hash names nobody.
        let decided_by = match &outcome {
            ApprovalOutcome::Allowed(_) | ApprovalOutcome::Denied { .. } => self
                .rt
                .store
                .get_approval(self.tenant, approval)
                .await
                .ok()
                .and_then(|r| r.decided_by),
            ApprovalOutcome::HashMismatch
            | ApprovalOutcome::Expired
            | ApprovalOutcome::PolicyDenied { .. } => None,
        };
        // A permission_request hook's journaled decision: the approvals row follows it (a human
        // deciding meanwhile is refused by the row, which the hook decided first in the journal).
        let hook = self
            .read(|j| {
                j.state
                    .approvals
                    .get(&approval)
                    .and_then(|a| a.hook.clone())
                    .filter(|(d, _, _)| matches!(d, HookDecision::Allow | HookDecision::Deny))
                    .map(|(_, h, _)| h)
            })
            .await;
        let (mut outcome, mut hook, mut decided_by) = (outcome, hook, decided_by);
        if let Some(h) = hook.clone()
            && let Some(first) = self.decide_row_for_hook(approval, &outcome, &h).await
        {
            // A human decided the row while the hook ran: the human's decision stands (the
            // hook's `hook.ran` stays in the journal as what it answered, too late).
            tracing::info!(session = %self.session, %approval, hook = %h, "a human decided before the permission_request hook answered; the human's decision stands");
            outcome = match first.decision {
                Some(ApprovalDecision::Deny { reason }) => ApprovalOutcome::Denied { reason },
                Some(d) => ApprovalOutcome::Allowed(d),
                None => outcome,
            };
            decided_by = first.decided_by;
            hook = None;
        }
        let decided_by = if hook.is_some() { None } else { decided_by };
        let acorr = Correlation::default()
            .with_approval(approval)
            .by(decided_by);
        let reject =
            |text: String| finished_item(turn, step, &call, ToolCallStatus::Rejected, text, true);
        let items = match outcome {
            ApprovalOutcome::Allowed(decision) => {
                vec![(
                    acorr,
                    EventBody::ApprovalDecided {
                        decision,
                        hook: hook.clone(),
                    },
                )]
            }
            ApprovalOutcome::Denied { reason } => vec![
                (
                    acorr,
                    EventBody::ApprovalDecided {
                        decision: ApprovalDecision::Deny {
                            reason: reason.clone(),
                        },
                        hook: hook.clone(),
                    },
                ),
                reject(match &hook {
                    Some(h) => format!(
                        "The permission_request hook `{h}` denied this `{name}` call: {reason}. It was not run; do not retry it unchanged."
                    ),
                    None => format!(
                        "The user denied this `{name}` call: {reason}. It was not run; do not retry it unchanged."
                    ),
                }),
            ],
            ApprovalOutcome::HashMismatch => {
                let reason = "the decision was made for other arguments than this call's";
                vec![
                    (
                        acorr,
                        EventBody::ApprovalDecided {
                            decision: ApprovalDecision::Deny {
                                reason: reason.into(),
                            },
                            hook: None,
                        },
                    ),
                    reject(format!(
                        "The approval for this `{name}` call was refused: {reason}. It was not run."
                    )),
                ]
            }
            ApprovalOutcome::PolicyDenied { reason } => {
                // The row leaves `pending` too (nobody is asked any more); a human who allowed
                // it meanwhile is overruled by the policy (logged).
                let hash = self.requested_hash(approval).await;
                let deny = ApprovalDecision::Deny {
                    reason: reason.clone(),
                };
                if let Err(e) = self
                    .approvals
                    .decide(approval, deny, &hash, Utc::now())
                    .await
                {
                    tracing::info!(session = %self.session, %approval, "the session's policy now denies the call; its approvals row stays as decided: {e}");
                }
                vec![
                    (
                        acorr,
                        EventBody::ApprovalDecided {
                            decision: ApprovalDecision::Deny {
                                reason: reason.clone(),
                            },
                            hook: None,
                        },
                    ),
                    reject(format!(
                        "This `{name}` call was not run: the session's policy now denies it ({reason}). Do not retry it unchanged."
                    )),
                ]
            }
            ApprovalOutcome::Expired => {
                // Persist the expiry in the table so no late decision can land.
                let rec = self.approvals.expire_overdue(approval, Utc::now()).await?;
                if rec.status == ApprovalStatus::Allowed || rec.status == ApprovalStatus::Denied {
                    // Decided just now: the next planning pass applies the decision.
                    return Ok(());
                }
                vec![
                    (acorr, EventBody::ApprovalExpired {}),
                    reject(format!(
                        "The approval for this `{name}` call expired at {} without a decision; the call was not run. Ask again if it is still needed.",
                        rec.expires_at.to_rfc3339()
                    )),
                ]
            }
        };
        self.stage(items).await?;
        Ok(())
    }

    /// The argument hash approval `approval` was requested for (empty when unknown).
    async fn requested_hash(&self, approval: ApprovalId) -> String {
        self.read(|j| {
            j.state
                .approvals
                .get(&approval)
                .map(|a| a.args_hash.clone())
        })
        .await
        .unwrap_or_default()
    }

    /// Decides the approvals row as the `permission_request` hook `hook` did (journaled
    /// already). Returns the row when a human decided it first (allowed or denied before the
    /// hook answered): that decision stands, not the hook's. A row that expired, or refuses
    /// for another reason, stays as it is (logged) and `None` is returned.
    async fn decide_row_for_hook(
        &self,
        approval: ApprovalId,
        outcome: &ApprovalOutcome,
        hook: &str,
    ) -> Option<ApprovalRecord> {
        let decision = match outcome {
            ApprovalOutcome::Allowed(d) => d.clone(),
            ApprovalOutcome::Denied { reason } => ApprovalDecision::Deny {
                reason: reason.clone(),
            },
            ApprovalOutcome::HashMismatch
            | ApprovalOutcome::Expired
            | ApprovalOutcome::PolicyDenied { .. } => return None,
        };
        let hash = self.requested_hash(approval).await;
        let Err(e) = self
            .approvals
            .decide(approval, decision.clone(), &hash, Utc::now())
            .await
        else {
            return None;
        };
        let row = self.rt.store.get_approval(self.tenant, approval).await.ok();
        match row {
            Some(r)
                if matches!(r.status, ApprovalStatus::Allowed | ApprovalStatus::Denied)
                    && r.decision.as_ref().is_some_and(|d| *d != decision) =>
            {
                Some(r)
            }
            _ => {
                tracing::warn!(session = %self.session, %approval, %hook, "the approvals row does not take the hook's decision: {e}");
                None
            }
        }
    }

    /// Only humans can move the turn on: `requires_action`, with the wake-up time at the
    /// earliest pending approval's expiry, committed with everything staged.
    pub(crate) async fn wait_for_human(&self, turn: TurnId) -> Result<()> {
        let mut j = self.active.journal.lock().await;
        let wake = j
            .state
            .approvals
            .values()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .filter(|a| {
                j.state
                    .tool_calls
                    .get(&a.tool_call_id)
                    .is_some_and(|c| c.turn_id == turn)
            })
            .map(|a| a.expires_at)
            .chain(
                // A child's approval expiring runs this session again, which re-attaches the
                // child (whose run then expires it and goes on).
                crate::background::lock(&self.active.child_pending)
                    .iter()
                    .filter_map(|p| match p {
                        crate::PendingAction::Approval { expires_at, .. } => Some(*expires_at),
                        crate::PendingAction::Effect { .. } => None,
                    }),
            )
            .min();
        if j.state.status != SessionStatus::RequiresAction {
            j.stage(vec![status_item(
                SessionStatus::RequiresAction,
                "waiting on a human decision",
            )])
            .await?;
        }
        j.extras.wake_at = Some(wake);
        let v = j.commit("session.requires_action").await?;
        self.active.version.store(v, Ordering::SeqCst);
        self.pending_outcome.store(false, Ordering::SeqCst);
        Ok(())
    }
}
