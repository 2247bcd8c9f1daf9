//! Test-only switches that turn a guarded mechanism off, so a test can prove it fails without it
//! (issue 18: "each test must be able to fail"), and a test-only clock offset for chaos trials.
//!
//! **Compiled in only with the `mechanism-switches` feature**, which only dev-dependencies
//! enable (`keel`'s, `keel-store`'s and `keel-runtime`'s). Without it — `cargo build --release -p keel`, `cargo
//! install`, any host's normal build — [`is_off`] is the constant `false` and
//! [`clock_skew_ms`] the constant `0`, so the checks below fold away and the variables are
//! ignored. (Cargo's resolver unifies a dev-dependency's features into every crate built in the
//! same invocation *when dev-dependencies are built*: `cargo test` and `cargo build
//! --all-targets` produce a `target/debug/keel` with the switches; see docs/SECURITY.md.)
//!
//! With the feature:
//! - `KEEL_MECHANISM_OFF=<name>[,<name>…]` (snake_case names of [`Mechanism`]) turns those
//!   mechanisms off for the whole process. An unknown name panics with the list of names, so a
//!   typo cannot make a run pass silently. Read once per process.
//! - `KEEL_CLOCK_SKEW_MS=<i64>` shifts the wall time the store and the scheduler read for
//!   leases and claims by that many milliseconds (a worker whose clock is wrong).
//!
//! This is the one place keel-core reads the environment; it does so only in test builds.

use std::fmt;

/// A guarded mechanism that a test-only switch can turn off. Each variant names where it is
/// enforced (`scripts/mechanisms-off.sh` runs the release-validation scenario it guards with
/// it off and fails unless the scenario fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The lease-epoch fence of a journal append (`lease_epoch = ? AND lease_owner IS NOT
    /// NULL` in the append's compare-and-set, SQLite and PostgreSQL); a side-effecting tool is
    /// dispatched only after its `tool.dispatched` append passes it, so this also fences
    /// dispatch.
    Fencing,
    /// The journal-version compare-and-set of an append (`version = ?`).
    CasVersion,
    /// The HTTP API's `Idempotency-Key` records (one request runs per key).
    IdempotencyKey,
    /// An approval is decided once (the store's `status = 'pending'` compare-and-set, and the
    /// rule that a decided approval refuses another decision).
    DecisionOnce,
    /// An approval decision is bound to the arguments' hash (`ApprovalRecord::decide`: a
    /// decision carrying another hash is refused).
    ApprovalHash,
    /// An approved call is dispatched only with the arguments its approval hashed (`keel-runtime`
    /// `tools.rs` `run_call`, checked again right before the dispatch): arguments that differ at
    /// execution from what was approved get the call refused, and journaled so.
    DispatchHash,
    /// An operation key is dispatched once: an `outcome_unknown` effect is reconciled or put to a
    /// human, never re-dispatched blindly, and a key the effects table has past `prepared` is
    /// never dispatched again.
    EffectClaim,
    /// Every store query filters by the caller's tenant (`tenant_id = ?`).
    TenantScope,
    /// A turn whose cancellation was requested stops before anything else is dispatched.
    CancelBeforeDispatch,
    /// Budgets (tokens, cost, steps, tool calls, wall time) end the turn when exhausted.
    BudgetCheck,
    /// The queued-turn bounds (`max_queued_turns`, per tenant and overall: 429).
    QueueBound,
    /// A store or session written by a newer schema is refused (`SchemaTooNew`; a worker claims
    /// only sessions whose `schema_version` it reads).
    SchemaVersionCheck,
    /// An intent's journal entry commits only with its row's deletion (the store's
    /// `AppendExtras::consume_intent`: no row deleted, nothing appended), so a poster that
    /// withdrew its intent and answered "busy" never sees it journaled afterwards.
    IntentConsume,
    /// A model route hands a call that failed in a way that falls back
    /// (`ErrorKind::falls_back`: overloaded, server errors, …) to its next model (`keel-model`
    /// `route.rs`); off, the route ends with the primary's error.
    Fallback,
}

impl Mechanism {
    /// Every mechanism, in declaration order.
    pub const ALL: [Mechanism; 14] = [
        Mechanism::Fencing,
        Mechanism::CasVersion,
        Mechanism::IdempotencyKey,
        Mechanism::DecisionOnce,
        Mechanism::ApprovalHash,
        Mechanism::DispatchHash,
        Mechanism::EffectClaim,
        Mechanism::TenantScope,
        Mechanism::CancelBeforeDispatch,
        Mechanism::BudgetCheck,
        Mechanism::QueueBound,
        Mechanism::SchemaVersionCheck,
        Mechanism::IntentConsume,
        Mechanism::Fallback,
    ];

