//! `ostiary audit export` and `ostiary audit verify --offline`: a slice of the chain with
//! the signed checkpoints that cover it, and its check with nothing but the public key.
//!
//! The format (docs/audit-export.md) is JSON lines: a header, then one line per row in
//! sequence order, each with the record's text exactly as sealed. An export runs from the
//! start of a signed range to the newest checkpoint record, so that every row in it is in
//! the range of a checkpoint it also holds (the last checkpoint record is vouched for by
//! its own signature); rows newer than that checkpoint wait for the next export.
//!
//! What the check proves: every row of the file is as the holder of the signing key
//! signed it, none was added, removed or reordered. What it cannot: that the chain did not
//! go on after the file's last checkpoint (compare its `signed_ms` with when you asked).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::attest::{self, Checkpoint, PublicKey, RangeDigest};
use crate::store::audit::{AuditStore, Tip};
use crate::store::StoreError;

/// The header's `format`.
pub const FORMAT: &str = "ostiary-audit-export";
/// The header's `version`.
pub const VERSION: u32 = 1;

/// Ranges a check follows at once: one per writer that signed since the file's start
/// (replicas sharing a chain); past this many, the oldest is given up.
const OPEN_RANGES: usize = 64;

/// The first line of an export.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Header {
    pub format: String,
    pub version: u32,
    /// The first and last row exported.
    pub first: i64,
    pub last: i64,
    /// Checkpoint records among them.
    pub checkpoints: usize,
    /// The key that signed the newest one.
    pub key: String,
    pub exported_ms: i64,
}

/// One row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Line {
    pub seq: i64,
    pub prev: String,
    pub hash: String,
    /// The record's JSON text, exactly as sealed and digested.
    pub record: String,
}

/// Why nothing was exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "the audit chain has no signed checkpoint yet: one is made every \
         `audit.signed_checkpoint_interval` while records come, and at shutdown"
    )]
    NothingSigned,
    #[error(
        "no record at or after that time is covered by a signed checkpoint yet (the newest \
         covers up to record {last}); export again after the next one"
    )]
    NothingSince { last: i64 },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("writing the export: {0}")]
    Write(#[from] std::io::Error),
    #[error("serialising the export: {0}")]
    Serialise(#[from] serde_json::Error),
}

/// What was exported, and what was left for later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub header: Header,
    /// Rows newer than the last checkpoint, not exported.
    pub unsigned: i64,
    /// Rows before the first signed range (a chain from before checkpoints were signed),
    /// not exported.
    pub unsigned_before: i64,
}

/// Write the rows from the signed range holding the first record at or after `since_ms`
/// (the whole signed chain: `None`) to the newest checkpoint record.
pub fn export(
    trail: &dyn AuditStore,
    since_ms: Option<i64>,
    out: &mut dyn Write,
) -> Result<Exported, ExportError> {
    // First pass: the checkpoints (record seq, range) and where `since` falls.
    let mut checkpoints: Vec<(i64, Checkpoint)> = Vec::new();
    let mut first_since = None;
    let mut tip = 0;
    trail.scan(0, &mut |row| {
        tip = row.seq;
        if first_since.is_none() && since_ms.is_none_or(|t| row.ts_ms >= t) {
            first_since = Some(row.seq);
        }
        if row.decision == attest::CHECKPOINT {
            if let Some(c) = attest::checkpoint_of(&row.record) {
                checkpoints.push((row.seq, c));
            }
        }
        true
    })?;
    let Some((last, newest)) = checkpoints.last().cloned() else {
        return Err(ExportError::NothingSigned);
    };
    let wanted = match first_since {
        Some(seq) if seq <= last => seq,
        _ => return Err(ExportError::NothingSince { last }),
    };
    // The tightest signed range that starts at or before the first record wanted.
    let earliest = checkpoints
        .iter()
        .map(|(_, c)| c.from + 1)
        .min()
        .unwrap_or(1);
    let first = checkpoints
        .iter()
        .map(|(_, c)| c.from + 1)
        .filter(|start| *start <= wanted)
        .max()
        .unwrap_or(earliest);
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        first,
        last,
        checkpoints: checkpoints
            .iter()
            .filter(|(seq, _)| (first..=last).contains(seq))
            .count(),
        key: newest.key,
        exported_ms: crate::store::now_ms(),
    };
    serde_json::to_writer(&mut *out, &header)?;
    out.write_all(b"\n")?;
    let mut failed = None;
    trail.scan(first - 1, &mut |row| {
        if row.seq > last {
            return false;
        }
        let line = Line {
            seq: row.seq,
            prev: row.prev,
            hash: row.hash,
            record: row.record,
        };
        let written = serde_json::to_writer(&mut *out, &line)
            .map_err(ExportError::from)
            .and_then(|()| out.write_all(b"\n").map_err(ExportError::from));
        if let Err(e) = written {
            failed = Some(e);
            return false;
        }
        true
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    out.flush()?;
    Ok(Exported {
        header,
        unsigned: tip - last,
        unsigned_before: earliest - 1,
    })
}

/// What an intact export holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub first: i64,
    pub last: i64,
    /// Checkpoints whose signature and range were checked.
    pub checkpoints: usize,
    pub key: String,
    /// When the newest of them was signed.
    pub signed_ms: i64,
}

