//! The lease journal on SQLite ([`crate::leases::LeaseStore`]).

use rusqlite::params;

use super::Db;
use crate::leases::{LeaseKind, LeaseRow, LeaseStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqliteLeases(pub(super) Db);

impl LeaseStore for SqliteLeases {
    fn owed(&self, r: &LeaseRow, now_ms: i64) -> Result<(), StoreError> {
        let (kind, mount, serial) = match &r.kind {
            LeaseKind::Vault => ("vault", None, None),
            LeaseKind::Pki { mount, serial } => {
                ("pki", Some(mount.as_str()), Some(serial.as_str()))
            }
        };
        self.0.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO leases (lease_id, session, binding, kind, mount, serial,
                   renewable, expires_at_ms, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    r.lease_id,
                    r.session,
                    r.binding,
                    kind,
                    mount,
                    serial,
                    r.renewable,
                    r.expires_at_ms,
                    now_ms
                ],
            )
            .map(drop)
        })
    }

    fn settled(&self, lease_id: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute("DELETE FROM leases WHERE lease_id = ?1", params![lease_id])
                .map(drop)
        })
    }

    fn owed_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.0.with(|c| {
            let mut stmt = c.prepare(
                "SELECT lease_id, session, binding, kind, mount, serial, renewable, expires_at_ms
                 FROM leases ORDER BY created_ms, lease_id",
            )?;
            let rows = stmt.query_map([], |row| {
                let kind: String = row.get(3)?;
                let mount: Option<String> = row.get(4)?;
                let serial: Option<String> = row.get(5)?;
                Ok(LeaseRow {
                    lease_id: row.get(0)?,
                    session: row.get(1)?,
                    binding: row.get(2)?,
                    // A `pki` row without its mount and serial cannot be revoked by serial;
                    // as a Vault lease it is at least tried.
                    kind: match (kind.as_str(), mount, serial) {
                        ("pki", Some(mount), Some(serial)) => LeaseKind::Pki { mount, serial },
                        _ => LeaseKind::Vault,
                    },
                    renewable: row.get(6)?,
                    expires_at_ms: row.get(7)?,
                })
            })?;
            rows.collect()
        })
    }
}
