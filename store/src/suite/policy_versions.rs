//! The history of live policy sets: one row per set, newest first, what a reload and a
//! start-up replace, and a set that comes back.

use super::Backend;
use crate::policy_versions::{Replaces, VersionRow, WentLive};

fn live<'a>(version: &'a str, at_ms: i64, replaces: Replaces<'a>) -> WentLive<'a> {
    WentLive {
        version,
        policies: 3,
        tools: 1,
        at_ms,
        replaces,
    }
}

fn row(version: &str, first: i64, last: i64, replaced: Option<i64>) -> VersionRow {
    VersionRow {
        version: version.into(),
        first_live_ms: first,
        last_live_ms: last,
        replaced_ms: replaced,
        policies: 3,
        tools: 1,
    }
}

pub fn policy_versions_record_what_was_live_and_when(b: &dyn Backend) {
    let s = b.open().policy_versions;
    assert!(s.list(10).unwrap().is_empty());
    s.went_live(&live("sha256:v1", 100, Replaces::AllOthers))
        .unwrap();
    // A second replica starting with the same files: still one row.
    s.went_live(&live("sha256:v1", 150, Replaces::Nothing))
        .unwrap();
    assert_eq!(s.list(10).unwrap(), [row("sha256:v1", 100, 150, None)]);

    // A reload to v2 replaces v1.
    s.went_live(&live("sha256:v2", 200, Replaces::Version("sha256:v1")))
        .unwrap();
    assert_eq!(
        s.list(10).unwrap(),
        [
            row("sha256:v2", 200, 200, None),
            row("sha256:v1", 100, 150, Some(200)),
        ]
    );
    // A reload that loads the same files again replaces nothing.
    s.went_live(&live("sha256:v2", 250, Replaces::Version("sha256:v2")))
        .unwrap();
    assert_eq!(s.list(10).unwrap()[0], row("sha256:v2", 200, 250, None));

    // Back to v1's files: it is live again (newest first), its first time kept.
    s.went_live(&live("sha256:v1", 300, Replaces::Version("sha256:v2")))
        .unwrap();
    assert_eq!(
        s.list(10).unwrap(),
        [
            row("sha256:v1", 100, 300, None),
            row("sha256:v2", 200, 250, Some(300)),
        ]
    );
    assert_eq!(s.list(1).unwrap().len(), 1);

    // The only process of its database starts with v3: whatever it served is replaced.
    let reopened = b.open().policy_versions;
    reopened
        .went_live(&live("sha256:v3", 400, Replaces::AllOthers))
        .unwrap();
    assert_eq!(
        reopened.list(10).unwrap(),
        [
            row("sha256:v3", 400, 400, None),
            row("sha256:v1", 100, 300, Some(400)),
            // Replaced before: its time stays.
            row("sha256:v2", 200, 250, Some(300)),
        ]
    );
}