/// Why an export does not verify.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("reading the export: {0}")]
    Read(#[from] std::io::Error),
    #[error("line {line}: {problem}")]
    Format { line: usize, problem: String },
    /// What is wrong with an export that parses, each problem naming its records.
    #[error("{}", .0.join("; "))]
    Failed(Vec<String>),
}

/// Check an export against `key`, reading it once, holding no more than the open ranges.
pub fn verify_offline(input: impl BufRead, key: &PublicKey) -> Result<Verified, OfflineError> {
    let mut lines = input.lines().enumerate();
    let header: Header = match lines.next() {
        None => {
            return Err(OfflineError::Format {
                line: 1,
                problem: "the file is empty".into(),
            })
        }
        Some((_, text)) => serde_json::from_str(&text?).map_err(|e| OfflineError::Format {
            line: 1,
            problem: format!("not an export header: {e}"),
        })?,
    };
    if header.format != FORMAT || header.version != VERSION {
        return Err(OfflineError::Format {
            line: 1,
            problem: format!(
                "format {:?} version {}: this verifier reads {FORMAT:?} version {VERSION}",
                header.format, header.version
            ),
        });
    }
    let mut check = Check::new(key);
    for (n, text) in lines {
        let line: Line = serde_json::from_str(&text?).map_err(|e| OfflineError::Format {
            line: n + 1,
            problem: format!("not an export row: {e}"),
        })?;
        check.row(line);
    }
    check.finish(&header)
}

/// The state of one pass over an export.
struct Check<'k> {
    key: &'k PublicKey,
    /// The row before (none before the first).
    prev: Option<Tip>,
    first: Option<i64>,
    /// Ranges being followed, each from a possible range start.
    open: Vec<RangeDigest>,
    /// Ranges a verified checkpoint covers.
    covered: Vec<(i64, i64)>,
    /// The last row, when it is a checkpoint whose signature verified.
    last_signed: Option<(i64, i64)>,
    verified: usize,
    problems: Vec<String>,
}

impl<'k> Check<'k> {
    fn new(key: &'k PublicKey) -> Self {
        Self {
            key,
            prev: None,
            first: None,
            open: Vec::new(),
            covered: Vec::new(),
            last_signed: None,
            verified: 0,
            problems: Vec::new(),
        }
    }

