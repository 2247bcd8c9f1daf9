//! Tests of [`super`]: built-in and configured patterns, escaped spellings, the stream.

use super::*;

#[test]
fn every_builtin_pattern_compiles_once_and_is_shared() {
    assert_eq!(BUILTIN_SET.as_ref().map(RegexSet::len), Some(BUILTIN.len()));
    for i in 0..BUILTIN.len() {
        let re = builtin(i).unwrap();
        assert!(std::ptr::eq(re, builtin(i).unwrap()), "compiled once");
    }
    assert!(builtin(BUILTIN.len()).is_none());
    let a = Redactor::with_values(&[], &[]).unwrap();
    let b = Redactor::with_values(&["x{3}".to_owned()], &[]).unwrap();
    assert!(
        a.patterns.is_empty(),
        "built-in patterns are not per redactor"
    );
    assert_eq!(b.patterns.len(), 1);
}

#[test]
fn the_builtin_set_finds_every_span_each_pattern_finds() {
    let r = Redactor::with_values(&["tok_[0-9]{4}".to_owned()], &[]).unwrap();
    let texts = [
        "nothing here",
        "sk-ant-api03-abcdefghijklmnopqrstuvwxyz and sk-proj-ABCDEFGHIJKLMNOPQRSTUV",
        "ghp_abcdefghijklmnopqrstuvwxyz0123 github_pat_abcdefghijklmnopqrstuvwx",
        "AKIAABCDEFGHIJKLMNOP xoxb-1234567890-abc authorization: BEARER abcdefghijklmnop==",
        "tok_1234 sk-abcdefghijklmnopqrstuvwx tok_5678 gho_abcdefghijklmnopqrstuvwx",
        "é sk-ant-ééé AKIA1234 bearer short",
    ];
    for text in texts {
        let mut by_set = Vec::new();
        r.plain_spans(text, &mut by_set);
        let mut by_each: Vec<Range<usize>> = (0..BUILTIN.len())
            .map(|i| builtin(i).unwrap())
            .chain(r.patterns.iter().map(AsRef::as_ref))
            .flat_map(|re| re.find_iter(text).map(|m| m.range()))
            .collect();
        by_set.sort_by_key(|s| (s.start, s.end));
        by_each.sort_by_key(|s| (s.start, s.end));
        assert_eq!(by_set, by_each, "{text}");
    }
}

#[test]
fn every_builtin_match_begins_with_a_prefix_the_prefilter_finds() {
    assert!(BUILTIN_PREFILTER.is_some());
    // Each pattern's literal start, every spelling its class allows, in several cases.
    let samples = [
        "sk-ant-abcdefghijklmnopqrstuvwxyz",
        "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX",
        "sk-ABCDEFGHIJKLMNOPQRSTUVWX",
        "ghp_abcdefghijklmnopqrstuvwxyz",
        "gho_abcdefghijklmnopqrstuvwxyz",
        "ghu_abcdefghijklmnopqrstuvwxyz",
        "ghs_abcdefghijklmnopqrstuvwxyz",
        "ghr_abcdefghijklmnopqrstuvwxyz",
        "github_pat_abcdefghijklmnopqrstuvwxyz",
        "AKIAABCDEFGHIJKLMNOP",
        "xoxa-1234567890",
        "xoxb-1234567890",
        "xoxp-1234567890",
        "xoxr-1234567890",
        "xoxs-1234567890",
        "bearer abcdefghijklmnopq",
        "BEARER abcdefghijklmnopq",
        "BeArEr\tabcdefghijklmnopq==",
    ];
    for sample in samples {
        let text = format!("say {sample} once");
        let matched: Vec<usize> = (0..BUILTIN.len())
            .filter(|&i| builtin(i).unwrap().is_match(&text))
            .collect();
        assert!(!matched.is_empty(), "{sample} is a sample of a pattern");
        assert!(may_hold_builtin(&text), "{sample}");
        for i in matched {
            for m in builtin(i).unwrap().find_iter(&text) {
                let found = m.as_str().to_ascii_lowercase();
                assert!(
                    BUILTIN_PREFIXES.iter().any(|p| found.starts_with(p)),
                    "pattern {i}'s match {found} begins with no prefix"
                );
            }
        }
    }
    // Every pattern has a sample above.
    for (i, pattern) in BUILTIN.iter().enumerate() {
        assert!(
            samples.iter().any(|s| builtin(i).unwrap().is_match(s)),
            "no sample of {pattern}"
        );
    }
    for clean in ["nothing here", "a high, thorough task", "skip ghost xo"] {
        assert!(!may_hold_builtin(clean), "{clean}");
    }
}

