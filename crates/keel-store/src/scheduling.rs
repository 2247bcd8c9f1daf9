//! What the scheduler reads and writes: which sessions have work, claiming one with its lease,
//! waking workers, queue depths for admission, and the per-tenant token windows of rate
//! admission. See `keel_runtime::scheduler` for the worker loop that uses them.
//!
//! **Runnable.** A session is *claimable* at `now` when it has work — its row's `runnable`
//! mark is set (the runtime sets it on every commit from the folded state —
//! `keel_runtime::journal::work_mark`: a queued turn, an active turn not waiting on a human,
//! a waiting turn whose cancellation was requested, a `running` status owed its idle), its wake-up time is due (an approval's expiry, a
//! decision to act on), or it has a posted intent (input, a cancellation) — and its lease is
//! free or expired, it is not deferred (`claim_after` in the future), and its journal was
//! written by an event schema this build can read (`schema_version` ≤ the caller's).
//!
//! **Wake-ups** ([`crate::Store::wait_for_work`]): an append that makes a session runnable, a
//! posted intent, a decided approval, and a lease given back (`release_lease`,
//! `release_claim`) while the session has work and is not deferred. A session that stays
//! runnable while its holder keeps appending wakes nobody: it is leased. A lease that expires
//! wakes nobody either: the callers' timeout (polling) finds it.
//!
//! The columns live on the session row (migration 9): `runnable`, `runnable_since`,
//! `priority`, `queued_turns`, `claim_after`, `schema_version` (the highest event envelope
//! version appended); token windows in table `token_windows`.

use chrono::{DateTime, Utc};
use keel_core::TenantId;

use crate::types::Lease;

/// The scheduler's mark of a session, computed by the runtime from the state it just folded
/// and written with the append ([`crate::AppendExtras::work`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkMark {
    /// Whether a worker should run the session (the rule is the runtime's,
    /// `keel_runtime::journal::work_mark`: roughly, a turn is queued, or a turn is active and
    /// not waiting on a human). The first append that sets it records when (`runnable_since`:
    /// the order of claims within a priority).
    pub runnable: bool,
    /// Turns queued and not yet started (admission counts these).
    pub queued_turns: u32,
}

/// One tenant's backlog, as the scheduler picks the next tenant to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantBacklog {
    /// The tenant.
    pub tenant_id: TenantId,
    /// Its sessions claimable now.
    pub claimable: u64,
    /// Its sessions under a live lease now (any worker): its concurrency in use.
    pub leased: u64,
}

/// A session claimed by a worker: the lease it now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The session's tenant.
    pub tenant_id: TenantId,
    /// The lease taken (epoch bumped).
    pub lease: Lease,
    /// The previous holder whose lease had expired (a takeover), if any.
    pub took_over: Option<String>,
    /// When the session became runnable (`None` when claimed for a due timer or an intent).
    pub runnable_since: Option<DateTime<Utc>>,
}

/// A tenant's token window after a reservation attempt ([`crate::Store::reserve_tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenWindow {
    /// Whether the tokens were reserved.
    pub admitted: bool,
    /// Tokens reserved or used in the window, after the attempt.
    pub used: u64,
}
