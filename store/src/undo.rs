//! The undo journal: for each successful call of a catalog tool that declares `undo`, the
//! request that reverses it, rendered when the call succeeded (docs/undo.md).
//!
//! The store does not read the requests it keeps: `request`, `args` and `subject` are JSON
//! text the proxy wrote and reads back. What the store owns is the order (a session's
//! entries come back newest first, the order they are reversed in) and the exactly-once
//! guard: an entry runs only after [`UndoStore::claim`] moved it to `running`, one guarded
//! `UPDATE`, so of any number of callers or replicas only one sends it.

use crate::StoreError;

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UndoStatus {
    /// Recorded, not reversed yet (or refused or failed before: tried again next time).
    Pending,
    /// Claimed by an undo that is sending it.
    Running,
    /// Reversed: the upstream answered the undo request with a 2xx.
    Done,
    /// The last try failed (the upstream answered otherwise, or could not be reached).
    Failed,
    /// The last try was refused by policy.
    Refused,
    /// No undo request could be recorded for the call (a value it needs was missing, too
    /// large or looked like a secret): nothing to send, ever.
    Unavailable,
}

impl UndoStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UndoStatus::Pending => "pending",
            UndoStatus::Running => "running",
            UndoStatus::Done => "done",
            UndoStatus::Failed => "failed",
            UndoStatus::Refused => "refused",
            UndoStatus::Unavailable => "unavailable",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => UndoStatus::Pending,
            "running" => UndoStatus::Running,
            "done" => UndoStatus::Done,
            "failed" => UndoStatus::Failed,
            "refused" => UndoStatus::Refused,
            "unavailable" => UndoStatus::Unavailable,
            _ => return None,
        })
    }

    /// Whether an undo may claim it: never reversed, and something to send.
    pub fn claimable(self) -> bool {
        matches!(
            self,
            UndoStatus::Pending | UndoStatus::Failed | UndoStatus::Refused
        )
    }
}

/// An entry as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUndo<'a> {
    /// The id of the call it reverses (its audit record's `request_id`); unique.
    pub id: &'a str,
    pub session: &'a str,
    /// When the call succeeded (milliseconds since the epoch).
    pub recorded_ms: i64,
    /// The catalog tool called.
    pub tool: &'a str,
    pub tier: &'a str,
    /// Who called it, as policy saw them (JSON, the proxy's own shape).
    pub subject: &'a str,
    /// The call's arguments as kept for the undo's decision (JSON, secrets redacted).
    pub args: &'a str,
    /// The undo request (JSON); `None` when [`UndoStatus::Unavailable`].
    pub request: Option<&'a str>,
    /// `Pending`, or `Unavailable` with `detail` saying why.
    pub status: UndoStatus,
    pub detail: Option<&'a str>,
}

/// An entry as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRow {
    pub id: String,
    /// Recording order across the whole store: a session's entries are reversed highest
    /// first.
    pub seq: i64,
    pub session: String,
    pub recorded_ms: i64,
    pub tool: String,
    pub tier: String,
    pub subject: String,
    pub args: String,
    pub request: Option<String>,
    pub status: UndoStatus,
    /// Why it is unavailable, or what its last try met (the upstream's status, the policy
    /// that refused it).
    pub detail: Option<String>,
    /// How many times an undo sent (or tried to send) it.
    pub attempts: i64,
    /// When it last left `running` (milliseconds).
    pub finished_ms: Option<i64>,
}

/// Where undo requests are kept.
pub trait UndoStore: Send + Sync + std::fmt::Debug {
    /// Record an entry. Recording the same `id` again changes nothing.
    fn record(&self, entry: &NewUndo<'_>) -> Result<(), StoreError>;
    /// `session`'s entries recorded at or after `since_ms`, newest first (highest `seq`).
    fn list(&self, session: &str, since_ms: i64) -> Result<Vec<UndoRow>, StoreError>;
    /// Move entry `id` to `running` if it is claimable (pending, failed or refused),
    /// counting the attempt: `true` for the one caller that did.
    fn claim(&self, id: &str) -> Result<bool, StoreError>;
    /// Move a `running` entry to `status` (done, failed, refused) with `detail`; an entry
    /// not running is left as it is (`false`).
    fn finish(
        &self,
        id: &str,
        status: UndoStatus,
        detail: &str,
        at_ms: i64,
    ) -> Result<bool, StoreError>;
}
