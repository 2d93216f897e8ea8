//! Versioned migrations of the SQLite schema.
//!
//! `schema_version` holds one row per migration applied (version, name, when). [`migrate`]
//! applies those the database lacks, each in its own `IMMEDIATE` transaction together with
//! its row, so that a crash leaves the database at one version or the next and two
//! processes opening it at once apply each migration once. A database at a version newer
//! than [`LATEST`] was written by a newer Ostiary: it is refused, never written to.
//!
//! A migration is never edited once released; a change of schema is a new one appended to
//! [`MIGRATIONS`]. Version 1 is the schema as it stood when versions began: its statements
//! are idempotent, so a database from before versioning is adopted as it is.

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::{classify, describe};
use crate::StoreError;

/// One step of the schema.
struct Migration {
    version: i64,
    name: &'static str,
    apply: fn(&Transaction<'_>) -> rusqlite::Result<()>,
}

/// Every migration, in order.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "baseline: sessions, audit, leases, approvals and their outbox, guard state",
        apply: |tx| tx.execute_batch(BASELINE),
    },
    Migration {
        version: 2,
        name: "sessions.profile (the sandbox profile a session runs under)",
        // A database from before versioning may have it already (it was added then
        // without a version).
        apply: |tx| add_column(tx, "sessions", "profile", "TEXT"),
    },
    Migration {
        version: 3,
        name: "export_cursors (how far the audit trail's streams to a SIEM have delivered)",
        apply: |tx| tx.execute_batch(EXPORT_CURSORS),
    },
    Migration {
        version: 4,
        name: "runs, run_dedup and run_checkpoints (runs that triggers started)",
        apply: |tx| tx.execute_batch(RUNS),
    },
    Migration {
        version: 5,
        name: "runs.lease_until_ms (a running run's holder is alive until then)",
        apply: |tx| add_column(tx, "runs", "lease_until_ms", "INTEGER"),
    },
    Migration {
        version: 6,
        name: "run_rates (each trigger's rate, shared by replicas); indexes for one-at-a-time claims and the sweep",
        apply: |tx| tx.execute_batch(RUN_RATES),
    },
    Migration {
        version: 7,
        name: "policy_versions (the policy sets that were live, and when); approvals.held_policy_version and executed_policy_version",
        apply: |tx| {
            tx.execute_batch(POLICY_VERSIONS)?;
            add_column(tx, "approvals", "held_policy_version", "TEXT")?;
            add_column(tx, "approvals", "executed_policy_version", "TEXT")
        },
    },
    Migration {
        version: 8,
        name: "session_labels (what each session touched: the catalog's labels, kept for its life)",
        apply: |tx| tx.execute_batch(SESSION_LABELS),
    },
    Migration {
        version: 9,
        name: "undo_journal (for each successful call of a tool declaring undo, the request that reverses it)",
        apply: |tx| tx.execute_batch(UNDO_JOURNAL),
    },
];

/// The schema version this binary writes.
pub const LATEST: i64 = 9;

// `seq` is the recording order a session is reversed in, newest first. It is not a rowid
// alias (`id` is the key: the call's request id, recorded again by a retry), so the insert
// computes it as `MAX(seq) + 1` under SQLite's single writer; UNIQUE keeps that honest and
// serves the `MAX`. `request` is NULL for an entry that is unavailable from the start.
const UNDO_JOURNAL: &str = "
CREATE TABLE IF NOT EXISTS undo_journal (
    id          TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL UNIQUE,
    session     TEXT NOT NULL,
    recorded_ms INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    tier        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    args        TEXT NOT NULL,
    request     TEXT,
    status      TEXT NOT NULL,
    detail      TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    finished_ms INTEGER
);
CREATE INDEX IF NOT EXISTS undo_journal_session ON undo_journal(session, seq);
";

// One row per label a session took on; never deleted while the session row stays, so a
// child spawned later still inherits it.
const SESSION_LABELS: &str = "
CREATE TABLE IF NOT EXISTS session_labels (
    session  TEXT NOT NULL,
    label    TEXT NOT NULL,
    added_ms INTEGER NOT NULL,
    PRIMARY KEY (session, label)
);
";

