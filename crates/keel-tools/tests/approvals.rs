use chrono::{Duration, SubsecRound, Utc};
use keel_core::ids::TurnId;
use keel_core::machine::ApprovalStatus;
use keel_core::{ApprovalDecision, args_hash};
use std::sync::Arc;

use keel_core::ids::TenantId;
use keel_store::{SqlStore, Store};
use keel_tools::approval::{ApprovalService, Resolution};
use keel_tools::error::ToolsError;
use keel_tools::policy::{PermissionMode, Policy, Verdict};
use keel_tools::registry::{Dispatch, ToolCallRequest, ValidatedCall};
use keel_tools::sandbox::SandboxMode;
use keel_tools::tool::ToolResultStatus;
use serde_json::json;

use crate::common::{Durable, Fixture};

fn fixture() -> Fixture {
    Fixture::with(SandboxMode::Off, Policy::new(PermissionMode::Default))
}

async fn ask(f: &Fixture, command: &str) -> (ValidatedCall, keel_tools::policy::Subject) {
    let request = ToolCallRequest {
        call_id: "call_7".into(),
        name: "shell".into(),
        arguments: json!({"command": command}),
    };
    match f.registry.dispatch(&request, &f.ctx).await {
        Dispatch::NeedsApproval {
            call,
            decision,
            subject,
        } => {
            assert_eq!(decision.verdict, Verdict::Ask);
            (call, subject)
        }
        Dispatch::Finished(r) => panic!("expected an ask, got {r:?}"),
    }
}

struct Pending {
    f: Fixture,
    db: Durable,
    call: ValidatedCall,
    subject: keel_tools::policy::Subject,
    service: ApprovalService,
    now: chrono::DateTime<Utc>,
    record: keel_core::ApprovalRecord,
}

/// A shell call that policy asks about, with its approval requested at `now` in a SQLite store.
async fn pending(command: &str, ttl: Duration) -> Pending {
    let f = fixture();
    let (call, subject) = ask(&f, command).await;
    let db = Durable::new().await;
    let service = db.service(ttl);
    let now = Utc::now().trunc_subsecs(3);
    let record = service
        .request(db.session, TurnId::new(), &call, now)
        .await
        .unwrap();
    Pending {
        f,
        db,
        call,
        subject,
        service,
        now,
        record,
    }
}

#[tokio::test]
async fn ask_creates_an_approval_bound_to_the_call_and_its_arguments() {
    let Pending {
        f,
        call: _,
        subject: _,
        service: _,
        now,
        record,
        db: _db,
    } = pending("touch made", Duration::hours(24)).await;
    assert_eq!(record.tool_call_id.0, "call_7");
    assert_eq!(
        record.args_hash,
        args_hash(&json!({"command": "touch made"}))
    );
    assert_eq!(record.status, ApprovalStatus::Pending);
    assert_eq!(record.expires_at, now + Duration::hours(24));
    assert!(!f.path("made").exists(), "nothing runs while pending");
}

#[tokio::test]
async fn allow_once_runs_the_call_and_deciding_twice_is_idempotent() {
    let Pending {
        f,
        call,
        subject,
        service,
        now,
        record,
        db: _db,
    } = pending("touch made", Duration::hours(24)).await;
    let hash = record.args_hash.clone();
    let first = service
        .decide(record.approval_id, ApprovalDecision::AllowOnce, &hash, now)
        .await
        .unwrap();
    let second = service
        .decide(record.approval_id, ApprovalDecision::AllowOnce, &hash, now)
        .await
        .unwrap();
    assert_eq!(first, second);
    let conflict = service
        .decide(
            record.approval_id,
            ApprovalDecision::Deny {
                reason: "no".into(),
            },
            &hash,
            now,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(conflict, ToolsError::ApprovalConflict { .. }),
        "{conflict}"
    );
    match service
        .resolve(record.approval_id, &call, &subject, now)
        .await
        .unwrap()
    {
        Resolution::Run { session_rules } => assert!(session_rules.is_empty()),
        other => panic!("{other:?}"),
    }
    let result = f.registry.execute(&call, &f.ctx).await;
    assert_eq!(
        result.status,
        ToolResultStatus::Succeeded,
        "{}",
        result.content
    );
    assert!(f.path("made").exists());
}

#[tokio::test]
async fn a_decision_for_other_arguments_is_rejected() {
    let Pending {
        f: _,
        call: _,
        subject: _,
        service,
        now,
        record,
        db: _db,
    } = pending("rm -rf build", Duration::hours(24)).await;
    let other = args_hash(&json!({"command": "rm -rf /"}));
    let err = service
        .decide(record.approval_id, ApprovalDecision::AllowOnce, &other, now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolsError::ApprovalArgsMismatch { .. }),
        "{err}"
    );
    assert_eq!(
        status(&service, record.approval_id).await,
        ApprovalStatus::Pending
    );
}

