//! The approval queue's part of the store suite: decisions once, claims once, recovery,
//! deadlines, the outbox, bounded holds.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]
use super::Backend;
use crate::approvals::{
    Admission, Approval, ApprovalStore, Channel, DecideError, Decision, HeldRequest, Hold,
    Observed, RecipientState, Status, StoredResponse, Verdict,
};

#[allow(clippy::too_many_arguments)]
fn decide(
    s: &dyn ApprovalStore,
    id: &str,
    verdict: Verdict,
    approver: &str,
    channel: Channel,
    reason: Option<&str>,
    nonce: Option<&str>,
    now_ms: i64,
) -> Result<Approval, DecideError> {
    s.decide(&Decision {
        id,
        verdict,
        approver,
        channel,
        reason,
        nonce,
        now_ms,
    })
}

// ---------------------------------------------------------------------------------------
// Approvals: transitions once each, under races, across a crash, and the outbox
// ---------------------------------------------------------------------------------------

pub(super) fn approval(id: &str, now: i64) -> Approval {
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
        held_policy_version: Some("sha256:0123456789abcdef".into()),
        executed_policy_version: None,
    }
}

pub fn approvals_roundtrip_and_decide_once(b: &dyn Backend) {
    let s = b.open().approvals;
    let a = approval("apr_1", 1000);
    s.insert(&a).unwrap();
    assert_eq!(s.get("apr_1").unwrap().unwrap(), a);
    let decided = decide(
        &*s,
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
    let again = decide(
        &*s,
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

pub fn approvals_a_link_nonce_decides_once_and_a_refusal_does_not_burn_it(b: &dyn Backend) {
    let s = b.open().approvals;
    s.insert(&approval("apr_1", 0)).unwrap();
    s.insert(&approval("apr_2", 0)).unwrap();
    decide(
        &*s,
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
    let reused = decide(
        &*s,
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
    let late = decide(
        &*s,
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

pub fn approvals_two_stores_claiming_one_approval_exactly_one_wins(b: &dyn Backend) {
    let first = b.open().approvals;
    first.insert(&approval("apr_1", 0)).unwrap();
    decide(
        &*first,
        "apr_1",
        Verdict::Approve,
        "a",
        Channel::Api,
        None,
        None,
        1,
    )
    .unwrap();
    let stores: Vec<_> = (0..8).map(|_| b.open().approvals).collect();
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

pub fn approvals_recovery_returns_claimed_executions_to_approved(b: &dyn Backend) {
    let s = b.open().approvals;
    s.insert(&approval("apr_1", 0)).unwrap();
    decide(
        &*s,
        "apr_1",
        Verdict::Approve,
        "a",
        Channel::Api,
        None,
        None,
        1,
    )
    .unwrap();
    s.claim("apr_1", 2).unwrap().unwrap();
    // A claim renewed within its lease is live: another replica's recovery leaves it.
    assert!(s.renew("apr_1", 10).unwrap());
    assert!(
        s.recover(12, 9).unwrap().is_empty(),
        "a live claim is not taken"
    );
    assert_eq!(s.get("apr_1").unwrap().unwrap().status, Status::Executing);
    // Not heard of since its lease: back to approved, once, for whoever claims it next.
    assert_eq!(s.recover(20, 10).unwrap(), vec!["apr_1".to_owned()]);
    assert!(s.recover(21, 21).unwrap().is_empty());
    assert!(
        !s.renew("apr_1", 22).unwrap(),
        "the old executor's claim is gone"
    );
    // Claimed and released (its executor shutting down): approved again, once.
    s.claim("apr_1", 23).unwrap().unwrap();
    assert!(s.release("apr_1", 24).unwrap());
    assert!(!s.release("apr_1", 25).unwrap(), "not executing any more");
    assert_eq!(s.get("apr_1").unwrap().unwrap().status, Status::Approved);
    let again = s.claim("apr_1", 26).unwrap().unwrap();
    assert_eq!(again.attempts, 3, "every attempt is counted");
    let result = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"ok".to_vec(),
        truncated: false,
    };
    let executed_under = Some("sha256:fedcba9876543210");
    assert!(s
        .finish(
            "apr_1",
            Status::Executed,
            Some(&result),
            None,
            executed_under,
            5
        )
        .unwrap());
    assert!(!s
        .finish("apr_1", Status::Failed, None, Some("x"), None, 6)
        .unwrap());
    let done = s.get("apr_1").unwrap().unwrap();
    assert_eq!(done.result, Some(result));
    // Held under one set, executed under another: both kept.
    assert_eq!(
        done.held_policy_version.as_deref(),
        Some("sha256:0123456789abcdef")
    );
    assert_eq!(done.executed_policy_version.as_deref(), executed_under);
}

pub fn approvals_deadline_expires_and_reminders_advance(b: &dyn Backend) {
    let s = b.open().approvals;
    s.insert(&approval("apr_1", 0)).unwrap();
    assert!(s.renotify_due(999, 1000).unwrap().is_empty());
    let due = s.renotify_due(1000, 1000).unwrap();
    assert_eq!((due.len(), due[0].rounds, due[0].renotify_ms), (1, 2, 2000));
    assert!(s.expire_due(9_999).unwrap().is_empty());
    // A decision at the deadline, before the sweep ran, is refused as expired.
    let racing = decide(
        &*s,
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
    let late = decide(
        &*s,
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

pub fn approvals_outbox_retries_until_delivered(b: &dyn Backend) {
    let s = b.open().approvals;
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

pub fn approvals_slack_signatures_are_seen_once(b: &dyn Backend) {
    let s = b.open().approvals;
    assert!(s.slack_first_seen("v0=ab", 0).unwrap());
    assert!(!s.slack_first_seen("v0=ab", 1).unwrap());
}

// ---------------------------------------------------------------------------------------
// Bounded holds and the recipients' rate state
// ---------------------------------------------------------------------------------------

fn of(session: &str, id: &str, now: i64) -> Approval {
    let mut a = approval(id, now);
    a.session = session.to_owned();
    a
}

fn hold(s: &dyn ApprovalStore, a: &Approval, fingerprint: &str, now: i64) -> Admission {
    let notify = [("email", "alice@example.com".to_owned())];
    s.hold_bounded(
        Hold {
            approval: a,
            fingerprint,
            default_max: 5,
            notify: &notify,
        },
        now,
    )
    .unwrap()
}

pub fn approvals_holds_stop_at_the_cap_and_identical_ones_join(b: &dyn Backend) {
    let s = b.open().approvals;
    s.set_cap("ses_a", None, 2).unwrap();
    assert_eq!(
        hold(&*s, &of("ses_a", "apr_1", 0), "f1", 0),
        Admission::Held
    );
    // The same fingerprint joins, whatever the new approval's id.
    match hold(&*s, &of("ses_a", "apr_x", 1), "f1", 1) {
        Admission::Joined(existing) => assert_eq!(existing.id, "apr_1"),
        other => panic!("{other:?}"),
    }
    assert!(s.get("apr_x").unwrap().is_none(), "a join stores nothing");
    assert_eq!(
        hold(&*s, &of("ses_a", "apr_2", 2), "f2", 2),
        Admission::Held
    );
    match hold(&*s, &of("ses_a", "apr_3", 3), "f3", 3) {
        Admission::Full(full) => {
            assert_eq!(
                (full.used, full.max, full.session.as_str()),
                (2, 2, "ses_a")
            );
            assert_eq!(full.frees_at_ms, Some(10_000), "the first deadline");
        }
        other => panic!("{other:?}"),
    }
    // At the cap an identical request still joins (it adds nothing).
    assert!(matches!(
        hold(&*s, &of("ses_a", "apr_y", 4), "f2", 4),
        Admission::Joined(_)
    ));
    // Another session with the same fingerprint gets its own (default cap 5).
    assert_eq!(
        hold(&*s, &of("ses_b", "apr_b", 5), "f1", 5),
        Admission::Held
    );
    // Only the held ones owe notifications.
    assert_eq!(s.due_deliveries(10, 100).unwrap().len(), 3);
    // A decision frees a slot; so does a deadline passing.
    decide(
        &*s,
        "apr_1",
        Verdict::Deny,
        "a",
        Channel::Api,
        None,
        None,
        6,
    )
    .unwrap();
    assert_eq!(
        hold(&*s, &of("ses_a", "apr_3", 7), "f3", 7),
        Admission::Held
    );
    assert!(matches!(
        hold(&*s, &of("ses_a", "apr_4", 8), "f4", 8),
        Admission::Full(_)
    ));
    assert_eq!(
        hold(&*s, &of("ses_a", "apr_4", 10_002), "f4", 10_002),
        Admission::Held
    );
}

pub fn approvals_a_tree_counts_against_every_ancestor_and_survives_reopening(b: &dyn Backend) {
    {
        let s = b.open().approvals;
        s.set_cap("root", None, 3).unwrap();
        s.set_cap("child", Some("root"), 3).unwrap();
        s.set_cap("grandchild", Some("child"), 1).unwrap();
        assert_eq!(hold(&*s, &of("root", "apr_1", 0), "a", 0), Admission::Held);
        assert_eq!(hold(&*s, &of("child", "apr_2", 0), "b", 0), Admission::Held);
        assert_eq!(
            hold(&*s, &of("grandchild", "apr_3", 0), "c", 0),
            Admission::Held
        );
    }
    let s = b.open().approvals;
    assert_eq!(s.cap("grandchild").unwrap(), Some(1));
    assert_eq!(s.pending_holds("root", 1).unwrap(), 3);
    for (session, full_at) in [
        ("grandchild", "grandchild"),
        ("child", "root"),
        ("root", "root"),
    ] {
        match hold(&*s, &of(session, "apr_9", 1), "z", 1) {
            Admission::Full(full) => assert_eq!(full.session, full_at, "{session}"),
            other => panic!("{session}: {other:?}"),
        }
    }
    // The child's end forgets its bounds; its pending approval expires, freeing the root.
    s.expire_session("grandchild", 2).unwrap();
    assert_eq!(s.cap("grandchild").unwrap(), None);
    assert_eq!(s.pending_holds("root", 2).unwrap(), 2);
}

pub fn approvals_concurrent_holds_never_overshoot_a_cap(b: &dyn Backend) {
    let first = b.open().approvals;
    first.set_cap("ses_a", None, 3).unwrap();
    let stores: Vec<_> = (0..8).map(|_| b.open().approvals).collect();
    let held: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                scope.spawn(move || {
                    let a = of("ses_a", &format!("apr_{i}"), 0);
                    usize::from(hold(&**s, &a, &format!("f{i}"), 0) == Admission::Held)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(held, 3);
    assert_eq!(first.pending_holds("ses_a", 0).unwrap(), 3);
}

pub fn approvals_a_closed_recipient_collects_and_is_not_due(b: &dyn Backend) {
    let s = b.open().approvals;
    s.insert(&approval("apr_1", 0)).unwrap();
    s.insert(&approval("apr_2", 0)).unwrap();
    let (email, alice, bob) = ("email", "alice@example.com", "bob@example.com");
    assert_eq!(
        s.recipient_state(email, alice).unwrap(),
        RecipientState::default()
    );
    s.close_recipient(email, alice, 1000).unwrap();
    assert!(!s.recipient_state(email, alice).unwrap().collecting);
    s.enqueue("apr_1", email, alice, 1, 10).unwrap();
    s.enqueue("apr_1", email, bob, 1, 10).unwrap();
    assert!(s.recipient_state(email, alice).unwrap().collecting);
    assert!(!s.recipient_state(email, bob).unwrap().collecting);
    let due: Vec<String> = s
        .due_deliveries(20, 10)
        .unwrap()
        .into_iter()
        .map(|d| d.recipient)
        .collect();
    assert_eq!(due, [bob], "alice is closed until 1000");
    s.enqueue("apr_2", email, alice, 1, 20).unwrap();
    assert_eq!(s.due_deliveries(1000, 10).unwrap().len(), 3);
    assert_eq!(s.due_for(email, alice, 1000).unwrap().len(), 2);
    // Closing a recipient with a delivery still unsent (owed while a message was on its
    // way) leaves it collecting; once everything is sent, not.
    s.close_recipient(email, bob, 5).unwrap();
    assert!(s.recipient_state(email, bob).unwrap().collecting);
    for d in s.due_for(email, bob, 1000).unwrap() {
        s.delivered(d.id, 1000).unwrap();
    }
    s.close_recipient(email, bob, 5).unwrap();
    assert!(!s.recipient_state(email, bob).unwrap().collecting);
    // Enqueued once it opened: not collected.
    s.enqueue("apr_2", email, bob, 1, 30).unwrap();
    assert!(!s.recipient_state(email, bob).unwrap().collecting);
}

// ---------------------------------------------------------------------------------------
// Guard state
// ---------------------------------------------------------------------------------------
