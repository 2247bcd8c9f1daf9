//! Every method of the `Store` trait tried by tenant A on tenant B's ids: each answers A as
//! it answers an id nobody has (the same result or error, ids aside); calls without ids show
//! A nothing of B's; B's rows are unchanged afterwards. The method list is read from the
//! trait's source, so a new method without a row here fails the test, named.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, Correlation, EffectStatus, Event, EventBody,
    OperationKey, ReleaseId, SessionId, TenantId, ToolCallId, TurnId,
};
use keel_store::{
    AppendExtras, ApprovalQuery, EffectRecord, EffectUpdate, IdempotencyBegin, IdempotencyKey,
    KeyScope, Lease, NewApiKey, NewSession, Role, SealedKind, SessionQuery, Store, StoreError,
    StoredResponse, TranscriptItem, UsageReservation,
};
use serde_json::json;

use crate::release_validation::harness::{Backend, FreshStore, release};

/// The `Store` trait's source: its method names are the rows this test must have.
const STORE_SOURCE: &str = include_str!("../../../../keel-store/src/store.rs");

/// Methods with no tenant to cross, and why: system-wide reads and writes the scheduler, the
/// API's authentication and the tenant administration make, each naming the tenant of every
/// row it returns (tried below where they take a scope).
const UNSCOPED: &[(&str, &str)] = &[
    ("backend", "the backend's name"),
    ("commits", "this handle's commit counters"),
    ("ready", "a health probe"),
    (
        "due_sessions",
        "the scheduler's scan; names each row's tenant",
    ),
    (
        "runnable_tenants",
        "the scheduler's scan; names each row's tenant",
    ),
    ("wait_for_work", "a wake-up, no data"),
    ("queue_depths", "metrics per tenant id"),
    ("session_counts", "metrics, counts only"),
    ("newer_schema_sessions", "metrics, a count only"),
    ("create_tenant", "system administration"),
    (
        "get_tenant",
        "system administration (the API refuses tenant keys: 403)",
    ),
    ("list_tenants", "system administration"),
    (
        "create_api_key",
        "administration; tried: a key of B's principal for A is refused",
    ),
    ("api_key_by_hash", "authentication by the key's secret hash"),
    (
        "idempotency_begin",
        "keyed by the API's scope (tenant id); tried below",
    ),
    ("idempotency_finish", "keyed by the API's scope (tenant id)"),
    (
        "idempotency_abandon",
        "keyed by the API's scope (tenant id)",
    ),
    ("idempotency_cleanup", "expiry of every scope's records"),
];

/// The `Store` trait's method names, from its source.
fn trait_methods() -> BTreeSet<String> {
    let start = STORE_SOURCE
        .find("pub trait Store")
        .expect("the Store trait");
    let body = &STORE_SOURCE[start..];
    let end = body.find("\n}\n").expect("the trait's end");
    body[..end]
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix("async fn ")
                .or_else(|| l.strip_prefix("fn "))?;
            Some(rest.split(['(', '<']).next()?.to_owned())
        })
        .collect()
}

/// A result as text, ids of `ids` replaced by `<id>` (so B's and nobody's compare).
fn shown<T: Debug>(r: &Result<T, StoreError>, ids: &[String]) -> String {
    let mut t = match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => format!("err {e}"),
    };
    let mut ids: Vec<&String> = ids.iter().collect();
    ids.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for id in ids {
        t = t.replace(id.as_str(), "<id>");
    }
    t
}

/// What a tenant owns, by id.
#[derive(Clone)]
struct Owned {
    session: SessionId,
    lease: Lease,
    approval: keel_core::ApprovalId,
    /// The turn the approval belongs to.
    turn: TurnId,
    args_hash: String,
    effect: OperationKey,
    artifact: String,
    release: ReleaseId,
    intent: String,
    key_id: String,
    /// A memory namespace and key.
    ns: String,
    key: String,
}

