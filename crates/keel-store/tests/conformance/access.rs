//! What the HTTP API keeps: tenants, principals and API keys (hashes only, roles, system keys,
//! expiry, revocation), idempotency records (begin/finish/replay/mismatch/in flight, stale
//! takeover, expiry and cleanup, concurrent begins), who decided an approval, and the API's
//! paged lists (sessions by release, approvals per tenant, artifacts, memory, releases).

use std::sync::Arc;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use keel_core::*;
use keel_store::*;
use serde_json::json;

use super::harness::{Harness, session};

fn key(tenant: Option<TenantId>, name: &str, role: Role, hash: &str) -> NewApiKey {
    NewApiKey {
        tenant_id: tenant,
        principal_id: None,
        principal_name: name.into(),
        role,
        key_hash: hash.into(),
        prefix: hash.chars().take(8).collect(),
        expires_at: None,
    }
}

pub async fn tenants_are_created_listed_and_unique_by_name(h: &Harness) {
    let a = h.store.create_tenant("acme").await.unwrap();
    let b = h.store.create_tenant("  globex ").await.unwrap();
    assert_eq!(b.name, "globex", "names are trimmed");
    assert!(matches!(
        h.store.create_tenant("acme").await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        h.store.create_tenant("  ").await,
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(h.store.get_tenant(a.tenant_id).await.unwrap(), a);
    assert!(matches!(
        h.store.get_tenant(TenantId::new()).await,
        Err(StoreError::NotFound {
            entity: "tenant",
            ..
        })
    ));
    let all = h.store.list_tenants(None, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|t| t.tenant_id).collect::<Vec<_>>(),
        vec![a.tenant_id, b.tenant_id]
    );
    let page = h.store.list_tenants(Some(a.tenant_id), 1).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].tenant_id, b.tenant_id);
}

