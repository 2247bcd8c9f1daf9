//! Masking secrets for `keel config show`.

use super::*;

pub(super) fn snake<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// Whether a configuration key names a secret: it contains `key`, `token`, `secret` or
/// `password` (any case), and is not a count (`*_tokens`, `max_*`) or the name of a variable
/// holding one (`*_env`).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.ends_with("tokens") || n.starts_with("max_") || n.ends_with("_env") {
        return false;
    }
    ["key", "token", "secret", "password", "passwd"]
        .iter()
        .any(|w| n.contains(w))
}

/// Hides the password of a `scheme://user:password@host` URL.
pub fn mask_url_password(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:{MASK}@{host}{path}")
        }
        _ => value.to_owned(),
    }
}

/// Masks secrets in a configuration table in place (see the module docs).
pub fn mask_secrets(table: &mut toml::Table, env: &BTreeMap<String, EnvValue>) {
    for (key, value) in table.iter_mut() {
        if key == "env" {
            if let toml::Value::Table(vars) = value {
                for (name, v) in vars.iter_mut() {
                    if env.get(name).is_some_and(|e| e.is_secret(name)) {
                        *v = toml::Value::String(MASK.into());
                    } else if let toml::Value::Table(detailed) = v {
                        // `{ value = "…", secret = false }`: the flag is not a secret.
                        if let Some(toml::Value::String(s)) = detailed.get_mut("value") {
                            *s = mask_url_password(s);
                        }
                    } else {
                        mask_value(name, v);
                    }
                }
            }
            continue;
        }
        if key == "timeouts" {
            // Durations, never secrets (though `first_token` is named like one).
            continue;
        }
        // A literal header value may be a credential whatever the header is called; one read
        // from an environment variable (`{ env = "…" }`) only names the variable. MCP servers
        // are a table of servers, hooks a table of lists (`[[hooks.permission_request]]`).
        if let ("mcp_servers" | "hooks", toml::Value::Table(entries)) = (key.as_str(), &mut *value)
        {
            let specs = entries.iter_mut().flat_map(|(_, v)| match v {
                toml::Value::Array(list) => list.iter_mut().collect::<Vec<_>>(),
                other => vec![other],
            });
            for spec in specs {
                if let Some(toml::Value::Table(headers)) = spec.get_mut("headers") {
                    for (_, header) in headers.iter_mut() {
                        if let toml::Value::String(text) = header {
                            *text = MASK.to_owned();
                        }
                    }
                }
            }
        }
        mask_value(key, value);
    }
}

pub(super) fn mask_value(key: &str, value: &mut toml::Value) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                mask_value(k, v);
            }
        }
        toml::Value::Array(items) => {
            for v in items {
                mask_value(key, v);
            }
        }
        toml::Value::String(s) if is_secret_name(key) && !s.starts_with(MASK) => {
            *s = MASK.into();
        }
        toml::Value::String(_) if is_secret_name(key) => {}
        toml::Value::String(s) => *s = mask_url_password(s),
        _ if is_secret_name(key) => *value = toml::Value::String(MASK.into()),
        _ => {}
    }
}
