//! The sessions aggregate: one row per session ever created, so that live sessions survive
//! a restart and an ended parent's agent is still known to its children.

use crate::StoreError;

/// A session as created.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSessionRow<'a> {
    pub id: &'a str,
    pub agent: &'a str,
    pub tenant: &'a str,
    /// Seconds since the epoch.
    pub created_at: i64,
    pub expires_at: i64,
    pub depth: u32,
    pub parent: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub max_calls: Option<i64>,
    pub max_cost: Option<f64>,
}

/// A live session as loaded at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: String,
    pub agent: String,
    pub tenant: String,
    pub depth: u32,
    /// Seconds since the epoch.
    pub expires_at: i64,
    pub parent: Option<String>,
    /// The parent's agent, from the parent's row (which stays after the parent ends).
    pub parent_agent: Option<String>,
    pub profile: Option<String>,
}

/// Where sessions are kept.
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Record a new session.
    fn insert(&self, row: &NewSessionRow<'_>) -> Result<(), StoreError>;
    /// Mark a session revoked at `at` (seconds); a session already revoked keeps its first
    /// revocation time.
    fn revoke(&self, id: &str, at: i64) -> Result<(), StoreError>;
    /// Sessions neither revoked nor expired at `now` (seconds).
    fn live(&self, now: i64) -> Result<Vec<SessionRow>, StoreError>;
    /// Session `id`, if it is live at `now`: how a replica learns of a session another
    /// made. The default scans [`SessionStore::live`]; a shared backend looks it up.
    fn get_live(&self, id: &str, now: i64) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.live(now)?.into_iter().find(|row| row.id == id))
    }
    /// Add `labels` to session `id`'s (`context.session.labels`) at `at_ms`; a label it has
    /// already keeps its first time. Labels are never taken off: what a session touched
    /// stays touched.
    fn add_labels(&self, id: &str, labels: &[String], at_ms: i64) -> Result<(), StoreError>;
    /// Give `child` every label `parent` has now (a spawn: taint does not wash out).
    fn inherit_labels(&self, parent: &str, child: &str, at_ms: i64) -> Result<(), StoreError>;
    /// Session `id`'s labels, sorted.
    fn labels(&self, id: &str) -> Result<Vec<String>, StoreError>;
}
