//! `keel memory list|get|rm`: what agents remember between sessions (the memory tools'
//! entries, `keel_runtime::memory`), for people to read and forget — on the local store, or
//! with `--server` through the API (`/v1/memory/…`).
//!
//! The namespace is `--namespace`, else the one the CLI's own sessions use: its agent is
//! `keel`, so `agent:keel` (`[memory] namespace = "agent"`, the default), `user:local`
//! (`"user"`) or `shared` (`"shared"`). A model's sub-namespace `N` is stored as
//! `<that>/N` (e.g. `agent:keel/people`); `list` names the sub-namespaces of the namespace it
//! lists, with their entry counts (on the local store).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Utc};
use keel_runtime::memory::{LOCAL_USER, MemoryScope};
use keel_store::Store;
use serde_json::{Value, json};

use crate::cli::{GlobalArgs, MemoryCommand};
use crate::config::Config;
use crate::remote::Server;

/// The name of the agent of the CLI's sessions (`crate::run::release_of`).
const CLI_AGENT: &str = "keel";

/// Most entries `list` prints (a search: the best this many).
const LIST_LIMIT: u32 = 1000;

/// One entry as the commands print it.
struct Entry {
    namespace: String,
    key: String,
    value: Value,
    updated_at: DateTime<Utc>,
}

impl Entry {
    fn json(&self) -> Value {
        json!({
            "namespace": self.namespace,
            "key": self.key,
            "value": self.value,
            "updated_at": self.updated_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })
    }
}

impl From<keel_store::MemoryEntry> for Entry {
    fn from(e: keel_store::MemoryEntry) -> Self {
        Self {
            namespace: e.namespace,
            key: e.key,
            value: e.value,
            updated_at: e.updated_at,
        }
    }
}

impl From<keel_client::api::MemoryBody> for Entry {
    fn from(e: keel_client::api::MemoryBody) -> Self {
        Self {
            namespace: e.namespace,
            key: e.key,
            value: e.value,
            updated_at: e.updated_at,
        }
    }
}

/// The namespace a command works in: `--namespace`, else the CLI sessions' (module docs).
///
/// # Errors
/// `[memory] namespace = "user"` with `--server`: the server's user is the key's principal,
/// which the CLI does not know.
fn namespace_of(given: Option<String>, config: &Config, remote: bool) -> anyhow::Result<String> {
    if let Some(ns) = given {
        anyhow::ensure!(
            !ns.is_empty(),
            "--namespace: give a namespace, e.g. agent:keel"
        );
        return Ok(ns);
    }
    let scope = config
        .merged
        .memory
        .as_ref()
        .map(crate::config::MemoryConfig::settings)
        .transpose()?
        .flatten()
        .map_or(MemoryScope::Agent, |s| s.scope);
    Ok(match scope {
        MemoryScope::Agent => format!("agent:{CLI_AGENT}"),
        // A usage error (exit 2): the flag is what is missing.
        MemoryScope::User if remote => {
            return Err(anyhow::Error::new(crate::exit::UsageError(
                "[memory] namespace is \"user\": on a server that is user:<principal id> of whoever created the session, which keel cannot tell from its key; name it with --namespace user:<principal id>".to_owned(),
            )));
        }
        MemoryScope::User => format!("user:{LOCAL_USER}"),
        MemoryScope::Shared => "shared".to_owned(),
    })
}

/// Where the entries are: the local store (the CLI's tenant) or a server.
enum Backend {
    Local(Arc<dyn Store>, keel_core::TenantId),
    Remote(keel_client::Client),
}

impl Backend {
    fn explain(&self, e: keel_client::Error) -> anyhow::Error {
        match self {
            Backend::Remote(client) => crate::remote::explain(client, e),
            Backend::Local(..) => anyhow::Error::new(e),
        }
    }

    /// A namespace's entries by key, or what `search` finds.
    async fn list(&self, ns: &str, search: Option<&str>) -> anyhow::Result<Vec<Entry>> {
        Ok(match self {
            Backend::Local(store, tenant) => match search {
                Some(q) => {
                    store
                        .memory_search(*tenant, Some(ns), q, LIST_LIMIT)
                        .await?
                }
                None => store.memory_list(*tenant, ns, None, LIST_LIMIT).await?,
            }
            .into_iter()
            .map(Entry::from)
            .collect(),
            Backend::Remote(client) => client
                .list_memory(ns, search)
                .await
                .map_err(|e| self.explain(e))?
                .into_iter()
                .map(Entry::from)
                .collect(),
        })
    }

    /// The namespaces below `ns` (`ns/…`) with their entry counts. On a server: none (the API
    /// lists one namespace at a time; name a sub-namespace with `--namespace`).
    async fn sub_namespaces(&self, ns: &str) -> anyhow::Result<Vec<(String, u64)>> {
        Ok(match self {
            Backend::Local(store, tenant) => {
                let prefix = format!("{ns}/");
                store
                    .memory_namespaces(*tenant)
                    .await?
                    .into_iter()
                    .filter(|(n, _)| n.starts_with(&prefix))
                    .collect()
            }
            Backend::Remote(_) => Vec::new(),
        })
    }

