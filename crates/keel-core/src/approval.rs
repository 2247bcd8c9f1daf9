//! Approvals: a durable request for a human decision, bound to one tool call and to a hash of its
//! exact arguments.
//!
//! [`ApprovalRecord::decide`] holds the rules every store and host applies: deciding twice with the
//! same decision is idempotent, a different second decision is refused, a decision whose arguments
//! hash differs from the recorded one is refused, and a decision at or after `expires_at` is refused
//! (the caller then records the approval as `expired` and the model gets a rejected result).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::content_hash;
use crate::ids::{ApprovalId, PrincipalId, SessionId, ToolCallId, TurnId};
use crate::machine::{ApprovalStatus, StateMachine, check_transition};
use crate::mechanisms::{Mechanism, is_off};

/// How long an approval waits by default: 24 h.
pub const DEFAULT_APPROVAL_TTL: Duration = Duration::hours(24);

/// The last expiry an approval can have, 9999-12-31T23:59:59.999Z: the last instant with a
/// four-digit year, so that it is written the same in RFC 3339 (the journal's JSON, the API)
/// and as milliseconds in the store. A TTL reaching past it (`approval_ttl_ms = i64::MAX`) ends
/// here: an approval that, in practice, never expires.
pub fn last_expiry() -> DateTime<Utc> {
    // 253_402_300_799_999 ms after the epoch is in chrono's range; MAX_UTC is never reached.
    DateTime::from_timestamp_millis(253_402_300_799_999).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The hash an approval is bound to: [`content_hash`] of the tool call's arguments
/// (`sha256:<hex>` of canonical JSON, so key order does not matter).
pub fn args_hash(arguments: &Value) -> String {
    content_hash(arguments)
}

/// A human's decision on an approval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Run this call, this once.
    AllowOnce,
    /// Run this call and add a session rule that allows the same call pattern from now on.
    AllowForSession,
    /// Do not run it; the model sees `reason`.
    Deny {
        /// Shown to the model in the rejected tool result.
        reason: String,
    },
}

impl ApprovalDecision {
    /// The approval state the decision leads to.
    pub fn status(&self) -> ApprovalStatus {
        match self {
            ApprovalDecision::AllowOnce | ApprovalDecision::AllowForSession => {
                ApprovalStatus::Allowed
            }
            ApprovalDecision::Deny { .. } => ApprovalStatus::Denied,
        }
    }
}

/// One approval as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// Its id.
    pub approval_id: ApprovalId,
    /// The session of the call.
    pub session_id: SessionId,
    /// The turn of the call.
    pub turn_id: TurnId,
    /// The call it is bound to.
    pub tool_call_id: ToolCallId,
    /// The tool's name, for display.
    pub tool_name: String,
    /// The exact arguments, for display (redacted by the host before it shows them).
    pub arguments: Value,
    /// [`args_hash`] of the arguments at request time.
    pub args_hash: String,
    /// Current state.
    pub status: ApprovalStatus,
    /// The decision, once decided.
    pub decision: Option<ApprovalDecision>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// After this instant it can only expire.
    pub expires_at: DateTime<Utc>,
    /// When it was decided or expired.
    pub decided_at: Option<DateTime<Utc>>,
    /// The principal whose decision it is, when it came through an authenticated host (the
    /// HTTP API); `None` for the local CLI and for rows written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<PrincipalId>,
}

/// Why a decision was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApprovalError {
    /// The decision names other arguments than the approval was requested for.
    #[error(
        "approval {approval_id}: arguments hash {given} does not match the requested call's {expected}"
    )]
    ArgsHashMismatch {
        /// The approval.
        approval_id: ApprovalId,
        /// Recorded hash.
        expected: String,
        /// Hash given with the decision.
        given: String,
    },
    /// Already decided differently (a same decision is idempotent and not an error).
    #[error("approval {approval_id} is already {status}")]
    AlreadyDecided {
        /// The approval.
        approval_id: ApprovalId,
        /// Its terminal state.
        status: ApprovalStatus,
    },
    /// Its expiry has passed.
    #[error("approval {approval_id} expired at {expires_at}")]
    Expired {
        /// The approval.
        approval_id: ApprovalId,
        /// When it expired.
        expires_at: DateTime<Utc>,
    },
}

/// What [`ApprovalRecord::decide`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Decided {
    /// The record moved to a terminal state; persist it.
    Now(ApprovalRecord),
    /// The same decision had already been made; nothing to write.
    Already(ApprovalRecord),
}

