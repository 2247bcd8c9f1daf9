//! Against the crate's own test server (rmcp's server side, over stdio): list changes in both
//! protocol revisions, a server killed mid-call, one that never answers, cancellation, progress,
//! roots, declined sampling and elicitation, and policy's refusal to trust a read-only hint.

use std::time::{Duration, Instant};

use keel_mcp::{McpServerConfig, ServerState};
use keel_tools::ToolResultStatus;
use keel_tools::policy::{PermissionMode, Policy, Verdict};
use keel_tools::registry::ToolCallRequest;
use keel_tools::tool::ToolProgress;
use serde_json::json;

use crate::common::{
    DEADLINE, Fixture, assert_answer, assert_result, eventually, stdio, test_server,
};

fn server(args: &[&str]) -> McpServerConfig {
    stdio(&test_server(), args)
}

async fn fixture(args: &'static [&'static str]) -> Fixture {
    Fixture::start(|_| vec![("t", server(args))]).await
}

#[tokio::test]
async fn tools_appear_with_prefixed_names_in_both_revisions() {
    for args in [&[][..], &["--legacy"][..]] {
        let f = Fixture::start(|_| vec![("t", server(args))]).await;
        assert!(f.notices.is_empty(), "{:?}", f.notices);
        let names = f.names();
        assert!(names.contains(&"mcp__t__echo".to_owned()), "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("mcp__t__")), "{names:?}");
        let expected = if args.is_empty() {
            "2026-07-28"
        } else {
            "2025-11-25"
        };
        let state = f.manager.servers()["t"].state();
        assert_eq!(
            state,
            ServerState::Ready {
                protocol: expected.into()
            },
            "{args:?}"
        );
        let result = f.call("mcp__t__echo", json!({"text": "hello"})).await;
        assert_answer(&result, "hello");
        f.manager.shutdown().await;
    }
}

#[tokio::test]
async fn arguments_are_validated_against_the_servers_schema_before_any_call() {
    let f = fixture(&[]).await;
    let result = f.call("mcp__t__echo", json!({"text": 5})).await;
    assert_eq!(result.status, ToolResultStatus::Rejected);
    assert!(
        result.content.contains("field `text`"),
        "{}",
        result.content
    );
    let result = f
        .call("mcp__t__echo", json!({"text": "a", "other": 1}))
        .await;
    assert_eq!(
        result.status,
        ToolResultStatus::Rejected,
        "{}",
        result.content
    );
    f.manager.shutdown().await;
}

#[tokio::test]
async fn a_tool_list_change_shows_in_the_next_listing_in_both_revisions() {
    for args in [&[][..], &["--legacy"][..]] {
        let f = Fixture::start(|_| vec![("t", server(args))]).await;
        assert!(!f.names().contains(&"mcp__t__extra".to_owned()));
        let result = f.call("mcp__t__add_tool", json!({})).await;
        assert_eq!(
            result.status,
            ToolResultStatus::Succeeded,
            "{}",
            result.content
        );
        // The registry this step was built from does not change under it.
        assert!(!f.names().contains(&"mcp__t__extra".to_owned()));
        let server = &f.manager.servers()["t"];
        eventually("a tool-list change", || server.tools_changed()).await;
        let (tools, notices) = f.manager.tools().await;
        assert!(notices.is_empty(), "{notices:?}");
        let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        assert!(names.contains(&"mcp__t__extra"), "{args:?}: {names:?}");
        f.manager.shutdown().await;
    }
}

#[tokio::test]
async fn a_server_killed_mid_call_gives_an_error_result_and_is_restarted() {
    let f = fixture(&[]).await;
    let started = Instant::now();
    let result = f.call("mcp__t__die", json!({})).await;
    assert!(started.elapsed() < DEADLINE);
    assert_result(&result, ToolResultStatus::Failed, "exited during `die`");
    assert!(
        result.content.contains("dying on purpose"),
        "stderr tail: {}",
        result.content
    );
    assert!(!result.not_performed, "a call in flight may have acted");
    assert!(matches!(
        f.manager.servers()["t"].state(),
        ServerState::Exited { .. }
    ));
    let result = f.call("mcp__t__echo", json!({"text": "again"})).await;
    assert_answer(&result, "again");
    f.manager.shutdown().await;
}

#[tokio::test]
async fn a_call_that_is_never_answered_times_out_with_cancellation() {
    let f = fixture(&[]).await;
    let mut ctx = f.ctx.clone();
    ctx.limits.shell_max_timeout_ms = 300;
    let result = f.call_with(&ctx, "mcp__t__hang", json!({})).await;
    assert_eq!(
        result.status,
        ToolResultStatus::Failed,
        "{}",
        result.content
    );
    assert!(
        result
            .content
            .contains("did not answer `hang` within 300 ms"),
        "{}",
        result.content
    );
    assert_eq!(result.details["timed_out"], true);
    // The connection is still usable.
    let result = f.call("mcp__t__echo", json!({"text": "still here"})).await;
    assert_eq!(result.content, "still here");
    f.manager.shutdown().await;
}

#[tokio::test]
async fn a_server_that_never_answers_its_handshake_is_a_notice_within_the_startup_bound() {
    let started = Instant::now();
    let f = Fixture::start(|_| {
        let mut hung = server(&["--hang"]);
        hung.startup_timeout_ms = Some(500);
        vec![("hung", hung), ("ok", server(&[]))]
    })
    .await;
    assert!(started.elapsed() < DEADLINE);
    assert_eq!(f.notices.len(), 1, "{:?}", f.notices);
    assert!(
        f.notices[0].contains("`hung` did not answer its handshake and tool listing within 500 ms"),
        "{:?}",
        f.notices
    );
    assert!(f.names().iter().all(|n| n.starts_with("mcp__ok__")));
    assert!(matches!(
        f.manager.servers()["hung"].state(),
        ServerState::Failed { .. }
    ));
    f.manager.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_call_sends_the_protocols_cancellation() {
    let marker = tempfile::tempdir().unwrap();
    let path = marker.path().join("cancelled");
    let path_arg = path.to_string_lossy().into_owned();
    let f =
        Fixture::start(move |_| vec![("t", stdio(&test_server(), &["--marker", &path_arg]))]).await;
    let ctx = f.ctx.clone();
    let cancel = ctx.cancel.clone();
    // Cancel once the call is in flight.
    let call = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let result = f.call_with(&ctx, "mcp__t__wait_cancel", json!({})).await;
    call.await.unwrap();
    assert_result(
        &result,
        ToolResultStatus::Cancelled,
        "notifications/cancelled sent",
    );
    eventually("the server seeing notifications/cancelled", || async {
        path.exists()
    })
    .await;
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "cancelled");
    f.manager.shutdown().await;
}

#[tokio::test]
async fn progress_notifications_become_tool_progress() {
    let f = fixture(&[]).await;
    let result = f.call("mcp__t__progress", json!({"steps": 3})).await;
    assert_eq!(result.content, "did 3 steps");
    let seen = f.progress.0.lock().unwrap().clone();
    let texts: Vec<String> = seen
        .iter()
        .map(|(call, p)| match p {
            ToolProgress::Status { text } => format!("{call}: {text}"),
            other => format!("{call}: {other:?}"),
        })
        .collect();
    // Notifications may arrive after the answer; every one that arrived is routed correctly.
    assert!(texts.len() <= 3);
    for text in &texts {
        assert!(text.starts_with("call_1: progress "), "{text}");
    }
    f.manager.shutdown().await;
}

#[tokio::test]
async fn roots_answer_the_workspace_and_sampling_and_elicitation_are_declined() {
    let f = fixture(&["--legacy"]).await;
    let root = f.dir.path().canonicalize().unwrap();
    let result = f.call("mcp__t__roots", json!({})).await;
    let roots: serde_json::Value =
        serde_json::from_str(&result.content).unwrap_or_else(|e| panic!("{e}: {}", result.content));
    assert_eq!(
        roots["roots"][0]["uri"],
        format!("file://{}", root.display())
    );
    let result = f.call("mcp__t__sample", json!({})).await;
    assert!(
        result.content.contains("sampling refused")
            && result.content.contains("keel declines sampling"),
        "{}",
        result.content
    );
    let result = f.call("mcp__t__elicit", json!({})).await;
    assert!(
        result.content.contains("elicitation refused")
            && result.content.contains("keel declines elicitation"),
        "{}",
        result.content
    );
    f.manager.shutdown().await;
}

#[tokio::test]
async fn is_error_results_fail() {
    let f = fixture(&[]).await;
    let result = f.call("mcp__t__fail", json!({})).await;
    assert_eq!(result.status, ToolResultStatus::Failed);
    assert_eq!(result.content, "it failed on purpose");
    f.manager.shutdown().await;
}

#[tokio::test]
async fn a_read_only_hint_informs_recovery_but_never_skips_the_question() {
    let f = Fixture::start_with(
        |_| vec![("t", server(&[]))],
        Policy::new(PermissionMode::Default),
    )
    .await;
    let peek = f.registry.get("mcp__t__peek").unwrap();
    assert_eq!(peek.effect(), keel_tools::EffectClass::ReadOnly);
    for mode in [PermissionMode::Default, PermissionMode::AcceptEdits] {
        let call = f
            .registry
            .validate(&ToolCallRequest {
                call_id: "c".into(),
                name: "mcp__t__peek".into(),
                arguments: json!({}),
            })
            .unwrap();
        let (decision, _) = f
            .registry
            .authorize(&call, &f.ctx.workspace, &Policy::new(mode));
        assert_eq!(
            decision.verdict,
            Verdict::Ask,
            "{mode:?}: {}",
            decision.reason
        );
        assert!(
            decision.reason.contains("readOnlyHint"),
            "{}",
            decision.reason
        );
    }
    // A built-in read-only tool still runs without asking (the comparison the rule is about).
    let builtin = keel_tools::ToolRegistry::with_builtins().unwrap();
    let call = builtin
        .validate(&ToolCallRequest {
            call_id: "c".into(),
            name: "list_dir".into(),
            arguments: json!({"path": "."}),
        })
        .unwrap();
    let (decision, _) = builtin.authorize(
        &call,
        &f.ctx.workspace,
        &Policy::new(PermissionMode::Default),
    );
    assert_eq!(decision.verdict, Verdict::Allow);
    f.manager.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_the_server_process() {
    let f = fixture(&[]).await;
    let pid = f.manager.servers()["t"]
        .pid()
        .await
        .expect("a stdio server has a pid");
    let proc = format!("/proc/{pid}");
    assert!(std::path::Path::new(&proc).exists());
    f.manager.shutdown().await;
    assert!(matches!(
        f.manager.servers()["t"].state(),
        ServerState::Stopped
    ));
    eventually("the server process ending", || async {
        !std::path::Path::new(&proc).exists()
    })
    .await;
}
