//! A session's secrets: the one place a session's [`Redactor`] is built.
//!
//! A session's redactor replaces the built-in patterns, the session's `secret_patterns`, and
//! every secret *value* the session has known:
//!
//! - the values this process knows now ([`Inner::process_secret_values`]): the variables named
//!   by the session's `secret_env`, by [`PROVIDER_KEY_ENV`] and by
//!   [`crate::RuntimeOptions::withheld_env`] (every provider key the host reads — an
//!   `api_key_env` added after the session was created too), and the host's
//!   [`crate::RuntimeOptions::secret_values`];
//! - every value an earlier process knew for the session: kept sealed (encrypted with the
//!   deployment key, like sealed arguments; see [`crate::seal`]) in the session's one `secrets`
//!   row, for the session's life (deleted with the session).
//!
//! A session is created with the values of its creating process sealed. Whenever a process
//! loads a session under a lease and knows a value the row lacks, the union is sealed again in
//! the commit of the next events it journals — so every event is written by a redactor that
//! holds every value any process journaling the session knew, and no later process (resumed
//! without an environment variable, a config entry dropped) forgets one. Readers without a lease
//! (subscriptions, decisions, intents) use the same union without writing it.
//!
//! A row that does not open with this deployment's key is left as it is (a warning says so):
//! its values cannot be used, and overwriting it would lose them for the deployment that can.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use keel_core::{EventBody, SessionId, TenantId};
use keel_store::{SealedKey, SealedKind};

use crate::config::SessionConfig;
use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::redact::{PROVIDER_KEY_ENV, Redactor, env_values};
use crate::runtime::Runtime;
use crate::shared::Inner;

/// Values shorter than this are not secrets (see [`Redactor`]).
const MIN_SECRET_BYTES: usize = 6;

/// The id of a session's `secrets` row.
const ROW_ID: &str = "values";

/// What the session's sealed `secrets` row holds.
enum Sealed {
    /// No row (a new session, or one created before rows existed).
    None,
    /// The row's values.
    Values(BTreeSet<String>),
    /// A row this deployment's key does not open.
    Unreadable,
}

/// What a session's secrets are now.
pub(crate) struct SessionSecrets {
    /// Its redactor, shared with every session of the same secrets ([`shared_redactor`]).
    pub(crate) redactor: Arc<Redactor>,
    /// The values to seal in the session's row with the next commit, when this process knows
    /// some the row lacks.
    pub(crate) to_seal: Option<Vec<String>>,
}

/// What a session's `secrets` row is bound to (it does not open for another session).
pub(crate) fn context(tenant: TenantId, session: SessionId) -> String {
    format!("keel-sealed-secrets/{tenant}/{session}")
}

/// Every secret value a host with `options` knows for a session whose `secret_env` is
/// `secret_env` (see [`Inner::process_secret_values`]).
fn host_secret_values(options: &crate::RuntimeOptions, secret_env: &[String]) -> BTreeSet<String> {
    let names: Vec<&str> = secret_env
        .iter()
        .chain(options.withheld_env.iter())
        .map(String::as_str)
        .chain(PROVIDER_KEY_ENV.iter().copied())
        .collect();
    env_values(&names)
        .into_iter()
        .chain(options.secret_values.iter().cloned())
        .filter(|v| v.len() >= MIN_SECRET_BYTES)
        .collect()
}

/// The redactor of a host with `options`, outside any session: the built-in patterns and every
/// secret value the host knows (its provider keys, [`crate::RuntimeOptions::withheld_env`]'s
/// values, [`crate::RuntimeOptions::secret_values`]). What a host checks text against that no
/// session's settings cover (a memory entry written through the API).
pub fn host_redactor(options: &crate::RuntimeOptions) -> Redactor {
    let values: Vec<String> = host_secret_values(options, &[]).into_iter().collect();
    // The built-in patterns compile; no configured pattern is added here.
    Redactor::with_values(&[], &values)
        .unwrap_or_else(|_| unreachable!("built-in patterns compile"))
}

/// How many distinct secret sets [`shared_redactor`] remembers; past it, the oldest is
/// forgotten (its sessions keep their redactor; a new session of that set compiles its own).
const SHARED_REDACTORS: usize = 256;

/// The redactors sessions share, by a hash of their secret set (keyed at random per process).
/// Entries are weak: a redactor, and the secret values it holds, goes when its last session
/// does; only the hash stays until the entry is reused.
struct SharedRedactors {
    keys: RandomState,
    entries: Vec<(u64, Weak<Redactor>)>,
}

static SHARED: LazyLock<Mutex<SharedRedactors>> = LazyLock::new(|| {
    Mutex::new(SharedRedactors {
        keys: RandomState::new(),
        entries: Vec::new(),
    })
});

