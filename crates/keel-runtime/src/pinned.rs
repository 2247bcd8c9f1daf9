//! The pinned release: what a session runs, and re-pinning it.
//!
//! **What runs is the release the session has pinned** — the one in `session.created`, or the
//! last `session.release_pinned` ([`SessionState::release_id`](keel_core::SessionState)):
//!
//! - its **instructions** and **tools**: the model sees only the release's `tools` (all the
//!   registry's when the list is empty), and a call to any other tool is rejected even when the
//!   model names it without having seen it ([`tool_enabled`]);
//! - its **policy rules** (`definition.policy`: `{"allow": [...], "ask": [...], "deny": [...]}`,
//!   or `null`), always enforced ([`enforced_policy`]);
//! - its **model route**: the runtime samples the [`keel_model::ModelClient`] its host gave
//!   [`Runtime::new`], so a host builds that client from [`Runtime::pinned_release`]'s
//!   `model_route` (the `keel` CLI does) — never from its own configuration;
//! - its default budget, under the settings' budgets.
//!
//! **Settings only tighten.** [`crate::SessionConfig`] adds the permission mode, sandbox,
//! budgets and `ask`/`deny` rules (a rule can only make a call ask or be denied), changed between
//! turns without a new release (`session.config_changed`). An `allow` rule loosens the policy, so
//! it belongs to a release: [`Runtime::create_session`] and [`Runtime::update_config`] refuse
//! `allow` rules in the settings. Changing the route, tools or policy rules is a re-pin
//! ([`Runtime::repin`]): a journaled `session.release_pinned` naming the old and the new release.
//!
//! **Journals written before.** Sessions created by earlier builds kept their rules in the
//! settings as well (the `keel` CLI wrote them to both places): their `ask`/`deny` rules still
//! apply as settings, and their `allow` rules apply only while the session runs a release without
//! any policy (`null`) — so such a session behaves as it did, and once re-pinned the new
//! release's rules decide.

use keel_core::{Correlation, EventBody, Release, ReleaseId, SessionId, SessionStatus, TenantId};
use keel_tools::policy::{Policy, Rule, RuleAction, RuleSource};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::SessionConfig;
use crate::error::{Result, RuntimeError};
use crate::hold::Held;
use crate::runtime::Runtime;

/// A release's `definition.policy`, as the runtime reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleasePolicy {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// The policy rules of `release` (source [`RuleSource::Agent`]).
///
/// # Errors
/// What is wrong with its `definition.policy`, in words: not an object of `allow`/`ask`/`deny`
/// lists (another key, such as a permission mode, is refused), or a rule that does not parse.
fn release_rules(release: &Release) -> std::result::Result<Vec<Rule>, String> {
    let policy: ReleasePolicy = match &release.definition.policy {
        Value::Null => ReleasePolicy::default(),
        v => serde_json::from_value(v.clone()).map_err(|e| {
            format!(
                "policy: {e} (expected {{\"allow\": [...], \"ask\": [...], \"deny\": [...]}}; the permission mode is a session setting)"
            )
        })?,
    };
    let mut rules = Vec::new();
    for (action, patterns) in [
        (RuleAction::Allow, &policy.allow),
        (RuleAction::Ask, &policy.ask),
        (RuleAction::Deny, &policy.deny),
    ] {
        for p in patterns {
            rules
                .push(Rule::new(action, p, RuleSource::Agent).map_err(|e| format!("policy: {e}"))?);
        }
    }
    Ok(rules)
}

/// Checks a release a session is to pin: its id matches its definition, its policy parses.
///
/// # Errors
/// [`RuntimeError::InvalidInput`] naming the release.
pub fn check_release(release: &Release) -> Result<()> {
    if !release.verify() {
        return Err(RuntimeError::InvalidInput(format!(
            "release {} does not match its definition's hash",
            release.id
        )));
    }
    release_rules(release)
        .map(|_| ())
        .map_err(|reason| RuntimeError::InvalidInput(format!("release {}: {reason}", release.id)))
}

