//! Typed identifiers.
//!
//! Entities created by Keel (sessions, turns, steps, approvals, tenants, principals) use UUIDv7
//! (RFC 9562 §5.7): 48 bits of Unix milliseconds first, so ids sort by creation time and index well.
//! Tool call ids come from the model provider (`call_…`, `toolu_…`) and are opaque strings.
//! Operation keys and release ids are derived strings (see their docs).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh, time-ordered id (UUIDv7).
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The underlying UUID.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// A short human prefix used in logs (`ses`, `trn`, …); the `Display` form is the bare UUID.
            pub const PREFIX: &'static str = $prefix;
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            /// Parses the hyphenated UUID form (as produced by `Display`).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl From<Uuid> for $name {
            fn from(u: Uuid) -> Self {
                Self(u)
            }
        }
    };
}

uuid_id!(
    /// An isolation boundary; every stored row carries one and every query filters on it.
    TenantId,
    "ten"
);
uuid_id!(
    /// Who acts: a user, a service or a worker, authenticated by API key.
    PrincipalId,
    "prn"
);
uuid_id!(
    /// A durable conversation container.
    SessionId,
    "ses"
);
uuid_id!(
    /// One user goal inside a session; the schedulable unit.
    TurnId,
    "trn"
);
uuid_id!(
    /// One model sampling on a frozen context snapshot.
    StepId,
    "stp"
);
uuid_id!(
    /// A durable request for a human decision, bound to one tool call.
    ApprovalId,
    "apr"
);

impl TenantId {
    /// The tenant of everything the local CLI (`keel run`, `keel resume`, …) creates: one fixed
    /// id (`00000000-0000-0000-0000-000000000001`), so every `keel` process on a store sees the
    /// same sessions. No server tenant has it (server tenants get random ids), and server
    /// workers (`keel serve`, `keel worker`) never claim its sessions: they run in the CLI that
    /// owns them, under its own permission mode and workspace.
    pub const fn local() -> Self {
        Self(uuid::Uuid::from_u128(1))
    }
}

impl SessionId {
    /// The session a `spawn_agent` call starts: a UUIDv8 whose bits are the first 16 bytes of
    /// the SHA-256 of `keel-child/<parent>/<step>/<call>` (the call's operation key), so a re-run
    /// of the same call — after a crash of the parent's worker — finds the child it started
    /// instead of starting a second one. Distinct calls give distinct children.
    pub fn for_child(parent: SessionId, step: StepId, call: &ToolCallId) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("keel-child/{parent}/{step}/{call}").as_bytes());
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Self(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

string_id!(
    /// A tool call id as issued by the model provider (`call_…` for OpenAI, `toolu_…` for Anthropic,
    /// `call_<line>_<index>` for the scripted model). Unique within a session.
    ToolCallId
);
string_id!(
    /// The stable key of one side effect: `<session>/<step>/<tool call id>` (see [`OperationKey::for_call`]).
    /// The effects table is keyed by it, so a second dispatch of the same call is detected.
    OperationKey
);
string_id!(
    /// The content hash of an agent definition: `sha256:<64 hex digits>` (see [`crate::release`]).
    ReleaseId
);

impl OperationKey {
    /// The operation key of a tool call: stable across retries and crashes of the same step.
    pub fn for_call(session: SessionId, step: StepId, call: &ToolCallId) -> Self {
        Self(format!("{session}/{step}/{call}"))
    }
}

/// The fencing epoch of a lease. Every acquisition increments it; the journal refuses an append
/// carrying an epoch other than the current one.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct LeaseEpoch(pub u64);

impl fmt::Display for LeaseEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_ids_are_time_ordered_and_round_trip() {
        let a = SessionId::new();
        let b = SessionId::new();
        assert!(a < b, "UUIDv7 ids sort by creation");
        assert_eq!(a.to_string().parse::<SessionId>().unwrap(), a);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, format!("\"{a}\""));
    }

    #[test]
    fn operation_key_is_stable() {
        let s = SessionId::new();
        let st = StepId::new();
        let c = ToolCallId::from("call_1_0");
        assert_eq!(
            OperationKey::for_call(s, st, &c),
            OperationKey::for_call(s, st, &c)
        );
        assert!(
            OperationKey::for_call(s, st, &c)
                .as_str()
                .ends_with("/call_1_0")
        );
    }
}
