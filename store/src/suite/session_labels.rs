//! Session labels ([`crate::sessions::SessionStore::add_labels`]): what a session touched,
//! kept for its life, seen by every store on the database, inherited by a child.

use super::Backend;

fn labels(v: &[&str]) -> Vec<String> {
    v.iter().map(|l| (*l).to_owned()).collect()
}

pub fn session_labels_only_grow_are_shared_and_pass_to_a_child(b: &dyn Backend) {
    let s = b.open().sessions;
    assert!(s.labels("root").unwrap().is_empty(), "none before any");
    s.add_labels("root", &labels(&["untrusted_input"]), 10)
        .unwrap();
    // A label again, with others: kept once; an empty list adds nothing.
    s.add_labels("root", &labels(&["private_data", "untrusted_input"]), 20)
        .unwrap();
    s.add_labels("root", &[], 30).unwrap();
    // Another store on the same database (another replica) sees them, sorted.
    let other = b.open().sessions;
    assert_eq!(
        other.labels("root").unwrap(),
        labels(&["private_data", "untrusted_input"])
    );
    // A child gets its parent's labels as they are at the spawn, and its own stay its own.
    other.inherit_labels("root", "child", 40).unwrap();
    assert_eq!(
        s.labels("child").unwrap(),
        labels(&["private_data", "untrusted_input"])
    );
    s.add_labels("child", &labels(&["external"]), 50).unwrap();
    assert_eq!(
        s.labels("child").unwrap(),
        labels(&["external", "private_data", "untrusted_input"])
    );
    assert_eq!(
        s.labels("root").unwrap().len(),
        2,
        "a child's label is not its parent's"
    );
    // Inheriting again (a retried spawn) changes nothing; a parent without labels gives none.
    s.inherit_labels("root", "child", 60).unwrap();
    assert_eq!(s.labels("child").unwrap().len(), 3);
    s.inherit_labels("nobody", "orphan", 60).unwrap();
    assert!(s.labels("orphan").unwrap().is_empty());
    // Reopened (a restart), nothing is lost.
    assert_eq!(b.open().sessions.labels("child").unwrap().len(), 3);
}
