//! The guardrails' state on PostgreSQL ([`crate::guard::GuardStore`]). Concurrent replicas
//! meet on primary keys: a second pause of one session, or a second claim of one
//! `Idempotency-Key`, finds the first's row (`ON CONFLICT DO NOTHING`) and yields to it.

use std::sync::Arc;

use serde_json::Value;

use super::{json, Db};
use crate::approvals::StoredResponse;
use crate::guard::{Begun, DeadLetter, GuardStore, Paused};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgGuard(pub(super) Arc<Db>);

impl GuardStore for PgGuard {
    fn save_accounts(&self, accounts: &[(String, Value)], now: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            let upsert = tx.prepare(
                "INSERT INTO session_accounts (session, account, updated_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (session) DO UPDATE SET account = $2, updated_ms = $3",
            )?;
            for (session, account) in accounts {
                tx.execute(&upsert, &[session, &account.to_string(), &now])?;
            }
            tx.commit()
        })
    }

    fn load_accounts(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let rows = self
            .0
            .with(|c| c.query("SELECT session, account FROM session_accounts", &[]))?;
        // As on SQLite: an account that does not parse is left out (the session starts
        // from its limits again).
        Ok(rows
            .iter()
            .filter_map(|row| {
                let account: String = row.get(1);
                Some((row.get(0), serde_json::from_str(&account).ok()?))
            })
            .collect())
    }

    fn forget_account(&self, session: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM session_accounts WHERE session = $1",
                &[&session],
            )
            .map(drop)
        })
    }

    fn pause(
        &self,
        session: &str,
        kind: &str,
        reason: &str,
        snapshot: &Value,
        at_ms: i64,
    ) -> Result<Option<Paused>, StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            let letter: i64 = tx
                .query_one(
                    "INSERT INTO dead_letters (session, kind, reason, at_ms, snapshot)
                     VALUES ($1, $2, $3, $4, $5) RETURNING id",
                    &[&session, &kind, &reason, &at_ms, &snapshot.to_string()],
                )?
                .get(0);
            let paused = tx.execute(
                "INSERT INTO session_pauses (session, kind, reason, at_ms, dead_letter)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session) DO NOTHING",
                &[&session, &kind, &reason, &at_ms, &letter],
            )?;
            if paused == 0 {
                // Already paused: it keeps its first pause, and this trip is not recorded.
                tx.rollback()?;
                return Ok(None);
            }
            tx.commit()?;
            Ok(Some(Paused {
                kind: kind.to_owned(),
                reason: reason.to_owned(),
                at_ms,
                dead_letter: letter,
            }))
        })
    }

    fn unpause(&self, session: &str, resolution: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            let Some(letter) = tx.query_opt(
                "DELETE FROM session_pauses WHERE session = $1 RETURNING dead_letter",
                &[&session],
            )?
            else {
                return Ok(false);
            };
            let letter: i64 = letter.get(0);
            tx.execute(
                "UPDATE dead_letters SET resolved = $1, resolved_ms = $2 WHERE id = $3",
                &[&resolution, &now_ms, &letter],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn pauses(&self) -> Result<Vec<(String, Paused)>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT session, kind, reason, at_ms, dead_letter FROM session_pauses",
                &[],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Paused {
                        kind: r.get(1),
                        reason: r.get(2),
                        at_ms: r.get(3),
                        dead_letter: r.get(4),
                    },
                )
            })
            .collect())
    }

    fn dead_letters(&self, session: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT id, session, kind, reason, at_ms, snapshot, resolved, resolved_ms
                 FROM dead_letters WHERE $1::TEXT IS NULL OR session = $1 ORDER BY id",
                &[&session],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| {
                let snapshot: String = r.get(5);
                DeadLetter {
                    id: r.get(0),
                    session: r.get(1),
                    kind: r.get(2),
                    reason: r.get(3),
                    at_ms: r.get(4),
                    snapshot: serde_json::from_str(&snapshot).unwrap_or(Value::Null),
                    resolved: r.get(6),
                    resolved_ms: r.get(7),
                }
            })
            .collect())
    }

    fn idempotency_begin(
        &self,
        session: &str,
        key: &str,
        fingerprint: &str,
        ttl_ms: i64,
        now: i64,
    ) -> Result<Begun, StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute(
                "DELETE FROM idempotency WHERE session = $1 AND key = $2 AND created_ms < $3",
                &[&session, &key, &(now - ttl_ms)],
            )?;
            let claimed = tx.execute(
                "INSERT INTO idempotency (session, key, fingerprint, state, created_ms)
                 VALUES ($1, $2, $3, 'running', $4) ON CONFLICT (session, key) DO NOTHING",
                &[&session, &key, &fingerprint, &now],
            )?;
            let begun = if claimed == 1 {
                Begun::Fresh
            } else {
                let row = tx.query_one(
                    "SELECT fingerprint, state, response FROM idempotency
                     WHERE session = $1 AND key = $2",
                    &[&session, &key],
                )?;
                let (stored, state, response): (String, String, Option<String>) =
                    (row.get(0), row.get(1), row.get(2));
                if stored != fingerprint {
                    Begun::Mismatch
                } else if state == "running" {
                    Begun::Running
                } else {
                    Begun::Done(response.and_then(|json| serde_json::from_str(&json).ok()))
                }
            };
            tx.commit()?;
            Ok(begun)
        })
    }

    fn idempotency_done(
        &self,
        session: &str,
        key: &str,
        response: Option<&StoredResponse>,
    ) -> Result<(), StoreError> {
        let response = response.map(json);
        self.0.with(|c| {
            c.execute(
                "UPDATE idempotency SET state = 'done', response = $3
                 WHERE session = $1 AND key = $2",
                &[&session, &key, &response],
            )
            .map(drop)
        })
    }

    fn idempotency_abandon(&self, session: &str, key: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM idempotency WHERE session = $1 AND key = $2 AND state = 'running'",
                &[&session, &key],
            )
            .map(drop)
        })
    }

    fn idempotency_forget(&self, session: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute("DELETE FROM idempotency WHERE session = $1", &[&session])
                .map(drop)
        })
    }
}
