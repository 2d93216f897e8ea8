//! The embedded backend: one SQLite database file holding every aggregate.
//!
//! One connection strategy: [`connect`] opens every connection the same way (WAL, so that
//! the CLI reads while the server writes; `synchronous = FULL`, so that nothing
//! acknowledged — a held request's `202` — is lost to a power cut), and each aggregate owns
//! one connection behind a mutex ([`Db`]), used from blocking threads ([`crate::Call`]).
//! SQLite allows one writer at a time whatever the number of connections; one per
//! aggregate keeps a slow audit batch from queueing an approval behind it in this process,
//! and each waits for the file lock up to its own busy timeout. Migrations run once, in [`open`], before any aggregate is handed out.
//!
//! The audit chain's connection is the one exception: it commits with `synchronous =
//! NORMAL` and its writer makes the log durable with [`crate::audit::AuditStore::sync`]
//! before a head checkpoint names the rows (see `audit.rs`): one WAL sync per checkpoint
//! instead of one per group commit, which was most of the audit writer's cost.
//!
//! `rusqlite` appears in this module and nowhere else in the workspace's libraries.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::{StoreError, Stores};

mod approvals;
mod audit;
mod bounds;
mod cursors;
mod guard;
mod leases;
pub mod migrations;
mod outbox;
mod policy_versions;
mod runs;
mod sessions;
mod undo;

/// How long a call waits for another connection's write lock before it fails
/// ([`StoreError::Busy`]).
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub busy_timeout: Duration,
    /// The audit writer's: short, so that a database held by someone else makes the trail
    /// unavailable (and forwarding stop) within a bound rather than after five seconds.
    pub audit_busy_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            audit_busy_timeout: Duration::from_millis(250),
        }
    }
}

/// Open (creating and migrating) the database at `path`: every aggregate's store.
pub fn open(path: &Path) -> Result<Stores, StoreError> {
    open_with(path, Options::default())
}

/// [`open`] with other timeouts.
pub fn open_with(path: &Path, options: Options) -> Result<Stores, StoreError> {
    {
        let mut conn = connect(path, Mode::ReadWrite, options.busy_timeout)?;
        migrations::migrate(&mut conn)?;
    }
    let db = |busy| connect(path, Mode::ReadWrite, busy).map(Db::new);
    let audit = connect(path, Mode::AuditLog, options.audit_busy_timeout)?;
    Ok(Stores {
        approvals: Arc::new(approvals::SqliteApprovals(db(options.busy_timeout)?)),
        sessions: Arc::new(sessions::SqliteSessions(db(options.busy_timeout)?)),
        guard: Arc::new(guard::SqliteGuard(db(options.busy_timeout)?)),
        audit: Arc::new(audit::SqliteAudit::new(Db::new(audit), path)),
        leases: Arc::new(leases::SqliteLeases(db(options.busy_timeout)?)),
        cursors: Arc::new(cursors::SqliteCursors(db(options.busy_timeout)?)),
        runs: Arc::new(runs::SqliteRuns(db(options.busy_timeout)?)),
        policy_versions: Arc::new(policy_versions::SqlitePolicyVersions(db(
            options.busy_timeout
        )?)),
        undo: Arc::new(undo::SqliteUndo(db(options.busy_timeout)?)),
    })
}

/// Open an existing database read-only (the CLI's queries while a server may be writing),
/// without migrating it; a database newer than this binary is refused. Writes through
/// these stores fail.
pub fn open_read_only(path: &Path) -> Result<Stores, StoreError> {
    let busy = Options::default().busy_timeout;
    let db = || connect(path, Mode::ReadOnly, busy).map(Db::new);
    {
        let conn = connect(path, Mode::ReadOnly, busy)?;
        migrations::refuse_newer(&conn)?;
    }
    Ok(Stores {
        approvals: Arc::new(approvals::SqliteApprovals(db()?)),
        sessions: Arc::new(sessions::SqliteSessions(db()?)),
        guard: Arc::new(guard::SqliteGuard(db()?)),
        audit: Arc::new(audit::SqliteAudit::read_only(db()?)),
        leases: Arc::new(leases::SqliteLeases(db()?)),
        cursors: Arc::new(cursors::SqliteCursors(db()?)),
        runs: Arc::new(runs::SqliteRuns(db()?)),
        policy_versions: Arc::new(policy_versions::SqlitePolicyVersions(db()?)),
        undo: Arc::new(undo::SqliteUndo(db()?)),
    })
}

