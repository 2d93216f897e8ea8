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
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the chain is kept.
pub trait AuditStore: Send + Sync + std::fmt::Debug {
    /// Append `rows` (numbered and sealed by the caller) in one transaction, provided the
    /// chain still ends at `after`; checked and written under one write lock.
    fn append(&self, after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError>;
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
}
