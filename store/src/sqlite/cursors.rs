//! Export cursors on SQLite ([`crate::cursors::CursorStore`]): each change one statement, so
//! SQLite's single writer makes every compare-and-set atomic.

use rusqlite::{params, OptionalExtension};

use super::Db;
use crate::cursors::{Cursor, CursorStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqliteCursors(pub(super) Db);

const COLUMNS: &str =
    "name, seq, holder, lease_until_ms, updated_ms, delivered, last_error, failed_ms";

impl CursorStore for SqliteCursors {
    fn claim(
        &self,
        name: &str,
        holder: &str,
        start: i64,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO export_cursors (name, seq, holder, lease_until_ms, updated_ms, delivered)
                 VALUES (?1, ?2, '', 0, ?3, 0) ON CONFLICT (name) DO NOTHING",
                params![name, start, now_ms],
            )?;
            c.query_row(
                "UPDATE export_cursors SET holder = ?2, lease_until_ms = ?4
                 WHERE name = ?1 AND (holder = ?2 OR holder = '' OR lease_until_ms < ?3)
                 RETURNING seq",
                params![name, holder, now_ms, until_ms],
                |row| row.get(0),
            )
            .optional()
        })
    }

    fn advance(
        &self,
        name: &str,
        holder: &str,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE export_cursors SET seq = ?4, updated_ms = ?5,
                   delivered = delivered + (?4 - ?3), last_error = NULL, failed_ms = NULL
                 WHERE name = ?1 AND holder = ?2 AND seq = ?3",
                params![name, holder, from, to, now_ms],
            )
            .map(|n| n == 1)
        })
    }

    fn failed(&self, name: &str, holder: &str, error: &str, now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE export_cursors SET last_error = ?3, failed_ms = ?4
                 WHERE name = ?1 AND holder = ?2",
                params![name, holder, error, now_ms],
            )
            .map(drop)
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE export_cursors SET holder = '', lease_until_ms = 0
                 WHERE name = ?1 AND holder = ?2",
                params![name, holder],
            )
            .map(drop)
        })
    }

    fn reset(&self, name: &str, seq: i64, now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO export_cursors (name, seq, holder, lease_until_ms, updated_ms, delivered)
                 VALUES (?1, ?2, '', 0, ?3, 0)
                 ON CONFLICT (name) DO UPDATE SET seq = ?2, updated_ms = ?3,
                   last_error = NULL, failed_ms = NULL",
                params![name, seq, now_ms],
            )
            .map(drop)
        })
    }

    fn get(&self, name: &str) -> Result<Option<Cursor>, StoreError> {
        self.0.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM export_cursors WHERE name = ?1"),
                [name],
                |row| {
                    Ok(Cursor {
                        name: row.get(0)?,
                        seq: row.get(1)?,
                        holder: row.get(2)?,
                        lease_until_ms: row.get(3)?,
                        updated_ms: row.get(4)?,
                        delivered: row.get(5)?,
                        last_error: row.get(6)?,
                        failed_ms: row.get(7)?,
                    })
                },
            )
            .optional()
        })
    }
}
