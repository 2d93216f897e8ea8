//! Sessions on SQLite ([`crate::sessions::SessionStore`]).

use rusqlite::params;

use super::Db;
use crate::sessions::{NewSessionRow, SessionRow, SessionStore};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqliteSessions(pub(super) Db);

impl SessionStore for SqliteSessions {
    fn insert(&self, r: &NewSessionRow<'_>) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO sessions (id, agent, tenant, created_at, expires_at, depth,
                   max_calls, max_cost, parent, profile)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    r.id,
                    r.agent,
                    r.tenant,
                    r.created_at,
                    r.expires_at,
                    r.depth,
                    r.max_calls,
                    r.max_cost,
                    r.parent,
                    r.profile
                ],
            )
            .map(drop)
        })
    }

    fn revoke(&self, id: &str, at: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE sessions SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
                params![at, id],
            )
            .map(drop)
        })
    }

    fn live(&self, now: i64) -> Result<Vec<SessionRow>, StoreError> {
        self.0.with(|c| {
            // The parent's row stays after it ends (revoked, not deleted): its agent is the
            // child's `parent_agent`.
            let mut stmt = c.prepare(
                "SELECT s.id, s.agent, s.tenant, s.depth, s.expires_at, s.parent, p.agent,
                        s.profile
                 FROM sessions s LEFT JOIN sessions p ON p.id = s.parent
                 WHERE s.revoked_at IS NULL AND s.expires_at > ?1",
            )?;
            let rows = stmt.query_map([now], |row| {
                Ok(SessionRow {
                    id: row.get(0)?,
                    agent: row.get(1)?,
                    tenant: row.get(2)?,
                    depth: row.get(3)?,
                    expires_at: row.get(4)?,
                    parent: row.get(5)?,
                    parent_agent: row.get(6)?,
                    profile: row.get(7)?,
                })
            })?;
            rows.collect()
        })
    }

    fn add_labels(&self, id: &str, labels: &[String], at_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            let tx = c.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO session_labels (session, label, added_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (session, label) DO NOTHING",
                )?;
                for label in labels {
                    stmt.execute(params![id, label, at_ms])?;
                }
            }
            tx.commit()
        })
    }

    fn inherit_labels(&self, parent: &str, child: &str, at_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO session_labels (session, label, added_ms)
                 SELECT ?1, label, ?2 FROM session_labels WHERE session = ?3
                 ON CONFLICT (session, label) DO NOTHING",
                params![child, at_ms, parent],
            )
            .map(drop)
        })
    }

    fn labels(&self, id: &str) -> Result<Vec<String>, StoreError> {
        self.0.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT label FROM session_labels WHERE session = ?1 ORDER BY label",
            )?;
            let rows = stmt.query_map([id], |row| row.get(0))?;
            rows.collect()
        })
    }
}
