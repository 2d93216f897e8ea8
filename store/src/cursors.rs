//! The export-cursor aggregate: how far a stream of the audit trail to an outside system (a
//! SIEM) has been delivered, and which process may deliver it.
//!
//! The trail itself is the stream's buffer: a cursor is one number, the last record an
//! export delivered, so nothing is lost while the receiver is down — the export falls behind
//! and catches up. Several replicas sharing a database share a cursor; a lease on it names
//! the one process that sends, so a receiver never gets each batch once per replica. A
//! cursor moves only by compare-and-set (`advance` from where it was read), so an operator's
//! `reset` (replay from a record, or skip) is never overwritten by a delivery in flight.

use crate::StoreError;

/// One export's position and who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub name: String,
    /// The last record delivered (0: none yet).
    pub seq: i64,
    /// The process whose lease it is (empty: nobody's).
    pub holder: String,
    /// The lease runs until then (milliseconds since the epoch).
    pub lease_until_ms: i64,
    /// When the cursor last moved or was reset.
    pub updated_ms: i64,
    /// Records delivered since the cursor was made.
    pub delivered: i64,
    /// Why the last delivery failed, until one succeeds.
    pub last_error: Option<String>,
    /// When that failure was.
    pub failed_ms: Option<i64>,
}

/// Where cursors are kept.
pub trait CursorStore: Send + Sync + std::fmt::Debug {
    /// Take or renew the lease on cursor `name` for `holder` until `until_ms` — making the
    /// cursor at `start` if there is none — and return its position; `None` while another
    /// holder's lease runs (at `now_ms`).
    fn claim(
        &self,
        name: &str,
        holder: &str,
        start: i64,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<i64>, StoreError>;
    /// Move cursor `name` from `from` to `to` (records `from+1..=to` delivered), provided
    /// `holder` holds it and it is still at `from`; false (nothing changed) otherwise.
    fn advance(
        &self,
        name: &str,
        holder: &str,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Note that a delivery failed (kept until one succeeds), if `holder` holds the cursor.
    fn failed(&self, name: &str, holder: &str, error: &str, now_ms: i64) -> Result<(), StoreError>;
    /// Give up `holder`'s lease (at shutdown), so another replica takes over at once.
    fn release(&self, name: &str, holder: &str) -> Result<(), StoreError>;
    /// Put cursor `name` at `seq` (the operator's replay or skip), making it if need be;
    /// whoever holds it keeps the lease and sends from there.
    fn reset(&self, name: &str, seq: i64, now_ms: i64) -> Result<(), StoreError>;
    /// Cursor `name`, if it exists.
    fn get(&self, name: &str) -> Result<Option<Cursor>, StoreError>;
}
