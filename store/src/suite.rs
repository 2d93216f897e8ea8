//! The store test suite: every behaviour the proxy relies on, written against the traits
//! only, so that each backend runs the same assertions unchanged. A backend's test file is
//! one line: `ostiary_store::store_suite!(MyBackend::fresh());`, which makes one `#[test]`
//! per suite function, each on a fresh database ([`Backend`]).
//!
//! Functions panic on failure (they are tests); nothing in the proxy calls them.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::sync::Arc;

use crate::approvals::{
    Admission, Approval, ApprovalStore, Channel, DecideError, Decision, HeldRequest, Hold,
    Observed, RecipientState, Status, StoredResponse, Verdict,
};
use crate::audit::{AppendError, AuditQuery, AuditRow, Tip};
use crate::guard::Begun;
use crate::leases::{LeaseKind, LeaseRow};
use crate::sessions::NewSessionRow;
use crate::Stores;

/// One fresh database per test; every [`Backend::open`] opens the same one again (as a
/// second process, or the same one after a restart, would).
pub trait Backend {
    fn open(&self) -> Stores;
}

/// One `#[test]` per suite function, each on `$backend` (an expression evaluated afresh for
/// every test).
#[macro_export]
macro_rules! store_suite {
    ($backend:expr) => {
        $crate::store_suite!(@each $backend; approvals_roundtrip_and_decide_once, approvals_a_link_nonce_decides_once_and_a_refusal_does_not_burn_it, approvals_two_stores_claiming_one_approval_exactly_one_wins, approvals_recovery_returns_claimed_executions_to_approved, approvals_deadline_expires_and_reminders_advance, approvals_outbox_retries_until_delivered, approvals_slack_signatures_are_seen_once, approvals_holds_stop_at_the_cap_and_identical_ones_join, approvals_a_tree_counts_against_every_ancestor_and_survives_reopening, approvals_concurrent_holds_never_overshoot_a_cap, approvals_a_closed_recipient_collects_and_is_not_due, guard_an_idempotency_key_runs_once_and_refuses_another_request, guard_a_pause_is_recorded_once_and_resolved_once, sessions_live_rows_come_back_with_their_parent_agent_and_revocation_sticks, leases_owed_leases_survive_until_settled, audit_appends_only_onto_the_tip_it_was_given, audit_queries_filter_and_scans_stop_when_asked, audit_a_long_chain_scans_whole_and_in_order, stores_on_one_database_see_each_other);
    };
    (@each $backend:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let backend = $backend;
                $crate::suite::$name(&backend);
            }
        )*
    };
}

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
    assert!(s
        .finish("apr_1", Status::Executed, Some(&result), None, 5)
        .unwrap());
    assert!(!s
        .finish("apr_1", Status::Failed, None, Some("x"), 6)
        .unwrap());
    assert_eq!(s.get("apr_1").unwrap().unwrap().result, Some(result));
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

pub fn guard_an_idempotency_key_runs_once_and_refuses_another_request(b: &dyn Backend) {
    let s = b.open().guard;
    let day = 86_400_000;
    assert_eq!(
        s.idempotency_begin("s", "k", "f1", day, 0).unwrap(),
        Begun::Fresh
    );
    assert_eq!(
        s.idempotency_begin("s", "k", "f1", day, 0).unwrap(),
        Begun::Running
    );
    assert_eq!(
        s.idempotency_begin("s", "k", "f2", day, 0).unwrap(),
        Begun::Mismatch
    );
    // Another session's key of the same name is its own.
    assert_eq!(
        s.idempotency_begin("t", "k", "f2", day, 0).unwrap(),
        Begun::Fresh
    );
    let stored = StoredResponse {
        status: 201,
        headers: vec![("x".into(), "y".into())],
        body: b"made".to_vec(),
        truncated: false,
    };
    s.idempotency_done("s", "k", Some(&stored)).unwrap();
    assert_eq!(
        s.idempotency_begin("s", "k", "f1", day, 0).unwrap(),
        Begun::Done(Some(stored))
    );
    // An abandoned key runs afresh; a finished one is not abandoned.
    s.idempotency_abandon("s", "k").unwrap();
    assert!(matches!(
        s.idempotency_begin("s", "k", "f1", day, 0).unwrap(),
        Begun::Done(_)
    ));
    s.idempotency_abandon("t", "k").unwrap();
    assert_eq!(
        s.idempotency_begin("t", "k", "f2", day, 0).unwrap(),
        Begun::Fresh
    );
    // Past the ttl the key is forgotten.
    assert_eq!(
        s.idempotency_begin("s", "k", "f9", -1, 0).unwrap(),
        Begun::Fresh
    );
}

