use super::*;

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
    assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
    assert_eq!(parse_duration_ms("30").unwrap(), 30_000);
    assert_eq!(parse_duration_ms("1.5m").unwrap(), 90_000);
    assert_eq!(parse_duration_ms("2h").unwrap(), 7_200_000);
    assert!(parse_duration_ms("soon").is_err());
    assert!(parse_duration_ms("0s").is_err());
    assert!(parse_duration_ms("5 days").is_err());
}

#[test]
fn defaults_print_in_their_largest_whole_unit() {
    assert_eq!(format_duration_ms(600_000), "10m");
    assert_eq!(format_duration_ms(60_000), "1m");
    assert_eq!(format_duration_ms(90_000), "90s");
    assert_eq!(format_duration_ms(7_200_000), "2h");
    assert_eq!(format_duration_ms(1_500), "1500ms");
    for ms in [1, 999, 1_000, 61_000, 600_000, 5_400_000] {
        assert_eq!(parse_duration_ms(&format_duration_ms(ms)).unwrap(), ms);
    }
}

#[test]
fn timeouts_parse_with_defaults_and_name_the_key_at_fault() {
    let t = TimeoutsConfig {
        first_token: Some("2m".into()),
        ..TimeoutsConfig::default()
    }
    .parse()
    .unwrap();
    assert_eq!(
        t,
        TimeoutSettings {
            tool_ms: 600_000,
            first_token_ms: Some(120_000),
            model_total_ms: None,
            stream_idle_ms: 60_000,
        }
    );
    let e = TimeoutsConfig {
        stream_idle: Some("soon".into()),
        ..TimeoutsConfig::default()
    }
    .parse()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("timeouts.stream_idle") && e.contains("\"soon\""),
        "{e}"
    );
}

#[test]
fn secret_names_exclude_counts_and_variable_names() {
    for s in [
        "api_key",
        "API_KEY",
        "GITHUB_TOKEN",
        "client_secret",
        "db_password",
    ] {
        assert!(is_secret_name(s), "{s}");
    }
    for s in ["max_tokens", "api_key_env", "model", "base_url"] {
        assert!(!is_secret_name(s), "{s}");
    }
}

#[test]
fn literal_mcp_header_values_are_masked() {
    let mut table: toml::Table = toml::from_str(
        "[mcp_servers.d]\nurl = \"https://h/mcp\"\nheaders = { Authorization = \"Bearer s3cret\", X-Key = { env = \"K\" } }\n",
    )
    .unwrap();
    mask_secrets(&mut table, &BTreeMap::new());
    let text = toml::to_string(&table).unwrap();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("env = \"K\""), "{text}");
}

/// Attack (issue 14): an HTTP hook's literal header (the README's own example,
/// `headers = { Authorization = "Bearer …" }`) is a credential as much as an MCP server's,
/// and `keel config show` must not print it.
#[test]
fn literal_hook_header_values_are_masked() {
    let mut table: toml::Table = toml::from_str(
        "[hooks]\nmax_stop_continues = 2\n[[hooks.permission_request]]\nurl = \"https://approvals.example/keel\"\nheaders = { Authorization = \"Bearer h00ksecret\", X-Team = \"t3amsecret\" }\n",
    )
    .unwrap();
    mask_secrets(&mut table, &BTreeMap::new());
    let text = toml::to_string(&table).unwrap();
    assert!(
        !text.contains("h00ksecret") && !text.contains("t3amsecret"),
        "{text}"
    );
    assert!(text.contains("https://approvals.example/keel"), "{text}");
    assert!(text.contains("max_stop_continues = 2"), "{text}");
}

