//! The undo journal's part of the store suite: entries come back as recorded, a session's
//! newest first; an id is recorded once; only a claimable entry is claimed, once per try,
//! also when two replicas race; only a running entry is finished.

use std::collections::BTreeSet;
use std::sync::Barrier;

use super::Backend;
use crate::undo::{NewUndo, UndoRow, UndoStatus, UndoStore};

/// A pending entry of `session` with a request to send.
fn pending<'a>(id: &'a str, session: &'a str, recorded_ms: i64) -> NewUndo<'a> {
    NewUndo {
        id,
        session,
        recorded_ms,
        tool: "github.create_issue",
        tier: "write",
        subject: r#"{"agent":"planner","tenant":"acme"}"#,
        args: r#"{"repo":"acme/app","title":"hi"}"#,
        request: Some(
            r#"{"method":"PATCH","url":"https://api.github.com/x","body":{"state":"closed"}}"#,
        ),
        status: UndoStatus::Pending,
        detail: None,
    }
}

/// What `entry` should come back as, numbered `seq`, never tried.
fn kept(entry: &NewUndo<'_>, seq: i64) -> UndoRow {
    UndoRow {
        id: entry.id.into(),
        seq,
        session: entry.session.into(),
        recorded_ms: entry.recorded_ms,
        tool: entry.tool.into(),
        tier: entry.tier.into(),
        subject: entry.subject.into(),
        args: entry.args.into(),
        request: entry.request.map(Into::into),
        status: entry.status,
        detail: entry.detail.map(Into::into),
        attempts: 0,
        finished_ms: None,
    }
}

fn one(s: &dyn UndoStore, session: &str, id: &str) -> UndoRow {
    s.list(session, i64::MIN)
        .unwrap()
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} not in {session}"))
}

fn ids(rows: &[UndoRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

pub fn undo_a_row_comes_back_with_every_field_as_stored(b: &dyn Backend) {
    let s = b.open().undo;
    assert!(s.list("s1", 0).unwrap().is_empty());
    let sent = pending("req_1", "s1", 1_000);
    let unavailable = NewUndo {
        request: None,
        status: UndoStatus::Unavailable,
        detail: Some("the response had no `number` to close the issue by"),
        ..pending("req_2", "s1", 2_000)
    };
    s.record(&sent).unwrap();
    s.record(&unavailable).unwrap();
    // Read back by another store (a restart, another replica).
    let rows = b.open().undo.list("s1", 0).unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (second, first) = (&rows[0], &rows[1]);
    assert!(second.seq > first.seq, "{rows:?}");
    assert_eq!(first, &kept(&sent, first.seq));
    assert_eq!(second, &kept(&unavailable, second.seq));
}

pub fn undo_list_is_newest_first_and_filters_by_session_and_time(b: &dyn Backend) {
    let s = b.open().undo;
    // Recorded out of clock order (two replicas' clocks): the order is the recording's.
    s.record(&pending("a1", "a", 100)).unwrap();
    s.record(&pending("b1", "b", 150)).unwrap();
    s.record(&pending("a2", "a", 300)).unwrap();
    s.record(&pending("a3", "a", 200)).unwrap();
    assert_eq!(ids(&s.list("a", 0).unwrap()), ["a3", "a2", "a1"]);
    assert_eq!(ids(&s.list("b", 0).unwrap()), ["b1"]);
    // At or after `since_ms`.
    assert_eq!(ids(&s.list("a", 200).unwrap()), ["a3", "a2"]);
    assert_eq!(ids(&s.list("a", 201).unwrap()), ["a2"]);
    assert!(s.list("a", 301).unwrap().is_empty());
    assert!(s.list("nobody", 0).unwrap().is_empty());
    let seqs: Vec<i64> = s.list("a", 0).unwrap().iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
}

pub fn undo_recording_an_id_twice_keeps_the_first(b: &dyn Backend) {
    let s = b.open().undo;
    let first = pending("req_1", "s1", 100);
    s.record(&first).unwrap();
    let before = one(&*s, "s1", "req_1");
    // A retried call recording again, even with other content or another session.
    s.record(&NewUndo {
        request: None,
        status: UndoStatus::Unavailable,
        detail: Some("other"),
        ..pending("req_1", "s2", 500)
    })
    .unwrap();
    assert_eq!(s.list("s1", 0).unwrap(), [kept(&first, before.seq)]);
    assert!(s.list("s2", 0).unwrap().is_empty());
    // Nor does it reset a claimed entry.
    assert!(s.claim("req_1").unwrap());
    s.record(&first).unwrap();
    let after = one(&*s, "s1", "req_1");
    assert_eq!((after.status, after.attempts), (UndoStatus::Running, 1));
}

pub fn undo_claim_takes_only_claimable_entries_and_counts_attempts(b: &dyn Backend) {
    let s = b.open().undo;
    s.record(&pending("p", "s", 1)).unwrap();
    s.record(&NewUndo {
        request: None,
        status: UndoStatus::Unavailable,
        detail: Some("too large"),
        ..pending("u", "s", 2)
    })
    .unwrap();
    assert!(!s.claim("nobody").unwrap());
    assert!(!s.claim("u").unwrap(), "unavailable: nothing to send, ever");
    assert!(s.claim("p").unwrap());
    assert!(!s.claim("p").unwrap(), "running: claimed once");
    let row = one(&*s, "s", "p");
    assert_eq!((row.status, row.attempts), (UndoStatus::Running, 1));

    // Failed and refused are tried again, each try counted.
    assert!(s.finish("p", UndoStatus::Failed, "502", 10).unwrap());
    assert!(s.claim("p").unwrap());
    assert!(s.finish("p", UndoStatus::Refused, "policy x", 20).unwrap());
    assert!(s.claim("p").unwrap());
    assert_eq!(one(&*s, "s", "p").attempts, 3);
    // Done is never tried again.
    assert!(s.finish("p", UndoStatus::Done, "200", 30).unwrap());
    assert!(!s.claim("p").unwrap());
    let row = one(&*s, "s", "p");
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.detail.as_deref(),
            row.finished_ms
        ),
        (UndoStatus::Done, 3, Some("200"), Some(30))
    );
    let u = one(&*s, "s", "u");
    assert_eq!((u.status, u.attempts), (UndoStatus::Unavailable, 0));
}

