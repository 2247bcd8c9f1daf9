//! Long-term memory tools (issue 15): `memory_read {namespace?, key}`,
//! `memory_write {namespace?, key, value}` and `memory_search {namespace?, query, limit?}` over
//! the tenant-scoped memory store ([`keel_store::Store::memory_put`] and friends) — facts an
//! agent keeps between sessions, separate from transcript, journal and usage.
//!
//! **Namespaces.** Every call works in the session's memory scope ([`MemoryScope`], set by the
//! host's `[memory] namespace`): `agent:<agent name>` (per agent, the default),
//! `user:<creator principal>` (per user: the principal that created the session, `local` for a
//! session the local CLI created) or `shared` (the whole tenant). The model's optional
//! `namespace` argument picks a sub-namespace inside that scope (stored as `<scope>/<namespace>`);
//! without it the scope itself. A call can never reach another scope or another tenant.
//!
//! **Writes.** `memory_write` is an idempotent write: the runtime journals its effect
//! (`effect.prepared` with a probe of the entry before and after, `effect.dispatched`, then the
//! outcome) and it is policy-checked like other writes; after a crash its outcome is read back
//! from the store ([`Tool::reconcile_call`]). Values (any JSON) larger than
//! [`MemorySettings::max_value_bytes`] (64 KiB by default, measured as compact JSON), and
//! values, keys or sub-namespaces holding a secret the session's redactor knows, are refused
//! with a tool error saying why; nothing is stored. Reads and searches are read-only.
//!
//! Search is the store's full-text search (SQLite FTS5 with BM25, PostgreSQL `tsvector` with
//! `ts_rank`): every word of the query must start a word of the key or value.

use std::sync::Arc;

use async_trait::async_trait;
use keel_store::{MemoryEntry, Store};
use keel_tools::tool::ReconcileOutcome;
use keel_tools::{EffectClass, SessionScope, Tool, ToolContext, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Which memory a session's calls use (`[memory] namespace` in `keel.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// One memory per agent (`agent:<agent name>`), shared by its sessions and users.
    #[default]
    Agent,
    /// One memory per user (`user:<principal id>`, `user:local` for the local CLI).
    User,
    /// One memory for the whole tenant (`shared`).
    Shared,
}

impl MemoryScope {
    /// The scope's configuration spelling (`agent`, `user`, `shared`).
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryScope::Agent => "agent",
            MemoryScope::User => "user",
            MemoryScope::Shared => "shared",
        }
    }

    /// The stored namespace of this scope for a session (see the module docs).
    pub fn root(self, session: &SessionScope) -> String {
        match self {
            MemoryScope::Agent => format!("agent:{}", session.agent),
            MemoryScope::User => match &session.creator {
                Some(p) => format!("user:{p}"),
                None => format!("user:{LOCAL_USER}"),
            },
            MemoryScope::Shared => "shared".to_owned(),
        }
    }
}

/// The user of sessions a local host created (no principal): `user:local`.
pub const LOCAL_USER: &str = "local";

/// Default largest value, bytes of compact JSON (64 KiB).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 64 * 1024;

/// Longest key and sub-namespace, characters.
pub const MAX_KEY_CHARS: usize = 256;

/// Most results `memory_search` returns (and its default `limit`: 10).
pub const MAX_SEARCH_RESULTS: u32 = 50;

/// How a host's memory tools behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    /// Whose memory calls use.
    pub scope: MemoryScope,
    /// Values whose compact JSON is longer than this many bytes are refused.
    pub max_value_bytes: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            scope: MemoryScope::Agent,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
        }
    }
}

/// The memory tools' names.
pub const TOOL_NAMES: [&str; 3] = ["memory_read", "memory_write", "memory_search"];

/// The three memory tools over `store`, for a host's tool registry.
pub fn memory_tools(store: Arc<dyn Store>, settings: MemorySettings) -> Vec<Arc<dyn Tool>> {
    let m = Memory { store, settings };
    vec![
        Arc::new(MemoryRead(m.clone())),
        Arc::new(MemoryWrite(m.clone())),
        Arc::new(MemorySearch(m)),
    ]
}

/// Why a memory entry is refused ([`check_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The value's compact JSON is `bytes` long, over `max` bytes.
    TooLarge {
        /// Its length, bytes of compact JSON.
        bytes: usize,
        /// The limit ([`MemorySettings::max_value_bytes`]).
        max: usize,
    },
    /// The value (or a name) holds a secret the redactor knows.
    Secret,
}

