//! The store test suite: every behaviour the proxy relies on, written against the traits
//! only, so that each backend runs the same assertions unchanged. A backend's test file is
//! one line: `ostiary_store::store_suite!(MyBackend::fresh());`, which makes one `#[test]`
//! per suite function, each on a fresh database ([`Backend`]).
//!
//! Functions panic on failure (they are tests); nothing in the proxy calls them.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::sync::Arc;

use crate::approvals::{ApprovalStore, Status, StoredResponse};
use crate::guard::Begun;
use crate::leases::{LeaseKind, LeaseRow};
use crate::sessions::NewSessionRow;
use crate::Stores;

mod approvals;
mod audit;
mod cursors;
mod policy_versions;
mod runs;
mod runs_holders;
mod runs_limits;
mod session_labels;
mod undo;
use approvals::approval;
pub use approvals::*;
pub use audit::*;
pub use cursors::*;
pub use policy_versions::*;
pub use runs::*;
pub use runs_holders::*;
pub use runs_limits::*;
pub use session_labels::*;
pub use undo::*;

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
        $crate::store_suite!(@each $backend; approvals_roundtrip_and_decide_once, approvals_a_link_nonce_decides_once_and_a_refusal_does_not_burn_it, approvals_two_stores_claiming_one_approval_exactly_one_wins, approvals_recovery_returns_claimed_executions_to_approved, approvals_deadline_expires_and_reminders_advance, approvals_outbox_retries_until_delivered, approvals_slack_signatures_are_seen_once, approvals_holds_stop_at_the_cap_and_identical_ones_join, approvals_a_tree_counts_against_every_ancestor_and_survives_reopening, approvals_concurrent_holds_never_overshoot_a_cap, approvals_a_closed_recipient_collects_and_is_not_due, guard_an_idempotency_key_runs_once_and_refuses_another_request, guard_a_pause_is_recorded_once_and_resolved_once, sessions_live_rows_come_back_with_their_parent_agent_and_revocation_sticks, leases_owed_leases_survive_until_settled, audit_appends_only_onto_the_tip_it_was_given, audit_an_append_after_takes_on_other_writers_rows_under_its_lock, audit_queries_filter_and_scans_stop_when_asked, audit_a_long_chain_scans_whole_and_in_order, audit_appends_of_every_size_keep_each_rows_columns, cursors_one_holder_at_a_time_and_a_lapsed_lease_passes_on, cursors_move_only_from_where_they_were_read_and_count_what_was_delivered, cursors_a_reset_wins_over_a_delivery_in_flight_and_survives_reopening, runs_a_row_comes_back_with_every_field_as_stored, runs_a_delivery_key_is_seen_once_within_its_window, runs_two_stores_racing_one_key_store_one_run, runs_claim_takes_the_oldest_due_run_first, runs_two_stores_claiming_at_once_never_take_one_run, runs_start_moves_only_from_the_status_named, runs_an_approved_run_is_released_once_into_the_queue, runs_a_lapsed_holders_runs_are_reclaimed_and_a_live_ones_kept, runs_only_the_holder_moves_its_attempt_and_a_retry_waits, runs_cancel_in_each_state, runs_a_requeued_run_keeps_its_dead_letter_and_counts_on, runs_recover_ends_only_the_dead_holders_running_runs, runs_checkpoints_survive_reopening, runs_list_is_newest_first_and_filters, runs_a_serial_trigger_is_claimed_only_while_none_of_its_runs_runs, runs_two_stores_claiming_a_serial_trigger_at_once_start_one_run, runs_a_triggers_rate_is_one_for_every_store_and_a_duplicate_spends_none, runs_two_stores_racing_on_one_rate_store_no_more_than_it, runs_the_sweep_takes_expired_keys_and_long_ended_runs_checkpoints, stores_on_one_database_see_each_other, session_labels_only_grow_are_shared_and_pass_to_a_child, policy_versions_record_what_was_live_and_when, undo_a_row_comes_back_with_every_field_as_stored, undo_list_is_newest_first_and_filters_by_session_and_time, undo_recording_an_id_twice_keeps_the_first, undo_claim_takes_only_claimable_entries_and_counts_attempts, undo_finish_moves_only_a_running_entry, undo_two_stores_claiming_at_once_win_each_entry_once);
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
