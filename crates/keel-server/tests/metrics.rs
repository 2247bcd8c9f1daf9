//! `/metrics` (issue 13 item 6): the exposition parses, every metric is there before anything
//! happened, and a scripted run moves the token, cost, tool and step metrics by exactly what it
//! used.

use std::collections::BTreeMap;

use serde_json::json;

use crate::common::{Backend, TestServer, start};

/// Every metric family `/metrics` shows from the start, with its type.
const FAMILIES: &[(&str, &str)] = &[
    ("keel_sessions", "gauge"),
    ("keel_queue_depth", "gauge"),
    ("keel_sessions_left_for_newer_schema", "gauge"),
    ("keel_claim_latency_seconds", "histogram"),
    ("keel_worker_claims", "counter"),
    ("keel_lease_takeovers", "counter"),
    ("keel_admission_rejections", "counter"),
    ("keel_admitted_turns_unwritten", "gauge"),
    ("keel_admitted_turns_unwritten_max", "gauge"),
    ("keel_step_latency_seconds", "histogram"),
    ("keel_model_tokens", "counter"),
    ("keel_model_cost_usd", "counter"),
    ("keel_tool_calls", "counter"),
    ("keel_session_runs", "counter"),
    ("keel_session_run_errors", "counter"),
    ("keel_sessions_running", "gauge"),
    ("keel_http_responses", "counter"),
    ("keel_sse_streams_open", "gauge"),
    ("keel_sse_credential_checks", "counter"),
    ("keel_idempotent_replays", "counter"),
];

/// A parsed exposition: families (name → type) and samples (`name{labels}` → value).
#[derive(Debug)]
pub struct Exposition {
    families: BTreeMap<String, String>,
    samples: BTreeMap<String, f64>,
}

impl Exposition {
    /// The value of `sample` (`name{labels}`); panics when absent.
    pub fn get(&self, sample: &str) -> f64 {
        *self
            .samples
            .get(sample)
            .unwrap_or_else(|| panic!("no sample {sample} in {:#?}", self.samples))
    }
}

/// Parses the OpenMetrics text strictly: every line is `# HELP name text`, `# TYPE name type`,
/// `# UNIT name unit`, a sample `name{label="value",…} number` of a declared family (with the
/// suffixes its type allows), or the final `# EOF`.
fn parse(text: &str) -> Exposition {
    let mut families = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name, value) = (
                parts.next().unwrap(),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            assert!(name_ok(name), "bad name in {line:?}");
            match kind {
                "HELP" => assert!(!value.is_empty(), "{line:?}"),
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram"].contains(&value),
                        "{line:?}"
                    );
                    assert!(
                        families.insert(name.to_owned(), value.to_owned()).is_none(),
                        "{name} declared twice"
                    );
                }
                "UNIT" => assert_eq!(value, "seconds", "{line:?}"),
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "bad name in {line:?}");
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("bad labels in {line:?}"));
            for pair in inner.split("\",") {
                let (k, v) = pair
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("bad label in {line:?}"));
                assert!(name_ok(k), "bad label name in {line:?}");
                assert!(!v.trim_end_matches('"').contains('"'), "{line:?}");
            }
        }
        assert!(
            families.iter().any(|(f, t)| {
                let suffixes: &[&str] = match t.as_str() {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| name == format!("{f}{s}"))
            }),
            "sample of no declared family: {line:?}"
        );
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    Exposition { families, samples }
}

