//! What the pages draw beyond the journey in `flow`: a look-alike warning above the decision
//! buttons, model text capped with a link to all of it, dark mode with AA-contrast buttons.

use serde_json::json;

use super::*;
use crate::common::*;
use crate::on_both;

on_both!(look_alikes_are_flagged_and_huge_model_text_is_capped);

/// Review item 5: a command with characters of another script that pass for Latin ones gets a
/// warning above the decision buttons, naming them; a model text of 30,000 characters is drawn
/// up to the cap, with a link to the journal for the rest.
async fn look_alikes_are_flagged_and_huge_model_text_is_capped(b: Backend) {
    let s = start(b).await;
    let d = driver().await;
    // "оut.txt" starts with a Cyrillic о (U+043E).
    let spoof = s
        .release(
            "spoof",
            &[json!({"text": "Writing.", "tool_calls": [call("write_file", json!({"path": "\u{043e}ut.txt", "content": "x"}))]})],
            &["write_file"],
        )
        .await;
    let big_text = "0123456789".repeat(3000);
    let big = s.release("big", &[json!({"text": big_text})], &[]).await;
    let spoofed = s.session(&spoof, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let long = s.session(&big, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for id in [&spoofed, &long] {
        let r = s
            .post(
                &format!("/v1/sessions/{id}/turns"),
                &s.operator,
                &json!({"input": "go"}),
            )
            .await;
        assert!(r.status.is_success(), "{r:?}");
    }
    let c = browser(&d).await;
    sign_in(&c, &s.base, &s.operator).await;

    go(&c, &s.base, &format!("#/session/{spoofed}")).await;
    let warning = until(
        &c,
        "the look-alike warning",
        "document.querySelector('#session-decisions article.approval .lookalike')",
    )
    .await;
    assert!(!warning.is_null());
    let (text, before) = {
        let v = eval(&c, "const card = document.querySelector('#session-decisions article.approval'); const w = card.querySelector('.lookalike'); const b = card.querySelector('.actions'); return [w.textContent, !!(w.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING)]").await;
        (v[0].as_str().unwrap().to_owned(), v[1].clone())
    };
    assert!(text.contains("\"о\" U+043E"), "{text}");
    assert_eq!(before, json!(true), "the warning is above the buttons");
    // Plain ASCII arguments get none (the card is drawn by the same function).
    let plain = eval(
        &c,
        "return K.lookAlikes(JSON.stringify({path: 'out.txt', command: 'ls -la ~/'})).length",
    )
    .await;
    assert_eq!(plain, json!(0));

    go(&c, &s.base, &format!("#/session/{long}")).await;
    let shown = until(
        &c,
        "the capped model text",
        "document.querySelector('.model-text a.full-text') && document.querySelector('.model-text').textContent.length",
    )
    .await;
    let shown = shown.as_u64().unwrap();
    assert!(
        shown > 20_000 && shown < 20_200,
        "20,000 characters and the note: {shown}"
    );
    let link = eval(
        &c,
        "return document.querySelector('.model-text a.full-text').getAttribute('href')",
    )
    .await;
    assert_eq!(link, json!(format!("#/journal/{long}")));
    c.close().await.unwrap();

    // Review item 5: in dark mode the page is dark and the decision buttons keep WCAG AA
    // contrast (4.5:1) against what they are drawn on.
    let dark = browser_with(&d, &["--force-dark-mode"]).await;
    sign_in(&dark, &s.base, &s.operator).await;
    go(&dark, &s.base, &format!("#/session/{spoofed}")).await;
    until(
        &dark,
        "the decision buttons",
        "document.querySelector('#session-decisions button.allow')",
    )
    .await;
    let ratios = eval(&dark, CONTRASTS).await;
    assert_eq!(
        ratios[0], "rgb(13, 17, 23)",
        "the dark background: {ratios}"
    );
    assert_eq!(
        ratios[1].as_array().unwrap().len(),
        3,
        "allow, allow for session, deny: {ratios}"
    );
    for r in ratios[1].as_array().unwrap() {
        assert!(r[1].as_f64().unwrap() >= 4.5, "{ratios}");
    }
    screenshot(
        &dark,
        matches!(b, Backend::Sqlite),
        "session-approval-dark",
        "document.querySelector('.lookalike')",
    )
    .await;
    dark.close().await.unwrap();
}

/// The body's background, and `[button, contrast ratio]` of each decision button's text on its
/// background (its own, or the card's when it has none).
const CONTRASTS: &str = r#"
    const rgb = (s) => (s.match(/[\d.]+/g) || []).map(Number);
    const lum = (c) => { const l = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return 0.2126 * l(c[0]) + 0.7152 * l(c[1]) + 0.0722 * l(c[2]); };
    const bgOf = (el) => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c; } return [255, 255, 255]; };
    const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
    return [getComputedStyle(document.body).backgroundColor,
        [...document.querySelectorAll('#session-decisions .actions button')].map((b) => [b.className, ratio(rgb(getComputedStyle(b).color), bgOf(b))])];
"#;