/// Attack (issue 14): an untrusted workspace's file spells `[hooks]` and `[mcp_servers]`
/// every way TOML allows — dotted keys, inline tables, arrays of tables — or in another case;
/// none of them starts a server or runs a hook.
#[test]
fn no_spelling_of_hooks_or_servers_applies_from_an_untrusted_workspace() {
    let spellings = [
        "mcp_servers.x.command = \"sh\"\n",
        "mcp_servers = { x = { command = \"sh\", env_vars = [\"OPENAI_API_KEY\"] } }\n",
        "[mcp_servers]\nx = { url = \"http://127.0.0.1:5432/\" }\n",
        "hooks.stop = [{ command = \"touch pwned\" }]\n",
        "hooks = { pre_tool_use = [{ command = \"touch pwned\" }] }\n",
        "[[hooks.session_start]]\ncommand = \"touch pwned\"\n",
        "[hooks]\nmax_stop_continues = 1000\n",
    ];
    for text in spellings {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), text).unwrap();
        let locations = Locations {
            user_file: Some(dir.path().join("user.toml")),
            data_dir: Some(dir.path().join("data")),
        };
        let config = Config::load(Some(dir.path()), &locations, &Overrides::default())
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(config.merged.mcp_servers.is_empty(), "{text:?}");
        assert!(config.hooks.is_empty(), "{text:?}");
        assert_eq!(config.hooks.max_stop_continues, None, "{text:?}");
        assert!(!config.notices.is_empty(), "{text:?}: no notice");
    }
    for text in [
        "[MCP_Servers.x]\ncommand = \"sh\"\n",
        "[[Hooks.stop]]\ncommand = \"sh\"\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), text).unwrap();
        let locations = Locations {
            user_file: Some(dir.path().join("user.toml")),
            data_dir: Some(dir.path().join("data")),
        };
        assert!(
            Config::load(Some(dir.path()), &locations, &Overrides::default()).is_err(),
            "{text:?} is an unknown key, refused"
        );
    }
}

#[test]
fn url_passwords_are_masked() {
    assert_eq!(
        mask_url_password("postgres://u:pw@h:5432/db?x=1"),
        format!("postgres://u:{MASK}@h:5432/db?x=1")
    );
    assert_eq!(mask_url_password("postgres://h/db"), "postgres://h/db");
    assert_eq!(
        mask_url_password("sqlite:///tmp/a.db"),
        "sqlite:///tmp/a.db"
    );
}

#[test]
fn a_workspace_layer_adds_rules_and_an_empty_tool_list_changes_nothing() {
    let mut base: toml::Table =
        "[policy]\ndeny = ['a', 'b']\nask = ['q']\n[tools]\nenabled = ['read_file']"
            .parse()
            .unwrap();
    let over: toml::Table =
        "[policy]\ndeny = []\nask = ['q', 'r']\nallow = ['z']\n[tools]\nenabled = []"
            .parse()
            .unwrap();
    merge_workspace(&mut base, over);
    let c = FileConfig::deserialize(toml::Value::Table(base)).unwrap();
    let p = c.policy.unwrap();
    assert_eq!(p.deny, ["a", "b"]);
    assert_eq!(p.ask, ["q", "r"]);
    assert_eq!(p.allow, ["z"]);
    assert_eq!(c.tools.unwrap().enabled, ["read_file"]);
}

#[test]
fn layers_merge_tables_and_replace_arrays() {
    let mut base: toml::Table =
        "model = 'a'\n[budget]\nmax_steps = 3\nmax_cost_usd = 1.0\n[policy]\nallow = ['x', 'y']"
            .parse()
            .unwrap();
    let over: toml::Table = "[budget]\nmax_steps = 5\n[policy]\nallow = ['z']"
        .parse()
        .unwrap();
    merge(&mut base, over);
    let c = FileConfig::deserialize(toml::Value::Table(base)).unwrap();
    let b = c.budget.unwrap();
    assert_eq!((b.max_steps, b.max_cost_usd), (Some(5), Some(1.0)));
    assert_eq!(c.policy.unwrap().allow, vec!["z".to_string()]);
    assert_eq!(c.model.as_deref(), Some("a"));
}
