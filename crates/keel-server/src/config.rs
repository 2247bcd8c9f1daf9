//! The server's settings: the `[server]` table (of the server's own TOML file, see the README)
//! with the command line's flags over it.
//!
//! ```toml
//! [server]
//! listen = "127.0.0.1:7878"             # --listen
//! metrics_listen = "127.0.0.1:7879"     # --metrics-listen
//! tls_cert = "/etc/keel/cert.pem"       # --tls-cert / --tls-key (PEM)
//! tls_key = "/etc/keel/key.pem"
//! insecure_listen = false               # --insecure-listen: plain HTTP on a non-loopback address
//! public_url = "https://keel.example.com"   # --public-url: the origin browsers use, when a proxy ends TLS (http only for localhost)
//! workspace_roots = ["/srv/keel/workspaces"]   # a session's workspace must lie under one
//! max_permission_mode = "accept_edits"  # ceiling: read_only < default < accept_edits < bypass
//! allow_sandbox_off = false             # sessions may not ask for sandbox = "off"
//! body_limit_bytes = 1048576            # larger request bodies get 413
//! body_read_timeout_ms = 30000          # a body not all there after this gets 408
//! max_streams_per_key = 100             # concurrent SSE streams per API key; more get 429
//! tenant_stream_page = 1000            # sessions per store read of GET /v1/events (1..1000)
//! allow_script_models = false           # releases may name script:PATH models (tests, demos)
//! release_mcp_stdio = false             # releases may name stdio MCP servers (programs run here)
//! release_mcp_header_env = []           # variables a release's MCP header values may read
//!
//! [scheduler]                           # keel serve's in-process workers, and keel worker
//! workers = 2                           # keel serve --workers (0: an API-only node)
//! concurrency = 16                      # sessions one worker runs at once
//! lease_ttl_ms = 10000                  # a dead worker's sessions move on after this
//! poll_ms = 1000                        # look at the store at least this often
//! drain_timeout_ms = 30000              # SIGTERM: running steps get this long to finish
//! tenant_max_sessions = 50              # sessions of one tenant running at once (all workers)
//! tenant_tokens_per_minute = 0          # model tokens per tenant per minute (0: no limit)
//! tenant_max_queued_turns = 1000        # beyond this a tenant's new turns get 429
//! max_queued_turns = 100000             # beyond this (all tenants) new turns get 429
//!
//! [scheduler.tenants.acme]              # one tenant (its name or id) overrides the defaults
//! max_sessions = 10
//! tokens_per_minute = 20000
//! max_queued_turns = 200
//! weight = 2                            # claims per round in deficit round robin
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use keel_tools::policy::PermissionMode;
use serde::Deserialize;

use crate::error::ServerError;

/// `url` as an origin (RFC 6454 serialization): `http(s)://host[:port]`, lower case, the
/// scheme's default port dropped, at most a trailing `/` after it.
///
/// # Errors
/// [`ServerError::Config`] for another scheme, a path, query, fragment, user info or no host.
fn origin_of(url: &str) -> Result<String, ServerError> {
    let bad = || {
        ServerError::Config(format!(
            "public_url {url:?} is not an origin: https://HOST[:PORT] with no path"
        ))
    };
    let lower = url.trim().to_ascii_lowercase();
    let (scheme, rest) = lower.split_once("://").ok_or_else(bad)?;
    let default = match scheme {
        "https" => ":443",
        "http" => ":80",
        _ => return Err(bad()),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(bad());
    }
    // A port, when given, is 1–65535 (RFC 3986's digits, in range).
    let port = if authority.starts_with('[') {
        authority
            .split_once("]")
            .and_then(|(_, p)| p.strip_prefix(':'))
    } else {
        authority.rsplit_once(':').map(|(_, p)| p)
    };
    if let Some(p) = port
        && !(p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|p| p > 0))
    {
        return Err(bad());
    }
    let authority = authority.strip_suffix(default).unwrap_or(authority);
    Ok(format!("{scheme}://{authority}"))
}

