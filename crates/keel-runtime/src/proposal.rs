//! A proposed call whose arguments are complete: its id made safe and unique in the session,
//! its arguments checked for depth, `tool_call.proposed` staged, and a read-only, parallel-safe,
//! allowed call started at once while the model still streams (the sampling phase calls
//! [`Runner::proposed`] for each call as its arguments end).

use std::collections::HashSet;
use std::sync::Arc;

use keel_core::plan::{CallFacts, Verdict};
use keel_core::{
    Correlation, EffectClass, EventBody, StateMachine, StepId, ToolCallId, ToolCallStatus, TurnId,
};
use serde_json::Value;

use crate::background::{finished_item, lock};
use crate::context::ContextSnapshot;
use crate::driver::Runner;
use crate::error::Result;

/// The deepest nesting of arrays and objects a tool call's arguments may have (the arguments
/// object itself is level 1). A deeper call is invalid: never run, its result tells the model
/// why. The journal's events must read back through serde_json's limit of 128 levels, and an
/// event wraps the arguments in two more (the event, its payload): a model sending arguments
/// 126 deep over HTTP (the OpenAI wires carry them as a string, parsed on their own) made a
/// `tool_call.proposed` the store refused, and the turn could then never be journaled as
/// finished.
pub const MAX_ARGUMENT_DEPTH: usize = 64;

/// How deeply `v` nests arrays and objects: 0 for a scalar, 1 for `{}` or `[1]`.
fn json_depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 1)];
    while let Some((v, depth)) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, depth + 1))),
            Value::Object(o) => stack.extend(o.values().map(|c| (c, depth + 1))),
            _ => continue,
        }
        deepest = deepest.max(depth);
    }
    deepest
}

impl Runner {
    /// A call whose arguments are complete: journal it, and start it at once if it is read-only,
    /// parallel-safe and allowed by the step's snapshot.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn proposed(
        self: Arc<Self>,
        turn: TurnId,
        step: StepId,
        attempt: u32,
        id: String,
        name: String,
        arguments: Value,
        invalid: Option<keel_model::InvalidArguments>,
        snapshot: &ContextSnapshot,
        seen: &HashSet<ToolCallId>,
    ) -> Result<ToolCallId> {
        // A call id is stored as it is (correlation columns, approval rows): one the model made
        // up with a secret in it gets a plain one instead (the transcript uses it both ways).
        let id = if self.redactor.redact_str(&id) == id {
            id
        } else {
            // Deterministic (a re-sampled attempt proposing the same id maps to the same one)
            // and distinct per original id.
            let h = keel_core::canonical::bytes_hash(id.as_bytes());
            format!(
                "call_redacted_{}",
                h.trim_start_matches("sha256:").get(..16).unwrap_or("")
            )
        };
        let (arguments, invalid) = match invalid {
            None if json_depth(&arguments) > MAX_ARGUMENT_DEPTH => (
                // Kept as text, as a call whose arguments did not parse is.
                Value::String(arguments.to_string()),
                Some(keel_model::InvalidArguments::Malformed {
                    error: format!("nested deeper than {MAX_ARGUMENT_DEPTH} levels"),
                }),
            ),
            invalid => (arguments, invalid),
        };
        let call = ToolCallId::from(id.as_str());
        let existing = self
            .read(|j| {
                j.state.tool_calls.get(&call).map(|c| {
                    (
                        c.step_id,
                        c.name.clone(),
                        j.exact_arguments(&call).unwrap_or(Value::Null),
                        c.status,
                    )
                })
            })
            .await;
        let call = match existing {
            // The same call proposed again by a re-sampled attempt of the same step: reuse it.
            // (The same id, name and arguments twice in one response are two calls: the second
            // gets a fresh id below and runs in its place in the model's order.)
            Some((s, n, a, _))
                if s == step && n == name && a == arguments && !seen.contains(&call) =>
            {
                return Ok(call);
            }
            // Another call has this id (an earlier step, a model reusing ids): a fresh one that
            // no call of the session has.
            Some(_) => {
                self.read(|j| {
                    (1u32..)
                        .map(|n| match n {
                            1 => format!("{id}_a{attempt}"),
                            n => format!("{id}_a{attempt}_{n}"),
                        })
                        .map(ToolCallId::from)
                        .find(|c| !j.state.tool_calls.contains_key(c))
                        .unwrap_or(call)
                })
                .await
            }
            None => call,
        };
        let corr = Correlation::tool_call(turn, step, call.clone()).with_attempt(attempt);
        let mut items = vec![(
            corr.clone(),
            EventBody::ToolCallProposed {
                name: name.clone(),
                arguments: arguments.clone(),
                sealed: false,
            },
        )];
        if let Some(inv) = invalid {
            items.push((corr.clone(), EventBody::ToolCallValidating {}));
            items.push(finished_item(
                turn,
                step,
                &call,
                ToolCallStatus::Failed,
                inv.result_message(),
                true,
            ));
            self.stage(items).await?;
            return Ok(call);
        }
        self.stage(items).await?;
        if self.hooks_gate(&name) {
            // Its pre_tool_use hooks decide first (the planner runs them).
            return Ok(call);
        }
        let facts = self.assess(&call, &name, &arguments, &snapshot.policy);
        // A read-only call starts while the model still streams, unless a tool-call budget is
        // set (then the planner decides which calls fit) or an earlier call of the step that is
        // not parallel-safe is still open (a read proposed after a write must see it: the
        // planner runs it once the write has its result).
        let limits = self.limits();
        let counted = limits.turn_budget.max_tool_calls.is_some()
            || limits.session_budget.max_tool_calls.is_some();
        if let CallFacts::Valid {
            effect: EffectClass::ReadOnly,
            parallel_safe: true,
            verdict: Verdict::Allow,
            ..
        } = facts
            && !counted
            && !self.behind_a_sequential_call(step, &call).await
        {
            self.spawn_call(turn, step, call.clone());
        }
        lock(&self.call_facts).insert(call.clone(), facts);
        Ok(call)
    }

    /// Whether a call of `step` proposed before `call` that is not parallel-safe
    /// ([`keel_core::plan::is_parallel`]) has no result yet.
    async fn behind_a_sequential_call(&self, step: StepId, call: &ToolCallId) -> bool {
        let open: Vec<ToolCallId> = self
            .read(|j| {
                j.state
                    .steps
                    .get(&step)
                    .map(|s| {
                        s.tool_calls
                            .iter()
                            .take_while(|c| *c != call)
                            .filter(|c| {
                                j.state
                                    .tool_calls
                                    .get(*c)
                                    .is_some_and(|t| !t.status.is_terminal())
                            })
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .await;
        let facts = lock(&self.call_facts);
        open.iter()
            .any(|c| !keel_core::plan::is_parallel(facts.get(c)))
    }
}