impl Refusal {
    /// What the refusal says as JSON (`{"refused": "too_large", "bytes", "max_value_bytes"}` or
    /// `{"refused": "secret"}`): a tool result's details.
    pub fn details(&self) -> Value {
        match self {
            Refusal::TooLarge { bytes, max } => {
                json!({"refused": "too_large", "bytes": bytes, "max_value_bytes": max})
            }
            Refusal::Secret => json!({"refused": "secret"}),
        }
    }
}

impl std::fmt::Display for Refusal {
    /// Says why, never echoing the value (nor the secret in it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooLarge { bytes, max } => write!(
                f,
                "the value is {bytes} bytes (as JSON), over the memory limit of {max} bytes; store a shorter summary"
            ),
            Refusal::Secret => f.write_str(
                "the entry holds a secret (it matches the secret patterns or values); memory never stores secrets — leave the secret out",
            ),
        }
    }
}

/// The checks every memory write goes through — the `memory_write` tool's and the API's
/// `PUT /v1/memory/{namespace}/{key}` alike: `value`'s compact JSON is at most
/// `max_value_bytes` long, and neither it nor any of `names` (the key, the namespace) holds a
/// secret `secrets` knows (the redactor's patterns and values, plain or JSON-escaped).
///
/// # Errors
/// The first [`Refusal`]: the size first, then secrets.
pub fn check_entry(
    value: &Value,
    names: &[&str],
    max_value_bytes: usize,
    secrets: &dyn keel_tools::SecretCheck,
) -> Result<(), Refusal> {
    let text = value.to_string();
    if text.len() > max_value_bytes {
        return Err(Refusal::TooLarge {
            bytes: text.len(),
            max: max_value_bytes,
        });
    }
    if std::iter::once(text.as_str())
        .chain(names.iter().copied())
        .any(|t| secrets.holds_secret(t))
    {
        return Err(Refusal::Secret);
    }
    Ok(())
}

/// What the three tools share.
#[derive(Clone)]
struct Memory {
    store: Arc<dyn Store>,
    settings: MemorySettings,
}

impl Memory {
    /// The session scope, or the error of a call made outside a session.
    fn session<'a>(
        &self,
        tool: &str,
        ctx: &'a ToolContext,
    ) -> Result<&'a SessionScope, ToolOutput> {
        ctx.session.as_deref().ok_or_else(|| {
            ToolOutput::not_performed(format!(
                "{tool} failed: memory is only available inside a session"
            ))
        })
    }

    /// The stored namespace for the call's optional `namespace`.
    fn namespace(
        &self,
        tool: &str,
        session: &SessionScope,
        sub: Option<&str>,
    ) -> Result<String, ToolOutput> {
        let root = self.settings.scope.root(session);
        match sub {
            None => Ok(root),
            Some(ns) => {
                let ok = !ns.is_empty()
                    && ns.chars().count() <= MAX_KEY_CHARS
                    && ns
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if ok {
                    Ok(format!("{root}/{ns}"))
                } else {
                    Err(ToolOutput::rejected(format!(
                        "{tool}: invalid namespace {ns:?}: use 1 to {MAX_KEY_CHARS} letters, digits, `_`, `-` or `.`, or leave it out for this agent's memory"
                    )))
                }
            }
        }
    }

    /// Checks a key: 1 to [`MAX_KEY_CHARS`] characters, no control characters.
    fn key<'k>(&self, tool: &str, key: &'k str) -> Result<&'k str, ToolOutput> {
        if key.is_empty()
            || key.chars().count() > MAX_KEY_CHARS
            || key.chars().any(char::is_control)
        {
            return Err(ToolOutput::rejected(format!(
                "{tool}: invalid key {key:?}: use 1 to {MAX_KEY_CHARS} characters without control characters"
            )));
        }
        Ok(key)
    }

    /// The call's session, stored namespace and key.
    fn locate(
        &self,
        tool: &str,
        ctx: &ToolContext,
        namespace: Option<&str>,
        key: &str,
    ) -> Result<(keel_core::TenantId, String, String), ToolOutput> {
        let session = self.session(tool, ctx)?;
        let ns = self.namespace(tool, session, namespace)?;
        let key = self.key(tool, key)?;
        Ok((session.tenant_id, ns, key.to_owned()))
    }

    /// The keyed hash of an entry's value as stored (`absent` when there is none).
    fn entry_hash(ctx: &ToolContext, value: Option<&Value>) -> Value {
        match value {
            Some(v) => Value::String(ctx.hash_key.hash(v.to_string().as_bytes())),
            None => Value::String("absent".into()),
        }
    }
}

