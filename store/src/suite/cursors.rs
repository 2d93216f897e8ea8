//! Export cursors: one holder at a time, moves only from where they were read, resets win
//! over deliveries in flight, and everything survives reopening.

use super::Backend;

pub fn cursors_one_holder_at_a_time_and_a_lapsed_lease_passes_on(b: &dyn Backend) {
    let (one, two) = (b.open().cursors, b.open().cursors);
    // Made at the start position by the first claim.
    assert_eq!(one.claim("siem", "a", 0, 1_000, 2_000).unwrap(), Some(0));
    // Another holder waits while the lease runs; the holder renews it.
    assert_eq!(two.claim("siem", "b", 0, 1_500, 2_500).unwrap(), None);
    assert_eq!(one.claim("siem", "a", 0, 1_900, 3_000).unwrap(), Some(0));
    assert_eq!(two.claim("siem", "b", 0, 2_999, 4_000).unwrap(), None);
    // Lapsed: the other takes it, and the first may no longer move it.
    assert_eq!(two.claim("siem", "b", 0, 3_001, 5_000).unwrap(), Some(0));
    assert!(!one.advance("siem", "a", 0, 10, 3_002).unwrap());
    assert!(two.advance("siem", "b", 0, 10, 3_002).unwrap());
    // Released: taken at once, wherever it stands.
    two.release("siem", "b").unwrap();
    assert_eq!(one.claim("siem", "a", 0, 3_003, 6_000).unwrap(), Some(10));
    // Cursors are independent by name; a new one starts where it is told.
    assert_eq!(two.claim("other", "b", 42, 3_003, 6_000).unwrap(), Some(42));
}

pub fn cursors_move_only_from_where_they_were_read_and_count_what_was_delivered(b: &dyn Backend) {
    let s = b.open().cursors;
    assert!(s.get("siem").unwrap().is_none());
    assert_eq!(s.claim("siem", "a", 0, 1, 100).unwrap(), Some(0));
    assert!(s.advance("siem", "a", 0, 5, 2).unwrap());
    // A second delivery of the same batch (read before the first moved it) moves nothing.
    assert!(!s.advance("siem", "a", 0, 5, 3).unwrap());
    s.failed("siem", "a", "503 from the receiver", 4).unwrap();
    let c = s.get("siem").unwrap().unwrap();
    assert_eq!((c.seq, c.delivered, c.holder.as_str()), (5, 5, "a"));
    assert_eq!(c.last_error.as_deref(), Some("503 from the receiver"));
    assert_eq!(c.failed_ms, Some(4));
    // A failure is forgotten by the next delivery.
    assert!(s.advance("siem", "a", 5, 7, 5).unwrap());
    let c = s.get("siem").unwrap().unwrap();
    assert_eq!((c.seq, c.delivered, c.updated_ms), (7, 7, 5));
    assert_eq!((c.last_error, c.failed_ms), (None, None));
    // Only the holder notes failures.
    s.failed("siem", "b", "not mine", 6).unwrap();
    assert_eq!(s.get("siem").unwrap().unwrap().last_error, None);
}

pub fn cursors_a_reset_wins_over_a_delivery_in_flight_and_survives_reopening(b: &dyn Backend) {
    let s = b.open().cursors;
    assert_eq!(s.claim("siem", "a", 0, 1, 100).unwrap(), Some(0));
    assert!(s.advance("siem", "a", 0, 50, 2).unwrap());
    // The operator replays from record 11 while a batch 50..60 is on its way.
    s.reset("siem", 10, 3).unwrap();
    assert!(!s.advance("siem", "a", 50, 60, 4).unwrap());
    // The holder keeps its lease and reads the new position on its next claim.
    assert_eq!(s.claim("siem", "a", 0, 5, 100).unwrap(), Some(10));
    // A reset of a cursor that does not exist makes it.
    s.reset("fresh", 7, 6).unwrap();
    drop(s);
    let again = b.open().cursors;
    let c = again.get("siem").unwrap().unwrap();
    assert_eq!((c.seq, c.holder.as_str(), c.delivered), (10, "a", 50));
    assert_eq!(again.get("fresh").unwrap().unwrap().seq, 7);
    assert_eq!(again.claim("fresh", "b", 0, 7, 100).unwrap(), Some(7));
}
