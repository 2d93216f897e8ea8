//! The writer's side of signed checkpoints ([`super::attest`]): where the next range starts,
//! the digest kept up as rows are committed, and when a checkpoint is due.
//!
//! The digest is taken from the rows as this writer commits them, and from the rows of
//! other writers sharing the store (replicas on PostgreSQL) as the append lock hands them
//! over, so signing costs no read of the chain. At start-up, or after more rows than are
//! read under the lock, the range is caught up from the store instead, in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attest::{self, Checkpoint, RangeDigest, Signer, CHECKPOINT};
use super::record::AuditRecord;
use crate::store::audit::{AuditRow, AuditStore, Tip};
use crate::store::StoreError;

pub(super) struct Signing {
    signer: Arc<Signer>,
    every: Duration,
    /// The rows since the last checkpoint's range.
    range: RangeDigest,
    /// Rows not fed to `range` were committed after it (another writer's): catch up from
    /// the store before signing.
    stale: bool,
    /// The newest checkpoint record known (0: none): rows after it are not yet signed.
    signed_seq: i64,
    /// When this writer last signed (or started).
    last: Instant,
}

impl Signing {
    /// Start after the newest checkpoint in `trail` (any writer's), its range's end being
    /// where the next one starts; with none, at the chain's start. The rows since are read
    /// now (a crash's unsigned tail, or a whole chain from before checkpoints were signed).
    pub(super) fn start(
        signer: Arc<Signer>,
        every: Duration,
        trail: &dyn AuditStore,
    ) -> Result<Self, StoreError> {
        let (from, signed_seq) = match trail.last_decided(CHECKPOINT)? {
            Some(row) => {
                let checkpoint = attest::checkpoint_of(&row.record).ok_or_else(|| {
                    StoreError::Backend(format!(
                        "audit record {} is a checkpoint without one",
                        row.seq
                    ))
                })?;
                let from = Tip {
                    seq: checkpoint.to,
                    hash: checkpoint.to_hash,
                };
                (from, row.seq)
            }
            None => (Tip::genesis(), 0),
        };
        let mut signing = Self {
            signer,
            every,
            range: RangeDigest::after(from),
            stale: true,
            signed_seq,
            last: Instant::now(),
        };
        signing.catch_up(trail, None)?;
        Ok(signing)
    }

    /// Rows this writer committed, in order.
    pub(super) fn written(&mut self, rows: &[AuditRow]) {
        if self.stale {
            return;
        }
        for row in rows {
            if !self.range.feed(row) {
                self.stale = true;
                return;
            }
        }
    }

    /// Another writer's rows, read under the append lock and checked, in order.
    pub(super) fn adopted(&mut self, rows: &[AuditRow]) {
        self.written(rows);
        if let Some(seq) = rows
            .iter()
            .rev()
            .find(|row| row.decision == CHECKPOINT)
            .map(|row| row.seq)
        {
            self.signed_seq = self.signed_seq.max(seq);
        }
    }

    /// Rows of other writers were taken on without being read here (too many to read
    /// under the lock): catch up from the store before signing.
    pub(super) fn skipped(&mut self) {
        self.stale = true;
    }

    /// Whether rows after the last checkpoint record are not signed yet.
    pub(super) fn unsigned(&self, tip: &Tip) -> bool {
        tip.seq > self.signed_seq
    }

    /// When the next checkpoint is due, if rows wait for one.
    pub(super) fn due_at(&self, tip: &Tip) -> Option<Instant> {
        self.unsigned(tip).then(|| self.last + self.every)
    }

    /// Make the range end at `tip`, reading the store for rows not fed (at start-up, or
    /// after [`Self::skipped`]); before [`Self::checkpoint`], outside the append lock.
    pub(super) fn ready(&mut self, trail: &dyn AuditStore, tip: &Tip) -> Result<(), StoreError> {
        if self.stale || self.range.upto != *tip {
            self.catch_up(trail, Some(tip))?;
        }
        Ok(())
    }

    /// The checkpoint record for the rows up to `tip`, under the append lock (the range
    /// having been fed what other writers appended since [`Self::ready`]); why not, when
    /// the range does not end at `tip`.
    pub(super) fn checkpoint(&self, tip: &Tip) -> Result<AuditRecord, String> {
        if self.stale || self.range.upto != *tip {
            return Err(format!(
                "the signed range ends at record {} where the chain ends at record {}",
                self.range.upto.seq, tip.seq
            ));
        }
        let now = crate::store::now_ms();
        let checkpoint = self.signer.sign(&self.range, now);
        Ok(AuditRecord {
            ts_ms: now,
            request_id: crate::ids::request_id(),
            kind: "audit".into(),
            decision: CHECKPOINT.into(),
            checkpoint: Some(checkpoint),
            ..Default::default()
        })
    }

    /// `checkpoint` was committed as `rows` (its own row last): the next range starts at
    /// its range's end, and takes in the rows since (the checkpoint record among them).
    pub(super) fn signed(&mut self, checkpoint: &Checkpoint, rows: &[AuditRow]) {
        self.range = RangeDigest::after(Tip {
            seq: checkpoint.to,
            hash: checkpoint.to_hash.clone(),
        });
        self.stale = false;
        self.last = Instant::now();
        if let Some(own) = rows.last() {
            self.signed_seq = own.seq;
        }
        self.written(rows);
    }

    /// Feed the rows after the range from the store, up to `tip` (all of them: `None`).
    ///
    /// A row that does not follow the one before is a loss the chain's check accepted: the
    /// rows an operator acknowledged with `audit reanchor` (anything else is refused before
    /// it gets here). The range starts again at that row, so that an export across the
    /// loss shows it, and one after it verifies.
    fn catch_up(&mut self, trail: &dyn AuditStore, tip: Option<&Tip>) -> Result<(), StoreError> {
        let range = &mut self.range;
        let signed_seq = &mut self.signed_seq;
        trail.scan(range.upto.seq, &mut |row| {
            if tip.is_some_and(|t| row.seq > t.seq) {
                return false;
            }
            if !range.feed(&row) {
                tracing::warn!(
                    seq = row.seq,
                    after = range.upto.seq,
                    "audit records missing before this one (acknowledged by a re-anchor): the \
                     next signed checkpoint covers from here"
                );
                *range = RangeDigest::after(Tip {
                    seq: row.seq - 1,
                    hash: row.prev.clone(),
                });
                range.feed(&row);
            }
            if row.decision == CHECKPOINT {
                *signed_seq = row.seq;
            }
            true
        })?;
        if let Some(tip) = tip {
            if self.range.upto != *tip {
                return Err(StoreError::Backend(format!(
                    "the audit chain ends at record {} where the writer committed record {}",
                    self.range.upto.seq, tip.seq
                )));
            }
        }
        self.stale = false;
        Ok(())
    }
}
