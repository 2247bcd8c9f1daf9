//! These run for real: the machine has Landlock (ABI ≥ 3) and seccomp; a missing sandbox fails
//! the probe test loudly instead of skipping.

use keel_tools::policy::{PermissionMode, Policy};
use keel_tools::sandbox::{Sandbox, SandboxMode};
use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use serde_json::json;

use crate::common::Fixture;

fn fixture(mode: SandboxMode) -> Fixture {
    Fixture::with(mode, Policy::new(PermissionMode::Bypass))
}

#[tokio::test]
async fn the_kernel_enforces_both_sandbox_modes() {
    Sandbox::probe(SandboxMode::WorkspaceWrite).await.unwrap();
    Sandbox::probe(SandboxMode::ReadOnly).await.unwrap();
}

#[tokio::test]
async fn write_outside_the_workspace_fails_in_the_sandbox_and_works_without() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped.txt");
    let command = format!("echo pwned > '{}'", target.display());

    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(r.content.contains("Permission denied"), "{}", r.content);
    assert!(
        !target.exists(),
        "the sandbox let a write outside the workspace through (even as root)"
    );

    let f = fixture(SandboxMode::Off);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "pwned\n");
}

#[tokio::test]
async fn tcp_connect_to_localhost_fails_in_the_sandbox_and_works_without() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let command = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");

    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(!r.content.contains("connected"), "{}", r.content);
    assert!(
        r.content.contains("Operation not permitted"),
        "{}",
        r.content
    );

    let f = fixture(SandboxMode::Off);
    let r = f.call("shell", json!({"command": command})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert!(r.content.contains("connected"), "{}", r.content);
}

#[tokio::test]
async fn unix_sockets_stay_allowed_in_the_sandbox() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f
        .call(
            "shell",
            json!({"command": "perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die \"unix: $!\\n\"; print \"unix ok\\n\"; socket(my $t, AF_INET6, SOCK_STREAM, 0) or die \"inet6: $!\\n\"'"}),
        )
        .await;
    assert!(r.content.contains("unix ok"), "{}", r.content);
    assert!(
        r.content.contains("inet6: Operation not permitted"),
        "{}",
        r.content
    );
}

#[tokio::test]
async fn workspace_and_private_temp_are_writable_in_workspace_write() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f
        .call("shell", json!({"command": "echo a > inside.txt && echo b > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" >/dev/null && cat /etc/hostname >/dev/null && echo ok"}))
        .await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    assert_eq!(
        std::fs::read_to_string(f.path("inside.txt")).unwrap(),
        "a\n"
    );
}

#[tokio::test]
async fn read_only_sandbox_refuses_workspace_writes_but_reads() {
    let f = fixture(SandboxMode::ReadOnly);
    f.write("r.txt", "readable\n");
    let r = f
        .call("shell", json!({"command": "cat r.txt && echo x > w.txt"}))
        .await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(r.content.contains("readable"), "{}", r.content);
    assert!(!f.path("w.txt").exists());
}

#[tokio::test]
async fn the_sandbox_binds_only_the_spawned_process_tree() {
    let f = fixture(SandboxMode::WorkspaceWrite);
    let r = f.call("shell", json!({"command": "true"})).await;
    assert_eq!(r.status, Succeeded);
    // The test process itself is still free to write anywhere and open IP sockets.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("free"), "x").unwrap();
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
}
