//! The server's own reading of request bodies: each `/v1` body held to its schema in the
//! OpenAPI document (`keel_server::http::BodySchemas`, what every route's `JsonBody` does) and
//! the inspector's sign-in body (`keel_server::inspector::sign_in_key`).

use std::sync::OnceLock;

use keel_server::error::ApiError;
use keel_server::http::BodySchemas;
use serde::de::DeserializeOwned;

/// The document `/openapi.json` serves, and the validators compiled from it (once per process:
/// compiling a schema is the slow part, and the server also compiles each once).
fn schemas() -> &'static (String, BodySchemas) {
    static SCHEMAS: OnceLock<(String, BodySchemas)> = OnceLock::new();
    SCHEMAS.get_or_init(|| match keel_server::api::document() {
        Ok(doc) => (doc, BodySchemas::default()),
        Err(e) => panic!("the OpenAPI document does not render: {e}"),
    })
}

/// An input's error must be the client's: 400 (not JSON) or 422 (does not fit), naming a
/// field; a 500 here is a server bug (a schema missing from the document, one that does not
/// compile).
fn client_error(what: &str, e: &ApiError) {
    let status = e.status.as_u16();
    assert!(
        status == 400 || status == 422,
        "{what}: a body got {status} ({}), not 400 or 422",
        e.problem.detail
    );
}

/// `body` through the server's schema check as `T`: an answer, never a panic; refused as the
/// client's error; and what the check accepts, the plain decode ([`keel_api::body::decode`])
/// accepts too (the schema only narrows what serde takes).
fn checked<T: DeserializeOwned + utoipa::ToSchema>(body: &[u8]) {
    let (doc, schemas) = schemas();
    let name = T::name();
    match schemas.decode::<T>(doc, body) {
        Ok(_) => assert!(
            keel_api::body::decode::<T>(body).is_ok(),
            "{name}: the schema check took a body serde refuses"
        ),
        Err(e) => client_error(&name, &e),
    }
}

/// The `/v1` request bodies as the server reads them, schema check included, and the
/// inspector's sign-in body: the first byte picks the type (`% 12`: the eleven `*Request` types
/// in [`crate::api_request`]'s order, then sign-in), the rest is the body.
///
/// Invariants: every body gets an answer, never a panic; a refusal is 400 or 422 (never a 500);
/// a body the schema check accepts also decodes without it; a sign-in body gives a non-blank
/// key without surrounding whitespace, or 400/422 naming `key` or `body`.
pub fn api_body_schema(data: &[u8]) {
    use keel_api::*;
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    match pick % 12 {
        0 => checked::<CreateSessionRequest>(body),
        1 => checked::<UpdateSessionRequest>(body),
        2 => checked::<SubmitTurnRequest>(body),
        3 => checked::<CancelRequest>(body),
        4 => checked::<CloseRequest>(body),
        5 => checked::<CreateReleaseRequest>(body),
        6 => checked::<PutMemoryRequest>(body),
        7 => checked::<DecideApprovalRequest>(body),
        8 => checked::<DecideEffectRequest>(body),
        9 => checked::<CreateTenantRequest>(body),
        10 => checked::<CreateKeyRequest>(body),
        _ => match keel_server::inspector::sign_in_key(body) {
            Ok(key) => assert!(
                !key.is_empty() && key.trim() == key,
                "sign-in took a blank or untrimmed key {key:?}"
            ),
            Err(e) => client_error("SignInRequest", &e),
        },
    }
}
