//! A tool's `prepare` (the probe recorded before a side effect) and `reconcile` (the check
//! after a crash) run under the call's time limit and the turn's cancellation, like the call
//! (issue 10, review item A: a probe that hung on a FIFO defeated `--timeout` and
//! `--tool-timeout`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_core::{Budget, EventBody, TerminalReason, ToolCallId, ToolCallStatus};
use keel_runtime::{Runtime, RuntimeOptions, SessionConfig};
use keel_tools::tool::{EffectClass, ReconcileOutcome, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_hung_probe_is_stopped_by_the_tool_time_limit_and_the_call_gets_a_result,
    a_hung_probe_is_stopped_by_the_turn_time_limit,
    a_hung_probe_is_stopped_by_cancelling_the_turn,
    a_hung_reconcile_is_stopped_by_the_tool_time_limit_and_a_human_decides,
);

/// How long a test may take before it counts as hung: 10x and more over the limits it sets.
const HUNG: Duration = Duration::from_secs(30);

/// A side-effecting tool whose `prepare` never returns; its call would write `ran.txt`.
struct HungProbe;

#[async_trait]
impl Tool for HungProbe {
    fn name(&self) -> &str {
        "hung_probe"
    }
    fn description(&self) -> &str {
        "Writes ran.txt after a probe that never ends."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    async fn prepare(&self, _args: &Value, _ctx: &ToolContext) -> Option<Value> {
        std::future::pending::<()>().await;
        None
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> ToolOutput {
        std::fs::write(ctx.workspace.root().join("ran.txt"), "ran").unwrap();
        ToolOutput::success("ran")
    }
}

/// A side-effecting tool that runs until cancelled (its outcome then unknown) and whose
/// reconcile never answers.
struct HungReconcile;

#[async_trait]
impl Tool for HungReconcile {
    fn name(&self) -> &str {
        "hung_reconcile"
    }
    fn description(&self) -> &str {
        "Works until stopped; its check never ends."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::SideEffecting
    }
    fn can_reconcile(&self) -> bool {
        true
    }
    async fn reconcile_call(
        &self,
        _key: &str,
        _arguments: &Value,
        _probe: Option<&Value>,
        _ctx: &ToolContext,
    ) -> ReconcileOutcome {
        std::future::pending::<()>().await;
        ReconcileOutcome::Unknown
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> ToolOutput {
        ctx.cancel.cancelled().await;
        ToolOutput::cancelled("stopped")
    }
}

async fn hung_fixture(
    b: Backend,
    tool: &str,
    tune: impl FnOnce(&mut SessionConfig),
) -> (Fixture, ToolCallId) {
    let db = db(b).await;
    let mut tools = registry();
    tools.register(Arc::new(HungProbe)).unwrap();
    tools.register(Arc::new(HungReconcile)).unwrap();
    let lines = [
        json!({"tool_calls": [{"id": "call_hung", "name": tool, "arguments": {}}]}),
        json!({"text": "done"}),
    ];
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&lines),
        tools,
        RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let mut cfg = config(ws.path());
    tune(&mut cfg);
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    (
        Fixture {
            db,
            rt,
            tenant,
            session,
            ws,
        },
        ToolCallId::from("call_hung"),
    )
}

/// The call's one result, and whether an effect was ever dispatched for it.
async fn result_of(f: &Fixture, call: &ToolCallId) -> (ToolCallStatus, String, bool) {
    let evs = f.events().await;
    let dispatched = evs.iter().any(|e| e.type_name() == "effect.dispatched");
    let finished: Vec<(ToolCallStatus, String)> = evs
        .iter()
        .filter(|e| e.correlation.tool_call_id.as_ref() == Some(call))
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "one result: {finished:?}");
    let (status, output) = finished.into_iter().next().unwrap();
    (status, output, dispatched)
}

/// `--tool-timeout 300ms` and a probe that never ends: the call fails "timed out" without
/// running (no effect dispatched, `ran.txt` never written), and the turn goes on to its answer.
async fn a_hung_probe_is_stopped_by_the_tool_time_limit_and_the_call_gets_a_result(b: Backend) {
    let (f, call) = hung_fixture(b, "hung_probe", |c| c.tool_timeout_ms = Some(300)).await;
    let out = tokio::time::timeout(HUNG, f.rt.run(f.tenant, f.session))
        .await
        .expect("the run ends although the probe hangs")
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let (status, output, dispatched) = result_of(&f, &call).await;
    assert_eq!(status, ToolCallStatus::Failed, "{output}");
    assert!(output.contains("timed out after 300 ms"), "{output}");
    assert!(!dispatched, "nothing was dispatched");
    assert!(!f.ws.path().join("ran.txt").exists());
}

/// `--timeout 500ms` (no tool limit): the turn's wall clock stops the probe; the turn ends
/// `failed` (timed out) with the call's result.
async fn a_hung_probe_is_stopped_by_the_turn_time_limit(b: Backend) {
    let (f, call) = hung_fixture(b, "hung_probe", |c| c.turn_timeout_ms = Some(500)).await;
    let out = tokio::time::timeout(HUNG, f.rt.run(f.tenant, f.session))
        .await
        .expect("the turn's time limit ends it although the probe hangs")
        .unwrap();
    let t = &out.turns[0];
    assert_eq!(t.terminal_reason, TerminalReason::Failed, "{t:?}");
    assert!(
        t.error.as_deref().unwrap_or("").contains("timed out"),
        "{t:?}"
    );
    let (status, _, dispatched) = result_of(&f, &call).await;
    assert_eq!(status, ToolCallStatus::Cancelled);
    assert!(!dispatched);
    assert!(!f.ws.path().join("ran.txt").exists());
}

/// `cancel_turn` while the probe hangs: the turn ends `aborted`, the call cancelled unrun.
async fn a_hung_probe_is_stopped_by_cancelling_the_turn(b: Backend) {
    let (f, call) = hung_fixture(b, "hung_probe", |_| {}).await;
    let run = {
        let (rt, t, s) = (f.rt.clone(), f.tenant, f.session);
        tokio::spawn(async move { rt.run(t, s).await })
    };
    wait_for_event(&f.db.store, f.tenant, f.session, "turn.started").await;
    // The step's proposal is staged with the probe; cancel once the call is being prepared.
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let out = tokio::time::timeout(HUNG, run)
        .await
        .expect("cancelling ends the turn although the probe hangs")
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    let (status, _, dispatched) = result_of(&f, &call).await;
    assert_eq!(status, ToolCallStatus::Cancelled);
    assert!(!dispatched);
}

/// A worker dies while a side-effecting call runs (its effect `dispatched`); the next worker
/// finds the effect `outcome_unknown` and asks the tool to reconcile, but the check never
/// answers. Under `--tool-timeout 300ms` it is given up and a human decides (`requires_action`)
/// instead of the run hanging.
async fn a_hung_reconcile_is_stopped_by_the_tool_time_limit_and_a_human_decides(b: Backend) {
    let (f, call) = hung_fixture(b, "hung_reconcile", |c| c.tool_timeout_ms = Some(300)).await;
    // The first worker, in a runtime of its own, dies once the call runs.
    let (die, died) = tokio::sync::oneshot::channel::<()>();
    let (location, tenant, session) = (f.db.location.clone(), f.tenant, f.session);
    let worker = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let store = keel_store::open(&location).await.unwrap();
            let mut tools = registry();
            tools.register(Arc::new(HungReconcile)).unwrap();
            let lines = [
                json!({"tool_calls": [{"id": "call_hung", "name": "hung_reconcile", "arguments": {}}]}),
            ];
            let w = Runtime::new(
                store,
                scripted(&lines),
                tools,
                RuntimeOptions {
                    worker_name: "dying".into(),
                    lease_ttl: Duration::from_secs(2),
                    ..RuntimeOptions::default()
                },
            );
            tokio::select! {
                _ = w.run(tenant, session) => panic!("the call runs until the worker dies"),
                _ = died => {}
            }
        });
        // Everything of the worker stops here (its heartbeat too): a crash.
        rt.shutdown_background();
    });
    wait_for_event(&f.db.store, f.tenant, f.session, "tool_call.started").await;
    die.send(()).unwrap();
    worker.join().unwrap();
    let out = tokio::time::timeout(HUNG, f.rt.run(f.tenant, f.session))
        .await
        .expect("the run ends although the reconcile hangs")
        .unwrap();
    assert_eq!(
        out.status,
        keel_core::SessionStatus::RequiresAction,
        "{out:?}"
    );
    assert!(
        matches!(&out.pending[..], [keel_runtime::PendingAction::Effect { tool_call_id, .. }] if *tool_call_id == call),
        "{:?}",
        out.pending
    );
}
