//! The durable approval queue in SQLite.
//!
//! Every transition is one `UPDATE ... WHERE status = <expected>` (or a transaction around
//! one), so a transition either happens once or not at all: two executors — tasks of one
//! process or two processes on one database — can never both claim an approval, and a
//! decision racing the deadline is either a decision or an expiry, never both. The
//! connection runs `synchronous = FULL`: the agent is told `202` only after its request is
//! on disk, and a `kill -9` at any point loses nothing that was acknowledged.
//!
//! Also here: single-use link nonces, Slack callback signatures already seen (replay), the
//! notification outbox and its per-recipient rate state, and the bounds on holds (each
//! session's cap, the fingerprints identical holds are joined on), because each of them
//! must commit together with, or survive as durably as, the approval it belongs to.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row};

pub use bounds::{Admission, CapReached, Hold};
pub use outbox::{Delivery, DeliveryState, RecipientState};

use super::model::{Approval, Channel, Status, StoredResponse, Verdict};
use crate::store::{self, StoreError};

mod bounds;
mod outbox;

/// Why a decision was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no approval {0}")]
    Unknown(String),
    #[error("approval is already {}", .0.as_str())]
    NotPending(Status),
    #[error("this link was already used")]
    LinkUsed,
    #[error("{0:?} is not one of the configured approvers")]
    NotApprover(String),
    #[error("the agent that made a request cannot approve it")]
    SelfApproval,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counts for gauges and the CLI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub pending: i64,
    pub approved: i64,
    pub executing: i64,
    /// Deliveries that failed at least once and are not yet delivered.
    pub failing_deliveries: i64,
}

/// The queue's connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct ApprovalStore {
    conn: Arc<Mutex<Connection>>,
}

const COLUMNS: &str = "id, status, created_ms, deadline_ms, renotify_ms, rounds, session, agent, \
     tenant, request_id, policies, policy_generation, request, observed, approver, channel, \
     decided_ms, reason, attempts, result";

