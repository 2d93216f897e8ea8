//! The history of live policy sets on PostgreSQL
//! ([`crate::policy_versions::PolicyVersionStore`]): a set going live and what it replaced
//! change together, in one transaction; replicas going live with one set at once meet in
//! the upsert's row lock.

use std::sync::Arc;

use super::Db;
use crate::policy_versions::{PolicyVersionStore, Replaces, VersionRow, WentLive};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgPolicyVersions(pub(super) Arc<Db>);

impl PolicyVersionStore for PgPolicyVersions {
    fn went_live(&self, live: &WentLive<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute(
                "INSERT INTO policy_versions
                   (version, first_live_ms, last_live_ms, replaced_ms, policies, tools)
                 VALUES ($1, $2, $2, NULL, $3, $4)
                 ON CONFLICT (version) DO UPDATE SET
                   first_live_ms = LEAST(policy_versions.first_live_ms, excluded.first_live_ms),
                   last_live_ms = GREATEST(policy_versions.last_live_ms, excluded.last_live_ms),
                   replaced_ms = NULL",
                &[&live.version, &live.at_ms, &live.policies, &live.tools],
            )?;
            match live.replaces {
                Replaces::Nothing => {}
                Replaces::Version(old) => {
                    tx.execute(
                        "UPDATE policy_versions SET replaced_ms = $2
                         WHERE version = $1 AND version <> $3",
                        &[&old, &live.at_ms, &live.version],
                    )?;
                }
                Replaces::AllOthers => {
                    tx.execute(
                        "UPDATE policy_versions SET replaced_ms = $1
                         WHERE version <> $2 AND replaced_ms IS NULL",
                        &[&live.at_ms, &live.version],
                    )?;
                }
            }
            tx.commit()
        })
    }

    fn list(&self, limit: usize) -> Result<Vec<VersionRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.0.with(|c| {
            let rows = c.query(
                "SELECT version, first_live_ms, last_live_ms, replaced_ms, policies, tools
                 FROM policy_versions
                 ORDER BY last_live_ms DESC, first_live_ms DESC, version
                 LIMIT $1",
                &[&limit],
            )?;
            Ok(rows
                .iter()
                .map(|r| VersionRow {
                    version: r.get(0),
                    first_live_ms: r.get(1),
                    last_live_ms: r.get(2),
                    replaced_ms: r.get(3),
                    policies: r.get(4),
                    tools: r.get(5),
                })
                .collect())
        })
    }
}
