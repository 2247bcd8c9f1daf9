//! In-process fixtures of the scenarios: a runtime over a fresh store of either backend
//! ([`keel_testkit::db::TestDb`]), a seeded random source, and a side-effecting test tool that
//! records when each of its effects was dispatched. The release, session settings and scripted
//! model are [`super::harness`]'s (re-exported here for the scenarios that use this rig).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_core::{Budget, Event, EventBody, Release, SessionId};
use keel_model::ModelClient;
use keel_runtime::{Runtime, RuntimeOptions};
use keel_store::Store;
use keel_testkit::db::TestDb;
use keel_tools::ToolRegistry;
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

pub(crate) use super::harness::{config, scripted};

/// A release named `tester` on the scripted route with `tools` (empty: every registered tool)
/// and `budget` ([`super::harness::release_with`]).
pub(crate) fn release(tools: &[&str], budget: Budget) -> Release {
    super::harness::release_with("tester", tools, budget)
}

/// The built-in tools plus [`EffectTool`] writing to `log` and [`WaitTool`].
pub(crate) fn registry(log: &Dispatches) -> ToolRegistry {
    let mut r = ToolRegistry::with_builtins().unwrap();
    r.register(Arc::new(EffectTool { log: log.clone() }))
        .unwrap();
    r.register(Arc::new(WaitTool)).unwrap();
    r
}

/// A runtime over `store` sampling `model`, with `tools` and short leases (a test's waits stay
/// short), the rest of the options from `base`.
pub(crate) fn runtime(
    store: Arc<dyn Store>,
    model: Arc<dyn ModelClient>,
    tools: ToolRegistry,
    base: RuntimeOptions,
) -> Runtime {
    let base = RuntimeOptions {
        cancel_grace_ms: 2_000,
        ..base
    };
    Runtime::new(
        store,
        model,
        tools,
        super::harness::options(Duration::from_secs(5), Duration::from_secs(6), base),
    )
}

/// Decides the one approval `session` waits on `allow_once`, with the hash it was asked with;
/// returns it as it was asked.
pub(crate) async fn allow_the_approval(
    rt: &Runtime,
    tenant: keel_core::TenantId,
    session: SessionId,
) -> keel_core::state::ApprovalState {
    let approval = rt
        .view(tenant, session)
        .await
        .unwrap()
        .state
        .approvals
        .values()
        .next()
        .cloned()
        .unwrap();
    rt.decide_approval(
        tenant,
        approval.id,
        keel_core::ApprovalDecision::AllowOnce,
        &approval.args_hash,
    )
    .await
    .unwrap();
    approval
}

/// The journal of `session`.
pub(crate) async fn journal(
    db: &TestDb,
    tenant: keel_core::TenantId,
    session: SessionId,
) -> Vec<Event> {
    db.store.read(tenant, session, 1, None).await.unwrap()
}