    /// The snake_case name `KEEL_MECHANISM_OFF` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fencing => "fencing",
            Mechanism::CasVersion => "cas_version",
            Mechanism::IdempotencyKey => "idempotency_key",
            Mechanism::DecisionOnce => "decision_once",
            Mechanism::ApprovalHash => "approval_hash",
            Mechanism::DispatchHash => "dispatch_hash",
            Mechanism::EffectClaim => "effect_claim",
            Mechanism::TenantScope => "tenant_scope",
            Mechanism::CancelBeforeDispatch => "cancel_before_dispatch",
            Mechanism::BudgetCheck => "budget_check",
            Mechanism::QueueBound => "queue_bound",
            Mechanism::SchemaVersionCheck => "schema_version_check",
            Mechanism::IntentConsume => "intent_consume",
            Mechanism::Fallback => "fallback",
        }
    }

    /// The mechanism named `name` (see [`Mechanism::name`]).
    ///
    /// # Errors
    /// A message listing the known names when `name` is none of them.
    pub fn parse(name: &str) -> Result<Mechanism, String> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
                format!(
                    "unknown mechanism {name:?} in KEEL_MECHANISM_OFF; known: {}",
                    names.join(", ")
                )
            })
    }

    /// The mechanisms a `KEEL_MECHANISM_OFF` value names (comma-separated, blanks ignored).
    ///
    /// # Errors
    /// As [`Mechanism::parse`], for the first unknown name.
    pub fn parse_list(value: &str) -> Result<Vec<Mechanism>, String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Mechanism::parse)
            .collect()
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this build has the switches (`mechanism-switches` feature).
pub const SWITCHES: bool = cfg!(feature = "mechanism-switches");

#[cfg(feature = "mechanism-switches")]
mod switches {
    use std::sync::OnceLock;

    use super::Mechanism;

    pub(super) fn off() -> &'static [Mechanism] {
        static OFF: OnceLock<Vec<Mechanism>> = OnceLock::new();
        OFF.get_or_init(|| {
            let value = std::env::var("KEEL_MECHANISM_OFF").unwrap_or_default();
            // Nothing is printed: tests read the first lines of `keel serve` and `keel worker`.
            match Mechanism::parse_list(&value) {
                Ok(list) => list,
                // A typo must not let a run pass with the mechanism on.
                #[allow(clippy::panic)]
                Err(e) => panic!("{e}"),
            }
        })
    }

    pub(super) fn skew_ms() -> i64 {
        static SKEW: OnceLock<i64> = OnceLock::new();
        *SKEW.get_or_init(|| match std::env::var("KEEL_CLOCK_SKEW_MS") {
            Err(_) => 0,
            Ok(v) if v.trim().is_empty() => 0,
            Ok(v) => match v.trim().parse() {
                Ok(ms) => ms,
                #[allow(clippy::panic)]
                Err(_) => panic!("KEEL_CLOCK_SKEW_MS must be an integer (milliseconds), not {v:?}"),
            },
        })
    }
}

/// Whether mechanism `m` is turned off. Always `false` without the `mechanism-switches`
/// feature; with it, whether `KEEL_MECHANISM_OFF` names `m`.
///
/// # Panics
/// With the feature, on the first call, when `KEEL_MECHANISM_OFF` names an unknown mechanism.
#[inline]
pub fn is_off(m: Mechanism) -> bool {
    #[cfg(feature = "mechanism-switches")]
    {
        switches::off().contains(&m)
    }
    #[cfg(not(feature = "mechanism-switches"))]
    {
        let _ = m;
        false
    }
}

/// The test-only offset (ms) added to the wall time read for leases and claims. Always `0`
/// without the `mechanism-switches` feature; with it, `KEEL_CLOCK_SKEW_MS`.
///
/// # Panics
/// With the feature, on the first call, when `KEEL_CLOCK_SKEW_MS` is not an integer.
#[inline]
pub fn clock_skew_ms() -> i64 {
    #[cfg(feature = "mechanism-switches")]
    {
        switches::skew_ms()
    }
    #[cfg(not(feature = "mechanism-switches"))]
    {
        0
    }
}

/// `clause` as written, or — with `m` turned off — `(clause OR 1 = 1)`: the same placeholders
/// (so the binds stay as they are) but a condition that always holds. For the store's SQL.
pub fn sql_guard(m: Mechanism, clause: &str) -> String {
    if is_off(m) {
        format!("({clause} OR 1 = 1)")
    } else {
        clause.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_an_unknown_name_lists_the_known_ones() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.name()), Ok(m));
        }
        assert_eq!(
            Mechanism::parse_list(" fencing, ,effect_claim "),
            Ok(vec![Mechanism::Fencing, Mechanism::EffectClaim])
        );
        let err = Mechanism::parse_list("fencing,fenceing").unwrap_err();
        assert!(err.contains("\"fenceing\""), "{err}");
        assert!(err.contains("schema_version_check"), "{err}");
    }

    #[test]
    fn a_guard_keeps_its_placeholders() {
        let on = "lease_epoch = ? AND lease_owner IS NOT NULL";
        // The test process has no KEEL_MECHANISM_OFF unless a run sets it on purpose.
        if !is_off(Mechanism::Fencing) {
            assert_eq!(sql_guard(Mechanism::Fencing, on), on);
        } else {
            assert_eq!(
                sql_guard(Mechanism::Fencing, on),
                format!("({on} OR 1 = 1)")
            );
        }
    }
}