pub async fn api_keys_store_hashes_with_roles_scopes_expiry_and_revocation(h: &Harness) {
    let t = h.store.create_tenant("acme").await.unwrap().tenant_id;
    let other = h.store.create_tenant("globex").await.unwrap().tenant_id;
    let admin = h
        .store
        .create_api_key(&key(Some(t), "alice", Role::Admin, "sha256:aaaa"))
        .await
        .unwrap();
    assert_eq!(admin.tenant_id, Some(t));
    assert_eq!(admin.role, Role::Admin);
    assert_eq!(admin.principal_name, "alice");
    assert!(admin.is_usable(Utc::now()));
    let system = h
        .store
        .create_api_key(&key(None, "root", Role::System, "sha256:ssss"))
        .await
        .unwrap();
    assert_eq!(system.tenant_id, None);
    // A second key for the same principal.
    let mut second = key(Some(t), "ignored", Role::Viewer, "sha256:bbbb");
    second.principal_id = Some(admin.principal_id);
    let second = h.store.create_api_key(&second).await.unwrap();
    assert_eq!(second.principal_id, admin.principal_id);
    assert_eq!(
        second.role,
        Role::Admin,
        "the principal's role, not the request's"
    );
    // Refusals: role and tenant disagree, unknown tenant, another tenant's principal, dup hash.
    assert!(matches!(
        h.store
            .create_api_key(&key(Some(t), "x", Role::System, "sha256:c1"))
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        h.store
            .create_api_key(&key(None, "x", Role::Admin, "sha256:c2"))
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        h.store
            .create_api_key(&key(Some(TenantId::new()), "x", Role::Admin, "sha256:c3"))
            .await,
        Err(StoreError::NotFound {
            entity: "tenant",
            ..
        })
    ));
    let mut foreign = key(Some(other), "x", Role::Admin, "sha256:c4");
    foreign.principal_id = Some(admin.principal_id);
    assert!(matches!(
        h.store.create_api_key(&foreign).await,
        Err(StoreError::NotFound {
            entity: "principal",
            ..
        })
    ));
    assert!(matches!(
        h.store
            .create_api_key(&key(Some(t), "x", Role::Viewer, "sha256:aaaa"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    // Lookup by hash only.
    assert_eq!(
        h.store.api_key_by_hash("sha256:aaaa").await.unwrap(),
        Some(admin.clone())
    );
    assert_eq!(h.store.api_key_by_hash("sha256:none").await.unwrap(), None);
    // Scopes.
    let ids = |v: Vec<ApiKeyRecord>| v.into_iter().map(|k| k.key_id).collect::<Vec<_>>();
    assert_eq!(
        ids(h
            .store
            .list_api_keys(KeyScope::Tenant(t), None, 100)
            .await
            .unwrap()),
        vec![admin.key_id.clone(), second.key_id.clone()]
    );
    assert_eq!(
        ids(h
            .store
            .list_api_keys(KeyScope::System, None, 100)
            .await
            .unwrap()),
        vec![system.key_id.clone()]
    );
    assert_eq!(
        h.store
            .list_api_keys(KeyScope::All, None, 100)
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(
        h.store
            .list_api_keys(KeyScope::Tenant(other), None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ids(h
            .store
            .list_api_keys(KeyScope::Tenant(t), Some(&admin.key_id), 100)
            .await
            .unwrap()),
        vec![second.key_id.clone()]
    );
    // Revocation: scoped, idempotent, keeps its first time.
    assert!(matches!(
        h.store
            .revoke_api_key(KeyScope::Tenant(other), &admin.key_id, Utc::now())
            .await,
        Err(StoreError::NotFound { .. })
    ));
    let first = Utc::now();
    let revoked = h
        .store
        .revoke_api_key(KeyScope::Tenant(t), &admin.key_id, first)
        .await
        .unwrap();
    assert!(!revoked.is_usable(Utc::now()));
    let again = h
        .store
        .revoke_api_key(
            KeyScope::All,
            &admin.key_id,
            first + ChronoDuration::hours(1),
        )
        .await
        .unwrap();
    assert_eq!(again.revoked_at, revoked.revoked_at);
    // Expiry.
    let mut expiring = key(Some(t), "bob", Role::Viewer, "sha256:eeee");
    expiring.expires_at = Some(Utc::now() + ChronoDuration::minutes(5));
    let expiring = h.store.create_api_key(&expiring).await.unwrap();
    assert!(expiring.is_usable(Utc::now()));
    assert!(!expiring.is_usable(Utc::now() + ChronoDuration::minutes(6)));
}

fn idem(principal: PrincipalId, k: &str) -> IdempotencyKey {
    IdempotencyKey {
        scope: "tenant-a".into(),
        principal_id: principal,
        route: "POST /v1/sessions".into(),
        key: k.into(),
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);
const STALE: Duration = Duration::from_secs(300);

pub async fn idempotency_replays_refuses_other_bodies_and_reports_in_flight(h: &Harness) {
    let p = PrincipalId::new();
    let k = idem(p, "k1");
    let now = Utc::now();
    let s = &h.store;
    assert_eq!(
        s.idempotency_begin(&k, "h1", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    assert_eq!(
        s.idempotency_begin(&k, "h1", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::InFlight
    );
    assert_eq!(
        s.idempotency_begin(&k, "h2", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Mismatch
    );
    let resp = StoredResponse {
        status: 201,
        headers: vec![("etag".into(), "\"3\"".into())],
        body: "{\"ok\":true}".into(),
    };
    s.idempotency_finish(&k, "h1", &resp).await.unwrap();
    assert_eq!(
        s.idempotency_begin(&k, "h1", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Done(resp.clone())
    );
    assert_eq!(
        s.idempotency_begin(&k, "h2", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Mismatch
    );
    // Scoped: another principal, route or scope with the same key is a new record.
    assert_eq!(
        s.idempotency_begin(&idem(PrincipalId::new(), "k1"), "h2", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    let mut other_route = k.clone();
    other_route.route = "POST /v1/releases".into();
    assert_eq!(
        s.idempotency_begin(&other_route, "h2", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    let mut other_scope = k.clone();
    other_scope.scope = "tenant-b".into();
    assert_eq!(
        s.idempotency_begin(&other_scope, "h2", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    // Abandoned: the key may be used again.
    let k2 = idem(p, "k2");
    assert_eq!(
        s.idempotency_begin(&k2, "h1", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    s.idempotency_abandon(&k2, "h1").await.unwrap();
    assert_eq!(
        s.idempotency_begin(&k2, "h9", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    // Finishing a record that is not in flight under that hash is NotFound.
    assert!(matches!(
        s.idempotency_finish(&k2, "h1", &resp).await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn idempotency_records_expire_are_cleaned_up_and_stale_ones_taken_over(h: &Harness) {
    let p = PrincipalId::new();
    let s = &h.store;
    let now = Utc::now();
    let later = now + ChronoDuration::hours(25);
    let k = idem(p, "old");
    assert_eq!(
        s.idempotency_begin(&k, "h1", now, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    s.idempotency_finish(
        &k,
        "h1",
        &StoredResponse {
            status: 200,
            headers: vec![],
            body: String::new(),
        },
    )
    .await
    .unwrap();
    // Expired: a different body starts afresh.
    assert_eq!(
        s.idempotency_begin(&k, "h2", later, DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    // Cleanup removes every record expired at the instant given, and only those.
    let k3 = idem(p, "short");
    s.idempotency_begin(&k3, "h", now, Duration::from_secs(1), STALE)
        .await
        .unwrap();
    assert_eq!(
        s.idempotency_cleanup(now + ChronoDuration::seconds(2))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.idempotency_begin(&k3, "other", now + ChronoDuration::seconds(2), DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
    // A stale in-flight record (its process died) is taken over.
    let k4 = idem(p, "stale");
    s.idempotency_begin(&k4, "h", now, DAY, STALE)
        .await
        .unwrap();
    assert_eq!(
        s.idempotency_begin(&k4, "h", now + ChronoDuration::seconds(10), DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::InFlight
    );
    assert_eq!(
        s.idempotency_begin(&k4, "h", now + ChronoDuration::minutes(6), DAY, STALE)
            .await
            .unwrap(),
        IdempotencyBegin::Started
    );
}

pub async fn concurrent_idempotency_begins_start_exactly_once(h: &Harness) {
    let p = PrincipalId::new();
    let k = idem(p, "race");
    let now = Utc::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let store: Arc<dyn Store> = h.store.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            store
                .idempotency_begin(&k, "h", now, DAY, STALE)
                .await
                .unwrap()
        }));
    }
    let mut started = 0;
    for t in tasks {
        match t.await.unwrap() {
            IdempotencyBegin::Started => started += 1,
            IdempotencyBegin::InFlight => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(started, 1);
}

pub async fn approvals_record_who_decided_and_page_per_tenant(h: &Harness) {
    let t = TenantId::new();
    let f = session(&h.store, t).await;
    let g = session(&h.store, t).await;
    let mk = |s: SessionId, c: &str| {
        ApprovalRecord::request(
            s,
            TurnId::new(),
            ToolCallId::from(c),
            "shell",
            json!({"command": c}),
            Utc::now(),
            ChronoDuration::hours(1),
        )
    };
    let a1 = mk(f.session, "a");
    let a2 = mk(g.session, "b");
    let a3 = mk(f.session, "c");
    for a in [&a1, &a2, &a3] {
        h.store.create_approval(t, a).await.unwrap();
    }
    let who = PrincipalId::new();
    let d = h
        .store
        .decide_approval_as(
            t,
            a1.approval_id,
            ApprovalDecision::AllowOnce,
            &a1.args_hash,
            Utc::now(),
            Some(who),
        )
        .await
        .unwrap();
    let Decided::Now(rec) = d else {
        panic!("decided now")
    };
    assert_eq!(rec.decided_by, Some(who));
    assert_eq!(
        h.store
            .get_approval(t, a1.approval_id)
            .await
            .unwrap()
            .decided_by,
        Some(who)
    );
    // Without a principal (the CLI): none recorded.
    h.store
        .decide_approval(
            t,
            a3.approval_id,
            ApprovalDecision::AllowOnce,
            &a3.args_hash,
            Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!(
        h.store
            .get_approval(t, a3.approval_id)
            .await
            .unwrap()
            .decided_by,
        None
    );
    let ids = |v: Vec<ApprovalRecord>| v.into_iter().map(|a| a.approval_id).collect::<Vec<_>>();
    let pending = h
        .store
        .list_approvals_page(
            t,
            &ApprovalQuery {
                status: Some(ApprovalStatus::Pending),
                ..ApprovalQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(pending), vec![a2.approval_id]);
    let all = h
        .store
        .list_approvals_page(t, &ApprovalQuery::default())
        .await
        .unwrap();
    assert_eq!(
        ids(all),
        vec![a1.approval_id, a2.approval_id, a3.approval_id]
    );
    let page = h
        .store
        .list_approvals_page(
            t,
            &ApprovalQuery {
                after: Some(a1.approval_id),
                limit: Some(1),
                ..ApprovalQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(page), vec![a2.approval_id]);
    let of_f = h
        .store
        .list_approvals_page(
            t,
            &ApprovalQuery {
                session_id: Some(f.session),
                ..ApprovalQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(of_f), vec![a1.approval_id, a3.approval_id]);
    assert!(
        h.store
            .list_approvals_page(TenantId::new(), &ApprovalQuery::default())
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn api_lists_page_sessions_by_release_artifacts_memory_and_releases(h: &Harness) {
    let t = TenantId::new();
    // Sessions by release (the harness pins sha256:test).
    let f = session(&h.store, t).await;
    let other = SessionId::new();
    h.store
        .create_session(
            t,
            NewSession {
                session_id: other,
                release_id: ReleaseId::from("sha256:other"),
                parent_session_id: None,
                metadata: json!({}),
            },
        )
        .await
        .unwrap();
    let by_release = h
        .store
        .list_sessions(
            t,
            &SessionQuery {
                release_id: Some(ReleaseId::from("sha256:other")),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        by_release.iter().map(|s| s.session_id).collect::<Vec<_>>(),
        vec![other]
    );
    // Artifacts without their bytes, paged.
    let a = h
        .store
        .put_artifact(t, f.session, "one.txt", "text/plain", b"12345")
        .await
        .unwrap();
    let b = h
        .store
        .put_artifact(t, f.session, "two.txt", "text/plain", b"1")
        .await
        .unwrap();
    let arts = h
        .store
        .list_artifacts(t, f.session, None, 100)
        .await
        .unwrap();
    assert_eq!(
        arts.iter()
            .map(|x| (x.artifact_id.clone(), x.size))
            .collect::<Vec<_>>(),
        vec![(a.clone(), 5), (b.clone(), 1)]
    );
    let next = h
        .store
        .list_artifacts(t, f.session, Some(&a), 100)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].artifact_id, b);
    assert!(matches!(
        h.store
            .list_artifacts(TenantId::new(), f.session, None, 100)
            .await,
        Err(StoreError::NotFound {
            entity: "session",
            ..
        })
    ));
    // Memory in key order.
    for k in ["b", "a", "c"] {
        h.store.memory_put(t, "ns", k, &json!(k)).await.unwrap();
    }
    h.store
        .memory_put(t, "other", "z", &json!(1))
        .await
        .unwrap();
    let keys = |v: Vec<MemoryEntry>| v.into_iter().map(|m| m.key).collect::<Vec<_>>();
    assert_eq!(
        keys(h.store.memory_list(t, "ns", None, 100).await.unwrap()),
        vec!["a", "b", "c"]
    );
    assert_eq!(
        keys(h.store.memory_list(t, "ns", Some("a"), 1).await.unwrap()),
        vec!["b"]
    );
    assert!(
        h.store
            .memory_list(TenantId::new(), "ns", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    // Namespaces with their counts, byte-wise; another tenant's are not listed.
    h.store
        .memory_put(t, "ns/sub", "k", &json!(2))
        .await
        .unwrap();
    assert_eq!(
        h.store.memory_namespaces(t).await.unwrap(),
        vec![
            ("ns".to_owned(), 3),
            ("ns/sub".to_owned(), 1),
            ("other".to_owned(), 1)
        ]
    );
    assert!(
        h.store
            .memory_namespaces(TenantId::new())
            .await
            .unwrap()
            .is_empty()
    );
    // Releases in the order first stored; storing again keeps the first.
    let r = |name: &str| {
        Release::new(AgentDefinition {
            name: name.into(),
            model_route: vec!["script:x".into()],
            instructions: String::new(),
            tools: vec![],
            policy: serde_json::Value::Null,
            budget: Budget::default(),
            mcp_servers: Default::default(),
            agents: Default::default(),
        })
    };
    let (r1, r2) = (r("one"), r("two"));
    h.store.put_release(t, &r1).await.unwrap();
    // Ids are hashes: order comes from the time first stored (millisecond resolution).
    tokio::time::sleep(Duration::from_millis(3)).await;
    h.store.put_release(t, &r2).await.unwrap();
    h.store.put_release(t, &r1).await.unwrap();
    let rels = h.store.list_releases(t, None, 100).await.unwrap();
    assert_eq!(
        rels.iter()
            .map(|x| x.release.id.clone())
            .collect::<Vec<_>>(),
        vec![r1.id.clone(), r2.id.clone()]
    );
    let after = h.store.list_releases(t, Some(&r1.id), 100).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].release, r2);
    assert!(
        h.store
            .list_releases(TenantId::new(), None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn a_migrated_store_is_ready(h: &Harness) {
    h.store.ready().await.unwrap();
    h.raw("DELETE FROM keel_migrations WHERE version = (SELECT MAX(version) FROM keel_migrations)")
        .await;
    assert!(matches!(
        h.store.ready().await,
        Err(StoreError::MigrationMismatch { .. })
    ));
}

pub async fn a_workspace_is_one_tenants_with_the_directories_above_and_below_it(h: &Harness) {
    let (a, b) = (TenantId::new(), TenantId::new());
    h.store.claim_workspace(a, "/srv/work/a").await.unwrap();
    // Again, and below its own: fine.
    h.store.claim_workspace(a, "/srv/work/a").await.unwrap();
    h.store.claim_workspace(a, "/srv/work/a/sub").await.unwrap();
    for (path, relation) in [
        ("/srv/work/a", "in it"),
        ("/srv/work/a/", "in it"),
        ("/srv/work", "below it"),
        ("/srv/work/a/sub/deeper", "above it"),
    ] {
        match h.store.claim_workspace(b, path).await {
            Err(StoreError::Conflict(m)) => assert!(m.contains(relation), "{path}: {m}"),
            other => panic!("{path}: {other:?}"),
        }
    }
    // A sibling sharing a prefix is not below: /srv/work/ab is not under /srv/work/a.
    h.store.claim_workspace(b, "/srv/work/ab").await.unwrap();
    assert!(matches!(
        h.store.claim_workspace(b, "relative").await,
        Err(StoreError::InvalidInput(_))
    ));
    // Concurrent claims of nested paths by two tenants: exactly one wins.
    let (c, d) = (TenantId::new(), TenantId::new());
    let (x, y) = tokio::join!(
        h.store.claim_workspace(c, "/race/p"),
        h.store.claim_workspace(d, "/race/p/q")
    );
    assert!(x.is_ok() != y.is_ok(), "{x:?} {y:?}");
}
