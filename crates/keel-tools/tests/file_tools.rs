use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use serde_json::json;

use crate::common::Fixture;

#[tokio::test]
async fn read_file_numbers_lines_and_pages() {
    let f = Fixture::new();
    f.write("a.txt", "one\ntwo\nthree\n");
    let r = f.call("read_file", json!({"path": "a.txt"})).await;
    assert_eq!(r.status, Succeeded);
    assert_eq!(r.content, "     1\tone\n     2\ttwo\n     3\tthree\n");
    let r = f
        .call(
            "read_file",
            json!({"path": "a.txt", "offset": 2, "limit": 1}),
        )
        .await;
    assert_eq!(
        r.content,
        "     2\ttwo\n… (showing lines 2-2 of 3; call read_file with offset=3 to continue)\n"
    );
}

#[tokio::test]
async fn read_file_errors_say_what_to_do() {
    let f = Fixture::new();
    f.write("dir/a.txt", "x\n");
    std::fs::write(f.path("bin.dat"), [0u8, 1, 2, 255, 0]).unwrap();
    let cases = [
        (
            json!({"path": "missing.txt"}),
            "`missing.txt` does not exist; use list_dir or glob",
        ),
        (json!({"path": "dir"}), "`dir` is a directory; use list_dir"),
        (
            json!({"path": "bin.dat"}),
            "`bin.dat` is a binary file (5 bytes)",
        ),
        (
            json!({"path": "dir/a.txt", "offset": 5}),
            "offset 5 is past the end of `dir/a.txt`, which has 1 lines",
        ),
        (
            json!({"path": "artifact://nope"}),
            "artifact `nope`: no such artifact; use the exact artifact://<id>",
        ),
    ];
    for (args, needle) in cases {
        let r = f.call("read_file", args.clone()).await;
        assert_eq!(r.status, Failed, "{args}");
        assert!(r.content.contains(needle), "{args}: {}", r.content);
    }
}

#[tokio::test]
async fn read_file_reports_an_empty_file() {
    let f = Fixture::new();
    f.write("empty", "");
    let r = f.call("read_file", json!({"path": "empty"})).await;
    assert_eq!(r.status, Succeeded);
    assert!(r.content.contains("is empty"), "{}", r.content);
}

#[tokio::test]
async fn write_file_writes_bytes_exactly_and_creates_parents() {
    let f = Fixture::new();
    let content = "no trailing newline\r\nwith CRLF\t and unicode é";
    let r = f
        .call(
            "write_file",
            json!({"path": "deep/new/file.txt", "content": content}),
        )
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(
        r.content.starts_with("Created `deep/new/file.txt`"),
        "{}",
        r.content
    );
    assert_eq!(
        std::fs::read(f.path("deep/new/file.txt")).unwrap(),
        content.as_bytes()
    );
    let r = f
        .call(
            "write_file",
            json!({"path": "deep/new/file.txt", "content": ""}),
        )
        .await;
    assert!(r.content.starts_with("Overwrote"), "{}", r.content);
    assert_eq!(std::fs::read(f.path("deep/new/file.txt")).unwrap(), b"");
}

#[tokio::test]
async fn write_file_refuses_a_directory() {
    let f = Fixture::new();
    std::fs::create_dir(f.path("d")).unwrap();
    let r = f
        .call("write_file", json!({"path": "d", "content": "x"}))
        .await;
    assert_eq!(r.status, Failed);
    assert!(r.content.contains("`d` is a directory"), "{}", r.content);
}

#[tokio::test]
async fn edit_file_replaces_exactly_once() {
    let f = Fixture::new();
    f.write("a.rs", "fn a() {}\r\nfn b() {}\n");
    let r = f
        .call(
            "edit_file",
            json!({"path": "a.rs", "old_string": "fn b() {}", "new_string": "fn b() { a() }"}),
        )
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert_eq!(
        std::fs::read_to_string(f.path("a.rs")).unwrap(),
        "fn a() {}\r\nfn b() { a() }\n"
    );
}

#[tokio::test]
async fn edit_file_replace_all_replaces_every_match() {
    let f = Fixture::new();
    f.write("a.txt", "x x x");
    let r = f
        .call(
            "edit_file",
            json!({"path": "a.txt", "old_string": "x", "new_string": "yy", "replace_all": true}),
        )
        .await;
    assert_eq!(r.status, Succeeded);
    assert!(
        r.content.contains("replaced 3 occurrences"),
        "{}",
        r.content
    );
    assert_eq!(
        std::fs::read_to_string(f.path("a.txt")).unwrap(),
        "yy yy yy"
    );
}

#[tokio::test]
async fn edit_file_errors_say_how_many_matched() {
    let f = Fixture::new();
    f.write("a.txt", "x x x");
    let cases = [
        (
            json!({"path": "a.txt", "old_string": "zzz", "new_string": "q"}),
            "(0 matches)",
        ),
        (
            json!({"path": "a.txt", "old_string": "x", "new_string": "q"}),
            "matches 3 times in `a.txt`",
        ),
        (
            json!({"path": "a.txt", "old_string": "x", "new_string": "x"}),
            "identical",
        ),
        (
            json!({"path": "a.txt", "old_string": "", "new_string": "q"}),
            "old_string is empty",
        ),
        (
            json!({"path": "nope.txt", "old_string": "x", "new_string": "q"}),
            "`nope.txt` does not exist; use write_file",
        ),
    ];
    for (args, needle) in cases {
        let r = f.call("edit_file", args.clone()).await;
        assert_eq!(r.status, Failed, "{args}");
        assert!(r.content.contains(needle), "{args}: {}", r.content);
    }
    assert_eq!(
        std::fs::read_to_string(f.path("a.txt")).unwrap(),
        "x x x",
        "failed edits change nothing"
    );
}

#[tokio::test]
async fn edit_file_refuses_non_utf8() {
    let f = Fixture::new();
    std::fs::write(f.path("b"), [0xffu8, 0xfe]).unwrap();
    let r = f
        .call(
            "edit_file",
            json!({"path": "b", "old_string": "x", "new_string": "y"}),
        )
        .await;
    assert_eq!(r.status, Failed);
    assert!(r.content.contains("not UTF-8"), "{}", r.content);
}

#[tokio::test]
async fn list_dir_lists_sorted_with_markers() {
    let f = Fixture::new();
    f.write("b.txt", "");
    f.write("a/inner.txt", "");
    std::os::unix::fs::symlink(f.path("b.txt"), f.path("c")).unwrap();
    let r = f.call("list_dir", json!({"path": "."})).await;
    assert_eq!(r.status, Succeeded);
    assert_eq!(r.content, "a/\nb.txt\nc@\n");
}

#[tokio::test]
async fn list_dir_errors() {
    let f = Fixture::new();
    f.write("file.txt", "");
    let r = f.call("list_dir", json!({"path": "file.txt"})).await;
    assert_eq!(r.status, Failed);
    assert!(
        r.content
            .contains("is a file, not a directory; use read_file"),
        "{}",
        r.content
    );
    let r = f.call("list_dir", json!({"path": "missing"})).await;
    assert!(
        r.content.contains("`missing` does not exist"),
        "{}",
        r.content
    );
}