/// The redactor of `patterns` (configured, in order) and the literal `values`, as
/// [`Redactor::with_values`] builds it, shared by every caller with the same set: sessions of
/// one tenant mostly have the same secrets, and a redactor's compiled patterns and their search
/// caches are then held once per process instead of once per session (issue 16: ~60 KB per
/// waiting session). A hash match is confirmed against the redactor's own patterns and values,
/// so two sets never share one by a collision. Redaction is the same as an unshared redactor's.
///
/// # Errors
/// [`RuntimeError::InvalidInput`] naming a pattern that does not compile.
pub(crate) fn shared_redactor(patterns: &[String], values: &[String]) -> Result<Arc<Redactor>> {
    let mut set: Vec<&str> = values
        .iter()
        .filter(|v| v.len() >= MIN_SECRET_BYTES)
        .map(String::as_str)
        .collect();
    set.sort_unstable();
    set.dedup();
    let find = |shared: &SharedRedactors, hash: u64| {
        shared
            .entries
            .iter()
            .filter(|(h, _)| *h == hash)
            .filter_map(|(_, weak)| weak.upgrade())
            .find(|r| r.is_built_from(patterns, values))
    };
    let hash = {
        let shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        let hash = shared.keys.hash_one((patterns, &set));
        if let Some(found) = find(&shared, hash) {
            return Ok(found);
        }
        hash
    };
    // Compiled outside the lock: other sessions' look-ups do not wait for it.
    let built = Arc::new(Redactor::with_values(patterns, values)?);
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = find(&shared, hash) {
        return Ok(found);
    }
    shared.entries.retain(|(_, weak)| weak.strong_count() > 0);
    if shared.entries.len() >= SHARED_REDACTORS {
        shared.entries.remove(0);
    }
    shared.entries.push((hash, Arc::downgrade(&built)));
    Ok(built)
}

impl Inner {
    /// Every secret value this process knows for a session whose `secret_env` is `secret_env`:
    /// the values of those variables, of [`PROVIDER_KEY_ENV`] and of
    /// [`crate::RuntimeOptions::withheld_env`], and [`crate::RuntimeOptions::secret_values`]
    /// (values under 6 bytes left out).
    pub(crate) fn process_secret_values(&self, secret_env: &[String]) -> BTreeSet<String> {
        host_secret_values(&self.options, secret_env)
    }

    /// Reads and opens the session's sealed `secrets` row.
    async fn sealed_secrets(&self, tenant: TenantId, session: SessionId) -> Result<Sealed> {
        let rows = self
            .store
            .sealed_rows(tenant, session, SealedKind::Secrets)
            .await?;
        let Some((_, row)) = rows.into_iter().find(|(id, _)| id == ROW_ID) else {
            return Ok(Sealed::None);
        };
        let opened = self
            .options
            .seal_key
            .open(context(tenant, session).as_bytes(), &row)
            .and_then(|plain| serde_json::from_slice::<BTreeSet<String>>(&plain).ok());
        Ok(match opened {
            Some(values) => Sealed::Values(values),
            None => {
                tracing::warn!(
                    %session,
                    "the session's sealed secret values do not open with this deployment's key; \
                     only the values this process knows are redacted"
                );
                Sealed::Unreadable
            }
        })
    }

