use keel_tools::error::ToolsError;
use keel_tools::tool::ToolResultStatus;
use keel_tools::workspace::Workspace;
use serde_json::json;

use crate::common::Fixture;

fn refused(ws: &Workspace, path: &str) -> String {
    match ws.resolve(path) {
        Err(ToolsError::PathRefused { reason, .. }) => reason,
        other => panic!("{path} should be refused, got {other:?}"),
    }
}

#[test]
fn dot_dot_out_of_the_workspace_is_refused() {
    let f = Fixture::new();
    let reason = refused(&f.ctx.workspace, "../outside.txt");
    assert!(reason.contains("outside the workspace"), "{reason}");
    refused(&f.ctx.workspace, "a/../../outside.txt");
}

#[test]
fn absolute_paths_outside_are_refused_and_inside_are_accepted() {
    let f = Fixture::new();
    let reason = refused(&f.ctx.workspace, "/etc/passwd");
    assert!(reason.contains("absolute path elsewhere"), "{reason}");
    let inside = f.path("x.txt");
    let r = f.ctx.workspace.resolve(inside.to_str().unwrap()).unwrap();
    assert_eq!(r.relative, "x.txt");
}

#[test]
fn symlinked_directory_pointing_out_is_refused() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path(), f.path("escape")).unwrap();
    let reason = refused(&f.ctx.workspace, "escape/secret");
    assert!(reason.contains("symlink that points outside"), "{reason}");
    refused(&f.ctx.workspace, "escape/new-file");
}

#[test]
fn symlinked_file_pointing_out_is_refused() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), f.path("link")).unwrap();
    refused(&f.ctx.workspace, "link");
}

#[test]
fn dangling_symlink_is_refused_so_a_write_cannot_create_its_target() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path().join("created"), f.path("dangling")).unwrap();
    let reason = refused(&f.ctx.workspace, "dangling");
    assert!(reason.contains("does not exist"), "{reason}");
}

#[test]
fn symlink_inside_the_workspace_is_followed() {
    let f = Fixture::new();
    f.write("real/a.txt", "a");
    std::os::unix::fs::symlink(f.path("real"), f.path("alias")).unwrap();
    assert_eq!(
        f.ctx.workspace.resolve("alias/a.txt").unwrap().relative,
        "real/a.txt"
    );
}

#[tokio::test]
async fn tools_report_escapes_as_failed_results_and_touch_nothing() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), f.path("escape")).unwrap();
    let w = f
        .call(
            "write_file",
            json!({"path": "escape/pwned", "content": "x"}),
        )
        .await;
    assert_eq!(w.status, ToolResultStatus::Failed);
    assert!(
        w.content.contains("points outside the workspace"),
        "{}",
        w.content
    );
    assert!(!outside.path().join("pwned").exists());
    let r = f
        .call("read_file", json!({"path": "../../etc/passwd"}))
        .await;
    assert_eq!(r.status, ToolResultStatus::Failed);
    assert!(r.content.contains("outside the workspace"), "{}", r.content);
    let l = f.call("list_dir", json!({"path": "escape"})).await;
    assert_eq!(l.status, ToolResultStatus::Failed);
    let g = f
        .call("grep", json!({"pattern": "x", "path": "/etc"}))
        .await;
    assert_eq!(g.status, ToolResultStatus::Failed);
    let s = f
        .call("shell", json!({"command": "pwd", "workdir": ".."}))
        .await;
    assert_eq!(s.status, ToolResultStatus::Failed);
    assert!(s.content.contains("outside the workspace"), "{}", s.content);
}

#[tokio::test]
async fn deny_rule_reaches_through_a_symlink_alias() {
    let f = secrets_denied();
    std::os::unix::fs::symlink(f.path("secrets"), f.path("docs")).unwrap();
    let r = f.call("read_file", json!({"path": "docs/key"})).await;
    assert_eq!(r.status, ToolResultStatus::Rejected, "{}", r.content);
    assert!(
        r.content.contains("deny read_file(./secrets/**)"),
        "{}",
        r.content
    );
    let w = f
        .call("write_file", json!({"path": "docs/key", "content": "x"}))
        .await;
    assert_eq!(w.status, ToolResultStatus::Rejected, "{}", w.content);
}

