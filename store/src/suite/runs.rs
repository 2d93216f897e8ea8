//! Runs' part of the store suite: rows come back as stored, delivery keys dedup within their
//! window (also when two replicas race), claims take the oldest due run and never one run
//! twice, every move is a compare-and-set for its holder, cancels and requeues in each
//! state, checkpoints survive reopening. Recovery and lapsed holders are in `runs_holders`; what
//! bounds a trigger's runs (one at a time, a rate) and the sweep are in `runs_limits`.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::collections::BTreeSet;
use std::sync::Barrier;

use super::Backend;
use crate::runs::{
    Cancel, Dedup, Enqueued, Finished, NewRun, RateLimit, RunFilter, RunRow, RunStatus, RunStore,
};

/// A queued run of `trigger`, made at `created_ms` and due then, with nothing else set.
pub(super) fn run(id: &str, trigger: &str, created_ms: i64) -> RunRow {
    let new = NewRun {
        id: id.to_owned(),
        trigger: trigger.to_owned(),
        kind: "webhook".into(),
        spec: r#"{"command":["echo","hi"]}"#.into(),
        payload: "{}".into(),
        payload_sha256: "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a".into(),
    };
    RunRow::queued(new, created_ms)
}

/// Every field set, each to a value no other field of its type has (a swapped column
/// shows), the JSON texts laid out as no serializer would (a re-encoded one shows).
pub(super) fn full(id: &str, status: RunStatus) -> RunRow {
    RunRow {
        id: id.to_owned(),
        trigger: "deploy-hook".into(),
        kind: "api".into(),
        status,
        spec: "{ \"command\" : [\"sh\", \"-c\", \"echo \\\"h\u{e9}\\\"\\n\"],\n  \"env\": {\"A\": \"1\"} }"
            .into(),
        payload: "[1, 2.50, {\"k\": null}]".into(),
        payload_sha256: "ab".repeat(32),
        attempt: 3,
        created_ms: 1_000,
        not_before_ms: 2_000,
        started_ms: Some(3_000),
        ended_ms: Some(4_000),
        session: Some("ses_full".into()),
        holder: Some("replica-a".into()),
        exit_code: Some(137),
        limit: Some("memory".into()),
        error: Some("killed: out of memory".into()),
        stderr_tail: Some("line 1\nline 2 \u{2014} \u{1f4a5}\n".into()),
        // Past what a double holds exactly: an integer column, not a real one.
        cost_micros: Some(9_007_199_254_740_993),
        dead_letter: Some("{\"audit\": [], \"usage\": {\"calls\": 7}}".into()),
        cancel_requested: true,
        parent_run: Some("run_parent".into()),
        approval: Some("apr_full".into()),
    }
}

pub(super) fn new(s: &dyn RunStore, row: &RunRow) {
    assert_eq!(
        s.enqueue(row, None, None, row.created_ms).unwrap(),
        Enqueued::New
    );
}

pub(super) fn key(key: &str, expires_ms: i64) -> Option<Dedup<'_>> {
    Some(Dedup { key, expires_ms })
}

/// An attempt that ended as `status` at `ended_ms`, with nothing else to say.
pub(super) fn ended(status: RunStatus, ended_ms: i64) -> Finished {
    Finished {
        status,
        retry_at_ms: None,
        ended_ms,
        exit_code: None,
        limit: None,
        error: None,
        stderr_tail: None,
        cost_micros: None,
        dead_letter: None,
    }
}

/// An attempt that ended at `ended_ms` and goes back to the queue until `at_ms`.
pub(super) fn retry(at_ms: i64, ended_ms: i64) -> Finished {
    Finished {
        retry_at_ms: Some(at_ms),
        ..ended(RunStatus::Queued, ended_ms)
    }
}

