//! Durable approvals: an `ask` verdict becomes a pending [`ApprovalRecord`] bound to the tool call
//! id and the hash of its exact arguments ([`keel_core::args_hash`]); a human decides
//! `allow_once`, `allow_for_session` (adds session rules) or `deny {reason}`; the runtime then
//! [`ApprovalService::resolve`]s the call into "run it" or one rejected [`ToolResult`].
//!
//! The rules (twice is idempotent, a different second decision is refused, a hash mismatch is
//! refused, nothing is decided after expiry) are [`ApprovalRecord::decide`]'s, in `keel-core`.
//! Persistence goes through [`ApprovalStore`], whose methods mirror the approval methods of
//! `keel_store::Store` (minus the tenant, which the runtime's adapter supplies) so that the runtime
//! wires it to the store with a thin adapter. [`MemoryApprovalStore`] is for tests and embedding.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use keel_core::approval::DEFAULT_APPROVAL_TTL;
use keel_core::ids::{ApprovalId, SessionId, ToolCallId, TurnId};
use keel_core::machine::ApprovalStatus;
use keel_core::{ApprovalDecision, ApprovalError, ApprovalRecord, Decided};

use crate::error::ToolsError;
use crate::policy::{Rule, Subject, session_rules_for};
use crate::registry::ValidatedCall;
use crate::tool::{ToolOutput, ToolResult};

/// Where approvals live. Implementations make `decide_approval` atomic (read, apply
/// [`ApprovalRecord::decide`], write) so two deciders cannot both win.
#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// Stores a new pending approval.
    ///
    /// Errors: [`ToolsError::ApprovalStore`] when it cannot be stored.
    async fn create_approval(&self, approval: &ApprovalRecord) -> Result<(), ToolsError>;

    /// Reads approval `id`.
    ///
    /// Errors: [`ToolsError::ApprovalNotFound`]; [`ToolsError::ApprovalStore`].
    async fn get_approval(&self, id: ApprovalId) -> Result<ApprovalRecord, ToolsError>;

    /// Applies `decision` for arguments hashing to `args_hash` at `now` by
    /// [`ApprovalRecord::decide`]'s rules.
    ///
    /// Errors: [`ToolsError::ApprovalArgsMismatch`], [`ToolsError::ApprovalConflict`],
    /// [`ToolsError::ApprovalExpired`], [`ToolsError::ApprovalNotFound`], [`ToolsError::ApprovalStore`].
    async fn decide_approval(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Decided, ToolsError>;

    /// Marks a pending approval whose expiry has passed at `now` as expired (no-op if it already
    /// is) and returns it.
    ///
    /// Errors: [`ToolsError::ApprovalConflict`] if it was decided; [`ToolsError::ApprovalNotFound`].
    async fn expire_approval(
        &self,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError>;
}

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

/// In-memory [`ApprovalStore`].
#[derive(Debug, Default)]
pub struct MemoryApprovalStore {
    rows: Mutex<HashMap<ApprovalId, ApprovalRecord>>,
}

impl MemoryApprovalStore {
    fn lock(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<ApprovalId, ApprovalRecord>>, ToolsError> {
        self.rows.lock().map_err(|_| {
            ToolsError::ApprovalStore("the in-memory approval store is poisoned".into())
        })
    }
}

#[async_trait]
impl ApprovalStore for MemoryApprovalStore {
    async fn create_approval(&self, approval: &ApprovalRecord) -> Result<(), ToolsError> {
        self.lock()?.insert(approval.approval_id, approval.clone());
        Ok(())
    }

    async fn get_approval(&self, id: ApprovalId) -> Result<ApprovalRecord, ToolsError> {
        self.lock()?
            .get(&id)
            .cloned()
            .ok_or(ToolsError::ApprovalNotFound {
                approval_id: id.to_string(),
            })
    }

    async fn decide_approval(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Decided, ToolsError> {
        let mut rows = self.lock()?;
        let record = rows.get(&id).ok_or(ToolsError::ApprovalNotFound {
            approval_id: id.to_string(),
        })?;
        let decided = record
            .decide(decision, args_hash, now)
            .map_err(map_approval_error)?;
        if let Decided::Now(next) = &decided {
            rows.insert(id, next.clone());
        }
        Ok(decided)
    }

    async fn expire_approval(
        &self,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        let mut rows = self.lock()?;
        let record = rows.get_mut(&id).ok_or(ToolsError::ApprovalNotFound {
            approval_id: id.to_string(),
        })?;
        match record.status {
            ApprovalStatus::Expired => Ok(record.clone()),
            ApprovalStatus::Pending if record.is_overdue(now) => {
                record.status = ApprovalStatus::Expired;
                record.decided_at = Some(now);
                Ok(record.clone())
            }
            status => Err(ToolsError::ApprovalConflict {
                approval_id: id.to_string(),
                status: format!("{status:?}").to_lowercase(),
            }),
        }
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

/// Requests, decides and resolves approvals.
#[derive(Debug)]
pub struct ApprovalService<S> {
    store: S,
    ttl: Duration,
}

impl<S: ApprovalStore> ApprovalService<S> {
    /// A service over `store` with the default time-to-live (24 h).
    pub fn new(store: S) -> Self {
        Self {
            store,
            ttl: DEFAULT_APPROVAL_TTL,
        }
    }

    /// Sets how long an approval waits before it expires.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Creates and stores a pending approval for `call` (bound to its id and the hash of its exact
    /// arguments), expiring `ttl` after `now`.
    ///
    /// Errors: [`ToolsError::ApprovalStore`].
    pub async fn request(
        &self,
        session: SessionId,
        turn: TurnId,
        call: &ValidatedCall,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        let record = ApprovalRecord::request(
            session,
            turn,
            ToolCallId::from(call.call_id.as_str()),
            call.name.clone(),
            call.arguments.clone(),
            now,
            self.ttl,
        );
        self.store.create_approval(&record).await?;
        Ok(record)
    }

    /// Records `decision` on approval `id`, made for the arguments hashing to `args_hash` (the hash
    /// the decider was shown). The same decision twice is idempotent. A decision arriving after
    /// expiry marks the approval expired and fails.
    ///
    /// Errors: [`ToolsError::ApprovalArgsMismatch`] (nothing changes), [`ToolsError::ApprovalConflict`],
    /// [`ToolsError::ApprovalExpired`], [`ToolsError::ApprovalNotFound`], [`ToolsError::ApprovalStore`].
    pub async fn decide(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord, ToolsError> {
        match self
            .store
            .decide_approval(id, decision, args_hash, now)
            .await
        {
            Ok(Decided::Now(record) | Decided::Already(record)) => Ok(record),
            Err(err @ ToolsError::ApprovalExpired { .. }) => {
                // Best effort: persist the expiry so the call gets its rejected result.
                let _ = self.store.expire_approval(id, now).await;
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Turns approval `id` into what the runtime does with `call` at `now`: still pending, run (with
    /// session rules derived from `subject` for `allow_for_session`), or one rejected result
    /// (denied with the human's reason, or expired).
    ///
    /// Errors: [`ToolsError::ApprovalNotFound`], [`ToolsError::ApprovalStore`].
    pub async fn resolve(
        &self,
        id: ApprovalId,
        call: &ValidatedCall,
        subject: &Subject,
        now: DateTime<Utc>,
    ) -> Result<Resolution, ToolsError> {
        let mut record = self.store.get_approval(id).await?;
        if record.is_overdue(now) {
            record = self.store.expire_approval(id, now).await?;
        }
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
