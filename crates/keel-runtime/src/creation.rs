//! Creating sessions: [`Runtime::create_session`], [`Runtime::create_session_held`] (the
//! lease kept for what this runtime does next with the session) and
//! [`Runtime::release_held`].

use keel_core::{Correlation, EventBody, Release, SessionId, TenantId};
use keel_store::NewSession;

use crate::config::SessionConfig;
use crate::error::{Result, RuntimeError};
use crate::hold::Held;
use crate::runtime::Runtime;

impl Runtime {
    /// Creates a session pinned to `release` with `config`: stores the release, creates the
    /// session row and journals `session.created` (config redacted). Nothing runs yet. What
    /// runs is the release (see [`crate::pinned`]); `config` holds the settings.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a bad config (an `allow` rule among them: it belongs
    /// to the release) or a release whose id or policy is wrong (nothing written); store errors.
    pub async fn create_session(
        &self,
        tenant: TenantId,
        release: &Release,
        config: SessionConfig,
    ) -> Result<SessionId> {
        self.create_session_with_id(tenant, SessionId::new(), release, config, false)
            .await
    }

    /// As [`Runtime::create_session`], and keeps the session's lease for this process
    /// afterwards: the operations that follow here ([`Runtime::submit_prompt`], settings,
    /// decisions, cancels) use it instead of taking and releasing the lease each (a durable
    /// commit each way), and [`Runtime::run`] runs under it and releases it when it returns.
    /// The lease is renewed while kept; give it back with [`Runtime::release_held`] when the
    /// session will not be run here (until then no other worker can run it, and a process that
    /// exits holding it leaves a lease other processes of this host take over at once and
    /// remote workers after its TTL, as after a crash).
    ///
    /// # Errors
    /// As [`Runtime::create_session`] (nothing is kept then).
    pub async fn create_session_held(
        &self,
        tenant: TenantId,
        release: &Release,
        config: SessionConfig,
    ) -> Result<SessionId> {
        self.create_session_with_id(tenant, SessionId::new(), release, config, true)
            .await
    }

    /// Gives back the lease [`Runtime::create_session_held`] kept for `session`, if it is still
    /// kept (a run took it over, or it was lost: nothing to do). Errors of the store's release
    /// are logged (the lease then expires after its TTL).
    pub async fn release_held(&self, tenant: TenantId, session: SessionId) {
        self.inner.release_parked(tenant, session).await;
    }

    /// As [`Runtime::create_session`], under the id `session`: a child session
    /// ([`SessionConfig::subagent`] set) records its parent in the store row and in
    /// `session.created`'s correlation (`parent_session_id`, and the parent's `tool_call_id`).
    pub(crate) async fn create_session_with_id(
        &self,
        tenant: TenantId,
        session: SessionId,
        release: &Release,
        config: SessionConfig,
        keep_lease: bool,
    ) -> Result<SessionId> {
        config.validate()?;
        crate::pinned::check_settings_rules(&config, None)?;
        crate::pinned::check_release(release)?;
        let store = &self.inner.store;
        store.put_release(tenant, release).await?;
        let parent = config.subagent.clone();
        // The row is created with this process's lease on it (one commit, not two), held for
        // `session.created`.
        let lease = store
            .create_session_leased(
                tenant,
                NewSession {
                    session_id: session,
                    release_id: release.id.clone(),
                    parent_session_id: parent.as_ref().map(|p| p.parent_session_id),
                    metadata: serde_json::json!({"workspace": config.workspace}),
                },
                &self.inner.owner,
                self.inner.options.lease_ttl,
            )
            .await?;
        let mut held = self.inner.hold_leased(tenant, session, lease).await?;
        let cfg = serde_json::to_value(&config)
            .map_err(|e| RuntimeError::InvalidInput(format!("config: {e}")))?;
        // The session's secrets (its patterns, the values this process knows) redact
        // `session.created` and are sealed with it.
        if let Err(e) = self
            .inner
            .install_secrets(held.journal(), Some(&config))
            .await
        {
            self.inner.unhold(tenant, held).await;
            return Err(e);
        }
        let r = held
            .journal()
            .append(
                "session.created",
                vec![(
                    Correlation {
                        parent_session_id: parent.as_ref().map(|p| p.parent_session_id),
                        tool_call_id: parent.map(|p| p.tool_call_id),
                        ..Correlation::default()
                    }
                    .by(self.actor),
                    EventBody::SessionCreated {
                        tenant_id: tenant,
                        release_id: release.id.clone(),
                        config: cfg,
                    },
                )],
            )
            .await;
        match held {
            Held::Leased(_, lease, _gate) if keep_lease && r.is_ok() => {
                self.inner.park(tenant, lease);
            }
            held => self.inner.unhold(tenant, held).await,
        }
        r?;
        Ok(session)
    }
}
