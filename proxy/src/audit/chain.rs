//! The chain's seals and its checkpoint: what a record's hash covers, what `audit.head`
//! holds, and the start-up check that refuses to extend a chain that no longer matches it.
//!
//! `audit.head` is one line, `<seq> <hash> <seal>`: the last committed record's sequence
//! number and hash, sealed with the audit key (`HMAC(key, "ostiary audit head" ‖ seq ‖
//! hash)`). Without the seal, whoever deletes the newest rows could write a head naming the
//! new last row (its hash is in the database); with it, only a genuine older head can be put
//! back. It is written to a temporary file, synced and renamed over the old one, so a crash
//! leaves the old head or the new one, never half a line.

use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::store::audit::{AuditRow, AuditStore};
pub use crate::store::audit::{Tip, GENESIS};
use crate::store::StoreError;

/// The seal of one record.
pub fn seal(key: &[u8], prev: &str, seq: i64, record_json: &str) -> String {
    Sealer::new(key).seal(prev, seq, record_json)
}

/// The audit key made ready to seal many records: HMAC's keyed state (a SHA-256 block of
/// key padding each for its inner and outer hash) is computed once and copied for each
/// seal, rather than computed again for every record the writer seals or a check reads.
#[derive(Clone)]
pub struct Sealer(Hmac<Sha256>);

impl Sealer {
    pub fn new(key: &[u8]) -> Self {
        Self(Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length"))
    }

    /// [`seal`] with this key: `HMAC(key, prev ‖ "\n" ‖ seq ‖ "\n" ‖ record)`, lowercase hex.
    pub fn seal(&self, prev: &str, seq: i64, record_json: &str) -> String {
        let mut mac = self.0.clone();
        mac.update(prev.as_bytes());
        mac.update(b"\n");
        mac.update(itoa::Buffer::new().format(seq).as_bytes());
        mac.update(b"\n");
        mac.update(record_json.as_bytes());
        crate::state::hex_lower(&mac.finalize().into_bytes())
    }
}

impl std::fmt::Debug for Sealer {
    /// The keyed state is as good as the key: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(***)")
    }
}

fn head_seal(sealer: &Sealer, seq: i64, hash: &str) -> String {
    // A domain of its own, so a head's seal can never be taken for a record's.
    sealer.seal("ostiary audit head", seq, hash)
}

/// What the checkpoint file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// No file: a chain that was never written, or a deleted checkpoint.
    Missing,
    /// Present and sealed with this key.
    Sealed(Tip),
    /// Present, but its seal does not verify (forged, written with another key, or by an
    /// Ostiary from before heads were sealed) or it does not parse.
    Unsealed(String),
}

/// Read the checkpoint at `path`.
pub fn read_head(key: &[u8], path: &Path) -> Result<Head, std::io::Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Head::Missing),
        Err(e) => return Err(e),
    };
    let parts: Vec<&str> = text.split_whitespace().collect();
    if parts.len() == 2 {
        return Ok(Head::Unsealed(
            "it has no seal: written by an Ostiary from before checkpoints were sealed, or by \
             someone without the audit key"
                .into(),
        ));
    }
    let [seq, hash, mac] = parts.as_slice() else {
        return Ok(Head::Unsealed(format!(
            "expected `<seq> <hash> <seal>`, found {} fields",
            parts.len()
        )));
    };
    let Ok(seq) = seq.parse::<i64>() else {
        return Ok(Head::Unsealed("the sequence number does not parse".into()));
    };
    let expected = head_seal(&Sealer::new(key), seq, hash);
    if !bool::from(expected.as_bytes().ct_eq(mac.as_bytes())) {
        return Ok(Head::Unsealed("its seal does not verify".into()));
    }
    Ok(Head::Sealed(Tip {
        seq,
        hash: (*hash).to_owned(),
    }))
}

