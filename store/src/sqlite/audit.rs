//! The audit chain on SQLite ([`crate::audit::AuditStore`]).

use std::path::{Path, PathBuf};

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, TransactionBehavior};

use super::Db;
use crate::audit::{
    yield_every, Adopted, AppendError, AuditQuery, AuditRow, AuditStore, Seal, Tip,
};
use crate::StoreError;

/// The chain's own connection, committing with `synchronous = NORMAL`: a commit is in the
/// write-ahead log, safe from a crash of the process but not yet from a power cut, until
/// [`AuditStore::sync`] syncs the log.
#[derive(Debug)]
pub(super) struct SqliteAudit {
    db: Db,
    /// The write-ahead log beside the database (SQLite names it `<database>-wal`); none
    /// for a read-only store, which commits nothing.
    wal: Option<PathBuf>,
}

impl SqliteAudit {
    pub(super) fn new(db: Db, path: &Path) -> Self {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Self {
            db,
            wal: Some(wal.into()),
        }
    }

    pub(super) fn read_only(db: Db) -> Self {
        Self { db, wal: None }
    }
}

/// The newest row. Cached: every append reads it, and parsing the statement each time was
/// most of its cost (~1% of the proxy's CPU flat out).
fn last_row(c: &Connection) -> rusqlite::Result<Option<Tip>> {
    c.prepare_cached("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")?
        .query_row([], |row| {
            Ok(Tip {
                seq: row.get(0)?,
                hash: row.get(1)?,
            })
        })
        .optional()
}

/// Rows one `INSERT` statement carries: the statement's own cost (a step, its halt and
/// reset) is paid once for this many rows rather than for each.
const ROWS_PER_INSERT: usize = 16;

/// `INSERT INTO audit … VALUES (…), (…)` for `n` rows, numbered parameters in row order.
fn insert_sql(n: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO audit (seq, ts_ms, session, decision, record, prev, hash) VALUES ",
    );
    for i in 0..n {
        let p = i * 7;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6,
            p + 7
        ));
    }
    sql
}

fn insert(c: &Connection, rows: &[AuditRow]) -> rusqlite::Result<()> {
    static MANY: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| insert_sql(ROWS_PER_INSERT));
    static ONE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| insert_sql(1));
    // The core offered between statements as [`yielding`] offers it between rows: after
    // every `yield_every` rows, here rounded up to a whole statement.
    let every = yield_every(rows.len());
    let mut since_yield = 0;
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        if since_yield >= every {
            std::thread::yield_now();
            since_yield = 0;
        }
        since_yield += chunk.len();
        if chunk.len() == ROWS_PER_INSERT {
            c.prepare_cached(&MANY)?
                .execute(params_from_iter(chunk.iter().flat_map(row_values)))?;
        } else {
            let mut one = c.prepare_cached(&ONE)?;
            for r in chunk {
                one.execute(params_from_iter(row_values(r)))?;
            }
        }
    }
    Ok(())
}

/// A row's columns in the order [`insert_sql`] names them.
fn row_values(r: &AuditRow) -> [&dyn rusqlite::ToSql; 7] {
    [
        &r.seq,
        &r.ts_ms,
        &r.session,
        &r.decision,
        &r.record,
        &r.prev,
        &r.hash,
    ]
}

fn audit_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        seq: row.get(0)?,
        ts_ms: row.get(1)?,
        session: row.get(2)?,
        decision: row.get(3)?,
        record: row.get(4)?,
        prev: row.get(5)?,
        hash: row.get(6)?,
    })
}

/// Every row after `seq`, oldest first (bounded by the caller's [`Adopted::check`]).
fn rows_after(c: &Connection, seq: i64) -> rusqlite::Result<Vec<AuditRow>> {
    c.prepare_cached(
        "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
         WHERE seq > ?1 ORDER BY seq",
    )?
    .query_map([seq], audit_row)?
    .collect()
}

