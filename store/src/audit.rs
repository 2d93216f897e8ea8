//! The audit aggregate: an append-only chain of sealed records. The store keeps rows and
//! answers queries; what a seal covers, the checkpoint file and verification are the
//! proxy's (`ostiary::audit`), so that a backend never needs the audit key.

use crate::StoreError;

/// Hash of the (virtual) record before the first one.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The last record of the chain: where the writer extends it, what the checkpoint names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tip {
    pub seq: i64,
    pub hash: String,
}

impl Tip {
    /// Before the first record.
    pub fn genesis() -> Self {
        Self {
            seq: 0,
            hash: GENESIS.to_owned(),
        }
    }
}

/// `items`, offering the thread's core to whatever waits for it (`sched_yield`) every 8
/// items, or every eighth of more than 64, as the writer walks them. The audit writer's
/// thread shares the cores with the requests it records, and a request woken onto its core
/// waits until the scheduler preempts the writer — after its time slice, not at the wakeup
/// (EEVDF runs the current task to parity first); a group commit's burst was most of the
/// one-client p99 the proxy added. Under load every yield finds a task waiting and costs a
/// context switch, so a batch yields about as often whatever its size (docs/benchmarks.md,
/// "The audit writer gives way").
pub fn yielding<T>(items: &[T]) -> impl Iterator<Item = &T> {
    let every = yield_every(items.len());
    items.iter().enumerate().map(move |(i, item)| {
        if i % every == every - 1 {
            std::thread::yield_now();
        }
        item
    })
}

/// How many of a batch's `len` items [`yielding`] walks between two offers of the core.
pub fn yield_every(len: usize) -> usize {
    (len / 8).max(8)
}

/// One record as stored: its sequence number, the columns queries filter on, the record
/// itself (JSON), the previous record's hash and its own seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub seq: i64,
    pub ts_ms: i64,
    pub session: Option<String>,
    pub decision: String,
    pub record: String,
    pub prev: String,
    pub hash: String,
}

/// Filters of `ostiary audit query` and `GET /v1/audit`.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub session: Option<String>,
    pub decision: Option<String>,
    /// Milliseconds since the epoch (inclusive).
    pub since_ms: Option<i64>,
    /// At most this many (10,000 when absent).
    pub limit: Option<u32>,
}

/// Why rows were not appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The chain no longer ends where the writer left it (a second writer, or rows
    /// deleted underneath it): nothing was written.
    #[error(
        "the chain was changed by another writer (it should end at record {expected}, it ends \
         at record {found}); restart to have it checked"
    )]
    Moved { expected: i64, found: i64 },
    /// More rows than [`ADOPT_MAX`] were appended by other writers since `after`: they are
    /// not read under the write lock; the caller checks them outside it and tries again.
    #[error("{found} records were appended after record {expected} by other writers")]
    Behind { expected: i64, found: i64 },
    /// The rows other writers appended do not check (the seal's verdict): nothing written.
    #[error("records another writer appended do not check: {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Most rows of other writers [`AuditStore::append_after`] reads under its write lock.
/// A writer that fell further behind than this (it stalled while others wrote) catches up
/// outside the lock, so that the lock is never held for a long read.
pub const ADOPT_MAX: i64 = 4_096;

/// What [`AuditStore::append_after`] calls under its write lock: given the rows other
/// writers appended after the caller's tip (oldest first; empty when there are none), the
/// rows to append after them — or why those rows do not check.
pub type Seal<'a> = dyn FnMut(&[AuditRow]) -> Result<Vec<AuditRow>, String> + 'a;

/// How an [`AuditStore::append_after`] transaction ended, inside a backend's connection
/// closure (whose error type is the driver's).
pub(crate) enum Adopted {
    Written(Vec<AuditRow>),
    Moved(i64),
    Behind(i64),
    Refused(String),
}

impl Adopted {
    /// Under the lock: the chain ends at `last`; `None` when the caller is to read the rows
    /// after `after` and seal, else why not.
    pub(crate) fn check(after: &Tip, last: &Tip) -> Option<Self> {
        if last.seq <= after.seq && last != after {
            Some(Self::Moved(last.seq))
        } else if last.seq - after.seq > ADOPT_MAX {
            Some(Self::Behind(last.seq))
        } else {
            None
        }
    }

    pub(crate) fn into_result(self, after: &Tip) -> Result<Vec<AuditRow>, AppendError> {
        match self {
            Self::Written(rows) => Ok(rows),
            Self::Moved(found) => Err(AppendError::Moved {
                expected: after.seq,
                found,
            }),
            Self::Behind(found) => Err(AppendError::Behind {
                expected: after.seq,
                found,
            }),
            Self::Refused(why) => Err(AppendError::Refused(why)),
        }
    }
}

/// Where the chain is kept.
pub trait AuditStore: Send + Sync + std::fmt::Debug {
    /// Append `rows` (numbered and sealed by the caller) in one transaction, provided the
    /// chain still ends at `after`; checked and written under one write lock.
    fn append(&self, after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError>;
    /// Append in one transaction what `seal` returns, `seal` being handed, under the same
    /// write lock, the rows other writers appended after `after` (at most [`ADOPT_MAX`]).
    /// Writers sharing the store (replicas on PostgreSQL) therefore never lose a race to
    /// each other: whoever holds the lock writes. The rows written are returned. A chain
    /// that ends before `after`, or differently at it, is `Moved` and nothing is written.
    fn append_after(&self, after: &Tip, seal: &mut Seal<'_>) -> Result<Vec<AuditRow>, AppendError>;
    /// The last row of the chain, if any.
    fn last(&self) -> Result<Option<Tip>, StoreError>;
    /// The newest row whose `decision` column is `decision` (the last signed checkpoint).
    fn last_decided(&self, decision: &str) -> Result<Option<AuditRow>, StoreError>;
    /// The hash of record `seq`, if it is stored.
    fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError>;
    /// Every row after `after`, in order, to `visit`, until it returns false.
    fn scan(&self, after: i64, visit: &mut dyn FnMut(AuditRow) -> bool) -> Result<(), StoreError>;
    /// The records matching `q`, oldest first (JSON texts).
    fn query(&self, q: &AuditQuery) -> Result<Vec<String>, StoreError>;
    /// The last `n` records of `session`, newest last (a watchdog trip's snapshot).
    fn recent(&self, session: &str, n: u32) -> Result<Vec<String>, StoreError>;
    /// Make every row appended so far survive a power cut. The writer calls it before a
    /// head checkpoint names those rows (a checkpoint naming a row the store then lost
    /// would read as a truncation at the next start), so that the appends themselves need
    /// not be synced one by one.
    fn sync(&self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::yielding;

    #[test]
    fn yielding_hands_back_every_item_in_order_whatever_the_batch() {
        for n in [0, 1, 7, 8, 9, 64, 65, 1000] {
            let items: Vec<usize> = (0..n).collect();
            let walked: Vec<usize> = yielding(&items).copied().collect();
            assert_eq!(walked, items, "a batch of {n}");
        }
    }
}
