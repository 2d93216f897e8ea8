//! The store's transitions: once each, under races, across a crash, and the outbox.

use super::*;
use crate::approvals::model::{HeldRequest, Observed};

fn approval(id: &str, now: i64) -> Approval {
    Approval {
        id: id.to_owned(),
        status: Status::Pending,
        created_ms: now,
        deadline_ms: now + 10_000,
        renotify_ms: now + 1_000,
        rounds: 1,
        session: "ses_1".into(),
        agent: "bot".into(),
        tenant: "default".into(),
        request_id: "r1".into(),
        policies: vec!["irreversible-needs-human".into()],
        policy_generation: 3,
        request: HeldRequest {
            method: "POST".into(),
            url: "https://pay.test/refund".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{\"ids\":[1,2]}".to_vec(),
            body_digest: "d".into(),
        },
        observed: Observed {
            host: "pay.test".into(),
            port: 443,
            ..Default::default()
        },
        approver: None,
        channel: None,
        decided_ms: None,
        reason: None,
        attempts: 0,
        result: None,
    }
}

fn store() -> (tempfile::TempDir, ApprovalStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = ApprovalStore::open(&dir.path().join("db")).unwrap();
    (dir, s)
}

#[test]
fn roundtrip_and_decide_once() {
    let (_d, s) = store();
    let a = approval("apr_1", 1000);
    s.insert(&a).unwrap();
    assert_eq!(s.get("apr_1").unwrap().unwrap(), a);
    let decided = s
        .decide(
            "apr_1",
            Verdict::Approve,
            "alice",
            Channel::Api,
            None,
            None,
            2000,
        )
        .unwrap();
    assert_eq!(decided.status, Status::Approved);
    assert_eq!(decided.approver.as_deref(), Some("alice"));
    let again = s.decide(
        "apr_1",
        Verdict::Deny,
        "bob",
        Channel::Api,
        None,
        None,
        2001,
    );
    assert!(matches!(
        again,
        Err(DecideError::NotPending(Status::Approved))
    ));
}

#[test]
fn a_link_nonce_decides_once_and_a_refusal_does_not_burn_it() {
    let (_d, s) = store();
    s.insert(&approval("apr_1", 0)).unwrap();
    s.insert(&approval("apr_2", 0)).unwrap();
    s.decide(
        "apr_1",
        Verdict::Deny,
        "a",
        Channel::Page,
        None,
        Some("n1"),
        1,
    )
    .unwrap();
    // The same nonce on another approval (it cannot happen with a valid MAC, but the
    // table is the last line): refused.
    let reused = s.decide(
        "apr_2",
        Verdict::Approve,
        "a",
        Channel::Page,
        None,
        Some("n1"),
        2,
    );
    assert!(matches!(reused, Err(DecideError::LinkUsed)));
    // A link for a decided approval is refused without being consumed.
    let late = s.decide(
        "apr_1",
        Verdict::Approve,
        "a",
        Channel::Page,
        None,
        Some("n2"),
        3,
    );
    assert!(matches!(late, Err(DecideError::NotPending(_))));
    assert!(!s.link_used("n2").unwrap());
}

#[test]
fn two_stores_claiming_one_approval_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let first = ApprovalStore::open(&path).unwrap();
    first.insert(&approval("apr_1", 0)).unwrap();
    first
        .decide("apr_1", Verdict::Approve, "a", Channel::Api, None, None, 1)
        .unwrap();
    let stores: Vec<_> = (0..8)
        .map(|_| ApprovalStore::open(&path).unwrap())
        .collect();
    let wins: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .iter()
            .map(|s| scope.spawn(move || s.claim("apr_1", 2).unwrap().is_some()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap() as usize)
            .sum()
    });
    assert_eq!(wins, 1);
    let a = first.get("apr_1").unwrap().unwrap();
    assert_eq!((a.status, a.attempts), (Status::Executing, 1));
}

#[test]
fn recovery_returns_claimed_executions_to_approved() {
    let (_d, s) = store();
    s.insert(&approval("apr_1", 0)).unwrap();
    s.decide("apr_1", Verdict::Approve, "a", Channel::Api, None, None, 1)
        .unwrap();
    s.claim("apr_1", 2).unwrap().unwrap();
    assert_eq!(s.recover(3).unwrap(), vec!["apr_1".to_owned()]);
    let again = s.claim("apr_1", 4).unwrap().unwrap();
    assert_eq!(again.attempts, 2, "the second attempt is counted");
    let result = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"ok".to_vec(),
        truncated: false,
    };
    assert!(s
        .finish("apr_1", Status::Executed, Some(&result), None, 5)
        .unwrap());
    assert!(!s
        .finish("apr_1", Status::Failed, None, Some("x"), 6)
        .unwrap());
    assert_eq!(s.get("apr_1").unwrap().unwrap().result, Some(result));
}

#[test]
fn deadline_expires_and_reminders_advance() {
    let (_d, s) = store();
    s.insert(&approval("apr_1", 0)).unwrap();
    assert!(s.renotify_due(999, 1000).unwrap().is_empty());
    let due = s.renotify_due(1000, 1000).unwrap();
    assert_eq!((due.len(), due[0].rounds, due[0].renotify_ms), (1, 2, 2000));
    assert!(s.expire_due(9_999).unwrap().is_empty());
    // A decision at the deadline, before the sweep ran, is refused as expired.
    let racing = s.decide(
        "apr_1",
        Verdict::Approve,
        "a",
        Channel::Api,
        None,
        None,
        10_000,
    );
    assert!(matches!(
        racing,
        Err(DecideError::NotPending(Status::Expired))
    ));
    let expired = s.expire_due(10_000).unwrap();
    assert_eq!(expired[0].status, Status::Expired);
    let late = s.decide(
        "apr_1",
        Verdict::Approve,
        "a",
        Channel::Api,
        None,
        None,
        10_001,
    );
    assert!(matches!(
        late,
        Err(DecideError::NotPending(Status::Expired))
    ));
}

#[test]
fn outbox_retries_until_delivered() {
    let (_d, s) = store();
    s.insert(&approval("apr_1", 0)).unwrap();
    s.enqueue("apr_1", "email", "alice@example.com", 1, 0)
        .unwrap();
    s.enqueue("apr_1", "email", "alice@example.com", 1, 0)
        .unwrap();
    let due = s.due_deliveries(0, 10).unwrap();
    assert_eq!(due.len(), 1, "enqueue is idempotent per round");
    s.delivery_failed(due[0].id, "smtp: connection refused", 500)
        .unwrap();
    assert!(s.due_deliveries(499, 10).unwrap().is_empty());
    assert_eq!(s.counts().unwrap().failing_deliveries, 1);
    let retry = s.due_deliveries(500, 10).unwrap();
    assert_eq!(retry[0].attempts, 1);
    s.delivered(retry[0].id, 600).unwrap();
    assert!(s.due_deliveries(10_000, 10).unwrap().is_empty());
    assert_eq!(s.counts().unwrap().failing_deliveries, 0);
}

#[test]
fn slack_signatures_are_seen_once() {
    let (_d, s) = store();
    assert!(s.slack_first_seen("v0=ab", 0).unwrap());
    assert!(!s.slack_first_seen("v0=ab", 1).unwrap());
}