/// Only the audit trail, read-only, on one connection of its own: what a server's queries
/// and the CLI read beside a running writer. Not migrated; a database newer than this binary
/// is refused.
pub fn open_audit_reader(path: &Path) -> Result<Arc<dyn crate::audit::AuditStore>, StoreError> {
    let conn = connect(path, Mode::ReadOnly, Options::default().busy_timeout)?;
    migrations::refuse_newer(&conn)?;
    Ok(Arc::new(audit::SqliteAudit::read_only(Db::new(conn))))
}

/// The most pages a connection caches, in KiB (SQLite's default is 2,000 KiB on each
/// connection). An aggregate's call reads a few pages (a session's row, an approval's), and
/// the kernel's page cache holds the file anyway; but each connection's cache grew towards
/// its bound with every page it had touched, the audit writer's with every page it wrote
/// (1.6 MB of the proxy's heap after 1,000 requests), a reader's with every page of the
/// trail it scanned.
const PAGE_CACHE_KIB: i64 = 256;

/// The audit writer's: one group commit dirties about a KiB per record, and a transaction
/// whose dirty pages outgrow the cache writes them to the WAL before its commit. A few
/// hundred records, a 20 ms group at tens of thousands of requests a second, fit.
const AUDIT_PAGE_CACHE_KIB: i64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every commit synced (`synchronous = FULL`).
    ReadWrite,
    /// Commits synced only when the caller asks (`synchronous = NORMAL`): a crash of the
    /// process loses nothing committed, a power cut what was committed since the last sync.
    AuditLog,
    ReadOnly,
}

/// Every connection, opened one way.
fn connect(path: &Path, mode: Mode, busy: Duration) -> Result<Connection, StoreError> {
    let unavailable = |e: rusqlite::Error| {
        StoreError::Unavailable(format!("{}: {}", path.display(), describe(&e)))
    };
    let conn = match mode {
        Mode::ReadWrite | Mode::AuditLog => Connection::open(path),
        Mode::ReadOnly => Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
    }
    .map_err(unavailable)?;
    conn.busy_timeout(busy).map_err(unavailable)?;
    let cache_kib = match mode {
        Mode::AuditLog => AUDIT_PAGE_CACHE_KIB,
        Mode::ReadWrite | Mode::ReadOnly => PAGE_CACHE_KIB,
    };
    // Negative: a size in KiB rather than a count of pages.
    conn.pragma_update(None, "cache_size", -cache_kib)
        .map_err(unavailable)?;
    let synchronous = match mode {
        Mode::ReadWrite => "FULL",
        Mode::AuditLog => "NORMAL",
        Mode::ReadOnly => return Ok(conn),
    };
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(unavailable)?;
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(unavailable)?;
    Ok(conn)
}

/// One aggregate's connection.
#[derive(Debug)]
struct Db(Mutex<Connection>);

impl Db {
    fn new(conn: Connection) -> Self {
        Self(Mutex::new(conn))
    }

    /// Run `f` on the connection; its error classified.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .0
            .lock()
            .map_err(|e| StoreError::Task(format!("database connection lock poisoned: {e}")))?;
        f(&mut conn).map_err(classify)
    }
}

/// A driver error as a [`StoreError`]: busy and locked apart (a writer elsewhere), values
/// that do not convert as corrupt data, the rest with the driver's message.
fn classify(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) =>
        {
            StoreError::Busy(describe(&e))
        }
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                ErrorCode::CannotOpen
                    | ErrorCode::DiskFull
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::PermissionDenied
                    | ErrorCode::ReadOnly
            ) =>
        {
            StoreError::Unavailable(describe(&e))
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(describe(&e)),
        _ => StoreError::Backend(describe(&e)),
    }
}

/// The driver's message (a failure's extended text when it has one).
fn describe(e: &rusqlite::Error) -> String {
    e.to_string()
}

/// JSON text of a plain struct (string keys only: cannot fail).
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A JSON column, parsed; a row that does not parse is corrupt data.
fn parse_json<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    idx: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection bounds its page cache, the audit writer's to its own bound; a
    /// connection left at SQLite's default grew to 2,000 KiB.
    #[test]
    fn every_connection_bounds_its_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ostiary.db");
        let busy = Duration::from_secs(1);
        let cache = |mode| -> i64 {
            connect(&path, mode, busy)
                .unwrap()
                .query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(cache(Mode::ReadWrite), -PAGE_CACHE_KIB);
        assert_eq!(cache(Mode::AuditLog), -AUDIT_PAGE_CACHE_KIB);
        assert_eq!(cache(Mode::ReadOnly), -PAGE_CACHE_KIB);
        // Smaller than what a connection opened without the bound keeps.
        let default: i64 = Connection::open_in_memory()
            .unwrap()
            .query_row("PRAGMA cache_size", [], |r| r.get(0))
            .unwrap();
        assert!(
            -default > AUDIT_PAGE_CACHE_KIB,
            "SQLite's default: {default}"
        );
    }
}
