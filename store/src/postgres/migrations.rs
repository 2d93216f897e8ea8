//! Versioned migrations of the PostgreSQL schema: the same versions as SQLite's
//! ([`crate::sqlite::migrations`]), in PostgreSQL's dialect.
//!
//! `schema_version` holds one row per migration applied. [`migrate`] takes a transaction-level
//! advisory lock first, so that replicas starting together apply each migration once, then
//! applies what the database lacks, each migration in the same transaction as its row. A
//! database at a version newer than [`LATEST`] is refused, never written to.

use postgres::{Client, Transaction};

use super::{classify, describe};
use crate::StoreError;

/// One step of the schema.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order; the versions and names are SQLite's.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "baseline: sessions, audit, leases, approvals and their outbox, guard state",
        sql: BASELINE,
    },
    Migration {
        version: 2,
        name: "sessions.profile (the sandbox profile a session runs under)",
        sql: "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS profile TEXT",
    },
    Migration {
        version: 3,
        name: "export_cursors (how far the audit trail's streams to a SIEM have delivered)",
        sql: "CREATE TABLE IF NOT EXISTS export_cursors (
            name           TEXT PRIMARY KEY,
            seq            BIGINT NOT NULL,
            holder         TEXT NOT NULL,
            lease_until_ms BIGINT NOT NULL,
            updated_ms     BIGINT NOT NULL,
            delivered      BIGINT NOT NULL,
            last_error     TEXT,
            failed_ms      BIGINT
        )",
    },
    Migration {
        version: 4,
        name: "runs, run_dedup and run_checkpoints (runs that triggers started)",
        sql: RUNS,
    },
    Migration {
        version: 5,
        name: "runs.lease_until_ms (a running run's holder is alive until then)",
        sql: "ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease_until_ms BIGINT",
    },
    Migration {
        version: 6,
        name: "run_rates (each trigger's rate, shared by replicas); indexes for one-at-a-time claims and the sweep",
        sql: RUN_RATES,
    },
    Migration {
        version: 7,
        name: "policy_versions (the policy sets that were live, and when); approvals.held_policy_version and executed_policy_version",
        sql: POLICY_VERSIONS,
    },
    Migration {
        version: 8,
        name: "session_labels (what each session touched: the catalog's labels, kept for its life)",
        sql: SESSION_LABELS,
    },
    Migration {
        version: 9,
        name: "undo_journal (for each successful call of a tool declaring undo, the request that reverses it)",
        sql: UNDO_JOURNAL,
    },
];

/// The schema version this binary writes.
pub const LATEST: i64 = 9;

// As on SQLite, but `seq` comes from a sequence: replicas recording at once need no lock
// to order their entries. A sequence may leave gaps (an insert that met an existing id, a
// rolled-back one): only the order is read, never the count.
const UNDO_JOURNAL: &str = "
CREATE TABLE IF NOT EXISTS undo_journal (
    id          TEXT PRIMARY KEY,
    seq         BIGSERIAL NOT NULL UNIQUE,
    session     TEXT NOT NULL,
    recorded_ms BIGINT NOT NULL,
    tool        TEXT NOT NULL,
    tier        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    args        TEXT NOT NULL,
    request     TEXT,
    status      TEXT NOT NULL,
    detail      TEXT,
    attempts    BIGINT NOT NULL DEFAULT 0,
    finished_ms BIGINT
);
CREATE INDEX IF NOT EXISTS undo_journal_session ON undo_journal(session, seq);
";

// As on SQLite: one row per label a session took on.
const SESSION_LABELS: &str = "
CREATE TABLE IF NOT EXISTS session_labels (
    session  TEXT NOT NULL,
    label    TEXT NOT NULL,
    added_ms BIGINT NOT NULL,
    PRIMARY KEY (session, label)
);
";

