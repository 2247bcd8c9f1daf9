//! **cancellation_race.** Invariant: wherever a cancellation lands — while the model streams,
//! between a call's proposal and its approval, while a side-effecting tool runs, or at the
//! instant the turn completes — every turn, step and tool call ends in exactly one terminal
//! state (one `turn.finished`; one `step.completed` or `step.failed`; one `tool_call.finished`,
//! so every call has exactly one result; an effect and an approval are decided at most once),
//! the session is left idle (nothing stuck), and no
//! effect is dispatched after the cancellation was acknowledged: every real dispatch of the
//! side-effecting test tool happened before `Runtime::cancel_turn` returned, was journaled
//! (`effect.dispatched`) before it happened, and no `effect.dispatched` follows
//! `turn.cancel_requested` in the journal (an effect committed is one that really ran).
//!
//! Guarded mechanism: the cancel check before dispatch (the planner answers a turn whose
//! cancellation is journaled by finishing it, never by running a call; the intent handler
//! journals the cancellation and cancels the turn's token under the journal lock) and the
//! fold's write-once terminal states.
//!
//! 200 randomized timings per backend in all (50 per phase; `KEEL_CANCEL_TRIALS=N` runs N per
//! phase), seeded: the seed is printed with every failure and `KEEL_CANCEL_SEED=S` repeats it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::{ApprovalDecision, ApprovalStatus, Budget, EventBody, SessionStatus, TenantId};
use keel_model::ModelClient;
use keel_runtime::{Runtime, RuntimeError, RuntimeOptions};
use keel_testkit::db::{Backend, TestDb};
use keel_testkit::{FakeModelServer, FakeResponse, Handler, Pacing, Reply};
use keel_tools::policy::PermissionMode;
use serde_json::json;

use super::rig::{
    Dispatches, Rng, call, config, decided_more_than_once, journal, not_ended_exactly_once,
    registry, release, runtime, scripted, seed_from_env,
};

per_backend!(
    cancel_during_streaming,
    cancel_between_proposal_and_approval,
    cancel_during_a_tool_run,
    cancel_at_the_instant_of_completion,
);