/// Write the checkpoint atomically: a temporary file, synced, renamed over the old one.
pub fn write_head(sealer: &Sealer, path: &Path, tip: &Tip) -> Result<(), std::io::Error> {
    // A name of this write's own: writers sharing the state directory (replicas on one
    // store) each rename their own file over the head, never one another's half-written one.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("head.{}.{n}.tmp", std::process::id()));
    let line = format!(
        "{} {} {}\n",
        tip.seq,
        tip.hash,
        head_seal(sealer, tip.seq, &tip.hash)
    );
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(line.as_bytes())?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Why the writer refuses to extend the chain (at start-up), each naming what it found. The
/// operator's way out is `ostiary audit verify`, then `ostiary audit reanchor`.
#[derive(Debug)]
pub enum ChainError {
    /// The checkpoint names a record the database no longer has.
    Truncated {
        expected: i64,
        found: i64,
        path: PathBuf,
    },
    /// Records, but no checkpoint.
    CheckpointMissing {
        found: i64,
        path: PathBuf,
    },
    /// A checkpoint whose seal does not verify, or that does not parse.
    CheckpointUntrusted {
        reason: String,
        found: i64,
        path: PathBuf,
    },
    /// The record the checkpoint names has another hash.
    Diverged {
        seq: i64,
        found: i64,
        path: PathBuf,
    },
    /// The records after the checkpoint do not chain onto it.
    BrokenTail {
        checkpoint: i64,
        problem: String,
    },
    /// The checkpoint could not be read at all.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    Store(StoreError),
}

impl ChainError {
    /// What is wrong, without the advice (as a re-anchor records it).
    pub fn problem(&self) -> String {
        match self {
            ChainError::Truncated {
                expected,
                found,
                path,
            } => format!(
                "the audit chain ends at record {found} but its checkpoint {} names record \
                 {expected}: the newest {} records were deleted (or the database was replaced \
                 by an older copy)",
                path.display(),
                expected - found
            ),
            ChainError::CheckpointMissing { found, path } => format!(
                "the audit chain ends at record {found} but its checkpoint {} is missing: \
                 deletion of the newest records cannot be ruled out",
                path.display()
            ),
            ChainError::CheckpointUntrusted {
                reason,
                found,
                path,
            } => format!(
                "the audit checkpoint {} cannot be trusted ({reason}); the chain ends at record \
                 {found}",
                path.display()
            ),
            ChainError::Diverged { seq, found, path } => format!(
                "the audit chain's record {seq} is not the one its checkpoint {} names (the \
                 database was replaced or rewritten); the chain ends at record {found}",
                path.display()
            ),
            ChainError::BrokenTail {
                checkpoint,
                problem,
            } => format!(
                "the audit records after the checkpoint (record {checkpoint}) do not chain: \
                 {problem}"
            ),
            ChainError::Io { path, source } => format!(
                "the audit checkpoint {} cannot be read: {source}",
                path.display()
            ),
            ChainError::Store(e) => e.to_string(),
        }
    }

    /// Whether `ostiary audit reanchor` is the way out (not for a database or file that
    /// cannot be read at all).
    pub fn reanchorable(&self) -> bool {
        !matches!(self, ChainError::Io { .. } | ChainError::Store(_))
    }
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.problem())?;
        if self.reanchorable() {
            f.write_str(
                "; refusing to extend it. Run `ostiary audit verify` to see the chain, then \
                 `ostiary audit reanchor --reason <why>` (with the proxy stopped) to record the \
                 loss in the chain and go on",
            )?;
        }
        Ok(())
    }
}

// No `source`: the message already carries the cause, and `main` prints the chain.
impl std::error::Error for ChainError {}

impl From<StoreError> for ChainError {
    fn from(e: StoreError) -> Self {
        ChainError::Store(e)
    }
}

/// The start-up check: the chain in the database must still contain the record its
/// checkpoint names, and the records after it (at most a batch, written before a crash
/// could checkpoint them) must chain onto it. Returns the tip to extend. A chain and a
/// checkpoint that are both absent are a new chain.
pub fn check_tip(trail: &dyn AuditStore, key: &[u8], head_path: &Path) -> Result<Tip, ChainError> {
    let last = trail.last()?;
    let head = read_head(key, head_path).map_err(|source| ChainError::Io {
        path: head_path.to_owned(),
        source,
    })?;
    let found = last.as_ref().map_or(0, |t| t.seq);
    let path = head_path.to_owned();
    let checkpoint = match head {
        Head::Missing if last.is_none() => return Ok(Tip::genesis()),
        Head::Missing => return Err(ChainError::CheckpointMissing { found, path }),
        Head::Unsealed(reason) => {
            return Err(ChainError::CheckpointUntrusted {
                reason,
                found,
                path,
            })
        }
        Head::Sealed(tip) => tip,
    };
    if checkpoint.seq > found {
        return Err(ChainError::Truncated {
            expected: checkpoint.seq,
            found,
            path,
        });
    }
    if checkpoint.seq == 0 {
        if checkpoint.hash != GENESIS {
            return Err(ChainError::Diverged {
                seq: 0,
                found,
                path,
            });
        }
    } else {
        let stored = trail.hash_at(checkpoint.seq)?;
        if stored.as_deref() != Some(checkpoint.hash.as_str()) {
            return Err(ChainError::Diverged {
                seq: checkpoint.seq,
                found,
                path,
            });
        }
    }
    check_tail(trail, &Sealer::new(key), &checkpoint)?;
    Ok(last.unwrap_or_else(Tip::genesis))
}

