//! `keel serve` (the HTTP API of `keel-server` on this store, with this configuration's
//! providers) and the bootstrap commands `keel tenants create|list` and `keel keys
//! create|list|revoke`, which work on the store directly.
//!
//! The server's own settings are the `[server]` table of `server.toml` in the user config
//! directory (or `--config FILE`), with the flags over it; the store, providers and keys are
//! the same `keel.toml` every other command reads.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use keel_core::TenantId;
use keel_model::ModelClient;
use keel_server::auth::{KeySpec, create_key};
use keel_server::{Deps, ModelFactory, Server, ServerConfig};
use keel_store::{KeyScope, Role, Store};

use crate::cli::{GlobalArgs, store_config};
use crate::config::{Config, Locations};
use crate::model_spec::{ModelSpec, build_route, split_base_url};

/// `keel serve` flags (each overrides `[server]` of the server file).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Address of the API (default 127.0.0.1:7878). A non-loopback address needs TLS or
    /// --insecure-listen.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Address of /metrics (default 127.0.0.1:7879).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// PEM certificate chain: serve HTTPS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address (something in front terminates TLS).
    #[arg(long)]
    pub insecure_listen: bool,
    /// The origin browsers use behind a proxy that ends TLS (https://HOST[:PORT]; http:// only
    /// for localhost, 127.0.0.0/8 or [::1]): with https the inspector's cookie becomes Secure and
    /// __Host-; only that Origin is accepted.
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// The server's settings file (default: server.toml in the user config directory).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Workers run in this process (default: [scheduler] workers, 2); 0 serves the API only
    /// and leaves running sessions to `keel worker` processes on the same store.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
}

