//! The approvals aggregate on SQLite ([`crate::approvals::ApprovalStore`]).
//!
//! Every transition is one `UPDATE ... WHERE status = <expected>` (or a transaction around
//! one), so a transition happens once or not at all, whoever races it. The bounds on holds
//! and the outbox are in [`super::bounds`] and [`super::outbox`], because each must commit
//! together with the approval it belongs to.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{json, parse_json, Db};
use crate::approvals::{
    Admission, Approval, ApprovalStore, Channel, DecideError, Decision, Delivery, DeliveryState,
    Hold, QueueCounts, RecipientState, Status, StoredResponse, Verdict,
};
use crate::StoreError;

const COLUMNS: &str = "id, status, created_ms, deadline_ms, renotify_ms, rounds, session, agent, \
     tenant, request_id, policies, policy_generation, request, observed, approver, channel, \
     decided_ms, reason, attempts, result, held_policy_version, executed_policy_version";

/// The approvals' connection.
#[derive(Debug)]
pub(super) struct SqliteApprovals(pub(super) Db);

impl SqliteApprovals {
    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.0.with(f)
    }
}

impl SqliteApprovals {
    /// Store a new pending approval.
    pub(super) fn insert(&self, a: &Approval) -> Result<(), StoreError> {
        self.with(|c| insert_on(c, a))
    }

    /// One approval.
    pub(super) fn get(&self, id: &str) -> Result<Option<Approval>, StoreError> {
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
    pub(super) fn list(
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

    pub(super) fn decide(&self, d: &Decision<'_>) -> Result<Approval, DecideError> {
        let Decision {
            id,
            verdict,
            approver,
            channel,
            reason,
            nonce,
            now_ms,
        } = *d;
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
    pub(super) fn link_used(&self, nonce: &str) -> Result<bool, StoreError> {
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
    pub(super) fn claim(&self, id: &str, now_ms: i64) -> Result<Option<Approval>, StoreError> {
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
    pub(super) fn finish(
        &self,
        id: &str,
        status: Status,
        result: Option<&StoredResponse>,
        reason: Option<&str>,
        executed_policy_version: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = result.map(json);
        let changed = self.with(|c| {
            c.execute(
                "UPDATE approvals SET status = ?2, result = ?3,
                   reason = COALESCE(?4, reason), updated_ms = ?5,
                   executed_policy_version = ?6
                 WHERE id = ?1 AND status = 'executing'",
                params![
                    id,
                    status.as_str(),
                    result,
                    reason,
                    now_ms,
                    executed_policy_version
                ],
            )
        })?;
        Ok(changed == 1)
    }

    /// At start-up: executions a previous process claimed and never finished go back to
    /// `approved`, to be re-sent with the same idempotency key. Returns their ids.
    pub(super) fn recover(
        &self,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        // `updated_ms` of an executing approval is its claim's heartbeat (`renew`).
        self.with(|c| {
            returning_ids(
                c,
                "UPDATE approvals SET status = 'approved', updated_ms = ?1
                 WHERE status = 'executing' AND updated_ms <= ?2 RETURNING id",
                [now_ms, stale_before_ms],
            )
        })
    }

    pub(super) fn release(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let changed = self.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'approved', updated_ms = ?2
                 WHERE id = ?1 AND status = 'executing'",
                params![id, now_ms],
            )
        })?;
        Ok(changed == 1)
    }

    pub(super) fn renew(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let changed = self.with(|c| {
            c.execute(
                "UPDATE approvals SET updated_ms = ?2 WHERE id = ?1 AND status = 'executing'",
                params![id, now_ms],
            )
        })?;
        Ok(changed == 1)
    }

    /// Ids of approvals waiting for the executor, oldest first.
    pub(super) fn approved(&self) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id FROM approvals WHERE status = 'approved' ORDER BY decided_ms, id",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Expire every pending approval past its deadline; returns them (now `expired`).
    pub(super) fn expire_due(&self, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        let ids = self.with(|c| {
            returning_ids(
                c,
                "UPDATE approvals SET status = 'expired', decided_ms = ?1, updated_ms = ?1,
                   reason = 'the deadline passed without a decision'
                 WHERE status = 'pending' AND deadline_ms <= ?1 RETURNING id",
                [now_ms],
            )
        })?;
        self.get_many(&ids)
    }

    /// Expire every pending approval of `session` (it ended: nothing it asked for can run,
    /// so no human should be asked any more), and forget its cap and hold fingerprints;
    /// returns the approvals, now `expired`.
    pub(super) fn expire_session(
        &self,
        session: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let ids = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let ids = returning_ids(
                &tx,
                "UPDATE approvals SET status = 'expired', decided_ms = ?2, updated_ms = ?2,
                   reason = 'the session ended before anyone decided'
                 WHERE status = 'pending' AND session = ?1 RETURNING id",
                params![session, now_ms],
            )?;
            super::bounds::forget_bounds_on(&tx, session)?;
            tx.commit()?;
            Ok(ids)
        })?;
        self.get_many(&ids)
    }

