use chrono::{Duration, Utc};
use keel_core::ids::{SessionId, TurnId};
use keel_core::machine::ApprovalStatus;
use keel_core::{ApprovalDecision, args_hash};
use keel_tools::approval::{ApprovalService, MemoryApprovalStore, Resolution};
use keel_tools::error::ToolsError;
use keel_tools::policy::{PermissionMode, Policy, Verdict};
use keel_tools::registry::{Dispatch, ToolCallRequest, ValidatedCall};
use keel_tools::sandbox::SandboxMode;
use keel_tools::tool::ToolResultStatus;
use serde_json::json;

use crate::common::Fixture;

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
    call: ValidatedCall,
    subject: keel_tools::policy::Subject,
    service: ApprovalService<MemoryApprovalStore>,
    now: chrono::DateTime<Utc>,
    record: keel_core::ApprovalRecord,
}

/// A shell call that policy asks about, with its approval requested at `now`.
async fn pending(command: &str, ttl: Duration) -> Pending {
    let f = fixture();
    let (call, subject) = ask(&f, command).await;
    let service = ApprovalService::new(MemoryApprovalStore::default()).with_ttl(ttl);
    let now = Utc::now();
    let record = service
        .request(SessionId::new(), TurnId::new(), &call, now)
        .await
        .unwrap();
    Pending {
        f,
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
    let f = fixture();
    let (call, subject) = ask(&f, "touch late").await;
    let service =
        ApprovalService::new(MemoryApprovalStore::default()).with_ttl(Duration::minutes(5));
    let now = Utc::now();
    let record = service
        .request(SessionId::new(), TurnId::new(), &call, now)
        .await
        .unwrap();
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
    let f = fixture();
    let (call, subject) = ask(&f, "touch x").await;
    let service =
        ApprovalService::new(MemoryApprovalStore::default()).with_ttl(Duration::seconds(1));
    let now = Utc::now();
    let record = service
        .request(SessionId::new(), TurnId::new(), &call, now)
        .await
        .unwrap();
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
    let service = ApprovalService::new(MemoryApprovalStore::default());
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

async fn status(
    service: &ApprovalService<MemoryApprovalStore>,
    id: keel_core::ids::ApprovalId,
) -> ApprovalStatus {
    use keel_tools::approval::ApprovalStore;
    service.store().get_approval(id).await.unwrap().status
}