impl AuditStore for SqliteAudit {
    fn append(&self, after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError> {
        let moved = self.db.with(|c| {
            // Immediate: the check below and the inserts happen under one write lock.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let last = last_row(&tx)?.unwrap_or_else(Tip::genesis);
            if last != *after {
                return Ok(Some(last.seq));
            }
            insert(&tx, rows)?;
            tx.commit()?;
            Ok(None)
        })?;
        match moved {
            None => Ok(()),
            Some(found) => Err(AppendError::Moved {
                expected: after.seq,
                found,
            }),
        }
    }

    fn append_after(&self, after: &Tip, seal: &mut Seal<'_>) -> Result<Vec<AuditRow>, AppendError> {
        let adopted = self.db.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let last = last_row(&tx)?.unwrap_or_else(Tip::genesis);
            if let Some(refused) = Adopted::check(after, &last) {
                return Ok(refused);
            }
            let foreign = if last == *after {
                Vec::new()
            } else {
                rows_after(&tx, after.seq)?
            };
            let rows = match seal(&foreign) {
                Ok(rows) => rows,
                Err(why) => return Ok(Adopted::Refused(why)),
            };
            insert(&tx, &rows)?;
            tx.commit()?;
            Ok(Adopted::Written(rows))
        })?;
        adopted.into_result(after)
    }

    fn last(&self) -> Result<Option<Tip>, StoreError> {
        self.db.with(|c| last_row(c))
    }

    fn last_decided(&self, decision: &str) -> Result<Option<AuditRow>, StoreError> {
        self.db.with(|c| {
            c.query_row(
                "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
                 WHERE decision = ?1 ORDER BY seq DESC LIMIT 1",
                [decision],
                audit_row,
            )
            .optional()
        })
    }

    fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError> {
        self.db.with(|c| {
            c.query_row("SELECT hash FROM audit WHERE seq = ?1", [seq], |r| r.get(0))
                .optional()
        })
    }

    fn scan(&self, after: i64, visit: &mut dyn FnMut(AuditRow) -> bool) -> Result<(), StoreError> {
        self.db.with(|c| {
            let mut stmt = c.prepare(
                "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
                 WHERE seq > ?1 ORDER BY seq",
            )?;
            let mut rows = stmt.query([after])?;
            while let Some(row) = rows.next()? {
                if !visit(audit_row(row)?) {
                    break;
                }
            }
            Ok(())
        })
    }

    fn query(&self, q: &AuditQuery) -> Result<Vec<String>, StoreError> {
        let mut sql = String::from("SELECT record FROM audit WHERE 1=1");
        let mut args: Vec<SqlValue> = Vec::new();
        if let Some(s) = &q.session {
            sql.push_str(" AND session = ?");
            args.push(SqlValue::Text(s.clone()));
        }
        if let Some(d) = &q.decision {
            sql.push_str(" AND decision = ?");
            args.push(SqlValue::Text(d.clone()));
        }
        if let Some(t) = q.since_ms {
            sql.push_str(" AND ts_ms >= ?");
            args.push(SqlValue::Integer(t));
        }
        sql.push_str(" ORDER BY seq LIMIT ?");
        args.push(SqlValue::Integer(i64::from(q.limit.unwrap_or(10_000))));
        self.db.with(|c| {
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt.query_map(params_from_iter(args), |row| row.get::<_, String>(0))?;
            rows.collect()
        })
    }

    fn recent(&self, session: &str, n: u32) -> Result<Vec<String>, StoreError> {
        self.db.with(|c| {
            let mut stmt = c.prepare(
                "SELECT record FROM (SELECT seq, record FROM audit WHERE session = ?1
                 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![session, n], |r| r.get::<_, String>(0))?;
            rows.collect()
        })
    }

    fn sync(&self) -> Result<(), StoreError> {
        // The log file itself, synced from outside SQLite: `wal_checkpoint` syncs it only
        // when it has frames to copy that no reader still needs, so a CLI holding a read
        // transaction open would leave commits unsynced behind a checkpoint.
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        // A missing log is an error too: SQLite keeps it while this connection is open, so
        // it was removed behind the store's back, and what it held is lost.
        std::fs::File::open(wal)
            .and_then(|log| log.sync_data())
            .map_err(|e| StoreError::Unavailable(format!("syncing {}: {e}", wal.display())))
    }
}
