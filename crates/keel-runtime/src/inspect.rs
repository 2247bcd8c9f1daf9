//! Reading a session without running it: subscriptions (replay + live tail), the folded view,
//! and the context the next step would show the model.

use std::sync::Arc;

use keel_core::{SessionId, SessionState, TenantId};

use crate::context::ContextSnapshot;
use crate::error::{Result, RuntimeError};
use crate::journal::{Journal, TurnOutcome};
use crate::redact::Redactor;
use crate::runtime::{Runtime, SessionView};
use crate::subscribe::Subscription;

impl Runtime {
    /// Subscribes to the session from journal sequence number `from_seq` (1 = everything):
    /// durable events replayed then tailed, plus live deltas. See [`crate::subscribe`].
    ///
    /// # Errors
    /// Store errors (`NotFound`).
    pub async fn subscribe(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
    ) -> Result<Subscription> {
        let rec = self.inner.store.get_session(tenant, session).await?;
        let _ = rec;
        let sender = self.inner.hub.sender(session);
        let deltas = (sender.subscribe(), sender.tail.clone());
        let redactor = self.shared_redactor(tenant, session).await?;
        Ok(Subscription::new(
            self.inner.store.clone(),
            tenant,
            session,
            from_seq,
            deltas,
            redactor,
        ))
    }

    /// The session folded from its journal (no lease needed).
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Rejected`] for a journal that does not fold.
    pub async fn view(&self, tenant: TenantId, session: SessionId) -> Result<SessionView> {
        let j = self.read_journal(tenant, session).await?;
        let mut turns: Vec<TurnOutcome> = j
            .state
            .turn_order
            .iter()
            .filter_map(|t| j.proj.finished.get(t).cloned())
            .collect();
        turns.shrink_to_fit();
        Ok(SessionView {
            state: j.state,
            turns,
        })
    }
    /// What the model would see if the session sampled its next step now (for inspection and
    /// tests; the same projection the turn loop uses).
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Config`].
    pub async fn project_context(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<ContextSnapshot> {
        let j = self.read_journal(tenant, session).await?;
        self.project_journal(tenant, &j).await
    }

    /// The context the next step of the session whose journal is `j` would send, as
    /// [`Runtime::project_context`] projects it: the one context size every host shows
    /// (`/status`, `/compact`'s before and after).
    ///
    /// # Errors
    /// As [`Runtime::project_context`].
    pub(crate) async fn project_journal(
        &self,
        tenant: TenantId,
        j: &Journal,
    ) -> Result<ContextSnapshot> {
        let session = j.session;
        let config = j.config()?;
        let release_id = j.state.release_id.clone().ok_or(RuntimeError::Config {
            session,
            reason: "no session.created".into(),
        })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let workspace = keel_tools::workspace::Workspace::new(&config.workspace)
            .ok()
            .map(|w| w.protecting(&self.inner.options.hidden_paths));
        let tools = match &workspace {
            Some(w) => self.inner.tools.registry(&release, w.root()).await,
            None => self.inner.tools.base().clone(),
        };
        let policy = crate::authorize::session_policy(&release, &config, j, &tools)?;
        let agents = workspace.as_ref().and_then(crate::context::read_agents_md);
        Ok(crate::context::project(
            &release.definition.instructions,
            agents.as_deref(),
            &crate::pinned::offered_tools(&release, &tools),
            &tools,
            policy,
            &j.proj,
            &[],
        ))
    }

    /// The whole journal folded, without a lease (read only).
    async fn read_journal(&self, tenant: TenantId, session: SessionId) -> Result<Journal> {
        Journal::load(
            self.inner.store.clone(),
            tenant,
            session,
            keel_core::LeaseEpoch(0),
            Arc::new(Redactor::new(&[], &[])?),
        )
        .await
    }

    /// The session's state folded from its journal.
    ///
    /// # Errors
    /// As [`Runtime::view`].
    pub(crate) async fn fold(&self, tenant: TenantId, session: SessionId) -> Result<SessionState> {
        Ok(self.view(tenant, session).await?.state)
    }
}
