//! Runs' holders in the store suite: recovery at start-up ends only the dead holder's
//! running runs, and a holder whose lease lapsed loses its runs to a live one.

use super::runs::*;
use super::Backend;
use crate::runs::*;

pub fn runs_recover_ends_only_the_dead_holders_running_runs(b: &dyn Backend) {
    let s = b.open().runs;
    for id in ["run_1", "run_2", "run_3", "run_4", "run_5"] {
        new(&*s, &run(id, "hook", 0));
    }
    for (id, holder) in [
        ("run_1", "dead"),
        ("run_2", "dead"),
        ("run_3", "alive"),
        ("run_5", "dead"),
    ] {
        s.start(id, RunStatus::Queued, holder, 1).unwrap().unwrap();
    }
    assert!(s.set_session("run_2", "dead", "ses_2").unwrap());
    assert!(s
        .finish("run_5", "dead", &ended(RunStatus::Succeeded, 2))
        .unwrap());
    let untouched: Vec<RunRow> = ["run_3", "run_4", "run_5"]
        .iter()
        .map(|id| s.get(id).unwrap().unwrap())
        .collect();
    let letter = |row: &RunRow| format!("{{\"run\":\"{}\",\"session\":{:?}}}", row.id, row.session);
    let mut recovered = s
        .recover("dead", "replica dead restarted", 100, &letter)
        .unwrap();
    recovered.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(ids(&recovered), ["run_1", "run_2"]);
    for row in &recovered {
        assert_eq!(row.status, RunStatus::Killed);
        assert_eq!(row.ended_ms, Some(100));
        assert_eq!(row.error.as_deref(), Some("replica dead restarted"));
        assert_eq!(row.dead_letter.as_ref(), Some(&letter(row)));
        assert_eq!(
            s.get(&row.id).unwrap().as_ref(),
            Some(row),
            "returned as stored"
        );
    }
    assert_eq!(
        recovered[1].dead_letter.as_deref(),
        Some("{\"run\":\"run_2\",\"session\":Some(\"ses_2\")}")
    );
    for row in &untouched {
        assert_eq!(s.get(&row.id).unwrap().as_ref(), Some(row));
    }
    assert!(s.recover("dead", "again", 200, &letter).unwrap().is_empty());
    assert_eq!(s.running("hook").unwrap(), 1);
}

pub fn runs_a_lapsed_holders_runs_are_reclaimed_and_a_live_ones_kept(b: &dyn Backend) {
    use crate::runs::UNRENEWED_LEASE_MS;
    let (one, two) = (b.open().runs, b.open().runs);
    for id in ["run_a", "run_b", "run_c"] {
        new(&*one, &run(id, "hook", 0));
    }
    // Replica a takes two, replica b one; only a renews.
    let a1 = one.claim("a", None, 1_000).unwrap().unwrap();
    let a2 = one.claim("a", None, 1_000).unwrap().unwrap();
    let b1 = two.claim("b", None, 1_000).unwrap().unwrap();
    assert_eq!(one.renew("a", 100_000).unwrap(), 2);
    assert_eq!(two.renew("nobody", 100_000).unwrap(), 0);
    // Before b's unrenewed lease ends, nothing is reclaimed.
    let letter = |row: &RunRow| format!("letter of {}", row.id);
    assert!(one
        .reclaim(1_000 + UNRENEWED_LEASE_MS - 1, "lapsed", &letter)
        .unwrap()
        .is_empty());
    // After it, b's run is, a's are not.
    let reclaimed = two
        .reclaim(1_000 + UNRENEWED_LEASE_MS + 1, "lapsed", &letter)
        .unwrap();
    assert_eq!(reclaimed.len(), 1);
    let gone = &reclaimed[0];
    assert_eq!(
        (gone.id.as_str(), gone.status),
        (b1.id.as_str(), RunStatus::Killed)
    );
    assert_eq!(gone.error.as_deref(), Some("lapsed"));
    assert_eq!(
        gone.dead_letter.as_deref(),
        Some(format!("letter of {}", b1.id).as_str())
    );
    for kept in [&a1, &a2] {
        assert_eq!(
            one.get(&kept.id).unwrap().unwrap().status,
            RunStatus::Running
        );
    }
    // b can no longer finish what was taken from it.
    assert!(!two
        .finish(&b1.id, "b", &ended(RunStatus::Succeeded, 70_000))
        .unwrap());
    // a's lease ends too, unless renewed.
    assert!(one.reclaim(99_999, "lapsed", &letter).unwrap().is_empty());
    assert_eq!(one.reclaim(100_001, "lapsed", &letter).unwrap().len(), 2);
}
