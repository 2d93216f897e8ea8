//! Reading the audit chain back: `ostiary audit verify` and `ostiary audit query`.

use std::path::Path;

use subtle::ConstantTimeEq;

use super::chain::{self, Head, Sealer, GENESIS};
use super::record::AuditRecord;
pub use crate::store::audit::AuditQuery as Query;
use crate::store::audit::{AuditRow, AuditStore};
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
pub fn verify(
    trail: &dyn AuditStore,
    key: &[u8],
    head_path: &Path,
) -> Result<VerifyReport, StoreError> {
    let mut walk = Walk {
        sealer: Sealer::new(key),
        problems: Vec::new(),
        notes: Vec::new(),
        expected_seq: 1,
        prev: GENESIS.to_owned(),
        records: 0,
    };
    trail.scan(0, &mut |row| {
        walk.check(row);
        true
    })?;
    let Walk {
        mut problems,
        notes,
        expected_seq,
        prev,
        records,
        ..
    } = walk;
    let last_seq = expected_seq - 1;
    if let Some(problem) = head_problem(trail, key, head_path, records, last_seq, &prev)? {
        problems.push(problem);
    }
    Ok(VerifyReport {
        records,
        problems,
        notes,
    })
}

/// The walk along the chain: what each record must be, given the one before it.
struct Walk {
    sealer: Sealer,
    problems: Vec<String>,
    notes: Vec<String>,
    expected_seq: i64,
    prev: String,
    records: i64,
}

impl Walk {
    fn check(&mut self, row: AuditRow) {
        let AuditRow {
            seq,
            ts_ms,
            session,
            decision,
            record: json,
            prev: stored_prev,
            hash,
        } = row;
        let (problems, notes, expected_seq) =
            (&mut self.problems, &mut self.notes, self.expected_seq);
        self.records += 1;
        let sealed = bool::from(
            self.sealer
                .seal(&stored_prev, seq, &json)
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
        if stored_prev != self.prev {
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
        self.expected_seq = seq + 1;
        self.prev = hash;
    }
}

/// What is wrong between the chain (ending at `last_seq` with hash `last_hash`) and its
/// checkpoint, if anything.
fn head_problem(
    trail: &dyn AuditStore,
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
        trail.hash_at(tip.seq)?
    };
    Ok((stored.as_deref() != Some(tip.hash.as_str()))
        .then(|| format!("record {}: differs from the checkpointed head", tip.seq)))
}

/// Records matching the filters, oldest first.
pub fn query(trail: &dyn AuditStore, q: &Query) -> Result<Vec<AuditRecord>, StoreError> {
    trail
        .query(q)?
        .iter()
        .map(|json| {
            serde_json::from_str(json)
                .map_err(|e| StoreError::Corrupt(format!("audit record does not parse: {e}")))
        })
        .collect()
}
