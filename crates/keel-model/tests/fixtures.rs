//! Every recorded and hand-written SSE fixture parses into exactly the snapshotted events
//! (`tests/snapshots/`, one JSON line per event — the output of `keel model parse`).

use keel_model::{Wire, parse_recorded};

async fn parse_fixture(file: &str) -> String {
    let wire: Wire = file.split('.').next().unwrap_or_default().parse().unwrap();
    let path = format!("{}/tests/fixtures/sse/{file}", env!("CARGO_MANIFEST_DIR"));
    let body = std::fs::read(&path).unwrap();
    let events = parse_recorded(wire, &body).await;
    events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

macro_rules! fixture_tests {
    ($($name:ident => $file:literal,)*) => {$(
        #[tokio::test]
        async fn $name() {
            insta::assert_snapshot!(stringify!($name), parse_fixture($file).await);
        }
    )*};
}

fixture_tests! {
    anthropic_text => "anthropic.text.sse",
    anthropic_thinking_keeps_signature => "anthropic.thinking.sse",
    anthropic_tool_with_empty_input => "anthropic.tool-no-args.sse",
    anthropic_tool_use_split_mid_word_with_pings => "anthropic.tool-use.sse",
    openai_chat_parallel_tool_calls_and_usage_only_chunk => "openai-chat.parallel-tool-calls.sse",
    openai_responses_function_call => "openai-responses.function-call.sse",
    openai_responses_reasoning_1_encrypted => "openai-responses.reasoning.1.sse",
    openai_responses_reasoning_2 => "openai-responses.reasoning.2.sse",
    openai_responses_reasoning_3 => "openai-responses.reasoning.3.sse",
    openai_responses_reasoning_4_text => "openai-responses.reasoning.4.sse",
    own_anthropic_duplicate_message_start_padded_json => "anthropic.duplicate-message-start.sse",
    own_anthropic_truncated_stream => "anthropic.truncated.sse",
    own_anthropic_max_tokens_cuts_tool_call => "anthropic.max-tokens-tool.sse",
    own_anthropic_error_event_after_200 => "anthropic.error-after-200.sse",
    own_openai_chat_invalid_json_arguments => "openai-chat.invalid-json-arguments.sse",
    own_openai_chat_finish_reason_length => "openai-chat.finish-length.sse",
    own_openai_responses_unknown_events_ignored => "openai-responses.unknown-events.sse",
    own_openai_responses_error_then_failed => "openai-responses.error-after-200.sse",
    own_openai_responses_incomplete_max_output_tokens => "openai-responses.incomplete-max-output.sse",
    own_openai_chat_compatible_server_stop_with_tool_call => "openai-chat.compatible-stop-with-tool-call.sse",
    own_anthropic_unknown_events_ignored_refusal => "anthropic.unknown-events.sse",
}

#[tokio::test]
async fn every_fixture_file_has_a_test() {
    let dir = format!("{}/tests/fixtures/sse", env!("CARGO_MANIFEST_DIR"));
    let count = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sse")
        })
        .count();
    assert_eq!(count, 21, "add a fixture_tests! entry for each new fixture");
}

#[tokio::test]
async fn truncation_at_every_byte_is_a_classified_error_never_a_panic() {
    for file in [
        "anthropic.tool-use.sse",
        "openai-chat.parallel-tool-calls.sse",
        "openai-responses.function-call.sse",
    ] {
        let wire: Wire = file.split('.').next().unwrap().parse().unwrap();
        let body = std::fs::read(format!(
            "{}/tests/fixtures/sse/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        for cut in (0..body.len()).step_by(7) {
            let events = parse_recorded(wire, &body[..cut]).await;
            let last = events.last().unwrap();
            assert!(last.is_terminal(), "{file} cut at {cut}: {last:?}");
        }
    }
}

#[tokio::test]
async fn corrupted_fixtures_end_in_one_terminal_event_never_a_panic() {
    let dir = format!("{}/tests/fixtures/sse", env!("CARGO_MANIFEST_DIR"));
    let mut rng = fastrand::Rng::with_seed(7);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Ok(wire) = name.split('.').next().unwrap().parse::<Wire>() else {
            continue;
        };
        let body = std::fs::read(&path).unwrap();
        for _ in 0..40 {
            let mut bad = body.clone();
            for _ in 0..rng.usize(1..8) {
                let i = rng.usize(..bad.len());
                bad[i] = rng.u8(..);
            }
            let events = parse_recorded(wire, &bad).await;
            let terminals = events.iter().filter(|e| e.is_terminal()).count();
            assert_eq!(terminals, 1, "{name}: {events:?}");
            assert!(events.last().unwrap().is_terminal(), "{name}");
        }
    }
}

#[tokio::test]
async fn copies_of_the_shared_recordings_are_byte_identical() {
    // ../shared/fixtures/sse next to the repository, when present (not in every checkout).
    let shared =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/sse");
    let Ok(entries) = std::fs::read_dir(&shared) else {
        return;
    };
    let ours = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sse");
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let copy = std::fs::read(ours.join(name))
            .unwrap_or_else(|e| panic!("shared recording {name:?} has no copy here: {e}"));
        assert_eq!(copy, std::fs::read(&path).unwrap(), "{name:?} differs");
    }
}
