//! The node's workers and admission control over HTTP: beyond the queue depths new turns get
//! 429 with `Retry-After` and nothing accepted is dropped; a tenant with one turn is served
//! within a round of a tenant with a thousand; the tenant's and the worker's limits bound the
//! sessions running at once. (`/readyz` during a drain: `keel`'s `workers::drain` tests.)

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

/// A release of the other tenant (`globex`) on a script, and a session of it in its own
/// workspace (workspaces are claimed per tenant).
async fn other_session(s: &TestServer, lines: &[Value]) -> String {
    let path = s.root.path().join("globex.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    let r = s
        .post(
            "/v1/releases",
            &s.other,
            &json!({"name": "g", "model_route": [format!("script:{}", path.display())],
                    "instructions": "You are a test agent.", "tools": ["shell"]}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let release = r.body["release_id"].as_str().unwrap().to_owned();
    let ws = s.root.path().join("ws-globex");
    std::fs::create_dir_all(&ws).unwrap();
    let r = s
        .post(
            "/v1/sessions",
            &s.other,
            &json!({"release_id": release, "workspace": ws.display().to_string(), "settings": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r.body["session_id"].as_str().unwrap().to_owned()
}

async fn submit(s: &TestServer, key: &str, session: &str, input: &str) -> Res {
    s.post(
        &format!("/v1/sessions/{session}/turns"),
        key,
        &json!({"input": input}),
    )
    .await
}

/// Submits a turn to the other tenant's session `light` and waits until it starts, failing
/// when that takes 2 s or more (a correctness bound with a wide margin); `behind` says what it
/// waited behind, for the failure message. Returns when the turn was submitted.
async fn light_turn_starts_within_2s(s: &TestServer, light: &str, behind: &str) -> Instant {
    let sent = Instant::now();
    let r = submit(s, &s.other, light, "light").await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    loop {
        let events = s
            .get(&format!("/v1/sessions/{light}/events"), &s.other)
            .await
            .body;
        if events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "turn.started")
        {
            return sent;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "the light tenant's turn did not start within 2 s {behind}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts `session` has `n` queued turns; returns its state.
async fn queued(s: &TestServer, session: &str, n: usize) -> Value {
    let state = s
        .get(&format!("/v1/sessions/{session}/state"), &s.viewer)
        .await
        .body;
    assert_eq!(
        state["queued_turn_ids"].as_array().unwrap().len(),
        n,
        "{state}"
    );
    state
}

async fn admission_refuses_turns_beyond_the_queue_depths_and_drops_nothing(b: Backend) {
    // No worker: whatever is accepted stays queued.
    let s = start_with(b, |c| {
        c.scheduler.workers = 0;
        c.scheduler.tenant_max_queued_turns = 2;
        c.scheduler.max_queued_turns = 3;
    })
    .await;
    let release = s.release("done", &[json!({"text": "ok"})], &[]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..2 {
        let r = submit(&s, &s.operator, &session, &format!("turn {i}")).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    }
    let r = submit(&s, &s.operator, &session, "one too many").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.body["limit"], "tenant_max_queued_turns", "{r:?}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // The other tenant is under its own limit but the service is full at 3.
    let theirs = other_session(&s, &[json!({"text": "ok"})]).await;
    let r = submit(&s, &s.other, &theirs, "first").await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let r = submit(&s, &s.other, &theirs, "second").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.body["limit"], "max_queued_turns", "{r:?}");
    assert!(r.header("retry-after").is_some());
    // Nothing accepted was dropped, nothing refused was written.
    assert_turns(&s, &session, 2, 2).await;
    // Each 429 counted by the limit that refused it; the queues as the store has them.
    let m = crate::metrics::scrape(&s).await;
    assert_eq!(
        m.get("keel_admission_rejections_total{scope=\"tenant\"}"),
        1.0
    );
    assert_eq!(
        m.get("keel_admission_rejections_total{scope=\"overall\"}"),
        1.0
    );
    assert_eq!(
        m.get(&format!("keel_queue_depth{{tenant=\"{}\"}}", s.tenant)),
        2.0
    );
    assert_eq!(
        m.get(&format!(
            "keel_queue_depth{{tenant=\"{}\"}}",
            s.other_tenant
        )),
        1.0
    );
}

/// Asserts that `session` holds `turns` turns, `queued` of them queued.
async fn assert_turns(s: &TestServer, session: &str, turns: usize, queued: usize) {
    let state = s
        .get(&format!("/v1/sessions/{session}/state"), &s.viewer)
        .await
        .body;
    assert_eq!(
        state["queued_turn_ids"].as_array().unwrap().len(),
        queued,
        "{state}"
    );
    assert_eq!(state["turns"].as_array().unwrap().len(), turns, "{state}");
}

/// The light tenant's turn starts within 2 s (a correctness bound, with a wide margin: one
/// round of deficit round robin is one claim) although the heavy tenant queued 1,000 turns
/// first, each in its own session, on one worker running two sessions at once.
async fn a_light_tenant_is_not_starved_by_a_heavy_one(b: Backend) {
    let s = start_with(b, |c| {
        c.scheduler.workers = 1;
        c.scheduler.concurrency = 2;
        c.scheduler.tenant_max_queued_turns = 10_000;
    })
    .await;
    // Each heavy turn holds its slot a moment (a slow model), so the backlog builds up.
    let release = s
        .release("heavy", &[json!({"delay_ms": 300, "text": "done"})], &[])
        .await;
    let filling = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let sessions = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let s = std::sync::Arc::new(s);
    for i in 0..1000 {
        let (s, release, permit) = (
            s.clone(),
            release.clone(),
            sessions.clone().acquire_owned().await.unwrap(),
        );
        tasks.spawn(async move {
            let _permit = permit;
            let r = s.session(&release, json!({})).await;
            assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
            let id = r.body["session_id"].as_str().unwrap().to_owned();
            let r = submit(&s, &s.operator, &id, &format!("heavy {i}")).await;
            assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let (mine, _) = s.store.queue_depth(s.tenant).await.unwrap();
    assert!(
        mine > 100,
        "the heavy backlog drained before the light turn came ({mine} queued): the test proves nothing"
    );
    let light = other_session(&s, &[json!({"text": "light"})]).await;
    let sent = light_turn_starts_within_2s(&s, &light, "behind the heavy backlog").await;
    eprintln!(
        "fairness ({b:?}): the light turn started {} ms after submit, {} heavy turns still queued; the backlog took {} ms to queue",
        sent.elapsed().as_millis(),
        s.store.queue_depth(s.tenant).await.unwrap().0,
        (sent - filling).as_millis()
    );
}

/// A worker node (`keel worker`) leaves a session written by a newer event schema alone and
/// shows how many there are as `keel_sessions_left_for_newer_schema` on its `/metrics` (README,
/// Workers: "Mixed versions").
async fn a_worker_counts_the_sessions_it_leaves_for_newer_schemas_in_its_metrics(b: Backend) {
    // An API-only node: the turn waits for a worker.
    let s = start_with(b, |c| c.scheduler.workers = 0).await;
    let release = s.release("newer", &[json!({"text": "ran"})], &[]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = submit(&s, &s.operator, &session, "for a newer worker").await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    s.db.raw(&format!(
        "UPDATE sessions SET schema_version = {} WHERE session_id = '{session}'",
        keel_core::event::SCHEMA_VERSION + 1
    ))
    .await;
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = metrics.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(keel_server::run_worker_node(
        s.config.clone(),
        deps(s.store.clone(), s.runtime_options.clone()),
        1,
        Some(metrics),
        async move {
            let _ = stopped.await;
        },
        std::future::pending(),
    ));
    let started = Instant::now();
    let text = loop {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("\nkeel_sessions_left_for_newer_schema 1\n") {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the worker's metrics never counted the newer session:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        text.contains("# TYPE keel_sessions_left_for_newer_schema gauge"),
        "{text}"
    );
    stop.send(()).unwrap();
    node.await.unwrap().unwrap();
    // Left alone: the turn is still queued, nothing ran.
    assert_turns(&s, &session, 1, 1).await;
}

/// The claim's lease and its heartbeats use the same `[scheduler] lease_ttl_ms`: with a short
/// one (1 s, the smallest allowed) a worker running a three-second command keeps the session —
/// the other worker, polling every 50 ms, never takes a live lease over, and the holder's fence
/// never takes its own renewed lease for lapsed — so the command's effect is committed once,
/// never made `outcome_unknown`.
async fn a_short_lease_is_renewed_in_time_and_never_taken_from_a_live_worker(b: Backend) {
    let s = start_with(b, |c| {
        c.scheduler.workers = 2;
        c.scheduler.lease_ttl_ms = keel_server::config::limits::MIN_LEASE_TTL_MS;
        c.scheduler.poll_ms = 50;
        c.allow_sandbox_off = true;
        c.max_permission_mode = keel_tools::policy::PermissionMode::Bypass;
    })
    .await;
    let release = s
        .release(
            "slow",
            &[
                json!({"tool_calls": [{"name": "shell", "arguments": {"command": "echo run >> runs.txt; sleep 3"}}]}),
                json!({"text": "done"}),
            ],
            &["shell"],
        )
        .await;
    let session = s
        .session(
            &release,
            json!({"permission_mode": "bypass", "sandbox": "off"}),
        )
        .await
        .body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = submit(&s, &s.operator, &session, "go").await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let end = s
        .wait_session(&session, |b| {
            b["status"] == "idle" || b["status"] == "requires_action"
        })
        .await;
    let events = s
        .get(
            &format!("/v1/sessions/{session}/events?limit=1000"),
            &s.viewer,
        )
        .await
        .body;
    let types: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(end["status"], "idle", "{end} {types:?}");
    assert!(!types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert_eq!(
        types.iter().filter(|t| **t == "effect.committed").count(),
        1,
        "{types:?}"
    );
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("runs.txt")).unwrap(),
        "run\n"
    );
}

/// Admission holds under concurrent submits: 40 turns sent at once to 40 sessions of a tenant
/// allowed 5 queued turns — at most 5 (at least 1) are accepted, the rest get 429, and exactly
/// the accepted are queued (a check of the depth followed by a write once let every request
/// that read the depth before the others wrote pass). A full service says it is full without
/// telling one tenant how many turns the others queued.
async fn concurrent_submits_never_queue_beyond_the_limit(b: Backend) {
    let s = std::sync::Arc::new(
        start_with(b, |c| {
            c.scheduler.workers = 0;
            c.scheduler.tenant_max_queued_turns = 5;
            c.scheduler.max_queued_turns = 5;
        })
        .await,
    );
    let release = s.release("idle", &[json!({"text": "ok"})], &[]).await;
    let mut sessions = Vec::new();
    for _ in 0..40 {
        let r = s.session(&release, json!({})).await;
        sessions.push(r.body["session_id"].as_str().unwrap().to_owned());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (s, session) = (s.clone(), sessions[i % sessions.len()].clone());
        tasks.spawn(async move { submit(&s, &s.operator, &session, &format!("turn {i}")).await });
    }
    let (mut accepted, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        match r.status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}: {r:?}"),
        }
    }
    let (mine, all) = s.store.queue_depth(s.tenant).await.unwrap();
    // Never past the limit; the first of the burst always in. A turn written while its
    // submission is still finishing counts twice for a moment, so a burst may be refused a
    // little early (never late): between 1 and 5 accepted, and exactly those queued.
    assert!((1..=5).contains(&accepted), "{accepted} accepted");
    assert_eq!((refused, mine, all), (40 - accepted, accepted, accepted));
    // The other tenant meets the full service: it learns that, not the queue of acme.
    let theirs = other_session(&s, &[json!({"text": "ok"})]).await;
    let r = submit(&s, &s.other, &theirs, "one").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.body["limit"], "max_queued_turns", "{r:?}");
    let detail = r.body["detail"].as_str().unwrap();
    assert!(!detail.contains('5'), "{detail}");
}

/// Turns sent at once to one session are all queued, in some order: none is refused because
/// the session's short lease changed hands between the API's attempt and its look at the
/// holder (a 409 "lease … changed during acquisition").
async fn concurrent_submits_to_one_session_are_all_queued(b: Backend) {
    let s = std::sync::Arc::new(
        start_with(b, |c| {
            c.scheduler.workers = 0;
        })
        .await,
    );
    let release = s.release("idle", &[json!({"text": "ok"})], &[]).await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let (s, session) = (s.clone(), session.clone());
        tasks.spawn(async move { submit(&s, &s.operator, &session, &format!("turn {i}")).await });
    }
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    }
    queued(&s, &session, 30).await;
}

/// Turns that hold a slot for long do not starve another tenant: while the heavy tenant's two
/// sessions run a hundred-step turn each on the only worker's two slots (about 20 s), the light
/// tenant's turn starts within 2 s — one heavy run gives its slot back at its next step
/// boundary (its turn continues later, here or on another worker), and deficit round robin
/// gives the slot to the light tenant. Both heavy turns still complete, every step once.
async fn a_light_tenant_is_served_while_a_heavy_one_holds_every_slot(b: Backend) {
    let s = start_with(b, |c| {
        c.scheduler.workers = 1;
        c.scheduler.concurrency = 2;
        c.scheduler.poll_ms = 100;
    })
    .await;
    let step = json!({"delay_ms": 200, "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]});
    let mut lines = vec![step; 100];
    lines.push(json!({"text": "heavy done"}));
    let release = s.release("heavy", &lines, &["read_file"]).await;
    let mut heavy = Vec::new();
    for _ in 0..2 {
        let id = s.session(&release, json!({})).await.body["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = submit(&s, &s.operator, &id, "heavy").await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
        heavy.push(id);
    }
    // Both heavy turns run: every slot is taken.
    for id in &heavy {
        s.wait_session(id, |b| b["status"] == "running").await;
    }
    let light = other_session(&s, &[json!({"text": "light"})]).await;
    let sent = light_turn_starts_within_2s(&s, &light, "while the heavy one held every slot").await;
    eprintln!(
        "slots ({b:?}): the light turn started {} ms after submit",
        sent.elapsed().as_millis()
    );
    for id in &heavy {
        let end = s.wait_session(id, |b| b["status"] == "idle").await;
        let turns = s
            .get(&format!("/v1/sessions/{id}/turns"), &s.viewer)
            .await
            .body;
        let turn = &turns["items"][0];
        assert_eq!(turn["status"], "completed", "{end} {turn}");
        assert_eq!(turn["num_steps"], 101, "{turn}");
        assert_eq!(turn["final_text"], "heavy done", "{turn}");
    }
}

/// An approval TTL as long as the API accepts (`approval_ttl_ms = i64::MAX`, the schema's
/// `int64` maximum; one more is refused, naming the field) reaches past the last time an
/// approval can expire at: the expiry saturates there instead of overflowing in the run (which
/// would panic it), the session waits on the human, and the decision resumes it.
async fn the_longest_approval_ttl_waits_on_a_human(b: Backend) {
    let s = start(b).await;
    let release = s
        .release(
            "patient",
            &[
                json!({"tool_calls": [call("write_file", json!({"path": "out.txt", "content": "hi\n"}))]}),
                json!({"text": "wrote it"}),
            ],
            &["write_file"],
        )
        .await;
    for ttl in [1 << 63, u64::MAX] {
        let refused = s.session(&release, json!({"approval_ttl_ms": ttl})).await;
        assert_eq!(
            refused.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{refused:?}"
        );
        assert_eq!(refused.body["field"], "settings.approval_ttl_ms");
    }
    for ttl in [u64::try_from(i64::MAX).unwrap()] {
        let created = s.session(&release, json!({"approval_ttl_ms": ttl})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        let session = created.body["session_id"].as_str().unwrap().to_owned();
        let _ = std::fs::remove_file(s.workspace.join("out.txt"));
        let r = submit(&s, &s.operator, &session, "write out.txt").await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
        let waiting = s
            .wait_session(&session, |b| b["status"] == "requires_action")
            .await;
        let approvals = s
            .get(&format!("/v1/sessions/{session}/approvals"), &s.viewer)
            .await
            .body;
        let a = &approvals["items"][0];
        assert_eq!(a["status"], "pending", "{waiting} {approvals}");
        assert_eq!(a["expires_at"], "9999-12-31T23:59:59.999Z", "{a}");
        let decided = s
            .post(
                &format!(
                    "/v1/approvals/{}/decision",
                    a["approval_id"].as_str().unwrap()
                ),
                &s.operator,
                &json!({"decision": "allow_once", "args_hash": a["args_hash"]}),
            )
            .await;
        assert_eq!(decided.status, StatusCode::OK, "{decided:?}");
        let end = s.wait_session(&session, |b| b["status"] == "idle").await;
        let turns = s
            .get(&format!("/v1/sessions/{session}/turns"), &s.viewer)
            .await
            .body;
        assert_eq!(turns["items"][0]["status"], "completed", "{end} {turns}");
        assert_eq!(
            std::fs::read_to_string(s.workspace.join("out.txt")).unwrap(),
            "hi\n"
        );
    }
}

/// How many of `sessions`' turns ran at once at most, read from their journals: a turn runs
/// from its `turn.started` to its `turn.finished` under its session's lease.
async fn most_at_once(s: &TestServer, sessions: &[String]) -> usize {
    let mut spans = Vec::new();
    for id in sessions {
        let events = s
            .get(&format!("/v1/sessions/{id}/events?limit=1000"), &s.viewer)
            .await
            .body;
        let ts = |ty: &str| {
            let e = events["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["type"] == ty)
                .unwrap_or_else(|| panic!("no {ty} in {events}"));
            chrono::DateTime::parse_from_rfc3339(e["ts"].as_str().unwrap()).unwrap()
        };
        spans.push((ts("turn.started"), ts("turn.finished")));
    }
    spans
        .iter()
        .map(|(at, _)| spans.iter().filter(|(a, z)| a <= at && at < z).count())
        .max()
        .unwrap_or(0)
}

/// `[scheduler] tenant_max_sessions` and a worker's `concurrency` bound the sessions running
/// at once: six sessions whose turns each take 800 ms, queued together on the node's one
/// worker, run two at a time — with the tenant's limit at 2 (and 8 slots), then with the
/// worker's slots at 2 (and a tenant limit of 8) — and every turn completes.
async fn sessions_run_at_once_up_to_the_tenant_and_worker_limits(b: Backend) {
    for (max_sessions, concurrency) in [(2, 8), (8, 2)] {
        let s = start_with(b, |c| {
            c.scheduler.workers = 1;
            c.scheduler.concurrency = concurrency;
            c.scheduler.tenant_max_sessions = max_sessions;
        })
        .await;
        let release = s
            .release("slow", &[json!({"delay_ms": 800, "text": "done"})], &[])
            .await;
        let mut sessions = Vec::new();
        for _ in 0..6 {
            let r = s.session(&release, json!({})).await;
            sessions.push(r.body["session_id"].as_str().unwrap().to_owned());
        }
        for id in &sessions {
            let r = submit(&s, &s.operator, id, "slow").await;
            assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
        }
        for id in &sessions {
            s.wait_session(id, |b| b["status"] == "idle").await;
            let turns = s.get(&format!("/v1/sessions/{id}/turns"), &s.viewer).await;
            assert_eq!(turns.body["items"][0]["status"], "completed", "{turns:?}");
        }
        let most = most_at_once(&s, &sessions).await;
        assert!(
            most <= 2,
            "{most} sessions ran at once (tenant_max_sessions {max_sessions}, concurrency {concurrency})"
        );
        assert_eq!(
            most, 2,
            "six 800 ms turns queued together never ran two at once: the test proves nothing"
        );
    }
}

on_both!(
    the_longest_approval_ttl_waits_on_a_human,
    admission_refuses_turns_beyond_the_queue_depths_and_drops_nothing,
    a_light_tenant_is_not_starved_by_a_heavy_one,
    a_short_lease_is_renewed_in_time_and_never_taken_from_a_live_worker,
    concurrent_submits_never_queue_beyond_the_limit,
    concurrent_submits_to_one_session_are_all_queued,
    a_worker_counts_the_sessions_it_leaves_for_newer_schemas_in_its_metrics,
    a_light_tenant_is_served_while_a_heavy_one_holds_every_slot,
    sessions_run_at_once_up_to_the_tenant_and_worker_limits,
);