    /// One entry, `None` when there is none.
    async fn get(&self, ns: &str, key: &str) -> anyhow::Result<Option<Entry>> {
        match self {
            Backend::Local(store, tenant) => {
                Ok(store.memory_get(*tenant, ns, key).await?.map(Entry::from))
            }
            Backend::Remote(client) => match client.get_memory(ns, key).await {
                Ok(e) => Ok(Some(Entry::from(e))),
                Err(e) if e.status() == Some(404) => Ok(None),
                Err(e) => Err(self.explain(e)),
            },
        }
    }

    /// Deletes one entry; whether it was there.
    async fn delete(&self, ns: &str, key: &str) -> anyhow::Result<bool> {
        match self {
            Backend::Local(store, tenant) => Ok(store.memory_delete(*tenant, ns, key).await?),
            Backend::Remote(client) => {
                // The API's delete is idempotent: ask first, to say when there was nothing.
                if self.get(ns, key).await?.is_none() {
                    return Ok(false);
                }
                client
                    .delete_memory(ns, key)
                    .await
                    .map_err(|e| self.explain(e))?;
                Ok(true)
            }
        }
    }
}

/// `keel memory …` on the local store.
///
/// # Errors
/// Configuration and store errors; `get` and `rm` of a missing entry.
pub fn local(global: &GlobalArgs, cmd: MemoryCommand) -> anyhow::Result<ExitCode> {
    let config = crate::cli::store_config(global)?;
    crate::cli::tokio_runtime()?.block_on(async move {
        let store = crate::store::open(&config.store).await?;
        let backend = Backend::Local(store, crate::store::local_tenant());
        execute(&backend, &config, cmd).await
    })
}

/// `keel --server URL memory …`.
///
/// # Errors
/// Server errors; `get` and `rm` of a missing entry.
pub fn remote(
    server: &Server,
    global: &GlobalArgs,
    cmd: MemoryCommand,
) -> anyhow::Result<ExitCode> {
    let config = crate::cli::store_config(global)?;
    let backend = Backend::Remote(crate::remote::connect(server)?);
    crate::cli::tokio_runtime()?.block_on(execute(&backend, &config, cmd))
}

async fn execute(
    backend: &Backend,
    config: &Config,
    cmd: MemoryCommand,
) -> anyhow::Result<ExitCode> {
    let remote = matches!(backend, Backend::Remote(_));
    match cmd {
        MemoryCommand::List {
            namespace,
            search,
            json,
        } => {
            let ns = namespace_of(namespace, config, remote)?;
            let entries = backend.list(&ns, search.as_deref()).await?;
            let below = if search.is_none() && !json {
                backend.sub_namespaces(&ns).await?
            } else {
                Vec::new()
            };
            print_list(&ns, entries, &below, json)
        }
        MemoryCommand::Get {
            key,
            namespace,
            json,
        } => {
            let ns = namespace_of(namespace, config, remote)?;
            match backend.get(&ns, &key).await? {
                Some(e) => print_entry(&e, json),
                None => Err(missing(&ns, &key)),
            }
        }
        MemoryCommand::Rm { key, namespace } => {
            let ns = namespace_of(namespace, config, remote)?;
            if backend.delete(&ns, &key).await? {
                forgot(&ns, &key)
            } else {
                Err(missing(&ns, &key))
            }
        }
    }
}

fn missing(ns: &str, key: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "no memory entry {key:?} in namespace {ns} (see `keel memory list --namespace {ns}`)"
    )
}

fn forgot(ns: &str, key: &str) -> anyhow::Result<ExitCode> {
    writeln!(std::io::stdout().lock(), "forgot {key:?} in {ns}")?;
    Ok(ExitCode::SUCCESS)
}

/// Text: one line per entry (`KEY  UPDATED  VALUE`, the value's JSON cut to 80 characters),
/// or `(no entries in NS)`, then the sub-namespaces `below` with their entry counts; JSON: one
/// object per entry per line.
fn print_list(
    ns: &str,
    entries: Vec<Entry>,
    below: &[(String, u64)],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        for e in &entries {
            writeln!(out, "{}", e.json())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        writeln!(out, "(no entries in {ns})")?;
    }
    for e in &entries {
        let value = e.value.to_string();
        let shown: String = if value.chars().count() > 80 {
            value.chars().take(79).chain(['…']).collect()
        } else {
            value
        };
        writeln!(
            out,
            "{}  {}  {shown}",
            e.key,
            e.updated_at.format("%Y-%m-%d %H:%M:%S")
        )?;
    }
    if !below.is_empty() {
        writeln!(out, "sub-namespaces (keel memory list --namespace NAME):")?;
        for (name, n) in below {
            let noun = if *n == 1 { "entry" } else { "entries" };
            writeln!(out, "  {name}  {n} {noun}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Text: the value (a string as it is, anything else as pretty JSON); JSON: the whole entry.
fn print_entry(e: &Entry, json: bool) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", e.json())?;
    } else {
        match &e.value {
            Value::String(s) => writeln!(out, "{s}")?,
            v => writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(v).context("cannot print the value")?
            )?,
        }
    }
    Ok(ExitCode::SUCCESS)
}
