//! The store test suite on the SQLite backend: each test on a fresh database file.

use ostiary_store::suite::Backend;
use ostiary_store::{sqlite, Stores};

struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn fresh() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

impl Backend for Sqlite {
    fn open(&self) -> Stores {
        sqlite::open(&self.dir.path().join("ostiary.db")).unwrap()
    }
}

ostiary_store::store_suite!(Sqlite::fresh());

/// A read-only open sees what was written and writes nothing.
#[test]
fn a_read_only_open_reads_and_refuses_writes() {
    let backend = Sqlite::fresh();
    let path = backend.dir.path().join("ostiary.db");
    let written = backend.open();
    written.guard.forget_account("nobody").unwrap();
    let read = sqlite::open_read_only(&path).unwrap();
    assert!(read.audit.last().unwrap().is_none());
    assert!(read.guard.forget_account("nobody").is_err());
}

/// A missing database directory is `Unavailable`, naming the path.
#[test]
fn an_unopenable_database_says_where() {
    let err = sqlite::open(std::path::Path::new("/nonexistent/dir/ostiary.db")).unwrap_err();
    assert!(
        matches!(err, ostiary_store::StoreError::Unavailable(ref m) if m.contains("/nonexistent/dir")),
        "{err}"
    );
}

/// The audit connection's commits are synced on request ([`AuditStore::sync`], before a
/// head checkpoint names them); a write-ahead log removed behind the store's back fails
/// the sync, naming the file, rather than passing as synced.
#[test]
fn the_audit_log_is_synced_on_request_and_a_missing_log_fails_it() {
    use ostiary_store::audit::{AuditRow, Tip};

    let backend = Sqlite::fresh();
    let stores = backend.open();
    let row = AuditRow {
        seq: 1,
        ts_ms: 1,
        session: None,
        decision: "allow".into(),
        record: "{}".into(),
        prev: Tip::genesis().hash,
        hash: "h1".into(),
    };
    stores.audit.append(&Tip::genesis(), &[row]).unwrap();
    let wal = backend.dir.path().join("ostiary.db-wal");
    assert!(
        wal.metadata().unwrap().len() > 0,
        "the commit is in the log"
    );
    stores.audit.sync().unwrap();

    let read = sqlite::open_read_only(&backend.dir.path().join("ostiary.db")).unwrap();
    read.audit.sync().unwrap();

    std::fs::remove_file(&wal).unwrap();
    let err = stores.audit.sync().unwrap_err();
    assert!(
        matches!(err, ostiary_store::StoreError::Unavailable(ref m) if m.contains("ostiary.db-wal")),
        "{err}"
    );
}
