//! Untrusted output stays data: model text, tool arguments and stored prompts reach a
//! human-readable rendering with control characters made visible; JSONL keeps them exact.

use crate::common::{Env, jsonl_lines, stdout};

const NASTY: &str = r#"\u001b[2J\u001b[31mRED\u001b]0;pwned-title\u0007"#;

fn no_raw_controls(text: &str) {
    assert!(
        !text.bytes().any(|b| b == 0x1b || b == 0x07),
        "raw control bytes in: {text:?}"
    );
}

#[test]
fn text_output_and_session_listings_show_escapes_as_data() {
    let env = Env::new();
    let script = format!(
        "{{\"tool_calls\":[{{\"name\":\"read_file\",\"arguments\":{{\"path\":\"x{NASTY}\"}}}}]}}\n{{\"text\":\"{NASTY}\"}}\n"
    );
    env.write("script.jsonl", &script);
    let prompt = "task \u{1b}]0;pwned-title\u{7} \u{9b}31m";
    let out = env
        .keel()
        .args(["run", "--workspace", "ws", "--model", "script:script.jsonl"])
        .arg(prompt)
        .output()
        .unwrap();
    let text = stdout(&out);
    no_raw_controls(&text);
    assert!(text.contains("␛[31mRED"), "{text}");
    let session = text
        .rsplit("session ")
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let list = stdout(&env.run(&["sessions", "list"]));
    no_raw_controls(&list);
    assert!(list.contains("␛]0;pwned-title"), "{list}");
    assert!(!list.contains('\u{9b}'), "{list}");
    let show = stdout(&env.run(&["sessions", "show", &session]));
    no_raw_controls(&show);
    // JSON stays exact: the prompt round-trips.
    let json = env.run(&["sessions", "list", "--json"]);
    let lines = jsonl_lines(&json.stdout);
    assert_eq!(lines[0]["last_input"], prompt);
}
