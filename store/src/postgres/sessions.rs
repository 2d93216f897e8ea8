//! Sessions on PostgreSQL ([`crate::sessions::SessionStore`]).

use std::sync::Arc;

use super::{count, Db};
use crate::sessions::{NewSessionRow, SessionRow, SessionStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgSessions(pub(super) Arc<Db>);

impl SessionStore for PgSessions {
    fn insert(&self, r: &NewSessionRow<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO sessions (id, agent, tenant, created_at, expires_at, depth,
                   max_calls, max_cost, parent, profile)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &[
                    &r.id,
                    &r.agent,
                    &r.tenant,
                    &r.created_at,
                    &r.expires_at,
                    &i64::from(r.depth),
                    &r.max_calls,
                    &r.max_cost,
                    &r.parent,
                    &r.profile,
                ],
            )
            .map(drop)
        })
    }

    fn revoke(&self, id: &str, at: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE sessions SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                &[&at, &id],
            )
            .map(drop)
        })
    }

    fn live(&self, now: i64) -> Result<Vec<SessionRow>, StoreError> {
        self.select("", now, None)
    }

    fn get_live(&self, id: &str, now: i64) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.select(" AND s.id = $2", now, Some(id))?.pop())
    }

    fn add_labels(&self, id: &str, labels: &[String], at_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            // One statement for the whole list: one round trip, all or none.
            c.execute(
                "INSERT INTO session_labels (session, label, added_ms)
                 SELECT $1, label, $3 FROM unnest($2::TEXT[]) AS label
                 ON CONFLICT (session, label) DO NOTHING",
                &[&id, &labels, &at_ms],
            )
            .map(drop)
        })
    }

    fn inherit_labels(&self, parent: &str, child: &str, at_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO session_labels (session, label, added_ms)
                 SELECT $1, label, $2 FROM session_labels WHERE session = $3
                 ON CONFLICT (session, label) DO NOTHING",
                &[&child, &at_ms, &parent],
            )
            .map(drop)
        })
    }

    fn labels(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT label FROM session_labels WHERE session = $1 ORDER BY label",
                &[&id],
            )
        })?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

impl PgSessions {
    /// Live sessions (`extra` narrows it, with `id` as `$2`).
    fn select(
        &self,
        extra: &str,
        now: i64,
        id: Option<&str>,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let rows = self.0.with(|c| {
            // The parent's row stays after it ends (revoked, not deleted): its agent is the
            // child's `parent_agent`.
            let sql = format!(
                "SELECT s.id, s.agent, s.tenant, s.depth, s.expires_at, s.parent, p.agent,
                        s.profile
                 FROM sessions s LEFT JOIN sessions p ON p.id = s.parent
                 WHERE s.revoked_at IS NULL AND s.expires_at > $1{extra}"
            );
            match id {
                Some(id) => c.query(&sql, &[&now, &id]),
                None => c.query(&sql, &[&now]),
            }
        })?;
        Ok(rows
            .iter()
            .map(|row| SessionRow {
                id: row.get(0),
                agent: row.get(1),
                tenant: row.get(2),
                depth: count(row.get(3)),
                expires_at: row.get(4),
                parent: row.get(5),
                parent_agent: row.get(6),
                profile: row.get(7),
            })
            .collect())
    }
}
