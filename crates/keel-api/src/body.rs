//! Reading a request body's JSON as `keel serve` does (its `JsonBody` extractor, after the
//! media type and size checks and before its JSON Schema validation), so the server and the
//! fuzz target (`keel-fuzz` `api_request`) decode exactly the same way.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Decodes `bytes` as `T`; a number written with a zero fraction (`3.0`) is taken where an
/// integer is expected (JSON Schema counts it as an integer, serde does not). A body of only
/// whitespace is not JSON here: the server reads it as `{}` before this only where the
/// operation's body is optional.
///
/// # Errors
/// serde_json's error of the first attempt (its `classify()` tells bad JSON from a body that
/// does not fit `T`) when the body is not JSON or does not fit `T` even with such numbers made
/// integers.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    match serde_json::from_slice::<T>(bytes) {
        // Retry with integral floats made integers, keeping the first error when that does
        // not help.
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else {
                return Err(e);
            };
            if integral_floats_to_integers(&mut v) {
                serde_json::from_value::<T>(v).map_err(|_| e)
            } else {
                Err(e)
            }
        }
        other => other,
    }
}

/// Rewrites every float with a zero fractional part that fits an `i64`/`u64` as that
/// integer; whether any changed.
fn integral_floats_to_integers(v: &mut Value) -> bool {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() != 0.0 || !f.is_finite() {
                return false;
            }
            // 2^63 and 2^64 are exact as f64; below them the casts are exact too.
            let int = if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                serde_json::Number::from(f as u64)
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                serde_json::Number::from(f as i64)
            } else {
                return false;
            };
            *v = Value::Number(int);
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, v| integral_floats_to_integers(v) | any),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |any, v| integral_floats_to_integers(v) | any),
        _ => false,
    }
}
