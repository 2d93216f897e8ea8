//! The audit chain's part of the store suite: appends only onto the given tip, queries,
//! whole scans in order.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use super::Backend;
use crate::audit::{AppendError, AuditQuery, AuditRow, Tip, ADOPT_MAX};

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

pub fn audit_an_append_after_takes_on_other_writers_rows_under_its_lock(b: &dyn Backend) {
    let (mine, theirs) = (b.open().audit, b.open().audit);
    let genesis = Tip::genesis();
    // Nothing appended since: the seal sees no rows of others.
    let rows = mine
        .append_after(&genesis, &mut |foreign| {
            assert!(foreign.is_empty(), "{foreign:?}");
            Ok(vec![audit_row(1, &genesis.hash, Some("a"), "allow")])
        })
        .unwrap();
    assert_eq!(rows.len(), 1);
    let one = Tip {
        seq: 1,
        hash: "h1".into(),
    };
    // Another writer appends two: the next append is handed them, in order, and its
    // rows go after them.
    theirs
        .append(
            &one,
            &[
                audit_row(2, "h1", None, "deny"),
                audit_row(3, "h2", None, "allow"),
            ],
        )
        .unwrap();
    let mut seen = Vec::new();
    mine.append_after(&one, &mut |foreign| {
        seen = foreign.iter().map(|r| r.seq).collect();
        Ok(vec![audit_row(4, "h3", None, "allow")])
    })
    .unwrap();
    assert_eq!(seen, [2, 3]);
    let four = Tip {
        seq: 4,
        hash: "h4".into(),
    };
    assert_eq!(mine.last().unwrap(), Some(four.clone()));
    // A seal that refuses the others' rows writes nothing, and says why.
    let refused = mine.append_after(&one, &mut |_| Err("record 2 does not match".into()));
    assert!(
        matches!(&refused, Err(AppendError::Refused(why)) if why == "record 2 does not match"),
        "{refused:?}"
    );
    assert_eq!(mine.last().unwrap(), Some(four.clone()));
    // A chain that ends before the tip (rows lost) is refused before the seal runs.
    let ahead = Tip {
        seq: 9,
        hash: "h9".into(),
    };
    let moved = mine.append_after(&ahead, &mut |_| panic!("sealed over a lost tail"));
    assert!(
        matches!(
            moved,
            Err(AppendError::Moved {
                expected: 9,
                found: 4
            })
        ),
        "{moved:?}"
    );
    // As is one that ends differently at the tip (a fork).
    let forked = Tip {
        seq: 4,
        hash: "other".into(),
    };
    let moved = mine.append_after(&forked, &mut |_| panic!("sealed over a fork"));
    assert!(matches!(moved, Err(AppendError::Moved { .. })), "{moved:?}");
    // Too many rows of others to read under the lock: the caller catches up outside it.
    let mut tip = four;
    let rows: Vec<AuditRow> = (5..=5 + ADOPT_MAX)
        .map(|seq| audit_row(seq, &format!("h{}", seq - 1), None, "allow"))
        .collect();
    theirs.append(&tip, &rows).unwrap();
    let behind = mine.append_after(&tip, &mut |_| panic!("read too many under the lock"));
    assert!(
        matches!(behind, Err(AppendError::Behind { expected: 4, .. })),
        "{behind:?}"
    );
    tip = mine.last().unwrap().unwrap();
    assert_eq!(tip.seq, 5 + ADOPT_MAX);
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
    // The newest row of a decision: the last one, whole.
    let last = s.last_decided("allow").unwrap().unwrap();
    assert_eq!((last.seq, last.hash.as_str()), (4, "h4"));
    assert_eq!(last.record, "{\"seq\":4}");
    assert_eq!(s.last_decided("deny").unwrap().unwrap().seq, 6);
    assert_eq!(s.last_decided("checkpoint").unwrap(), None);
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

/// Batches of every size around a backend's statement of several rows (SQLite inserts 16 at
/// a time, the rest one by one) come back whole: every column of every row where it was put,
/// in order.
pub fn audit_appends_of_every_size_keep_each_rows_columns(b: &dyn Backend) {
    let s = b.open().audit;
    let mut tip = Tip::genesis();
    let mut appended = Vec::new();
    for size in [1, 15, 16, 17, 31, 32, 33, 48] {
        let rows: Vec<AuditRow> = (1..=size)
            .map(|i| {
                let seq = tip.seq + i;
                let prev = appended
                    .last()
                    .map_or(tip.hash.clone(), |r: &AuditRow| r.hash.clone());
                let session = (seq % 3 != 0).then(|| format!("ses_{seq}"));
                let decision = ["allow", "deny", "error"][usize::try_from(seq % 3).unwrap()];
                let row = AuditRow {
                    ts_ms: 1_000_000 + seq * 7,
                    record: format!("{{\"seq\":{seq},\"size\":{size}}}"),
                    ..audit_row(seq, &prev, session.as_deref(), decision)
                };
                appended.push(row.clone());
                row
            })
            .collect();
        s.append(&tip, &rows).unwrap();
        let last = rows.last().unwrap();
        tip = Tip {
            seq: last.seq,
            hash: last.hash.clone(),
        };
    }
    let mut read = Vec::new();
    s.scan(0, &mut |row| {
        read.push(row);
        true
    })
    .unwrap();
    assert_eq!(read.len(), 193);
    assert_eq!(read, appended);
}
