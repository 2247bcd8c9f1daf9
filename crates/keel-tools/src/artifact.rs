//! Artifacts: full tool outputs stored outside the transcript (the model sees a capped view and a
//! pointer it can read back with `read_file {"path": "artifact://<id>"}`).
//!
//! [`ArtifactSink`] is where they go: [`StoreArtifactSink`] keeps them in the [`Store`]'s
//! artifacts table, owned by the session (the runtime's choice); [`FsArtifactSink`] keeps them as
//! files in a directory (embedding without a store). Either way `artifact://<id>` can only name
//! an artifact of this sink: ids are checked, and a store artifact of another session is "not
//! found".

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use keel_core::ids::{SessionId, TenantId};
use keel_store::{Store, StoreError};

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
    /// Stores `bytes` as artifact `name` of tool call `call_id` and returns where it is. Storing
    /// the same call and name again is harmless (a re-run after a crash): the file sink replaces
    /// the artifact, the store sink adds a new one.
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

/// Whether `id` is an artifact id as [`artifact_id`] makes them: `[A-Za-z0-9._-]+`, not
/// starting with `.` (so never `.` or `..`).
pub fn valid_id(id: &str) -> bool {
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
        let path = self.dir.join(id);
        let read = tokio::task::spawn_blocking(move || read_regular_file(&path))
            .await
            .map_err(|e| std::io::Error::other(format!("the read task failed: {e}")))
            .and_then(|r| r);
        read.map_err(|e| ToolsError::Artifact {
            id: id.to_owned(),
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                "no such artifact; use the exact artifact://<id> a truncated result names".into()
            } else {
                e.to_string()
            },
        })
    }
}

/// Reads the artifact file at `path`: opened without following a symlink and without blocking,
/// and only when the open handle is a regular file (a FIFO or device put in the artifacts
/// directory would otherwise block the read or never end it).
fn read_regular_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let flags =
        rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                std::io::Error::other(
                    "it is a symlink, not a regular file; artifacts are regular files",
                )
            } else {
                e
            }
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::other(format!(
            "it is {}, not a regular file; artifacts are regular files",
            crate::files::kind_name(&kind)
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Artifacts in the [`Store`], owned by one session of one tenant.
pub struct StoreArtifactSink {
    store: Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
}

impl StoreArtifactSink {
    /// Stores artifacts of `session` (which must exist in `store`) for `tenant`.
    pub fn new(store: Arc<dyn Store>, tenant: TenantId, session: SessionId) -> Self {
        Self {
            store,
            tenant,
            session,
        }
    }
}

impl std::fmt::Debug for StoreArtifactSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreArtifactSink")
            .field("store", &self.store.backend())
            .field("tenant", &self.tenant)
            .field("session", &self.session)
            .finish()
    }
}

#[async_trait]
impl ArtifactSink for StoreArtifactSink {
    async fn put(
        &self,
        call_id: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<ArtifactRef, ToolsError> {
        let size_bytes = bytes.len() as u64;
        let id = self
            .store
            .put_artifact(
                self.tenant,
                self.session,
                &artifact_id(call_id, name),
                "text/plain; charset=utf-8",
                &bytes,
            )
            .await
            .map_err(|e| ToolsError::Artifact {
                id: artifact_id(call_id, name),
                reason: format!("cannot store it: {e}"),
            })?;
        Ok(ArtifactRef { id, size_bytes })
    }

    async fn get(&self, id: &str) -> Result<Vec<u8>, ToolsError> {
        let not_found = || ToolsError::Artifact {
            id: id.to_owned(),
            reason: "no such artifact; use the exact artifact://<id> a truncated result names"
                .into(),
        };
        if !valid_id(id) {
            return Err(not_found());
        }
        match self.store.get_artifact(self.tenant, id).await {
            // Another session's artifact is not this session's to read.
            Ok(artifact) if artifact.session_id == self.session => Ok(artifact.data),
            Ok(_) | Err(StoreError::NotFound { .. }) => Err(not_found()),
            Err(e) => Err(ToolsError::Artifact {
                id: id.to_owned(),
                reason: format!("cannot read it: {e}"),
            }),
        }
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
