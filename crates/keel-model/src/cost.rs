//! What Keel knows about models: prices and cost per step, and context windows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::Usage;

/// Prices of one model in USD per million tokens. In configuration, `cache_read` and
/// `cache_write` may be left out: they then cost the plain input price (never under-counted).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "PriceConfig")]
pub struct Price {
    /// Uncached input, USD per 1M tokens.
    pub input: f64,
    /// Output (including reasoning), USD per 1M tokens.
    pub output: f64,
    /// Input read from cache, USD per 1M tokens.
    pub cache_read: f64,
    /// Input written to cache, USD per 1M tokens (Anthropic 5-minute cache writes; OpenAI charges
    /// the input price).
    pub cache_write: f64,
}

/// [`Price`] as written in configuration.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceConfig {
    input: f64,
    output: f64,
    #[serde(default)]
    cache_read: Option<f64>,
    #[serde(default)]
    cache_write: Option<f64>,
}

impl From<PriceConfig> for Price {
    fn from(c: PriceConfig) -> Self {
        Self {
            input: c.input,
            output: c.output,
            cache_read: c.cache_read.unwrap_or(c.input),
            cache_write: c.cache_write.unwrap_or(c.input),
        }
    }
}

impl Price {
    /// Cost of `usage` in USD.
    pub fn cost_usd(&self, usage: &Usage) -> f64 {
        let plain = usage.input_tokens.saturating_sub(
            usage
                .cache_read_tokens
                .saturating_add(usage.cache_write_tokens),
        );
        (plain as f64 * self.input
            + usage.cache_read_tokens as f64 * self.cache_read
            + usage.cache_write_tokens as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

const fn p(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Price {
    Price {
        input,
        output,
        cache_read,
        cache_write,
    }
}

/// Default prices (USD per 1M tokens, input / output / cache read / cache write) from the
/// providers' pricing pages (standard tier, 5-minute Anthropic cache writes), for current OpenAI
/// and Anthropic models. Keys are model ids or prefixes of them (dated snapshots match their
/// family). Models without prompt caching charge cache reads at the input price.
const DEFAULT_PRICES: &[(&str, Price)] = &[
    ("gpt-5.2", p(1.75, 14.0, 0.175, 1.75)),
    ("gpt-5.1", p(1.25, 10.0, 0.125, 1.25)),
    ("gpt-5.1-codex-mini", p(0.25, 2.0, 0.025, 0.25)),
    ("gpt-5-pro", p(15.0, 120.0, 15.0, 15.0)),
    ("gpt-5", p(1.25, 10.0, 0.125, 1.25)),
    ("gpt-5-mini", p(0.25, 2.0, 0.025, 0.25)),
    ("gpt-5-nano", p(0.05, 0.40, 0.005, 0.05)),
    ("gpt-4.1", p(2.0, 8.0, 0.50, 2.0)),
    ("gpt-4.1-mini", p(0.40, 1.60, 0.10, 0.40)),
    ("gpt-4.1-nano", p(0.10, 0.40, 0.025, 0.10)),
    ("gpt-4o", p(2.50, 10.0, 1.25, 2.50)),
    ("gpt-4o-mini", p(0.15, 0.60, 0.075, 0.15)),
    ("o1", p(15.0, 60.0, 7.50, 15.0)),
    ("o3", p(2.0, 8.0, 0.50, 2.0)),
    ("o3-mini", p(1.10, 4.40, 0.55, 1.10)),
    ("o4-mini", p(1.10, 4.40, 0.275, 1.10)),
    ("claude-opus-4-5", p(5.0, 25.0, 0.50, 6.25)),
    ("claude-opus-4-1", p(15.0, 75.0, 1.50, 18.75)),
    ("claude-opus-4", p(15.0, 75.0, 1.50, 18.75)),
    ("claude-sonnet-4-5", p(3.0, 15.0, 0.30, 3.75)),
    ("claude-sonnet-4", p(3.0, 15.0, 0.30, 3.75)),
    ("claude-3-7-sonnet", p(3.0, 15.0, 0.30, 3.75)),
    ("claude-haiku-4-5", p(1.0, 5.0, 0.10, 1.25)),
    ("claude-3-5-haiku", p(0.80, 4.0, 0.08, 1.0)),
    ("claude-3-opus", p(15.0, 75.0, 1.50, 18.75)),
];

/// Prices by model id. Lookup takes the exact id, else the longest key that the id starts with
/// (`claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`). Deserializes from a map
/// `{"gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25, "cache_write": 2.5}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable {
    prices: BTreeMap<String, Price>,
}

impl Default for PriceTable {
    /// The built-in prices.
    fn default() -> Self {
        Self {
            prices: DEFAULT_PRICES
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }
    }
}

impl PriceTable {
    /// A table with no prices.
    pub fn empty() -> Self {
        Self {
            prices: BTreeMap::new(),
        }
    }

    /// Adds or replaces the price of `model` (configuration overrides).
    pub fn set(&mut self, model: impl Into<String>, price: Price) {
        self.prices.insert(model.into(), price);
    }

    /// Adds or replaces every price of `overrides`.
    pub fn merge(&mut self, overrides: &PriceTable) {
        self.prices
            .extend(overrides.prices.iter().map(|(k, v)| (k.clone(), *v)));
    }

    /// The price of `model`, if known.
    pub fn price(&self, model: &str) -> Option<&Price> {
        lookup(self.prices.iter().map(|(k, v)| (k.as_str(), v)), model)
    }

    /// Cost of `usage` by `model` in USD; `None` when the model has no price (e.g. a local model).
    pub fn cost_usd(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.price(model).map(|p| p.cost_usd(usage))
    }
}

/// The context window assumed for a model this build does not know (a local or new model):
/// 128,000 tokens, the common window of current mid-size models. Configure the real one
/// (`SessionConfig::context_window_tokens`, `context_window` in `keel.toml`) when it differs.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

/// Context windows (prompt tokens a model accepts) from the providers' model pages. Keys are
/// model ids or prefixes of them, looked up like prices. Where a provider documents an input
/// limit below the total window (GPT-5: 400k total, at most 128k of it output), the input
/// limit is listed, since it is what a prompt may fill. Anthropic's 1M-token beta windows need
/// a request header Keel does not send, so Claude models count 200k.
const CONTEXT_WINDOWS: &[(&str, u64)] = &[
    ("gpt-5.2", 272_000),
    ("gpt-5.1", 272_000),
    ("gpt-5", 272_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o1-preview", 128_000),
    ("o3", 200_000),
    ("o3-mini", 200_000),
    ("o4-mini", 200_000),
    ("claude-opus-4", 200_000),
    ("claude-sonnet-4", 200_000),
    ("claude-haiku-4", 200_000),
    ("claude-3", 200_000),
];

/// Looks `model` up in `table`: the exact id, else the longest key the id starts with followed
/// by `-`, `@` or `:` (`claude-sonnet-4-5-20250929` → `claude-sonnet-4`).
fn lookup<'a, V>(table: impl IntoIterator<Item = (&'a str, V)>, model: &str) -> Option<V> {
    table
        .into_iter()
        .filter(|(key, _)| {
            model == *key
                || (model.starts_with(key) && model[key.len()..].starts_with(['-', '@', ':']))
        })
        .max_by_key(|(key, _)| key.len())
        .map(|(_, v)| v)
}

/// The context window of `model` in tokens, if this build knows the model (see
/// [`DEFAULT_CONTEXT_WINDOW`] for the others). Dated snapshots and variants take their
/// family's window (`gpt-4o-2024-08-06` → `gpt-4o`, `gpt-4.1-mini` → `gpt-4.1`).
pub fn context_window(model: &str) -> Option<u64> {
    lookup(CONTEXT_WINDOWS.iter().map(|(k, v)| (*k, *v)), model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_snapshots_use_their_family_price_and_longest_prefix_wins() {
        let t = PriceTable::default();
        assert_eq!(
            t.price("claude-sonnet-4-5-20250929"),
            t.price("claude-sonnet-4-5")
        );
        assert_eq!(
            t.price("gpt-4o-mini-2024-07-18").map(|p| p.input),
            Some(0.15)
        );
        assert_eq!(t.price("gpt-4o-2024-08-06").map(|p| p.input), Some(2.50));
        assert_eq!(t.price("gpt-5.1-codex-max").map(|p| p.input), Some(1.25));
        assert!(t.price("llama-3-8b").is_none());
        assert!(t.price("gpt-4olala").is_none());
    }

    #[test]
    fn known_models_have_their_window_and_unknown_ones_none() {
        assert_eq!(context_window("gpt-4o"), Some(128_000));
        assert_eq!(context_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(context_window("gpt-4o-2024-08-06"), Some(128_000));
        assert_eq!(context_window("gpt-4.1-nano"), Some(1_047_576));
        assert_eq!(context_window("gpt-4"), Some(8_192));
        assert_eq!(context_window("gpt-4-0613"), Some(8_192));
        assert_eq!(context_window("gpt-5"), Some(272_000));
        assert_eq!(context_window("gpt-5-mini"), Some(272_000));
        assert_eq!(context_window("gpt-5.1-codex-mini"), Some(272_000));
        assert_eq!(context_window("o1-mini-2024-09-12"), Some(128_000));
        assert_eq!(context_window("o3-mini"), Some(200_000));
        assert_eq!(context_window("o4-mini"), Some(200_000));
        assert_eq!(context_window("claude-sonnet-4-5-20250929"), Some(200_000));
        assert_eq!(context_window("claude-opus-4-1"), Some(200_000));
        assert_eq!(context_window("claude-3-5-haiku-latest"), Some(200_000));
        assert_eq!(context_window("claude-3-opus-20240229"), Some(200_000));
        assert_eq!(context_window("llama-3-8b"), None);
        assert_eq!(context_window("gpt-4olala"), None);
        assert_eq!(context_window("scripted:demo.jsonl"), None);
    }

    #[test]
    fn cost_splits_cached_and_plain_input() {
        let price = p(3.0, 15.0, 0.30, 3.75);
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: 500_000,
            cache_write_tokens: 100_000,
            reasoning_tokens: 0,
        };
        // 400k plain * 3 + 500k * 0.30 + 100k * 3.75 + 100k * 15, per million
        let expected = 1.2 + 0.15 + 0.375 + 1.5;
        assert!((price.cost_usd(&usage) - expected).abs() < 1e-9);
    }

    #[test]
    fn config_prices_may_omit_cache_prices_and_reject_unknown_fields() {
        let t: PriceTable =
            serde_json::from_str(r#"{"my-model": {"input": 2, "output": 8}}"#).unwrap();
        assert_eq!(t.price("my-model"), Some(&p(2.0, 8.0, 2.0, 2.0)));
        assert!(serde_json::from_str::<PriceTable>(r#"{"m": {"input": 2, "ouput": 8}}"#).is_err());
        let round: PriceTable =
            serde_json::from_str(&serde_json::to_string(&PriceTable::default()).unwrap()).unwrap();
        assert_eq!(round, PriceTable::default());
    }

    #[test]
    fn config_overrides_merge() {
        let mut t = PriceTable::default();
        let o: PriceTable = serde_json::from_str(
            r#"{"local-llama": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}}"#,
        )
        .unwrap();
        t.merge(&o);
        assert_eq!(
            t.cost_usd(
                "local-llama",
                &Usage {
                    input_tokens: 10,
                    ..Usage::default()
                }
            ),
            Some(0.0)
        );
    }
}
