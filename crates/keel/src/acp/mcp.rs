//! MCP servers an ACP client passes (`session/new`, `session/load`) as Keel's
//! `[mcp_servers]` entries: they go into the session's release and run on keel-mcp, as the
//! configuration's do.
//!
//! ## The editor's secrets never reach the store
//! A stdio server's `env` values, an HTTP server's `headers` values, its URL's userinfo and
//! query values, and a stdio server's arguments that look secret (the value of a flag whose
//! name holds `key`, `token`, `secret`, `password`, `passwd` or `auth` — `--api-key=V`,
//! `--token V` — or an argument the redactor's built-in patterns match, `ghp_…`) are often
//! tokens. The release (journaled, stored) holds each as a placeholder,
//! `keel-acp:withheld:<uuid>`; the value stays in this process's memory ([`Withheld`]) and the
//! servers start with it ([`Unsealing`] puts the values back into the release the MCP pool is
//! given). A value is bound to the `session/new` or `session/load` it came with ([`Scope`]),
//! to its server's name and to its place there (the variable, the header, the URL, the
//! arguments): a placeholder string anywhere else — another server, another variable, a
//! `keel.toml` that copied one — is never replaced. In a new process the editor passes its
//! `mcpServers` again on `session/load`, and a server of the session's release named like one
//! of them takes its values: the stored placeholder at the same place is bound to the value the
//! editor passes now, so the release, and the session, stay as they were. A placeholder no
//! value was passed for stays as it is (the server gets the placeholder text, and fails to
//! authenticate rather than get a stale token). The values are also secret values of the
//! sessions' redactors ([`Withheld::values`]): an event that would carry one (a server printing
//! its environment) carries `[REDACTED]`, and the session's sealed `secrets` row keeps them,
//! encrypted, for later processes' redactors.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol as acp;
use keel_mcp::McpServerConfig;
use keel_mcp::config::HeaderValueSpec;
use keel_tools::tool::{ToolProvider, ToolSource};
use serde_json::Value;

/// What a withheld value is stored as, before its id.
pub const PLACEHOLDER_PREFIX: &str = "keel-acp:withheld:";

/// The editor's withheld values of this process, by placeholder: each bound to the hosting
/// that sealed it ([`Scope`]), the server it was passed for and the place in that server
/// ([`Slot`]). A value is put back only there: a placeholder string found anywhere else — in
/// another server, another key, a `keel.toml` that copied it — stays as it is.
#[derive(Debug, Default)]
pub struct Withheld {
    values: Mutex<HashMap<String, Bound>>,
    scopes: std::sync::atomic::AtomicU64,
}

/// One `session/new` or `session/load`: the values its editor passed are unsealed only for the
/// runtime it builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope(u64);

/// Where in a server entry a withheld value goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    /// `env` variable.
    Env(String),
    /// `headers` header.
    Header(String),
    /// Inside `url` (its userinfo, a query value).
    Url,
    /// Inside an element of `args`.
    Args,
}

#[derive(Debug)]
struct Bound {
    scope: Scope,
    server: String,
    slot: Slot,
    value: String,
}

/// The argument names whose values are withheld (`--api-key=…`, `--token …`), lowercase
/// substrings.
const SECRET_ARG_NAMES: &[&str] = &["key", "token", "secret", "password", "passwd", "auth"];

/// Whether `flag` (`--api-key`, `-token`) names a secret.
fn secret_flag(flag: &str) -> bool {
    let name = flag.trim_start_matches('-').to_ascii_lowercase();
    flag.starts_with('-') && !name.is_empty() && SECRET_ARG_NAMES.iter().any(|k| name.contains(k))
}

/// Whether `text` is a secret by the redactor's built-in patterns (`ghp_…`, `sk-…`, bearer
/// tokens).
fn looks_secret(text: &str) -> bool {
    keel_runtime::redact::Redactor::with_values(&[], &[]).is_ok_and(|r| r.holds_secret(text))
}