#[test]
fn builtin_patterns_and_configured_ones_are_redacted() {
    let r = Redactor::new(&["tok_[0-9]{4}".into()], &[]).unwrap();
    let s = r.redact_str(
        "key sk-abcdefghijklmnopqrstuvwx and tok_1234 and Bearer abcdefghijklmnopqrstu",
    );
    assert!(!s.contains("sk-abc"), "{s}");
    assert!(!s.contains("tok_1234"), "{s}");
    assert!(!s.contains("abcdefghijklmnopqrstu"), "{s}");
    assert_eq!(r.redact_str("nothing here"), "nothing here");
}

#[test]
fn a_urls_password_is_redacted_and_the_rest_of_the_url_kept() {
    let r = Redactor::with_values(&[], &[]).unwrap();
    assert!(URL_PASSWORD.is_some());
    for (text, want) in [
        (
            "DATABASE_URL=postgres://app:s3cr%40t@db.internal:5432/prod",
            "DATABASE_URL=postgres://app:[REDACTED]@db.internal:5432/prod",
        ),
        (
            "git clone https://x-access:tok@github.com/o/r.git and redis://:pw@h",
            "git clone https://x-access:[REDACTED]@github.com/o/r.git and redis://:[REDACTED]@h",
        ),
        // JSON-escaped, as in a tool call's raw arguments.
        (
            r#"{"url":"mysql:\/\/root:hunter22@h\/db"}"#,
            r#"{"url":"mysql:\/\/root:[REDACTED]@h\/db"}"#,
        ),
    ] {
        assert_eq!(r.redact_str(text), want);
    }
    for kept in [
        "http://localhost:8080/path",
        "see https://example.com/a@b",
        "ssh git@github.com:o/r.git",
        "http://[::1]:8080/",
        "user@host: no scheme",
    ] {
        assert_eq!(r.redact_str(kept), kept);
    }
}

#[test]
fn a_secret_split_across_chunks_is_redacted_in_the_stream() {
    let r = Arc::new(Redactor::new(&["tok_[0-9]{4}".into()], &[]).unwrap());
    let text = format!(
        "{} key sk-abcdefghij{} and tok_12{}34 end é",
        "x".repeat(300),
        "klmnopqrstuvwx",
        ""
    );
    for split in [1, 3, 7, 64, 301, 310, 317] {
        let mut s = StreamRedactor::new(r.clone());
        let mut out = String::new();
        let bytes: Vec<char> = text.chars().collect();
        for chunk in bytes.chunks(split) {
            let piece: String = chunk.iter().collect();
            let got = s.push(&piece);
            assert!(!got.contains("sk-"), "split {split}: {got}");
            out.push_str(&got);
        }
        out.push_str(&s.finish());
        assert_eq!(out, r.redact_str(&text), "split {split}");
        assert!(
            !out.contains("abcdefghij") && !out.contains("tok_12"),
            "{out}"
        );
    }
}

#[test]
fn a_pattern_matching_a_structural_field_still_redacts_the_rest() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Ev {
        ts: chrono::DateTime<chrono::Utc>,
        payload: String,
    }
    // A configured pattern that also matches the timestamp: the payload must still be
    // redacted (the value must not fall back to its unredacted form).
    let r = Redactor::new(&["[0-9]{4}-[0-9]{2}-[0-9]{2}".into()], &[]).unwrap();
    let ev = Ev {
        ts: chrono::Utc::now(),
        payload: "license 1234-56-78".into(),
    };
    let ts = ev.ts;
    let out = r.redact_typed(ev);
    assert_eq!(out.ts, ts);
    assert_eq!(out.payload, format!("license {REDACTED}"));
}