pub fn guard_a_pause_is_recorded_once_and_resolved_once(b: &dyn Backend) {
    let s = b.open().guard;
    let snap = serde_json::json!({"x": 1});
    let p = s.pause("s", "repeat", "why", &snap, 5).unwrap().unwrap();
    assert!(s.pause("s", "cycle", "again", &snap, 6).unwrap().is_none());
    assert_eq!(s.pauses().unwrap(), vec![("s".to_owned(), p.clone())]);
    assert!(s.unpause("s", "resumed", 9).unwrap());
    assert!(!s.unpause("s", "resumed", 9).unwrap());
    let letters = s.dead_letters(Some("s")).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].resolved.as_deref(), Some("resumed"));
    assert_eq!(letters[0].snapshot, snap);
}

// ---------------------------------------------------------------------------------------
// Sessions, leases, the audit chain
// ---------------------------------------------------------------------------------------

pub fn sessions_live_rows_come_back_with_their_parent_agent_and_revocation_sticks(b: &dyn Backend) {
    let s = b.open().sessions;
    let row = |id: &'static str, agent: &'static str, parent: Option<&'static str>, expires_at| {
        NewSessionRow {
            id,
            agent,
            tenant: "t",
            created_at: 100,
            expires_at,
            depth: u32::from(parent.is_some()),
            parent,
            profile: Some("strict"),
            max_calls: Some(5),
            max_cost: Some(1.5),
        }
    };
    s.insert(&row("root", "planner", None, 1_000)).unwrap();
    s.insert(&row("child", "planner", Some("root"), 1_000))
        .unwrap();
    s.insert(&row("old", "x", None, 150)).unwrap();
    assert!(
        s.insert(&row("root", "again", None, 1_000)).is_err(),
        "ids are unique"
    );
    // An ended parent still names its child's parent agent.
    s.revoke("root", 200).unwrap();
    s.revoke("root", 300).unwrap();
    let live = b.open().sessions.live(200).unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    // One session looked up by id (how a replica learns of another's): live only.
    let other = b.open().sessions;
    assert_eq!(other.get_live("child", 200).unwrap().as_ref(), live.first());
    assert_eq!(other.get_live("root", 200).unwrap(), None, "revoked");
    assert_eq!(other.get_live("old", 200).unwrap(), None, "expired");
    assert_eq!(other.get_live("nobody", 200).unwrap(), None);
    let child = &live[0];
    assert_eq!(child.id, "child");
    assert_eq!(child.parent.as_deref(), Some("root"));
    assert_eq!(child.parent_agent.as_deref(), Some("planner"));
    assert_eq!(child.profile.as_deref(), Some("strict"));
    assert_eq!((child.depth, child.expires_at), (1, 1_000));
    assert!(
        s.live(1_000).unwrap().is_empty(),
        "expired at its own second"
    );
}

pub fn leases_owed_leases_survive_until_settled(b: &dyn Backend) {
    let s = b.open().leases;
    let lease = |id: &str, kind| LeaseRow {
        lease_id: id.into(),
        session: "s1".into(),
        binding: "db".into(),
        kind,
        renewable: true,
        expires_at_ms: Some(2_000_000_000_000),
    };
    let pki = LeaseKind::Pki {
        mount: "pki".into(),
        serial: "0a:0b".into(),
    };
    s.owed(&lease("database/creds/r/1", LeaseKind::Vault), 1)
        .unwrap();
    s.owed(&lease("pki:pki:0a:0b", pki.clone()), 2).unwrap();
    // Owed again (a renewal): one row still.
    s.owed(&lease("pki:pki:0a:0b", pki.clone()), 3).unwrap();
    s.settled("database/creds/r/1").unwrap();
    s.settled("never-owed").unwrap();
    let left = b.open().leases.owed_leases().unwrap();
    assert_eq!(left, vec![lease("pki:pki:0a:0b", pki)]);
}

fn audit_row(seq: i64, prev: &str, session: Option<&str>, decision: &str) -> AuditRow {
    AuditRow {
        seq,
        ts_ms: seq * 10,
        session: session.map(str::to_owned),
        decision: decision.into(),
        record: format!("{{\"seq\":{seq}}}"),
        prev: prev.into(),
        hash: format!("h{seq}"),
    }
}

