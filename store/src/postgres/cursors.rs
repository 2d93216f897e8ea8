//! Export cursors on PostgreSQL ([`crate::cursors::CursorStore`]): each change one statement
//! whose `WHERE` is the compare of the compare-and-set; row locks make two replicas claiming
//! or advancing at once see each other's result.

use std::sync::Arc;

use super::Db;
use crate::cursors::{Cursor, CursorStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgCursors(pub(super) Arc<Db>);

impl CursorStore for PgCursors {
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
                 VALUES ($1, $2, '', 0, $3, 0) ON CONFLICT (name) DO NOTHING",
                &[&name, &start, &now_ms],
            )?;
            c.query_opt(
                "UPDATE export_cursors SET holder = $2, lease_until_ms = $4
                 WHERE name = $1 AND (holder = $2 OR holder = '' OR lease_until_ms < $3)
                 RETURNING seq",
                &[&name, &holder, &now_ms, &until_ms],
            )
            .map(|row| row.map(|r| r.get(0)))
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
                "UPDATE export_cursors SET seq = $4, updated_ms = $5,
                   delivered = delivered + ($4 - $3), last_error = NULL, failed_ms = NULL
                 WHERE name = $1 AND holder = $2 AND seq = $3",
                &[&name, &holder, &from, &to, &now_ms],
            )
            .map(|n| n == 1)
        })
    }

    fn failed(&self, name: &str, holder: &str, error: &str, now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE export_cursors SET last_error = $3, failed_ms = $4
                 WHERE name = $1 AND holder = $2",
                &[&name, &holder, &error, &now_ms],
            )
            .map(drop)
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE export_cursors SET holder = '', lease_until_ms = 0
                 WHERE name = $1 AND holder = $2",
                &[&name, &holder],
            )
            .map(drop)
        })
    }

    fn reset(&self, name: &str, seq: i64, now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO export_cursors (name, seq, holder, lease_until_ms, updated_ms, delivered)
                 VALUES ($1, $2, '', 0, $3, 0)
                 ON CONFLICT (name) DO UPDATE SET seq = $2, updated_ms = $3,
                   last_error = NULL, failed_ms = NULL",
                &[&name, &seq, &now_ms],
            )
            .map(drop)
        })
    }

    fn get(&self, name: &str) -> Result<Option<Cursor>, StoreError> {
        let row = self.0.with(|c| {
            c.query_opt(
                "SELECT name, seq, holder, lease_until_ms, updated_ms, delivered, last_error,
                        failed_ms
                 FROM export_cursors WHERE name = $1",
                &[&name],
            )
        })?;
        Ok(row.map(|row| Cursor {
            name: row.get(0),
            seq: row.get(1),
            holder: row.get(2),
            lease_until_ms: row.get(3),
            updated_ms: row.get(4),
            delivered: row.get(5),
            last_error: row.get(6),
            failed_ms: row.get(7),
        }))
    }
}