/// The entry shown to the model.
fn shown(e: &MemoryEntry, root: &str) -> Value {
    let namespace = e
        .namespace
        .strip_prefix(root)
        .and_then(|rest| rest.strip_prefix('/'));
    json!({
        "namespace": namespace,
        "key": e.key,
        "value": e.value,
        "updated_at": e.updated_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    })
}

fn parse<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(args)
        .map_err(|e| ToolOutput::rejected(format!("{tool}: invalid arguments: {e}")))
}

fn store_failure(tool: &str, e: &keel_store::StoreError) -> ToolOutput {
    ToolOutput::error(format!("{tool} failed: the memory store answered: {e}"))
}

const NAMESPACE_PROP: &str = "Optional sub-namespace (letters, digits, `_`, `-`, `.`) inside this agent's memory; leave it out for the default one.";

/// The `namespace` property: the same rule as [`Memory::namespace`], stated in the schema so a
/// malformed one is refused when the call is validated, before it starts.
fn namespace_schema() -> Value {
    json!({
        "type": "string",
        "pattern": format!("^[A-Za-z0-9_.-]{{1,{MAX_KEY_CHARS}}}$"),
        "description": NAMESPACE_PROP,
    })
}

/// The `key` property: the same rule as [`Memory::key`] (1 to [`MAX_KEY_CHARS`] characters, no
/// control characters), checked at validation.
fn key_schema(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_CHARS,
        "pattern": "^[^\\u0000-\\u001F\\u007F-\\u009F]*$",
        "description": description,
    })
}

/// `memory_read {namespace?, key}`.
struct MemoryRead(Memory);

#[derive(Deserialize)]
struct ReadArgs {
    namespace: Option<String>,
    key: String,
}

#[async_trait]
impl Tool for MemoryRead {
    fn name(&self) -> &str {
        "memory_read"
    }

    fn description(&self) -> &str {
        "Read one entry of your long-term memory (facts kept between sessions) by key."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "namespace": namespace_schema(),
                "key": key_schema("The entry's key.")
            },
            "required": ["key"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let run = async {
            let a: ReadArgs = parse(self.name(), args)?;
            let (tenant, ns, key) =
                self.0
                    .locate(self.name(), ctx, a.namespace.as_deref(), &a.key)?;
            let root = self
                .0
                .settings
                .scope
                .root(self.0.session(self.name(), ctx)?);
            match self.0.store.memory_get(tenant, &ns, &key).await {
                Ok(Some(e)) => Ok(ToolOutput::success(shown(&e, &root).to_string())),
                Ok(None) => Ok(ToolOutput::success(format!(
                    "No memory entry {key:?}{}.",
                    a.namespace
                        .map(|n| format!(" in namespace {n:?}"))
                        .unwrap_or_default()
                ))
                .with_details(json!({"found": false}))),
                Err(e) => Err(store_failure(self.name(), &e)),
            }
        };
        run.await.unwrap_or_else(|out| out)
    }
}

/// `memory_write {namespace?, key, value}`.
struct MemoryWrite(Memory);

#[derive(Deserialize)]
struct WriteArgs {
    namespace: Option<String>,
    key: String,
    value: Value,
}

impl MemoryWrite {
    /// Everything checked before the write: the entry's place and the value's size and secrets.
    fn check(
        &self,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<(keel_core::TenantId, String, String, Value), ToolOutput> {
        let tool = self.name();
        let a: WriteArgs = parse(tool, args)?;
        let (tenant, ns, key) = self.0.locate(tool, ctx, a.namespace.as_deref(), &a.key)?;
        let session = self.0.session(tool, ctx)?;
        if let Err(refused) = check_entry(
            &a.value,
            &[key.as_str(), ns.as_str()],
            self.0.settings.max_value_bytes,
            session.secrets.as_ref(),
        ) {
            return Err(
                ToolOutput::not_performed(format!("{tool} refused: {refused}"))
                    .with_details(refused.details()),
            );
        }
        Ok((tenant, ns, key, a.value))
    }
}

#[async_trait]
impl Tool for MemoryWrite {
    fn name(&self) -> &str {
        "memory_write"
    }