impl Owned {
    fn ids(&self) -> Vec<String> {
        vec![
            self.session.to_string(),
            self.approval.to_string(),
            self.turn.to_string(),
            self.effect.to_string(),
            self.artifact.clone(),
            self.release.to_string(),
            self.intent.clone(),
            self.key_id.clone(),
            self.lease.owner.clone(),
            self.ns.clone(),
            self.key.clone(),
        ]
    }
}

fn event(session: SessionId, seq: u64, body: EventBody) -> Event {
    Event::new(session, seq, Utc::now(), Correlation::default(), body)
}

/// B's rows: a session (created, leased, two events, a transcript item, an approval, an
/// effect, an intent, an artifact), a release, a memory entry, a key, a token window and an
/// idempotency record.
async fn b_rows(store: &dyn Store, b: TenantId) -> Owned {
    let session = SessionId::new();
    let rel = release("b-release", &[]);
    store.put_release(b, &rel).await.unwrap();
    store
        .create_session(
            b,
            NewSession {
                session_id: session,
                release_id: rel.id.clone(),
                parent_session_id: None,
                metadata: json!({"workspace": "/srv/b"}),
            },
        )
        .await
        .unwrap();
    let lease = store
        .acquire_lease(b, session, "worker-b", Duration::from_secs(300))
        .await
        .unwrap();
    let created = event(
        session,
        1,
        EventBody::SessionCreated {
            tenant_id: b,
            release_id: rel.id.clone(),
            config: json!({}),
        },
    );
    let queued = Event::new(
        session,
        2,
        Utc::now(),
        Correlation::turn(TurnId::new()),
        EventBody::TurnQueued {
            input: "b-secret-input".into(),
            compiled: None,
        },
    );
    store
        .append(b, session, 0, lease.epoch, &[created, queued])
        .await
        .unwrap();
    store
        .append_transcript(
            b,
            session,
            &[TranscriptItem {
                index: 0,
                turn_id: None,
                role: "user".into(),
                content: json!("b-secret-input"),
            }],
        )
        .await
        .unwrap();
    let approval = ApprovalRecord::request(
        session,
        TurnId::new(),
        ToolCallId::from("call_b"),
        "shell",
        json!({"command": "b"}),
        Utc::now(),
        ChronoDuration::hours(1),
    );
    store.create_approval(b, &approval).await.unwrap();
    let effect = OperationKey::from(format!("{session}/step_b/call_b").as_str());
    store
        .insert_effect(
            b,
            &EffectRecord {
                operation_key: effect.clone(),
                session_id: session,
                tool_call_id: ToolCallId::from("call_b"),
                tool_name: "shell".into(),
                status: EffectStatus::Prepared,
                request_hash: "sha256:b".into(),
                attempts: 0,
                outcome: None,
                error: None,
                created_at: Utc::now(),
                updated_at: Utc::now(),
            },
        )
        .await
        .unwrap();
    let intent = store
        .post_intent(b, session, "cancel_turn", &json!({}))
        .await
        .unwrap();
    let artifact = store
        .put_artifact(b, session, "b.txt", "text/plain", b"b-secret-bytes")
        .await
        .unwrap();
    store
        .memory_put(b, "bns", "bkey", &json!("b-secret-memory"))
        .await
        .unwrap();
    let key = store
        .create_api_key(&NewApiKey {
            tenant_id: Some(b),
            principal_id: None,
            principal_name: "bob".into(),
            role: Role::Admin,
            key_hash: "sha256:b-key".into(),
            prefix: "keel_b".into(),
            expires_at: None,
        })
        .await
        .unwrap();
    Owned {
        session,
        lease,
        approval: approval.approval_id,
        turn: approval.turn_id,
        args_hash: approval.args_hash.clone(),
        effect,
        artifact,
        release: rel.id.clone(),
        intent: intent.intent_id,
        key_id: key.key_id,
        ns: "bns".into(),
        key: "bkey".into(),
    }
}

