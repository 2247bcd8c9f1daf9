//! Shared fixture: a temp workspace, a context and a registry with the built-in tools.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::ids::{SessionId, TenantId};
use keel_store::{NewSession, SqlStore, Store};
use keel_tools::approval::ApprovalService;
use keel_tools::artifact::FsArtifactSink;
use keel_tools::policy::{PermissionMode, Policy};
use keel_tools::registry::{Dispatch, ToolCallRequest, ToolRegistry};
use keel_tools::sandbox::{Sandbox, SandboxMode};
use keel_tools::tool::{NoProgress, StepSnapshot, ToolContext, ToolLimits, ToolResult};
use keel_tools::workspace::Workspace;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub _data: tempfile::TempDir,
    pub registry: ToolRegistry,
    pub ctx: ToolContext,
}

impl Fixture {
    pub fn new() -> Self {
        Self::with(SandboxMode::Off, Policy::new(PermissionMode::Bypass))
    }

    pub fn with(mode: SandboxMode, policy: Policy) -> Self {
        register_launcher();
        let dir = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let ctx = ToolContext {
            call_id: "call_1".into(),
            cancel: CancellationToken::new(),
            progress: Arc::new(NoProgress),
            workspace: Workspace::new(dir.path()).unwrap(),
            sandbox: Sandbox::new(mode).unwrap(),
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
            registry: ToolRegistry::with_builtins().unwrap(),
            ctx,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// Dispatches a call; panics if it needs approval.
    pub async fn call(&self, name: &str, args: Value) -> ToolResult {
        let request = ToolCallRequest {
            call_id: self.ctx.call_id.clone(),
            name: name.into(),
            arguments: args,
        };
        match self.registry.dispatch(&request, &self.ctx).await {
            Dispatch::Finished(result) => result,
            Dispatch::NeedsApproval { decision, .. } => {
                panic!("unexpected ask: {}", decision.reason)
            }
        }
    }
}

/// The sandbox launcher of these tests: this crate's `keel-sandbox` binary.
pub fn register_launcher() {
    keel_tools::sandbox::set_launcher(keel_tools::sandbox::Launcher::new(env!(
        "CARGO_BIN_EXE_keel-sandbox"
    )));
}

/// A real SQLite store in a temp dir with one session, and an approval service over it.
pub struct Durable {
    pub _dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
    pub store: Arc<dyn Store>,
    pub tenant: TenantId,
    pub session: SessionId,
}

impl Durable {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&path).await.unwrap());
        let tenant = TenantId::new();
        let session = SessionId::new();
        store
            .create_session(
                tenant,
                NewSession {
                    session_id: session,
                    release_id: keel_core::ReleaseId::from("sha256:test"),
                    parent_session_id: None,
                    metadata: json!({}),
                },
            )
            .await
            .unwrap();
        Self {
            _dir: dir,
            path,
            store,
            tenant,
            session,
        }
    }

    pub fn service(&self, ttl: chrono::Duration) -> ApprovalService {
        ApprovalService::new(Arc::clone(&self.store), self.tenant).with_ttl(ttl)
    }
}
