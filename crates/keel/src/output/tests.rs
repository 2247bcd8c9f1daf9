use super::*;

#[test]
fn the_unshown_rest_skips_what_was_streamed_and_an_abandoned_attempt() {
    assert_eq!(unshown_rest("", "hi"), "hi");
    assert_eq!(unshown_rest("hi", "hi"), "");
    assert_eq!(unshown_rest("hel", "hello"), "lo");
    // An attempt that failed mid-stream, then the whole answer of the next one.
    assert_eq!(unshown_rest("partiahello", "hello"), "");
    assert_eq!(unshown_rest("zz", "hello"), "hello");
    assert_eq!(unshown_rest("é", "éa"), "a");
}

#[test]
fn a_budget_hint_names_the_key_and_the_flag() {
    let h = raise_hint(Some(BudgetLimit::Steps));
    assert!(h.contains("max_steps") && h.contains("--max-steps"), "{h}");
    assert!(raise_hint(Some(BudgetLimit::Tokens)).contains("[budget] max_tokens"));
    assert!(raise_hint(Some(BudgetLimit::WallTime)).contains("--timeout"));
    assert!(raise_hint(None).contains("[budget]"));
}

#[test]
fn counts_are_singular_for_one() {
    assert_eq!(count(1u32, "step"), "1 step");
    assert_eq!(count(0u32, "step"), "0 steps");
    assert_eq!(count(72u64, "token"), "72 tokens");
}