/// Refuses `allow` rules in settings that did not hold exactly these before (`before`: `None`
/// for a new session). They loosen the policy, so they belong to a release.
///
/// # Errors
/// [`RuntimeError::InvalidInput`] naming the first such rule.
pub(crate) fn check_settings_rules(
    config: &SessionConfig,
    before: Option<&[String]>,
) -> Result<()> {
    if before.is_some_and(|b| b == config.allow.as_slice()) {
        return Ok(());
    }
    match config.allow.first() {
        Some(rule) => Err(RuntimeError::InvalidInput(format!(
            "allow rule {rule:?}: `allow` rules loosen the policy, so they belong to the release (its policy.allow); re-pin the session with Runtime::repin instead of changing its settings"
        ))),
        None => Ok(()),
    }
}

/// The policy a session enforces: the settings' permission mode; the release's rules; the
/// settings' `ask` and `deny` rules (and, for a release without any policy, the `allow` rules an
/// older build kept in the settings — see the module docs).
///
/// # Errors
/// [`RuntimeError::Release`] when the release's policy cannot be read;
/// [`RuntimeError::InvalidInput`] naming a settings rule that does not parse.
pub(crate) fn enforced_policy(
    session: SessionId,
    release: &Release,
    config: &SessionConfig,
) -> Result<Policy> {
    let mut policy = Policy::new(config.permission_mode);
    policy.rules = release_rules(release).map_err(|reason| RuntimeError::Release {
        session,
        release: release.id.clone(),
        reason,
    })?;
    let legacy_allow: &[String] = if release.definition.policy.is_null() {
        &config.allow
    } else {
        &[]
    };
    for (action, patterns) in [
        (RuleAction::Allow, legacy_allow),
        (RuleAction::Ask, config.ask.as_slice()),
        (RuleAction::Deny, config.deny.as_slice()),
    ] {
        for p in patterns {
            policy.rules.push(
                Rule::new(action, p, RuleSource::Settings)
                    .map_err(|e| RuntimeError::InvalidInput(e.to_string()))?,
            );
        }
    }
    Ok(policy)
}

/// Whether `release` lets its agent call tool `name` (an empty `tools` list enables every tool
/// of the registry).
pub(crate) fn tool_enabled(release: &Release, name: &str) -> bool {
    if name == crate::subagents::SPAWN_AGENT && release.definition.agents.is_empty() {
        return false;
    }
    let tools = &release.definition.tools;
    tools.is_empty() || tools.iter().any(|t| t == name)
}

/// The tools the model of `release` is shown, as the allow list `crate::context::project`
/// takes (empty: every tool of `registry`): the release's list, without `spawn_agent` when
/// the release defines no agents (see [`tool_enabled`]).
pub(crate) fn offered_tools<'a>(
    release: &'a Release,
    registry: &keel_tools::ToolRegistry,
) -> std::borrow::Cow<'a, [String]> {
    let spawn = crate::subagents::SPAWN_AGENT;
    let tools = &release.definition.tools;
    if !release.definition.agents.is_empty() || registry.get(spawn).is_none() {
        return std::borrow::Cow::Borrowed(tools);
    }
    let all: Box<dyn Iterator<Item = &String>> = if tools.is_empty() {
        Box::new(registry.iter_specs().map(|s| &s.name))
    } else {
        Box::new(tools.iter())
    };
    std::borrow::Cow::Owned(all.filter(|t| *t != spawn).cloned().collect())
}

/// What [`Runtime::repin`] journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repin {
    /// The release the session ran until now.
    pub from_release_id: ReleaseId,
    /// The release it runs from now on.
    pub to_release_id: ReleaseId,
    /// The journal's version after `session.release_pinned`.
    pub version: u64,
}

impl Runtime {
    /// The release `session` runs now: the one pinned in `session.created`, or the last
    /// re-pin's. A host builds the model it gives [`Runtime::new`] from its `model_route`.
    ///
    /// # Errors
    /// Unknown session; [`RuntimeError::Config`] for a journal without `session.created`; store
    /// errors.
    pub async fn pinned_release(&self, tenant: TenantId, session: SessionId) -> Result<Release> {
        let state = self.view(tenant, session).await?.state;
        let id = state.release_id.ok_or(RuntimeError::Config {
            session,
            reason: "the journal has no session.created".into(),
        })?;
        Ok(self.inner.store.get_release(tenant, &id).await?)
    }