/// Trials per phase: `KEEL_CANCEL_TRIALS`, default 50 (four phases: 200 per backend).
fn trials() -> u64 {
    std::env::var("KEEL_CANCEL_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50)
}

/// Trials run side by side (each its own session on the phase's store and runtime).
const AT_ONCE: u64 = 4;

#[derive(Clone, Copy, Debug)]
enum Phase {
    Streaming,
    Approval,
    ToolRun,
    Completion,
}

/// One phase's store, runtime and what the effect tool recorded.
struct Bench {
    db: TestDb,
    rt: Runtime,
    log: Dispatches,
    tenant: TenantId,
    ws: tempfile::TempDir,
    phase: Phase,
    /// Kept alive while the model is used (the streaming phase's fake provider).
    _server: Option<FakeModelServer>,
}

async fn bench(
    b: Backend,
    phase: Phase,
    model: Arc<dyn ModelClient>,
    server: Option<FakeModelServer>,
) -> Bench {
    let db = TestDb::new(b).await;
    let log = Dispatches::default();
    let rt = runtime(
        db.store.clone(),
        model,
        registry(&log),
        RuntimeOptions::default(),
    );
    Bench {
        db,
        rt,
        log,
        tenant: TenantId::new(),
        ws: tempfile::tempdir().unwrap(),
        phase,
        _server: server,
    }
}

/// What one trial saw: how the cancellation was answered and when.
#[derive(Debug)]
struct Outcome {
    /// `Runtime::cancel_turn` returned `Ok` at this instant (the acknowledgement).
    acked: Option<Instant>,
    /// It answered that no turn was active (the turn had already ended).
    too_late: bool,
}

/// Runs `n` trials of `bench`'s phase with delays from `delays` (µs, drawn per trial), checks
/// each, and fails listing every violated trial with the seed. A batch whose cancellations all
/// came after the turn ended halves the delays of the next: the machine runs faster than when
/// the delays were calibrated (CI of 2026-12-06: calibrated at 114 ms among other tests, the
/// trials' turns then took under 57 ms, and none of 50 landed).
async fn run_trials(bench: Arc<Bench>, mut delays: (u64, u64)) {
    let n = trials();
    let seed = seed_from_env("KEEL_CANCEL_SEED");
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    let (mut acked, mut late) = (0, 0);
    let mut i = 0;
    while i < n {
        let mut batch = tokio::task::JoinSet::new();
        for k in i..(i + AT_ONCE).min(n) {
            let delay = Duration::from_micros(rng.range(delays.0, delays.1));
            let extra = Duration::from_micros(rng.range(0, 10_000));
            let bench = bench.clone();
            batch.spawn(async move { (k, delay, trial(&bench, delay, extra).await) });
        }
        let (mut batch_acked, mut batch_late) = (0, 0);
        while let Some(r) = batch.join_next().await {
            let (k, delay, r) = r.unwrap();
            match r {
                Ok(o) => {
                    batch_acked += u32::from(o.acked.is_some());
                    batch_late += u32::from(o.too_late);
                }
                Err(e) => failures.push(format!("trial {k} (cancel after {delay:?}): {e}")),
            }
        }
        if batch_acked == 0 && batch_late > 0 {
            delays = (delays.0 / 2, delays.1 / 2);
        }
        acked += batch_acked;
        late += batch_late;
        i += AT_ONCE;
    }
    eprintln!(
        "cancellation_race {:?} ({:?}): {n} trials, seed {seed}: {acked} cancellations acknowledged, {late} after the turn ended",
        bench.phase, bench.db.backend
    );
    assert!(
        failures.is_empty(),
        "seed {seed} (KEEL_CANCEL_SEED={seed} repeats it), {} of {n} trials broke the invariant:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        acked > 0,
        "seed {seed}: no cancellation of {n} landed while the turn ran: the phase proves nothing"
    );
}

/// One session: submit, run, cancel after `delay` (the approval phase also allows the call
/// after `extra` once it is asked), run what is left, then check the journal.
async fn trial(bench: &Bench, delay: Duration, extra: Duration) -> Result<Outcome, String> {
    let (rt, tenant) = (&bench.rt, bench.tenant);
    let mut cfg = config(bench.ws.path());
    if matches!(bench.phase, Phase::Approval) {
        cfg.permission_mode = PermissionMode::Default;
    }
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), cfg)
        .await
        .map_err(|e| format!("create: {e}"))?;
    rt.submit(tenant, session, "go")
        .await
        .map_err(|e| format!("submit: {e}"))?;
    let runner = {
        let rt = rt.clone();
        let approve = matches!(bench.phase, Phase::Approval);
        tokio::spawn(async move {
            let out = rt.run(tenant, session).await?;
            if approve && out.status == SessionStatus::RequiresAction {
                tokio::time::sleep(extra).await;
                let view = rt.view(tenant, session).await?;
                for a in view.state.approvals.values() {
                    if a.status == ApprovalStatus::Pending {
                        // Refused when the cancellation came first: that is the race.
                        let _ = rt
                            .decide_approval(
                                tenant,
                                a.id,
                                ApprovalDecision::AllowOnce,
                                &a.args_hash,
                            )
                            .await;
                    }
                }
                rt.run(tenant, session).await?;
            }
            Ok::<_, RuntimeError>(())
        })
    };
    tokio::time::sleep(delay).await;
    let cancelled = rt.cancel_turn(tenant, session).await;
    let ack = Instant::now();
    let outcome = match cancelled {
        Ok(_) => Outcome {
            acked: Some(ack),
            too_late: false,
        },
        Err(RuntimeError::NoActiveTurn { .. }) => Outcome {
            acked: None,
            too_late: true,
        },
        // The run took the session's lease back from the short lease the cancellation held
        // (or the other way round): not acknowledged, the race goes on.
        Err(RuntimeError::LeaseLost { .. }) => Outcome {
            acked: None,
            too_late: false,
        },
        Err(e) => return Err(format!("cancel_turn: {e}")),
    };
    tokio::time::timeout(Duration::from_secs(30), runner)
        .await
        .map_err(|_| "the run did not end within 30 s".to_owned())?
        .unwrap()
        .or_else(|e| match e {
            // The cancellation's short lease took the session from the starting run: the
            // final run below finishes whatever is left.
            RuntimeError::LeaseLost { .. } => Ok(()),
            e => Err(format!("run: {e}")),
        })?;
    // Whatever is left (an allowed call whose run the cancellation raced) runs to its end.
    let out = rt
        .run(tenant, session)
        .await
        .map_err(|e| format!("final run: {e}"))?;
    // Nothing left open: idle, or still `created` when the cancellation ended the turn before
    // it started (the session never ran).
    if !matches!(out.status, SessionStatus::Idle | SessionStatus::Created) {
        return Err(format!("the session is left {:?}", out.status));
    }
    let state = rt
        .view(tenant, session)
        .await
        .map_err(|e| format!("view: {e}"))?
        .state;
    if state.active_turn.is_some() || !state.queue.is_empty() {
        return Err(format!(
            "a turn is left open: active {:?}, queued {:?}",
            state.active_turn, state.queue
        ));
    }
    let events = journal(&bench.db, tenant, session).await;
    let mut problems = not_ended_exactly_once(&events);
    problems.extend(decided_more_than_once(&events));
    let cancel_seq = events
        .iter()
        .find(|e| matches!(e.body, EventBody::TurnCancelRequested { .. }))
        .map(|e| e.seq);
    let dispatched: Vec<u64> = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::EffectDispatched {}))
        .map(|e| e.seq)
        .collect();
    if let Some(c) = cancel_seq {
        for d in dispatched.iter().filter(|d| **d > c) {
            problems.push(format!(
                "effect.dispatched at seq {d} after turn.cancel_requested at {c}"
            ));
        }
    }
    // Every real dispatch was journaled first. (A journaled one may never reach the tool: the
    // cancellation came between its commit and the tool's start — it is then `outcome_unknown`,
    // as a call stopped mid-flight, never `committed`.)
    let real = bench.log.of(session);
    if real.len() > dispatched.len() {
        problems.push(format!(
            "{} real dispatches, {} journaled: {real:?}",
            real.len(),
            dispatched.len()
        ));
    }
    let committed = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::EffectCommitted { .. }))
        .count();
    if committed > real.len() {
        problems.push(format!(
            "{committed} effects committed, {} really dispatched",
            real.len()
        ));
    }
    if let Some(ack) = outcome.acked {
        for d in real.iter().filter(|d| d.at > ack) {
            problems.push(format!(
                "{} was dispatched {:?} after the cancellation was acknowledged",
                d.call,
                d.at - ack
            ));
        }
        if cancel_seq.is_none() && !ended_before_cancel(&events) {
            problems.push(
                "acknowledged, but no turn.cancel_requested and the turn did not end first".into(),
            );
        }
    }
    let finished: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnFinished {
                terminal_reason, ..
            } => Some(terminal_reason.as_str()),
            _ => None,
        })
        .collect();
    let expected = if cancel_seq.is_some() {
        "aborted"
    } else {
        "completed"
    };
    if finished != [expected] {
        problems.push(format!(
            "the turn ended {finished:?}, expected [{expected:?}]"
        ));
    }
    if problems.is_empty() {
        Ok(outcome)
    } else {
        let types: Vec<String> = events
            .iter()
            .map(|e| format!("{} {}", e.seq, e.type_name()))
            .collect();
        Err(format!(
            "session {session}: {}\n  journal: {}",
            problems.join("; "),
            types.join(", ")
        ))
    }
}