    /// Withdraw the pending "resume this paused session?" questions of `session`: a human
    /// already resumed it another way, so approvers are not asked (or reminded) any more.
    pub(super) fn withdraw_resume(
        &self,
        session: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let ids = self.with(|c| {
            returning_ids(
                c,
                "UPDATE approvals SET status = 'expired', decided_ms = ?2, updated_ms = ?2,
                   reason = ?3
                 WHERE status = 'pending' AND session = ?1
                   AND json_extract(request, '$.url') LIKE 'ostiary:session/%' RETURNING id",
                params![session, now_ms, reason],
            )
        })?;
        self.get_many(&ids)
    }

    /// Start a new notification round for every pending approval whose `renotify_ms` has
    /// passed: rounds + 1, next reminder one `ttl` later. Returns them, updated.
    pub(super) fn renotify_due(
        &self,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let ids = self.with(|c| {
            returning_ids(
                c,
                "UPDATE approvals SET rounds = rounds + 1, renotify_ms = ?1 + ?2, updated_ms = ?1
                 WHERE status = 'pending' AND renotify_ms <= ?1 AND deadline_ms > ?1
                 RETURNING id",
                params![now_ms, ttl_ms],
            )
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
    pub(super) fn slack_first_seen(
        &self,
        signature: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
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
    pub(super) fn counts(&self) -> Result<QueueCounts, StoreError> {
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
pub(super) fn insert_on(c: &Connection, a: &Approval) -> rusqlite::Result<()> {
    let policies = json(&a.policies);
    let request = json(&a.request);
    let observed = json(&a.observed);
    c.execute(
        "INSERT INTO approvals (id, status, created_ms, deadline_ms, renotify_ms, rounds,
           session, agent, tenant, request_id, policies, policy_generation, request,
           observed, attempts, updated_ms, held_policy_version)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 0, ?3,
           ?15)",
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
            a.held_policy_version,
        ],
    )
    .map(drop)
}

/// Run one transition (`UPDATE … RETURNING id`: the rows it moved, in one statement, so
/// nothing moves between the choice and the change); the ids, sorted as PostgreSQL's are.
fn returning_ids(
    c: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = c.prepare(sql)?;
    let mut ids = stmt
        .query_map(params, |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    ids.sort();
    Ok(ids)
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
        held_policy_version: r.get(20)?,
        executed_policy_version: r.get(21)?,
    })
}

impl ApprovalStore for SqliteApprovals {
    fn insert(&self, a: &Approval) -> Result<(), StoreError> {
        Self::insert(self, a)
    }
    fn get(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        Self::get(self, id)
    }
    fn list(
        &self,
        status: Option<Status>,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        Self::list(self, status, session, limit)
    }
    fn decide(&self, d: &Decision<'_>) -> Result<Approval, DecideError> {
        Self::decide(self, d)
    }
    fn link_used(&self, nonce: &str) -> Result<bool, StoreError> {
        Self::link_used(self, nonce)
    }
    fn claim(&self, id: &str, now_ms: i64) -> Result<Option<Approval>, StoreError> {
        Self::claim(self, id, now_ms)
    }
    fn finish(
        &self,
        id: &str,
        status: Status,
        result: Option<&StoredResponse>,
        reason: Option<&str>,
        executed_policy_version: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        Self::finish(
            self,
            id,
            status,
            result,
            reason,
            executed_policy_version,
            now_ms,
        )
    }
    fn recover(&self, now_ms: i64, stale_before_ms: i64) -> Result<Vec<String>, StoreError> {
        Self::recover(self, now_ms, stale_before_ms)
    }
    fn renew(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        Self::renew(self, id, now_ms)
    }
    fn release(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        Self::release(self, id, now_ms)
    }
    fn approved(&self) -> Result<Vec<String>, StoreError> {
        Self::approved(self)
    }
    fn expire_due(&self, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        Self::expire_due(self, now_ms)
    }
    fn expire_session(&self, session: &str, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        Self::expire_session(self, session, now_ms)
    }
    fn withdraw_resume(
        &self,
        session: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        Self::withdraw_resume(self, session, reason, now_ms)
    }
    fn renotify_due(&self, now_ms: i64, ttl_ms: i64) -> Result<Vec<Approval>, StoreError> {
        Self::renotify_due(self, now_ms, ttl_ms)
    }
    fn slack_first_seen(&self, signature: &str, now_ms: i64) -> Result<bool, StoreError> {
        Self::slack_first_seen(self, signature, now_ms)
    }
    fn counts(&self) -> Result<QueueCounts, StoreError> {
        Self::counts(self)
    }
    fn set_cap(&self, session: &str, parent: Option<&str>, max: u32) -> Result<(), StoreError> {
        Self::set_cap(self, session, parent, max)
    }
    fn cap(&self, session: &str) -> Result<Option<u32>, StoreError> {
        Self::cap(self, session)
    }
    fn pending_holds(&self, session: &str, now_ms: i64) -> Result<u32, StoreError> {
        Self::pending_holds(self, session, now_ms)
    }
    fn hold_bounded(&self, hold: Hold<'_>, now_ms: i64) -> Result<Admission, StoreError> {
        Self::hold_bounded(self, hold, now_ms)
    }
    fn enqueue(
        &self,
        approval_id: &str,
        channel: &str,
        recipient: &str,
        round: u32,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        Self::enqueue(self, approval_id, channel, recipient, round, now_ms)
    }
    fn due_deliveries(&self, now_ms: i64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        Self::due_deliveries(self, now_ms, limit)
    }
    fn due_for(
        &self,
        channel: &str,
        recipient: &str,
        now_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        Self::due_for(self, channel, recipient, now_ms)
    }
    fn delivered(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        Self::delivered(self, id, now_ms)
    }
    fn delivery_failed(&self, id: i64, error: &str, next_ms: i64) -> Result<(), StoreError> {
        Self::delivery_failed(self, id, error, next_ms)
    }
    fn delivery_dropped(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        Self::delivery_dropped(self, id, now_ms)
    }
    fn recipient_state(
        &self,
        channel: &str,
        recipient: &str,
    ) -> Result<RecipientState, StoreError> {
        Self::recipient_state(self, channel, recipient)
    }
    fn close_recipient(
        &self,
        channel: &str,
        recipient: &str,
        open_ms: i64,
    ) -> Result<(), StoreError> {
        Self::close_recipient(self, channel, recipient, open_ms)
    }
    fn deliveries_of(&self, approval_id: &str) -> Result<Vec<DeliveryState>, StoreError> {
        Self::deliveries_of(self, approval_id)
    }
}
