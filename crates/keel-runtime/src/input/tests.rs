use super::*;

#[test]
fn commands_and_paths_are_told_apart() {
    assert_eq!(split_command("/help"), Some(("help", "")));
    assert_eq!(
        split_command("  /compact  keep the API notes "),
        Some(("compact", "keep the API notes"))
    );
    assert_eq!(split_command("/usr/bin/env is missing"), None);
    assert_eq!(split_command("fix /help text"), None);
    assert_eq!(split_command("/"), None);
}

#[test]
fn mentions_are_words_starting_with_at() {
    assert_eq!(
        mentions("see @src/a.rs, and @b.txt. mail me@x.org @src/a.rs"),
        ["src/a.rs", "b.txt"]
    );
    assert!(mentions("no @ here").is_empty());
    assert_eq!(
        mentions("read @\"a b.txt\" and @c.txt"),
        vec!["a b.txt".to_owned(), "c.txt".to_owned()]
    );
}

#[test]
fn a_command_file_has_optional_front_matter() {
    let c = parse_command_file(
        "fix",
        PathBuf::from("fix.md"),
        "---\ndescription: \"Fix an issue\"\n---\nFix issue $ARGUMENTS now.\n",
    );
    assert_eq!(c.description.as_deref(), Some("Fix an issue"));
    assert_eq!(expand(&c.body, "42"), "Fix issue 42 now.");
    let plain = parse_command_file("p", PathBuf::from("p.md"), "Just text");
    assert_eq!(
        (plain.description, plain.body.as_str()),
        (None, "Just text")
    );
    assert_eq!(expand("Review", "src/a.rs"), "Review\n\nsrc/a.rs");
    assert!(!valid_command_name("../x"));
}

#[test]
fn the_compact_focus_reaches_the_summary_request() {
    let r = crate::compaction::summary_request(None, &[], Some(" the API notes "), 3);
    let Some(keel_model::Message::User { content }) = r.messages.last().map(|m| &**m) else {
        panic!("{:?}", r.messages)
    };
    assert!(
        content.ends_with("Focus the summary on: the API notes"),
        "{content}"
    );
    assert_eq!(r.response_index, Some(3));
}
