//! Validation and authorization: what the step's frozen policy says of each call.
//!
//! Owns the session policy (the configured rules plus those granted by `allow_for_session`
//! decisions), the policy frozen with a step, and [`Runner::assess`]: validating one call's
//! exact arguments and asking the policy about it, which gives the planner its [`CallFacts`].
//! Nothing here runs a tool.

use keel_core::plan::{CallFacts, Verdict};
use keel_core::{EffectClass, Release, StateMachine, StepId, ToolCallId, ToolCallStatus};
use keel_tools::policy::{Policy, Verdict as PolicyVerdict, session_rules_for};
use keel_tools::workspace::Workspace;
use keel_tools::{ToolCallRequest, ToolRegistry, ToolResultStatus, ValidatedCall};
use serde_json::Value;

use crate::background::lock;
use crate::config::SessionConfig;
use crate::driver::Runner;
use crate::error::Result;
use crate::journal::Journal;

/// The result of a call whose arguments held a secret and whose exact arguments are gone (sealed
/// under another deployment key): it never runs with the redacted ones.
pub(crate) const SEALED_UNAVAILABLE: &str = "Error: the call was not run: its arguments held a secret, and their exact form (sealed until the call ends) could not be opened with this deployment's key.";

/// The policy the session enforces (the pinned release's rules under the settings, see
/// [`crate::pinned::enforced_policy`]) plus the session rules granted by `allow_for_session`
/// decisions.
pub(crate) fn session_policy(
    release: &Release,
    config: &SessionConfig,
    j: &Journal,
    tools: &ToolRegistry,
) -> Result<Policy> {
    let mut policy = crate::pinned::enforced_policy(j.session, release, config)?;
    if let Ok(ws) = Workspace::new(&config.workspace) {
        for (name, args) in &j.proj.allowed_for_session {
            let call = ValidatedCall {
                call_id: String::new(),
                name: name.clone(),
                arguments: args.clone(),
                effect: EffectClass::SideEffecting,
                parallel_safe: false,
            };
            let subject = tools.subject(&call, &ws);
            policy.rules.extend(session_rules_for(name, &subject));
        }
    }
    Ok(policy)
}

pub(crate) fn map_status(s: ToolResultStatus) -> ToolCallStatus {
    match s {
        ToolResultStatus::Succeeded => ToolCallStatus::Succeeded,
        ToolResultStatus::Failed => ToolCallStatus::Failed,
        ToolResultStatus::Cancelled => ToolCallStatus::Cancelled,
        ToolResultStatus::Rejected => ToolCallStatus::Rejected,
    }
}

/// The tool result of a call to a tool the agent is not offered: names the tools it is (the
/// ones its model was shown), or says it has none.
fn unknown_tool_text(name: &str, offered: &[String]) -> String {
    if offered.is_empty() {
        format!("Unknown tool `{name}`: this agent has no tools; answer in text.")
    } else {
        format!(
            "Unknown tool `{name}`: this agent's release does not enable it. Available tools: {}.",
            offered.join(", ")
        )
    }
}

impl Runner {
    /// The names of the tools this agent's model is shown (the release's list, or every tool of
    /// the registry, less those the release does not enable), sorted.
    fn offered_names(&self) -> Vec<String> {
        let registry = self.tools();
        let offered = crate::pinned::offered_tools(&self.release, &registry);
        let mut names: Vec<String> = if offered.is_empty() {
            registry.specs().into_iter().map(|s| s.name).collect()
        } else {
            offered.into_owned()
        };
        names
            .retain(|n| crate::pinned::tool_enabled(&self.release, n) && registry.get(n).is_some());
        names.sort();
        names.dedup();
        names
    }

    /// Validates a call and asks `policy` about it: the planner's facts for it. A tool the
    /// pinned release does not enable is rejected like an unknown one, whatever the model saw.
    pub(crate) fn assess(
        &self,
        call: &ToolCallId,
        name: &str,
        arguments: &Value,
        policy: &Policy,
    ) -> CallFacts {
        if !crate::pinned::tool_enabled(&self.release, name) || self.tools().get(name).is_none() {
            return CallFacts::Invalid {
                status: ToolCallStatus::Rejected,
                output: unknown_tool_text(name, &self.offered_names()),
            };
        }
        let req = ToolCallRequest {
            call_id: call.to_string(),
            name: name.to_owned(),
            arguments: arguments.clone(),
        };
        match self.tools().validate(&req) {
            Err(result) => CallFacts::Invalid {
                status: map_status(result.status),
                output: result.content,
            },
            Ok(v) => {
                let (decision, _) = self.tools().authorize(&v, &self.workspace, policy);
                CallFacts::Valid {
                    effect: v.effect,
                    parallel_safe: v.parallel_safe,
                    can_reconcile: self.tools().get(&v.name).is_some_and(|t| t.can_reconcile()),
                    verdict: match decision.verdict {
                        PolicyVerdict::Allow => Verdict::Allow,
                        PolicyVerdict::Ask => Verdict::Ask,
                        PolicyVerdict::Deny => Verdict::Deny {
                            reason: decision.reason,
                        },
                    },
                }
            }
        }
    }

    /// The policy frozen with step `step` (or the session's current one).
    pub(crate) fn policy_for(&self, j: &Journal, step: StepId) -> Result<Policy> {
        if let Some((s, p)) = lock(&self.step_policy).as_ref()
            && *s == step
        {
            return Ok(p.clone());
        }
        session_policy(&self.release, &self.config, j, &self.tools())
    }

    /// Facts for every open call of the active turn's last step (cached per call: the step's
    /// policy is frozen).
    pub(crate) fn call_facts_for(
        &self,
        j: &Journal,
    ) -> std::collections::BTreeMap<ToolCallId, CallFacts> {
        let s = &j.state;
        let mut out = std::collections::BTreeMap::new();
        let Some(step) = s
            .active_turn
            .and_then(|t| s.turns.get(&t))
            .and_then(|t| t.steps.last())
            .and_then(|st| s.steps.get(st))
        else {
            return out;
        };
        let mut cache = lock(&self.call_facts);
        let mut policy: Option<Policy> = None;
        for call in step
            .tool_calls
            .iter()
            .filter_map(|c| s.tool_calls.get(c))
            .filter(|c| !c.status.is_terminal())
        {
            if let Some(f) = cache.get(&call.id) {
                out.insert(call.id.clone(), f.clone());
                continue;
            }
            if policy.is_none() {
                match self.policy_for(j, step.id) {
                    Ok(p) => policy = Some(p),
                    Err(e) => {
                        tracing::warn!(session = %self.session, "the session policy: {e}");
                        return out;
                    }
                }
            }
            let Some(p) = policy.as_ref() else {
                return out;
            };
            let f = match j.exact_arguments(&call.id) {
                // Its hooks decide first; nothing is cached until they have.
                Some(_) if self.awaits_hook(call) => {
                    out.insert(call.id.clone(), CallFacts::AwaitingHook);
                    continue;
                }
                Some(args) => {
                    Self::with_hook_decision(call, self.assess(&call.id, &call.name, &args, p))
                }
                None => CallFacts::Invalid {
                    status: ToolCallStatus::Rejected,
                    output: SEALED_UNAVAILABLE.into(),
                },
            };
            cache.insert(call.id.clone(), f.clone());
            out.insert(call.id.clone(), f);
        }
        out
    }
}
