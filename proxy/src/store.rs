//! The embedded SQLite store: one database file in the state directory holding sessions,
//! the audit chain, the lease journal and the approval queue. WAL mode so that the CLI can
//! read (`ostiary audit query`) while the server writes.

use std::path::Path;

use rusqlite::Connection;

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database task failed: {0}")]
    Task(String),
}

const MIGRATION: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    agent       TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    revoked_at  INTEGER,
    parent      TEXT,
    depth       INTEGER NOT NULL DEFAULT 0,
    max_calls   INTEGER,
    max_cost    REAL
);
CREATE TABLE IF NOT EXISTS audit (
    seq       INTEGER PRIMARY KEY,
    ts_ms     INTEGER NOT NULL,
    session   TEXT,
    decision  TEXT NOT NULL,
    record    TEXT NOT NULL,
    prev      TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_session ON audit(session);
CREATE TABLE IF NOT EXISTS leases (
    lease_id      TEXT PRIMARY KEY,
    session       TEXT NOT NULL,
    binding       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    mount         TEXT,
    serial        TEXT,
    renewable     INTEGER NOT NULL,
    expires_at_ms INTEGER,
    created_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts_ms);
CREATE TABLE IF NOT EXISTS approvals (
    id                TEXT PRIMARY KEY,
    status            TEXT NOT NULL,
    created_ms        INTEGER NOT NULL,
    deadline_ms       INTEGER NOT NULL,
    renotify_ms       INTEGER NOT NULL,
    rounds            INTEGER NOT NULL,
    session           TEXT NOT NULL,
    agent             TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    policies          TEXT NOT NULL,
    policy_generation INTEGER NOT NULL,
    request           TEXT NOT NULL,
    observed          TEXT NOT NULL,
    approver          TEXT,
    channel           TEXT,
    decided_ms        INTEGER,
    reason            TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    result            TEXT,
    updated_ms        INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals(status);
CREATE INDEX IF NOT EXISTS approvals_session ON approvals(session);
CREATE TABLE IF NOT EXISTS approval_links_used (
    nonce       TEXT PRIMARY KEY,
    approval_id TEXT NOT NULL,
    used_ms     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS slack_callbacks_seen (
    signature TEXT PRIMARY KEY,
    seen_ms   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS approval_notifications (
    id          INTEGER PRIMARY KEY,
    approval_id TEXT NOT NULL,
    channel     TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    round       INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_ms     INTEGER NOT NULL,
    sent_ms     INTEGER,
    last_error  TEXT,
    UNIQUE (approval_id, channel, recipient, round)
);
CREATE TABLE IF NOT EXISTS session_accounts (
    session    TEXT PRIMARY KEY,
    account    TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS session_pauses (
    session     TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    dead_letter INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id          INTEGER PRIMARY KEY,
    session     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    snapshot    TEXT NOT NULL,
    resolved    TEXT,
    resolved_ms INTEGER
);
CREATE INDEX IF NOT EXISTS dead_letters_session ON dead_letters(session);
CREATE TABLE IF NOT EXISTS idempotency (
    session     TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state       TEXT NOT NULL,
    response    TEXT,
    created_ms  INTEGER NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE INDEX IF NOT EXISTS approval_notifications_due ON approval_notifications(sent_ms, next_ms);
";

/// Open (and migrate) the database file.
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(MIGRATION)?;
    // Columns added after a table first shipped: a database an older version created gets
    // them here (SQLite has no `ADD COLUMN IF NOT EXISTS`).
    add_column(&conn, "sessions", "profile", "TEXT")?;
    Ok(conn)
}

/// Add `column` to `table` unless it is there.
fn add_column(conn: &Connection, table: &str, column: &str, decl: &str) -> Result<(), StoreError> {
    let exists = conn
        .prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"
        ))?
        .exists([column])?;
    if !exists {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

/// Open an existing database read-only (CLI queries), without migrating.
pub fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
