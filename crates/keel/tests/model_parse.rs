//! `keel model parse` prints, for every fixture, exactly the events keel-model's parser yields.

use std::process::Command;

fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../keel-model/tests/fixtures/sse")
}

#[test]
fn model_parse_prints_normalized_events_of_every_fixture() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "sse") {
            continue;
        }
        seen += 1;
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let wire = name.split('.').next().unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["model", "parse", "--wire", wire])
            .arg(&path)
            .output()
            .unwrap();
        let expected = runtime.block_on(keel_model::parse_recorded(
            wire.parse().unwrap(),
            &std::fs::read(&path).unwrap(),
        ));
        let printed: Vec<keel_model::StreamEvent> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(printed, expected, "{name}");
        let failed = matches!(expected.last(), Some(keel_model::StreamEvent::Error { .. }));
        assert_eq!(
            output.status.success(),
            !failed,
            "{name}: exit status says whether the stream failed"
        );
    }
    assert!(seen >= 19, "only {seen} fixtures found");
}

#[test]
fn model_parse_rejects_unknown_wire_and_missing_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["model", "parse", "--wire", "gemini", "x.sse"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("openai-chat"));
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "model",
            "parse",
            "--wire",
            "anthropic",
            "/nonexistent/file.sse",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/file.sse"));
}