    fn row(&mut self, line: Line) {
        let row = crate::store::audit::AuditRow {
            seq: line.seq,
            ts_ms: 0,
            session: None,
            decision: String::new(),
            record: line.record,
            prev: line.prev,
            hash: line.hash,
        };
        match &self.prev {
            None => {
                self.first = Some(row.seq);
                // The file starts a range.
                self.open.push(RangeDigest::after(Tip {
                    seq: row.seq - 1,
                    hash: row.prev.clone(),
                }));
            }
            Some(prev) if row.seq != prev.seq + 1 => self.problems.push(format!(
                "record {} follows record {} (records missing or reordered)",
                row.seq, prev.seq
            )),
            Some(prev) if row.prev != prev.hash => self.problems.push(format!(
                "record {} does not link to record {}",
                row.seq, prev.seq
            )),
            Some(_) => {}
        }
        self.last_signed = None;
        if let Some(checkpoint) = attest::checkpoint_of(&row.record) {
            self.checkpoint(row.seq, &checkpoint);
        }
        self.open.retain_mut(|range| range.feed(&row));
        self.prev = Some(Tip {
            seq: row.seq,
            hash: row.hash,
        });
    }

    /// A checkpoint record at `seq`: its signature, then its range against the one
    /// followed from its start; a new range starts at its end.
    fn checkpoint(&mut self, seq: i64, checkpoint: &Checkpoint) {
        if checkpoint.key != self.key.id() {
            self.problems.push(format!(
                "record {seq}: checkpoint signed by key {}, not the key given ({})",
                checkpoint.key,
                self.key.id()
            ));
            return;
        }
        if !checkpoint.verify(self.key) {
            self.problems.push(format!(
                "record {seq}: the checkpoint's signature does not verify"
            ));
            return;
        }
        if checkpoint.to != seq - 1 {
            self.problems.push(format!(
                "record {seq}: a checkpoint's range must end at the record before it, this one \
                 ends at record {}",
                checkpoint.to
            ));
            return;
        }
        self.last_signed = Some((seq, checkpoint.signed_ms));
        // A range not followed starts before the file (or at a start given up): it covers
        // nothing here, which the coverage check reports if it matters.
        if let Some(i) = self.open.iter().position(|r| r.from.seq == checkpoint.from) {
            let range = self.open.remove(i);
            if range.upto.seq != checkpoint.to
                || range.upto.hash != checkpoint.to_hash
                || range.from.hash != checkpoint.from_hash
                || range.hex() != checkpoint.digest
            {
                self.problems.push(format!(
                    "records {}–{} are not the ones the checkpoint at record {seq} signed",
                    checkpoint.from + 1,
                    checkpoint.to
                ));
            } else {
                self.verified += 1;
                self.covered.push((checkpoint.from + 1, checkpoint.to));
            }
        }
        self.open.push(RangeDigest::after(Tip {
            seq: checkpoint.to,
            hash: checkpoint.to_hash.clone(),
        }));
        if self.open.len() > OPEN_RANGES {
            self.open.remove(0);
        }
    }

    fn finish(mut self, header: &Header) -> Result<Verified, OfflineError> {
        let (Some(first), Some(last)) = (self.first, self.prev.as_ref().map(|t| t.seq)) else {
            return Err(OfflineError::Failed(vec![
                "the export holds no records".into()
            ]));
        };
        if (first, last) != (header.first, header.last) {
            self.problems.push(format!(
                "the header says records {}–{}, the file holds {first}–{last}",
                header.first, header.last
            ));
        }
        // Every row in a verified range, but the last if it is a checkpoint (its signature
        // vouches for it).
        let mut end = last;
        let signed_ms = match self.last_signed {
            Some((seq, ms)) if seq == last => {
                end = last - 1;
                Some(ms)
            }
            _ => None,
        };
        self.covered.sort_unstable();
        let mut reached = first - 1;
        for &(from, to) in &self.covered {
            if from > reached + 1 {
                self.problems.push(format!(
                    "records {}–{} are covered by no signed checkpoint",
                    reached + 1,
                    from - 1
                ));
            }
            reached = reached.max(to);
        }
        if reached < end {
            self.problems.push(format!(
                "records {}–{} are covered by no signed checkpoint{}",
                reached + 1,
                end,
                if signed_ms.is_none() {
                    " (the file does not end with one)"
                } else {
                    ""
                }
            ));
        }
        if !self.problems.is_empty() {
            return Err(OfflineError::Failed(self.problems));
        }
        Ok(Verified {
            first,
            last,
            checkpoints: self.verified,
            key: self.key.id().to_owned(),
            signed_ms: signed_ms.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
