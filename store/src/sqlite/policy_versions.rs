//! The history of live policy sets on SQLite ([`crate::policy_versions::PolicyVersionStore`]):
//! a set going live and what it replaced change together, in one transaction.

use rusqlite::{params, Row};

use super::Db;
use crate::policy_versions::{PolicyVersionStore, Replaces, VersionRow, WentLive};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqlitePolicyVersions(pub(super) Db);

impl PolicyVersionStore for SqlitePolicyVersions {
    fn went_live(&self, live: &WentLive<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO policy_versions
                   (version, first_live_ms, last_live_ms, replaced_ms, policies, tools)
                 VALUES (?1, ?2, ?2, NULL, ?3, ?4)
                 ON CONFLICT (version) DO UPDATE SET
                   first_live_ms = MIN(first_live_ms, excluded.first_live_ms),
                   last_live_ms = MAX(last_live_ms, excluded.last_live_ms),
                   replaced_ms = NULL",
                params![live.version, live.at_ms, live.policies, live.tools],
            )?;
            match live.replaces {
                Replaces::Nothing => {}
                Replaces::Version(old) => {
                    tx.execute(
                        "UPDATE policy_versions SET replaced_ms = ?2
                         WHERE version = ?1 AND version <> ?3",
                        params![old, live.at_ms, live.version],
                    )?;
                }
                Replaces::AllOthers => {
                    tx.execute(
                        "UPDATE policy_versions SET replaced_ms = ?1
                         WHERE version <> ?2 AND replaced_ms IS NULL",
                        params![live.at_ms, live.version],
                    )?;
                }
            }
            tx.commit()
        })
    }

    fn list(&self, limit: usize) -> Result<Vec<VersionRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.0.with(|c| {
            let mut stmt = c.prepare(
                "SELECT version, first_live_ms, last_live_ms, replaced_ms, policies, tools
                 FROM policy_versions
                 ORDER BY last_live_ms DESC, first_live_ms DESC, version
                 LIMIT ?1",
            )?;
            let rows = stmt.query_map([limit], from_row)?;
            rows.collect()
        })
    }
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<VersionRow> {
    Ok(VersionRow {
        version: r.get(0)?,
        first_live_ms: r.get(1)?,
        last_live_ms: r.get(2)?,
        replaced_ms: r.get(3)?,
        policies: r.get(4)?,
        tools: r.get(5)?,
    })
}
