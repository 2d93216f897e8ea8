//! The undo journal on PostgreSQL ([`crate::undo::UndoStore`]), shared by replicas.
//!
//! An entry's `seq` comes from the column's sequence, so replicas recording at once take
//! no lock. A claim or a finish is one `UPDATE … WHERE status …`: a second replica's
//! concurrent update waits on the row lock, re-reads the row and finds it moved on, so of
//! replicas undoing one session at once only one sends each entry.

use std::sync::Arc;

use postgres::Row;

use super::Db;
use crate::undo::{NewUndo, UndoRow, UndoStatus, UndoStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgUndo(pub(super) Arc<Db>);

const COLUMNS: &str = "id, seq, session, recorded_ms, tool, tier, subject, args, request, \
                       status, detail, attempts, finished_ms";

impl UndoStore for PgUndo {
    fn record(&self, entry: &NewUndo<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO undo_journal
                   (id, session, recorded_ms, tool, tier, subject, args, request, status, detail)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (id) DO NOTHING",
                &[
                    &entry.id,
                    &entry.session,
                    &entry.recorded_ms,
                    &entry.tool,
                    &entry.tier,
                    &entry.subject,
                    &entry.args,
                    &entry.request,
                    &entry.status.as_str(),
                    &entry.detail,
                ],
            )
            .map(drop)
        })
    }

    fn list(&self, session: &str, since_ms: i64) -> Result<Vec<UndoRow>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                &format!(
                    "SELECT {COLUMNS} FROM undo_journal
                     WHERE session = $1 AND recorded_ms >= $2
                     ORDER BY seq DESC"
                ),
                &[&session, &since_ms],
            )
        })?;
        rows.iter().map(from_row).collect()
    }

    fn claim(&self, id: &str) -> Result<bool, StoreError> {
        // The statuses are `UndoStatus::claimable`'s.
        self.0.with(|c| {
            c.execute(
                "UPDATE undo_journal SET status = 'running', attempts = attempts + 1
                 WHERE id = $1 AND status IN ('pending', 'failed', 'refused')",
                &[&id],
            )
            .map(|n| n > 0)
        })
    }

    fn finish(
        &self,
        id: &str,
        status: UndoStatus,
        detail: &str,
        at_ms: i64,
    ) -> Result<bool, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE undo_journal SET status = $2, detail = $3, finished_ms = $4
                 WHERE id = $1 AND status = 'running'",
                &[&id, &status.as_str(), &detail, &at_ms],
            )
            .map(|n| n > 0)
        })
    }
}

fn from_row(r: &Row) -> Result<UndoRow, StoreError> {
    let id: String = r.get(0);
    let status: String = r.get(9);
    // Unknown, it is corrupt (or a newer binary's): an undo is never sent on a guess.
    let status = UndoStatus::parse(&status).ok_or_else(|| {
        StoreError::Corrupt(format!("undo entry {id}: unknown status {status:?}"))
    })?;
    Ok(UndoRow {
        id,
        seq: r.get(1),
        session: r.get(2),
        recorded_ms: r.get(3),
        tool: r.get(4),
        tier: r.get(5),
        subject: r.get(6),
        args: r.get(7),
        request: r.get(8),
        status,
        detail: r.get(10),
        attempts: r.get(11),
        finished_ms: r.get(12),
    })
}
