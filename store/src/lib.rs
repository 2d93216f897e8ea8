//! Ostiary's durable state, behind one interface.
//!
//! Map:
//! - one trait per aggregate, each with its row types: [`approvals::ApprovalStore`] (held
//!   requests, link nonces, Slack replays, the bounds on holds and the notification
//!   outbox), [`sessions::SessionStore`], [`guard::GuardStore`] (pauses, dead letters,
//!   idempotency keys, session accounts), [`audit::AuditStore`] (append, query, read back
//!   for verification), [`leases::LeaseStore`] (the broker's lease journal),
//!   [`cursors::CursorStore`] (how far the audit trail's exports have delivered) and
//!   [`runs::RunStore`] (runs that triggers started: their queue, deliveries' dedup keys,
//!   checkpoints), [`policy_versions::PolicyVersionStore`] (the policy sets that were
//!   live, and when) and [`undo::UndoStore`] (the undo journal: for each successful call
//!   of a tool declaring `undo`, the request that reverses it);
//! - [`StoreError`]: why a store call failed, with no driver type in it;
//! - [`Call`]: how async code runs a store call (every trait is blocking; see below);
//! - [`sqlite`]: the embedded backend — one database file, versioned migrations
//!   ([`sqlite::migrations`]), one way of opening and using connections;
//! - [`postgres`]: the shared backend — one database (or schema) for several replicas, the
//!   same migrations in its dialect ([`postgres::migrations`]);
//! - [`suite`]: the store test suite, written against the traits only, so that every
//!   backend runs the same assertions (`tests/sqlite.rs` and `tests/postgres.rs` run it).
//!
//! The traits are synchronous: the embedded backend is SQLite, whose calls block, and
//! callers already run them on tokio's blocking pool ([`Call::call`]). A networked backend
//! implements them the same way (a blocking client, or `Handle::block_on` on the pool
//! thread), so that no caller changes with the backend.

use std::sync::Arc;

pub mod approvals;
pub mod audit;
mod call;
pub mod cursors;
mod error;
pub mod guard;
pub mod leases;
pub mod policy_versions;
pub mod postgres;
pub mod runs;
pub mod sessions;
pub mod sqlite;
pub mod suite;
pub mod undo;

pub use call::Call;
pub use error::StoreError;

/// Every aggregate's store, as the server hands them out: each consumer takes the one it
/// uses, not this bundle.
#[derive(Debug, Clone)]
pub struct Stores {
    pub approvals: Arc<dyn approvals::ApprovalStore>,
    pub sessions: Arc<dyn sessions::SessionStore>,
    pub guard: Arc<dyn guard::GuardStore>,
    pub audit: Arc<dyn audit::AuditStore>,
    pub leases: Arc<dyn leases::LeaseStore>,
    pub cursors: Arc<dyn cursors::CursorStore>,
    pub runs: Arc<dyn runs::RunStore>,
    pub policy_versions: Arc<dyn policy_versions::PolicyVersionStore>,
    pub undo: Arc<dyn undo::UndoStore>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
