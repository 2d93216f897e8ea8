//! What the guardrails keep across a restart: session accounts (limits and usage), paused
//! sessions, the dead-letter table of watchdog trips, and `Idempotency-Key` outcomes.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::meter::Account;
use crate::approvals::model::StoredResponse;
use crate::store::{self, StoreError};

/// A paused session, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub kind: String,
    pub reason: String,
    pub at_ms: i64,
    /// The dead-letter row holding the diagnostic snapshot.
    pub dead_letter: i64,
}

/// One watchdog trip with its diagnostic snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub id: i64,
    pub session: String,
    pub kind: String,
    pub reason: String,
    pub at_ms: i64,
    pub snapshot: Value,
    /// `resumed` or `terminated`, once a human decided.
    pub resolved: Option<String>,
    pub resolved_ms: Option<i64>,
}

/// Where an `Idempotency-Key` stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Begun {
    /// First use: the request runs; [`GuardStore::idempotency_done`] stores its outcome.
    Fresh,
    /// Same key, same request, finished: its stored outcome (`None`: it was too large to
    /// keep).
    Done(Option<StoredResponse>),
    /// Same key, same request, still running.
    Running,
    /// Same key, another request.
    Mismatch,
}

/// The guardrails' connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct GuardStore {
    conn: Arc<Mutex<Connection>>,
}

impl GuardStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            conn: Arc::new(Mutex::new(store::open(path)?)),
        })
    }

    /// Run `f` on the connection in a blocking task.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&GuardStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|e| StoreError::Task(format!("guardrail store lock poisoned: {e}")))?;
        Ok(f(&mut conn)?)
    }

    /// Write every account (one transaction).
    pub fn save_accounts(&self, accounts: &[(String, Account)]) -> Result<(), StoreError> {
        let now = store::now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            for (session, account) in accounts {
                let json = serde_json::to_string(account).unwrap_or_default();
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
    pub fn load_accounts(&self) -> Result<Vec<(String, Account)>, StoreError> {
        self.with(|c| {
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

    pub fn forget_account(&self, session: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM session_accounts WHERE session = ?1",
                params![session],
            )
            .map(|_| ())
        })
    }

    /// Pause `session`: the dead letter and the pause in one transaction. A session already
    /// paused keeps its first pause (and this trip is not recorded again).
    pub fn pause(
        &self,
        session: &str,
        kind: &str,
        reason: &str,
        snapshot: &Value,
        at_ms: i64,
    ) -> Result<Option<Paused>, StoreError> {
        self.with(|c| {
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
    pub fn unpause(&self, session: &str, resolution: &str) -> Result<bool, StoreError> {
        let now = store::now_ms();
        self.with(|c| {
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

    pub fn pauses(&self) -> Result<Vec<(String, Paused)>, StoreError> {
        self.with(|c| {
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

    pub fn dead_letters(&self, session: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        self.with(|c| {
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

    /// The last `n` audit records of `session`, newest last (the snapshot of a trip).
    pub fn recent_audit(&self, session: &str, n: u32) -> Result<Vec<Value>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT record FROM (SELECT seq, record FROM audit WHERE session = ?1
                 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![session, n], |r| r.get::<_, String>(0))?;
            let mut out = Vec::new();
            for row in rows {
                out.push(serde_json::from_str(&row?).unwrap_or(Value::Null));
            }
            Ok(out)
        })
    }

    /// Claim `key` for a request with `fingerprint`, or say what became of it before.
    /// Outcomes older than `ttl_ms` are forgotten first.
    pub fn idempotency_begin(
        &self,
        session: &str,
        key: &str,
        fingerprint: &str,
        ttl_ms: i64,
    ) -> Result<Begun, StoreError> {
        let now = store::now_ms();
        self.with(|c| {
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
    pub fn idempotency_done(
        &self,
        session: &str,
        key: &str,
        response: Option<&StoredResponse>,
    ) -> Result<(), StoreError> {
        let json = response.map(|r| serde_json::to_string(r).unwrap_or_default());
        self.with(|c| {
            c.execute(
                "UPDATE idempotency SET state = 'done', response = ?3 WHERE session = ?1 AND key = ?2",
                params![session, key, json],
            )
            .map(|_| ())
        })
    }

    /// The request never reached the upstream: free the key so a retry runs afresh.
    pub fn idempotency_abandon(&self, session: &str, key: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM idempotency WHERE session = ?1 AND key = ?2 AND state = 'running'",
                params![session, key],
            )
            .map(|_| ())
        })
    }

    /// A session's keys go with it.
    pub fn idempotency_forget(&self, session: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM idempotency WHERE session = ?1",
                params![session],
            )
            .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, GuardStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = GuardStore::open(&dir.path().join("db")).unwrap();
        (dir, s)
    }

    #[test]
    fn an_idempotency_key_runs_once_and_refuses_another_request() {
        let (_d, s) = store();
        let day = 86_400_000;
        assert_eq!(
            s.idempotency_begin("s", "k", "f1", day).unwrap(),
            Begun::Fresh
        );
        assert_eq!(
            s.idempotency_begin("s", "k", "f1", day).unwrap(),
            Begun::Running
        );
        assert_eq!(
            s.idempotency_begin("s", "k", "f2", day).unwrap(),
            Begun::Mismatch
        );
        // Another session's key of the same name is its own.
        assert_eq!(
            s.idempotency_begin("t", "k", "f2", day).unwrap(),
            Begun::Fresh
        );
        let stored = StoredResponse {
            status: 201,
            headers: vec![("x".into(), "y".into())],
            body: b"made".to_vec(),
            truncated: false,
        };
        s.idempotency_done("s", "k", Some(&stored)).unwrap();
        assert_eq!(
            s.idempotency_begin("s", "k", "f1", day).unwrap(),
            Begun::Done(Some(stored))
        );
        // An abandoned key runs afresh; a finished one is not abandoned.
        s.idempotency_abandon("s", "k").unwrap();
        assert!(matches!(
            s.idempotency_begin("s", "k", "f1", day).unwrap(),
            Begun::Done(_)
        ));
        s.idempotency_abandon("t", "k").unwrap();
        assert_eq!(
            s.idempotency_begin("t", "k", "f2", day).unwrap(),
            Begun::Fresh
        );
        // Past the ttl the key is forgotten.
        assert_eq!(
            s.idempotency_begin("s", "k", "f9", -1).unwrap(),
            Begun::Fresh
        );
    }

    #[test]
    fn a_pause_is_recorded_once_and_resolved_once() {
        let (_d, s) = store();
        let snap = serde_json::json!({"x": 1});
        let p = s.pause("s", "repeat", "why", &snap, 5).unwrap().unwrap();
        assert!(s.pause("s", "cycle", "again", &snap, 6).unwrap().is_none());
        assert_eq!(s.pauses().unwrap(), vec![("s".to_owned(), p.clone())]);
        assert!(s.unpause("s", "resumed").unwrap());
        assert!(!s.unpause("s", "resumed").unwrap());
        let letters = s.dead_letters(Some("s")).unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].resolved.as_deref(), Some("resumed"));
        assert_eq!(letters[0].snapshot, snap);
    }
}
