//! The undo journal on SQLite ([`crate::undo::UndoStore`]).
//!
//! SQLite has one writer at a time, across connections and processes: an entry's `seq`,
//! computed inside its own `INSERT`, is never taken twice, and a claim or a finish is one
//! `UPDATE … WHERE status …`, a compare-and-set as it stands.

use rusqlite::types::Type;
use rusqlite::{params, Row};

use super::Db;
use crate::undo::{NewUndo, UndoRow, UndoStatus, UndoStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqliteUndo(pub(super) Db);

const COLUMNS: &str = "id, seq, session, recorded_ms, tool, tier, subject, args, request, \
                       status, detail, attempts, finished_ms";

impl UndoStore for SqliteUndo {
    fn record(&self, entry: &NewUndo<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            // `WHERE true`: without it SQLite reads the `ON` of `ON CONFLICT` after a
            // `SELECT … FROM` as a join's.
            // Cached: an entry is written on the request path of every call of an undoable
            // tool, and parsing this statement costs more than running it.
            c.prepare_cached(
                "INSERT INTO undo_journal
                   (id, seq, session, recorded_ms, tool, tier, subject, args, request, status,
                    detail)
                 SELECT ?1, COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10
                 FROM undo_journal WHERE true
                 ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![
                entry.id,
                entry.session,
                entry.recorded_ms,
                entry.tool,
                entry.tier,
                entry.subject,
                entry.args,
                entry.request,
                entry.status.as_str(),
                entry.detail,
            ])
            .map(drop)
        })
    }

    fn list(&self, session: &str, since_ms: i64) -> Result<Vec<UndoRow>, StoreError> {
        self.0.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM undo_journal
                 WHERE session = ?1 AND recorded_ms >= ?2
                 ORDER BY seq DESC"
            ))?;
            let rows = stmt.query_map(params![session, since_ms], from_row)?;
            rows.collect()
        })
    }

    fn claim(&self, id: &str) -> Result<bool, StoreError> {
        // The statuses are `UndoStatus::claimable`'s.
        self.0.with(|c| {
            c.execute(
                "UPDATE undo_journal SET status = 'running', attempts = attempts + 1
                 WHERE id = ?1 AND status IN ('pending', 'failed', 'refused')",
                [id],
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
                "UPDATE undo_journal SET status = ?2, detail = ?3, finished_ms = ?4
                 WHERE id = ?1 AND status = 'running'",
                params![id, status.as_str(), detail, at_ms],
            )
            .map(|n| n > 0)
        })
    }
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<UndoRow> {
    let status: String = r.get(9)?;
    // Unknown, it is corrupt (or a newer binary's): an undo is never sent on a guess.
    let status = UndoStatus::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            9,
            Type::Text,
            format!("unknown undo status {status:?}").into(),
        )
    })?;
    Ok(UndoRow {
        id: r.get(0)?,
        seq: r.get(1)?,
        session: r.get(2)?,
        recorded_ms: r.get(3)?,
        tool: r.get(4)?,
        tier: r.get(5)?,
        subject: r.get(6)?,
        args: r.get(7)?,
        request: r.get(8)?,
        status,
        detail: r.get(10)?,
        attempts: r.get(11)?,
        finished_ms: r.get(12)?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What the suite cannot write through the trait: a status no binary of this version
    /// knows comes back as corrupt data.
    #[test]
    fn an_unknown_status_is_corrupt_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let stores = crate::sqlite::open(&path).unwrap();
        stores
            .undo
            .record(&NewUndo {
                id: "req_1",
                session: "s",
                recorded_ms: 1,
                tool: "t",
                tier: "write",
                subject: "{}",
                args: "{}",
                request: Some("{}"),
                status: UndoStatus::Pending,
                detail: None,
            })
            .unwrap();
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute("UPDATE undo_journal SET status = 'reverted'", [])
            .unwrap();
        let err = stores.undo.list("s", 0).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt(ref m) if m.contains("reverted")),
            "{err}"
        );
    }
}