/// Whether `authority` (`host[:port]` of an origin, lower case) names this machine: `localhost`
/// (or a name under it), a 127.0.0.0/8 address or `[::1]`.
fn loopback_host(authority: &str) -> bool {
    let host = if authority.starts_with('[') {
        authority.split_once(']').map_or(authority, |(h, _)| h)
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let host = host.trim_start_matches('[');
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default `--metrics-listen`.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7879";

/// Everything `keel serve` is configured with. Units in the names; every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the API (`HOST:PORT`).
    pub listen: String,
    /// Address of `/metrics` (`HOST:PORT`); `None` serves no metrics.
    pub metrics_listen: Option<String>,
    /// PEM certificate chain for TLS.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address (something in front terminates TLS).
    pub insecure_listen: bool,
    /// The origin browsers reach this server at (`https://HOST[:PORT]`, no path), when a proxy
    /// in front of it ends TLS: the inspector's cookie is then `Secure` with the `__Host-`
    /// prefix, and a browser's `Origin` must be exactly this (see [`Self::public_origin`]).
    /// `None`: the origin is the request's `Host` (and `https` only with `tls_cert`).
    pub public_url: Option<String>,
    /// Directories a session's workspace must lie under (after resolving symlinks). Empty: no
    /// session can be created.
    pub workspace_roots: Vec<PathBuf>,
    /// The most permissive permission mode a session may use.
    pub max_permission_mode: PermissionMode,
    /// Whether a session may run `shell` without a sandbox.
    pub allow_sandbox_off: bool,
    /// Largest request body, bytes.
    pub body_limit_bytes: usize,
    /// How long a request's body may take to arrive once its headers have, ms (≥ 1): a client
    /// that announces a body and sends it slowly or never gets 408 (RFC 9110 §15.5.9) and its
    /// connection back, instead of holding it open.
    pub body_read_timeout_ms: u64,
    /// Most concurrent SSE streams one API key may hold.
    pub max_streams_per_key: usize,
    /// Whether releases may name `script:PATH` models (a file on the server: tests and demos).
    pub allow_script_models: bool,
    /// Whether a release's `mcp_servers` may name stdio servers (`command`: a program this
    /// host spawns, in the session's workspace). Off by default: releases are made over the
    /// API, and a `url` server (streamable HTTP) is always allowed.
    pub release_mcp_stdio: bool,
    /// The environment variables of this host a release's `url` MCP servers may send as header
    /// values (`{"env": "NAME"}`); any other is refused, so a release cannot send the host's
    /// provider keys to a URL it names.
    pub release_mcp_header_env: Vec<String>,
    /// Interval of SSE heartbeat comments, ms.
    pub heartbeat_ms: u64,
    /// Sessions per store read of the tenant-wide stream (`GET /v1/events`), which pages
    /// through all of a tenant's sessions on each look; clamped to 1..=1000.
    pub tenant_stream_page: u32,
    /// The `[scheduler]` table of the same file (not a `[server]` key).
    #[serde(skip)]
    pub scheduler: SchedulerSettings,
}

/// The `[scheduler]` table: how the workers of `keel serve` and `keel worker` claim and run
/// sessions, and the per-tenant limits they and the API's admission control enforce. Units in
/// the names; every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSettings {
    /// Workers `keel serve` runs in-process (`--workers`; 0: an API-only node).
    pub workers: usize,
    /// Sessions one worker runs at once.
    pub concurrency: usize,
    /// Lease time-to-live, ms: a dead worker's sessions are taken over this long after its
    /// last heartbeat (live runs renew it every third of it; the node's runtimes use it too).
    pub lease_ttl_ms: u64,
    /// Longest interval between looks at the store without a wake-up, ms.
    pub poll_ms: u64,
    /// How long a draining worker lets running steps finish, ms.
    pub drain_timeout_ms: u64,
    /// Sessions of one tenant running at once over all workers.
    pub tenant_max_sessions: u64,
    /// Model tokens one tenant may use per minute (projected context plus maximum output,
    /// reserved before each model call); 0: no limit.
    pub tenant_tokens_per_minute: u64,
    /// Queued turns one tenant may have before new turns get 429.
    pub tenant_max_queued_turns: u64,
    /// Queued turns over all tenants before new turns get 429.
    pub max_queued_turns: u64,
    /// Per-tenant overrides, by tenant name or id.
    pub tenants: std::collections::BTreeMap<String, TenantSettings>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            workers: 2,
            concurrency: 16,
            lease_ttl_ms: 10_000,
            poll_ms: 1_000,
            drain_timeout_ms: 30_000,
            tenant_max_sessions: 50,
            tenant_tokens_per_minute: 0,
            tenant_max_queued_turns: 1_000,
            max_queued_turns: 100_000,
            tenants: std::collections::BTreeMap::new(),
        }
    }
}

