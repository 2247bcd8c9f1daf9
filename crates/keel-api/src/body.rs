//! Reading a request body's JSON as `keel serve` does (its `JsonBody` extractor, after the
//! media type and size checks and before its JSON Schema validation), so the server and the
//! fuzz target (`keel-fuzz` `api_request`) decode exactly the same way.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Whether `bytes` hold no JSON at all: empty, or only JSON's whitespace (space, tab, line feed,
/// carriage return: RFC 8259 §2; a form feed or a vertical tab is not whitespace there).
pub fn is_blank(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

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
                // `Value` keeps only the last of a key given twice; the bytes must not.
                serde_json::from_slice::<NoDuplicateKeys>(bytes)?;
                serde_json::from_value::<T>(v).map_err(|_| e)
            } else {
                Err(e)
            }
        }
        other => other,
    }
}

/// The first key an object of `bytes` names twice (at any depth), when `bytes` are JSON and
/// one does: `serde_json::Value` (and so every reader that goes through it) keeps only the last
/// of duplicate keys, so a reader that must refuse them asks this of the bytes. Shared by the
/// server's bodies (through [`decode`]) and `keel acp`'s JSON-RPC lines.
pub fn duplicate_key(bytes: &[u8]) -> Option<String> {
    let e = serde_json::from_slice::<NoDuplicateKeys>(bytes).err()?;
    let text = e.to_string();
    // NoDuplicateKeys' message, then serde_json's " at line L column C".
    let (key, _) = text
        .strip_prefix(DUPLICATE_FIELD)?
        .rsplit_once("` at line ")?;
    Some(key.to_owned())
}

/// How [`NoDuplicateKeys`]' error starts (serde's wording for a struct's field given twice).
const DUPLICATE_FIELD: &str = "duplicate field `";

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

/// Any JSON value whose objects name no key twice; a key given twice is the error
/// ``duplicate field `KEY` `` (serde's wording for a struct's field). Read from the bytes, since
/// `serde_json::Value` keeps only the last of duplicate keys.
struct NoDuplicateKeys;

impl<'de> de::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }
}

impl<'de> Visitor<'de> for NoDuplicateKeys {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_FIELD}{key}`")));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[allow(dead_code)]
        a: u64,
        #[allow(dead_code)]
        b: Option<u64>,
    }

    #[test]
    fn an_integral_float_is_an_integer_but_a_key_twice_is_still_refused() {
        assert!(decode::<Body>(br#"{"a": 3.0}"#).is_ok());
        for body in [
            &br#"{"a": 1, "a": 2, "b": 3.0}"#[..],
            br#"{"b": 3.0, "a": 1, "a": 2}"#,
        ] {
            let e = decode::<Body>(body).unwrap_err();
            assert!(e.to_string().contains("duplicate field `a`"), "{e}");
        }
        // Refused too, for the float that the last `a` (read through `Value`) no longer has.
        assert!(decode::<Body>(br#"{"a": 1.0, "a": 2}"#).is_err());
        assert!(decode::<Body>(br#"{"a": 1.5}"#).is_err());
    }

    #[test]
    fn only_json_whitespace_is_blank() {
        assert!(is_blank(b""));
        assert!(is_blank(b" \t\r\n"));
        for b in [
            &b"\x0c"[..],
            b"\x0b",
            b"\xc2\xa0",
            b"\xef\xbb\xbf",
            b"\0",
            b"{}",
        ] {
            assert!(!is_blank(b), "{b:?}");
        }
    }

    #[test]
    fn duplicate_key_names_the_first_key_given_twice_at_any_depth() {
        assert_eq!(duplicate_key(br#"{"a": 1, "a": 2}"#).as_deref(), Some("a"));
        assert_eq!(
            duplicate_key(br#"{"x": [{"b`c": 1, "b`c": 2}], "a": 1}"#).as_deref(),
            Some("b`c")
        );
        assert_eq!(duplicate_key(br#"{"a": {"a": 1}, "b": [1, 1]}"#), None);
        assert_eq!(duplicate_key(b"{\"a\": "), None, "not JSON: no key to name");
    }
}