    /// Re-pins `session` to `release`: stores the release (content-hashed, idempotent) and
    /// journals `session.release_pinned {from_release_id, to_release_id}`; the store's session
    /// row follows in the same commit. Every later turn — on any worker, after a restart too —
    /// runs the new release's instructions, tools and policy rules, and a host builds its model
    /// from the new route. This is how the route, tools or policy rules change; settings
    /// (permission mode, sandbox, budgets, `ask`/`deny` rules) change with
    /// [`Runtime::update_config`]. Returns `None`, writing nothing, when the session already
    /// runs `release`.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a release whose id does not match its definition or
    /// whose policy does not parse; [`RuntimeError::TurnActive`] while the session has an
    /// active turn (running, or waiting on a human); [`RuntimeError::SessionBusy`] when a
    /// worker (this process or another) runs the session; [`RuntimeError::Closed`]; store
    /// errors. Nothing is journaled on error.
    pub async fn repin(
        &self,
        tenant: TenantId,
        session: SessionId,
        release: &Release,
    ) -> Result<Option<Repin>> {
        Ok(self
            .repin_with_config(tenant, session, release, |_| {})
            .await?
            .0)
    }

    /// [`Runtime::repin`] and [`Runtime::update_config`] at once: re-pins `session` to
    /// `release` and applies `change` to its settings, journaling `session.release_pinned`
    /// (when the release differs) followed by `session.config_changed` (when the settings
    /// differ) in **one commit** — both or neither. Between turns only, as [`Runtime::repin`]
    /// (even when only the settings change). Returns what was re-pinned (`None` when the session
    /// already ran `release`) and the effective config afterwards.
    ///
    /// # Errors
    /// Those of [`Runtime::repin`] and [`Runtime::update_config`]; the settings are validated
    /// before anything is written, and nothing is journaled on error.
    pub async fn repin_with_config(
        &self,
        tenant: TenantId,
        session: SessionId,
        release: &Release,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<(Option<Repin>, SessionConfig)> {
        check_release(release)?;
        let mut held = match self.inner.hold_now(tenant, session).await? {
            Ok(Held::Local(g)) => {
                drop(g);
                return Err(RuntimeError::SessionBusy {
                    session,
                    owner: self.inner.owner.clone(),
                });
            }
            Ok(held) => held,
            Err(owner) => return Err(RuntimeError::SessionBusy { session, owner }),
        };
        let r = self.repin_held(&mut held, release, change).await;
        self.inner.unhold(tenant, held).await;
        r
    }

    async fn repin_held(
        &self,
        held: &mut Held,
        release: &Release,
        change: impl FnOnce(&mut SessionConfig),
    ) -> Result<(Option<Repin>, SessionConfig)> {
        let j = held.journal();
        let session = j.session;
        if j.state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        if let Some(turn) = j.state.active_turn {
            return Err(RuntimeError::TurnActive { session, turn });
        }
        let from = j.state.release_id.clone().ok_or(RuntimeError::Config {
            session,
            reason: "the journal has no session.created".into(),
        })?;
        let (config, changes) = Runtime::planned_config(j, change)?;
        let repin = from != release.id;
        let mut items = Vec::new();
        if repin {
            self.inner.store.put_release(j.tenant, release).await?;
            items.push((
                Correlation::default().by(self.actor),
                EventBody::SessionReleasePinned {
                    from_release_id: from.clone(),
                    to_release_id: release.id.clone(),
                },
            ));
        }
        if let Some(changes) = changes {
            items.push((
                Correlation::default().by(self.actor),
                EventBody::SessionConfigChanged { changes },
            ));
        }
        if items.is_empty() {
            return Ok((None, config));
        }
        let site = if repin {
            "session.release_pinned"
        } else {
            "session.config_changed"
        };
        let version = j.append(site, items).await?;
        let repinned = repin.then(|| Repin {
            from_release_id: from,
            to_release_id: release.id.clone(),
            version,
        });
        Ok((repinned, j.config()?))
    }
}