impl ApprovalStore {
    /// Open the queue in the database at `path` (migrated by [`store::open`]).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = store::open(path)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(bounds::MIGRATION)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Run `f` on the connection in a blocking task.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ApprovalStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|e| StoreError::Task(format!("approval store lock poisoned: {e}")))?;
        Ok(f(&mut conn)?)
    }

    /// Store a new pending approval.
    pub fn insert(&self, a: &Approval) -> Result<(), StoreError> {
        self.with(|c| insert_on(c, a))
    }

    /// One approval.
    pub fn get(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                [id],
                from_row,
            )
            .optional()
        })
    }

    /// Approvals, newest first, optionally of one status and one session.
    pub fn list(
        &self,
        status: Option<Status>,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM approvals
                 WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR session = ?2)
                 ORDER BY created_ms DESC, id LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![status.map(Status::as_str), session, limit as i64],
                from_row,
            )?;
            rows.collect()
        })
    }

    /// Record a human's decision on a pending approval, consuming the link nonce it came
    /// with (if any) in the same transaction: a used link can never decide again, and a
    /// refused decision does not burn the link.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        id: &str,
        verdict: Verdict,
        approver: &str,
        channel: Channel,
        reason: Option<&str>,
        nonce: Option<&str>,
        now_ms: i64,
    ) -> Result<Approval, DecideError> {
        let outcome =
            self.with(|c| {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let row: Option<(String, i64)> = tx
                    .query_row(
                        "SELECT status, deadline_ms FROM approvals WHERE id = ?1",
                        [id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                let Some((status, deadline_ms)) = row else {
                    return Ok(Err(DecideError::Unknown(id.to_owned())));
                };
                let status = Status::parse(&status).unwrap_or(Status::Failed);
                if status != Status::Pending {
                    return Ok(Err(DecideError::NotPending(status)));
                }
                // Past its deadline it is expired, even if the sweep has not said so yet
                // (it will, with the audit record, at its next tick).
                if deadline_ms <= now_ms {
                    return Ok(Err(DecideError::NotPending(Status::Expired)));
                }
                if let Some(nonce) = nonce {
                    let fresh = tx.execute(
                        "INSERT OR IGNORE INTO approval_links_used (nonce, approval_id, used_ms)
                     VALUES (?1, ?2, ?3)",
                        params![nonce, id, now_ms],
                    )?;
                    if fresh == 0 {
                        return Ok(Err(DecideError::LinkUsed));
                    }
                }
                let next = match verdict {
                    Verdict::Approve => Status::Approved,
                    Verdict::Deny => Status::Denied,
                };
                tx.execute(
                "UPDATE approvals SET status = ?2, approver = ?3, channel = ?4, decided_ms = ?5,
                   reason = ?6, updated_ms = ?5
                 WHERE id = ?1 AND status = 'pending'",
                params![id, next.as_str(), approver, channel.as_str(), now_ms, reason],
            )?;
                tx.commit()?;
                Ok(Ok(()))
            })?;
        outcome?;
        self.get(id)?
            .ok_or_else(|| DecideError::Unknown(id.to_owned()))
    }

    /// Whether a link nonce was already used (for the page: say so before showing a form).
    pub fn link_used(&self, nonce: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT 1 FROM approval_links_used WHERE nonce = ?1",
                [nonce],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
        })
    }

    /// Claim an approved approval for execution: `approved → executing`, attempts + 1.
    /// `None` when someone else claimed it, or it is not approved.
    pub fn claim(&self, id: &str, now_ms: i64) -> Result<Option<Approval>, StoreError> {
        let changed = self.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'executing', attempts = attempts + 1,
                   updated_ms = ?2
                 WHERE id = ?1 AND status = 'approved'",
                params![id, now_ms],
            )
        })?;
        if changed == 0 {
            return Ok(None);
        }
        self.get(id)
    }

    /// End an execution: `executing → executed | failed | refused`, with the stored
    /// response (executed) or the reason (failed, refused).
    pub fn finish(
        &self,
        id: &str,
        status: Status,
        result: Option<&StoredResponse>,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = result.map(json);
        let changed = self.with(|c| {
            c.execute(
                "UPDATE approvals SET status = ?2, result = ?3,
                   reason = COALESCE(?4, reason), updated_ms = ?5
                 WHERE id = ?1 AND status = 'executing'",
                params![id, status.as_str(), result, reason, now_ms],
            )
        })?;
        Ok(changed == 1)
    }

    /// At start-up: executions a previous process claimed and never finished go back to
    /// `approved`, to be re-sent with the same idempotency key. Returns their ids.
    pub fn recover(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = ids_where(
                &tx,
                "SELECT id FROM approvals WHERE status = 'executing'",
                [],
            )?;
            tx.execute(
                "UPDATE approvals SET status = 'approved', updated_ms = ?1
                 WHERE status = 'executing'",
                [now_ms],
            )?;
            tx.commit()?;
            Ok(ids)
        })
    }

    /// Ids of approvals waiting for the executor, oldest first.
    pub fn approved(&self) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id FROM approvals WHERE status = 'approved' ORDER BY decided_ms, id",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Expire every pending approval past its deadline; returns them (now `expired`).
    pub fn expire_due(&self, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        let ids: Vec<String> = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = ids_where(
                &tx,
                "SELECT id FROM approvals WHERE status = 'pending' AND deadline_ms <= ?1",
                [now_ms],
            )?;
            tx.execute(
                "UPDATE approvals SET status = 'expired', decided_ms = ?1, updated_ms = ?1,
                   reason = 'the deadline passed without a decision'
                 WHERE status = 'pending' AND deadline_ms <= ?1",
                [now_ms],
            )?;
            tx.commit()?;
            Ok(ids)
        })?;
        self.get_many(&ids)
    }

    /// Expire every pending approval of `session` (it ended: nothing it asked for can run,
    /// so no human should be asked any more), and forget its cap and hold fingerprints;
    /// returns the approvals, now `expired`.
    pub fn expire_session(&self, session: &str, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        let ids: Vec<String> = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = ids_where(
                &tx,
                "SELECT id FROM approvals WHERE status = 'pending' AND session = ?1",
                [session],
            )?;
            tx.execute(
                "UPDATE approvals SET status = 'expired', decided_ms = ?2, updated_ms = ?2,
                   reason = 'the session ended before anyone decided'
                 WHERE status = 'pending' AND session = ?1",
                params![session, now_ms],
            )?;
            Self::forget_bounds_on(&tx, session)?;
            tx.commit()?;
            Ok(ids)
        })?;
        self.get_many(&ids)
    }

    /// Withdraw the pending "resume this paused session?" questions of `session`: a human
    /// already resumed it another way, so approvers are not asked (or reminded) any more.
    pub fn withdraw_resume(
        &self,
        session: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let ids: Vec<String> = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = ids_where(
                &tx,
                "SELECT id FROM approvals WHERE status = 'pending' AND session = ?1
                   AND json_extract(request, '$.url') LIKE 'ostiary:session/%'",
                [session],
            )?;
            for id in &ids {
                tx.execute(
                    "UPDATE approvals SET status = 'expired', decided_ms = ?2, updated_ms = ?2,
                       reason = ?3 WHERE status = 'pending' AND id = ?1",
                    params![id, now_ms, reason],
                )?;
            }
            tx.commit()?;
            Ok(ids)
        })?;
        self.get_many(&ids)
    }

    /// Start a new notification round for every pending approval whose `renotify_ms` has
    /// passed: rounds + 1, next reminder one `ttl` later. Returns them, updated.
    pub fn renotify_due(&self, now_ms: i64, ttl_ms: i64) -> Result<Vec<Approval>, StoreError> {
        let ids: Vec<String> = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = ids_where(
                &tx,
                "SELECT id FROM approvals
                     WHERE status = 'pending' AND renotify_ms <= ?1 AND deadline_ms > ?1",
                [now_ms],
            )?;
            for id in &ids {
                tx.execute(
                    "UPDATE approvals SET rounds = rounds + 1, renotify_ms = ?2 + ?3,
                       updated_ms = ?2
                     WHERE id = ?1 AND status = 'pending'",
                    params![id, now_ms, ttl_ms],
                )?;
            }
            tx.commit()?;
            Ok(ids)
        })?;
        self.get_many(&ids)
    }

    fn get_many(&self, ids: &[String]) -> Result<Vec<Approval>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(a) = self.get(id)? {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Remember a Slack callback signature; `false` if it was seen before (a replay).
    /// Signatures older than the callback window are forgotten: their timestamps are
    /// refused anyway.
    pub fn slack_first_seen(&self, signature: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM slack_callbacks_seen WHERE seen_ms < ?1",
                [now_ms - 11 * 60 * 1000],
            )?;
            let fresh = c.execute(
                "INSERT OR IGNORE INTO slack_callbacks_seen (signature, seen_ms) VALUES (?1, ?2)",
                params![signature, now_ms],
            )?;
            Ok(fresh == 1)
        })
    }

    /// Queue counts for gauges and `approvals list`.
    pub fn counts(&self) -> Result<QueueCounts, StoreError> {
        self.with(|c| {
            let mut counts = QueueCounts::default();
            let mut stmt = c.prepare(
                "SELECT status, COUNT(*) FROM approvals
                 WHERE status IN ('pending', 'approved', 'executing') GROUP BY status",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (status, n) = row?;
                match status.as_str() {
                    "pending" => counts.pending = n,
                    "approved" => counts.approved = n,
                    _ => counts.executing = n,
                }
            }
            counts.failing_deliveries = c.query_row(
                "SELECT COUNT(*) FROM approval_notifications
                 WHERE sent_ms IS NULL AND attempts > 0",
                [],
                |r| r.get(0),
            )?;
            Ok(counts)
        })
    }
}

