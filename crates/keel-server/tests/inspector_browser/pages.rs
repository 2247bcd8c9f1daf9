//! What the pages draw beyond the journey in `flow`: a look-alike warning above the decision
//! buttons, model text capped with a link to all of it.

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
}