/// `each` run on two threads at once, one with each store (as `a` and `b`), released together
/// so that they race; what each returned, `a`'s first.
pub(super) fn at_once<T: Send>(
    one: &dyn RunStore,
    two: &dyn RunStore,
    each: impl Fn(&dyn RunStore, &str) -> T + Sync,
) -> Vec<T> {
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let handles: Vec<_> = [(one, "a"), (two, "b")]
            .into_iter()
            .map(|(s, who)| {
                let (barrier, each) = (&barrier, &each);
                scope.spawn(move || {
                    barrier.wait();
                    each(s, who)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub(super) fn all(s: &dyn RunStore) -> Vec<RunRow> {
    s.list(&RunFilter {
        limit: Some(u32::MAX),
        ..RunFilter::default()
    })
    .unwrap()
}

pub(super) fn ids(rows: &[RunRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

/// The ids of every run stored, in order.
pub(super) fn sorted_ids(s: &dyn RunStore) -> Vec<String> {
    let mut stored: Vec<String> = all(s).into_iter().map(|r| r.id).collect();
    stored.sort();
    stored
}

pub fn runs_a_row_comes_back_with_every_field_as_stored(b: &dyn Backend) {
    let s = b.open().runs;
    let mut stored = vec![run("run_bare", "hook", 500)];
    // Every status, so that each is written and read under its own name.
    for (i, status) in RunStatus::ALL.into_iter().enumerate() {
        stored.push(full(&format!("run_full_{i}"), status));
    }
    for row in &stored {
        new(&*s, row);
    }
    let again = b.open().runs;
    for row in &stored {
        assert_eq!(again.get(&row.id).unwrap().as_ref(), Some(row));
    }
    let mut listed = all(&*again);
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    stored.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(listed, stored);
    assert_eq!(again.get("run_none").unwrap(), None);
}

pub fn runs_a_delivery_key_is_seen_once_within_its_window(b: &dyn Backend) {
    let s = b.open().runs;
    let dup = |id: &str| Enqueued::Duplicate(id.to_owned());
    let at = |id: &str, trigger: &str, now| run(id, trigger, now);
    assert_eq!(
        s.enqueue(&at("run_1", "hook", 0), key("d1", 1_000), None, 0)
            .unwrap(),
        Enqueued::New
    );
    assert_eq!(
        s.enqueue(&at("run_2", "hook", 10), key("d1", 2_000), None, 10)
            .unwrap(),
        dup("run_1")
    );
    assert_eq!(s.get("run_2").unwrap(), None, "a duplicate stores nothing");
    // The window is the first delivery's: a duplicate does not stretch it.
    assert_eq!(
        s.enqueue(&at("run_3", "hook", 999), key("d1", 9_000), None, 999)
            .unwrap(),
        dup("run_1")
    );
    // Another trigger's key of the same name is its own.
    assert_eq!(
        s.enqueue(&at("run_4", "cron", 20), key("d1", 1_000), None, 20)
            .unwrap(),
        Enqueued::New
    );
    // Expired at its own millisecond: a new delivery, whose key counts from now on.
    assert_eq!(
        s.enqueue(&at("run_5", "hook", 1_000), key("d1", 3_000), None, 1_000)
            .unwrap(),
        Enqueued::New
    );
    assert_eq!(
        s.enqueue(&at("run_6", "hook", 1_001), key("d1", 3_000), None, 1_001)
            .unwrap(),
        dup("run_5")
    );
    // Without a key nothing is a duplicate, the same payload included.
    new(&*s, &at("run_7", "hook", 1_002));
    new(&*s, &at("run_8", "hook", 1_002));
    // The key and the run are one transaction: a run that cannot be stored (its id is
    // taken) takes no key, and the next delivery with that key is new.
    assert!(s
        .enqueue(&at("run_1", "hook", 1_003), key("d2", 5_000), None, 1_003)
        .is_err());
    assert_eq!(
        s.enqueue(&at("run_9", "hook", 1_004), key("d2", 5_000), None, 1_004)
            .unwrap(),
        Enqueued::New
    );
    assert_eq!(
        sorted_ids(&*s),
        ["run_1", "run_4", "run_5", "run_7", "run_8", "run_9"]
    );
}

pub fn runs_two_stores_racing_one_key_store_one_run(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    for round in 0..20 {
        let key = format!("delivery-{round}");
        let outcomes: Vec<(String, Enqueued)> = at_once(&*one, &*two, |s, who| {
            let row = run(&format!("run_{round}_{who}"), "hook", round);
            let outcome = s
                .enqueue(
                    &row,
                    Some(Dedup {
                        key: &key,
                        expires_ms: 1_000_000,
                    }),
                    // Ample: the key and the rate taken together, racing.
                    Some(RateLimit {
                        count: 100,
                        per_ms: 1,
                    }),
                    round,
                )
                .unwrap();
            (row.id, outcome)
        });
        let winners: Vec<&String> = outcomes
            .iter()
            .filter(|(_, o)| *o == Enqueued::New)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let winner = winners[0];
        for (id, outcome) in &outcomes {
            if id != winner {
                assert_eq!(
                    *outcome,
                    Enqueued::Duplicate(winner.clone()),
                    "round {round}"
                );
                assert_eq!(
                    one.get(id).unwrap(),
                    None,
                    "round {round}: the loser is not stored"
                );
            }
        }
        assert!(two.get(winner).unwrap().is_some());
    }
}

pub fn runs_claim_takes_the_oldest_due_run_first(b: &dyn Backend) {
    let s = b.open().runs;
    new(&*s, &run("run_b", "hook", 20));
    // Made at the same millisecond: the smaller id first.
    new(&*s, &run("run_a", "hook", 20));
    // The oldest, but waiting for its backoff.
    new(
        &*s,
        &RunRow {
            not_before_ms: 500,
            ..run("run_c", "hook", 10)
        },
    );
    new(&*s, &run("run_d", "cron", 30));
    new(
        &*s,
        &RunRow {
            status: RunStatus::AwaitingApproval,
            approval: Some("apr_1".into()),
            ..run("run_e", "hook", 5)
        },
    );
    let first = s.claim("replica-a", None, 100).unwrap().unwrap();
    assert_eq!(first.id, "run_a");
    assert_eq!(first.status, RunStatus::Running);
    assert_eq!(first.holder.as_deref(), Some("replica-a"));
    assert_eq!((first.attempt, first.started_ms), (1, Some(100)));
    assert_eq!(s.get("run_a").unwrap().as_ref(), Some(&first), "as stored");
    // Of one trigger, when asked.
    let cron = s.claim("replica-a", Some("cron"), 100).unwrap().unwrap();
    assert_eq!(cron.id, "run_d");
    assert_eq!(s.claim("replica-a", Some("cron"), 100).unwrap(), None);
    assert_eq!(
        s.claim("replica-b", None, 100).unwrap().unwrap().id,
        "run_b"
    );
    assert_eq!(
        s.claim("replica-b", None, 499).unwrap(),
        None,
        "run_c is not due"
    );
    assert_eq!(s.claim("replica-b", Some("cron"), 500).unwrap(), None);
    let due = s.claim("replica-b", Some("hook"), 500).unwrap().unwrap();
    assert_eq!((due.id.as_str(), due.started_ms), ("run_c", Some(500)));
    // A run awaiting approval is started by its approval, never claimed.
    assert_eq!(s.claim("replica-b", None, 10_000).unwrap(), None);
    assert_eq!(
        s.get("run_e").unwrap().unwrap().status,
        RunStatus::AwaitingApproval
    );
    assert_eq!(s.running("hook").unwrap(), 3);
    assert_eq!(s.running("cron").unwrap(), 1);
    assert_eq!(s.running("none").unwrap(), 0);
}

pub fn runs_two_stores_claiming_at_once_never_take_one_run(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    for i in 0..20 {
        new(&*one, &run(&format!("run_{i:02}"), "hook", i));
    }
    let claimed: Vec<Vec<RunRow>> = at_once(&*one, &*two, |s, holder| {
        let mut mine = Vec::new();
        while let Some(row) = s.claim(holder, None, 1_000).unwrap() {
            assert_eq!(row.holder.as_deref(), Some(holder));
            mine.push(row);
        }
        mine
    });
    let total: usize = claimed.iter().map(Vec::len).sum();
    let distinct: BTreeSet<&str> = claimed.iter().flat_map(|rows| ids(rows)).collect();
    assert_eq!(total, 20, "{claimed:?}");
    assert_eq!(distinct.len(), 20, "a run was claimed twice: {claimed:?}");
    for rows in &claimed {
        for row in rows {
            let stored = one.get(&row.id).unwrap().unwrap();
            assert_eq!((stored.attempt, &stored.holder), (1, &row.holder));
        }
    }
}

pub fn runs_start_moves_only_from_the_status_named(b: &dyn Backend) {
    let s = b.open().runs;
    new(&*s, &run("run_q", "hook", 0));
    new(
        &*s,
        &RunRow {
            status: RunStatus::AwaitingApproval,
            approval: Some("apr_1".into()),
            ..run("run_w", "hook", 0)
        },
    );
    assert_eq!(
        s.start("run_q", RunStatus::AwaitingApproval, "a", 5)
            .unwrap(),
        None
    );
    assert_eq!(s.start("run_w", RunStatus::Queued, "a", 5).unwrap(), None);
    assert_eq!(s.get("run_q").unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(
        s.get("run_w").unwrap().unwrap().status,
        RunStatus::AwaitingApproval
    );
    let granted = s
        .start("run_w", RunStatus::AwaitingApproval, "a", 50)
        .unwrap()
        .unwrap();
    assert_eq!(granted.status, RunStatus::Running);
    assert_eq!((granted.holder.as_deref(), granted.attempt), (Some("a"), 1));
    assert_eq!(granted.started_ms, Some(50));
    assert_eq!(s.get("run_w").unwrap().as_ref(), Some(&granted));
    // Once only: a second start, or a start "from running", takes nothing from its holder.
    assert_eq!(
        s.start("run_w", RunStatus::AwaitingApproval, "b", 60)
            .unwrap(),
        None
    );
    assert_eq!(s.start("run_w", RunStatus::Running, "b", 60).unwrap(), None);
    assert_eq!(s.get("run_w").unwrap().as_ref(), Some(&granted));
    let tick = s
        .start("run_q", RunStatus::Queued, "b", 70)
        .unwrap()
        .unwrap();
    assert_eq!(
        (tick.status, tick.holder.as_deref()),
        (RunStatus::Running, Some("b"))
    );
    assert_eq!(
        s.start("run_none", RunStatus::Queued, "b", 70).unwrap(),
        None
    );
}

pub fn runs_only_the_holder_moves_its_attempt_and_a_retry_waits(b: &dyn Backend) {
    let s = b.open().runs;
    new(&*s, &run("run_1", "hook", 0));
    let claimed = s.claim("a", None, 10).unwrap().unwrap();
    assert!(!s.set_session("run_1", "b", "ses_b").unwrap());
    assert!(s.set_session("run_1", "a", "ses_1").unwrap());
    assert_eq!(
        s.get("run_1").unwrap().unwrap().session.as_deref(),
        Some("ses_1")
    );
    let retry = Finished {
        retry_at_ms: Some(5_000),
        exit_code: Some(1),
        error: Some("exit status 1".into()),
        stderr_tail: Some("boom".into()),
        ..ended(RunStatus::Queued, 20)
    };
    // Another holder's finish changes nothing.
    assert!(!s.finish("run_1", "b", &retry).unwrap());
    let before = s.get("run_1").unwrap().unwrap();
    assert_eq!(
        (before.status, before.holder.as_deref()),
        (RunStatus::Running, Some("a"))
    );
    assert_eq!(before.started_ms, claimed.started_ms);
    // A cancel asked for during the attempt does not outlive it.
    assert!(matches!(
        s.cancel("run_1", "stop", 15).unwrap(),
        Some(Cancel::Requested(_))
    ));
    assert!(s.finish("run_1", "a", &retry).unwrap());
    let waiting = s.get("run_1").unwrap().unwrap();
    assert_eq!(waiting.status, RunStatus::Queued);
    assert_eq!((waiting.holder, waiting.not_before_ms), (None, 5_000));
    assert_eq!((waiting.attempt, waiting.cancel_requested), (1, false));
    assert!(
        !s.finish("run_1", "a", &retry).unwrap(),
        "not running any more"
    );
    assert!(!s.set_session("run_1", "a", "ses_2").unwrap());
    assert_eq!(s.claim("b", None, 4_999).unwrap(), None, "backing off");
    let second = s.claim("b", None, 5_000).unwrap().unwrap();
    assert_eq!((second.attempt, second.started_ms), (2, Some(5_000)));
    assert_eq!(second.holder.as_deref(), Some("b"));
    // The new attempt carries none of the last one's outcome.
    assert_eq!(
        (
            second.ended_ms,
            second.exit_code,
            second.limit,
            second.error
        ),
        (None, None, None, None)
    );
    let over = Finished {
        exit_code: Some(137),
        limit: Some("memory".into()),
        error: Some("memory limit 512 MiB reached".into()),
        stderr_tail: Some("oom".into()),
        cost_micros: Some(1_250),
        dead_letter: Some("{\"usage\":{}}".into()),
        ..ended(RunStatus::LimitExceeded, 6_000)
    };
    assert!(
        !s.finish("run_1", "a", &over).unwrap(),
        "a's attempt is over"
    );
    assert!(s.finish("run_1", "b", &over).unwrap());
    let done = s.get("run_1").unwrap().unwrap();
    assert_eq!(done.status, RunStatus::LimitExceeded);
    assert_eq!((done.ended_ms, done.exit_code), (Some(6_000), Some(137)));
    assert_eq!(done.limit.as_deref(), Some("memory"));
    assert_eq!(done.error, over.error);
    assert_eq!(done.stderr_tail.as_deref(), Some("oom"));
    assert_eq!((done.cost_micros, done.attempt), (Some(1_250), 2));
    assert_eq!(done.dead_letter, over.dead_letter);
    assert!(!s
        .finish("run_1", "b", &ended(RunStatus::Succeeded, 7_000))
        .unwrap());
    assert_eq!(s.get("run_1").unwrap().unwrap(), done);
    assert_eq!(
        s.claim("b", None, 10_000).unwrap(),
        None,
        "ended runs are not claimed"
    );
    // An attempt ends in a final status or goes back to the queue; nothing else.
    new(&*s, &run("run_2", "hook", 0));
    s.claim("a", None, 10).unwrap().unwrap();
    assert!(s
        .finish("run_2", "a", &ended(RunStatus::Running, 20))
        .is_err());
    assert!(s
        .finish("run_2", "a", &ended(RunStatus::AwaitingApproval, 20))
        .is_err());
    assert_eq!(s.get("run_2").unwrap().unwrap().status, RunStatus::Running);
}

pub fn runs_cancel_in_each_state(b: &dyn Backend) {
    let s = b.open().runs;
    for id in ["run_q", "run_r", "run_f"] {
        new(&*s, &run(id, "hook", 0));
    }
    new(
        &*s,
        &RunRow {
            status: RunStatus::AwaitingApproval,
            ..run("run_w", "hook", 0)
        },
    );
    s.start("run_r", RunStatus::Queued, "a", 1)
        .unwrap()
        .unwrap();
    s.start("run_f", RunStatus::Queued, "a", 1)
        .unwrap()
        .unwrap();
    assert!(s
        .finish("run_f", "a", &ended(RunStatus::Succeeded, 2))
        .unwrap());
    let finished = s.get("run_f").unwrap().unwrap();

    for id in ["run_q", "run_w"] {
        let Some(Cancel::Cancelled(row)) = s.cancel(id, "not wanted", 50).unwrap() else {
            panic!("{id} is cancelled at once");
        };
        assert_eq!(row.status, RunStatus::Cancelled);
        assert_eq!(
            (row.ended_ms, row.error.as_deref()),
            (Some(50), Some("not wanted"))
        );
        assert_eq!(s.get(id).unwrap().as_ref(), Some(&row));
    }
    assert_eq!(
        s.claim("b", None, 100).unwrap(),
        None,
        "cancelled runs do not start"
    );

    // A running run is asked to stop, and stays its holder's until it does.
    for _ in 0..2 {
        let Some(Cancel::Requested(row)) = s.cancel("run_r", "stop", 60).unwrap() else {
            panic!("run_r is asked to stop");
        };
        assert_eq!(
            (row.status, row.cancel_requested),
            (RunStatus::Running, true)
        );
        assert_eq!((row.holder.as_deref(), row.ended_ms), (Some("a"), None));
        assert_eq!(s.get("run_r").unwrap().as_ref(), Some(&row));
    }
    assert!(s
        .finish("run_r", "a", &ended(RunStatus::Cancelled, 70))
        .unwrap());
    let stopped = s.get("run_r").unwrap().unwrap();
    assert_eq!(
        (stopped.status, stopped.cancel_requested),
        (RunStatus::Cancelled, false)
    );
    assert_eq!(
        s.cancel("run_r", "again", 80).unwrap(),
        Some(Cancel::Over(stopped.clone()))
    );
    assert_eq!(s.get("run_r").unwrap(), Some(stopped));

    // Over is over: nothing changes.
    assert_eq!(
        s.cancel("run_f", "too late", 90).unwrap(),
        Some(Cancel::Over(finished.clone()))
    );
    assert_eq!(s.get("run_f").unwrap(), Some(finished));
    assert_eq!(s.cancel("run_none", "nothing", 90).unwrap(), None);
}

pub fn runs_a_requeued_run_keeps_its_dead_letter_and_counts_on(b: &dyn Backend) {
    let s = b.open().runs;
    new(&*s, &run("run_1", "hook", 0));
    s.claim("a", None, 10).unwrap().unwrap();
    assert!(s.set_session("run_1", "a", "ses_1").unwrap());
    let letter = "{\"audit\":[1,2],\"stderr\":\"boom\"}";
    let killed = Finished {
        error: Some("wall clock limit".into()),
        limit: Some("wall_clock".into()),
        dead_letter: Some(letter.into()),
        ..ended(RunStatus::Killed, 20)
    };
    assert!(s.finish("run_1", "a", &killed).unwrap());
    let queued = s.requeue("run_1", 100).unwrap().unwrap();
    assert_eq!(queued.status, RunStatus::Queued);
    assert_eq!((queued.not_before_ms, queued.attempt), (100, 1));
    assert_eq!((&queued.holder, &queued.session), (&None, &None));
    assert_eq!(queued.dead_letter.as_deref(), Some(letter));
    assert_eq!(s.get("run_1").unwrap().as_ref(), Some(&queued));
    let letters = s
        .list(&RunFilter {
            dead_letters: true,
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(ids(&letters), ["run_1"]);
    assert_eq!(s.claim("b", None, 99).unwrap(), None);
    let again = s.claim("b", None, 100).unwrap().unwrap();
    assert_eq!(
        (again.attempt, again.dead_letter.as_deref()),
        (2, Some(letter))
    );
    // A run that has not ended is returned as it is.
    assert_eq!(s.requeue("run_1", 200).unwrap().as_ref(), Some(&again));
    assert_eq!(s.get("run_1").unwrap().as_ref(), Some(&again));
    new(&*s, &run("run_2", "hook", 0));
    let waiting = s.get("run_2").unwrap();
    assert_eq!(s.requeue("run_2", 200).unwrap(), waiting);
    assert_eq!(s.requeue("run_none", 200).unwrap(), None);
    // Whatever a final run carries, requeued it is nobody's and nothing is asked of it.
    new(
        &*s,
        &RunRow {
            status: RunStatus::Failed,
            holder: Some("a".into()),
            session: Some("ses_3".into()),
            cancel_requested: true,
            dead_letter: Some("{}".into()),
            not_before_ms: 0,
            ..run("run_3", "hook", 0)
        },
    );
    let requeued = s.requeue("run_3", 300).unwrap().unwrap();
    assert_eq!(
        (requeued.status, requeued.not_before_ms),
        (RunStatus::Queued, 300)
    );
    assert_eq!((requeued.holder, requeued.session), (None, None));
    assert!(!requeued.cancel_requested);
    assert_eq!(requeued.dead_letter.as_deref(), Some("{}"));
}

pub fn runs_checkpoints_survive_reopening(b: &dyn Backend) {
    {
        let s = b.open().runs;
        assert_eq!(s.checkpoint("run_1").unwrap(), None);
        s.save_checkpoint("run_1", &[0, 1, 2, 0xff, 0], 10).unwrap();
        s.save_checkpoint("run_1", b"second\0\xff", 20).unwrap();
        s.save_checkpoint("run_2", b"", 30).unwrap();
        assert_eq!(
            s.checkpoint("run_1").unwrap().as_deref(),
            Some(&b"second\0\xff"[..])
        );
    }
    let s = b.open().runs;
    assert_eq!(
        s.checkpoint("run_1").unwrap(),
        Some(b"second\0\xff".to_vec())
    );
    assert_eq!(s.checkpoint("run_2").unwrap(), Some(Vec::new()));
    assert_eq!(s.checkpoint("run_3").unwrap(), None);
}

pub fn runs_list_is_newest_first_and_filters(b: &dyn Backend) {
    let s = b.open().runs;
    for i in 0..101 {
        new(&*s, &run(&format!("run_{i:03}"), "hook", i));
    }
    // Two of one millisecond: the larger id first.
    new(&*s, &run("run_100b", "cron", 100));
    new(
        &*s,
        &RunRow {
            status: RunStatus::Failed,
            dead_letter: Some("{}".into()),
            ..run("run_dead", "cron", 50)
        },
    );
    let page = s.list(&RunFilter::default()).unwrap();
    assert_eq!(page.len(), 100, "100 when the filter names no limit");
    assert_eq!(
        ids(&page[..4]),
        ["run_100b", "run_100", "run_099", "run_098"]
    );
    assert!(page
        .windows(2)
        .all(|w| (w[0].created_ms, &w[0].id) > (w[1].created_ms, &w[1].id)));
    let three = s
        .list(&RunFilter {
            limit: Some(3),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(ids(&three), ["run_100b", "run_100", "run_099"]);
    assert_eq!(all(&*s).len(), 103, "a huge limit is clamped, not refused");
    let cron = s
        .list(&RunFilter {
            trigger: Some("cron".into()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(ids(&cron), ["run_100b", "run_dead"]);
    s.claim("a", Some("hook"), 1_000).unwrap().unwrap();
    let running = s
        .list(&RunFilter {
            status: Some(RunStatus::Running),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(ids(&running), ["run_000"]);
    let letters = |status, trigger: &str| {
        s.list(&RunFilter {
            status,
            trigger: Some(trigger.into()),
            dead_letters: true,
            limit: None,
        })
        .unwrap()
    };
    assert_eq!(ids(&letters(None, "cron")), ["run_dead"]);
    assert_eq!(ids(&letters(Some(RunStatus::Failed), "cron")), ["run_dead"]);
    assert!(letters(Some(RunStatus::Queued), "cron").is_empty());
    assert!(letters(None, "hook").is_empty());
}

pub fn runs_an_approved_run_is_released_once_into_the_queue(b: &dyn Backend) {
    let s = b.open().runs;
    new(
        &*s,
        &RunRow {
            status: RunStatus::AwaitingApproval,
            approval: Some("apr_1".into()),
            ..run("run_w", "hook", 0)
        },
    );
    new(&*s, &run("run_q", "hook", 0));
    // Not claimable while it waits for a human.
    assert_eq!(
        s.claim("a", Some("hook"), 10).unwrap().map(|r| r.id),
        Some("run_q".into())
    );
    assert!(s.claim("a", Some("hook"), 10).unwrap().is_none());
    let released = s.release("run_w", 20).unwrap().unwrap();
    assert_eq!(
        (released.status, released.not_before_ms),
        (RunStatus::Queued, 20)
    );
    assert_eq!(released.approval.as_deref(), Some("apr_1"));
    // Once: a second approval, or one of a run that is not waiting, moves nothing.
    assert!(s.release("run_w", 30).unwrap().is_none());
    assert!(s.release("run_q", 30).unwrap().is_none());
    assert!(s.release("nope", 30).unwrap().is_none());
    assert_eq!(
        s.claim("a", Some("hook"), 20).unwrap().map(|r| r.id),
        Some("run_w".into())
    );
}
