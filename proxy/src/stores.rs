//! Which store backend the config names (`state.store`), opened: the SQLite file in the
//! state directory, or a PostgreSQL database that several replicas may share
//! (docs/design.md §8). The server and the CLI open their stores here, so that both read the
//! same place.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::State;
use crate::state::files;
use crate::store::audit::AuditStore;
use crate::store::{postgres, sqlite, StoreError, Stores};

/// Where the durable state is.
#[derive(Clone, PartialEq, Eq)]
pub enum Backend<'a> {
    /// The database file in the state directory.
    Sqlite(PathBuf),
    /// A PostgreSQL URL (which may carry a password: see [`redacted`]).
    Postgres(&'a str),
}

impl std::fmt::Debug for Backend<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl<'a> Backend<'a> {
    /// The backend `state` names; why not, when it names none.
    pub fn of(state: &'a State) -> Result<Self, String> {
        let store = state.store.as_str();
        if store == "sqlite" {
            return Ok(Backend::Sqlite(state.dir.join(files::DATABASE)));
        }
        let refuse = |why: &str| {
            format!(
                "state.store = {:?}: {why}; \"sqlite\" or a postgres:// URL",
                redacted(store)
            )
        };
        let url = url::Url::parse(store).map_err(|e| refuse(&e.to_string()))?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(refuse(&format!("scheme {:?} is not a store", url.scheme())));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(refuse("no host"));
        }
        Ok(Backend::Postgres(store))
    }

    /// What an operator is told (no password).
    pub fn describe(&self) -> String {
        match self {
            Backend::Sqlite(path) => format!("sqlite {}", path.display()),
            Backend::Postgres(url) => format!("postgres {}", redacted(url)),
        }
    }

    /// Open (and migrate) every aggregate's store.
    pub fn open(&self) -> Result<Stores, StoreError> {
        match self {
            Backend::Sqlite(path) => sqlite::open(path),
            Backend::Postgres(url) => postgres::open(url, &postgres::Options::default()),
        }
    }

    /// The audit trail for reading (queries, verification) beside a running writer: a
    /// read-only connection on SQLite, a pool of its own on PostgreSQL. Not migrated, and a
    /// database newer than this binary is refused.
    pub fn audit_reader(&self) -> Result<Arc<dyn AuditStore>, StoreError> {
        match self {
            Backend::Sqlite(path) => {
                if !path.exists() {
                    return Err(StoreError::Unavailable(format!(
                        "no database at {} (has `ostiary serve` run with this state dir?)",
                        path.display()
                    )));
                }
                sqlite::open_audit_reader(path)
            }
            Backend::Postgres(url) => {
                let options = postgres::Options {
                    pool_size: 2,
                    ..postgres::Options::default()
                };
                Ok(postgres::open(url, &options)?.audit)
            }
        }
    }
}

/// A URL with its password (if any) replaced by `***`; anything that is not a URL as it is.
pub fn redacted(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(store: &str) -> State {
        State {
            store: store.to_owned(),
            ..State::default()
        }
    }

    #[test]
    fn sqlite_and_postgres_urls_are_stores_and_nothing_else_is() {
        let s = state("sqlite");
        assert!(matches!(Backend::of(&s), Ok(Backend::Sqlite(_))));
        for url in [
            "postgres://ostiary@db:5432/ostiary",
            "postgresql://ostiary:pw@127.0.0.1/ostiary?sslmode=disable",
        ] {
            let s = state(url);
            assert_eq!(Backend::of(&s), Ok(Backend::Postgres(url)), "{url}");
        }
        for bad in [
            "mysql://db/x",
            "postgres:///nohost",
            "postgres",
            "",
            "SQLite",
        ] {
            let s = state(bad);
            assert!(Backend::of(&s).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_is_never_said() {
        let url = "postgres://ostiary:hunter2@db/ostiary";
        assert_eq!(redacted(url), "postgres://ostiary:***@db/ostiary");
        let s = state(url);
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!Backend::of(&s).unwrap().describe().contains("hunter2"));
        let bad = state("mysql://u:hunter2@db/x");
        assert!(!Backend::of(&bad).unwrap_err().contains("hunter2"));
    }
}
