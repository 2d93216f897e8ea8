//! What bounds a trigger's runs, in the store suite: a one-at-a-time trigger never has two
//! runs running and a trigger's rate is one for all the stores sharing it (also when they
//! race); the sweep deletes expired keys and the checkpoints of runs long ended, never a
//! running run's.

use super::runs::{all, at_once, ended, key, new, retry, run, sorted_ids};
use super::Backend;
use crate::runs::{Enqueued, RateLimit, RunRow, RunStatus, RunStore, Swept};

/// A queued run of `trigger` made at `created_ms`, through `enqueue` with `rate`.
fn rated(s: &dyn RunStore, id: &str, trigger: &str, created_ms: i64, rate: RateLimit) -> Enqueued {
    s.enqueue(&run(id, trigger, created_ms), None, Some(rate), created_ms)
        .unwrap()
}

pub fn runs_a_serial_trigger_is_claimed_only_while_none_of_its_runs_runs(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    new(&*one, &run("run_n1", "nightly", 10));
    new(&*one, &run("run_n2", "nightly", 20));
    new(&*one, &run("run_h1", "hook", 30));
    let first = one.claim_serial("a", "nightly", 100).unwrap().unwrap();
    assert_eq!(
        (first.id.as_str(), first.status),
        ("run_n1", RunStatus::Running)
    );
    assert_eq!((first.attempt, first.started_ms), (1, Some(100)));
    assert_eq!(
        one.get("run_n1").unwrap().as_ref(),
        Some(&first),
        "as stored"
    );
    // Whoever asks, and whoever holds the running one.
    assert_eq!(two.claim_serial("b", "nightly", 200).unwrap(), None);
    assert_eq!(one.claim_serial("a", "nightly", 200).unwrap(), None);
    assert_eq!(
        one.get("run_n2").unwrap().unwrap().status,
        RunStatus::Queued,
        "it waits its turn"
    );
    // Another trigger's runs are not held back.
    let hook = two.claim_serial("b", "hook", 200).unwrap().unwrap();
    assert_eq!(hook.id, "run_h1");
    // Its run ended (by a clock ahead of the next claimer's): the next one starts, recorded
    // as starting no earlier than that end.
    assert!(one
        .finish("run_n1", "a", &ended(RunStatus::Succeeded, 500))
        .unwrap());
    let next = two.claim_serial("b", "nightly", 400).unwrap().unwrap();
    assert_eq!((next.id.as_str(), next.started_ms), ("run_n2", Some(500)));
    assert_eq!(next.holder.as_deref(), Some("b"));
    // A retry waits behind the running one too, and is started once it ended.
    assert!(two.finish("run_n2", "b", &retry(600, 550)).unwrap());
    new(&*one, &run("run_n3", "nightly", 560));
    let third = one.claim_serial("a", "nightly", 700).unwrap().unwrap();
    assert_eq!((third.id.as_str(), third.started_ms), ("run_n2", Some(700)));
    assert_eq!(two.claim_serial("b", "nightly", 800).unwrap(), None);
    assert_eq!(one.running("nightly").unwrap(), 1);
    // Nothing due, nothing claimed.
    assert_eq!(one.claim_serial("a", "none", 800).unwrap(), None);
}

pub fn runs_two_stores_claiming_a_serial_trigger_at_once_start_one_run(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    for i in 0..40 {
        new(&*one, &run(&format!("run_{i:02}"), "nightly", i));
    }
    for round in 0..20 {
        let claimed = at_once(&*one, &*two, |s, holder| {
            s.claim_serial(holder, "nightly", 1_000 + round).unwrap()
        });
        let started: Vec<&RunRow> = claimed.iter().flatten().collect();
        assert_eq!(started.len(), 1, "round {round}: {claimed:?}");
        assert_eq!(one.running("nightly").unwrap(), 1, "round {round}");
        let run = started[0];
        let holder = run.holder.as_deref().unwrap();
        assert!(one
            .finish(&run.id, holder, &ended(RunStatus::Succeeded, 1_000 + round))
            .unwrap());
    }
}

pub fn runs_a_triggers_rate_is_one_for_every_store_and_a_duplicate_spends_none(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    // Two a minute: a burst of two, then one every 30 s.
    let rate = RateLimit {
        count: 2,
        per_ms: 60_000,
    };
    let with_key = |s: &dyn RunStore, id: &str, k: &str, now: i64| {
        s.enqueue(
            &run(id, "hook", now),
            key(k, now + 3_600_000),
            Some(rate),
            now,
        )
        .unwrap()
    };
    assert_eq!(with_key(&*one, "run_1", "k1", 0), Enqueued::New);
    assert_eq!(with_key(&*two, "run_2", "k2", 10), Enqueued::New);
    // Spent, through either store: nothing stored, and the key not taken.
    let limited = Enqueued::RateLimited {
        retry_after_ms: 29_980,
    };
    assert_eq!(with_key(&*one, "run_3", "k3", 20), limited);
    assert_eq!(with_key(&*two, "run_3", "k3", 20), limited);
    assert_eq!(one.get("run_3").unwrap(), None);
    // A duplicate is answered as one, and spends nothing, even with the rate spent.
    assert_eq!(
        with_key(&*two, "run_x", "k1", 20),
        Enqueued::Duplicate("run_1".into())
    );
    // Another trigger's rate is its own.
    assert_eq!(rated(&*two, "run_c1", "cron", 20, rate), Enqueued::New);
    assert_eq!(
        with_key(&*one, "run_3", "k3", 29_999),
        Enqueued::RateLimited { retry_after_ms: 1 }
    );
    // One run back after 30 s; the refused delivery's key is free.
    assert_eq!(with_key(&*one, "run_3", "k3", 30_000), Enqueued::New);
    assert_eq!(
        rated(&*two, "run_4", "hook", 30_000, rate),
        Enqueued::RateLimited {
            retry_after_ms: 30_000
        }
    );
    // A run that cannot be stored (its id is taken) spends nothing.
    assert!(one
        .enqueue(&run("run_1", "hook", 60_010), None, Some(rate), 60_010)
        .is_err());
    assert_eq!(rated(&*two, "run_5", "hook", 60_010, rate), Enqueued::New);
    // Without a rate nothing is counted (runs made by the store's other callers).
    new(&*one, &run("run_6", "hook", 60_010));
    assert_eq!(
        sorted_ids(&*one),
        ["run_1", "run_2", "run_3", "run_5", "run_6", "run_c1"]
    );
}