/// The largest `[scheduler]` values a node runs with (see [`SchedulerSettings::check`]).
pub mod limits {
    /// `workers`: worker loops in one process.
    pub const MAX_WORKERS: usize = 1024;
    /// `concurrency`: sessions one worker runs at once.
    pub const MAX_CONCURRENCY: usize = 10_000;
    /// `lease_ttl_ms`: shortest lease (heartbeats renew it every third), ms. A run whose
    /// lease goes 0.9 of it without a renewal's answer stops (`keel_runtime::lease::LeaseKeeper`,
    /// "The fence"): at 1 s that is a renewal answered ~570 ms late; at 300 ms (the earlier
    /// floor) ~170 ms, which a loaded 2-core machine reached (a run fenced on a healthy store).
    pub const MIN_LEASE_TTL_MS: u64 = 1_000;
    /// `lease_ttl_ms`: longest lease (a dead worker's sessions wait this long), ms: a day.
    pub const MAX_LEASE_TTL_MS: u64 = 86_400_000;
    /// `poll_ms`: longest poll interval (bounds how late a due timer is noticed), ms: an hour.
    pub const MAX_POLL_MS: u64 = 3_600_000;
    /// `drain_timeout_ms`: longest drain, ms: a day.
    pub const MAX_DRAIN_TIMEOUT_MS: u64 = 86_400_000;
}

impl SchedulerSettings {
    /// Checks the values a worker cannot run with: no concurrency or more than
    /// [`limits::MAX_CONCURRENCY`], more than [`limits::MAX_WORKERS`] workers, a lease shorter
    /// than a heartbeat round trip or longer than a day, a zero or hour-long poll interval, a
    /// drain longer than a day, and a zero session limit, queue depth or weight (0 means "no
    /// limit" only for tokens per minute: a zero session limit would accept turns that never
    /// run, a zero queue depth refuse every turn while telling the caller to retry).
    ///
    /// # Errors
    /// [`ServerError::Config`] naming the key.
    pub fn check(&self) -> Result<(), ServerError> {
        use limits::*;
        let bad =
            |key: &str, why: &str| Err(ServerError::Config(format!("[scheduler] {key}: {why}")));
        let at_least_1 = "must be at least 1";
        if self.workers > MAX_WORKERS {
            return bad("workers", &format!("must be at most {MAX_WORKERS}"));
        }
        if self.concurrency == 0 {
            return bad("concurrency", at_least_1);
        }
        if self.concurrency > MAX_CONCURRENCY {
            return bad("concurrency", &format!("must be at most {MAX_CONCURRENCY}"));
        }
        if self.lease_ttl_ms < MIN_LEASE_TTL_MS {
            return bad(
                "lease_ttl_ms",
                &format!("must be at least {MIN_LEASE_TTL_MS} (heartbeats renew it every third)"),
            );
        }
        if self.lease_ttl_ms > MAX_LEASE_TTL_MS {
            return bad(
                "lease_ttl_ms",
                &format!(
                    "must be at most {MAX_LEASE_TTL_MS} (a day: a dead worker's sessions wait this long)"
                ),
            );
        }
        if self.poll_ms == 0 {
            return bad("poll_ms", at_least_1);
        }
        if self.poll_ms > MAX_POLL_MS {
            return bad(
                "poll_ms",
                &format!("must be at most {MAX_POLL_MS} (an hour)"),
            );
        }
        if self.drain_timeout_ms > MAX_DRAIN_TIMEOUT_MS {
            return bad(
                "drain_timeout_ms",
                &format!("must be at most {MAX_DRAIN_TIMEOUT_MS} (a day)"),
            );
        }
        for (key, v) in [
            ("tenant_max_sessions", self.tenant_max_sessions),
            ("tenant_max_queued_turns", self.tenant_max_queued_turns),
            ("max_queued_turns", self.max_queued_turns),
        ] {
            if v == 0 {
                return bad(key, at_least_1);
            }
        }
        for (name, t) in &self.tenants {
            for (key, v) in [
                ("max_sessions", t.max_sessions),
                ("max_queued_turns", t.max_queued_turns),
                ("weight", t.weight.map(u64::from)),
            ] {
                if v == Some(0) {
                    return bad(&format!("tenants.{name}.{key}"), at_least_1);
                }
            }
        }
        Ok(())
    }
}

