//! The store test suite on the PostgreSQL backend: each test in a schema of its own in the
//! database `OSTIARY_TEST_POSTGRES` names (default: the project machines' server,
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication), dropped afterwards.
//! A server that cannot be reached fails every test, naming it: nothing is skipped.

use std::sync::atomic::{AtomicU32, Ordering};

use ostiary_store::postgres::{self, Options};
use ostiary_store::suite::Backend;
use ostiary_store::{StoreError, Stores};

fn url() -> String {
    std::env::var("OSTIARY_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

struct Postgres {
    schema: String,
}

impl Postgres {
    fn fresh() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Self {
            schema: format!(
                "store_test_{}_{}_{nanos}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    fn options(&self) -> Options {
        Options {
            // Several stores open at once in the race tests: small pools.
            pool_size: 4,
            schema: Some(self.schema.clone()),
            ..Options::default()
        }
    }
}

impl Backend for Postgres {
    fn open(&self) -> Stores {
        postgres::open(&url(), &self.options()).unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {} (OSTIARY_TEST_POSTGRES) is required for these tests: {e}",
                url()
            )
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let dropped = std::process::Command::new("psql")
            .args([
                &url(),
                "-qc",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
            ])
            .output();
        if !dropped.is_ok_and(|o| o.status.success()) {
            eprintln!("could not drop test schema {}", self.schema);
        }
    }
}

ostiary_store::store_suite!(Postgres::fresh());

/// Both backends are at the same schema version.
#[test]
fn the_backends_migrate_to_the_same_version() {
    assert_eq!(
        postgres::migrations::LATEST,
        ostiary_store::sqlite::migrations::LATEST
    );
}

/// A database a newer binary migrated is refused, naming both versions, and left alone.
#[test]
fn a_database_newer_than_the_binary_is_refused() {
    let backend = Postgres::fresh();
    backend.open();
    let bumped = std::process::Command::new("psql")
        .args([
            &url(),
            "-qc",
            &format!(
                "INSERT INTO {}.schema_version (version, name, applied_ms) VALUES ({}, 'future', 0)",
                backend.schema,
                postgres::migrations::LATEST + 1
            ),
        ])
        .status()
        .unwrap();
    assert!(bumped.success());
    let err = postgres::open(&url(), &backend.options()).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found, supported } if found == supported + 1),
        "{err}"
    );
}

/// Replicas starting together apply each migration once.
#[test]
fn replicas_opening_at_once_migrate_once() {
    let backend = Postgres::fresh();
    let opened: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| postgres::open(&url(), &backend.options()).map(drop)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(opened.iter().all(Result::is_ok), "{opened:?}");
    let rows = std::process::Command::new("psql")
        .args([
            &url(),
            "-tAc",
            &format!("SELECT COUNT(*) FROM {}.schema_version", backend.schema),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&rows.stdout).trim(),
        postgres::migrations::LATEST.to_string()
    );
}

/// An unreachable server is `Unavailable`, within the connect timeout.
#[test]
fn an_unreachable_server_is_unavailable() {
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = Options {
        connect_timeout: std::time::Duration::from_secs(2),
        ..Options::default()
    };
    let err = postgres::open(
        &format!("postgres://postgres@127.0.0.1:{port}/test"),
        &options,
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
}