// One row per set (its content-addressed id), however often it went live (as on SQLite).
const POLICY_VERSIONS: &str = "
CREATE TABLE IF NOT EXISTS policy_versions (
    version       TEXT PRIMARY KEY,
    first_live_ms BIGINT NOT NULL,
    last_live_ms  BIGINT NOT NULL,
    replaced_ms   BIGINT,
    policies      BIGINT NOT NULL,
    tools         BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS policy_versions_live ON policy_versions(last_live_ms);
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS held_policy_version TEXT;
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS executed_policy_version TEXT;
";

// `full_at_us`: when the trigger's token bucket is full again (`RateLimit::take`). A run of a
// one-at-a-time trigger is claimed only while none of its runs is running, and starts no
// earlier than its last run ended: `(trigger, status)` and `(trigger, ended_ms)` answer
// both without reading the trigger's history.
const RUN_RATES: &str = "
CREATE TABLE IF NOT EXISTS run_rates (
    trigger    TEXT PRIMARY KEY,
    full_at_us BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_trigger_status ON runs(trigger, status);
CREATE INDEX IF NOT EXISTS runs_trigger_ended ON runs(trigger, ended_ms);
CREATE INDEX IF NOT EXISTS run_dedup_expires ON run_dedup(expires_ms);
";

// `limit_hit` is `RunRow::limit`: LIMIT is reserved in both dialects (as on SQLite).
const RUNS: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id               TEXT PRIMARY KEY,
    trigger          TEXT NOT NULL,
    kind             TEXT NOT NULL,
    status           TEXT NOT NULL,
    spec             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    payload_sha256   TEXT NOT NULL,
    attempt          BIGINT NOT NULL,
    created_ms       BIGINT NOT NULL,
    not_before_ms    BIGINT NOT NULL,
    started_ms       BIGINT,
    ended_ms         BIGINT,
    session          TEXT,
    holder           TEXT,
    exit_code        BIGINT,
    limit_hit        TEXT,
    error            TEXT,
    stderr_tail      TEXT,
    cost_micros      BIGINT,
    dead_letter      TEXT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    parent_run       TEXT,
    approval         TEXT
);
CREATE INDEX IF NOT EXISTS runs_due ON runs(status, not_before_ms, created_ms);
CREATE INDEX IF NOT EXISTS runs_trigger ON runs(trigger);
CREATE TABLE IF NOT EXISTS run_dedup (
    trigger    TEXT NOT NULL,
    key        TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (trigger, key)
);
CREATE TABLE IF NOT EXISTS run_checkpoints (
    root     TEXT PRIMARY KEY,
    data     BYTEA NOT NULL,
    saved_ms BIGINT NOT NULL
);
";

/// The advisory lock migrations take (any constant; the same in every replica).
pub(super) const MIGRATION_LOCK: i64 = 0x6f73_7469_6d69_6701;

const BASELINE: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    agent       TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    parent      TEXT,
    depth       BIGINT NOT NULL DEFAULT 0,
    max_calls   BIGINT,
    max_cost    DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS audit (
    seq       BIGINT PRIMARY KEY,
    ts_ms     BIGINT NOT NULL,
    session   TEXT,
    decision  TEXT NOT NULL,
    record    TEXT NOT NULL,
    prev      TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_session ON audit(session);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts_ms);
CREATE TABLE IF NOT EXISTS leases (
    lease_id      TEXT PRIMARY KEY,
    session       TEXT NOT NULL,
    binding       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    mount         TEXT,
    serial        TEXT,
    renewable     BOOLEAN NOT NULL,
    expires_at_ms BIGINT,
    created_ms    BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
    id                TEXT PRIMARY KEY,
    status            TEXT NOT NULL,
    created_ms        BIGINT NOT NULL,
    deadline_ms       BIGINT NOT NULL,
    renotify_ms       BIGINT NOT NULL,
    rounds            BIGINT NOT NULL,
    session           TEXT NOT NULL,
    agent             TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    policies          TEXT NOT NULL,
    policy_generation BIGINT NOT NULL,
    request           TEXT NOT NULL,
    observed          TEXT NOT NULL,
    approver          TEXT,
    channel           TEXT,
    decided_ms        BIGINT,
    reason            TEXT,
    attempts          BIGINT NOT NULL DEFAULT 0,
    result            TEXT,
    updated_ms        BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals(status);
CREATE INDEX IF NOT EXISTS approvals_session ON approvals(session);
CREATE TABLE IF NOT EXISTS approval_links_used (
    nonce       TEXT PRIMARY KEY,
    approval_id TEXT NOT NULL,
    used_ms     BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS slack_callbacks_seen (
    signature TEXT PRIMARY KEY,
    seen_ms   BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS approval_notifications (
    id          BIGSERIAL PRIMARY KEY,
    approval_id TEXT NOT NULL,
    channel     TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    round       BIGINT NOT NULL,
    attempts    BIGINT NOT NULL DEFAULT 0,
    next_ms     BIGINT NOT NULL,
    sent_ms     BIGINT,
    last_error  TEXT,
    UNIQUE (approval_id, channel, recipient, round)
);
CREATE INDEX IF NOT EXISTS approval_notifications_due ON approval_notifications(sent_ms, next_ms);
CREATE TABLE IF NOT EXISTS session_accounts (
    session    TEXT PRIMARY KEY,
    account    TEXT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_pauses (
    session     TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    dead_letter BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id          BIGSERIAL PRIMARY KEY,
    session     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    snapshot    TEXT NOT NULL,
    resolved    TEXT,
    resolved_ms BIGINT
);
CREATE INDEX IF NOT EXISTS dead_letters_session ON dead_letters(session);
CREATE TABLE IF NOT EXISTS idempotency (
    session     TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state       TEXT NOT NULL,
    response    TEXT,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE TABLE IF NOT EXISTS approval_caps (
    session TEXT PRIMARY KEY,
    parent  TEXT,
    max     BIGINT NOT NULL
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
    open_ms    BIGINT NOT NULL,
    collecting BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (channel, recipient)
);
";

/// Bring the database to [`LATEST`]; refuse one that is newer.
pub(super) fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction().map_err(classify)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(classify)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    BIGINT PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_ms BIGINT NOT NULL
         )",
    )
    .map_err(classify)?;
    let current = version(&mut tx).map_err(classify)?;
    if current > LATEST {
        return Err(StoreError::TooNew {
            found: current,
            supported: LATEST,
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        let failed = |e: postgres::Error| StoreError::Migration {
            version: m.version,
            name: m.name,
            reason: describe(&e),
        };
        tx.batch_execute(m.sql).map_err(failed)?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &crate::now_ms()],
        )
        .map_err(failed)?;
    }
    // All or nothing: a failed migration leaves the database at the version it was.
    tx.commit().map_err(classify)
}

/// The database's schema version (0: none applied).
pub fn version(tx: &mut Transaction<'_>) -> Result<i64, postgres::Error> {
    tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
        .map(|row| row.get(0))
}