/// Ids of the same shapes that nobody has.
fn nobody(b: &Owned) -> Owned {
    let session = SessionId::new();
    Owned {
        session,
        lease: Lease {
            session_id: session,
            ..b.lease.clone()
        },
        approval: keel_core::ApprovalId::new(),
        turn: TurnId::new(),
        args_hash: b.args_hash.clone(),
        effect: OperationKey::from(format!("{session}/step_b/call_b").as_str()),
        artifact: uuid::Uuid::now_v7().to_string(),
        release: ReleaseId::from(format!("sha256:{}", "0".repeat(64)).as_str()),
        intent: uuid::Uuid::now_v7().to_string(),
        key_id: uuid::Uuid::now_v7().to_string(),
        ns: "nobody-ns".into(),
        key: "nobody-key".into(),
    }
}

pub(super) async fn every_store_call_across_the_boundary(backend: Backend) {
    let fresh = FreshStore::new(backend);
    let store = fresh.open().await;
    let store = store.as_ref();
    let b = store.create_tenant("b-corp").await.unwrap().tenant_id;
    let a = store.create_tenant("a-corp").await.unwrap().tenant_id;
    let mine = b_rows(store, b).await;
    let other = nobody(&mine);
    let all_ids: Vec<String> = [mine.ids(), other.ids(), vec![b.to_string()]].concat();
    let b_version = store.get_session(b, mine.session).await.unwrap().version;
    let mut rows: BTreeMap<&str, &str> = BTreeMap::new();

    // A on B's ids and on nobody's: the same answer.
    macro_rules! same {
        ($name:literal, |$o:ident| $call:expr) => {{
            let cross = {
                let $o = &mine;
                shown(&$call.await, &all_ids)
            };
            let none = {
                let $o = &other;
                shown(&$call.await, &all_ids)
            };
            assert_eq!(
                cross, none,
                "{}: B's ids answer A differently from ids nobody has",
                $name
            );
            assert!(!cross.contains("b-secret"), "{}: {cross}", $name);
            rows.insert($name, "as for a nonexistent id");
        }};
    }
    // A's calls without ids: nothing of B's in the answer.
    macro_rules! blind {
        ($name:literal, $call:expr) => {{
            let seen = format!("{:?}", $call.await);
            for id in mine.ids().iter().chain([&b.to_string()]) {
                assert!(
                    !seen.contains(id.as_str()),
                    "{}: shows B's {id}: {seen}",
                    $name
                );
            }
            assert!(!seen.contains("b-secret"), "{}: {seen}", $name);
            rows.insert($name, "shows nothing of B's");
        }};
    }

    same!("get_session", |o| store.get_session(a, o.session));
    same!("read", |o| store.read(a, o.session, 1, None));
    same!("wait_for_version", |o| store.wait_for_version(
        a,
        o.session,
        0,
        Duration::from_millis(10)
    ));
    same!("set_wake_at", |o| store.set_wake_at(
        a,
        o.session,
        Some(Utc::now())
    ));
    same!("append", |o| store.append(
        a,
        o.session,
        2,
        o.lease.epoch,
        &[event(
            o.session,
            3,
            EventBody::TurnQueued {
                input: "a".into(),
                compiled: None
            }
        )]
    ));
    same!("append_with", |o| store.append_with(
        a,
        o.session,
        2,
        o.lease.epoch,
        &[event(
            o.session,
            3,
            EventBody::TurnQueued {
                input: "a".into(),
                compiled: None
            }
        )],
        &AppendExtras::default()
    ));
    same!("acquire_lease", |o| store.acquire_lease(
        a,
        o.session,
        "worker-a",
        Duration::from_secs(5)
    ));
    same!("take_over_lease", |o| store.take_over_lease(
        a,
        o.session,
        &o.lease.owner,
        o.lease.epoch,
        "worker-a",
        Duration::from_secs(5)
    ));
    same!("renew_lease", |o| store.renew_lease(
        a,
        &o.lease,
        Duration::from_secs(5)
    ));
    same!("renew_leases", |o| store.renew_leases(
        a,
        std::slice::from_ref(&o.lease),
        Duration::from_secs(5)
    ));
    same!("release_lease", |o| store.release_lease(a, &o.lease));
    same!("release_claim", |o| store
        .release_claim(a, &o.lease, None, None));
    same!("post_intent", |o| store.post_intent(
        a,
        o.session,
        "cancel_turn",
        &json!({})
    ));
    same!("wait_for_intent", |o| store.wait_for_intent(
        a,
        o.session,
        Duration::from_millis(10)
    ));
    same!("list_intents", |o| store.list_intents(a, o.session));
    same!("delete_intent", |o| store
        .delete_intent(a, o.session, &o.intent));
    same!("delete_session", |o| store.delete_session(a, o.session));
    same!("update_effect", |o| store.update_effect(
        a,
        &o.effect,
        EffectUpdate {
            from: EffectStatus::Prepared,
            to: EffectStatus::Dispatched,
            outcome: None,
            error: None,
        }
    ));
    same!("get_effect", |o| store.get_effect(a, &o.effect));
    same!("list_effects", |o| store.list_effects(a, o.session, None));
    same!("get_approval", |o| store.get_approval(a, o.approval));
    same!("decide_approval", |o| store.decide_approval(
        a,
        o.approval,
        ApprovalDecision::AllowOnce,
        &o.args_hash,
        Utc::now()
    ));
    same!("decide_approval_as", |o| store.decide_approval_as(
        a,
        o.approval,
        ApprovalDecision::AllowOnce,
        &o.args_hash,
        Utc::now(),
        None
    ));
    same!("expire_approval", |o| store.expire_approval(
        a,
        o.approval,
        Utc::now() + ChronoDuration::hours(2)
    ));
    same!("withdraw_turn_approvals", |o| store
        .withdraw_turn_approvals(a, o.session, o.turn, Utc::now()));
    same!("list_approvals", |o| store
        .list_approvals(a, o.session, None));
    same!("list_approvals_page", |o| store.list_approvals_page(
        a,
        &ApprovalQuery {
            session_id: Some(o.session),
            ..ApprovalQuery::default()
        }
    ));
    same!("append_transcript", |o| store.append_transcript(
        a,
        o.session,
        &[TranscriptItem {
            index: 1,
            turn_id: None,
            role: "user".into(),
            content: json!("a"),
        }]
    ));
    same!("read_transcript", |o| store
        .read_transcript(a, o.session, 0));
    same!("sealed_rows", |o| store.sealed_rows(
        a,
        o.session,
        SealedKind::Arguments
    ));
    same!("put_artifact", |o| store.put_artifact(
        a,
        o.session,
        "a.txt",
        "text/plain",
        b"a"
    ));
    same!("get_artifact", |o| store.get_artifact(a, &o.artifact));
    same!("list_artifacts", |o| store
        .list_artifacts(a, o.session, None, 10));
    same!("get_release", |o| store.get_release(a, &o.release));
    same!("get_release_record", |o| store
        .get_release_record(a, &o.release));
    same!("reserve_usage", |o| store.reserve_usage(
        a,
        &UsageReservation {
            session_id: o.session,
            lease_epoch: o.lease.epoch,
            day: Utc::now().format("%Y-%m-%d").to_string(),
            tokens: 10,
            cost_usd: 0.0,
            max_tokens: Some(100),
            max_cost_usd: None,
        }
    ));
    same!("revoke_api_key", |o| store.revoke_api_key(
        KeyScope::Tenant(a),
        &o.key_id,
        Utc::now()
    ));
    same!("memory_get", |o| store.memory_get(a, &o.ns, &o.key));
    same!("memory_delete", |o| store.memory_delete(a, &o.ns, &o.key));
    same!("memory_list", |o| store.memory_list(a, &o.ns, None, 10));

    // Creations under B's ids (ids the runtime makes, UUIDv7 and keys derived from them,
    // never chosen by a caller) are refused, and write nothing of A's into B's rows.
    macro_rules! refused {
        ($name:literal, $call:expr) => {{
            let r = $call.await;
            assert!(r.is_err(), "{}: A created under B's id: {r:?}", $name);
            assert!(!format!("{r:?}").contains("b-secret"), "{}: {r:?}", $name);
            rows.insert($name, "refused");
        }};
    }
    let o = &mine;
    refused!(
        "create_session",
        store.create_session(
            a,
            NewSession {
                session_id: o.session,
                release_id: o.release.clone(),
                parent_session_id: None,
                metadata: json!({}),
            }
        )
    );
    refused!(
        "create_session_leased",
        store.create_session_leased(
            a,
            NewSession {
                session_id: o.session,
                release_id: o.release.clone(),
                parent_session_id: None,
                metadata: json!({}),
            },
            "worker-a",
            std::time::Duration::from_secs(60),
        )
    );
    refused!(
        "insert_effect",
        store.insert_effect(
            a,
            &EffectRecord {
                operation_key: o.effect.clone(),
                session_id: o.session,
                tool_call_id: ToolCallId::from("call_b"),
                tool_name: "shell".into(),
                status: EffectStatus::Prepared,
                request_hash: "sha256:a".into(),
                attempts: 0,
                outcome: None,
                error: None,
                created_at: Utc::now(),
                updated_at: Utc::now(),
            }
        )
    );
    refused!(
        "create_approval",
        store.create_approval(
            a,
            &ApprovalRecord {
                approval_id: o.approval,
                ..ApprovalRecord::request(
                    o.session,
                    TurnId::new(),
                    ToolCallId::from("call_b"),
                    "shell",
                    json!({"command": "b"}),
                    Utc::now(),
                    ChronoDuration::hours(1),
                )
            }
        )
    );

    blind!(
        "list_sessions",
        store.list_sessions(a, &SessionQuery::default())
    );
    blind!("queue_depth", store.queue_depth(a));
    blind!(
        "claim_session",
        store.claim_session(
            a,
            "worker-a",
            Duration::from_secs(5),
            Utc::now(),
            u32::MAX,
            0
        )
    );
    blind!(
        "claim_sessions",
        store.claim_sessions(
            a,
            "worker-a",
            Duration::from_secs(5),
            Utc::now(),
            u32::MAX,
            0,
            100
        )
    );
    blind!(
        "memory_search",
        store.memory_search(a, None, "b-secret-memory", 10)
    );
    blind!("memory_namespaces", store.memory_namespaces(a));
    blind!(
        "memory_put",
        store.memory_put(a, "ans", "own", &json!("a's own"))
    );
    blind!("usage", store.usage(a, "2000-01-01", "2100-01-01"));
    blind!(
        "usage_reservations",
        store.usage_reservations(a, &Utc::now().format("%Y-%m-%d").to_string())
    );
    blind!("list_releases", store.list_releases(a, None, 100));
    blind!(
        "put_release",
        store.put_release(a, &release("a-release", &[]))
    );
    blind!(
        "list_api_keys",
        store.list_api_keys(KeyScope::Tenant(a), None, 100)
    );
    blind!("settle_tokens", store.settle_tokens(a, 0, 0));
    // B filled the minute's window to its limit; A's window is its own.
    store.reserve_tokens(b, 60_000, 100, 100).await.unwrap();
    let window = store.reserve_tokens(a, 60_000, 100, 100).await.unwrap();
    assert!(window.admitted && window.used == 100, "{window:?}");
    rows.insert("reserve_tokens", "A's window is its own");
    // A workspace another tenant holds is refused without naming the tenant (it is a server
    // path, not an id of B's; a claim cannot be shared).
    store.claim_workspace(b, "/srv/b").await.unwrap();
    let claim = store.claim_workspace(a, "/srv/b").await;
    assert!(
        matches!(&claim, Err(StoreError::Conflict(m)) if !m.contains(&b.to_string()) && !m.contains("b-corp")),
        "{claim:?}"
    );
    rows.insert("claim_workspace", "refused, naming no tenant");
    // An API key for B's principal in A's tenant is refused.
    let b_principal = store
        .list_api_keys(KeyScope::Tenant(b), None, 10)
        .await
        .unwrap()[0]
        .principal_id;
    let foreign = store
        .create_api_key(&NewApiKey {
            tenant_id: Some(a),
            principal_id: Some(b_principal),
            principal_name: "mallory".into(),
            role: Role::Admin,
            key_hash: "sha256:a-key".into(),
            prefix: "keel_a".into(),
            expires_at: None,
        })
        .await;
    assert!(foreign.is_err(), "{foreign:?}");
    // An idempotency key of B's scope is not A's: the same client key starts afresh for A.
    let idem = |scope: TenantId| IdempotencyKey {
        scope: scope.to_string(),
        principal_id: b_principal,
        route: "POST /v1/sessions/x/turns".into(),
        key: "same-client-key".into(),
    };
    let ttl = Duration::from_secs(3600);
    let began = store
        .idempotency_begin(&idem(b), "sha256:req", Utc::now(), ttl, ttl)
        .await
        .unwrap();
    assert_eq!(began, IdempotencyBegin::Started);
    store
        .idempotency_finish(
            &idem(b),
            "sha256:req",
            &StoredResponse {
                status: 202,
                headers: Vec::new(),
                body: "b-secret-response".into(),
            },
        )
        .await
        .unwrap();
    let began = store
        .idempotency_begin(&idem(a), "sha256:req", Utc::now(), ttl, ttl)
        .await
        .unwrap();
    assert_eq!(began, IdempotencyBegin::Started, "A got B's stored answer");

    // Every method has a row.
    let unscoped: BTreeSet<&str> = UNSCOPED.iter().map(|(m, _)| *m).collect();
    let missing: Vec<String> = trait_methods()
        .into_iter()
        .filter(|m| !rows.contains_key(m.as_str()) && !unscoped.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "Store methods never tried across tenants (add a row): {missing:?}"
    );

    // B's rows are as they were; B can still claim its session (it was claimable).
    let rec = store.get_session(b, mine.session).await.unwrap();
    assert_eq!(rec.version, b_version);
    assert_eq!(rec.lease_epoch, mine.lease.epoch);
    assert_eq!(rec.lease.map(|l| l.owner).as_deref(), Some("worker-b"));
    assert_eq!(store.read(b, mine.session, 1, None).await.unwrap().len(), 2);
    assert_eq!(
        store.get_approval(b, mine.approval).await.unwrap().status,
        ApprovalStatus::Pending
    );
    assert_eq!(
        store.get_effect(b, &mine.effect).await.unwrap().status,
        EffectStatus::Prepared
    );
    assert_eq!(store.list_intents(b, mine.session).await.unwrap().len(), 1);
    assert_eq!(
        store
            .memory_get(b, "bns", "bkey")
            .await
            .unwrap()
            .map(|m| m.value),
        Some(json!("b-secret-memory"))
    );
    assert_eq!(
        store.get_artifact(b, &mine.artifact).await.unwrap().data,
        b"b-secret-bytes"
    );
    assert_eq!(
        store
            .read_transcript(b, mine.session, 0)
            .await
            .unwrap()
            .len(),
        1
    );
    let keys = store
        .list_api_keys(KeyScope::Tenant(b), None, 10)
        .await
        .unwrap();
    assert!(keys.iter().all(|k| k.revoked_at.is_none()), "{keys:?}");
}
