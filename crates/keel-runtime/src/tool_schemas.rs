//! The tool lists steps show the model, built once and shared.
//!
//! A step's [`crate::context::ContextSnapshot`] and the [`keel_model::ModelRequest`] made from
//! it carry the tools the model may call. Every step of every session of one release sees the
//! same registry (the host's, or the one built for the release's sources; see
//! `crate::tool_catalog`) and nearly always the same visible tools, so the list is built once
//! per (registry, tools shown) and shared (`Arc<[ToolSchema]>`): a waiting session holds a
//! pointer, not its own copy of every schema (issue 16: ~40 KB per waiting session with the
//! built-in tools).

use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use keel_model::ToolSchema;
use keel_tools::ToolRegistry;

use crate::tokens::estimate_tokens;

/// How many (registry, tools shown) lists are remembered; past it, the oldest is forgotten
/// (the snapshots holding it keep it).
const REMEMBERED: usize = 64;

/// One remembered list.
struct Shown {
    /// The registry it was built from. Weak, and compared by address: while the entry holds
    /// it, the registry's allocation stays, so no other registry can take its address. A
    /// registry is not changed once shared (`tool_catalog` builds a new one for a new list).
    registry: Weak<ToolRegistry>,
    /// The names shown, in the registry's (name) order.
    names: Vec<String>,
    tools: Arc<[ToolSchema]>,
    /// The estimated tokens of the list (descriptions and parameter schemas).
    tokens: u64,
}

static SHOWN: LazyLock<Mutex<Vec<Shown>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The schemas of the tools of `registry` that `show` keeps (called with each tool's name and
/// effect class, in name order), shared with every other caller showing the same tools of the
/// same registry, and their estimated tokens (each description's and parameters schema's
/// bytes / 4, see [`crate::tokens`]).
pub(crate) fn shown_tools(
    registry: &Arc<ToolRegistry>,
    mut show: impl FnMut(&str, keel_tools::tool::EffectClass) -> bool,
) -> (Arc<[ToolSchema]>, u64) {
    let names: Vec<&str> = registry
        .iter_specs()
        .filter(|s| show(&s.name, s.effect))
        .map(|s| s.name.as_str())
        .collect();
    let same = |s: &Shown| {
        s.registry.as_ptr() == Arc::as_ptr(registry)
            && s.names.len() == names.len()
            && s.names.iter().zip(&names).all(|(a, b)| a == b)
    };
    {
        let shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = shown.iter().find(|s| same(s)) {
            return (s.tools.clone(), s.tokens);
        }
    }
    let tools: Arc<[ToolSchema]> = registry
        .iter_specs()
        .filter(|s| names.contains(&s.name.as_str()))
        .map(|s| ToolSchema {
            name: s.name.clone(),
            description: s.description.clone(),
            parameters: s.input_schema.clone(),
        })
        .collect();
    let tokens = tools
        .iter()
        .map(|t| estimate_tokens(&t.description) + estimate_tokens(&t.parameters.to_string()))
        .sum();
    let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = shown.iter().find(|s| same(s)) {
        return (s.tools.clone(), s.tokens);
    }
    shown.retain(|s| s.registry.strong_count() > 0);
    if shown.len() >= REMEMBERED {
        shown.remove(0);
    }
    shown.push(Shown {
        registry: Arc::downgrade(registry),
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        tools: tools.clone(),
        tokens,
    });
    (tools, tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_list_per_registry_and_tools_shown() {
        let registry = Arc::new(ToolRegistry::with_builtins().unwrap());
        let (all, tokens) = shown_tools(&registry, |_, _| true);
        let (again, same_tokens) = shown_tools(&registry, |_, _| true);
        assert!(Arc::ptr_eq(&all, &again), "the same tools are one list");
        assert_eq!(tokens, same_tokens);
        assert_eq!(all.len(), registry.specs().len());
        assert!(tokens > 0);

        let (some, fewer) = shown_tools(&registry, |name, _| name == "read_file");
        assert!(!Arc::ptr_eq(&all, &some));
        assert_eq!(
            some.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["read_file"]
        );
        assert!(fewer < tokens);

        // Another registry with the same tools has its own list (its schemas could differ).
        let other = Arc::new(ToolRegistry::with_builtins().unwrap());
        let (theirs, _) = shown_tools(&other, |_, _| true);
        assert!(!Arc::ptr_eq(&all, &theirs));
        assert_eq!(*all, *theirs);
    }
}