pub fn runs_two_stores_racing_on_one_rate_store_no_more_than_it(b: &dyn Backend) {
    let (one, two) = (b.open().runs, b.open().runs);
    let rate = RateLimit {
        count: 7,
        per_ms: 3_600_000,
    };
    let outcomes: Vec<Enqueued> = at_once(&*one, &*two, |s, who| {
        (0..10)
            .map(|i| rated(s, &format!("run_{who}_{i}"), "hook", 1_000 + i, rate))
            .collect::<Vec<_>>()
    })
    .concat();
    let admitted = outcomes.iter().filter(|o| **o == Enqueued::New).count();
    assert_eq!(admitted, 7, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Enqueued::New | Enqueued::RateLimited { .. })),
        "{outcomes:?}"
    );
    assert_eq!(all(&*one).len(), 7);
}

pub fn runs_the_sweep_takes_expired_keys_and_long_ended_runs_checkpoints(b: &dyn Backend) {
    let s = b.open().runs;
    let enq = |id: &str, k: &str, expires_ms: i64, now: i64| {
        s.enqueue(&run(id, "hook", now), key(k, expires_ms), None, now)
            .unwrap()
    };
    assert_eq!(enq("run_live", "live", 2_000, 0), Enqueued::New);
    assert_eq!(enq("run_dead", "dead", 1_000, 0), Enqueued::New);
    // Expired at its own millisecond, as the enqueue reads it.
    let swept = s.sweep(1_000, 0).unwrap();
    assert_eq!(
        swept,
        Swept {
            dedup_keys: 1,
            checkpoints: 0
        }
    );
    assert_eq!(s.sweep(1_000, 0).unwrap(), Swept::default(), "once");
    assert_eq!(
        enq("run_x", "live", 9_000, 1_500),
        Enqueued::Duplicate("run_live".into()),
        "a live key is kept"
    );
    assert_eq!(enq("run_y", "dead", 9_000, 1_500), Enqueued::New);

    // Runs in each state, each with a checkpoint.
    let done = |id: &str, status, at| {
        new(&*s, &run(id, "hook", 0));
        s.start(id, RunStatus::Queued, "a", 1).unwrap().unwrap();
        assert!(s.finish(id, "a", &ended(status, at)).unwrap());
    };
    done("run_old", RunStatus::Succeeded, 100);
    done("run_old_failed", RunStatus::Failed, 200);
    done("run_recent", RunStatus::Succeeded, 50_000);
    // Running now, its last attempt ended long ago.
    new(&*s, &run("run_going", "hook", 0));
    s.start("run_going", RunStatus::Queued, "a", 1)
        .unwrap()
        .unwrap();
    assert!(s.finish("run_going", "a", &retry(150, 100)).unwrap());
    s.start("run_going", RunStatus::Queued, "b", 200)
        .unwrap()
        .unwrap();
    // Waiting for its retry, its attempt ended long ago.
    new(&*s, &run("run_retry", "hook", 0));
    s.start("run_retry", RunStatus::Queued, "a", 1)
        .unwrap()
        .unwrap();
    assert!(s.finish("run_retry", "a", &retry(1_000_000, 100)).unwrap());
    new(&*s, &run("run_queued", "hook", 0));
    let all_ids = [
        "run_old",
        "run_old_failed",
        "run_recent",
        "run_going",
        "run_retry",
        "run_queued",
        "run_nowhere",
    ];
    for id in all_ids {
        s.save_checkpoint(id, id.as_bytes(), 10).unwrap();
    }
    let swept = s.sweep(100_000, 10_000).unwrap();
    assert_eq!(swept.checkpoints, 2, "{swept:?}");
    let kept = |id: &str| s.checkpoint(id).unwrap().is_some();
    assert!(!kept("run_old") && !kept("run_old_failed"));
    for id in [
        "run_recent",
        "run_going",
        "run_retry",
        "run_queued",
        "run_nowhere",
    ] {
        assert!(kept(id), "{id}");
    }
    // Whatever the retention, a run that has not ended keeps its checkpoint.
    let swept = b.open().runs.sweep(i64::MAX, i64::MAX).unwrap();
    assert_eq!(swept.checkpoints, 1, "{swept:?}");
    assert!(!kept("run_recent"));
    for id in ["run_going", "run_retry", "run_queued", "run_nowhere"] {
        assert_eq!(s.checkpoint(id).unwrap().as_deref(), Some(id.as_bytes()));
    }
    assert_eq!(
        s.get("run_going").unwrap().unwrap().status,
        RunStatus::Running
    );
}
