//! OpenAPI links (OpenAPI 3.1 §4.8.20): how an id a create operation returns feeds the path
//! parameters of the operations on that resource. Generic clients follow them — schemathesis's
//! stateful phase creates a session, then reads, changes, closes and deletes *that* session.

use std::collections::BTreeMap;

use utoipa::openapi::{OpenApi, RefOr, path::ParameterIn};

/// `(operation_id, body field)`: the operations that create a resource and the field of their
/// 2xx JSON body holding its id, named like the path parameters that take it.
const PRODUCERS: &[(&str, &str)] = &[
    ("create_tenant", "tenant_id"),
    ("create_tenant_key", "key_id"),
    ("create_key", "key_id"),
    ("create_release", "release_id"),
    ("create_session", "session_id"),
    ("submit_turn", "turn_id"),
];

/// Adds a link from every 2xx response of each producer to every operation with a path
/// parameter named like the producer's id field. The consumer's other path parameters come
/// from the producer's own request path (`submit_turn`'s `session_id`); a consumer needing a
/// parameter neither supplies gets no link.
pub fn add(doc: &mut OpenApi) {
    // (operation_id, path parameter names) of every operation.
    let mut consumers: Vec<(String, Vec<String>)> = Vec::new();
    for item in doc.paths.paths.values() {
        for (_, op) in super::operations(item) {
            let Some(id) = op.operation_id.clone() else {
                continue;
            };
            let names = op
                .parameters
                .iter()
                .flatten()
                .filter(|p| matches!(p.parameter_in, ParameterIn::Path))
                .map(|p| p.name.clone())
                .collect();
            consumers.push((id, names));
        }
    }
    for item in doc.paths.paths.values_mut() {
        for op in super::operations_mut(item) {
            let Some((_, field)) = PRODUCERS
                .iter()
                .find(|(id, _)| op.operation_id.as_deref() == Some(id))
            else {
                continue;
            };
            let own: Vec<String> = op
                .parameters
                .iter()
                .flatten()
                .filter(|p| matches!(p.parameter_in, ParameterIn::Path))
                .map(|p| p.name.clone())
                .collect();
            let mut links = BTreeMap::new();
            for (consumer, names) in &consumers {
                if !names.iter().any(|n| n == field) {
                    continue;
                }
                let mut params = BTreeMap::new();
                let mut complete = true;
                for n in names {
                    let value = if n == field {
                        format!("$response.body#/{field}")
                    } else if own.contains(n) {
                        format!("$request.path.{n}")
                    } else {
                        complete = false;
                        break;
                    };
                    params.insert(n.clone(), value);
                }
                if !complete {
                    continue;
                }
                let mut link = utoipa::openapi::link::LinkBuilder::new()
                    .operation_id(consumer.clone())
                    .description(format!("The {field} this response returns"));
                for (n, v) in params {
                    link = link.parameter(n, v);
                }
                links.insert(consumer.clone(), link.build());
            }
            for (status, response) in op.responses.responses.iter_mut() {
                if !status.starts_with('2') {
                    continue;
                }
                if let RefOr::T(response) = response {
                    for (name, link) in &links {
                        response.links.insert(name.clone(), RefOr::T(link.clone()));
                    }
                }
            }
        }
    }
}

/// The document as served: JSON, with the link fields spelled as OpenAPI spells them
/// (`operationId`, `operationRef`, `requestBody`; utoipa 5.4 writes them in snake_case).
///
/// # Errors
/// When the document does not serialize.
pub fn render(doc: &OpenApi) -> serde_json::Result<String> {
    let mut v = serde_json::to_value(doc)?;
    if let Some(paths) = v.get_mut("paths").and_then(|p| p.as_object_mut()) {
        for op in paths
            .values_mut()
            .filter_map(|i| i.as_object_mut())
            .flat_map(|i| i.values_mut())
        {
            let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else {
                continue;
            };
            for links in responses
                .values_mut()
                .filter_map(|r| r.get_mut("links"))
                .filter_map(|l| l.as_object_mut())
            {
                for link in links.values_mut().filter_map(|l| l.as_object_mut()) {
                    for (from, to) in [
                        ("operation_id", "operationId"),
                        ("operation_ref", "operationRef"),
                        ("request_body", "requestBody"),
                    ] {
                        if let Some(x) = link.remove(from) {
                            link.insert(to.to_owned(), x);
                        }
                    }
                }
            }
        }
    }
    serde_json::to_string_pretty(&v)
}
