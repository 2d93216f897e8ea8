//! The audit chain on PostgreSQL ([`crate::audit::AuditStore`]). Appends from any number of
//! writers (replicas) serialise on one advisory lock, held for the check of the tip and the
//! inserts, so that the chain has one tip and no fork.

use std::sync::Arc;

use postgres::types::ToSql;

use super::Db;
use crate::audit::{Adopted, AppendError, AuditQuery, AuditRow, AuditStore, Seal, Tip};
use crate::StoreError;

/// The advisory lock appends take (any constant; the same in every replica).
const APPEND_LOCK: i64 = 0x6f73_7469_6175_6401;

/// Rows fetched at a time by [`AuditStore::scan`].
const PAGE: i64 = 1_000;

#[derive(Debug)]
pub(super) struct PgAudit(pub(super) Arc<Db>);

fn last_row(c: &mut impl postgres::GenericClient) -> Result<Option<Tip>, postgres::Error> {
    Ok(
        c.query_opt("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])?
            .map(|row| Tip {
                seq: row.get(0),
                hash: row.get(1),
            }),
    )
}

fn insert(tx: &mut postgres::Transaction<'_>, rows: &[AuditRow]) -> Result<(), postgres::Error> {
    let insert = tx.prepare(
        "INSERT INTO audit (seq, ts_ms, session, decision, record, prev, hash)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )?;
    for r in rows {
        tx.execute(
            &insert,
            &[
                &r.seq,
                &r.ts_ms,
                &r.session,
                &r.decision,
                &r.record,
                &r.prev,
                &r.hash,
            ],
        )?;
    }
    Ok(())
}

fn audit_row(row: &postgres::Row) -> AuditRow {
    AuditRow {
        seq: row.get(0),
        ts_ms: row.get(1),
        session: row.get(2),
        decision: row.get(3),
        record: row.get(4),
        prev: row.get(5),
        hash: row.get(6),
    }
}

impl AuditStore for PgAudit {
    fn append(&self, after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError> {
        let moved = self.0.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&APPEND_LOCK])?;
            let last = last_row(&mut tx)?.unwrap_or_else(Tip::genesis);
            if last != *after {
                return Ok(Some(last.seq));
            }
            insert(&mut tx, rows)?;
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
        let adopted = self.0.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&APPEND_LOCK])?;
            let last = last_row(&mut tx)?.unwrap_or_else(Tip::genesis);
            if let Some(refused) = Adopted::check(after, &last) {
                return Ok(refused);
            }
            let foreign = if last == *after {
                Vec::new()
            } else {
                tx.query(
                    "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
                     WHERE seq > $1 ORDER BY seq",
                    &[&after.seq],
                )?
                .iter()
                .map(audit_row)
                .collect()
            };
            let rows = match seal(&foreign) {
                Ok(rows) => rows,
                Err(why) => return Ok(Adopted::Refused(why)),
            };
            insert(&mut tx, &rows)?;
            tx.commit()?;
            Ok(Adopted::Written(rows))
        })?;
        adopted.into_result(after)
    }

    fn last(&self) -> Result<Option<Tip>, StoreError> {
        self.0.with(last_row)
    }

    fn last_decided(&self, decision: &str) -> Result<Option<AuditRow>, StoreError> {
        self.0.with(|c| {
            Ok(c.query_opt(
                "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
                 WHERE decision = $1 ORDER BY seq DESC LIMIT 1",
                &[&decision],
            )?
            .map(|row| audit_row(&row)))
        })
    }

    fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError> {
        self.0.with(|c| {
            Ok(
                c.query_opt("SELECT hash FROM audit WHERE seq = $1", &[&seq])?
                    .map(|row| row.get(0)),
            )
        })
    }

    fn scan(&self, after: i64, visit: &mut dyn FnMut(AuditRow) -> bool) -> Result<(), StoreError> {
        // Page by page, so that a long chain is never held in memory at once.
        let mut from = after;
        loop {
            let rows = self.0.with(|c| {
                c.query(
                    "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit
                     WHERE seq > $1 ORDER BY seq LIMIT $2",
                    &[&from, &PAGE],
                )
            })?;
            let full = rows.len() as i64 == PAGE;
            for row in rows {
                let row = audit_row(&row);
                from = row.seq;
                if !visit(row) {
                    return Ok(());
                }
            }
            if !full {
                return Ok(());
            }
        }
    }

    fn query(&self, q: &AuditQuery) -> Result<Vec<String>, StoreError> {
        let mut sql = String::from("SELECT record FROM audit WHERE TRUE");
        let limit = i64::from(q.limit.unwrap_or(10_000));
        let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
        if let Some(s) = &q.session {
            args.push(s);
            sql.push_str(&format!(" AND session = ${}", args.len()));
        }
        if let Some(d) = &q.decision {
            args.push(d);
            sql.push_str(&format!(" AND decision = ${}", args.len()));
        }
        if let Some(t) = &q.since_ms {
            args.push(t);
            sql.push_str(&format!(" AND ts_ms >= ${}", args.len()));
        }
        args.push(&limit);
        sql.push_str(&format!(" ORDER BY seq LIMIT ${}", args.len()));
        let rows = self.0.with(|c| c.query(&sql, &args))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    fn recent(&self, session: &str, n: u32) -> Result<Vec<String>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT record FROM (SELECT seq, record FROM audit WHERE session = $1
                 ORDER BY seq DESC LIMIT $2) recent ORDER BY seq",
                &[&session, &i64::from(n)],
            )
        })?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    fn sync(&self) -> Result<(), StoreError> {
        // A committed transaction is the server's to keep (its `synchronous_commit`).
        Ok(())
    }
}
