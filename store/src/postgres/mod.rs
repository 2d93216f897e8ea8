//! The PostgreSQL backend: every aggregate in one database (or one schema of it), shared by
//! as many replicas as point at it.
//!
//! One connection strategy, as on SQLite: [`open`] makes one pool (r2d2 over the blocking
//! `postgres` client) that every aggregate of the [`Stores`] draws from, and each call takes
//! a connection for its statement or transaction and gives it back ([`Db::with`]); calls run
//! on tokio's blocking pool ([`crate::Call`]). Migrations run once, in [`open`], under an
//! advisory lock so that replicas starting together apply each one once.
//!
//! What SQLite gets from its single writer, this backend gets explicitly: a transition is one
//! `UPDATE … WHERE status = <expected>` (row locks make a second one see the first's
//! result); a decision locks its row (`FOR UPDATE`); holds, which count a whole session tree
//! against its caps, serialise on an advisory lock; audit appends serialise on another, so
//! that the chain has one tip whatever the number of writers.
//!
//! `postgres` and `r2d2` appear in this module and nowhere else in the workspace.

use std::sync::Arc;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::NoTls;
use r2d2_postgres::PostgresConnectionManager;

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

type Pool = r2d2::Pool<PostgresConnectionManager<NoTls>>;

/// How the backend connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// Connections at most, for all aggregates together.
    pub pool_size: u32,
    /// How long a call waits for a free connection (or a new one) before it fails
    /// ([`StoreError::Unavailable`]).
    pub connect_timeout: Duration,
    /// A schema of its own (created if absent) instead of the connection's default
    /// `search_path`: several deployments, or tests, in one database.
    pub schema: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            schema: None,
        }
    }
}

/// Open (and migrate) the database `url` names (`postgres://user@host:port/db` or a
/// `key=value` connection string): every aggregate's store.
pub fn open(url: &str, options: &Options) -> Result<Stores, StoreError> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e| StoreError::Unavailable(format!("the PostgreSQL URL does not parse: {e}")))?;
    config.connect_timeout(options.connect_timeout);
    if let Some(schema) = &options.schema {
        if !valid_schema(schema) {
            return Err(StoreError::Unavailable(format!(
                "schema {schema:?}: 1-63 characters of a-z 0-9 _, not starting with a digit"
            )));
        }
        // Made before the pool, whose connections start in it; under the migrations' lock,
        // since two `CREATE SCHEMA IF NOT EXISTS` at once collide on the catalog's key.
        let mut client = config.connect(NoTls).map_err(unavailable)?;
        let mut tx = client.transaction().map_err(classify)?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&migrations::MIGRATION_LOCK],
        )
        .map_err(classify)?;
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .map_err(classify)?;
        tx.commit().map_err(classify)?;
        config.options(&format!("-c search_path={schema}"));
    }
    let pool = r2d2::Pool::builder()
        .max_size(options.pool_size.max(1))
        .min_idle(Some(1))
        .connection_timeout(options.connect_timeout)
        .build(PostgresConnectionManager::new(config, NoTls))
        .map_err(|e| StoreError::Unavailable(format!("PostgreSQL: {e}")))?;
    let db = Arc::new(Db(Some(pool)));
    {
        let mut conn = db
            .pool()
            .get()
            .map_err(|e| StoreError::Unavailable(format!("no PostgreSQL connection: {e}")))?;
        migrations::migrate(&mut conn)?;
    }
    Ok(Stores {
        approvals: Arc::new(approvals::PgApprovals(db.clone())),
        sessions: Arc::new(sessions::PgSessions(db.clone())),
        guard: Arc::new(guard::PgGuard(db.clone())),
        audit: Arc::new(audit::PgAudit(db.clone())),
        leases: Arc::new(leases::PgLeases(db.clone())),
        cursors: Arc::new(cursors::PgCursors(db.clone())),
        runs: Arc::new(runs::PgRuns(db.clone())),
        policy_versions: Arc::new(policy_versions::PgPolicyVersions(db.clone())),
        undo: Arc::new(undo::PgUndo(db)),
    })
}

/// A schema name that needs no quoting.
fn valid_schema(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The pool every aggregate draws from (always `Some` until dropped).
struct Db(Option<Pool>);

impl Drop for Db {
    fn drop(&mut self) {
        // Closing a connection of the blocking client runs a runtime of its own, which
        // cannot start on a thread that drives an async runtime's tasks — where the last
        // handle on the stores is often dropped (a server shutting down): closed on a
        // thread of its own instead.
        if let Some(pool) = self.0.take() {
            let _ = std::thread::Builder::new()
                .name("postgres-close".into())
                .spawn(move || drop(pool));
        }
    }
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.pool().state();
        f.debug_struct("Db")
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish()
    }
}

impl Db {
    fn pool(&self) -> &Pool {
        self.0
            .as_ref()
            .expect("the pool is only taken when the Db is dropped")
    }

    /// Run `f` on a pooled connection; its error classified.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .pool()
            .get()
            .map_err(|e| StoreError::Unavailable(format!("no PostgreSQL connection: {e}")))?;
        f(&mut conn).map_err(classify)
    }
}

/// A driver error as a [`StoreError`]: lock and serialisation conflicts as busy, a lost or
/// refused connection as unavailable, the rest with the server's message.
fn classify(e: postgres::Error) -> StoreError {
    let busy = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
    ];
    match e.code() {
        Some(code) if busy.contains(code) => StoreError::Busy(describe(&e)),
        Some(code) if code.code().starts_with("08") || code.code().starts_with("57P") => {
            StoreError::Unavailable(describe(&e))
        }
        Some(code) if code.code().starts_with("22") => StoreError::Corrupt(describe(&e)),
        None if e.is_closed() => StoreError::Unavailable(describe(&e)),
        _ => StoreError::Backend(describe(&e)),
    }
}

fn unavailable(e: postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {}", describe(&e)))
}

/// The server's message when there is one (the driver's `Display` says only "db error").
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// A stored count as the row types hold it.
fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// JSON text of a plain struct (string keys only: cannot fail).
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A JSON column, parsed; a value that does not parse is corrupt data.
fn parse_json<T: serde::de::DeserializeOwned>(text: &str, column: &str) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("column {column} does not parse: {e}")))
}
