//! JSON merge patches (RFC 7386), the shape of `session.config_changed`.
//!
//! A patch is a JSON object: each key replaces that key of the target, an object value is merged
//! into the target's object recursively, and `null` removes the key (so an optional setting goes
//! back to its default). [`merge_diff`] computes the smallest patch between two values.

use serde_json::{Map, Value};

/// Applies `patch` to `target` in place (RFC 7386). A non-object patch replaces the target.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(obj) = target {
        for (key, value) in changes {
            if value.is_null() {
                obj.remove(key);
            } else {
                merge_patch(obj.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// The merge patch that turns `from` into `to`: for two objects, the keys that differ (nested
/// objects diffed recursively, removed keys as `null`); otherwise `to` itself. `merge_patch(from,
/// merge_diff(from, to)) == to` whenever `to` holds no `null` inside an object (a merge patch
/// cannot set a key to `null`). Two equal values give an empty object.
pub fn merge_diff(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = Map::new();
            for (key, old) in a {
                match b.get(key) {
                    None => {
                        out.insert(key.clone(), Value::Null);
                    }
                    Some(new) if new != old => {
                        out.insert(key.clone(), merge_diff(old, new));
                    }
                    Some(_) => {}
                }
            }
            for (key, new) in b {
                if !a.contains_key(key) {
                    out.insert(key.clone(), new.clone());
                }
            }
            Value::Object(out)
        }
        _ => to.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patches_merge_nested_objects_and_null_removes() {
        let mut t =
            json!({"mode": "default", "budget": {"max_steps": 5, "max_cost_usd": 1.0}, "x": 1});
        merge_patch(
            &mut t,
            &json!({"mode": "bypass", "budget": {"max_steps": 1}, "x": null, "host": {"u": "h"}}),
        );
        assert_eq!(
            t,
            json!({"mode": "bypass", "budget": {"max_steps": 1, "max_cost_usd": 1.0}, "host": {"u": "h"}})
        );
    }

    #[test]
    fn diff_then_patch_gives_the_target() {
        let from = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        let to = json!({"a": 1, "b": {"c": 4}, "e": [2], "f": "new"});
        let d = merge_diff(&from, &to);
        assert_eq!(d, json!({"b": {"c": 4, "d": null}, "e": [2], "f": "new"}));
        let mut t = from.clone();
        merge_patch(&mut t, &d);
        assert_eq!(t, to);
        assert_eq!(merge_diff(&to, &to), json!({}));
    }
}