/// The turn finished (completed) with no cancellation journaled: a cancellation acknowledged
/// after that found it ended.
fn ended_before_cancel(events: &[keel_core::Event]) -> bool {
    events
        .iter()
        .any(|e| matches!(e.body, EventBody::TurnFinished { .. }))
}

/// The side-effecting call every phase's model proposes (`ms`: how long the effect takes).
fn effect_line(ms: u64) -> serde_json::Value {
    json!({"text": "Working on it.", "tool_calls": [call("effect", json!({"ms": ms}))]})
}

/// While the model streams: a paced provider (Anthropic wire, ~1 frame per ms) streams 40
/// words and then the effect call; the answer after its result is short. Cancellations land
/// before the first token, mid-text, while the call streams, while it runs, or after.
async fn cancel_during_streaming(b: Backend) {
    let words = "word ".repeat(40);
    let handler: Handler = Arc::new(move |req| {
        if req.body.to_string().contains("tool_result") {
            Reply::Respond(FakeResponse::text("Done."))
        } else {
            Reply::Respond(FakeResponse::text(words.clone()).with_tool_call(
                "toolu_1",
                "effect",
                r#"{"ms": 10}"#,
            ))
        }
    });
    let server = FakeModelServer::start(
        handler,
        Pacing {
            time_to_first_token_ms: 5,
            tokens_per_second: Some(1000.0),
        },
    )
    .await
    .unwrap();
    let model = keel_model::HttpModel::new(
        keel_model::Wire::Anthropic,
        keel_model::ProviderConfig::new("claude-test")
            .with_base_url(server.anthropic_base_url())
            .with_api_key("k"),
    )
    .unwrap();
    let bench = bench(b, Phase::Streaming, Arc::new(model), Some(server)).await;
    run_trials(Arc::new(bench), (0, 90_000)).await;
}

