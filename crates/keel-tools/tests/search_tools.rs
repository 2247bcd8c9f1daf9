use keel_tools::policy::{PermissionMode, Policy, Rule};
use keel_tools::sandbox::SandboxMode;
use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use serde_json::json;

use crate::common::Fixture;

fn tree(f: &Fixture) {
    f.write(".gitignore", "target/\n*.log\n");
    f.write("src/lib.rs", "fn main() {\n    println!(\"Hello\");\n}\n");
    f.write("src/util.rs", "// hello util\n");
    f.write("target/debug/out.rs", "hello from build output\n");
    f.write("debug.log", "hello log\n");
    f.write("README.md", "Hello readme\n");
}

#[tokio::test]
async fn glob_honours_gitignore() {
    let f = Fixture::new();
    tree(&f);
    let r = f.call("glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(r.status, Succeeded);
    assert_eq!(r.content, "src/lib.rs\nsrc/util.rs\n");
    let r = f.call("glob", json!({"pattern": "*.log"})).await;
    assert!(r.content.contains("No files match"), "{}", r.content);
}

#[tokio::test]
async fn glob_star_stays_within_a_directory_and_path_narrows() {
    let f = Fixture::new();
    tree(&f);
    let r = f.call("glob", json!({"pattern": "*.rs"})).await;
    assert!(r.content.contains("No files match"), "{}", r.content);
    let r = f
        .call("glob", json!({"pattern": "*.rs", "path": "src"}))
        .await;
    assert_eq!(r.content, "src/lib.rs\nsrc/util.rs\n");
}

#[tokio::test]
async fn glob_errors() {
    let f = Fixture::new();
    let r = f.call("glob", json!({"pattern": "src/[a"})).await;
    assert_eq!(r.status, Failed);
    assert!(
        r.content.contains("invalid pattern `src/[a`"),
        "{}",
        r.content
    );
    let r = f
        .call("glob", json!({"pattern": "*", "path": "nope"}))
        .await;
    assert!(
        r.content.contains("`nope` is not an existing directory"),
        "{}",
        r.content
    );
}

#[tokio::test]
async fn grep_honours_gitignore_and_shows_line_numbers() {
    let f = Fixture::new();
    tree(&f);
    let r = f.call("grep", json!({"pattern": "hello"})).await;
    assert_eq!(r.status, Succeeded);
    assert_eq!(r.content, "src/util.rs:1:// hello util\n");
    let r = f
        .call(
            "grep",
            json!({"pattern": "hello", "case_insensitive": true}),
        )
        .await;
    assert_eq!(
        r.content,
        "README.md:1:Hello readme\nsrc/lib.rs:2:    println!(\"Hello\");\nsrc/util.rs:1:// hello util\n"
    );
}

/// A multi-megabyte pattern once kept the lazy DFA busy for minutes (a search a cancel could
/// not stop): patterns over `MAX_PATTERN_BYTES` are a tool error that changed nothing.
#[tokio::test]
async fn grep_refuses_a_pattern_over_the_limit() {
    let f = Fixture::new();
    tree(&f);
    let big = "A".repeat(keel_tools::builtin::MAX_PATTERN_BYTES + 1);
    let r = f.call("grep", json!({"pattern": big})).await;
    assert_eq!(r.status, keel_tools::tool::ToolResultStatus::Failed);
    assert!(r.not_performed);
    assert!(
        r.content.contains("the limit is 4096 bytes"),
        "{}",
        r.content
    );
    let ok = "A".repeat(keel_tools::builtin::MAX_PATTERN_BYTES);
    let r = f.call("grep", json!({"pattern": ok})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
}

#[tokio::test]
async fn grep_filters_by_glob_and_path() {
    let f = Fixture::new();
    tree(&f);
    let r = f
        .call("grep", json!({"pattern": "(?i)hello", "glob": "*.md"}))
        .await;
    assert_eq!(r.content, "README.md:1:Hello readme\n");
    let r = f
        .call("grep", json!({"pattern": "Hello", "path": "src/lib.rs"}))
        .await;
    assert_eq!(r.content, "src/lib.rs:2:    println!(\"Hello\");\n");
    let r = f.call("grep", json!({"pattern": "nothing-here"})).await;
    assert_eq!(r.status, Succeeded);
    assert!(
        r.content.contains("No matches for `nothing-here`"),
        "{}",
        r.content
    );
}

#[tokio::test]
async fn grep_skips_binary_files() {
    let f = Fixture::new();
    std::fs::write(f.path("bin"), b"hello\0world").unwrap();
    let r = f.call("grep", json!({"pattern": "hello"})).await;
    assert!(r.content.contains("No matches"), "{}", r.content);
}

#[tokio::test]
async fn grep_errors() {
    let f = Fixture::new();
    let r = f.call("grep", json!({"pattern": "(unclosed"})).await;
    assert_eq!(r.status, Failed);
    assert!(
        r.content.contains("invalid regular expression `(unclosed`"),
        "{}",
        r.content
    );
    let r = f.call("grep", json!({"pattern": "x", "glob": "[z"})).await;
    assert!(r.content.contains("invalid glob `[z`"), "{}", r.content);
    let r = f
        .call("grep", json!({"pattern": "x", "path": "gone"}))
        .await;
    assert!(r.content.contains("`gone` does not exist"), "{}", r.content);
}

#[tokio::test]
async fn walking_tools_skip_denied_paths() {
    let f = Fixture::with(
        SandboxMode::Off,
        Policy::new(PermissionMode::Default)
            .with_rule(Rule::deny("read_file(./secrets/**)").unwrap()),
    );
    f.write("secrets/key.txt", "token=hunter2\n");
    f.write("ok.txt", "token=fine\n");
    let r = f.call("grep", json!({"pattern": "token"})).await;
    assert_eq!(r.content, "ok.txt:1:token=fine\n");
    let r = f.call("glob", json!({"pattern": "**/*.txt"})).await;
    assert_eq!(r.content, "ok.txt\n");
    let r = f.call("list_dir", json!({"path": "."})).await;
    assert_eq!(r.content, "ok.txt\n");
}

/// A file name that is not UTF-8 (Latin-1 `café.txt`) is listed in a form the tools read back
/// (`caf\xe9.txt`). Before, it was listed lossily (`caf�.txt`) and no tool could open it.
#[tokio::test]
async fn a_non_utf8_file_name_is_listed_in_a_form_that_reads_back() {
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(f.path(".").join(name), "latin\n").unwrap();
    f.write("plain.txt", "plain\n");
    let listed = f.call("list_dir", json!({"path": "."})).await;
    assert!(
        listed.content.contains("caf\\xe9.txt"),
        "{}",
        listed.content
    );
    let found = f.call("glob", json!({"pattern": "*.txt"})).await;
    assert!(found.content.contains("caf\\xe9.txt"), "{}", found.content);
    let grep = f.call("grep", json!({"pattern": "latin"})).await;
    assert!(grep.content.contains("caf\\xe9.txt"), "{}", grep.content);
    let r = f.call("read_file", json!({"path": "caf\\xe9.txt"})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(r.content.contains("latin"), "{}", r.content);
    let w = f
        .call(
            "edit_file",
            json!({"path": "caf\\xe9.txt", "old_string": "latin", "new_string": "latin-1"}),
        )
        .await;
    assert_eq!(w.status, Succeeded, "{}", w.content);
    assert_eq!(
        std::fs::read_to_string(f.path(".").join(name)).unwrap(),
        "latin-1\n"
    );
    // An escape that decodes to valid UTF-8 is not a form keel writes: it stays literal.
    let r = f.call("read_file", json!({"path": "pl\\x61in.txt"})).await;
    assert_ne!(r.status, Succeeded);
}