/// What is wrong with `row` as the record after `tip`, if anything: numbered on from it,
/// linked to it, carrying a valid seal.
fn problem_after(sealer: &Sealer, tip: &Tip, row: &AuditRow) -> Option<String> {
    let seq = row.seq;
    if seq != tip.seq + 1 {
        Some(format!(
            "record {seq} follows record {} (records missing)",
            tip.seq
        ))
    } else if row.prev != tip.hash {
        Some(format!(
            "record {seq} does not link to the record before it"
        ))
    } else if !bool::from(
        sealer
            .seal(&row.prev, seq, &row.record)
            .as_bytes()
            .ct_eq(row.hash.as_bytes()),
    ) {
        Some(format!("record {seq} does not match its seal"))
    } else {
        None
    }
}

/// [`check_tail`] over rows in hand (another writer's, read under the append lock): the
/// last of them, or why they do not follow `tip`.
pub(crate) fn check_rows(sealer: &Sealer, tip: &Tip, rows: &[AuditRow]) -> Result<Tip, String> {
    let mut tip = tip.clone();
    for row in rows {
        if let Some(problem) = problem_after(sealer, &tip, row) {
            return Err(problem);
        }
        tip = Tip {
            seq: row.seq,
            hash: row.hash.clone(),
        };
    }
    Ok(tip)
}

/// The records after `checkpoint` are numbered on from it, link to it and carry valid seals;
/// the last of them (or `checkpoint` when there are none).
pub(crate) fn check_tail(
    trail: &dyn AuditStore,
    sealer: &Sealer,
    checkpoint: &Tip,
) -> Result<Tip, ChainError> {
    let mut tip = checkpoint.clone();
    let mut problem = None;
    trail.scan(checkpoint.seq, &mut |row| {
        problem = problem_after(sealer, &tip, &row);
        tip = Tip {
            seq: row.seq,
            hash: row.hash,
        };
        problem.is_none()
    })?;
    match problem {
        None => Ok(tip),
        Some(problem) => Err(ChainError::BrokenTail {
            checkpoint: checkpoint.seq,
            problem,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keyed state copied for each seal gives what HMAC keyed afresh gives, for every
    /// key length HMAC treats apart (shorter than a block, a block, hashed down), and a
    /// sealer reused across records carries nothing from one seal to the next.
    #[test]
    fn a_sealer_seals_as_the_key_does_and_keeps_nothing_between_seals() {
        for key in [&b"k"[..], &[7u8; 64][..], &[9u8; 65][..]] {
            let sealer = Sealer::new(key);
            for (prev, seq, json) in [
                (GENESIS, 1, "{}"),
                ("ab", i64::MAX, "{\"a\":1}"),
                ("", -1, ""),
            ] {
                let mut fresh = Hmac::<Sha256>::new_from_slice(key).unwrap();
                fresh.update(format!("{prev}\n{seq}\n{json}").as_bytes());
                let expected = crate::state::hex_lower(&fresh.finalize().into_bytes());
                assert_eq!(sealer.seal(prev, seq, json), expected);
                assert_eq!(seal(key, prev, seq, json), expected);
            }
        }
        assert_ne!(
            Sealer::new(b"a").seal("", 1, "x"),
            Sealer::new(b"b").seal("", 1, "x")
        );
        assert_eq!(format!("{:?}", Sealer::new(b"secret")), "Sealer(***)");
    }

    #[test]
    fn a_head_is_sealed_and_a_forged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.head");
        let key = b"k";
        assert_eq!(read_head(key, &path).unwrap(), Head::Missing);
        let tip = Tip {
            seq: 7,
            hash: "ab".repeat(32),
        };
        write_head(&Sealer::new(key), &path, &tip).unwrap();
        assert_eq!(read_head(key, &path).unwrap(), Head::Sealed(tip.clone()));
        assert!(matches!(
            read_head(b"other key", &path).unwrap(),
            Head::Unsealed(_)
        ));
        // A head naming an earlier record, written without the key.
        std::fs::write(
            &path,
            format!("6 {} {}\n", "cd".repeat(32), "00".repeat(32)),
        )
        .unwrap();
        assert!(matches!(read_head(key, &path).unwrap(), Head::Unsealed(_)));
        // The format of an Ostiary from before heads were sealed.
        std::fs::write(&path, format!("7 {}\n", tip.hash)).unwrap();
        assert!(matches!(read_head(key, &path).unwrap(), Head::Unsealed(_)));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