/// One tenant's overrides of the `[scheduler]` defaults (absent keys keep them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantSettings {
    /// Sessions running at once.
    pub max_sessions: Option<u64>,
    /// Model tokens per minute (0: no limit).
    pub tokens_per_minute: Option<u64>,
    /// Queued turns before 429.
    pub max_queued_turns: Option<u64>,
    /// Claims per round in deficit round robin (≥ 1).
    pub weight: Option<u32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerSettings::default(),
            listen: DEFAULT_LISTEN.into(),
            metrics_listen: Some(DEFAULT_METRICS_LISTEN.into()),
            tls_cert: None,
            tls_key: None,
            insecure_listen: false,
            public_url: None,
            workspace_roots: Vec::new(),
            max_permission_mode: PermissionMode::AcceptEdits,
            allow_sandbox_off: false,
            body_limit_bytes: 1024 * 1024,
            body_read_timeout_ms: 30_000,
            max_streams_per_key: 100,
            allow_script_models: false,
            release_mcp_stdio: false,
            release_mcp_header_env: Vec::new(),
            heartbeat_ms: 15_000,
            tenant_stream_page: 1000,
        }
    }
}

/// The file form: `[server]` and `[scheduler]`, nothing else.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    #[serde(default)]
    server: ServerConfig,
    #[serde(default)]
    scheduler: SchedulerSettings,
}

impl ServerConfig {
    /// Parses a TOML document with a `[server]` and a `[scheduler]` table (anything else is
    /// refused).
    ///
    /// # Errors
    /// [`ServerError::Config`] naming the key at fault.
    pub fn from_toml(text: &str) -> Result<Self, ServerError> {
        toml::from_str::<ServerFile>(text)
            .map(|f| ServerConfig {
                scheduler: f.scheduler,
                ..f.server
            })
            .map_err(|e| ServerError::Config(e.to_string().trim().replace('\n', " ")))
    }

    /// Checks the settings as `keel serve` would start with them: the listen address parses; a
    /// non-loopback one has TLS or `insecure_listen`; the TLS files come in pairs; every
    /// workspace root is an existing directory. Returns the API address.
    ///
    /// # Errors
    /// The first [`ServerError`] found.
    pub fn check(&self) -> Result<SocketAddr, ServerError> {
        let addr = parse_addr(&self.listen)?;
        if let Some(m) = &self.metrics_listen {
            parse_addr(m)?;
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            _ => return Err(ServerError::HalfTls),
        };
        if !addr.ip().is_loopback() && !tls && !self.insecure_listen {
            return Err(ServerError::NeedsTls(addr.to_string()));
        }
        if let Some(url) = &self.public_url {
            let origin = origin_of(url)?;
            if let Some(host) = origin.strip_prefix("http://")
                && !loopback_host(host)
            {
                return Err(ServerError::Config(format!(
                    "public_url {url:?} is plain http on a host other than this machine: browsers would send the sign-in cookie in the clear; use https://HOST[:PORT] (the proxy in front ends TLS), or http only for localhost, 127.0.0.1 or [::1]"
                )));
            }
        }
        for root in &self.workspace_roots {
            canonical_root(root)?;
        }
        if self.body_read_timeout_ms == 0 {
            return Err(ServerError::Config(
                "body_read_timeout_ms: must be at least 1".to_owned(),
            ));
        }
        self.scheduler.check()?;
        Ok(addr)
    }

    /// `public_url` as an origin (`scheme://host[:port]`, lower case, no default port, no
    /// trailing slash), or `None` when unset (or not an origin: [`Self::check`] refuses that).
    #[must_use]
    pub fn public_origin(&self) -> Option<String> {
        self.public_url.as_deref().and_then(|u| origin_of(u).ok())
    }