/// Insert a new pending approval on `c` (a connection or an open transaction).
fn insert_on(c: &Connection, a: &Approval) -> rusqlite::Result<()> {
    let policies = json(&a.policies);
    let request = json(&a.request);
    let observed = json(&a.observed);
    c.execute(
        "INSERT INTO approvals (id, status, created_ms, deadline_ms, renotify_ms, rounds,
           session, agent, tenant, request_id, policies, policy_generation, request,
           observed, attempts, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 0, ?3)",
        params![
            a.id,
            a.status.as_str(),
            a.created_ms,
            a.deadline_ms,
            a.renotify_ms,
            a.rounds,
            a.session,
            a.agent,
            a.tenant,
            a.request_id,
            policies,
            a.policy_generation as i64,
            request,
            observed,
        ],
    )
    .map(drop)
}

/// The ids a transition is about to move, read in its own transaction.
fn ids_where(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = tx.prepare(sql)?;
    let rows = stmt.query_map(params, |r| r.get::<_, String>(0))?;
    rows.collect()
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // Serialising these plain structs cannot fail (string keys, no maps with other keys).
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn parse_json<T: serde::de::DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<Approval> {
    let status: String = r.get(1)?;
    let channel: Option<String> = r.get(15)?;
    let result: Option<String> = r.get(19)?;
    Ok(Approval {
        id: r.get(0)?,
        // An unknown status string can only come from a newer version's row: treat it as
        // final so that nothing executes it.
        status: Status::parse(&status).unwrap_or(Status::Failed),
        created_ms: r.get(2)?,
        deadline_ms: r.get(3)?,
        renotify_ms: r.get(4)?,
        rounds: r.get(5)?,
        session: r.get(6)?,
        agent: r.get(7)?,
        tenant: r.get(8)?,
        request_id: r.get(9)?,
        policies: parse_json(r, 10)?,
        policy_generation: r.get::<_, i64>(11)? as u64,
        request: parse_json(r, 12)?,
        observed: parse_json(r, 13)?,
        approver: r.get(14)?,
        channel: channel.as_deref().and_then(|c| match c {
            "api" => Some(Channel::Api),
            "page" => Some(Channel::Page),
            "slack" => Some(Channel::Slack),
            _ => None,
        }),
        decided_ms: r.get(16)?,
        reason: r.get(17)?,
        attempts: r.get(18)?,
        result: result
            .map(|text| {
                serde_json::from_str(&text).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        19,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })
            })
            .transpose()?,
    })
}

#[cfg(test)]
mod tests;
