//! A turn cancelled while its call waits on an approval: the Decisions page, still showing the
//! card, clicks Allow and is told why it cannot be decided (the API's 409 message), and the card
//! goes; the sessions list says the session is idle because its last turn was cancelled, and on
//! a phone shows the model and tokens under the release and the cost. The focused heading has
//! no ring; the journal filters by the short id shown, keeps its filter and seq in the URL across
//! a reload, says when a seq is out of range, dates its times and names the principal; the
//! conversation says the call waited for approval and did not run.

use serde_json::json;

use super::*;
use crate::common::*;
use crate::on_both;

on_both!(a_late_allow_on_a_cancelled_turn_is_refused_with_the_reason);

async fn a_late_allow_on_a_cancelled_turn_is_refused_with_the_reason(b: Backend) {
    let s = start(b).await;
    let sid = s.awaiting_approval("late.txt").await;

    let d = driver().await;
    let c = browser(&d).await;
    // An admin: the journal can name the tenant's principals (the cancel below is olga's).
    sign_in(&c, &s.base, &s.admin).await;
    go(&c, &s.base, "#/decisions").await;
    until(
        &c,
        "the approval's card",
        "document.querySelector('#approvals article.approval button.allow')",
    )
    .await;
    // A card left on the screen (a tab whose live stream dropped): the card itself, with its
    // buttons, is held apart from the list the page redraws, so the click below is the late one.
    eval(
        &c,
        "const a = document.querySelector('#approvals article.approval'); a.id = 'stale-card'; document.querySelector('#main').appendChild(a); return true",
    )
    .await;
    let allow = "#stale-card button.allow";
    // Cancelled elsewhere (the CLI, another tab) while the card is on the screen.
    let r = s
        .post(
            &format!("/v1/sessions/{sid}/cancel"),
            &s.operator,
            &json!({}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    s.wait_session(&sid, |b| b["status"] == "idle").await;
    click(&c, allow).await;
    let toast = until(
        &c,
        "the refusal's reason",
        "document.querySelector('#toast').textContent.includes('can no longer be decided') && document.querySelector('#toast').textContent",
    )
    .await;
    assert!(
        toast.as_str().unwrap().contains("turn ended (aborted)"),
        "{toast}"
    );
    assert!(!toast.as_str().unwrap().starts_with("Decided"), "{toast}");
    until(
        &c,
        "the withdrawn card gone",
        "!document.querySelector('#approvals article.approval')",
    )
    .await;
    assert!(!s.workspace.join("late.txt").exists(), "the call ran");

    // The conversation: the call waited on a human and never ran, and says both apart.
    go(&c, &s.base, &format!("#/session/{sid}")).await;
    let took = until(
        &c,
        "the call's times",
        "document.querySelector('details.tool summary .took') && document.querySelector('details.tool summary .took').textContent",
    )
    .await;
    let took = took.as_str().unwrap();
    assert!(
        took.contains("did not run") && took.contains("for approval"),
        "{took}"
    );

    go(&c, &s.base, "#/sessions").await;
    let row = format!("#sessions-body tr[data-session-id='{sid}']");
    let status = until(
        &c,
        "the last turn's outcome",
        &format!("document.querySelector(\"{row} .status-cell\").textContent"),
    )
    .await;
    assert_eq!(status, json!("idle · last turn cancelled"));
    // On a phone: model and tokens stacked in the columns that stay.
    c.set_window_size(390, 844).await.unwrap();
    let stacked = until(
        &c,
        "the model and tokens on a phone",
        &format!(
            "[...document.querySelectorAll(\"{row} .show-narrow\")].filter((e) => e.offsetParent !== null).map((e) => e.textContent).join(' | ')"
        ),
    )
    .await;
    let stacked = stacked.as_str().unwrap();
    assert!(stacked.contains("script:"), "{stacked}");
    assert!(stacked.contains(" tok"), "{stacked}");
    c.set_window_size(1280, 900).await.unwrap();

    // The heading took the focus on the page change, drawn without a ring.
    let ring = eval(
        &c,
        "const h = document.querySelector('#main h1'); return document.activeElement === h && getComputedStyle(h).outlineStyle",
    )
    .await;
    assert_eq!(ring, json!("none"), "a focus ring on the heading");

    // The journal: the short id shown on the page filters; the filter and the seq travelled to
    // are in the URL and survive a reload; a seq past the end says so; times carry the date.
    go(&c, &s.base, &format!("#/journal/{sid}")).await;
    until(
        &c,
        "the events",
        "document.querySelectorAll('#journal-body tr').length > 3",
    )
    .await;
    let by = until(
        &c,
        "who cancelled, by name",
        "[...document.querySelectorAll('#journal-body .entity-principal_id')].map((e) => e.textContent).join(',')",
    )
    .await;
    // olga (the operator's key) submitted the turn and cancelled it; the page names her.
    assert!(
        by.as_str()
            .unwrap()
            .split(',')
            .all(|p| p == "principal olga"),
        "{by}"
    );
    let approval = s
        .get(&format!("/v1/sessions/{sid}/approvals"), &s.viewer)
        .await
        .body["items"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let short = format!("{}…{}", &approval[..8], &approval[approval.len() - 4..]);
    eval(
        &c,
        &format!("const e = document.querySelector('#journal-entity'); e.value = '{short}'; e.dispatchEvent(new Event('input')); return true"),
    )
    .await;
    let types = until(
        &c,
        "the events of the approval",
        "document.querySelector('#journal-body').textContent.includes('approval.expired') && [...document.querySelectorAll('#journal-body tr code')].map((c) => c.textContent).join(',')",
    )
    .await;
    let types = types.as_str().unwrap().to_owned();
    assert!(types.contains("approval.requested"), "{types}");
    assert!(
        !types.contains("turn.") && !types.contains("step."),
        "only the approval's events: {types}"
    );
    let counted = eval(
        &c,
        "return document.querySelector('#journal-count').textContent",
    )
    .await;
    let time = eval(
        &c,
        "return document.querySelector('#journal-body tr td:nth-child(2)').textContent",
    )
    .await;
    assert!(
        time.as_str()
            .unwrap()
            .starts_with(&chrono::Utc::now().format("%Y-").to_string()),
        "{time}"
    );
    let seq = eval(
        &c,
        "return document.querySelector('#journal-body tr').dataset.seq",
    )
    .await;
    click(&c, "#journal-body tr button.seq").await;
    until(&c, "the state at the seq", &format!("document.querySelector('#state-seq') && document.querySelector('#state-seq').textContent === '{}'", seq.as_str().unwrap())).await;
    let url: String = c.current_url().await.unwrap().to_string();
    assert!(
        url.contains("entity=") && url.contains(&format!("at={}", seq.as_str().unwrap())),
        "{url}"
    );
    c.refresh().await.unwrap();
    until(
        &c,
        "the filter after a reload",
        &format!("document.querySelector('#journal-count') && document.querySelector('#journal-count').textContent === {counted}"),
    )
    .await;
    until(&c, "the seq after a reload", &format!("document.querySelector('#state-seq') && document.querySelector('#state-seq').textContent === '{}'", seq.as_str().unwrap())).await;
    eval(&c, "document.querySelector('#at-seq').value = 99999; document.querySelector('#travel').click(); return true").await;
    let said = until(
        &c,
        "the seq out of range said",
        "document.querySelector('#at-note').textContent",
    )
    .await;
    assert!(
        said.as_str().unwrap().contains("There is no seq 99999"),
        "{said}"
    );
    c.close().await.unwrap();
}