/// `keel worker` flags (each overrides `[scheduler]` of the server file).
#[derive(Debug, Clone, Default, Args)]
pub struct WorkerArgs {
    /// Worker loops in this process (default 1).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// Sessions each worker runs at once (default: [scheduler] concurrency, 16).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: Option<u16>,
    /// How long SIGTERM lets running steps finish, e.g. 30s (default: [scheduler]
    /// drain_timeout_ms, 30 s); a second SIGTERM stops at once.
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// Serve /metrics, /healthz and /readyz at this address (default: none).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// The settings file with [server] (workspace roots, script models) and [scheduler]
    /// (default: server.toml in the user config directory).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `keel tenants …`
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant; prints its id.
    Create {
        /// A unique name.
        name: String,
    },
    /// List tenants.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// `keel keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key; the key is printed once (only its hash is stored).
    Create {
        /// The tenant (id or name); not with --system.
        #[arg(long, required_unless_present = "system", conflicts_with = "system")]
        tenant: Option<String>,
        /// A system key: manages tenants, belongs to none.
        #[arg(long)]
        system: bool,
        /// Who the key is for (the principal's name).
        #[arg(long)]
        name: String,
        /// admin, operator or viewer (not with --system).
        #[arg(long, default_value = "operator")]
        role: String,
        /// Lifetime: 30d, 12h, 90m… (default: no expiry).
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
    },
    /// List keys (never the keys themselves).
    List {
        /// Only this tenant's (id or name).
        #[arg(long, conflicts_with = "system")]
        tenant: Option<String>,
        /// Only system keys.
        #[arg(long)]
        system: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key (for good).
    Revoke {
        /// The key id (from `keel keys list`).
        key_id: String,
    },
}

/// Models for the server: the routes of releases, built with this configuration's providers.
/// A release may not name a base URL of its own (where the server's keys go is the server's to
/// say), and names `script:` models only when the server allows them.
struct CliModels {
    config: Config,
    allow_scripts: bool,
}

impl ModelFactory for CliModels {
    fn build(&self, route: &[String]) -> Result<Arc<dyn ModelClient>, String> {
        for spec in route {
            if split_base_url(spec).1.is_some() {
                return Err(format!(
                    "model {spec:?}: a release may not name a base URL; the server's providers ([providers.*] base_url) decide where requests go"
                ));
            }
            match ModelSpec::parse(spec) {
                Ok(ModelSpec::Script(_)) if !self.allow_scripts => {
                    return Err(format!(
                        "model {spec:?}: script models read files on the server; this server does not allow them ([server] allow_script_models)"
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let mut config = self.config.clone();
        config.model_route = route.to_vec();
        build_route(&config)
            .map(|r| Arc::new(r) as Arc<dyn ModelClient>)
            .map_err(|e| e.to_string())
    }
}

/// The server's settings and the file they came from (`None`: no file, the defaults).
fn server_config(args: &ServeArgs) -> anyhow::Result<(ServerConfig, Option<std::path::PathBuf>)> {
    let (mut config, file) = settings_file(args.config.as_deref())?;
    if let Some(n) = args.workers {
        config.scheduler.workers = n;
    }
    if let Some(l) = &args.listen {
        config.listen.clone_from(l);
    }
    if let Some(m) = &args.metrics_listen {
        config.metrics_listen = Some(m.clone());
    }
    if args.tls_cert.is_some() {
        config.tls_cert.clone_from(&args.tls_cert);
        config.tls_key.clone_from(&args.tls_key);
    }
    if args.insecure_listen {
        config.insecure_listen = true;
    }
    if args.public_url.is_some() {
        config.public_url.clone_from(&args.public_url);
    }
    Ok((config, file))
}

/// The settings file (`--config`, else `server.toml` beside the user config, else none) read.
fn settings_file(
    given: Option<&std::path::Path>,
) -> anyhow::Result<(ServerConfig, Option<std::path::PathBuf>)> {
    let file = given.map(std::path::Path::to_path_buf).or_else(|| {
        Locations::from_env()
            .user_file
            .and_then(|f| f.parent().map(|d| d.join("server.toml")))
            .filter(|f| f.exists())
    });
    let config = match &file {
        Some(f) => {
            let bytes =
                keel_tools::files::read_regular_file(f, keel_tools::files::MAX_CONFIG_BYTES)
                    .with_context(|| format!("cannot read {}", f.display()))?;
            let text = String::from_utf8(bytes)
                .with_context(|| format!("{} is not UTF-8", f.display()))?;
            ServerConfig::from_toml(&text).with_context(|| format!("{}", f.display()))?
        }
        None => ServerConfig::default(),
    };
    Ok((config, file))
}

/// What `keel serve` says about its settings when it starts: where they came from and the
/// limits every session is held to.
fn describe_settings(config: &ServerConfig, file: Option<&std::path::Path>) -> String {
    let from = file.map_or_else(
        || "no server.toml: defaults".to_owned(),
        |f| format!("settings from {}", f.display()),
    );
    let roots = if config.workspace_roots.is_empty() {
        "none — no session can be created; set [server] workspace_roots".to_owned()
    } else {
        config
            .workspace_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "keel serve: {from}; workspace roots: {roots}; max permission mode {}; sandbox off {}; script models {}; workers {} × {} sessions",
        serde_json::to_value(config.max_permission_mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        if config.allow_sandbox_off {
            "allowed"
        } else {
            "refused"
        },
        if config.allow_script_models {
            "allowed"
        } else {
            "refused"
        },
        config.scheduler.workers,
        config.scheduler.concurrency,
    )
}

/// `keel serve`: serves until Ctrl-C or SIGTERM.
///
/// # Errors
/// Configuration, store, TLS and bind errors, naming what to fix.
pub fn serve(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let config = store_config(global)?;
    let (server_config, server_file) = server_config(args)?;
    server_config.check()?;
    let settings = describe_settings(&server_config, server_file.as_deref());
    node_runtime()?.block_on(async move {
        crate::signals::install();
        let Some(store) = open_store("serve", &config.store).await? else {
            return Ok(ExitCode::SUCCESS);
        };
        // The same options as every keel host: the server's provider keys are secrets of
        // every session it runs, sealed with each.
        let deps = deps(store, &config, &server_config, "keel-serve")?;
        let tls = server_config.tls_cert.is_some();
        let server = Server::bind(server_config, deps).await?;
        if let Some(addr) = server.local_addr() {
            let scheme = if tls { "https" } else { "http" };
            eprintln!(
                "keel serve: listening on {scheme}://{addr} (store {})",
                crate::config::mask_url_password(&config.store)
            );
        }
        if let Some(m) = server.metrics_addr() {
            eprintln!("keel serve: metrics on http://{m}/metrics");
        }
        eprintln!("{settings}");
        server
            .run_until(drain_signal("serve"), stop_signal("serve"))
            .await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// The multi-threaded runtime of a node (`keel serve`, `keel worker`).
fn node_runtime() -> anyhow::Result<crate::cli::BoundedRuntime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map(crate::cli::BoundedRuntime::new)
        .context("cannot start the async runtime")
}

/// Opens a node's store, unless Ctrl-C / SIGTERM comes first (a server that does not answer
/// is given up only after its connect timeout): `None` then, and the node stops with nothing
/// started.
async fn open_store(node: &'static str, location: &str) -> anyhow::Result<Option<Arc<dyn Store>>> {
    tokio::select! {
        opened = crate::store::open(location) => Ok(Some(opened?)),
        () = crate::signals::next() => {
            eprintln!("keel {node}: stopped before the store answered");
            Ok(None)
        }
    }
}

/// The first Ctrl-C / SIGTERM of a node: drain.
async fn drain_signal(node: &'static str) {
    crate::signals::next().await;
    eprintln!("keel {node}: draining (again to stop at once)");
}

/// The second: stop at once.
async fn stop_signal(node: &'static str) {
    crate::signals::next().await;
    eprintln!("keel {node}: stopping at once");
}

/// The host's part of a node: models from this configuration's providers, the built-in tools
/// (and the memory tools when `[memory]` enables them), the runtime options every keel host
/// uses.
fn deps(
    store: Arc<dyn Store>,
    config: &Config,
    server: &ServerConfig,
    name: &str,
) -> anyhow::Result<Deps> {
    Ok(Deps {
        store: store.clone(),
        models: Arc::new(CliModels {
            allow_scripts: server.allow_script_models,
            config: config.clone(),
        }),
        tools: {
            let (memory, store) = (config.memory, store.clone());
            Arc::new(move || {
                let mut tools = keel_tools::ToolRegistry::with_builtins()?;
                if let Some(settings) = memory {
                    for tool in keel_runtime::memory::memory_tools(store.clone(), settings) {
                        tools.register(tool)?;
                    }
                }
                Ok(tools)
            })
        },
        runtime_options: crate::run::host_options(config, name)?,
    })
}

/// `keel worker`: runs sessions of the shared store until SIGTERM (drain: running steps finish
/// up to the drain timeout, sessions are given back, exit 0); a second SIGTERM stops at once.
///
/// # Errors
/// Configuration and store errors, naming what to fix.
pub fn worker(global: &GlobalArgs, args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let config = store_config(global)?;
    let (mut server_config, server_file) = settings_file(args.config.as_deref())?;
    if let Some(c) = args.concurrency {
        server_config.scheduler.concurrency = usize::from(c);
    }
    if let Some(d) = &args.drain_timeout {
        server_config.scheduler.drain_timeout_ms =
            crate::config::parse_duration_ms(d).map_err(|_| {
                anyhow::anyhow!("--drain-timeout {d:?}: expected a duration such as 30s or 500ms")
            })?;
    }
    server_config.scheduler.check()?;
    node_runtime()?.block_on(async move {
        crate::signals::install();
        let Some(store) = open_store("worker", &config.store).await? else {
            return Ok(ExitCode::SUCCESS);
        };
        let metrics = match &args.metrics_listen {
            Some(a) => {
                let addr = keel_server::config::parse_addr(a)?;
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("--metrics-listen {a}: cannot bind"))?;
                eprintln!("keel worker: metrics on http://{}/metrics", l.local_addr()?);
                Some(l)
            }
            None => None,
        };
        let deps = deps(store, &config, &server_config, "keel-worker")?;
        eprintln!(
            "keel worker: {} worker(s) × {} sessions on {} ({}); drain timeout {} ms",
            args.workers,
            server_config.scheduler.concurrency,
            crate::config::mask_url_password(&config.store),
            server_file.map_or_else(
                || "no server.toml: defaults".to_owned(),
                |f| format!("settings from {}", f.display())
            ),
            server_config.scheduler.drain_timeout_ms,
        );
        keel_server::run_worker_node(
            server_config,
            deps,
            usize::from(args.workers),
            metrics,
            drain_signal("worker"),
            stop_signal("worker"),
        )
        .await?;
        eprintln!("keel worker: stopped");
        Ok(ExitCode::SUCCESS)
    })
}

async fn open(global: &GlobalArgs) -> anyhow::Result<Arc<dyn Store>> {
    let config = store_config(global)?;
    Ok(crate::store::open(&config.store).await?)
}

async fn tenant_of(store: &dyn Store, text: &str) -> anyhow::Result<TenantId> {
    if let Ok(id) = text.parse::<TenantId>() {
        return Ok(store.get_tenant(id).await?.tenant_id);
    }
    let mut after = None;
    loop {
        let page = store.list_tenants(after, 1000).await?;
        if let Some(t) = page.iter().find(|t| t.name == text) {
            return Ok(t.tenant_id);
        }
        match page.last() {
            Some(last) if page.len() == 1000 => after = Some(last.tenant_id),
            _ => anyhow::bail!("no tenant named {text:?} (keel tenants list)"),
        }
    }
}

/// `keel tenants …`
///
/// # Errors
/// Store errors.
pub fn tenants(global: &GlobalArgs, cmd: TenantsCommand) -> anyhow::Result<ExitCode> {
    crate::cli::tokio_runtime()?.block_on(async move {
        let store = open(global).await?;
        match cmd {
            TenantsCommand::Create { name } => {
                let t = store.create_tenant(&name).await?;
                println!("{}", t.tenant_id);
            }
            TenantsCommand::List { json } => {
                let mut after = None;
                loop {
                    let page = store.list_tenants(after, 1000).await?;
                    for t in &page {
                        if json {
                            println!(
                                "{}",
                                serde_json::json!({"tenant_id": t.tenant_id.to_string(), "name": t.name, "created_at": t.created_at})
                            );
                        } else {
                            println!("{}  {}  {}", t.tenant_id, t.created_at.format("%Y-%m-%d"), t.name);
                        }
                    }
                    match page.last() {
                        Some(last) if page.len() == 1000 => after = Some(last.tenant_id),
                        _ => break,
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `keel keys …`
///
/// # Errors
/// Store errors; a bad role or duration.
pub fn keys(global: &GlobalArgs, cmd: KeysCommand) -> anyhow::Result<ExitCode> {
    crate::cli::tokio_runtime()?.block_on(async move {
        let store = open(global).await?;
        match cmd {
            KeysCommand::Create {
                tenant,
                system,
                name,
                role,
                expires_in,
            } => {
                let (tenant, role) = if system {
                    (None, Role::System)
                } else {
                    let role: Role = role.parse().map_err(anyhow::Error::msg)?;
                    if role == Role::System {
                        anyhow::bail!("--role system: use --system (system keys belong to no tenant)");
                    }
                    let t = tenant.as_deref().unwrap_or_default();
                    (Some(tenant_of(store.as_ref(), t).await?), role)
                };
                let expires_at = match expires_in {
                    Some(d) => {
                        let bad = || {
                            anyhow::anyhow!(
                                "--expires-in {d:?}: expected a duration such as 30d, 12h or 90m"
                            )
                        };
                        let ms = match d.strip_suffix('d') {
                            Some(days) => days
                                .trim()
                                .parse::<u64>()
                                .ok()
                                .and_then(|n| n.checked_mul(86_400_000))
                                .ok_or_else(bad)?,
                            None => crate::config::parse_duration_ms(&d).map_err(|_| bad())?,
                        };
                        Some(chrono::Utc::now() + chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX)))
                    }
                    None => None,
                };
                let (key, record) = create_key(
                    store.as_ref(),
                    &KeySpec {
                        tenant,
                        name,
                        role,
                        expires_at,
                    },
                )
                .await?;
                eprintln!(
                    "keel: key {} for {} ({}{}); it is shown only now — store it safely",
                    record.key_id,
                    record.principal_name,
                    record.role,
                    record
                        .tenant_id
                        .map(|t| format!(", tenant {t}"))
                        .unwrap_or_default()
                );
                println!("{key}");
            }
            KeysCommand::List {
                tenant,
                system,
                json,
            } => {
                let scope = if system {
                    KeyScope::System
                } else if let Some(t) = tenant {
                    KeyScope::Tenant(tenant_of(store.as_ref(), &t).await?)
                } else {
                    KeyScope::All
                };
                let mut after: Option<String> = None;
                loop {
                    let page = store.list_api_keys(scope, after.as_deref(), 1000).await?;
                    for k in &page {
                        let state = if k.revoked_at.is_some() {
                            "revoked"
                        } else if !k.is_usable(chrono::Utc::now()) {
                            "expired"
                        } else {
                            "active"
                        };
                        if json {
                            println!(
                                "{}",
                                serde_json::json!({
                                    "key_id": k.key_id, "prefix": k.prefix, "name": k.principal_name,
                                    "principal_id": k.principal_id.to_string(),
                                    "tenant_id": k.tenant_id.map(|t| t.to_string()), "role": k.role,
                                    "state": state, "created_at": k.created_at, "expires_at": k.expires_at,
                                    "revoked_at": k.revoked_at,
                                })
                            );
                        } else {
                            println!(
                                "{}  {}…  {:8}  {:7}  {}  {}",
                                k.key_id,
                                k.prefix,
                                k.role.as_str(),
                                state,
                                k.tenant_id.map_or_else(|| "system".to_owned(), |t| t.to_string()),
                                k.principal_name
                            );
                        }
                    }
                    match page.last() {
                        Some(last) if page.len() == 1000 => after = Some(last.key_id.clone()),
                        _ => break,
                    }
                }
            }
            KeysCommand::Revoke { key_id } => {
                let k = store
                    .revoke_api_key(KeyScope::All, &key_id, chrono::Utc::now())
                    .await?;
                println!("revoked {} ({})", k.key_id, k.principal_name);
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
