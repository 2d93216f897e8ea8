//! The guardrails' state on SQLite ([`crate::guard::GuardStore`]).

use rusqlite::{params, OptionalExtension};
use serde_json::Value;

use super::Db;
use crate::approvals::StoredResponse;
use crate::guard::{Begun, DeadLetter, GuardStore, Paused};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct SqliteGuard(pub(super) Db);

impl GuardStore for SqliteGuard {
    /// Write every account (one transaction).
    fn save_accounts(&self, accounts: &[(String, Value)], now: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            let tx = c.transaction()?;
            for (session, account) in accounts {
                let json = account.to_string();
                tx.execute(
                    "INSERT INTO session_accounts (session, account, updated_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (session) DO UPDATE SET account = ?2, updated_ms = ?3",
                    params![session, json, now],
                )?;
            }
            tx.commit()
        })
    }

    /// The stored account of each of `sessions` that has one.
    fn load_accounts(&self) -> Result<Vec<(String, Value)>, StoreError> {
        self.0.with(|c| {
            let mut stmt = c.prepare("SELECT session, account FROM session_accounts")?;
            let rows = stmt.query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (session, json) = row?;
                if let Ok(account) = serde_json::from_str(&json) {
                    out.push((session, account));
                }
            }
            Ok(out)
        })
    }

    fn forget_account(&self, session: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM session_accounts WHERE session = ?1",
                params![session],
            )
            .map(|_| ())
        })
    }

    /// Pause `session`: the dead letter and the pause in one transaction. A session already
    /// paused keeps its first pause (and this trip is not recorded again).
    fn pause(
        &self,
        session: &str,
        kind: &str,
        reason: &str,
        snapshot: &Value,
        at_ms: i64,
    ) -> Result<Option<Paused>, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let already: Option<i64> = tx
                .query_row(
                    "SELECT dead_letter FROM session_pauses WHERE session = ?1",
                    params![session],
                    |r| r.get(0),
                )
                .optional()?;
            if already.is_some() {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO dead_letters (session, kind, reason, at_ms, snapshot) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![session, kind, reason, at_ms, snapshot.to_string()],
            )?;
            let id = tx.last_insert_rowid();
            tx.execute(
                "INSERT INTO session_pauses (session, kind, reason, at_ms, dead_letter) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![session, kind, reason, at_ms, id],
            )?;
            tx.commit()?;
            Ok(Some(Paused {
                kind: kind.to_owned(),
                reason: reason.to_owned(),
                at_ms,
                dead_letter: id,
            }))
        })
    }

    /// End a pause (`resumed` or `terminated`); false when the session was not paused.
    fn unpause(&self, session: &str, resolution: &str, now: i64) -> Result<bool, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let letter: Option<i64> = tx
                .query_row(
                    "SELECT dead_letter FROM session_pauses WHERE session = ?1",
                    params![session],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(letter) = letter else {
                return Ok(false);
            };
            tx.execute(
                "DELETE FROM session_pauses WHERE session = ?1",
                params![session],
            )?;
            tx.execute(
                "UPDATE dead_letters SET resolved = ?1, resolved_ms = ?2 WHERE id = ?3",
                params![resolution, now, letter],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn pauses(&self) -> Result<Vec<(String, Paused)>, StoreError> {
        self.0.with(|c| {
            let mut stmt =
                c.prepare("SELECT session, kind, reason, at_ms, dead_letter FROM session_pauses")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    Paused {
                        kind: r.get(1)?,
                        reason: r.get(2)?,
                        at_ms: r.get(3)?,
                        dead_letter: r.get(4)?,
                    },
                ))
            })?;
            rows.collect()
        })
    }

    fn dead_letters(&self, session: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        self.0.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, session, kind, reason, at_ms, snapshot, resolved, resolved_ms
                 FROM dead_letters WHERE ?1 IS NULL OR session = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![session], |r| {
                let snapshot: String = r.get(5)?;
                Ok(DeadLetter {
                    id: r.get(0)?,
                    session: r.get(1)?,
                    kind: r.get(2)?,
                    reason: r.get(3)?,
                    at_ms: r.get(4)?,
                    snapshot: serde_json::from_str(&snapshot).unwrap_or(Value::Null),
                    resolved: r.get(6)?,
                    resolved_ms: r.get(7)?,
                })
            })?;
            rows.collect()
        })
    }

    /// Claim `key` for a request with `fingerprint`, or say what became of it before.
    /// Outcomes older than `ttl_ms` are forgotten first.
    fn idempotency_begin(
        &self,
        session: &str,
        key: &str,
        fingerprint: &str,
        ttl_ms: i64,
        now: i64,
    ) -> Result<Begun, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM idempotency WHERE session = ?1 AND key = ?2 AND created_ms < ?3",
                params![session, key, now - ttl_ms],
            )?;
            let found: Option<(String, String, Option<String>)> = tx
                .query_row(
                    "SELECT fingerprint, state, response FROM idempotency WHERE session = ?1 AND key = ?2",
                    params![session, key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let begun = match found {
                None => {
                    tx.execute(
                        "INSERT INTO idempotency (session, key, fingerprint, state, created_ms)
                         VALUES (?1, ?2, ?3, 'running', ?4)",
                        params![session, key, fingerprint, now],
                    )?;
                    Begun::Fresh
                }
                Some((stored, _, _)) if stored != fingerprint => Begun::Mismatch,
                Some((_, state, _)) if state == "running" => Begun::Running,
                Some((_, _, response)) => Begun::Done(
                    response.and_then(|json| serde_json::from_str(&json).ok()),
                ),
            };
            tx.commit()?;
            Ok(begun)
        })
    }

    /// Store the outcome of a key's request (`None`: too large to keep).
    fn idempotency_done(
        &self,
        session: &str,
        key: &str,
        response: Option<&StoredResponse>,
    ) -> Result<(), StoreError> {
        let json = response.map(|r| serde_json::to_string(r).unwrap_or_default());
        self.0.with(|c| {
            c.execute(
                "UPDATE idempotency SET state = 'done', response = ?3 WHERE session = ?1 AND key = ?2",
                params![session, key, json],
            )
            .map(|_| ())
        })
    }

    /// The request never reached the upstream: free the key so a retry runs afresh.
    fn idempotency_abandon(&self, session: &str, key: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM idempotency WHERE session = ?1 AND key = ?2 AND state = 'running'",
                params![session, key],
            )
            .map(|_| ())
        })
    }

    /// A session's keys go with it.
    fn idempotency_forget(&self, session: &str) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM idempotency WHERE session = ?1",
                params![session],
            )
            .map(|_| ())
        })
    }
}
