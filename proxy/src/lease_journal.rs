//! The broker's lease journal: every lease Ostiary owes a revocation, from the moment it is
//! fetched until Vault confirms it is gone, kept in the store's lease aggregate.
//!
//! Credentials live in the broker's memory only, so after a restart (a crash, a deploy)
//! nothing can use the leases the previous process fetched — but Vault keeps them alive
//! until their TTL, which for database credentials can be hours. The journal is how the
//! next process finds and revokes them at start-up ([`load`], then `Broker::adopt`).
//!
//! Writes go through one thread, in order, so a `settled` never overtakes the `owed` it
//! answers; the request path only sends on a channel.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use ostiary_broker::{Lease, LeaseJournal, OwedLease, Revocation};

use crate::store::leases::{LeaseKind, LeaseRow, LeaseStore};
use crate::store::{self, StoreError};

enum Op {
    Owed { session: String, owed: OwedLease },
    Settled(String),
}

/// The journal; cheap to share (`Arc`).
#[derive(Debug)]
pub struct Journal {
    tx: Mutex<mpsc::Sender<Op>>,
}

impl Journal {
    /// Start the writer thread over `leases`.
    pub fn start(leases: Arc<dyn LeaseStore>) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Op>();
        std::thread::Builder::new()
            .name("lease-journal".into())
            .spawn(move || {
                for op in rx {
                    let written = match op {
                        Op::Owed { session, owed } => {
                            leases.owed(&row(&session, &owed), store::now_ms())
                        }
                        Op::Settled(id) => leases.settled(&id),
                    };
                    if let Err(e) = written {
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

impl LeaseJournal for Journal {
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

/// The row of one owed lease.
fn row(session: &str, owed: &OwedLease) -> LeaseRow {
    LeaseRow {
        lease_id: owed.lease.id.clone(),
        session: session.to_owned(),
        binding: owed.binding.clone(),
        kind: match &owed.lease.revocation {
            Revocation::VaultLease => LeaseKind::Vault,
            Revocation::PkiSerial { mount, serial } => LeaseKind::Pki {
                mount: mount.clone(),
                serial: serial.clone(),
            },
        },
        renewable: owed.lease.renewable,
        expires_at_ms: owed.expires_at.map(|at| {
            at.duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }),
    }
}

/// Leases a previous process left owed, as `(session, lease)`.
pub fn load(leases: &dyn LeaseStore) -> Result<Vec<(String, OwedLease)>, StoreError> {
    Ok(leases
        .owed_leases()?
        .into_iter()
        .map(|r| {
            let owed = OwedLease {
                binding: r.binding,
                lease: Lease {
                    id: r.lease_id,
                    revocation: match r.kind {
                        LeaseKind::Vault => Revocation::VaultLease,
                        LeaseKind::Pki { mount, serial } => Revocation::PkiSerial { mount, serial },
                    },
                    renewable: r.renewable,
                },
                expires_at: r
                    .expires_at_ms
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            };
            (r.session, owed)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owed_leases_survive_until_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ostiary.db");
        let journal = Journal::start(store::sqlite::open(&path).unwrap().leases).unwrap();
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
        // Writes are asynchronous: wait for the thread to catch up — for the state after
        // all three (one owed lease is also what the first write alone leaves).
        let reader = store::sqlite::open(&path).unwrap().leases;
        let mut left = Vec::new();
        for _ in 0..100 {
            left = load(&*reader).unwrap();
            if left.len() == 1 && left[0].1.lease.id == "pki:pki:0a:0b" {
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