pub fn audit_appends_only_onto_the_tip_it_was_given(b: &dyn Backend) {
    let s = b.open().audit;
    assert_eq!(s.last().unwrap(), None);
    let genesis = Tip::genesis();
    s.append(
        &genesis,
        &[
            audit_row(1, &genesis.hash, Some("a"), "allow"),
            audit_row(2, "h1", Some("b"), "deny"),
        ],
    )
    .unwrap();
    let tip = Tip {
        seq: 2,
        hash: "h2".into(),
    };
    assert_eq!(s.last().unwrap(), Some(tip.clone()));
    // A writer that thinks the chain ends elsewhere writes nothing.
    let stale = s.append(&genesis, &[audit_row(1, &genesis.hash, None, "allow")]);
    assert!(
        matches!(
            stale,
            Err(AppendError::Moved {
                expected: 0,
                found: 2
            })
        ),
        "{stale:?}"
    );
    // A batch that fails half-way (a duplicate number) leaves nothing of itself.
    let clash = s.append(
        &tip,
        &[
            audit_row(3, "h2", None, "allow"),
            audit_row(3, "h3", None, "allow"),
        ],
    );
    assert!(clash.is_err());
    assert_eq!(s.last().unwrap(), Some(tip.clone()));
    s.append(&tip, &[audit_row(3, "h2", Some("a"), "escalate")])
        .unwrap();
    assert_eq!(s.hash_at(2).unwrap().as_deref(), Some("h2"));
    assert_eq!(s.hash_at(9).unwrap(), None);
}

pub fn audit_queries_filter_and_scans_stop_when_asked(b: &dyn Backend) {
    let s = b.open().audit;
    let mut prev = Tip::genesis();
    for seq in 1..=6 {
        let session = if seq % 2 == 0 { "even" } else { "odd" };
        let decision = if seq > 4 { "deny" } else { "allow" };
        let row = audit_row(seq, &prev.hash, Some(session), decision);
        s.append(&prev, std::slice::from_ref(&row)).unwrap();
        prev = Tip {
            seq,
            hash: row.hash,
        };
    }
    let q = |session: Option<&str>, decision: Option<&str>, since_ms, limit| AuditQuery {
        session: session.map(str::to_owned),
        decision: decision.map(str::to_owned),
        since_ms,
        limit,
    };
    let seqs = |records: Vec<String>| -> Vec<i64> {
        records
            .iter()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"]
                    .as_i64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(
        seqs(s.query(&q(None, None, None, None)).unwrap()),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        seqs(s.query(&q(Some("even"), None, None, None)).unwrap()),
        [2, 4, 6]
    );
    assert_eq!(
        seqs(s.query(&q(Some("odd"), Some("deny"), None, None)).unwrap()),
        [5]
    );
    assert_eq!(
        seqs(s.query(&q(None, None, Some(30), Some(2))).unwrap()),
        [3, 4]
    );
    assert_eq!(seqs(s.recent("even", 2).unwrap()), [4, 6], "newest last");
    let mut seen = Vec::new();
    s.scan(2, &mut |row| {
        seen.push(row.seq);
        row.seq < 4
    })
    .unwrap();
    assert_eq!(seen, [3, 4]);
}

pub fn audit_a_long_chain_scans_whole_and_in_order(b: &dyn Backend) {
    // Longer than a backend's page (PostgreSQL reads 1,000 rows at a time).
    let s = b.open().audit;
    let mut prev = Tip::genesis().hash;
    let rows: Vec<AuditRow> = (1..=2_500)
        .map(|seq| {
            let row = audit_row(seq, &prev, None, "allow");
            prev = row.hash.clone();
            row
        })
        .collect();
    s.append(&Tip::genesis(), &rows).unwrap();
    let mut seen = Vec::new();
    s.scan(0, &mut |row| {
        seen.push(row.seq);
        true
    })
    .unwrap();
    assert_eq!(seen, (1..=2_500).collect::<Vec<_>>());
    let mut from_middle = 0;
    s.scan(1_999, &mut |_| {
        from_middle += 1;
        true
    })
    .unwrap();
    assert_eq!(from_middle, 501);
}

pub fn stores_on_one_database_see_each_other(b: &dyn Backend) {
    // What one process (or replica) wrote, another reads at once.
    let (one, two) = (b.open(), b.open());
    one.approvals.insert(&approval("apr_1", 0)).unwrap();
    let seen: Arc<dyn ApprovalStore> = two.approvals;
    assert_eq!(seen.get("apr_1").unwrap().unwrap().status, Status::Pending);
    one.guard
        .save_accounts(&[("s".into(), serde_json::json!({"calls": 3}))], 1)
        .unwrap();
    assert_eq!(
        two.guard.load_accounts().unwrap(),
        vec![("s".to_owned(), serde_json::json!({"calls": 3}))]
    );
    one.guard.forget_account("s").unwrap();
    assert!(two.guard.load_accounts().unwrap().is_empty());
    two.guard
        .idempotency_begin("s", "k", "f", 1_000, 0)
        .unwrap();
    one.guard.idempotency_forget("s").unwrap();
    assert_eq!(
        two.guard
            .idempotency_begin("s", "k", "g", 1_000, 0)
            .unwrap(),
        Begun::Fresh
    );
}
