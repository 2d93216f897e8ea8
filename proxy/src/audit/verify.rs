//! Reading the audit chain back: `ostiary audit verify` and `ostiary audit query`.

use std::path::Path;

use rusqlite::{params_from_iter, types::Value as SqlValue, Connection, OptionalExtension};
use subtle::ConstantTimeEq;

use super::chain::{self, Head, GENESIS};
use super::record::AuditRecord;
use super::writer::seal;
use crate::store::StoreError;

/// What verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records checked.
    pub records: i64,
    /// Problems, in chain order; empty when the chain is intact.
    pub problems: Vec<String>,
    /// What an operator acknowledged (`ostiary audit reanchor`): said, but not a failure.
    pub notes: Vec<String>,
}

impl VerifyReport {
    /// True when nothing was found wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Recompute the whole chain and compare it with the head checkpoint.
pub fn verify(conn: &Connection, key: &[u8], head_path: &Path) -> Result<VerifyReport, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT seq, ts_ms, session, decision, record, prev, hash FROM audit ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let (mut expected_seq, mut prev) = (1i64, GENESIS.to_owned());
    let mut records = 0;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        let ts_ms: i64 = row.get(1)?;
        let session: Option<String> = row.get(2)?;
        let decision: String = row.get(3)?;
        let json: String = row.get(4)?;
        let stored_prev: String = row.get(5)?;
        let hash: String = row.get(6)?;
        records += 1;
        let sealed = bool::from(
            seal(key, &stored_prev, seq, &json)
                .as_bytes()
                .ct_eq(hash.as_bytes()),
        );
        let parsed = serde_json::from_str::<AuditRecord>(&json);
        let reanchor = match (&parsed, sealed) {
            (Ok(r), true) => r.reanchor.as_ref().map(|a| (a, r.reason.as_deref())),
            _ => None,
        };
        if let Some((anchor, reason)) = reanchor {
            notes.push(format!(
                "record {seq}: re-anchored by an operator ({}): {}",
                reason.unwrap_or("no reason given"),
                anchor.problem
            ));
        }
        if seq != expected_seq {
            match reanchor {
                // The gap a re-anchor declared (it numbers on past the checkpoint's last
                // record, so a number is never reused).
                Some((anchor, _)) if anchor.chain_seq == expected_seq - 1 && seq > expected_seq => {
                    notes.push(format!(
                        "records {expected_seq} to {} are missing: acknowledged by the re-anchor at record {seq}",
                        seq - 1
                    ))
                }
                _ => problems.push(format!(
                    "record {seq}: expected sequence {expected_seq} (records deleted or inserted)"
                )),
            }
        }
        if stored_prev != prev {
            problems.push(format!(
                "record {seq}: does not link to the record before it"
            ));
        }
        if !sealed {
            problems.push(format!(
                "record {seq}: content does not match its seal (edited)"
            ));
        }
        match parsed {
            Ok(r) if r.ts_ms == ts_ms && r.session == session && r.decision == decision => {}
            Ok(_) => problems.push(format!(
                "record {seq}: indexed columns differ from the record (edited)"
            )),
            Err(e) => problems.push(format!("record {seq}: not a valid record: {e}")),
        }
        expected_seq = seq + 1;
        prev = hash;
    }
    let last_seq = expected_seq - 1;
    if let Some(problem) = head_problem(conn, key, head_path, records, last_seq, &prev)? {
        problems.push(problem);
    }
    Ok(VerifyReport {
        records,
        problems,
        notes,
    })
}

/// What is wrong between the chain (ending at `last_seq` with hash `last_hash`) and its
/// checkpoint, if anything.
fn head_problem(
    conn: &Connection,
    key: &[u8],
    head_path: &Path,
    records: i64,
    last_seq: i64,
    last_hash: &str,
) -> Result<Option<String>, StoreError> {
    let path = head_path.display();
    let head = match chain::read_head(key, head_path) {
        Ok(head) => head,
        Err(e) => {
            return Ok(Some(format!(
                "head checkpoint {path} unreadable ({e}); deletion of the newest records cannot be ruled out"
            )))
        }
    };
    let tip = match head {
        Head::Missing if records == 0 => return Ok(None),
        Head::Missing => {
            return Ok(Some(format!(
                "head checkpoint {path} is missing; deletion of the newest records cannot be ruled out"
            )))
        }
        Head::Unsealed(why) => {
            return Ok(Some(format!(
                "head checkpoint {path} cannot be trusted ({why}); deletion of the newest records cannot be ruled out"
            )))
        }
        Head::Sealed(tip) => tip,
    };
    if tip.seq > last_seq {
        return Ok(Some(format!(
            "the chain ends at record {last_seq} but record {} was written (newest records deleted, or the database replaced by an older copy)",
            tip.seq
        )));
    }
    let stored = if tip.seq == last_seq {
        Some(last_hash.to_owned())
    } else if tip.seq == 0 {
        Some(GENESIS.to_owned())
    } else {
        conn.query_row("SELECT hash FROM audit WHERE seq = ?1", [tip.seq], |r| {
            r.get::<_, String>(0)
        })
        .optional()?
    };
    Ok((stored.as_deref() != Some(tip.hash.as_str()))
        .then(|| format!("record {}: differs from the checkpointed head", tip.seq)))
}

/// Filters of `ostiary audit query` and `GET /v1/audit`.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub session: Option<String>,
    pub decision: Option<String>,
    /// Milliseconds since the epoch (inclusive).
    pub since_ms: Option<i64>,
    pub limit: Option<u32>,
}

/// Records matching the filters, oldest first.
pub fn query(conn: &Connection, q: &Query) -> Result<Vec<AuditRecord>, StoreError> {
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
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params_from_iter(args), |row| row.get::<_, String>(0))?;
    let mut out = Vec::new();
    for row in rows {
        let json = row?;
        let record = serde_json::from_str(&json)
            .map_err(|e| StoreError::Task(format!("audit record does not parse: {e}")))?;
        out.push(record);
    }
    Ok(out)
}