/// `/metrics` of `s`, parsed strictly.
pub async fn scrape(s: &TestServer) -> Exposition {
    let res = reqwest::get(format!("http://{}/metrics", s.metrics.unwrap()))
        .await
        .unwrap();
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{:?}",
        res.headers()
    );
    parse(&res.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_served_at_zero_before_anything_happens() {
    let s = start(Backend::Sqlite).await;
    let m = scrape(&s).await;
    for (name, kind) in FAMILIES {
        assert_eq!(
            m.families.get(*name).map(String::as_str),
            Some(*kind),
            "{name} in {:#?}",
            m.families
        );
    }
    for status in ["created", "running", "idle", "requires_action", "closed"] {
        assert_eq!(m.get(&format!("keel_sessions{{status=\"{status}\"}}")), 0.0);
    }
    for sample in [
        "keel_worker_claims_total",
        "keel_lease_takeovers_total",
        "keel_admission_rejections_total{scope=\"tenant\"}",
        "keel_admission_rejections_total{scope=\"overall\"}",
        "keel_claim_latency_seconds_count",
        "keel_step_latency_seconds_count",
        "keel_sessions_left_for_newer_schema",
        "keel_session_runs_total",
        "keel_session_run_errors_total",
    ] {
        assert_eq!(m.get(sample), 0.0, "{sample}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_moves_tokens_cost_tools_and_steps_by_what_it_used() {
    let s = start(Backend::Sqlite).await;
    let release = s
        .release(
            "meter",
            &[
                json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}], "usage": {"input_tokens": 10, "output_tokens": 5}}),
                json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.md"}}], "usage": {"input_tokens": 11, "output_tokens": 6, "reasoning_tokens": 2}}),
                json!({"text": "read it", "usage": {"input_tokens": 20, "output_tokens": 7, "cache_read_tokens": 3}}),
            ],
            &["read_file"],
        )
        .await;
    let before = scrape(&s).await;
    s.run_to_idle(&release, "read the readme").await;
    let m = scrape(&s).await;
    // The one model of the route, by its label.
    let tokens: BTreeMap<&String, f64> = m
        .samples
        .iter()
        .filter(|(k, _)| k.starts_with("keel_model_tokens_total{"))
        .map(|(k, v)| (k, *v))
        .collect();
    let model = tokens
        .keys()
        .find_map(|k| k.split("model=\"").nth(1)?.split('"').next())
        .unwrap()
        .to_owned();
    assert!(
        model.starts_with("scripted:") && model.ends_with("meter.jsonl"),
        "{model}"
    );
    let token = |kind: &str| {
        m.get(&format!(
            "keel_model_tokens_total{{model=\"{model}\",kind=\"{kind}\"}}"
        ))
    };
    assert_eq!(token("input"), 41.0);
    assert_eq!(token("output"), 18.0);
    assert_eq!(token("cache_read"), 3.0);
    assert_eq!(token("reasoning"), 2.0);
    assert_eq!(tokens.len(), 4, "no cache_write series: {tokens:#?}");
    // The scripted model has no price: no cost series.
    assert!(
        !m.samples
            .keys()
            .any(|k| k.starts_with("keel_model_cost_usd_total{")),
        "{:#?}",
        m.samples
    );
    assert_eq!(
        m.get("keel_tool_calls_total{tool=\"read_file\",outcome=\"succeeded\"}"),
        1.0
    );
    assert_eq!(
        m.get("keel_tool_calls_total{tool=\"read_file\",outcome=\"failed\"}"),
        1.0
    );
    assert_eq!(
        m.get("keel_step_latency_seconds_count") - before.get("keel_step_latency_seconds_count"),
        3.0
    );
    // The node's workers claimed and ran the session (runnable since its turn was queued).
    assert!(m.get("keel_worker_claims_total") >= 1.0);
    assert!(m.get("keel_claim_latency_seconds_count") >= 1.0);
    assert!(m.get("keel_session_runs_total") >= 1.0);
    assert_eq!(m.get("keel_session_run_errors_total"), 0.0);
    assert!(m.get("keel_http_responses_total{class=\"2xx\"}") >= 3.0);
    // The session is idle and nothing is queued (the store's counts at scrape time).
    assert_eq!(m.get("keel_sessions{status=\"idle\"}"), 1.0);
    assert_eq!(m.get("keel_sessions{status=\"running\"}"), 0.0);
    assert!(
        !m.samples.keys().any(|k| k.starts_with("keel_queue_depth{")),
        "{:#?}",
        m.samples
    );
}

/// Open event streams recheck their key every `RECHECK`; 60 streams of one key share one store
/// read per check, not one each (1,000 streams of one key, all rechecking at once, exhausted
/// the store's pool and failed other requests with 500: `cargo bench -p keel --bench fanout`,
/// 2026-12-06). The count is of store reads, so it is asserted as a bound on a count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_of_one_key_share_their_credential_checks() {
    let s = start(Backend::Sqlite).await;
    let before = scrape(&s).await.get("keel_sse_credential_checks_total");
    let mut streams = Vec::new();
    for _ in 0..60 {
        let st = s.sse("/v1/events", &s.viewer, None).await;
        assert_eq!(st.status, reqwest::StatusCode::OK);
        streams.push(st);
    }
    let periods = 3;
    tokio::time::sleep(
        keel_server::api::events::RECHECK * periods + std::time::Duration::from_millis(500),
    )
    .await;
    let m = scrape(&s).await;
    assert_eq!(m.get("keel_sse_streams_open"), 60.0);
    let reads = m.get("keel_sse_credential_checks_total") - before;
    // Each stream rechecked `periods` times (180 checks); a check within `FRESH` of another
    // of the same key reuses it, so each period costs one read, two when its ticks straddle one.
    assert!(
        reads >= 1.0 && reads <= f64::from(2 * periods),
        "{reads} store reads for 60 streams over {periods} check periods"
    );
    drop(streams);
}
