//! The store test suite on the SQLite backend: each test on a fresh database file.

use ostiary_store::audit::{AuditRow, Tip};
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

/// The trail's first row, chained to the genesis tip.
fn first_row() -> AuditRow {
    AuditRow {
        seq: 1,
        ts_ms: 1,
        session: None,
        decision: "allow".into(),
        record: "{}".into(),
        prev: Tip::genesis().hash,
        hash: "h1".into(),
    }
}

/// The audit connection's commits are synced on request ([`AuditStore::sync`], before a
/// head checkpoint names them); a write-ahead log removed behind the store's back fails
/// the sync, naming the file, rather than passing as synced.
#[test]
fn the_audit_log_is_synced_on_request_and_a_missing_log_fails_it() {
    let backend = Sqlite::fresh();
    let stores = backend.open();
    let row = first_row();
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

/// The file descriptors this process holds on `path` (the database file itself): one per
/// SQLite connection.
fn connections_to(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

/// The audit reader a server's queries and the CLI use opens one connection, not one per
/// aggregate; it reads what the writer committed, writes nothing, and refuses a database a
/// newer binary migrated.
#[test]
fn the_audit_reader_is_one_read_only_connection() {
    let backend = Sqlite::fresh();
    let path = backend.dir.path().join("ostiary.db");
    let stores = backend.open();
    let row = first_row();
    stores
        .audit
        .append(&Tip::genesis(), std::slice::from_ref(&row))
        .unwrap();

    let before = connections_to(&path);
    let reader = sqlite::open_audit_reader(&path).unwrap();
    assert_eq!(connections_to(&path), before + 1);
    assert_eq!(reader.last().unwrap().map(|tip| tip.seq), Some(1));
    let next = AuditRow {
        seq: 2,
        prev: "h1".into(),
        hash: "h2".into(),
        ..row
    };
    let tip = reader.last().unwrap().unwrap();
    assert!(reader.append(&tip, &[next]).is_err());
    drop(reader);

    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, 'future', 0)",
        [sqlite::migrations::LATEST + 1],
    )
    .unwrap();
    let Err(err) = sqlite::open_audit_reader(&path) else {
        panic!("a database a newer binary migrated was opened");
    };
    assert!(
        matches!(err, ostiary_store::StoreError::TooNew { .. }),
        "{err}"
    );
}

/// A missing database is `Unavailable` for the reader too, naming the path.
#[test]
fn the_audit_reader_of_a_missing_database_says_where() {
    let Err(err) = sqlite::open_audit_reader(std::path::Path::new("/nonexistent/dir/ostiary.db"))
    else {
        panic!("a missing database was opened");
    };
    assert!(
        matches!(err, ostiary_store::StoreError::Unavailable(ref m) if m.contains("/nonexistent/dir")),
        "{err}"
    );
}
