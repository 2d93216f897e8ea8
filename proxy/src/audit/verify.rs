//! Reading the audit chain back: `ostiary audit verify` and `ostiary audit query`.

use std::path::Path;

use rusqlite::{params_from_iter, types::Value as SqlValue, Connection};
use subtle::ConstantTimeEq;

use super::record::AuditRecord;
use super::writer::{seal, GENESIS};
use crate::store::StoreError;

/// What verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records checked.
    pub records: i64,
    /// Problems, in chain order; empty when the chain is intact.
    pub problems: Vec<String>,
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
        if seq != expected_seq {
            problems.push(format!(
                "record {seq}: expected sequence {expected_seq} (records deleted or inserted)"
            ));
        }
        if stored_prev != prev {
            problems.push(format!(
                "record {seq}: does not link to the record before it"
            ));
        }
        let computed = seal(key, &stored_prev, seq, &json);
        if !bool::from(computed.as_bytes().ct_eq(hash.as_bytes())) {
            problems.push(format!(
                "record {seq}: content does not match its seal (edited)"
            ));
        }
        match serde_json::from_str::<AuditRecord>(&json) {
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
    match std::fs::read_to_string(head_path) {
        Ok(head) => {
            let mut parts = head.split_whitespace();
            let head_seq: i64 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
            let head_hash = parts.next().unwrap_or("");
            if head_seq > last_seq {
                problems.push(format!(
                    "the chain ends at record {last_seq} but record {head_seq} was written (newest records deleted)"
                ));
            } else if head_seq == last_seq && head_hash != prev {
                problems.push(format!("record {last_seq}: differs from the checkpointed head"));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && records == 0 => {}
        Err(e) => problems.push(format!(
            "head checkpoint {} unreadable ({e}); deletion of the newest records cannot be ruled out",
            head_path.display()
        )),
    }
    Ok(VerifyReport { records, problems })
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