#[tokio::test]
async fn deny_gives_the_model_a_rejected_result_with_the_reason() {
    let Pending {
        f: _,
        call,
        subject,
        service,
        now,
        record,
        db: _db,
    } = pending("git push --force", Duration::hours(24)).await;
    let deny = ApprovalDecision::Deny {
        reason: "never force-push main".into(),
    };
    service
        .decide(record.approval_id, deny, &record.args_hash, now)
        .await
        .unwrap();
    match service
        .resolve(record.approval_id, &call, &subject, now)
        .await
        .unwrap()
    {
        Resolution::Rejected(r) => {
            assert_eq!(r.status, ToolResultStatus::Rejected);
            assert_eq!(r.call_id, "call_7");
            assert!(r.content.contains("never force-push main"), "{}", r.content);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_expired_approval_rejects_the_call_saying_it_expired() {
    let Pending {
        f,
        call,
        subject,
        service,
        now,
        record,
        db: _db,
    } = pending("touch late", Duration::minutes(5)).await;
    match service
        .resolve(
            record.approval_id,
            &call,
            &subject,
            now + Duration::minutes(1),
        )
        .await
        .unwrap()
    {
        Resolution::Pending { expires_at } => assert_eq!(expires_at, now + Duration::minutes(5)),
        other => panic!("{other:?}"),
    }
    let later = now + Duration::minutes(6);
    let err = service
        .decide(
            record.approval_id,
            ApprovalDecision::AllowOnce,
            &record.args_hash,
            later,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ToolsError::ApprovalExpired { .. }), "{err}");
    match service
        .resolve(record.approval_id, &call, &subject, later)
        .await
        .unwrap()
    {
        Resolution::Rejected(r) => {
            assert_eq!(r.status, ToolResultStatus::Rejected);
            assert!(r.content.contains("expired"), "{}", r.content);
        }
        other => panic!("{other:?}"),
    }
    assert!(!f.path("late").exists());
}

#[tokio::test]
async fn expiry_is_noticed_on_resolve_even_without_a_decision() {
    let Pending {
        call,
        subject,
        service,
        now,
        record,
        // Keep the database (a temp dir) alive for the whole test.
        db: _db,
        f: _f,
    } = pending("touch x", Duration::seconds(1)).await;
    let r = service
        .resolve(
            record.approval_id,
            &call,
            &subject,
            now + Duration::seconds(2),
        )
        .await
        .unwrap();
    assert!(
        matches!(r, Resolution::Rejected(ref res) if res.content.contains("expired")),
        "{r:?}"
    );
    assert_eq!(
        status(&service, record.approval_id).await,
        ApprovalStatus::Expired
    );
}

#[tokio::test]
async fn allow_for_session_adds_rules_so_the_same_call_runs_without_asking() {
    let Pending {
        mut f,
        call,
        subject,
        service,
        now,
        record,
        db: _db,
    } = pending("cargo fmt && cargo check", Duration::hours(24)).await;
    service
        .decide(
            record.approval_id,
            ApprovalDecision::AllowForSession,
            &record.args_hash,
            now,
        )
        .await
        .unwrap();
    let Resolution::Run { session_rules } = service
        .resolve(record.approval_id, &call, &subject, now)
        .await
        .unwrap()
    else {
        panic!("expected run");
    };
    assert_eq!(session_rules.len(), 2);
    let mut policy = f.ctx.snapshot.policy.clone();
    policy.rules.extend(session_rules);
    let (decision, _) = f.registry.authorize(&call, &f.ctx.workspace, &policy);
    assert_eq!(decision.verdict, Verdict::Allow, "{}", decision.reason);
    std::sync::Arc::make_mut(&mut f.ctx.snapshot).policy = policy;
    let other = ToolCallRequest {
        call_id: "c2".into(),
        name: "shell".into(),
        arguments: json!({"command": "cargo publish"}),
    };
    assert!(matches!(
        f.registry.dispatch(&other, &f.ctx).await,
        Dispatch::NeedsApproval { .. }
    ));
}

#[tokio::test]
async fn unknown_approval_is_an_error() {
    let db = Durable::new().await;
    let service = db.service(Duration::hours(24));
    let err = service
        .decide(
            keel_core::ids::ApprovalId::new(),
            ApprovalDecision::AllowOnce,
            "sha256:x",
            Utc::now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ToolsError::ApprovalNotFound { .. }), "{err}");
}

async fn status(service: &ApprovalService, id: keel_core::ids::ApprovalId) -> ApprovalStatus {
    service.get(id).await.unwrap().status
}

#[tokio::test]
async fn a_pending_approval_survives_a_restart_and_another_worker_decides_it() {
    let Pending {
        f,
        db,
        call,
        subject,
        service,
        now,
        record,
    } = pending("touch after-restart", Duration::hours(24)).await;
    drop(service);
    // A fresh process opens the same database file.
    let reopened: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&db.path).await.unwrap());
    let other = ApprovalService::new(reopened, db.tenant);
    assert_eq!(other.get(record.approval_id).await.unwrap(), record);
    other
        .decide(
            record.approval_id,
            ApprovalDecision::AllowOnce,
            &record.args_hash,
            now,
        )
        .await
        .unwrap();
    assert!(matches!(
        other
            .resolve(record.approval_id, &call, &subject, now)
            .await
            .unwrap(),
        Resolution::Run { .. }
    ));
    let result = f.registry.execute(&call, &f.ctx).await;
    assert_eq!(
        result.status,
        ToolResultStatus::Succeeded,
        "{}",
        result.content
    );
    // Another tenant cannot see it.
    let stranger = ApprovalService::new(Arc::clone(&db.store), TenantId::new());
    assert!(matches!(
        stranger.get(record.approval_id).await,
        Err(ToolsError::ApprovalNotFound { .. })
    ));
}
