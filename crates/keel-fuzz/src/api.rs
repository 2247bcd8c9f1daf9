//! The API target: `/v1` request bodies as a client sends them.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Reads `body` as `T` the way the server does ([`keel_api::body::decode`]); when it is
/// accepted, its JSON form must read back to the same JSON form.
fn round_trip<T: Serialize + DeserializeOwned>(what: &str, body: &[u8]) {
    let Ok(first) = keel_api::body::decode::<T>(body) else {
        return;
    };
    let encoded = match serde_json::to_value(&first) {
        Ok(v) => v,
        Err(e) => panic!("an accepted {what} does not serialize: {e}"),
    };
    let second: T = match serde_json::from_value(encoded.clone()) {
        Ok(v) => v,
        Err(e) => panic!("an accepted {what}, serialized, is refused: {e}: {encoded}"),
    };
    match serde_json::to_value(&second) {
        Ok(again) => assert_eq!(again, encoded, "{what} changed on a round trip"),
        Err(e) => panic!("an accepted {what} does not serialize: {e}"),
    }
}

/// The `/v1` request bodies ([`keel_api`]'s `*Request` types): the first byte picks the type,
/// the rest is the JSON body.
///
/// Invariants: deserialization as the server decodes a body (integral floats as integers) answers (a body or an error), never panics; an accepted body
/// round-trips through its JSON form; any JSON body has a canonical hash (the idempotency
/// record's `request_hash`), the same for the body written again.
pub fn api_request(data: &[u8]) {
    use keel_api::*;
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    match pick % 11 {
        0 => round_trip::<CreateSessionRequest>("CreateSessionRequest", body),
        1 => round_trip::<UpdateSessionRequest>("UpdateSessionRequest", body),
        2 => round_trip::<SubmitTurnRequest>("SubmitTurnRequest", body),
        3 => round_trip::<CancelRequest>("CancelRequest", body),
        4 => round_trip::<CloseRequest>("CloseRequest", body),
        5 => round_trip::<CreateReleaseRequest>("CreateReleaseRequest", body),
        6 => round_trip::<PutMemoryRequest>("PutMemoryRequest", body),
        7 => round_trip::<DecideApprovalRequest>("DecideApprovalRequest", body),
        8 => round_trip::<DecideEffectRequest>("DecideEffectRequest", body),
        9 => round_trip::<CreateTenantRequest>("CreateTenantRequest", body),
        _ => round_trip::<CreateKeyRequest>("CreateKeyRequest", body),
    }
    // Any JSON value at all, as the server reads a body before picking its type, and hashes
    // it for `Idempotency-Key` (canonical JSON: key order and spacing do not matter).
    if let Ok(v) = keel_api::body::decode::<Value>(body) {
        let hash = keel_core::canonical::content_hash(&v);
        match serde_json::to_vec(&v) {
            Ok(again) => match serde_json::from_slice::<Value>(&again) {
                Ok(w) => assert_eq!(
                    keel_core::canonical::content_hash(&w),
                    hash,
                    "a body's hash changed when written again"
                ),
                Err(e) => panic!("a JSON body written again does not read: {e}"),
            },
            Err(e) => panic!("a JSON body does not write: {e}"),
        }
    }
}
