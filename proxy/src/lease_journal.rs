//! The broker's lease journal in SQLite: every lease Ostiary owes a revocation, from the
//! moment it is fetched until Vault confirms it is gone.
//!
//! Credentials live in the broker's memory only, so after a restart (a crash, a deploy)
//! nothing can use the leases the previous process fetched — but Vault keeps them alive
//! until their TTL, which for database credentials can be hours. The journal is how the
//! next process finds and revokes them at start-up ([`load`], then `Broker::adopt`).
//!
//! Writes go through one thread that owns its connection, in order, so a `settled` never
//! overtakes the `owed` it answers; the request path only sends on a channel.

use std::path::Path;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ostiary_broker::{Lease, LeaseJournal, OwedLease, Revocation};
use rusqlite::{params, Connection};

use crate::store::{self, StoreError};

enum Op {
    Owed { session: String, owed: OwedLease },
    Settled(String),
}

/// The journal; cheap to share (`Arc`).
#[derive(Debug)]
pub struct SqliteJournal {
    tx: Mutex<mpsc::Sender<Op>>,
}

impl SqliteJournal {
    /// Start the writer thread over the database at `path`.
    pub fn start(path: &Path) -> Result<Self, StoreError> {
        let conn = store::open(path)?;
        let (tx, rx) = mpsc::channel::<Op>();
        std::thread::Builder::new()
            .name("lease-journal".into())
            .spawn(move || {
                for op in rx {
                    if let Err(e) = write(&conn, op) {
                        // The lease stays owed in memory; only a restart would miss it.
                        tracing::error!(error = %e, "lease journal write failed");
                    }
                }
            })
            .map_err(|e| StoreError::Task(e.to_string()))?;
        Ok(Self { tx: Mutex::new(tx) })
    }

    fn send(&self, op: Op) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(op);
        }
    }
}

impl LeaseJournal for SqliteJournal {
    fn owed(&self, session: &str, owed: &OwedLease) {
        self.send(Op::Owed {
            session: session.to_owned(),
            owed: owed.clone(),
        });
    }

    fn settled(&self, lease_id: &str) {
        self.send(Op::Settled(lease_id.to_owned()));
    }
}

fn write(conn: &Connection, op: Op) -> rusqlite::Result<usize> {
    match op {
        Op::Owed { session, owed } => {
            let (kind, mount, serial) = match &owed.lease.revocation {
                Revocation::VaultLease => ("vault", None, None),
                Revocation::PkiSerial { mount, serial } => {
                    ("pki", Some(mount.clone()), Some(serial.clone()))
                }
            };
            let expires = owed.expires_at.map(millis);
            conn.execute(
                "INSERT OR REPLACE INTO leases (lease_id, session, binding, kind, mount, serial, renewable, expires_at_ms, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    owed.lease.id,
                    session,
                    owed.binding,
                    kind,
                    mount,
                    serial,
                    owed.lease.renewable,
                    expires,
                    store::now_ms()
                ],
            )
        }
        Op::Settled(id) => conn.execute("DELETE FROM leases WHERE lease_id = ?1", params![id]),
    }
}

fn millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Leases a previous process left owed, as `(session, lease)`.
pub fn load(path: &Path) -> Result<Vec<(String, OwedLease)>, StoreError> {
    let conn = store::open(path)?;
    let mut stmt = conn.prepare(
        "SELECT lease_id, session, binding, kind, mount, serial, renewable, expires_at_ms FROM leases",
    )?;
    let rows = stmt.query_map([], |row| {
        let kind: String = row.get(3)?;
        let mount: Option<String> = row.get(4)?;
        let serial: Option<String> = row.get(5)?;
        let revocation = match (kind.as_str(), mount, serial) {
            ("pki", Some(mount), Some(serial)) => Revocation::PkiSerial { mount, serial },
            _ => Revocation::VaultLease,
        };
        let expires: Option<i64> = row.get(7)?;
        Ok((
            row.get::<_, String>(1)?,
            OwedLease {
                binding: row.get(2)?,
                lease: Lease {
                    id: row.get(0)?,
                    revocation,
                    renewable: row.get(6)?,
                },
                expires_at: expires
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            },
        ))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owed_leases_survive_until_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ostiary.db");
        let journal = SqliteJournal::start(&path).unwrap();
        let lease = |id: &str, revocation| OwedLease {
            binding: "db".into(),
            lease: Lease {
                id: id.into(),
                revocation,
                renewable: true,
            },
            expires_at: Some(UNIX_EPOCH + Duration::from_secs(2_000_000_000)),
        };
        journal.owed("s1", &lease("database/creds/r/1", Revocation::VaultLease));
        journal.owed(
            "s1",
            &lease(
                "pki:pki:0a:0b",
                Revocation::PkiSerial {
                    mount: "pki".into(),
                    serial: "0a:0b".into(),
                },
            ),
        );
        journal.settled("database/creds/r/1");
        // Writes are asynchronous: wait for the thread to catch up.
        let mut left = Vec::new();
        for _ in 0..100 {
            left = load(&path).unwrap();
            if left.len() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(left.len(), 1, "{left:?}");
        let (session, owed) = &left[0];
        assert_eq!(session, "s1");
        assert_eq!(owed.lease.id, "pki:pki:0a:0b");
        assert_eq!(
            owed.lease.revocation,
            Revocation::PkiSerial {
                mount: "pki".into(),
                serial: "0a:0b".into()
            }
        );
        assert_eq!(
            owed.expires_at,
            Some(UNIX_EPOCH + Duration::from_secs(2_000_000_000))
        );
    }
}
