//! The lease journal on PostgreSQL ([`crate::leases::LeaseStore`]).

use std::sync::Arc;

use super::Db;
use crate::leases::{LeaseKind, LeaseRow, LeaseStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgLeases(pub(super) Arc<Db>);

impl LeaseStore for PgLeases {
    fn owed(&self, r: &LeaseRow, now_ms: i64) -> Result<(), StoreError> {
        let (kind, mount, serial) = match &r.kind {
            LeaseKind::Vault => ("vault", None, None),
            LeaseKind::Pki { mount, serial } => {
                ("pki", Some(mount.as_str()), Some(serial.as_str()))
            }
        };
        self.0.with(|c| {
            c.execute(
                "INSERT INTO leases (lease_id, session, binding, kind, mount, serial, renewable,
                   expires_at_ms, created_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (lease_id) DO UPDATE SET session = $2, binding = $3, kind = $4,
                   mount = $5, serial = $6, renewable = $7, expires_at_ms = $8, created_ms = $9",
                &[
                    &r.lease_id,
                    &r.session,
                    &r.binding,
                    &kind,
                    &mount,
                    &serial,
                    &r.renewable,
                    &r.expires_at_ms,
                    &now_ms,
                ],
            )
            .map(drop)
        })
    }

    fn settled(&self, lease_id: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute("DELETE FROM leases WHERE lease_id = $1", &[&lease_id])
                .map(drop)
        })
    }

    fn owed_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT lease_id, session, binding, kind, mount, serial, renewable, expires_at_ms
                 FROM leases ORDER BY created_ms, lease_id",
                &[],
            )
        })?;
        Ok(rows
            .iter()
            .map(|row| {
                let kind: String = row.get(3);
                let mount: Option<String> = row.get(4);
                let serial: Option<String> = row.get(5);
                LeaseRow {
                    lease_id: row.get(0),
                    session: row.get(1),
                    binding: row.get(2),
                    // As on SQLite: a `pki` row without its mount and serial is at least
                    // tried as a Vault lease.
                    kind: match (kind.as_str(), mount, serial) {
                        ("pki", Some(mount), Some(serial)) => LeaseKind::Pki { mount, serial },
                        _ => LeaseKind::Vault,
                    },
                    renewable: row.get(6),
                    expires_at_ms: row.get(7),
                }
            })
            .collect())
    }
}