/// Each terminal event of the turns, steps and tool calls of `events`, counted per entity:
/// the entities whose count is not exactly one (`"turn T: 0"`, `"call C: 2"`). Empty when every
/// turn, step and call that appears ended exactly once.
pub(crate) fn not_ended_exactly_once(events: &[Event]) -> Vec<String> {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for e in events {
        let c = &e.correlation;
        match &e.body {
            EventBody::TurnQueued { .. } => {
                counts
                    .entry(format!("turn {}", c.turn_id.unwrap()))
                    .or_default();
            }
            EventBody::TurnFinished { .. } => {
                *counts
                    .entry(format!("turn {}", c.turn_id.unwrap()))
                    .or_default() += 1;
            }
            EventBody::StepStarted { .. } => {
                counts
                    .entry(format!("step {}", c.step_id.unwrap()))
                    .or_default();
            }
            EventBody::StepCompleted { .. } | EventBody::StepFailed { .. } => {
                *counts
                    .entry(format!("step {}", c.step_id.unwrap()))
                    .or_default() += 1;
            }
            EventBody::ToolCallProposed { .. } => {
                counts
                    .entry(format!("call {}", c.tool_call_id.clone().unwrap()))
                    .or_default();
            }
            EventBody::ToolCallFinished { .. } => {
                *counts
                    .entry(format!("call {}", c.tool_call_id.clone().unwrap()))
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n != 1)
        .map(|(k, n)| format!("{k}: {n}"))
        .collect()
}

/// The effects and approvals of `events` that reached a terminal state more than once
/// (`effect.committed`/`effect.failed` per operation key; `approval.decided`/`approval.expired`
/// per approval): `"effect K: 2"`. Empty when none did.
pub(crate) fn decided_more_than_once(events: &[Event]) -> Vec<String> {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for e in events {
        let c = &e.correlation;
        let key = match &e.body {
            EventBody::EffectCommitted { .. } | EventBody::EffectFailed { .. } => {
                format!("effect {}", c.operation_key.clone().unwrap())
            }
            EventBody::ApprovalDecided { .. } | EventBody::ApprovalExpired {} => {
                format!("approval {}", c.approval_id.unwrap())
            }
            _ => continue,
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, n)| format!("{k}: {n}"))
        .collect()
}

/// A seeded pseudo-random source (SplitMix64): a failing trial's seed reproduces its timings.
pub(crate) struct Rng(u64);

impl Rng {
    /// The source for `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next_u64() % (hi - lo)
        }
    }
}

/// A seed from `var` when set (decimal), else from the clock; printed by the caller.
pub(crate) fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| {
                    u64::try_from(d.as_nanos() % u128::from(u64::MAX)).unwrap()
                })
        })
}

/// One real dispatch of [`EffectTool`]: the session and call, and when its effect started.
#[derive(Clone, Debug)]
pub(crate) struct Dispatch {
    pub(crate) session: SessionId,
    pub(crate) call: String,
    pub(crate) at: Instant,
}

/// Every dispatch of [`EffectTool`], shared by the tool and the test.
#[derive(Clone, Default)]
pub(crate) struct Dispatches(Arc<Mutex<Vec<Dispatch>>>);

impl Dispatches {
    /// The dispatches of `session`.
    pub(crate) fn of(&self, session: SessionId) -> Vec<Dispatch> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.session == session)
            .cloned()
            .collect()
    }
}

/// `effect {ms}`: a side-effecting tool whose effect is recorded (session, call, instant) the
/// moment it is dispatched, then takes `ms` (stopping when cancelled).
pub(crate) struct EffectTool {
    log: Dispatches,
}

#[async_trait]
impl Tool for EffectTool {
    fn name(&self) -> &str {
        "effect"
    }
    fn description(&self) -> &str {
        "Performs an external side effect."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let session = ctx.scope.as_ref().map(|s| s.session_id).unwrap();
        self.log.0.lock().unwrap().push(Dispatch {
            session,
            call: ctx.call_id.clone(),
            at: Instant::now(),
        });
        let ms = args["ms"].as_u64().unwrap_or(0);
        tokio::select! {
            () = ctx.cancel.cancelled() => ToolOutput::cancelled("the effect was stopped"),
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::success("effect done"),
        }
    }
}

/// A tool call line of a script.
pub(crate) fn call(name: &str, args: Value) -> Value {
    json!({"name": name, "arguments": args})
}

/// `wait {ms}`: a read-only tool that takes `ms` (stopping early when cancelled).
pub(crate) struct WaitTool;

#[async_trait]
impl Tool for WaitTool {
    fn name(&self) -> &str {
        "wait"
    }
    fn description(&self) -> &str {
        "Waits."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"], "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let ms = args["ms"].as_u64().unwrap_or(0);
        tokio::select! {
            () = ctx.cancel.cancelled() => ToolOutput::cancelled("the wait was cancelled"),
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::success(format!("waited {ms} ms")),
        }
    }
}
