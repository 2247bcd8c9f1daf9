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
    // Attacker review 19-1: a combining grapheme joiner and a variation selector glued to `#`
    // make it no comment; the card must show them.
    let marks = s
        .release(
            "marks",
            &[json!({"text": "Running.", "tool_calls": [call("shell", json!({"command": "echo safe \u{034f}# ; touch X ; \u{fe0f}# ; touch Y"}))]})],
            &["shell"],
        )
        .await;
    let marked = s.session(&marks, json!({})).await.body["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Attacker review 19-4/5: a tool result with a bidi override, a zero-width space and an
    // `artifact://..` that must not become a link.
    std::fs::write(
        s.workspace.join("names.txt"),
        "evil\u{202e}txt.sh\n\u{200b}hidden.txt\nsee artifact://.. and artifact://.\n",
    )
    .unwrap();
    let reader = s
        .release(
            "reader",
            &[
                json!({"text": "Reading.", "tool_calls": [call("read_file", json!({"path": "names.txt"}))]}),
                json!({"text": "Read."}),
            ],
            &["read_file"],
        )
        .await;
    let read = s.run_to_idle(&reader, "go").await;
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
    for id in [&spoofed, &long, &marked] {
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

    go(&c, &s.base, &format!("#/session/{marked}")).await;
    until(
        &c,
        "the approval of the marked command",
        "document.querySelector('#session-decisions article.approval .lookalike')",
    )
    .await;
    let card = eval(&c, "const card = document.querySelector('#session-decisions article.approval'); return [card.querySelector('pre.args').textContent, card.querySelector('.args-size').textContent, card.querySelector('.args-size').className, card.querySelector('.lookalike').textContent]").await;
    let args = card[0].as_str().unwrap();
    assert!(
        args.contains("echo safe ⟨U+034F⟩# ; touch X ; ⟨U+FE0F⟩# ; touch Y"),
        "{card}"
    );
    assert!(
        card[1]
            .as_str()
            .unwrap()
            .contains("2 invisible or format characters"),
        "{card}"
    );
    assert!(card[2].as_str().unwrap().contains("warn"), "{card}");
    assert!(card[3].as_str().unwrap().contains("U+034F"), "{card}");
    // Attacker review 19-6: "Allow for session" says what it grants.
    let grant = eval(
        &c,
        "return document.querySelector('#session-decisions article.approval p.grant').textContent",
    )
    .await;
    assert!(
        grant
            .as_str()
            .unwrap()
            .contains("each command of this line, exactly as written"),
        "{grant}"
    );
    let file_grant = eval(&c, "return K.grantOf('write_file')").await;
    assert!(
        file_grant.as_str().unwrap().contains("same path(s)"),
        "{file_grant}"
    );
    // Every mark, invisible or not, and every default-ignorable code point is shown.
    let exact = eval(&c, "const p = K.exactPre('a\\u0301 \\u17b4\\u180b\\u{e0100}\\u115f'); return [p.textContent, p.hidden_chars]").await;
    assert_eq!(
        exact,
        json!(["a⟨U+0301⟩ ⟨U+17B4⟩⟨U+180B⟩⟨U+E0100⟩⟨U+115F⟩", 5])
    );

    go(&c, &s.base, &format!("#/session/{read}")).await;
    let output = until(
        &c,
        "the read_file result",
        "document.querySelector('details.tool pre.output') && document.querySelector('details.tool pre.output').textContent",
    )
    .await;
    let output = output.as_str().unwrap();
    assert!(output.contains("evil⟨U+202E⟩txt.sh"), "{output}");
    assert!(output.contains("⟨U+200B⟩hidden.txt"), "{output}");
    assert!(output.contains("artifact://.."), "{output}");
    let links = eval(
        &c,
        "return document.querySelectorAll('a.artifact-link').length",
    )
    .await;
    assert_eq!(links, json!(0), "no link for artifact://.. or artifact://.");
    go(&c, &s.base, "#/artifact/..").await;
    let refused = until(
        &c,
        "the refused artifact id",
        "document.querySelector('#artifact-text') && document.querySelector('#artifact-text').textContent",
    )
    .await;
    assert!(
        refused.as_str().unwrap().contains("Not an artifact id"),
        "{refused}"
    );

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
    // Attacker review 19-6: a sign-out the server refuses (here: no token, 403) is shown, and
    // the page does not claim to be signed out.
    eval(
        &c,
        "sessionStorage.removeItem('inspectorToken'); K.memToken = ''; document.querySelector('#toast').replaceChildren(); return null",
    )
    .await;
    click(&c, "#sign-out").await;
    let toast = until(
        &c,
        "the refused sign-out",
        "document.querySelector('#toast').textContent",
    )
    .await;
    assert!(
        toast.as_str().unwrap().contains("Not signed out"),
        "{toast}"
    );
    let still = eval(
        &c,
        "return [!document.querySelector('#nav').hidden, !!document.querySelector('#sign-in')]",
    )
    .await;
    assert_eq!(still, json!([true, false]));
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
