//! `ostiary audit reanchor`: an operator's acknowledgement that the chain no longer matches
//! its checkpoint (the newest records deleted, the checkpoint deleted or forged, the database
//! replaced), so that the proxy may extend it again.
//!
//! Nothing is repaired or hidden: a record of kind `audit`, decision `reanchor`, is sealed
//! onto the chain as it stands, naming what start-up found, the last record the checkpoint
//! named, the last one found, and the operator's reason; the checkpoint then names it. It
//! is numbered after the checkpoint's last record, so the missing numbers stay a visible gap
//! (never reused for other records), which `verify` reports as acknowledged.

use std::path::Path;

use super::chain::{self, ChainError, Head, Tip};
use super::record::{AuditRecord, Reanchor};
use super::writer::seal;
use crate::store::audit::{AppendError, AuditRow, AuditStore};
use crate::store::StoreError;

/// What a re-anchor wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reanchored {
    /// The re-anchor record's sequence number (the chain's new tip).
    pub seq: i64,
    /// The last record the database held.
    pub chain_seq: i64,
    /// The last record a trustworthy checkpoint named.
    pub checkpoint_seq: Option<i64>,
    /// What was acknowledged.
    pub problem: String,
}

/// Why the chain was not re-anchored.
#[derive(Debug, thiserror::Error)]
pub enum ReanchorError {
    #[error("nothing to re-anchor: the audit chain matches its checkpoint (record {seq})")]
    Intact { seq: i64 },
    #[error("a re-anchor records why: give --reason")]
    NoReason,
    #[error("{0}")]
    Chain(ChainError),
    #[error("serialising the re-anchor record: {0}")]
    Serialise(#[from] serde_json::Error),
    #[error("writing the checkpoint: {0}")]
    Checkpoint(std::io::Error),
}

impl From<StoreError> for ReanchorError {
    fn from(e: StoreError) -> Self {
        ReanchorError::Chain(e.into())
    }
}

/// Re-anchor the chain in `trail` (opened read-write, with the proxy stopped) if start-up
/// would refuse it.
pub fn reanchor(
    trail: &dyn AuditStore,
    key: &[u8],
    head_path: &Path,
    reason: &str,
) -> Result<Reanchored, ReanchorError> {
    if reason.trim().is_empty() {
        return Err(ReanchorError::NoReason);
    }
    let problem = match chain::check_tip(trail, key, head_path) {
        Ok(tip) => return Err(ReanchorError::Intact { seq: tip.seq }),
        Err(e) if !e.reanchorable() => return Err(ReanchorError::Chain(e)),
        Err(e) => e.problem(),
    };
    let checkpoint_seq = match chain::read_head(key, head_path) {
        Ok(Head::Sealed(tip)) => Some(tip.seq),
        _ => None,
    };
    let last = trail.last()?.unwrap_or_else(Tip::genesis);
    let seq = checkpoint_seq.unwrap_or(0).max(last.seq) + 1;
    let record = AuditRecord {
        ts_ms: crate::store::now_ms(),
        request_id: crate::ids::request_id(),
        kind: "audit".into(),
        decision: "reanchor".into(),
        reason: Some(reason.trim().to_owned()),
        reanchor: Some(Reanchor {
            checkpoint_seq,
            chain_seq: last.seq,
            problem: problem.clone(),
        }),
        ..Default::default()
    };
    let json = serde_json::to_string(&record)?;
    let hash = seal(key, &last.hash, seq, &json);
    // Appended only if the chain still ends where it was read (a server started
    // meanwhile would have moved it).
    let row = AuditRow {
        seq,
        ts_ms: record.ts_ms,
        session: None,
        decision: record.decision.clone(),
        record: json,
        prev: last.hash.clone(),
        hash: hash.clone(),
    };
    trail.append(&last, &[row]).map_err(|e| match e {
        AppendError::Store(e) => ReanchorError::from(e),
        other => ReanchorError::from(StoreError::Backend(other.to_string())),
    })?;
    // Durable before the checkpoint names it, as the writer's own rows (`writer.rs`).
    trail.sync()?;
    chain::write_head(&chain::Sealer::new(key), head_path, &Tip { seq, hash })
        .map_err(ReanchorError::Checkpoint)?;
    Ok(Reanchored {
        seq,
        chain_seq: last.seq,
        checkpoint_seq,
        problem,
    })
}
