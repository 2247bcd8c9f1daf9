//! The `outcome_unknown` card: an effect whose worker lost its lease mid-dispatch is put to a
//! human, who retries it, marks it committed or marks it failed by a click; each decision is
//! journaled (`effect.decided`) with the signed-in principal.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::common::*;
use crate::on_both;

on_both!(an_unknown_effect_is_decided_by_clicks_and_journaled);

/// Runs a turn whose `shell` command is dispatched, then takes the lease from the live worker
/// (as if its process died: the store's fencing, as `keel-runtime`'s recovery tests do) and
/// releases it: the next claim finds the effect dispatched without an outcome and asks.
async fn unknown_effect(s: &TestServer, release: &str) -> String {
    let sid = s
        .session(
            release,
            json!({"permission_mode": "bypass", "sandbox": "off"}),
        )
        .await
        .body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s
        .post(
            &format!("/v1/sessions/{sid}/turns"),
            &s.operator,
            &json!({"input": "go"}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while events_of(s, &sid, "effect.dispatched").await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never dispatched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id: keel_core::SessionId = sid.parse().unwrap();
    let rec = s.store.get_session(s.tenant, id).await.unwrap();
    let holder = rec.lease.expect("a worker holds it").owner;
    let lease = s
        .store
        .take_over_lease(
            s.tenant,
            id,
            &holder,
            rec.lease_epoch,
            "test",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    s.store.release_lease(s.tenant, &lease).await.unwrap();
    s.wait_session(&sid, |b| b["status"] == "requires_action")
        .await;
    assert_eq!(events_of(s, &sid, "effect.outcome_unknown").await.len(), 1);
    sid
}

async fn an_unknown_effect_is_decided_by_clicks_and_journaled(b: Backend) {
    let s = start_with(b, |c| {
        c.scheduler.workers = 1;
        c.scheduler.poll_ms = 50;
        c.allow_sandbox_off = true;
        c.max_permission_mode = keel_tools::policy::PermissionMode::Bypass;
    })
    .await;
    let release = s
        .release(
            "effects",
            &[
                json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2; echo ran"}}]}),
                json!({"text": "done"}),
            ],
            &["shell"],
        )
        .await;
    let d = driver().await;
    let c = browser(&d).await;
    sign_in(&c, &s.base, &s.operator).await;
    for (button, decision) in [
        ("committed", "committed"),
        ("failed", "failed"),
        ("retry", "retry"),
    ] {
        let sid = unknown_effect(&s, &release).await;
        if button == "committed" {
            // The session page shows the call as outcome_unknown (the event names only the
            // operation key), its timeline bar stopped and drawn as waiting, not running.
            go(&c, &s.base, &format!("#/session/{sid}")).await;
            until(
                &c,
                "the call shown outcome_unknown",
                "document.querySelector('#timeline-svg .bar-tool.waiting') && !document.querySelector('#timeline-svg .bar-tool.running') && [...document.querySelectorAll('.status')].some((b) => b.textContent === 'outcome_unknown')",
            )
            .await;
        }
        // From another page, so the Decisions page is routed to afresh.
        go(&c, &s.base, "#/sessions").await;
        go(&c, &s.base, "#/decisions").await;
        let card = format!("#effects article.effect[data-operation-key] button.{button}");
        until(
            &c,
            "the unknown effect's card",
            &format!("document.querySelector('{card}') && document.querySelector('#effects article.effect').textContent.includes('shell')"),
        )
        .await;
        let args = eval(
            &c,
            "return document.querySelector('#effects article.effect .args').textContent",
        )
        .await;
        assert!(
            args.as_str().unwrap().contains("sleep 2; echo ran"),
            "{args}"
        );
        click(&c, &card).await;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let decided = loop {
            let d = events_of(&s, &sid, "effect.decided").await;
            if !d.is_empty() {
                break d;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{button}: never decided"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(decided.len(), 1, "{button}");
        assert!(
            decided[0]["principal_id"].is_string(),
            "{button}: journaled with the signed-in principal: {}",
            decided[0]
        );
        assert!(
            decided[0]["payload"].to_string().contains(decision),
            "{button}: {}",
            decided[0]
        );
        // The card goes; the turn ends (a retry runs the command again first).
        until(
            &c,
            "the card gone",
            "!document.querySelector('#effects article.effect')",
        )
        .await;
        let end = s.wait_session(&sid, |b| b["status"] == "idle").await;
        assert!(end["active_turn_id"].is_null(), "{button}: {end}");
    }
    c.close().await.unwrap();
}
