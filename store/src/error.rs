//! Why a store call failed. Backend errors arrive here as text and a class (busy,
//! unavailable, corrupt), never as the driver's own type, so that no caller depends on the
//! backend and a second one maps into the same variants.

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or reached (missing directory, permissions, disk).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Another writer held the database for longer than the call may wait.
    #[error("database busy: {0}")]
    Busy(String),
    /// A statement failed for another reason (the message names it).
    #[error("database: {0}")]
    Backend(String),
    /// A stored value does not parse as what the column should hold.
    #[error("stored data does not parse: {0}")]
    Corrupt(String),
    /// The database was migrated by a newer Ostiary: this binary does not know its schema
    /// and must not write to it.
    #[error(
        "the database is at schema version {found}, newer than this binary knows ({supported}); \
         run the newer Ostiary, or restore a backup made before it ran"
    )]
    TooNew { found: i64, supported: i64 },
    /// A migration failed (the database stays at the version it was).
    #[error("migrating the database to schema version {version} ({name}): {reason}")]
    Migration {
        version: i64,
        name: &'static str,
        reason: String,
    },
    /// The task running the call failed (a panic, a poisoned lock, shutdown).
    #[error("database task failed: {0}")]
    Task(String),
}