#[tokio::test]
async fn a_path_deny_reaches_shell_commands_naming_the_path_by_any_route() {
    let f = secrets_denied();
    f.write("src/a.txt", "a");
    std::os::unix::fs::symlink(f.path("secrets"), f.path("docs")).unwrap();
    let absolute = f.path("secrets/key");
    for (command, workdir) in [
        ("cat secrets/key", "."),
        ("cat docs/key", "."),
        ("cat ../secrets/key", "src"),
        ("cat key", "secrets"),
        ("ls", "secrets"),
        (&format!("cat {}", absolute.display()) as &str, "."),
    ] {
        let r = f
            .call("shell", json!({"command": command, "workdir": workdir}))
            .await;
        assert_eq!(
            r.status,
            ToolResultStatus::Rejected,
            "{command} in {workdir}: {}",
            r.content
        );
        assert!(
            r.content.contains("deny read_file(./secrets/**)"),
            "{command}: {}",
            r.content
        );
    }
    let ok = f.call("shell", json!({"command": "cat src/a.txt"})).await;
    assert_eq!(ok.status, ToolResultStatus::Succeeded, "{}", ok.content);
}

/// Bypass mode with `deny read_file(./secrets/**)` and a file `secrets/key`.
fn secrets_denied() -> Fixture {
    use keel_tools::policy::{PermissionMode, Policy, Rule};
    let f = Fixture::with(
        keel_tools::sandbox::SandboxMode::Off,
        Policy::new(PermissionMode::Bypass)
            .with_rule(Rule::deny("read_file(./secrets/**)").unwrap()),
    );
    f.write("secrets/key", "k");
    f
}

/// Symlinks that stay inside the workspace keep working with every file tool (relative and
/// absolute targets): they are resolved when the path is checked, and the use opens the real
/// path beneath the root.
#[tokio::test]
async fn file_tools_work_through_symlinks_that_stay_inside() {
    let f = Fixture::new();
    f.write("real/a.txt", "alpha\n");
    std::os::unix::fs::symlink("real", f.path("rel-alias")).unwrap();
    std::os::unix::fs::symlink(f.path("real"), f.path("abs-alias")).unwrap();
    std::os::unix::fs::symlink("real/a.txt", f.path("file-alias")).unwrap();
    for path in ["rel-alias/a.txt", "abs-alias/a.txt", "file-alias"] {
        let r = f.call("read_file", json!({"path": path})).await;
        assert_eq!(
            r.status,
            ToolResultStatus::Succeeded,
            "{path}: {}",
            r.content
        );
        assert!(r.content.contains("alpha"), "{path}: {}", r.content);
    }
    let w = f
        .call(
            "write_file",
            json!({"path": "file-alias", "content": "beta\n"}),
        )
        .await;
    assert_eq!(w.status, ToolResultStatus::Succeeded, "{}", w.content);
    assert!(
        std::fs::symlink_metadata(f.path("file-alias"))
            .unwrap()
            .is_symlink(),
        "the symlink is written through, not replaced"
    );
    let e = f
        .call(
            "edit_file",
            json!({"path": "abs-alias/a.txt", "old_string": "beta", "new_string": "gamma"}),
        )
        .await;
    assert_eq!(e.status, ToolResultStatus::Succeeded, "{}", e.content);
    let n = f
        .call(
            "write_file",
            json!({"path": "rel-alias/new/b.txt", "content": "b"}),
        )
        .await;
    assert_eq!(n.status, ToolResultStatus::Succeeded, "{}", n.content);
    assert_eq!(
        std::fs::read_to_string(f.path("real/a.txt")).unwrap(),
        "gamma\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.path("real/new/b.txt")).unwrap(),
        "b"
    );
    let l = f.call("list_dir", json!({"path": "rel-alias"})).await;
    assert_eq!(l.content, "a.txt\nnew/\n");
    let g = f
        .call("grep", json!({"pattern": "gamma", "path": "abs-alias"}))
        .await;
    assert_eq!(g.content, "real/a.txt:1:gamma\n");
}
