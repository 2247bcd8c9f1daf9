//! tenant_isolation — nothing of tenant B is readable, writable, cancellable, leasable or
//! decidable by tenant A, through any store call or any API route, and no answer reveals that
//! B's thing exists: A asking for B's id gets exactly what A gets for an id nobody has (same
//! status, same body but for the id itself), lists and searches show A nothing of B's, and
//! everything of B's is as it was afterwards (journal version, lease epoch, approval pending,
//! effect status, memory, keys, artifacts).
//!
//! Coverage is enumerated, not hand-picked: `api` walks every operation of the served
//! `/openapi.json` (a new route is tried automatically; a path parameter the test cannot fill
//! fails naming the route), and `store` reads the `Store` trait's methods from its source and
//! fails naming any method without a cross-tenant row.
//!
//! Guarded mechanism: the tenant scope filter (`tenant_id` first in every key and every
//! query's `WHERE`; the API acts only in the key's tenant). With it off, B's rows answer A:
//! the A-vs-nonexistent comparisons differ and B's state changes.

mod api;
mod store;

use super::harness::on_both;
use api::every_api_route_across_the_boundary;
use store::every_store_call_across_the_boundary;

on_both!(
    tokio every_api_route_across_the_boundary,
    tokio every_store_call_across_the_boundary,
);
