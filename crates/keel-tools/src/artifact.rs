//! Artifacts: full tool outputs stored outside the transcript (the model sees a capped view and a
//! pointer it can read back with `read_file {"path": "artifact://<id>"}`).
//!
//! [`ArtifactSink`] is the seam the runtime wires to the store's artifacts table;
//! [`FsArtifactSink`] keeps them as files in a directory (the session's data dir).

use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::ToolsError;

/// Prefix of a path that names an artifact instead of a workspace file.
pub const ARTIFACT_SCHEME: &str = "artifact://";

/// A stored artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    /// Id, `[A-Za-z0-9._-]+`; read it back as `artifact://<id>`.
    pub id: String,
    /// Size in bytes.
    pub size_bytes: u64,
}

impl ArtifactRef {
    /// The `read_file` path that reads this artifact.
    pub fn uri(&self) -> String {
        format!("{ARTIFACT_SCHEME}{}", self.id)
    }
}

/// Where full outputs go.
#[async_trait]
pub trait ArtifactSink: Send + Sync {
    /// Stores `bytes` as artifact `name` of tool call `call_id`; storing the same call and name
    /// again replaces it (so a re-run after a crash is harmless).
    ///
    /// Errors: [`ToolsError::Artifact`] when it cannot be stored.
    async fn put(
        &self,
        call_id: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<ArtifactRef, ToolsError>;

    /// Reads artifact `id` back.
    ///
    /// Errors: [`ToolsError::Artifact`] when it does not exist or cannot be read.
    async fn get(&self, id: &str) -> Result<Vec<u8>, ToolsError>;
}

/// Artifacts as files `<dir>/<id>`.
#[derive(Debug, Clone)]
pub struct FsArtifactSink {
    dir: PathBuf,
}

impl FsArtifactSink {
    /// Stores artifacts in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

/// The artifact id for `name` of call `call_id`: both sanitized to `[A-Za-z0-9._-]`.
pub fn artifact_id(call_id: &str, name: &str) -> String {
    let clean = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>()
    };
    format!("{}.{}", clean(call_id), clean(name))
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[async_trait]
impl ArtifactSink for FsArtifactSink {
    async fn put(
        &self,
        call_id: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<ArtifactRef, ToolsError> {
        let id = artifact_id(call_id, name);
        let err = |reason: String| ToolsError::Artifact {
            id: id.clone(),
            reason,
        };
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| err(format!("cannot create {}: {e}", self.dir.display())))?;
        let size_bytes = bytes.len() as u64;
        let tmp = self.dir.join(format!(".{id}.tmp"));
        tokio::fs::write(&tmp, bytes)
            .await
            .map_err(|e| err(format!("cannot write {}: {e}", tmp.display())))?;
        tokio::fs::rename(&tmp, self.dir.join(&id))
            .await
            .map_err(|e| err(format!("cannot rename into place: {e}")))?;
        Ok(ArtifactRef { id, size_bytes })
    }

    async fn get(&self, id: &str) -> Result<Vec<u8>, ToolsError> {
        if !valid_id(id) {
            return Err(ToolsError::Artifact {
                id: id.to_owned(),
                reason: "not a valid artifact id (ids are [A-Za-z0-9._-]+); use the exact artifact://<id> a truncated result names".into(),
            });
        }
        tokio::fs::read(self.dir.join(id))
            .await
            .map_err(|e| ToolsError::Artifact {
                id: id.to_owned(),
                reason: if e.kind() == std::io::ErrorKind::NotFound {
                    "no such artifact; use the exact artifact://<id> a truncated result names"
                        .into()
                } else {
                    e.to_string()
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_then_get_round_trips_and_ids_cannot_escape() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FsArtifactSink::new(dir.path().join("artifacts"));
        let r = sink
            .put("call/1", "shell output", b"hello".to_vec())
            .await
            .unwrap();
        assert_eq!(r.id, "call_1.shell_output");
        assert_eq!(r.size_bytes, 5);
        assert_eq!(sink.get(&r.id).await.unwrap(), b"hello");
        assert!(sink.get("../etc/passwd").await.is_err());
        assert!(sink.get("missing").await.is_err());
    }
}