/// Between proposal and approval: the effect call asks a human; the run stops on it, an
/// approval (`AllowOnce`) comes 0-10 ms after the question and the run goes on, while the
/// cancellation lands anywhere from before the proposal to after the effect.
async fn cancel_between_proposal_and_approval(b: Backend) {
    let model = scripted(&[effect_line(5), json!({"text": "Done."})]);
    let bench = bench(b, Phase::Approval, model, None).await;
    run_trials(Arc::new(bench), (0, 40_000)).await;
}

/// During a tool run: the effect takes 30 ms; the cancellation lands before it is dispatched,
/// while it runs, or after.
async fn cancel_during_a_tool_run(b: Backend) {
    let model = scripted(&[effect_line(30), json!({"text": "Done."})]);
    let bench = bench(b, Phase::ToolRun, model, None).await;
    run_trials(Arc::new(bench), (0, 60_000)).await;
}

/// At the instant of completion: a quick effect and a short answer; the delays are spread
/// around the measured time from submit to the end of an uncancelled run (calibrated on this
/// machine and backend first), so cancellations land just before, at and just after the
/// turn's `turn.finished`.
async fn cancel_at_the_instant_of_completion(b: Backend) {
    let model = scripted(&[effect_line(0), json!({"text": "Done."})]);
    let bench = Arc::new(bench(b, Phase::Completion, model, None).await);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let session = bench
            .rt
            .create_session(
                bench.tenant,
                &release(&[], Budget::default()),
                config(bench.ws.path()),
            )
            .await
            .unwrap();
        let start = Instant::now();
        bench.rt.submit(bench.tenant, session, "go").await.unwrap();
        bench.rt.run(bench.tenant, session).await.unwrap();
        runs.push(start.elapsed());
    }
    runs.sort();
    let typical = u64::try_from(runs[1].as_micros()).unwrap();
    eprintln!("cancellation_race completion ({b:?}): an uncancelled run takes {typical} µs");
    run_trials(bench, (typical / 2, typical * 3 / 2)).await;
}