pub fn undo_finish_moves_only_a_running_entry(b: &dyn Backend) {
    let s = b.open().undo;
    s.record(&pending("p", "s", 1)).unwrap();
    assert!(!s.finish("nobody", UndoStatus::Done, "200", 5).unwrap());
    // Not claimed: a finish without a claim sent nothing, and records nothing.
    assert!(!s.finish("p", UndoStatus::Done, "200", 5).unwrap());
    assert_eq!(
        one(&*s, "s", "p"),
        kept(&pending("p", "s", 1), one(&*s, "s", "p").seq)
    );
    assert!(s.claim("p").unwrap());
    assert!(s
        .finish("p", UndoStatus::Failed, "upstream 503", 7)
        .unwrap());
    // Finished once: a late second finish (another replica's) leaves the first's result.
    assert!(!s.finish("p", UndoStatus::Done, "200", 8).unwrap());
    let row = one(&*s, "s", "p");
    assert_eq!(
        (
            row.status,
            row.detail.as_deref(),
            row.finished_ms,
            row.attempts
        ),
        (UndoStatus::Failed, Some("upstream 503"), Some(7), 1)
    );
    // Another store sees it as it was left.
    assert_eq!(one(&*b.open().undo, "s", "p"), row);
}

pub fn undo_two_stores_claiming_at_once_win_each_entry_once(b: &dyn Backend) {
    let (one_store, two_store) = (b.open().undo, b.open().undo);
    let ids: Vec<String> = (0..20).map(|i| format!("req_{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        one_store
            .record(&pending(id, "s", i64::try_from(i).unwrap()))
            .unwrap();
    }
    let barrier = Barrier::new(2);
    let won: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = [&*one_store, &*two_store]
            .into_iter()
            .map(|s| {
                let (barrier, ids) = (&barrier, &ids);
                scope.spawn(move || {
                    barrier.wait();
                    // Both walk the session newest first, as an undo does.
                    ids.iter()
                        .rev()
                        .filter(|id| s.claim(id).unwrap())
                        .cloned()
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: usize = won.iter().map(Vec::len).sum();
    let distinct: BTreeSet<&String> = won.iter().flatten().collect();
    assert_eq!(total, 20, "{won:?}");
    assert_eq!(distinct.len(), 20, "an entry was claimed twice: {won:?}");
    for row in one_store.list("s", 0).unwrap() {
        assert_eq!(
            (row.status, row.attempts),
            (UndoStatus::Running, 1),
            "{row:?}"
        );
    }
}