    /// Whether browsers reach this server over HTTPS: it has `tls_cert`, or its `public_url` is
    /// `https://` (a proxy ends TLS). The inspector's cookie is then `Secure` and `__Host-`.
    #[must_use]
    pub fn secure_cookies(&self) -> bool {
        self.tls_cert.is_some()
            || self
                .public_origin()
                .is_some_and(|o| o.starts_with("https://"))
    }

    /// The workspace roots with symlinks resolved.
    ///
    /// # Errors
    /// [`ServerError::WorkspaceRoot`] for a root that is not an existing directory.
    pub fn canonical_roots(&self) -> Result<Vec<PathBuf>, ServerError> {
        self.workspace_roots
            .iter()
            .map(|r| canonical_root(r))
            .collect()
    }
}

/// Parses `HOST:PORT` (`localhost` counts as 127.0.0.1).
///
/// # Errors
/// [`ServerError::BadAddress`].
pub fn parse_addr(text: &str) -> Result<SocketAddr, ServerError> {
    let replaced = text.replacen("localhost:", "127.0.0.1:", 1);
    replaced
        .parse::<SocketAddr>()
        .map_err(|_| ServerError::BadAddress(text.to_owned()))
}

fn canonical_root(root: &std::path::Path) -> Result<PathBuf, ServerError> {
    let bad = |reason: String| ServerError::WorkspaceRoot {
        path: root.display().to_string(),
        reason,
    };
    if !root.is_absolute() {
        return Err(bad("must be an absolute path".into()));
    }
    let c = std::fs::canonicalize(root).map_err(|e| bad(e.to_string()))?;
    if !c.is_dir() {
        return Err(bad("is not a directory".into()));
    }
    Ok(c)
}

