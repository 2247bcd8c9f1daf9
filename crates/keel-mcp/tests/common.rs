//! Shared fixture: a temp workspace, a tool context, and where the installed servers are.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use keel_mcp::{McpManager, McpServerConfig};
use keel_tools::artifact::FsArtifactSink;
use keel_tools::policy::{PermissionMode, Policy};
use keel_tools::registry::{Dispatch, ToolCallRequest, ToolRegistry};
use keel_tools::sandbox::{Sandbox, SandboxMode};
use keel_tools::tool::{
    ProgressSink, StepSnapshot, ToolContext, ToolLimits, ToolProgress, ToolResult,
};
use keel_tools::workspace::Workspace;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A correctness deadline (not a timing assertion): far more than anything here needs.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until `done` says so; fails the test naming `what` after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < DEADLINE,
            "{what} did not happen within {DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Asserts that `result` succeeded with exactly `content`.
pub fn assert_answer(result: &ToolResult, content: &str) {
    assert_eq!(
        result.status,
        keel_tools::ToolResultStatus::Succeeded,
        "{}",
        result.content
    );
    assert_eq!(result.content, content);
}

/// Asserts that `result` has `status` and its content contains `part`.
pub fn assert_result(result: &ToolResult, status: keel_tools::ToolResultStatus, part: &str) {
    assert_eq!(result.status, status, "{}", result.content);
    assert!(result.content.contains(part), "{}", result.content);
}

/// Where `.ci/run` installs the npm and PyPI servers (override with `KEEL_MCP_SERVERS_DIR`).
pub fn servers_dir() -> PathBuf {
    std::env::var_os("KEEL_MCP_SERVERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel-ci/mcp")
        })
}

/// An installed server program; a missing one fails the test with how to install it.
pub fn installed(relative: &str) -> String {
    let path = servers_dir().join(relative);
    assert!(
        path.exists(),
        "{} is not installed: run .ci/run (or the README's \"MCP test servers\" commands) to install the MCP servers the tests run",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// The crate's test server.
pub fn test_server() -> String {
    env!("CARGO_BIN_EXE_keel-mcp-test-server").to_owned()
}

/// Progress reports, recorded.
#[derive(Default)]
pub struct Recorded(pub Mutex<Vec<(String, ToolProgress)>>);

impl ProgressSink for Recorded {
    fn report(&self, call_id: &str, progress: ToolProgress) {
        self.0.lock().unwrap().push((call_id.to_owned(), progress));
    }
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub _data: tempfile::TempDir,
    pub manager: McpManager,
    pub registry: ToolRegistry,
    pub ctx: ToolContext,
    pub progress: Arc<Recorded>,
    pub notices: Vec<String>,
}

pub fn stdio(command: &str, args: &[&str]) -> McpServerConfig {
    McpServerConfig {
        command: Some(command.to_owned()),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..McpServerConfig::default()
    }
}

impl Fixture {
    /// Starts `servers` in a fresh workspace (prepared by `setup`) and registers their tools.
    pub async fn start(
        setup: impl FnOnce(&std::path::Path) -> Vec<(&'static str, McpServerConfig)>,
    ) -> Self {
        Self::start_with(setup, Policy::new(PermissionMode::Bypass)).await
    }

    pub async fn start_with(
        setup: impl FnOnce(&std::path::Path) -> Vec<(&'static str, McpServerConfig)>,
        policy: Policy,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let data = tempfile::tempdir().unwrap();
        let configs: BTreeMap<String, McpServerConfig> = setup(&root)
            .into_iter()
            .map(|(n, c)| (n.to_owned(), c))
            .collect();
        let manager = McpManager::new(&configs, &root, &[]).unwrap();
        let mut notices = manager.start().await;
        let (registry, left_out) = manager.extend(&ToolRegistry::new()).await;
        notices.extend(left_out);
        let progress = Arc::new(Recorded::default());
        let ctx = ToolContext {
            call_id: "call_1".into(),
            cancel: CancellationToken::new(),
            progress: progress.clone(),
            workspace: Workspace::new(&root).unwrap(),
            sandbox: Sandbox::new(SandboxMode::Off).unwrap(),
            artifacts: Arc::new(FsArtifactSink::new(data.path().join("artifacts"))),
            snapshot: Arc::new(StepSnapshot {
                step_id: "step_1".into(),
                policy,
            }),
            limits: ToolLimits::default(),
            hash_key: keel_tools::keyed_hash::HashKey::derive(b"test deployment", "test"),
            scope: None,
            session: None,
        };
        Self {
            dir,
            _data: data,
            manager,
            registry,
            ctx,
            progress,
            notices,
        }
    }

    /// Dispatches a call through the registry (validation, policy, execution, budget).
    pub async fn call(&self, name: &str, args: Value) -> ToolResult {
        self.call_with(&self.ctx, name, args).await
    }

    pub async fn call_with(&self, ctx: &ToolContext, name: &str, args: Value) -> ToolResult {
        let request = ToolCallRequest {
            call_id: ctx.call_id.clone(),
            name: name.into(),
            arguments: args,
        };
        match self.registry.dispatch(&request, ctx).await {
            Dispatch::Finished(result) => result,
            Dispatch::NeedsApproval { decision, .. } => {
                panic!("unexpected ask: {}", decision.reason)
            }
        }
    }

    /// The names the model sees, sorted.
    pub fn names(&self) -> Vec<String> {
        self.registry.specs().into_iter().map(|s| s.name).collect()
    }
}