// One row per set (its content-addressed id), however often it went live: at start-up, on
// every replica, again after a rollback to the same files.
const POLICY_VERSIONS: &str = "
CREATE TABLE IF NOT EXISTS policy_versions (
    version       TEXT PRIMARY KEY,
    first_live_ms INTEGER NOT NULL,
    last_live_ms  INTEGER NOT NULL,
    replaced_ms   INTEGER,
    policies      INTEGER NOT NULL,
    tools         INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS policy_versions_live ON policy_versions(last_live_ms);
";

// `full_at_us`: when the trigger's token bucket is full again (`RateLimit::take`). A run of a
// one-at-a-time trigger is claimed only while none of its runs is running, and starts no
// earlier than its last run ended: `(trigger, status)` and `(trigger, ended_ms)` answer
// both without reading the trigger's history.
const RUN_RATES: &str = "
CREATE TABLE IF NOT EXISTS run_rates (
    trigger    TEXT PRIMARY KEY,
    full_at_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_trigger_status ON runs(trigger, status);
CREATE INDEX IF NOT EXISTS runs_trigger_ended ON runs(trigger, ended_ms);
CREATE INDEX IF NOT EXISTS run_dedup_expires ON run_dedup(expires_ms);
";

// `limit_hit` is `RunRow::limit`: LIMIT is a reserved word in both dialects, and a column
// that needs quoting in every hand-written query is a trap.
const RUNS: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id               TEXT PRIMARY KEY,
    trigger          TEXT NOT NULL,
    kind             TEXT NOT NULL,
    status           TEXT NOT NULL,
    spec             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    payload_sha256   TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    created_ms       INTEGER NOT NULL,
    not_before_ms    INTEGER NOT NULL,
    started_ms       INTEGER,
    ended_ms         INTEGER,
    session          TEXT,
    holder           TEXT,
    exit_code        INTEGER,
    limit_hit        TEXT,
    error            TEXT,
    stderr_tail      TEXT,
    cost_micros      INTEGER,
    dead_letter      TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    parent_run       TEXT,
    approval         TEXT
);
CREATE INDEX IF NOT EXISTS runs_due ON runs(status, not_before_ms, created_ms);
CREATE INDEX IF NOT EXISTS runs_trigger ON runs(trigger);
CREATE TABLE IF NOT EXISTS run_dedup (
    trigger    TEXT NOT NULL,
    key        TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (trigger, key)
);
CREATE TABLE IF NOT EXISTS run_checkpoints (
    root     TEXT PRIMARY KEY,
    data     BLOB NOT NULL,
    saved_ms INTEGER NOT NULL
);
";

const EXPORT_CURSORS: &str = "
CREATE TABLE IF NOT EXISTS export_cursors (
    name           TEXT PRIMARY KEY,
    seq            INTEGER NOT NULL,
    holder         TEXT NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    delivered      INTEGER NOT NULL,
    last_error     TEXT,
    failed_ms      INTEGER
);
";

const BASELINE: &str = "
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

CREATE TABLE IF NOT EXISTS approval_caps (
    session TEXT PRIMARY KEY,
    parent  TEXT,
    max     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS approval_caps_parent ON approval_caps(parent);
CREATE TABLE IF NOT EXISTS approval_holds (
    approval_id TEXT PRIMARY KEY,
    session     TEXT NOT NULL,
    fingerprint TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS approval_holds_session ON approval_holds(session, fingerprint);
CREATE TABLE IF NOT EXISTS approval_notify_state (
    channel    TEXT NOT NULL,
    recipient  TEXT NOT NULL,
    open_ms    INTEGER NOT NULL,
    collecting INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (channel, recipient)
);
";

/// Bring the database to [`LATEST`]; refuse one that is newer.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_ms INTEGER NOT NULL
         )",
    )
    .map_err(classify)?;
    for m in MIGRATIONS {
        let failed = |e: rusqlite::Error| StoreError::Migration {
            version: m.version,
            name: m.name,
            reason: describe(&e),
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(classify)?;
        let current = version(&tx).map_err(classify)?;
        if current > LATEST {
            return Err(StoreError::TooNew {
                found: current,
                supported: LATEST,
            });
        }
        if current >= m.version {
            continue;
        }
        (m.apply)(&tx).map_err(failed)?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, ?2, ?3)",
            params![m.version, m.name, crate::now_ms()],
        )
        .map_err(failed)?;
        tx.commit().map_err(failed)?;
    }
    Ok(())
}

/// Refuse a database newer than this binary (read-only opens, which do not migrate).
pub(super) fn refuse_newer(conn: &Connection) -> Result<(), StoreError> {
    let has_table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(classify)?
        .is_some();
    if !has_table {
        return Ok(());
    }
    let found = version(conn).map_err(classify)?;
    if found > LATEST {
        return Err(StoreError::TooNew {
            found,
            supported: LATEST,
        });
    }
    Ok(())
}

/// The database's schema version (0: none applied).
pub fn version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )
}

/// Add `column` to `table` unless it is there (SQLite has no `ADD COLUMN IF NOT EXISTS`).
fn add_column(tx: &Transaction<'_>, table: &str, column: &str, decl: &str) -> rusqlite::Result<()> {
    let exists = tx
        .prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"
        ))?
        .exists([column])?;
    if !exists {
        tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &tempfile::TempDir) -> Connection {
        Connection::open(dir.path().join("db")).unwrap()
    }

    #[test]
    fn a_fresh_database_is_migrated_to_the_latest_version_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), LATEST);
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, MIGRATIONS.len() as i64);
        assert_eq!(MIGRATIONS.last().unwrap().version, LATEST);
    }

    #[test]
    fn a_database_from_before_versions_is_adopted_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        // What the last unversioned binary left: the baseline tables, the profile column
        // already added, a session in them.
        conn.execute_batch(BASELINE).unwrap();
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN profile TEXT")
            .unwrap();
        conn.execute(
            "INSERT INTO sessions (id, agent, tenant, created_at, expires_at, profile)
             VALUES ('s', 'a', 't', 1, 2, 'p')",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), LATEST);
        let profile: String = conn
            .query_row("SELECT profile FROM sessions WHERE id = 's'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(profile, "p");
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        migrate(&mut conn).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, 'future', 0)",
            [LATEST + 1],
        )
        .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, StoreError::TooNew { found, supported } if found == LATEST + 1 && supported == LATEST),
            "{err}"
        );
        assert!(err.to_string().contains("newer than this binary"), "{err}");
        assert!(matches!(
            refuse_newer(&conn),
            Err(StoreError::TooNew { .. })
        ));
        assert_eq!(version(&conn).unwrap(), LATEST + 1);
    }
}
