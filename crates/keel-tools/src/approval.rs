//! Durable approvals: an `ask` verdict becomes a pending [`ApprovalRecord`] bound to the tool call
//! id and the hash of its exact arguments ([`keel_core::args_hash`]), stored in the
//! [`keel_store::Store`]; a human decides `allow_once`, `allow_for_session` (adds session rules)
//! or `deny {reason}`; the runtime then [`ApprovalService::resolve`]s the call into "run it" or
//! one rejected [`ToolResult`]. Because the approval is a row, any worker can resume the session
//! after any restart.
//!
//! The rules (twice is idempotent, a different second decision is refused, a hash mismatch is
//! refused, nothing is decided after expiry) are [`ApprovalRecord::decide`]'s, in `keel-core`,
//! applied atomically by [`Store::decide_approval`].

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use keel_core::approval::DEFAULT_APPROVAL_TTL;
use keel_core::ids::{ApprovalId, SessionId, TenantId, ToolCallId, TurnId};
use keel_core::machine::ApprovalStatus;
use keel_core::{ApprovalDecision, ApprovalError, ApprovalRecord, Decided};
use keel_store::{Store, StoreError};

use crate::error::ToolsError;
use crate::policy::{Rule, Subject, session_rules_for};
use crate::registry::ValidatedCall;
use crate::tool::{ToolOutput, ToolResult};

/// Maps `keel-core`'s decision errors to this crate's.
pub fn map_approval_error(err: ApprovalError) -> ToolsError {
    match err {
        ApprovalError::ArgsHashMismatch {
            approval_id,
            expected,
            given,
        } => ToolsError::ApprovalArgsMismatch {
            approval_id: approval_id.to_string(),
            expected,
            actual: given,
        },
        ApprovalError::AlreadyDecided {
            approval_id,
            status,
        } => ToolsError::ApprovalConflict {
            approval_id: approval_id.to_string(),
            status: format!("{status:?}").to_lowercase(),
        },
        ApprovalError::Expired {
            approval_id,
            expires_at,
        } => ToolsError::ApprovalExpired {
            approval_id: approval_id.to_string(),
            expired_at_ms: expires_at.timestamp_millis(),
        },
    }
}

/// `at` cut to whole milliseconds, the precision stores keep, so that the record a call returns
/// is the record any worker reads back.
fn to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at)
}

/// Maps a store error on approval `id` to this crate's: decision refusals and "not found" get
/// their own variants, everything else is [`ToolsError::Store`].
fn map_store_error(id: ApprovalId, err: StoreError) -> ToolsError {
    match err {
        StoreError::Approval(e) => map_approval_error(e),
        StoreError::NotFound {
            entity: "approval", ..
        } => ToolsError::ApprovalNotFound {
            approval_id: id.to_string(),
        },
        other => ToolsError::Store(other),
    }
}

/// What to do with a call whose approval was requested.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Still waiting for a human (the session is `requires_action`).
    Pending {
        /// When it expires.
        expires_at: DateTime<Utc>,
    },
    /// Allowed: execute the call (with `ToolRegistry::execute`); add `session_rules` to the
    /// session's policy first (non-empty only for `allow_for_session`).
    Run {
        /// Rules to add for the rest of the session.
        session_rules: Vec<Rule>,
    },
    /// Denied or expired: this is the call's one result (status `rejected`).
    Rejected(ToolResult),
}

/// Requests, decides and resolves the approvals of one tenant, durably in a [`Store`].
pub struct ApprovalService {
    store: Arc<dyn Store>,
    tenant: TenantId,
    ttl: Duration,
}

