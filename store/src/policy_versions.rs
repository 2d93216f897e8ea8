//! The policy-version aggregate: which policy sets were live, and when (`ostiary policy
//! versions`, `GET /v1/policy/versions`).
//!
//! A set is named by its content-addressed version id (`ostiary_policies::PolicyVersion`),
//! so one row stands for one set however often it went live: at each start-up, on every
//! replica, and again when a reload brings back files that were live before. A row keeps
//! when the set first went live, when it last did, and — when it was replaced since — when.
//! Replicas sharing a database share the rows: a set one replica replaced may still be live
//! on another until that one reloads too, so "replaced" means "last replaced somewhere".

use crate::StoreError;

/// One set that was live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRow {
    /// The content-addressed id (`sha256:…`).
    pub version: String,
    /// When it first went live (milliseconds since the epoch).
    pub first_live_ms: i64,
    /// When it last went live: a start-up or a reload that loaded it.
    pub last_live_ms: i64,
    /// When another set last replaced it, unless it went live again since.
    pub replaced_ms: Option<i64>,
    /// Policies in the set.
    pub policies: i64,
    /// Tools in its catalog.
    pub tools: i64,
}

/// Which set a set going live takes the place of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaces<'a> {
    /// None known: a replica starting beside others that may still serve theirs.
    Nothing,
    /// The set this process served until now (a reload).
    Version(&'a str),
    /// Every other set: the start of the only process of its database, which served
    /// whatever it last loaded until it stopped.
    AllOthers,
}

/// A set going live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WentLive<'a> {
    pub version: &'a str,
    pub policies: i64,
    pub tools: i64,
    pub at_ms: i64,
    pub replaces: Replaces<'a>,
}

/// Where the history of live sets is kept.
pub trait PolicyVersionStore: Send + Sync + std::fmt::Debug {
    /// Record that a set went live (and what it replaced), in one transaction.
    fn went_live(&self, live: &WentLive<'_>) -> Result<(), StoreError>;
    /// The sets that were live, the most recently gone live first, at most `limit`.
    fn list(&self, limit: usize) -> Result<Vec<VersionRow>, StoreError>;
}
