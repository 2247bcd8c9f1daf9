//! A recorded real trajectory (SWE-agent's str_replace demo, mapped onto list_dir / read_file /
//! edit_file) replayed against the tools: results carry what the model saw, and the file ends up
//! byte-for-byte as in the trajectory's submitted diff (git blob 5857437).

use keel_tools::tool::ToolResultStatus::Succeeded;
use serde_json::json;

use crate::common::Fixture;

const BEFORE: &str = "#!/usr/bin/env python3\n\n\ndef division(a: float, b: float) -> float\n    return a/b\n\n\nif __name__ == \"__main__\":\n    print(division(123, 15))\n\n";
const AFTER: &str = "#!/usr/bin/env python3\n\n\ndef division(a: float, b: float) -> float:\n    return a/b\n\n\nif __name__ == \"__main__\":\n    print(division(123, 15))\n\n";

#[tokio::test]
async fn str_replace_demo_reproduces_the_recorded_file() {
    let f = Fixture::new();
    f.write("src/testpkg/missing_colon.py", BEFORE);
    f.write("tests/missing_colon.py", BEFORE);
    f.write("src/testpkg/__init__.py", "");
    f.write("README.md", "# test-repo\n");
    let listing = f.call("list_dir", json!({"path": "."})).await;
    assert_eq!(listing.status, Succeeded);
    assert_eq!(listing.content, "README.md\nsrc/\ntests/\n");
    let read = f
        .call("read_file", json!({"path": "src/testpkg/missing_colon.py"}))
        .await;
    assert_eq!(read.status, Succeeded);
    assert!(
        read.content.contains(
            "     4\tdef division(a: float, b: float) -> float\n     5\t    return a/b\n"
        ),
        "{}",
        read.content
    );
    let edit = f
        .call(
            "edit_file",
            json!({
                "path": "src/testpkg/missing_colon.py",
                "old_string": "def division(a: float, b: float) -> float",
                "new_string": "def division(a: float, b: float) -> float:"
            }),
        )
        .await;
    assert_eq!(edit.status, Succeeded, "{}", edit.content);
    // The edit result shows the edited region, as the recorded tool did.
    assert!(
        edit.content.contains(
            "     4\tdef division(a: float, b: float) -> float:\n     5\t    return a/b\n"
        ),
        "{}",
        edit.content
    );
    assert_eq!(
        std::fs::read(f.path("src/testpkg/missing_colon.py")).unwrap(),
        AFTER.as_bytes()
    );
    assert_eq!(
        std::fs::read(f.path("tests/missing_colon.py")).unwrap(),
        BEFORE.as_bytes(),
        "only the named file changes"
    );
}
