//! Records as the rows the trail keeps: serialised, numbered on from the chain's tip, each
//! linked to the one before and sealed ([`super::chain::Sealer`]). The writer builds every
//! batch, and every signed checkpoint, through these.

use super::chain::{Sealer, Tip};
use super::record::AuditRecord;
use crate::store::audit::{yielding, AuditRow};

/// `records` serialised, the core offered as they are ([`yielding`]).
pub(super) fn texts(records: &[AuditRecord]) -> Result<Vec<String>, serde_json::Error> {
    yielding(records).map(record_text).collect()
}

/// `records` (serialised as `texts`) as rows, to be numbered and sealed by [`seal_after`].
pub(super) fn seal_rows(records: &[AuditRecord], texts: Vec<String>) -> Vec<AuditRow> {
    records
        .iter()
        .zip(texts)
        .map(|(record, text)| AuditRow {
            seq: 0,
            ts_ms: record.ts_ms,
            session: record.session.clone(),
            decision: record.decision.clone(),
            record: text,
            prev: String::new(),
            hash: String::new(),
        })
        .collect()
}

/// `rows` numbered on from `tip`, each linking to the one before and sealed.
pub(super) fn seal_after(sealer: &Sealer, tip: &Tip, mut rows: Vec<AuditRow>) -> Vec<AuditRow> {
    let (mut seq, mut prev) = (tip.seq, tip.hash.clone());
    for row in &mut rows {
        seq += 1;
        row.seq = seq;
        row.hash = sealer.seal(&prev, seq, &row.record);
        row.prev = std::mem::replace(&mut prev, row.hash.clone());
    }
    rows
}

/// A record as the JSON text its row keeps. Written into room for a typical record (most are
/// under 1 KiB) rather than into `serde_json::to_string`'s 128 bytes, which would be grown
/// three times for each.
pub(super) fn record_text(record: &AuditRecord) -> Result<String, serde_json::Error> {
    let mut text = Vec::with_capacity(1024);
    serde_json::to_writer(&mut text, record)?;
    String::from_utf8(text).map_err(|e| serde::ser::Error::custom(e.to_string()))
}