    fn description(&self) -> &str {
        "Write (insert or replace) one entry of your long-term memory: a fact worth keeping for \
         later sessions. The value is any JSON (at most the configured size, 64 KiB by default). \
         Never store secrets: values holding one are refused."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "namespace": namespace_schema(),
                "key": key_schema("The entry's key (replaces an entry with the same key)."),
                "value": {"description": "What to remember: text or any JSON value."}
            },
            "required": ["key", "value"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::IdempotentWrite
    }

    fn can_reconcile(&self) -> bool {
        true
    }

    /// The entry's value hash before and the hash the call gives it.
    async fn prepare(&self, args: &Value, ctx: &ToolContext) -> Option<Value> {
        let (tenant, ns, key, value) = self.check(args.clone(), ctx).ok()?;
        let before = self.0.store.memory_get(tenant, &ns, &key).await.ok()?;
        Some(json!({
            "before": Memory::entry_hash(ctx, before.as_ref().map(|e| &e.value)),
            "after": Memory::entry_hash(ctx, Some(&value)),
        }))
    }

    /// The entry has the intended value (committed), still the one before (not happened), or
    /// something else (unknown: a human decides).
    async fn reconcile_call(
        &self,
        _operation_key: &str,
        arguments: &Value,
        probe: Option<&Value>,
        ctx: &ToolContext,
    ) -> ReconcileOutcome {
        let (Some(probe), Ok((tenant, ns, key, _))) = (probe, self.check(arguments.clone(), ctx))
        else {
            return ReconcileOutcome::Unknown;
        };
        let Ok(now) = self.0.store.memory_get(tenant, &ns, &key).await else {
            return ReconcileOutcome::Unknown;
        };
        let now = Memory::entry_hash(ctx, now.as_ref().map(|e| &e.value));
        if probe.get("after") == Some(&now) {
            ReconcileOutcome::Committed {
                output: ToolOutput::success(format!(
                    "memory_write: {key:?} has the intended value (checked after a crash)"
                )),
            }
        } else if probe.get("before") == Some(&now) {
            ReconcileOutcome::NotHappened {
                reason: format!("memory entry {key:?} still has its value from before the call"),
            }
        } else {
            ReconcileOutcome::Unknown
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let (tenant, ns, key, value) = match self.check(args, ctx) {
            Ok(c) => c,
            Err(out) => return out,
        };
        let bytes = value.to_string().len();
        match self.0.store.memory_put(tenant, &ns, &key, &value).await {
            Ok(()) => ToolOutput::success(format!("Remembered {key:?} ({bytes} bytes)."))
                .with_details(json!({"bytes": bytes})),
            Err(e) => store_failure(self.name(), &e),
        }
    }
}

/// `memory_search {namespace?, query, limit?}`.
struct MemorySearch(Memory);

#[derive(Deserialize)]
struct SearchArgs {
    namespace: Option<String>,
    query: String,
    limit: Option<u32>,
}

#[async_trait]
impl Tool for MemorySearch {
    fn name(&self) -> &str {
        "memory_search"
    }

    fn description(&self) -> &str {
        "Full-text search of your long-term memory: entries whose key or value has every word of \
         the query (as a word or the start of one), best match first."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "namespace": namespace_schema(),
                "query": {"type": "string", "description": "Words to look for."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_RESULTS, "description": "Most results (default 10)."}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let run = async {
            let tool = self.name();
            let a: SearchArgs = parse(tool, args)?;
            let session = self.0.session(tool, ctx)?;
            let ns = self.0.namespace(tool, session, a.namespace.as_deref())?;
            let root = self.0.settings.scope.root(session);
            let limit = a.limit.unwrap_or(10).clamp(1, MAX_SEARCH_RESULTS);
            let found = self
                .0
                .store
                .memory_search(session.tenant_id, Some(&ns), &a.query, limit)
                .await
                .map_err(|e| store_failure(tool, &e))?;
            if found.is_empty() {
                return Ok(
                    ToolOutput::success(format!("No memory entry matches {:?}.", a.query))
                        .with_details(json!({"count": 0})),
                );
            }
            let items: Vec<Value> = found.iter().map(|e| shown(e, &root)).collect();
            Ok(ToolOutput::success(Value::Array(items).to_string())
                .with_details(json!({"count": found.len()})))
        };
        run.await.unwrap_or_else(|out| out)
    }
}