/// How permissive a mode is: `read_only` 0 < `default` 1 < `accept_edits` 2 < `bypass` 3.
pub fn permission_rank(m: PermissionMode) -> u8 {
    m.permissiveness()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_table_parses_and_refuses_unknown_keys() {
        let c = ServerConfig::from_toml(
            "[server]\nlisten = \"0.0.0.0:9000\"\nworkspace_roots = [\"/tmp\"]\nmax_permission_mode = \"bypass\"\n",
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9000");
        assert_eq!(c.max_permission_mode, PermissionMode::Bypass);
        assert_eq!(c.body_limit_bytes, 1024 * 1024);
        let err = ServerConfig::from_toml("[server]\nlisen = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
        assert!(ServerConfig::from_toml("model = \"x\"\n").is_err());
    }

    /// An error in `[scheduler]` names that table, not `[server]`.
    #[test]
    fn scheduler_errors_name_the_scheduler_table() {
        let err = ServerConfig::from_toml("[scheduler]\nconcurency = 3\n").unwrap_err();
        assert!(err.to_string().contains("concurency"), "{err}");
        assert!(!err.to_string().contains("[server]"), "{err}");
        let settings = SchedulerSettings {
            concurrency: 0,
            ..SchedulerSettings::default()
        };
        assert_eq!(
            settings.check().unwrap_err().to_string(),
            "[scheduler] concurrency: must be at least 1"
        );
    }

    #[test]
    fn public_url_is_an_origin_and_makes_cookies_secure() {
        let mut c = ServerConfig::default();
        assert!(!c.secure_cookies());
        assert_eq!(c.public_origin(), None);
        c.public_url = Some("HTTPS://Keel.Example.com:443/".into());
        assert!(c.check().is_ok());
        assert_eq!(
            c.public_origin().as_deref(),
            Some("https://keel.example.com")
        );
        assert!(c.secure_cookies());
        c.public_url = Some("http://keel.example.com:8080".into());
        assert_eq!(
            c.public_origin().as_deref(),
            Some("http://keel.example.com:8080")
        );
        assert!(!c.secure_cookies(), "plain http is not secure");
        // Plain http only names this machine: anywhere else the cookie would travel in clear.
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("plain http") && err.contains("https://"),
            "{err}"
        );
        for ok in [
            "http://localhost:7878",
            "http://127.0.0.1:7878",
            "http://[::1]:7878",
            "http://[::1]",
            "http://keel.localhost",
            "https://keel.example.com:65535",
        ] {
            c.public_url = Some(ok.into());
            assert!(c.check().is_ok(), "{ok}");
        }
        for bad in [
            "http://10.0.0.5",
            "http://localhost.example.com",
            "http://[::2]:80",
        ] {
            c.public_url = Some(bad.into());
            assert!(matches!(c.check(), Err(ServerError::Config(_))), "{bad}");
        }
        for bad in [
            "keel.example.com",
            "ftp://keel.example.com",
            "https://keel.example.com/inspector",
            "https://user@keel.example.com",
            "https://",
            "https://keel.example.com:99999",
            "https://keel.example.com:0",
            "https://keel.example.com:",
            "https://keel.example.com:+443",
            "http://[::1]:70000",
        ] {
            c.public_url = Some(bad.into());
            assert!(matches!(c.check(), Err(ServerError::Config(_))), "{bad}");
        }
    }

    #[test]
    fn non_loopback_plain_http_needs_insecure_listen() {
        let mut c = ServerConfig {
            listen: "0.0.0.0:7878".into(),
            ..ServerConfig::default()
        };
        assert!(matches!(c.check(), Err(ServerError::NeedsTls(_))));
        c.insecure_listen = true;
        assert!(c.check().is_ok());
        c.insecure_listen = false;
        c.tls_cert = Some("/x".into());
        assert!(matches!(c.check(), Err(ServerError::HalfTls)));
        c.tls_key = Some("/y".into());
        assert!(c.check().is_ok());
        assert!(
            ServerConfig {
                listen: "localhost:7878".into(),
                ..ServerConfig::default()
            }
            .check()
            .is_ok()
        );
        assert!(matches!(
            ServerConfig {
                listen: "nowhere".into(),
                ..ServerConfig::default()
            }
            .check(),
            Err(ServerError::BadAddress(_))
        ));
    }

    #[test]
    fn scheduler_values_no_worker_can_run_with_are_refused_by_name() {
        let refused = |toml: &str, key: &str| {
            let c = ServerConfig::from_toml(&format!("[scheduler]\n{toml}\n")).unwrap();
            let err = c.scheduler.check().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("[scheduler] {key}: ")),
                "{toml}: {err}"
            );
        };
        // More than a semaphore holds (tokio panics) and more than a node should run.
        refused("concurrency = 9223372036854775807", "concurrency");
        refused("concurrency = 0", "concurrency");
        refused("workers = 9223372036854775807", "workers");
        // A lease whose expiry overflows; a poll or drain of centuries.
        refused("lease_ttl_ms = 9223372036854775807", "lease_ttl_ms");
        refused("lease_ttl_ms = 999", "lease_ttl_ms");
        refused("poll_ms = 9223372036854775807", "poll_ms");
        refused("drain_timeout_ms = 9223372036854775807", "drain_timeout_ms");
        // 0 is "no limit" only for tokens per minute: elsewhere it would accept turns that
        // never run, or refuse every turn while telling the caller to retry.
        refused("tenant_max_sessions = 0", "tenant_max_sessions");
        refused("tenant_max_queued_turns = 0", "tenant_max_queued_turns");
        refused("max_queued_turns = 0", "max_queued_turns");
        refused(
            "[scheduler.tenants.acme]\nmax_sessions = 0",
            "tenants.acme.max_sessions",
        );
        refused(
            "[scheduler.tenants.acme]\nmax_queued_turns = 0",
            "tenants.acme.max_queued_turns",
        );
        refused(
            "[scheduler.tenants.acme]\nweight = 0",
            "tenants.acme.weight",
        );
        // The largest accepted values run.
        let c = ServerConfig::from_toml(
            "[scheduler]\nworkers = 1024\nconcurrency = 10000\nlease_ttl_ms = 86400000\npoll_ms = 3600000\ndrain_timeout_ms = 86400000\ntenant_tokens_per_minute = 0\n",
        )
        .unwrap();
        c.scheduler.check().unwrap();
        // The message names the table, not [server].
        let err = ServerConfig::from_toml("[scheduler]\nconcurrency = 0\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert_eq!(err, "[scheduler] concurrency: must be at least 1");
    }
}
