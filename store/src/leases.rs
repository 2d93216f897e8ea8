//! The lease journal: every lease the broker owes a revocation, from the moment it is
//! fetched until Vault confirms it gone, so that the next process revokes what a crashed
//! one left behind.

use crate::StoreError;

/// How a lease is revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseKind {
    /// A Vault lease id (`sys/leases/revoke`).
    Vault,
    /// A PKI certificate, revoked by serial on its mount.
    Pki { mount: String, serial: String },
}

/// One lease owed a revocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub lease_id: String,
    pub session: String,
    /// The credential binding it was fetched for.
    pub binding: String,
    pub kind: LeaseKind,
    pub renewable: bool,
    /// Milliseconds since the epoch.
    pub expires_at_ms: Option<i64>,
}

/// Where the journal is kept.
pub trait LeaseStore: Send + Sync + std::fmt::Debug {
    /// A lease is owed (replaces an earlier row of the same id).
    fn owed(&self, row: &LeaseRow, now_ms: i64) -> Result<(), StoreError>;
    /// A lease was revoked (or found gone).
    fn settled(&self, lease_id: &str) -> Result<(), StoreError>;
    /// Every lease still owed.
    fn owed_leases(&self) -> Result<Vec<LeaseRow>, StoreError>;
}
