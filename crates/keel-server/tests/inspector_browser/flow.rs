//! The journey of one scripted session through the inspector (see the parent module).

use fantoccini::Locator;
use reqwest::StatusCode;
use serde_json::json;

use super::*;
use crate::common::*;
use crate::on_both;

on_both!(the_inspector_in_a_browser);

async fn the_inspector_in_a_browser(b: Backend) {
    let write = matches!(b, Backend::Sqlite);
    let s = start(b).await;
    let d = driver().await;
    // The model writes a file (a call that waits on a human), then answers slowly: its first
    // text arrives while the turn runs, and the turn finishes after the approval.
    let release = s
        .release(
            "writer",
            &[
                json!({"delay_ms": 400, "text": "I will write out.txt now.", "tool_calls": [call("write_file", json!({"path": "out.txt", "content": "hello\nworld\n"}))], "usage": {"input_tokens": 120, "output_tokens": 30}}),
                json!({"delay_ms": 1500, "text": "Wrote out.txt.", "usage": {"input_tokens": 160, "output_tokens": 8}}),
                json!({"delay_ms": 100, "text": "Nothing to do.", "usage": {"input_tokens": 10, "output_tokens": 3}}),
            ],
            &["write_file", "read_file"],
        )
        .await;
    let session = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = browser(&d).await;

    // Sign-in: a wrong key is a clear error on the page; the operator's key signs in.
    c.goto(&format!("{}/", s.base)).await.unwrap();
    let input = c
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css("#key"))
        .await
        .unwrap();
    screenshot(&c, write, "sign-in", "document.querySelector('#key')").await;
    // New-user review F4: signed out, the navigation and "Sign out" are not shown.
    let shown = eval(&c, "return [getComputedStyle(document.querySelector('#nav')).display, getComputedStyle(document.querySelector('#who')).display]").await;
    assert_eq!(shown, json!(["none", "none"]));
    input.send_keys("keel_not_a_key").await.unwrap();
    c.find(Locator::Css("#sign-in-button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let error = until(
        &c,
        "the wrong-key error",
        "document.querySelector('#sign-in-error').textContent",
    )
    .await;
    assert!(error.as_str().unwrap().contains("not valid"), "{error}");
    c.find(Locator::Css("#key"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    sign_in(&c, &s.base, &s.operator).await;
    let cookies = c.get_all_cookies().await.unwrap();
    let cookie = cookies
        .iter()
        .find(|k| k.name().starts_with("keel_inspector_"))
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    assert!(!cookie.value().contains(&s.operator[5..]));
    let stored = eval(
        &c,
        "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie",
    )
    .await;
    assert!(
        !stored.as_str().unwrap().contains("keel_"),
        "the key is kept nowhere in the page: {stored}"
    );

    // Attacker review F3: arguments are shown exactly: a bidi override or a zero-width space is
    // escaped, never removed, and a run of blanks is one marked escape.
    let exact = eval(&c, "const p = K.exactPre({path: 'invoice\\u202Egpj.exe', cmd: 'curl github.com\\u200B/x' + '\\u2800'.repeat(3)}); return [p.textContent, p.hidden_chars]").await;
    let shown = exact[0].as_str().unwrap();
    assert!(shown.contains("invoice⟨U+202E⟩gpj.exe"), "{shown}");
    assert!(shown.contains("github.com⟨U+200B⟩/x⟨U+2800 ×3⟩"), "{shown}");
    assert_eq!(exact[1], json!(5));
    // Attacker review F9: a malformed fragment or an Object.prototype name draws the list.
    for frag in ["#/session/%E0%A4%A", "#/__proto__", "#/constructor"] {
        eval(
            &c,
            &format!("document.querySelector('#main').replaceChildren(); location.hash = '{frag}'; return null"),
        )
        .await;
        until(
            &c,
            "a page drawn after a malformed fragment",
            "K.me && document.querySelector('#main h1')",
        )
        .await;
    }
    go(&c, &s.base, "#/sessions").await;

    // The session list shows the session.
    let row = format!("document.querySelector('tr[data-session-id=\"{session}\"]')");
    until(&c, "the session in the list", &row).await;

    // Its page: the turn runs, the model's text appears while it does (over SSE deltas).
    click(&c, &format!("tr[data-session-id=\"{session}\"] a")).await;
    until(&c, "the live stream", "document.querySelector('#live.on')").await;
    let turn = s
        .post(
            &format!("/v1/sessions/{session}/turns"),
            &s.operator,
            &json!({"input": "write out.txt"}),
        )
        .await;
    assert_eq!(turn.status, StatusCode::ACCEPTED, "{turn:?}");
    let turn_id = turn.body["turn_id"].as_str().unwrap().to_owned();
    until(
        &c,
        "the model's first text",
        "[...document.querySelectorAll('.model-text')].some((e) => e.textContent.includes('I will write out.txt now.'))",
    )
    .await;
    let t = s
        .get(
            &format!("/v1/sessions/{session}/turns/{turn_id}"),
            &s.viewer,
        )
        .await;
    assert!(
        t.body["duration_ms"].is_null(),
        "the turn still runs while its text shows: {t:?}"
    );
    let deltas = eval(
        &c,
        "return Number(document.querySelector('#conversation').dataset.deltas || 0)",
    )
    .await;
    assert!(
        deltas.as_u64().unwrap() >= 1,
        "text came as live deltas: {deltas}"
    );

    // The call waits on a human: the approval card shows the exact arguments and a diff.
    let card = until(
        &c,
        "the approval card",
        "document.querySelector('#session-decisions article.approval')",
    )
    .await;
    assert!(!card.is_null());
    let args = eval(
        &c,
        "return document.querySelector('#session-decisions article.approval .args').textContent",
    )
    .await;
    assert!(
        args.as_str().unwrap().contains("\"path\": \"out.txt\""),
        "{args}"
    );
    let diff = eval(&c, "return [...document.querySelectorAll('#session-decisions .diff .add')].map((e) => e.textContent).join('')").await;
    assert_eq!(diff, "+ hello\n+ world\n");
    screenshot(
        &c,
        write,
        "session-approval",
        "document.querySelector('article.approval')",
    )
    .await;

    // New-user review F1: the page redraws while the turn waits, yet a call folded by the
    // reader stays folded (the conversation is patched in place, not rebuilt every second).
    click(&c, "#conversation details.tool > summary").await;
    let folded = "return document.querySelector('#conversation details.tool').open";
    assert_eq!(eval(&c, folded).await, json!(false));
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(eval(&c, folded).await, json!(false), "still folded");

    // Decisions page, with the pending approval.
    go(&c, &s.base, "#/decisions").await;
    until(
        &c,
        "the pending approval",
        "document.querySelector('#approvals article.approval button.allow')",
    )
    .await;
    // New-user review F2/F3: a reason typed on the page survives another session's change, and
    // a session with a turn in progress is listed with its cancel button.
    let reason = "not now: write it to notes.txt instead";
    let typed_in = eval(
        &c,
        "return document.querySelector('#approvals article.approval').dataset.approvalId",
    )
    .await;
    let typed_in = typed_in.as_str().unwrap().to_owned();
    c.find(Locator::Css("#approvals article.approval textarea"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
    let other = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.post(
        &format!("/v1/sessions/{other}/turns"),
        &s.operator,
        &json!({"input": "write"}),
    )
    .await;
    until(
        &c,
        "the other session's approval and its turn in progress",
        &format!("document.querySelectorAll('#approvals article.approval').length === 2 && document.querySelector('#active-turns [data-session-id=\"{other}\"] button.cancel-turn')"),
    )
    .await;
    let kept = eval(
        &c,
        &format!("return document.querySelector('#approvals article.approval[data-approval-id=\"{typed_in}\"] textarea').value"),
    )
    .await;
    assert_eq!(kept, json!(reason), "the typed reason is still there");
    // The other session's turn ends (cancelled) so the rest of the test sees one waiting
    // session. Review item 5: the button asks first; "no" cancels nothing.
    let cancel = format!("#active-turns [data-session-id=\"{other}\"] button.cancel-turn");
    click(&c, &cancel).await;
    c.dismiss_alert().await.unwrap();
    let still = s.get(&format!("/v1/sessions/{other}"), &s.viewer).await;
    assert_eq!(still.body["status"], "requires_action", "{still:?}");
    assert!(
        events_of(&s, &other, "turn.cancel_requested")
            .await
            .is_empty()
    );
    click(&c, &cancel).await;
    c.accept_alert().await.unwrap();
    s.wait_session(&other, |b| {
        b["status"] != "requires_action" && b["status"] != "running"
    })
    .await;
    screenshot(
        &c,
        write,
        "decisions",
        "document.querySelector('#approvals article.approval')",
    )
    .await;

    // Approve by a click on the session page; the turn finishes.
    go(&c, &s.base, &format!("#/session/{session}")).await;
    click(&c, "#session-decisions button.allow").await;
    until(
        &c,
        "the turn's end",
        "[...document.querySelectorAll('.model-text')].some((e) => e.textContent.includes('Wrote out.txt.')) && document.querySelector('.msg.user .st-completed')",
    )
    .await;
    let done = s.wait_session(&session, |b| b["status"] == "idle").await;
    assert!(done["active_turn_id"].is_null());
    let decided = events_of(&s, &session, "approval.decided").await;
    assert_eq!(decided.len(), 1);
    assert!(
        decided[0]["principal_id"].is_string(),
        "journaled with the signed-in principal"
    );

    // The timeline: one bar per step and per tool call, as the journal has them.
    let state = s
        .get(&format!("/v1/sessions/{session}/state"), &s.viewer)
        .await
        .body;
    let steps: u64 = state["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["num_steps"].as_u64().unwrap())
        .sum();
    let calls = state["tool_calls"].as_array().unwrap().len() as u64;
    assert_eq!((steps, calls), (2, 1));
    let bars = until(
        &c,
        "the timeline's bars",
        &format!(
            "document.querySelectorAll('#timeline rect.bar-step').length === {steps} && document.querySelectorAll('#timeline rect.bar-tool').length === {calls} && [document.querySelectorAll('#timeline rect.bar-turn').length, document.querySelectorAll('#timeline rect.bar-step.ok').length, document.querySelectorAll('#timeline rect.bar-tool.ok').length]"
        ),
    )
    .await;
    assert_eq!(
        bars,
        json!([1, 2, 1]),
        "one turn; steps and call coloured ok"
    );
    // Review item 2: the wait on the approval is its own bar (and legend entry), apart from
    // the tool's run.
    let wait = eval(&c, "return [document.querySelectorAll('#timeline rect.bar.approval').length, [...document.querySelectorAll('#timeline .legend span')].map((e) => e.textContent).includes('approval wait')]").await;
    assert_eq!(wait, json!([1, true]), "one approval wait, in the legend");
    screenshot(
        &c,
        write,
        "session",
        "document.querySelector('#timeline rect.bar-step')",
    )
    .await;
    // Review item 2: on a phone the timeline is drawn 1:1 at its width (text keeps its size) with
    // each label on its own line above its bar, so no label is cut to a few characters.
    c.set_window_size(390, 844).await.unwrap();
    let phone = until(
        &c,
        "the narrow timeline",
        "document.querySelector('#timeline-svg.narrow') && (() => { const svg = document.querySelector('#timeline-svg'); const t = svg.querySelector('text.label-tool'); return [Math.round(svg.getBoundingClientRect().width) === Number(svg.getAttribute('width')), t.textContent, t.getBoundingClientRect().height >= 12, svg.querySelectorAll('rect.bar.approval').length]; })()",
    )
    .await;
    assert_eq!(phone, json!([true, "write_file", true, 1]), "{phone}");
    c.set_window_size(1280, 900).await.unwrap();
    // The timeline on its own (below the conversation on a phone: rows stack their labels).
    screenshot(
        &c,
        write,
        "session-timeline",
        "(document.querySelector('#timeline').scrollIntoView(), document.querySelector('#timeline rect.bar.approval'))",
    )
    .await;

    // Time travel: where the session came to require action the call awaits approval and the session
    // requires action; at the end it succeeded and the session is idle.
    let requested = events_of(&s, &session, "session.status_changed")
        .await
        .iter()
        .find(|e| e["payload"]["status"] == "requires_action")
        .expect("the session required action")["seq"]
        .as_u64()
        .unwrap();
    go(&c, &s.base, &format!("#/journal/{session}")).await;
    until(
        &c,
        "the journal",
        "document.querySelectorAll('#journal-body tr').length > 5",
    )
    .await;
    until(
        &c,
        "the state now",
        "document.querySelector('#state-status .st-idle')",
    )
    .await;
    let now = eval(
        &c,
        "return document.querySelector('#state-calls').textContent",
    )
    .await;
    assert!(now.as_str().unwrap().contains("succeeded"), "{now}");
    let at = c.find(Locator::Css("#at-seq")).await.unwrap();
    at.clear().await.unwrap();
    at.send_keys(&requested.to_string()).await.unwrap();
    click(&c, "#travel").await;
    until(
        &c,
        "the earlier state",
        &format!("document.querySelector('#state-seq').textContent === '{requested}'"),
    )
    .await;
    let then = eval(&c, "return [document.querySelector('#state-status').textContent, document.querySelector('#state-calls').textContent]").await;
    assert_eq!(then[0], "requires_action", "{then}");
    assert!(
        then[1].as_str().unwrap().contains("awaiting_approval"),
        "{then}"
    );
    // Review item 6: the slider travels too (to the first event: the session only created).
    eval(
        &c,
        "const r = document.querySelector('#at-seq-range'); r.value = '1'; r.dispatchEvent(new Event('input')); return null",
    )
    .await;
    until(
        &c,
        "the state at seq 1",
        "document.querySelector('#state-seq').textContent === '1'",
    )
    .await;
    let first = eval(&c, "return [document.querySelector('#at-seq').value, document.querySelector('#state-status').textContent]").await;
    assert_eq!(first[0], "1", "{first}");
    assert_ne!(first[1], "idle", "{first}");
    // The filters: by type, then by entity.
    c.find(Locator::Css("#journal-type"))
        .await
        .unwrap()
        .select_by_value("tool_call.finished")
        .await
        .unwrap();
    until(
        &c,
        "one filtered event",
        "document.querySelectorAll('#journal-body tr').length === 1",
    )
    .await;
    screenshot(
        &c,
        write,
        "journal",
        "document.querySelector('#state-at .card')",
    )
    .await;
    // Attack review: a link cannot add a type this journal never had, and `..` as the
    // session (which a URL resolves to another path: the tenant's events) names no session.
    go(
        &c,
        &s.base,
        &format!("#/journal/{session}?type=forged.type&entity=zzz"),
    )
    .await;
    until(
        &c,
        "the journal again",
        "document.querySelectorAll('#journal-type option').length > 3",
    )
    .await;
    let forged = eval(&c, "return [[...document.querySelectorAll('#journal-type option')].some((o) => o.value === 'forged.type'), document.querySelector('#journal-type').value]").await;
    assert_eq!(forged, json!([false, ""]), "{forged}");
    go(&c, &s.base, "#/journal/..").await;
    until(
        &c,
        "no such session",
        "document.querySelector('#journal-count').textContent.includes('No such session')",
    )
    .await;

    // Usage: the tenant's tokens by day as a chart, by model and by turn.
    go(&c, &s.base, "#/usage").await;
    until(&c, "the usage chart", "document.querySelectorAll('#chart-days rect').length >= 1 && document.querySelector('#usage-by-turn tbody tr')").await;
    // Review item 1: per day, per model and per turn are charted, each with a legend that names
    // its colours and titled axes; tokens or cost.
    let charts = "return ['#chart-days', '#chart-models', '#chart-turns'].map((id) => { const f = document.querySelector(id).closest('figure'); return [f.querySelectorAll('rect').length > 0, [...f.querySelectorAll('.chart-legend li')].map((l) => l.textContent), [...f.querySelectorAll('.axis-title')].map((t) => t.textContent)]; })";
    let drawn = eval(&c, charts).await;
    assert_eq!(drawn[0][0], true, "{drawn}");
    assert_eq!(drawn[0][2][0], "tokens", "{drawn}");
    assert_eq!(
        drawn[1][1],
        json!(["input tokens", "output tokens"]),
        "{drawn}"
    );
    assert_eq!(drawn[2][1], drawn[0][1], "turns and days by model: {drawn}");
    assert!(!drawn[2][1].as_array().unwrap().is_empty(), "{drawn}");
    let swatch = eval(&c, "const s = document.querySelector('#usage-models .chart-legend .swatch'); const r = s.getBoundingClientRect(); return [r.width, getComputedStyle(s).backgroundColor]").await;
    assert!(swatch[0].as_f64().unwrap() >= 10.0, "{swatch}");
    assert_ne!(
        swatch[1], "rgba(0, 0, 0, 0)",
        "a legend swatch has its colour: {swatch}"
    );
    screenshot(&c, write, "usage", "document.querySelector('#chart-days')").await;
    c.find(Locator::Css("#usage-metric"))
        .await
        .unwrap()
        .select_by_value("USD")
        .await
        .unwrap();
    // At 390 px the charts are drawn for that width (1:1: their text keeps its size).
    c.set_window_size(390, 844).await.unwrap();
    until(
        &c,
        "the charts drawn 1:1 on a phone",
        "[...document.querySelectorAll('.chart svg')].every((svg) => Number(svg.getAttribute('width')) < 390 && Math.round(svg.getBoundingClientRect().width) === Number(svg.getAttribute('width')))",
    )
    .await;
    c.set_window_size(1280, 900).await.unwrap();
    until(
        &c,
        "the charts in USD",
        "document.querySelector('#chart-turns').closest('figure').querySelector('.axis-title').textContent === 'USD'",
    )
    .await;

    go(&c, &s.base, "#/sessions").await;
    until(&c, "the session row", &row).await;
    let cells = eval(
        &c,
        // The cells as drawn at this width (the phone's stacked copies left out).
        &format!("return [...{row}.querySelectorAll('td')].map((td) => {{ const t = td.cloneNode(true); t.querySelectorAll('.show-narrow').forEach((n) => n.remove()); return t.textContent; }})"),
    )
    .await;
    assert_eq!(cells[1], "idle", "{cells}");
    assert_eq!(cells[2], "writer", "{cells}");
    assert_eq!(cells[5], "1", "turns: {cells}");
    assert_eq!(cells[6], "318", "tokens: {cells}");
    // Live: a session made now shows up in the open list without a reload, and its status
    // follows (it comes to wait on an approval).
    let waiting = s.session(&release, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.post(
        &format!("/v1/sessions/{waiting}/turns"),
        &s.operator,
        &json!({"input": "write"}),
    )
    .await;
    until(
        &c,
        "the new session, live",
        &format!("document.querySelector('tr[data-session-id=\"{waiting}\"] .st-requires_action')"),
    )
    .await;
    screenshot(&c, write, "sessions", &row).await;
    // The status filter and the id search.
    c.find(Locator::Css("#status-filter"))
        .await
        .unwrap()
        .select_by_value("requires_action")
        .await
        .unwrap();
    let shown = eval(&c, "return [...document.querySelectorAll('#sessions-body tr')].map((r) => r.dataset.sessionId)").await;
    assert_eq!(shown, json!([waiting]));
    c.find(Locator::Css("#status-filter"))
        .await
        .unwrap()
        .select_by_value("")
        .await
        .unwrap();
    c.find(Locator::Css("#search"))
        .await
        .unwrap()
        .send_keys(&session[session.len() - 6..])
        .await
        .unwrap();
    let shown = eval(&c, "return [...document.querySelectorAll('#sessions-body tr')].map((r) => r.dataset.sessionId)").await;
    assert_eq!(shown, json!([session]));
    // Review item 3: the first 8 characters shown in the list find it, and so does the whole
    // shortened form as shown (`abcd1234…wxyz`).
    let shown_rows = "return [...document.querySelectorAll('#sessions-body tr')].map((r) => r.dataset.sessionId)";
    for q in [
        session[..8].to_owned(),
        format!("{}…{}", &session[..8], &session[session.len() - 4..]),
    ] {
        let search = c.find(Locator::Css("#search")).await.unwrap();
        search.clear().await.unwrap();
        search.send_keys(&q).await.unwrap();
        let shown = eval(&c, shown_rows).await;
        assert!(
            shown.as_array().unwrap().contains(&json!(session)),
            "{q}: {shown}"
        );
    }

    // CSRF: the page's own POST with the cookie but without the token is refused; with the
    // token it goes through.
    let status = page_post(
        &c,
        &format!("/v1/sessions/{session}/turns"),
        &json!({"input": "again"}),
        false,
    )
    .await;
    assert_eq!(status, 403);
    let status = page_post(
        &c,
        &format!("/v1/sessions/{session}/turns"),
        &json!({"input": "again"}),
        true,
    )
    .await;
    assert_eq!(status, 202);

    // Sign-out ends the server-side session: the old cookie is refused from then on.
    let old = format!("{}={}", cookie.name(), cookie.value());
    click(&c, "#sign-out").await;
    until(&c, "the sign-in form", "document.querySelector('#key')").await;
    let r = s
        .call(
            "GET",
            "/v1/sessions",
            None,
            None,
            &[("cookie", old.as_str())],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{r:?}");
    c.close().await.unwrap();

    // A viewer: sees the session and a pending approval, but no decision buttons, and its POSTs
    // (with a valid CSRF token) are refused.
    let v = browser(&d).await;
    sign_in(&v, &s.base, &s.viewer).await;
    go(&v, &s.base, &format!("#/session/{waiting}")).await;
    until(
        &v,
        "the approval card",
        "document.querySelector('#session-decisions article.approval')",
    )
    .await;
    let buttons = eval(&v, "return document.querySelectorAll('button.allow, button.deny, button.allow-session, button.cancel-turn, button.retry').length").await;
    assert_eq!(buttons, 0);
    go(&v, &s.base, "#/decisions").await;
    until(&v, "the read-only decisions", "document.querySelector('#read-only') && document.querySelector('#approvals article.approval')").await;
    assert_eq!(
        eval(
            &v,
            "return document.querySelectorAll('#main button.allow, #main button.deny').length"
        )
        .await,
        0
    );
    let approval = s
        .get(
            &format!("/v1/sessions/{waiting}/approvals?status=pending"),
            &s.viewer,
        )
        .await
        .body["items"][0]
        .clone();
    let status = page_post(
        &v,
        &format!(
            "/v1/approvals/{}/decision",
            approval["approval_id"].as_str().unwrap()
        ),
        &json!({"decision": "allow_once", "args_hash": approval["args_hash"]}),
        true,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(
        page_post(
            &v,
            &format!("/v1/sessions/{waiting}/cancel"),
            &json!({}),
            true
        )
        .await,
        403
    );
    v.close().await.unwrap();

    // Another tenant's key sees nothing of this tenant.
    let o = browser(&d).await;
    sign_in(&o, &s.base, &s.other).await;
    until(
        &o,
        "an empty list",
        "document.querySelector('#sessions-count').textContent === '0 of 0 sessions'",
    )
    .await;
    go(&o, &s.base, &format!("#/session/{session}")).await;
    until(
        &o,
        "no such session",
        "document.querySelector('#session-error')",
    )
    .await;
    go(&o, &s.base, "#/decisions").await;
    until(
        &o,
        "no approvals",
        "document.querySelector('#approvals p.muted')",
    )
    .await;
    assert_eq!(
        eval(
            &o,
            "return document.querySelectorAll('article.approval').length"
        )
        .await,
        0
    );
    o.close().await.unwrap();
}