/// Escaped spellings of a secret: a raw (truncated) arguments text with `\/`, a value with
/// a digit spelled `\u0037`, an emoji as a surrogate pair, upper-case hex, JSON in a JSON
/// string (two levels), a pattern match spelled with escapes. Each is redacted over its whole
/// escaped spelling, and the rest of the text stays as it was.
#[test]
fn a_secret_spelled_with_json_escapes_is_redacted() {
    let r = Redactor::with_values(
        &["tok_[0-9]{4}".into()],
        &[
            "postgres://u:pw@h/db".into(),
            "key-1234567".into(),
            "pass\u{1F600}word".into(),
        ],
    )
    .unwrap();
    let cases = [
        (
            r#"{"path":"a.txt","content":"postgres:\/\/u:pw@h\/db"#,
            r#"{"path":"a.txt","content":"[REDACTED]"#,
        ),
        (r#"{"k":"key-123456\u0037"}"#, r#"{"k":"[REDACTED]"}"#),
        (r#"{"k":"\u006bey-123456\u0037"}"#, r#"{"k":"[REDACTED]"}"#),
        (r#"{"k":"\u006Bey-1234567 x"}"#, r#"{"k":"[REDACTED] x"}"#),
        (r#"{"p":"pass\ud83d\ude00word"}"#, r#"{"p":"[REDACTED]"}"#),
        (r#"{"p":"pass\uD83D\uDE00word"}"#, r#"{"p":"[REDACTED]"}"#),
        (
            r#"{"doc":"{\"url\":\"postgres:\\\/\\\/u:pw@h\\\/db\"}"}"#,
            r#"{"doc":"{\"url\":\"[REDACTED]\"}"}"#,
        ),
        (
            r#"tok\u005f1234 and tok_\u0031234"#,
            "[REDACTED] and [REDACTED]",
        ),
        (
            r#"a\nkey-1234567\tb \x \ud83d"#,
            r#"a\n[REDACTED]\tb \x \ud83d"#,
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(r.redact_str(raw), want, "{raw}");
    }
    // Escapes that decode to nothing secret leave the text as it is.
    let plain = r#"{"a":"x\/y\u0041\ud83d\ude00\\","b":"\q"}"#;
    assert_eq!(r.redact_str(plain), plain);
    // A value holding the raw text.
    let mut v = serde_json::Value::String(cases[0].0.to_owned());
    r.redact_value(&mut v);
    assert_eq!(v, serde_json::Value::String(cases[0].1.to_owned()));
}

/// The stream redactor holds back enough for a secret spelled wholly in `\uXXXX` escapes
/// (six times its length) and redacts it whatever the chunking.
#[test]
fn an_escaped_secret_split_across_chunks_is_redacted_in_the_stream() {
    let secret = "s3cret-value-0123456789-abcdefghijklmnopqrstuvwxyz-0123456789";
    let r = Arc::new(Redactor::with_values(&[], &[secret.into()]).unwrap());
    let escaped: String = secret
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let text = format!("{}{escaped} tail", "x".repeat(300));
    for split in [1, 5, 64, 200, 397] {
        let mut s = StreamRedactor::new(r.clone());
        let mut out = String::new();
        for chunk in text.as_bytes().chunks(split) {
            out.push_str(&s.push(std::str::from_utf8(chunk).unwrap()));
        }
        out.push_str(&s.finish());
        assert_eq!(
            out,
            format!("{}{REDACTED} tail", "x".repeat(300)),
            "split {split}"
        );
    }
}

#[test]
fn a_bad_pattern_is_a_clear_error() {
    let err = Redactor::new(&["(".into()], &[]).unwrap_err();
    assert!(err.to_string().contains("does not compile"), "{err}");
}