impl ApprovalRecord {
    /// A new pending approval for a call, expiring `ttl` after `now`, or at [`last_expiry`] if
    /// that is later (it saturates; a huge TTL does not overflow).
    pub fn request(
        session_id: SessionId,
        turn_id: TurnId,
        tool_call_id: ToolCallId,
        tool_name: impl Into<String>,
        arguments: Value,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Self {
        let hash = args_hash(&arguments);
        ApprovalRecord {
            approval_id: ApprovalId::new(),
            session_id,
            turn_id,
            tool_call_id,
            tool_name: tool_name.into(),
            arguments,
            args_hash: hash,
            status: ApprovalStatus::INITIAL,
            decision: None,
            created_at: now,
            expires_at: now
                .checked_add_signed(ttl)
                .map_or_else(last_expiry, |t| t.min(last_expiry())),
            decided_at: None,
            decided_by: None,
        }
    }

    /// Applies `decision` made at `now` for the call whose arguments hash to `given_hash`.
    ///
    /// # Errors
    /// [`ApprovalError::ArgsHashMismatch`] when `given_hash` differs from the recorded hash;
    /// [`ApprovalError::Expired`] when pending past `expires_at` or already expired;
    /// [`ApprovalError::AlreadyDecided`] when decided differently before.
    pub fn decide(
        &self,
        decision: ApprovalDecision,
        given_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Decided, ApprovalError> {
        if given_hash != self.args_hash && !is_off(Mechanism::ApprovalHash) {
            return Err(ApprovalError::ArgsHashMismatch {
                approval_id: self.approval_id,
                expected: self.args_hash.clone(),
                given: given_hash.to_owned(),
            });
        }
        match self.status {
            ApprovalStatus::Pending if now >= self.expires_at => Err(ApprovalError::Expired {
                approval_id: self.approval_id,
                expires_at: self.expires_at,
            }),
            ApprovalStatus::Pending => {
                let to = check_transition(self.status, decision.status()).map_err(|_| {
                    ApprovalError::AlreadyDecided {
                        approval_id: self.approval_id,
                        status: self.status,
                    }
                })?;
                let mut next = self.clone();
                next.status = to;
                next.decision = Some(decision);
                next.decided_at = Some(now);
                Ok(Decided::Now(next))
            }
            ApprovalStatus::Expired => Err(ApprovalError::Expired {
                approval_id: self.approval_id,
                expires_at: self.expires_at,
            }),
            ApprovalStatus::Allowed | ApprovalStatus::Denied if is_off(Mechanism::DecisionOnce) => {
                let mut next = self.clone();
                next.status = decision.status();
                next.decision = Some(decision);
                next.decided_at = Some(now);
                Ok(Decided::Now(next))
            }
            ApprovalStatus::Allowed | ApprovalStatus::Denied => {
                if self.decision.as_ref() == Some(&decision) {
                    Ok(Decided::Already(self.clone()))
                } else {
                    Err(ApprovalError::AlreadyDecided {
                        approval_id: self.approval_id,
                        status: self.status,
                    })
                }
            }
        }
    }

    /// Whether it is pending and past its expiry at `now`.
    pub fn is_overdue(&self, now: DateTime<Utc>) -> bool {
        self.status == ApprovalStatus::Pending && now >= self.expires_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending(now: DateTime<Utc>) -> ApprovalRecord {
        ApprovalRecord::request(
            SessionId::new(),
            TurnId::new(),
            ToolCallId::from("call_1"),
            "shell",
            json!({"command": "rm -rf build"}),
            now,
            DEFAULT_APPROVAL_TTL,
        )
    }

    #[test]
    fn deciding_twice_is_idempotent_and_a_different_second_decision_is_refused() {
        let now = Utc::now();
        let a = pending(now);
        let Decided::Now(done) = a
            .decide(ApprovalDecision::AllowOnce, &a.args_hash, now)
            .unwrap()
        else {
            panic!("first decision must apply")
        };
        assert_eq!(done.status, ApprovalStatus::Allowed);
        assert!(matches!(
            done.decide(ApprovalDecision::AllowOnce, &a.args_hash, now),
            Ok(Decided::Already(_))
        ));
        let err = done
            .decide(
                ApprovalDecision::Deny {
                    reason: "no".into(),
                },
                &a.args_hash,
                now,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ApprovalError::AlreadyDecided {
                status: ApprovalStatus::Allowed,
                ..
            }
        ));
    }

    #[test]
    fn a_decision_for_other_arguments_is_refused() {
        let now = Utc::now();
        let a = pending(now);
        let other = args_hash(&json!({"command": "rm -rf /"}));
        let err = a
            .decide(ApprovalDecision::AllowOnce, &other, now)
            .unwrap_err();
        assert!(
            matches!(err, ApprovalError::ArgsHashMismatch { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("does not match"));
    }

    #[test]
    fn an_overdue_approval_cannot_be_decided() {
        let now = Utc::now();
        let a = pending(now);
        let later = now + DEFAULT_APPROVAL_TTL;
        assert!(a.is_overdue(later));
        let err = a
            .decide(ApprovalDecision::AllowOnce, &a.args_hash, later)
            .unwrap_err();
        assert!(matches!(err, ApprovalError::Expired { .. }));
    }

    #[test]
    fn a_ttl_past_the_last_representable_time_expires_then() {
        let now = Utc::now();
        let request = |ttl| {
            ApprovalRecord::request(
                SessionId::new(),
                TurnId::new(),
                ToolCallId::from("call_1"),
                "shell",
                json!({}),
                now,
                ttl,
            )
        };
        // `approval_ttl_ms = i64::MAX`, chrono's largest delta, and one just past the bound.
        for ttl in [
            Duration::milliseconds(i64::MAX),
            Duration::MAX,
            (last_expiry() - now) + Duration::milliseconds(1),
        ] {
            let a = request(ttl);
            assert_eq!(a.expires_at, last_expiry(), "{ttl}");
            assert!(!a.is_overdue(now + Duration::days(365 * 1000)));
            assert!(a.is_overdue(last_expiry()));
            // The journal's JSON holds it and reads it back unchanged.
            let json = serde_json::to_string(&a).unwrap();
            assert!(json.contains("9999-12-31T23:59:59.999Z"), "{json}");
            let back: ApprovalRecord = serde_json::from_str(&json).unwrap();
            assert_eq!(back.expires_at, last_expiry());
        }
        // A TTL within range is kept as given.
        assert_eq!(
            request(Duration::hours(1)).expires_at,
            now + Duration::hours(1)
        );
    }

    #[test]
    fn hash_ignores_key_order() {
        let x: Value = serde_json::from_str(r#"{"a":1,"b":2}"#).unwrap();
        let y: Value = serde_json::from_str(r#"{"b":2,"a":1}"#).unwrap();
        assert_eq!(args_hash(&x), args_hash(&y));
    }
}