/// The byte ranges of the secret parts of `url`: the userinfo's password (its whole userinfo
/// when it has no `:`) and each query value, named by slot (`userinfo`, `query:NAME`).
fn url_secrets(url: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return out;
    };
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    if let Some(at) = url[start..end].rfind('@') {
        let info = start..start + at;
        let range = match url[info.clone()].find(':') {
            Some(c) => info.start + c + 1..info.end,
            None => info,
        };
        if !range.is_empty() {
            out.push(("userinfo".to_owned(), range));
        }
    }
    let Some(q) = url[end..].find('?').map(|i| end + i + 1) else {
        return out;
    };
    let q_end = url[q..].find('#').map_or(url.len(), |i| q + i);
    let mut pos = q;
    for pair in url[q..q_end].split('&') {
        if let Some((k, v)) = pair.split_once('=')
            && !v.is_empty()
        {
            let v_start = pos + k.len() + 1;
            out.push((format!("query:{k}"), v_start..v_start + v.len()));
        }
        pos += pair.len() + 1;
    }
    out
}

impl Withheld {
    /// A new scope for one `session/new` or `session/load`.
    pub fn scope(&self) -> Scope {
        Scope(
            self.scopes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// The placeholder of `value` at `slot` of server `server`, bound to `scope`: `stored` (the
    /// session's stored placeholder there, `session/load`) when it is one, else a new one.
    fn seal(
        &self,
        scope: Scope,
        server: &str,
        slot: Slot,
        stored: Option<&str>,
        value: String,
    ) -> String {
        let placeholder = stored
            .filter(|p| p.starts_with(PLACEHOLDER_PREFIX) && !p.contains(char::is_whitespace))
            .map_or_else(
                || format!("{PLACEHOLDER_PREFIX}{}", uuid::Uuid::new_v4().simple()),
                str::to_owned,
            );
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                placeholder.clone(),
                Bound {
                    scope,
                    server: server.to_owned(),
                    slot,
                    value,
                },
            );
        placeholder
    }

    /// `url` with its secret parts ([`url_secrets`]) sealed; `stored`: the session's stored
    /// URL of that server, whose placeholders at the same parts are kept.
    fn seal_url(&self, scope: Scope, server: &str, url: &str, stored: Option<&str>) -> String {
        let old: Vec<(String, String)> = stored
            .map(|s| {
                url_secrets(s)
                    .into_iter()
                    .map(|(slot, r)| (slot, s[r].to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let mut out = String::new();
        let mut pos = 0;
        for (slot, range) in url_secrets(url) {
            let kept = old
                .iter()
                .find(|(s, _)| *s == slot)
                .map(|(_, p)| p.as_str());
            out.push_str(&url[pos..range.start]);
            out.push_str(&self.seal(
                scope,
                server,
                Slot::Url,
                kept,
                url[range.clone()].to_owned(),
            ));
            pos = range.end;
        }
        out.push_str(&url[pos..]);
        out
    }

    /// `args` with the values of secret-named flags (`--api-key=V`, `--token V`) and arguments
    /// matching the redactor's patterns sealed; `stored`: the session's stored args of that
    /// server, whose placeholders at the same positions are kept.
    fn seal_args(
        &self,
        scope: Scope,
        server: &str,
        args: Vec<String>,
        stored: &[Value],
    ) -> Vec<String> {
        let kept = |i: usize| -> Option<&str> {
            let s = stored.get(i)?.as_str()?;
            let at = s.find(PLACEHOLDER_PREFIX)?;
            Some(&s[at..])
        };
        let mut out = Vec::with_capacity(args.len());
        let mut next_is_secret = false;
        for (i, arg) in args.into_iter().enumerate() {
            let sealed = if let Some((flag, value)) = arg.split_once('=')
                && secret_flag(flag)
                && !value.is_empty()
            {
                let p = self.seal(scope, server, Slot::Args, kept(i), value.to_owned());
                format!("{flag}={p}")
            } else if (next_is_secret && !arg.starts_with('-')) || looks_secret(&arg) {
                self.seal(scope, server, Slot::Args, kept(i), arg.clone())
            } else {
                arg.clone()
            };
            next_is_secret = !arg.contains('=') && secret_flag(&arg);
            out.push(sealed);
        }
        out
    }

    /// Every value this process holds: redacted from the sessions' events (and sealed in
    /// their `secrets` rows) as the configuration's secrets are — a server that prints its
    /// environment does not put them in the journal either.
    pub fn values(&self) -> Vec<String> {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|b| b.value.clone())
            .collect()
    }

    /// `servers` with the placeholders `scope` sealed put back — each only at its own server
    /// and place.
    pub fn unseal(
        &self,
        scope: Scope,
        servers: &BTreeMap<String, Value>,
    ) -> BTreeMap<String, Value> {
        let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = servers.clone();
        for (placeholder, b) in values.iter().filter(|(_, b)| b.scope == scope) {
            let Some(server) = out.get_mut(&b.server) else {
                continue;
            };
            let replace = |v: &mut Value, whole: bool| {
                if let Some(text) = v.as_str() {
                    if whole && text == placeholder {
                        *v = Value::String(b.value.clone());
                    } else if !whole && text.contains(placeholder.as_str()) {
                        *v = Value::String(text.replace(placeholder.as_str(), &b.value));
                    }
                }
            };
            match &b.slot {
                Slot::Env(key) => {
                    if let Some(v) = server.get_mut("env").and_then(|e| e.get_mut(key)) {
                        replace(v, true);
                    }
                }
                Slot::Header(key) => {
                    if let Some(v) = server.get_mut("headers").and_then(|e| e.get_mut(key)) {
                        replace(v, true);
                    }
                }
                Slot::Url => {
                    if let Some(v) = server.get_mut("url") {
                        replace(v, false);
                    }
                }
                Slot::Args => {
                    if let Some(Value::Array(args)) = server.get_mut("args") {
                        for v in args {
                            replace(v, false);
                        }
                    }
                }
            }
        }
        out
    }

    /// `release` as the MCP pool must see it: `scope`'s placeholders replaced by their values.
    pub fn unseal_release(&self, scope: Scope, release: &keel_core::Release) -> keel_core::Release {
        let mut real = release.clone();
        real.definition.mcp_servers = self.unseal(scope, &release.definition.mcp_servers);
        real
    }
}

/// A tool provider that gives the MCP pool each release with the editor's values put back
/// ([`Withheld::unseal`]).
pub struct Unsealing {
    /// The pool.
    pub inner: Arc<dyn ToolProvider>,
    /// The values.
    pub withheld: Arc<Withheld>,
    /// Whose values: the hosting that built this runtime.
    pub scope: Scope,
}

#[async_trait::async_trait]
impl ToolProvider for Unsealing {
    async fn sources(
        &self,
        release: &keel_core::Release,
        workspace: &Path,
    ) -> (Vec<Arc<dyn ToolSource>>, Vec<String>) {
        let real = self.withheld.unseal_release(self.scope, release);
        self.inner.sources(&real, workspace).await
    }
}

/// Keel's MCP server entry for the `index`th server the client passes (stdio and streamable
/// HTTP; the same keel-mcp client as `[mcp_servers]`), its `env` and `headers` values as
/// placeholders ([`Withheld`]; `pinned`: the session's stored servers on `session/load`, empty
/// on `session/new`).
///
/// # Errors
/// Invalid params naming `mcpServers[index]`: a transport Keel does not speak (SSE), or an
/// entry keel-mcp refuses (a bad name, an empty command, a URL that is not http(s)).
pub fn mcp_entry(
    withheld: &Withheld,
    scope: Scope,
    pinned: &BTreeMap<String, Value>,
    index: usize,
    server: acp::McpServer,
) -> Result<(String, McpServerConfig), acp::Error> {
    let invalid = |what: String| {
        super::agent::invalid(
            Some(&format!("mcpServers[{index}]")),
            format!("keel acp: mcpServers[{index}]: {what}"),
        )
    };
    let stored = |name: &str, field: &str| pinned.get(name).and_then(|s| s.get(field)).cloned();
    let (name, entry) = match server {
        acp::McpServer::Stdio(s) => {
            let old_env = stored(&s.name, "env");
            let env = s
                .env
                .into_iter()
                .map(|v| {
                    let old = old_env
                        .as_ref()
                        .and_then(|e| e.get(&v.name))
                        .and_then(Value::as_str);
                    let slot = Slot::Env(v.name.clone());
                    (v.name, withheld.seal(scope, &s.name, slot, old, v.value))
                })
                .collect();
            let old_args = stored(&s.name, "args");
            let old_args = old_args
                .as_ref()
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            let entry = McpServerConfig {
                command: Some(s.command.to_string_lossy().into_owned()),
                args: withheld.seal_args(scope, &s.name, s.args, old_args),
                env,
                ..McpServerConfig::default()
            };
            (s.name, entry)
        }
        acp::McpServer::Http(h) => {
            let old_headers = stored(&h.name, "headers");
            let headers = h
                .headers
                .into_iter()
                .map(|v| {
                    let old = old_headers
                        .as_ref()
                        .and_then(|e| e.get(&v.name))
                        .and_then(Value::as_str);
                    let slot = Slot::Header(v.name.clone());
                    let sealed = withheld.seal(scope, &h.name, slot, old, v.value);
                    (v.name, HeaderValueSpec::Plain(sealed))
                })
                .collect();
            let old_url = stored(&h.name, "url");
            let entry = McpServerConfig {
                url: Some(withheld.seal_url(
                    scope,
                    &h.name,
                    &h.url,
                    old_url.as_ref().and_then(Value::as_str),
                )),
                headers,
                ..McpServerConfig::default()
            };
            (h.name, entry)
        }
        other => {
            return Err(invalid(format!(
                "MCP transport not supported (stdio and http are): {other:?}"
            )));
        }
    };
    entry.validate(&name).map_err(|e| invalid(e.to_string()))?;
    Ok((name, entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio(name: &str, env: &[(&str, &str)]) -> acp::McpServer {
        serde_json::from_value(json!({
            "name": name, "command": "srv", "args": [],
            "env": env.iter().map(|(n, v)| json!({"name": n, "value": v})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    /// The entry holds placeholders; unsealing gives the values back; a later load (a new
    /// process: a new `Withheld`) binds the stored placeholders to the values passed again.
    #[test]
    fn env_and_header_values_are_placeholders_bound_in_memory() {
        let w = Withheld::default();
        let scope = w.scope();
        let (name, entry) = mcp_entry(
            &w,
            scope,
            &BTreeMap::new(),
            0,
            stdio("gh", &[("GITHUB_TOKEN", "ghp_secret_value")]),
        )
        .unwrap();
        let stored = entry.env["GITHUB_TOKEN"].clone();
        assert!(stored.starts_with(PLACEHOLDER_PREFIX), "{stored}");
        let servers: BTreeMap<String, Value> =
            [(name.clone(), serde_json::to_value(&entry).unwrap())].into();
        assert!(
            !serde_json::to_string(&servers)
                .unwrap()
                .contains("ghp_secret_value")
        );
        assert_eq!(
            w.unseal(scope, &servers)["gh"]["env"]["GITHUB_TOKEN"],
            "ghp_secret_value"
        );
        // Another hosting's runtime does not get them.
        assert_eq!(w.unseal(w.scope(), &servers), servers);

        let http: acp::McpServer = serde_json::from_value(json!({
            "type": "http", "name": "docs", "url": "https://docs.example/mcp",
            "headers": [{"name": "Authorization", "value": "Bearer tok_123456"}],
        }))
        .unwrap();
        let (_, h) = mcp_entry(&w, scope, &BTreeMap::new(), 1, http).unwrap();
        let HeaderValueSpec::Plain(p) = &h.headers["Authorization"] else {
            panic!("plain")
        };
        assert!(p.starts_with(PLACEHOLDER_PREFIX));

        let fresh = Withheld::default();
        let scope = fresh.scope();
        let (_, again) = mcp_entry(
            &fresh,
            scope,
            &servers,
            0,
            stdio("gh", &[("GITHUB_TOKEN", "ghp_rotated_value")]),
        )
        .unwrap();
        assert_eq!(
            again.env["GITHUB_TOKEN"], stored,
            "the release stays the same"
        );
        assert_eq!(
            fresh.unseal(scope, &servers)["gh"]["env"]["GITHUB_TOKEN"],
            "ghp_rotated_value"
        );
        // A placeholder this process holds no value for stays as it is.
        let none = Withheld::default();
        assert_eq!(none.unseal(none.scope(), &servers), servers);
    }

    /// A placeholder string the workspace copied into another server (or another key) is not
    /// unsealed there: only the server and key the editor passed the value for get it (attack
    /// review of issue 17, F6).
    #[test]
    fn a_reused_placeholder_reaches_only_its_own_server_and_key() {
        let planted = format!("{PLACEHOLDER_PREFIX}0000attacker");
        let pinned: BTreeMap<String, Value> = [
            (
                "github".to_owned(),
                json!({"command": "gh", "env": {"GITHUB_TOKEN": planted, "OTHER": planted}}),
            ),
            (
                "evil".to_owned(),
                json!({"command": "/bin/sh", "args": ["-c", planted], "env": {"T": planted}}),
            ),
        ]
        .into();
        let w = Withheld::default();
        let scope = w.scope();
        let (_, entry) = mcp_entry(
            &w,
            scope,
            &pinned,
            0,
            stdio("github", &[("GITHUB_TOKEN", "ghp_REALSECRET_editor_only")]),
        )
        .unwrap();
        let mut servers = pinned.clone();
        servers.insert("github".into(), serde_json::to_value(&entry).unwrap());
        servers.get_mut("github").unwrap()["env"]["OTHER"] = json!(planted);
        let real = w.unseal(scope, &servers);
        assert_eq!(
            real["github"]["env"]["GITHUB_TOKEN"],
            "ghp_REALSECRET_editor_only"
        );
        let text = serde_json::to_string(&real).unwrap();
        assert_eq!(
            text.matches("ghp_REALSECRET_editor_only").count(),
            1,
            "{text}"
        );
        assert_eq!(real["evil"], pinned["evil"]);
    }

    /// URL userinfo and query values, secret-named flags' values and token-shaped arguments
    /// are withheld like `env` (F7); a load binds the stored placeholders again.
    #[test]
    fn url_and_argument_secrets_are_withheld() {
        let w = Withheld::default();
        let scope = w.scope();
        let http: acp::McpServer = serde_json::from_value(json!({
            "type": "http", "name": "h",
            "url": "http://user:urlpass-9999@127.0.0.1:1/mcp?token=qtok-4444&v=2#frag",
            "headers": [],
        }))
        .unwrap();
        let (_, h) = mcp_entry(&w, scope, &BTreeMap::new(), 0, http).unwrap();
        let url = h.url.clone().unwrap();
        assert!(!url.contains("urlpass") && !url.contains("qtok"), "{url}");
        assert!(
            url.starts_with("http://user:keel-acp:withheld:") && url.ends_with("#frag"),
            "{url}"
        );
        let s: acp::McpServer = serde_json::from_value(json!({
            "name": "s", "command": "srv",
            "args": ["--api-key=argsecret-7777", "--token", "tok-8888", "--verbose", "ghp_abcdefghijklmnopqrstuvwxyz", "plain"],
            "env": [],
        }))
        .unwrap();
        let (_, e) = mcp_entry(&w, scope, &BTreeMap::new(), 1, s).unwrap();
        let args = e.args.join(" ");
        for secret in ["argsecret-7777", "tok-8888", "ghp_abc"] {
            assert!(!args.contains(secret), "{args}");
        }
        assert!(
            e.args[0].starts_with("--api-key=keel-acp:withheld:"),
            "{args}"
        );
        assert_eq!(
            (e.args[3].as_str(), e.args[5].as_str()),
            ("--verbose", "plain")
        );
        let servers: BTreeMap<String, Value> = [
            ("h".to_owned(), serde_json::to_value(&h).unwrap()),
            ("s".to_owned(), serde_json::to_value(&e).unwrap()),
        ]
        .into();
        let real = w.unseal(scope, &servers);
        assert_eq!(
            real["h"]["url"],
            "http://user:urlpass-9999@127.0.0.1:1/mcp?token=qtok-4444&v=2#frag"
        );
        assert_eq!(real["s"]["args"][0], "--api-key=argsecret-7777");
        assert_eq!(real["s"]["args"][2], "tok-8888");

        // A new process binds the stored placeholders to the values passed again.
        let fresh = Withheld::default();
        let scope = fresh.scope();
        let http: acp::McpServer = serde_json::from_value(json!({
            "type": "http", "name": "h",
            "url": "http://user:rotated-1@127.0.0.1:1/mcp?token=rotated-2&v=2#frag",
            "headers": [],
        }))
        .unwrap();
        let (_, again) = mcp_entry(&fresh, scope, &servers, 0, http).unwrap();
        assert_eq!(again.url, h.url, "the release stays the same");
    }

    #[test]
    fn a_bad_entry_is_invalid_params_naming_the_field() {
        let w = Withheld::default();
        let e = mcp_entry(&w, w.scope(), &BTreeMap::new(), 2, stdio("a__b", &[])).unwrap_err();
        assert_eq!(e.code, acp::ErrorCode::InvalidParams);
        assert_eq!(e.data.unwrap()["field"], "mcpServers[2]");
    }
}