    /// The secrets of `session`, whose config is `config` (`None` before `session.created`):
    /// its redactor over the union of its sealed values and this process's, and what to seal.
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::InvalidInput`] for a secret pattern that does not compile.
    pub(crate) async fn session_secrets(
        &self,
        tenant: TenantId,
        session: SessionId,
        config: Option<&SessionConfig>,
    ) -> Result<SessionSecrets> {
        let (patterns, secret_env) = match config {
            Some(c) => (c.secret_patterns.as_slice(), c.secret_env.as_slice()),
            None => (&[][..], &[][..]),
        };
        let mine = self.process_secret_values(secret_env);
        let (values, to_seal) = match self.sealed_secrets(tenant, session).await? {
            Sealed::Values(mut sealed) => {
                let grew = mine.iter().any(|v| !sealed.contains(v));
                sealed.extend(mine);
                let to_seal = grew.then(|| sealed.iter().cloned().collect());
                (sealed, to_seal)
            }
            Sealed::None => {
                let to_seal = (!mine.is_empty()).then(|| mine.iter().cloned().collect());
                (mine, to_seal)
            }
            Sealed::Unreadable => (mine, None),
        };
        let values: Vec<String> = values.into_iter().collect();
        Ok(SessionSecrets {
            redactor: shared_redactor(patterns, &values)?,
            to_seal,
        })
    }

    /// Gives `j` the redactor of its session (config from its fold) and stages its `secrets`
    /// row when this process knows values the row lacks.
    ///
    /// # Errors
    /// As [`Inner::session_secrets`]; [`RuntimeError::Config`] for a config this build cannot
    /// read.
    pub(crate) async fn install_secrets(
        &self,
        j: &mut Journal,
        config: Option<&SessionConfig>,
    ) -> Result<()> {
        let folded;
        let config = match config {
            Some(c) => Some(c),
            None if j.state.session_id.is_some() => {
                folded = j.config()?;
                Some(&folded)
            }
            None => None,
        };
        let s = self.session_secrets(j.tenant, j.session, config).await?;
        j.redactor = s.redactor;
        j.secrets_to_seal = s.to_seal;
        Ok(())
    }
}

impl Journal {
    /// Stages the session's `secrets` row when values are waiting to be sealed (called at each
    /// commit, so a failed commit does not lose them).
    pub(crate) fn stage_secrets(&mut self) {
        let (Some(values), Some(key)) = (&self.secrets_to_seal, &self.seal_key) else {
            return;
        };
        let Ok(plain) = serde_json::to_vec(values) else {
            return;
        };
        let row = key.seal(context(self.tenant, self.session).as_bytes(), &plain);
        let k = SealedKey::new(SealedKind::Secrets, ROW_ID);
        self.extras.seal.retain(|(existing, _)| *existing != k);
        self.extras.seal.push((k, row));
    }
}

impl Runtime {
    /// The redactor of `session`: built-in patterns, the session's `secret_patterns`, and every
    /// secret value known for it — those sealed for the session by earlier processes and those
    /// this process knows (see `crate::secrets`). Hosts redact with it whatever they write to
    /// the store or show of the session themselves (a deny reason, a note).
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Config`] for a config this build cannot read (its secret
    /// patterns must not be dropped silently).
    pub async fn redactor(&self, tenant: TenantId, session: SessionId) -> Result<Redactor> {
        Ok(self
            .shared_redactor(tenant, session)
            .await?
            .as_ref()
            .clone())
    }

    /// [`Runtime::redactor`] as the one shared instance this process redacts the session's
    /// journal with (`crate::secrets::shared_redactor`): a subscription holding it knows the
    /// bodies of the events this process commits went through it already.
    ///
    /// # Errors
    /// As [`Runtime::redactor`].
    pub(crate) async fn shared_redactor(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<Arc<Redactor>> {
        let first = self.inner.store.read(tenant, session, 1, Some(1)).await?;
        let config = match first.first().map(|e| &e.body) {
            Some(EventBody::SessionCreated { config, .. }) => Some(
                serde_json::from_value::<SessionConfig>(config.clone()).map_err(|e| {
                    RuntimeError::Config {
                        session,
                        reason: e.to_string(),
                    }
                })?,
            ),
            _ => None,
        };
        Ok(self
            .inner
            .session_secrets(tenant, session, config.as_ref())
            .await?
            .redactor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn sessions_with_the_same_secrets_share_one_redactor_and_other_sets_do_not() {
        let patterns = strings(&["tok_[0-9]{4}"]);
        let values = strings(&["hunter2-secret", "another-secret"]);
        let a = shared_redactor(&patterns, &values).unwrap();
        // The same set, spelled in another order with a duplicate and a too-short value.
        let same = strings(&["another-secret", "hunter2-secret", "hunter2-secret", "ab"]);
        let b = shared_redactor(&patterns, &same).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "one compiled redactor for one secret set"
        );

        let other_values = shared_redactor(&patterns, &strings(&["hunter2-secret"])).unwrap();
        let other_patterns = shared_redactor(&strings(&["key_[a-z]{4}"]), &values).unwrap();
        let no_patterns = shared_redactor(&[], &values).unwrap();
        for other in [&other_values, &other_patterns, &no_patterns] {
            assert!(!Arc::ptr_eq(&a, other), "another set has its own redactor");
        }

        // Sharing changes nothing in what is redacted.
        let text = "tok_1234 hunter2-secret another-secret key_abcd";
        let alone = Redactor::with_values(&patterns, &values).unwrap();
        assert_eq!(a.redact_str(text), alone.redact_str(text));
        assert_eq!(
            a.redact_str(text),
            "[REDACTED] [REDACTED] [REDACTED] key_abcd"
        );
        assert_eq!(
            other_values.redact_str(text),
            "[REDACTED] [REDACTED] another-secret key_abcd"
        );
        assert_eq!(
            other_patterns.redact_str(text),
            "tok_1234 [REDACTED] [REDACTED] [REDACTED]"
        );

        // Once its last holder is gone, the set's redactor (and its values) goes too.
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none());
        assert!(shared_redactor(&patterns, &values).is_ok());
    }

    #[test]
    fn a_bad_pattern_is_refused_and_not_remembered() {
        let bad = strings(&["(unclosed"]);
        assert!(shared_redactor(&bad, &[]).is_err());
        assert!(shared_redactor(&bad, &[]).is_err());
    }
}