impl std::fmt::Debug for ApprovalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalService")
            .field("store", &self.store.backend())
            .field("tenant", &self.tenant)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl ApprovalService {
    /// A service over `store` for `tenant` with the default time-to-live (24 h).
    pub fn new(store: Arc<dyn Store>, tenant: TenantId) -> Self {
        Self {
            store,
            tenant,
            ttl: DEFAULT_APPROVAL_TTL,
        }
    }

    /// Sets how long an approval waits before it expires.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Reads approval `id` as stored.
    ///
    /// Errors: [`ToolsError::ApprovalNotFound`]; [`ToolsError::Store`].
    pub async fn get(&self, id: ApprovalId) -> Result<ApprovalRecord, ToolsError> {
        self.store
            .get_approval(self.tenant, id)
            .await
            .map_err(|e| map_store_error(id, e))
    }

    /// A pending approval for `call` (bound to its id and the hash of its exact arguments),
    /// expiring `ttl` after `now`, not yet stored: the runtime commits it with the journal's
    /// `approval.requested` in one transaction.
    pub fn new_request(
        &self,
        session: SessionId,
        turn: TurnId,
        call: &ValidatedCall,
        now: DateTime<Utc>,
    ) -> ApprovalRecord {
        ApprovalRecord::request(
            session,
            turn,
            ToolCallId::from(call.call_id.as_str()),
            call.name.clone(),
            call.arguments.clone(),
            to_millis(now),
            self.ttl,
        )
    }

    /// Creates and stores a pending approval for `call` (see [`ApprovalService::new_request`]).
    ///
    /// Errors: [`ToolsError::Store`] (for example when the session does not exist).
    pub async fn request(
        &self,
        session: SessionId,
        turn: TurnId,
        call: &ValidatedCall,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        let record = self.new_request(session, turn, call, now);
        self.store
            .create_approval(self.tenant, &record)
            .await
            .map_err(ToolsError::Store)?;
        Ok(record)
    }

    /// Marks approval `id` expired in the table if it is still pending and overdue at `now`;
    /// returns the row as it then is.
    ///
    /// Errors: [`ToolsError::ApprovalNotFound`], [`ToolsError::Store`].
    pub async fn expire_overdue(
        &self,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        self.expire_if_pending(id, to_millis(now)).await
    }

    /// Records `decision` on approval `id`, made for the arguments hashing to `args_hash` (the hash
    /// the decider was shown). The same decision twice is idempotent. A decision arriving after
    /// expiry marks the approval expired and fails.
    ///
    /// Errors: [`ToolsError::ApprovalArgsMismatch`] (nothing changes), [`ToolsError::ApprovalConflict`],
    /// [`ToolsError::ApprovalExpired`], [`ToolsError::ApprovalNotFound`], [`ToolsError::Store`].
    pub async fn decide(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        let now = to_millis(now);
        match self
            .store
            .decide_approval(self.tenant, id, decision, args_hash, now)
            .await
            .map_err(|e| map_store_error(id, e))
        {
            Ok(Decided::Now(record) | Decided::Already(record)) => Ok(record),
            Err(err @ ToolsError::ApprovalExpired { .. }) => {
                // Persist the expiry so the call gets its rejected result; if another worker
                // already did, the row says so and nothing more is needed.
                self.expire_if_pending(id, now).await?;
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Marks approval `id` expired if it is still pending and overdue at `now`; returns the row.
    async fn expire_if_pending(
        &self,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        let record = self.get(id).await?;
        if !record.is_overdue(now) {
            return Ok(record);
        }
        match self.store.expire_approval(self.tenant, id, now).await {
            Ok(expired) => Ok(expired),
            // Decided or expired by someone else in between: the row is the truth.
            Err(StoreError::Conflict(_)) => self.get(id).await,
            Err(e) => Err(map_store_error(id, e)),
        }
    }

    /// Turns approval `id` into what the runtime does with `call` at `now`: still pending, run (with
    /// session rules derived from `subject` for `allow_for_session`), or one rejected result
    /// (denied with the human's reason, or expired).
    ///
    /// Errors: [`ToolsError::ApprovalNotFound`], [`ToolsError::Store`].
    pub async fn resolve(
        &self,
        id: ApprovalId,
        call: &ValidatedCall,
        subject: &Subject,
        now: DateTime<Utc>,
    ) -> Result<Resolution, ToolsError> {
        let record = self.expire_if_pending(id, to_millis(now)).await?;
        let reject = |text: String| {
            Resolution::Rejected(ToolResult::from_output(
                &call.call_id,
                &call.name,
                ToolOutput::rejected(text),
            ))
        };
        Ok(match record.status {
            ApprovalStatus::Pending => Resolution::Pending {
                expires_at: record.expires_at,
            },
            ApprovalStatus::Allowed => Resolution::Run {
                session_rules: match record.decision {
                    Some(ApprovalDecision::AllowForSession) => {
                        session_rules_for(&call.name, subject)
                    }
                    _ => Vec::new(),
                },
            },
            ApprovalStatus::Denied => {
                let reason = match &record.decision {
                    Some(ApprovalDecision::Deny { reason }) if !reason.trim().is_empty() => {
                        reason.clone()
                    }
                    _ => "no reason given".to_owned(),
                };
                reject(format!(
                    "The user denied this `{}` call: {reason}. It was not run; do not retry it unchanged.",
                    call.name
                ))
            }
            ApprovalStatus::Expired => reject(format!(
                "The approval for this `{}` call expired at {} without a decision; the call was not run. Ask again if it is still needed.",
                call.name,
                record.expires_at.to_rfc3339()
            )),
        })
    }
}
