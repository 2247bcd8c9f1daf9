//! Artifacts kept in a real SQLite store, owned by the session: the full output of a capped shell
//! call is read back through `artifact://<id>`, and another session cannot read it.

use std::sync::Arc;

use keel_core::ids::SessionId;
use keel_tools::artifact::{ArtifactSink, StoreArtifactSink};
use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use serde_json::json;

use crate::common::{Durable, Fixture};

#[tokio::test]
async fn capped_shell_output_is_stored_in_the_store_and_read_back_only_by_its_session() {
    let db = Durable::new().await;
    let mut f = Fixture::new();
    f.ctx.artifacts = Arc::new(StoreArtifactSink::new(
        Arc::clone(&db.store),
        db.tenant,
        db.session,
    ));
    f.ctx.limits.shell_output_cap_bytes = 200;
    let r = f.call("shell", json!({"command": "seq 1 5000"})).await;
    assert_eq!(r.status, Succeeded, "{}", r.content);
    let artifact = r.artifact.clone().unwrap();
    assert!(
        r.content
            .contains(&format!("read_file {{\"path\": \"{}\"}}", artifact.uri())),
        "{}",
        r.content
    );
    let back = f
        .call(
            "read_file",
            json!({"path": artifact.uri(), "offset": 4999, "limit": 2}),
        )
        .await;
    assert_eq!(back.status, Succeeded, "{}", back.content);
    assert_eq!(back.content, "  4999\t4999\n  5000\t5000\n");

    // The same id through another session's sink (same tenant) is not found.
    let other_session = Durable::new().await;
    let stranger = StoreArtifactSink::new(Arc::clone(&db.store), db.tenant, SessionId::new());
    assert!(stranger.get(&artifact.id).await.is_err());
    let mut g = Fixture::new();
    g.ctx.artifacts = Arc::new(StoreArtifactSink::new(
        Arc::clone(&other_session.store),
        other_session.tenant,
        other_session.session,
    ));
    let denied = g.call("read_file", json!({"path": artifact.uri()})).await;
    assert_eq!(denied.status, Failed);
    assert!(
        denied.content.contains("no such artifact"),
        "{}",
        denied.content
    );
}
